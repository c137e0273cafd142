"""A PettingZoo parallel env whose agents change within an episode (`pettingzoo:changing_agents_env`): `runner`
leaves after 3 steps (terminated), `late` joins at step 2, `stayer` stays for all 8 steps (truncated). Each agent
gets +1 for action 1 and 0 for action 0, so a learner can tell a policy's reward from its actions. With
`info_masks=True` every agent's info carries an action mask that leaves action 1 only (`late`'s from when it joins)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

STEPS = 8


class ChangingAgents(ParallelEnv):
    metadata = {"name": "changing_agents_v0", "render_modes": ["rgb_array"]}
    possible_agents = ["stayer", "runner", "late"]

    def __init__(self, render_mode: str | None = None, info_masks: bool = False):
        self.render_mode, self.info_masks = render_mode, info_masks
        self.t = 0
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(0.0, 1.0, (3,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: np.asarray([self.t / STEPS, 1.0, 0.0], np.float32) for a in self.agents}

    def _info(self) -> dict:
        return {"action_mask": np.asarray([0, 1], np.int8)} if self.info_masks else {}

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = ["stayer", "runner"]
        return self._obs(), {a: self._info() for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: float(actions[a]) for a in self.agents}
        terminations = {a: a == "runner" and self.t >= 3 for a in self.agents}
        truncations = {a: self.t >= STEPS for a in self.agents}
        obs = self._obs()
        infos = {a: self._info() for a in self.agents}
        self.agents = [a for a in self.agents if not (terminations[a] or truncations[a])]
        if self.t == 2:
            self.agents.append("late")
            obs["late"] = np.asarray([self.t / STEPS, 0.0, 1.0], np.float32)
            infos["late"] = self._info()
        return obs, rewards, terminations, truncations, infos

    def render(self):
        return np.zeros((16, 16, 3), np.uint8)


def parallel_env(render_mode: str | None = None, info_masks: bool = False) -> ChangingAgents:
    return ChangingAgents(render_mode, info_masks)

"""A PettingZoo AEC env whose players take turns and find their action masks in their infos
(`pettingzoo:info_mask_turns_env`): `p1` and `p2` move in turn for `max_cycles` cycles (a cycle: one move of each),
then both are truncated. Each player has 3 actions; action 2 is illegal for `p1` and action 0 for `p2` (the masks in
`infos[agent]["action_mask"]`, every player's from reset on). A legal move earns +1, an illegal one −1."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv
from pettingzoo.utils.agent_selector import AgentSelector

MASKS = {"p1": np.asarray([1, 1, 0], np.int8), "p2": np.asarray([0, 1, 1], np.int8)}


class InfoMaskTurns(AECEnv):
    metadata = {"name": "info_mask_turns_v0", "render_modes": ["rgb_array"]}
    possible_agents = ["p1", "p2"]

    def __init__(self, max_cycles: int = 4, render_mode: str | None = None):
        self.max_cycles, self.render_mode = max_cycles, render_mode
        self.cycles = 0

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(3)

    def observe(self, agent: str) -> np.ndarray:
        return np.asarray([self.cycles / self.max_cycles, float(agent == "p1")], np.float32)

    def reset(self, seed=None, options=None):
        self.cycles = 0
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {"action_mask": MASKS[a].copy()} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.reset()

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.rewards[agent] = 1.0 if MASKS[agent][int(action)] else -1.0
        if self._selector.is_last():
            self.cycles += 1
            if self.cycles >= self.max_cycles:
                self.truncations = dict.fromkeys(self.agents, True)
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()

    def render(self):
        return np.zeros((16, 16, 3), np.uint8)


def env(max_cycles: int = 4, render_mode: str | None = None) -> InfoMaskTurns:
    return InfoMaskTurns(max_cycles, render_mode)

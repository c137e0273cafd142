"""Small tasks with Dict observations and MultiDiscrete / MultiBinary actions, for the tests of every space.

- `space_envs:DictCue-v0`: one-step episodes. The observation is a Dict of a `Discrete(4)` goal and the agent's
  heading as a `MultiBinary(2)` code (0..3 in two bits); the action (`Discrete(4)`) is paid 1 if it is the turn
  (goal − heading) mod 4, else 0. Each entry alone says nothing about the right turn: the best a policy can do
  from one entry is 1/4 on average; from both, 1.
- `space_envs:JointChoice-v0`: one-step episodes. The observation is a `Discrete(4)` cue c; the action a
  `MultiDiscrete([4, 4])` pair, paid 1 only if both factors are right, (a0, a1) = (c, 3 − c): a policy that
  gets one factor right and guesses the other earns 1/4. `start=s` makes the factors' values s..s+3 (the pair
  paid is then (s + c, s + 3 − c)).
- `space_envs:BitMatch-v0`: one-step episodes. The observation is a `MultiBinary(3)` pattern; the action a
  `MultiBinary(3)` one, paid the fraction of bits that match the pattern.
- `space_envs:HugeDiscrete-v0` and `space_envs:EmptyDict-v0`: observation spaces no network can take
  (`Discrete(10**16)`, whose one-hot would not fit in memory, and `Dict({})`), for the bad-input tests.
- `space_envs:DictPendulum-v0`: Pendulum-v1 with its observation as a Dict, the angle's (cos, sin) in one `Box`
  entry and the angular velocity in another: continuous control on a Dict observation.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import PendulumEnv


class _OneStep(gym.Env):
    """An episode of one step: observe (the subclass's `_observe()`), act, get paid (its `_pay(action)`), done."""

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.obs = self._observe()
        return self.obs, {}

    def step(self, action):
        return copy.deepcopy(self.obs), self._pay(action), True, False, {}


class DictCue(_OneStep):
    observation_space = gym.spaces.Dict({"goal": gym.spaces.Discrete(4), "heading": gym.spaces.MultiBinary(2)})
    action_space = gym.spaces.Discrete(4)

    def _observe(self):
        self.goal, self.heading = (int(x) for x in self.np_random.integers(4, size=2))
        bits = np.array([self.heading >> 1, self.heading & 1], dtype=np.int8)
        return {"goal": self.goal, "heading": bits}

    def _pay(self, action) -> float:
        return float(int(action) == (self.goal - self.heading) % 4)


class JointChoice(_OneStep):
    observation_space = gym.spaces.Discrete(4)

    def __init__(self, start: int = 0, render_mode=None):
        super().__init__(render_mode)
        self.start = start
        self.action_space = gym.spaces.MultiDiscrete([4, 4], start=[start, start])

    def _observe(self):
        self.cue = int(self.np_random.integers(4))
        return self.cue

    def _pay(self, action) -> float:
        a0, a1 = (int(a) - self.start for a in action)
        return float(a0 == self.cue and a1 == 3 - self.cue)


class BitMatch(_OneStep):
    observation_space = gym.spaces.MultiBinary(3)
    action_space = gym.spaces.MultiBinary(3)

    def _observe(self):
        self.pattern = self.np_random.integers(2, size=3).astype(np.int8)
        return self.pattern

    def _pay(self, action) -> float:
        return float(np.mean(np.asarray(action) == self.pattern))


class DictPendulum(gym.ObservationWrapper):
    metadata = PendulumEnv.metadata  # gymnasium.make reads it from the class (before 1.4: a Wrapper's is a property)

    def __init__(self, **kwargs):
        super().__init__(PendulumEnv(**kwargs))
        self.observation_space = gym.spaces.Dict(
            {
                "angle": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                "velocity": gym.spaces.Box(-8.0, 8.0, (1,), np.float32),
            }
        )

    def observation(self, observation):
        return {"angle": observation[:2], "velocity": observation[2:]}


class _Unlearnable(_OneStep):
    action_space = gym.spaces.Discrete(2)

    def _observe(self):
        return self.observation_space.sample()

    def _pay(self, action) -> float:
        return 0.0


class HugeDiscrete(_Unlearnable):
    observation_space = gym.spaces.Discrete(10**16)


class EmptyDict(_Unlearnable):
    observation_space = gym.spaces.Dict({})


class NoRenderMode(gym.Env):
    """An env whose constructor takes no `render_mode` (gym.make passes one only where it is given)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        pass

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, True, False, {}


class TextObservation(NoRenderMode):
    """Observes text: a space no network here takes."""

    observation_space = gym.spaces.Text(5)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "abc", {}


gym.register("DictCue-v0", entry_point="space_envs:DictCue", reward_threshold=0.99)
gym.register("JointChoice-v0", entry_point="space_envs:JointChoice", reward_threshold=0.99)
gym.register("BitMatch-v0", entry_point="space_envs:BitMatch", reward_threshold=0.99)
gym.register("DictPendulum-v0", entry_point="space_envs:DictPendulum", max_episode_steps=200, reward_threshold=-250)
gym.register("HugeDiscrete-v0", entry_point="space_envs:HugeDiscrete")
gym.register("EmptyDict-v0", entry_point="space_envs:EmptyDict")
gym.register("NoRenderMode-v0", entry_point="space_envs:NoRenderMode")
gym.register("TextObservation-v0", entry_point="space_envs:TextObservation")

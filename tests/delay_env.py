"""`delay_env:DelayedCartPole-v0`: CartPole whose steps sleep at random, for tests of what must hold whatever the
timing (gossip's round ordering): about one step in twenty sleeps 0-20 ms, seeded by the process, so learner
processes fall behind and run ahead of each other at random."""

from __future__ import annotations

import os
import random
import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class DelayedCartPole(CartPoleEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.delays = random.Random(os.getpid() * 7919 + time.monotonic_ns())

    def step(self, action):
        if self.delays.random() < 0.05:
            time.sleep(self.delays.uniform(0.0, 0.02))
        return super().step(action)


gym.register(
    "DelayedCartPole-v0",
    entry_point="delay_env:DelayedCartPole",
    max_episode_steps=500,
    reward_threshold=475.0,
)

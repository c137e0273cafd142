"""CartPoles with timing trouble, for gossip's tests. `delay_env:DelayedCartPole-v0`: steps sleep at random, for
what must hold whatever the timing (the round ordering): about one step in twenty sleeps 0-20 ms, seeded by the
process, so learner processes fall behind and run ahead of each other at random. `delay_env:HangingCartPole-v0`:
worker 2 hangs (a missing peer that is alive)."""

from __future__ import annotations

import multiprocessing
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


class HangingCartPole(CartPoleEnv):
    """CartPole that hangs (sleeps for an hour) at its 200th step in the worker process `rlfleet-worker-2`: a
    learner that is alive but never posts again. Plain CartPole in any other process."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 200 and multiprocessing.current_process().name == "rlfleet-worker-2":
            time.sleep(3600)
        return super().step(action)


gym.register("HangingCartPole-v0", entry_point="delay_env:HangingCartPole", max_episode_steps=500)


class HangingOnceCartPole(CartPoleEnv):
    """CartPole that hangs (sleeps for an hour) at its `at`-th step in the first process other than `driver_pid` to
    get there, on any backend: that process creates the file `flag` (atomically), so its restarted incarnation and
    every other process run plain CartPole."""

    def __init__(self, flag: str = "", driver_pid: int = 0, at: int = 200, **kwargs):
        super().__init__(**kwargs)
        self.flag, self.driver_pid, self.at, self.steps = flag, int(driver_pid), int(at), 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at and self.flag and os.getpid() != self.driver_pid:
            try:
                with open(self.flag, "x") as f:
                    f.write(str(os.getpid()))
            except FileExistsError:
                pass
            else:
                time.sleep(3600)
        return super().step(action)


gym.register("HangingOnceCartPole-v0", entry_point="delay_env:HangingOnceCartPole", max_episode_steps=500)

"""`crashing_env:CrashingCartPole-v0`: CartPole that raises once inside a worker process, for crash-recovery tests.

The first worker process (`rlfleet-worker-*`) to reach step 300 of an env raises `RuntimeError`, if the
file named by `$RLFLEET_TEST_CRASH_MARKER` does not exist yet (it creates it first, so the crash
happens once per run). In any other process it is plain CartPole-v1.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class CrashingCartPole(CartPoleEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        marker = os.environ.get("RLFLEET_TEST_CRASH_MARKER")
        in_worker = multiprocessing.current_process().name.startswith("rlfleet-worker")
        if marker and in_worker and self.steps >= 300 and not Path(marker).exists():
            Path(marker).write_text("crashed")
            raise RuntimeError("deliberate crash in CrashingCartPole")
        return super().step(action)


gym.register(
    "CrashingCartPole-v0",
    entry_point="crashing_env:CrashingCartPole",
    max_episode_steps=500,
    reward_threshold=475.0,
)

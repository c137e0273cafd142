"""`sparse_env:FarGoal-v0`: a point mass on a line that is paid only at a goal far away, for the exploration tests.

Dynamics, one step (a clipped to [-1, 1], the push):

    v ← 0.9 v + 0.1 a,   x ← x + v

so friction takes 10 % of the velocity per step and a steady push a drives the mass at a top speed of a units per
step, reached in about 10 steps (the friction's time constant). Each episode starts at rest at x ~ U(−2, 2); the
goal is x ≥ 40. Reaching it pays +100 and ends the episode; every step costs 0.05 a², so doing nothing (return 0)
is the safe local optimum. The time limit is 100 steps. Pushing at full force from x = 0 reaches the goal at
step 49 (x(t) = t − 9 (1 − 0.9ᵗ)): return 97.5; a steady push of 0.4 never gets there (36 units in 100 steps).
The threshold is 90, which a policy reaches only if it gets to the goal in every evaluation episode (one miss in
10 leaves the mean below 88). The observation is (x / 40, v), both within about [−1, 1] where it matters.

Why independent noise fails: the position is a sum of the pushes, x_t ≈ x_0 + Σ_s a_s (1 − 0.9^(t−s+1)), and
independent pushes of std σ sum to a std of σ √t, 6 to 8 after 100 steps for uniformly random actions (σ 0.58),
clip(N(0, 1)) (σ 0.72) or tanh(N(0, 2²)) (σ 0.8): the goal is five or more standard deviations away. Correlated noise
adds up instead: Ornstein–Uhlenbeck noise (TD3's `action_noise=ou`, θ 0.15, dt 0.01) is over an episode close to a
random walk of steps 0.1 σ, whose sum grows as t^1.5 (a std of about 58 σ after 100 steps), and noise that a policy
holds for many steps (gSDE with its noise matrix drawn anew every `sde_sample_freq` steps) adds up as a steady push
does.

Simulated with these dynamics, 20,000 episodes each (the share that reaches the goal; the farthest x):

    uniformly random actions           0        19.5
    clip(N(0, 1)), new every step      0        31.0
    tanh(N(0, 2²)), new every step     0        35.6
    Ornstein–Uhlenbeck, σ 0.5          4.7 %
    Ornstein–Uhlenbeck, σ 1.0          19.5 %
    tanh(N(0, 0.5²)) held 50 steps     7.4 %
    tanh(N(0, 0.5²)) held 100 steps    17 %

Pure NumPy on two floats: a step costs microseconds, and the networks' updates are all of a run's time.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

GOAL = 40.0
"""Where the goal starts (x ≥ GOAL)."""
FRICTION = 0.1
"""Fraction of the velocity lost per step."""
PUSH = 0.1
"""Velocity added per step by a push of 1: top speed PUSH / FRICTION = 1 unit per step."""
GOAL_REWARD = 100.0
ACTION_COST = 0.05
"""Cost per step of a push a: ACTION_COST · a²."""
START = 2.0
"""Episodes start at rest at x ~ U(−START, START)."""
TIME_LIMIT = 100
SOLVED = 90.0


class FarGoal(gym.Env):
    """A point mass with friction on a line, paid only at x ≥ GOAL (see the module's docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, render_mode: str | None = None):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.x = 0.0
        self.v = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.x / GOAL, self.v], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-START, START))
        self.v = 0.0
        return self._obs(), {}

    def step(self, action):
        a = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        self.v = (1.0 - FRICTION) * self.v + PUSH * a
        self.x += self.v
        reached = self.x >= GOAL
        reward = -ACTION_COST * a * a + (GOAL_REWARD if reached else 0.0)
        return self._obs(), reward, reached, False, {}


gym.register(
    "FarGoal-v0",
    entry_point="sparse_env:FarGoal",
    max_episode_steps=TIME_LIMIT,
    reward_threshold=SOLVED,
)

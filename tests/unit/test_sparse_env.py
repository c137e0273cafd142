"""`sparse_env:FarGoal-v0` (tests/sparse_env.py) is what its docstring and the exploration learning test say:
+100 only at the goal, ending the episode; 0.05 a² per step; 100 steps; a full push there at step 49; independent
noise never there, Ornstein–Uhlenbeck noise (rlfleet's `ActionNoise`) there in about one episode in five."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import sparse_env

from rlfleet.algos.noise import ActionNoise


def run_episode(env, act, seed):
    """(steps, return, terminated) of one episode with actions `act(t)`."""
    env.reset(seed=seed)
    total = 0.0
    for t in range(1, 10_000):
        _, reward, terminated, truncated, _ = env.step(np.asarray(act(t), np.float32).reshape(1))
        total += reward
        if terminated or truncated:
            return t, total, terminated
    raise AssertionError("the episode never ended")


def test_far_goal_pays_only_at_the_goal_and_costs_the_push():
    env = gym.make("sparse_env:FarGoal-v0")
    assert env.spec.max_episode_steps == 100 and env.spec.reward_threshold == 90.0
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    assert run_episode(env, lambda t: 0.0, seed=0) == (100, 0.0, False)  # doing nothing: return 0, time limit
    steps, ret, reached = run_episode(env, lambda t: 1.0, seed=0)
    assert reached and 48 <= steps <= 51 and ret == pytest.approx(100 - 0.05 * steps)
    steps, ret, reached = run_episode(env, lambda t: -0.4, seed=0)  # pushing away costs and pays nothing
    assert (steps, reached) == (100, False) and ret == pytest.approx(-0.05 * 0.16 * 100)
    assert not run_episode(env, lambda t: 0.4, seed=0)[2]  # a steady push of 0.4 is too weak
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2,) and obs.dtype == np.float32 and abs(obs[0]) <= 2 / 40 and obs[1] == 0.0


def far_goal_reached(next_actions, episodes=200, seed=0):
    """Share of `episodes` whose 100 steps under `next_actions(n)` (actions `[n]` for n envs) reach the goal,
    stepping `episodes` FarGoal envs side by side."""
    envs = [sparse_env.FarGoal() for _ in range(episodes)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
    reached = np.zeros(episodes, dtype=bool)
    for _ in range(sparse_env.TIME_LIMIT):
        actions = next_actions(episodes)
        for i, env in enumerate(envs):
            if not reached[i]:
                reached[i] = env.step(actions[i : i + 1])[2]
    return reached.mean()


def test_independent_noise_never_reaches_the_far_goal_and_ou_noise_does():
    rng = np.random.default_rng(0)
    assert far_goal_reached(lambda n: rng.uniform(-1.0, 1.0, n)) == 0.0
    assert far_goal_reached(lambda n: np.clip(rng.standard_normal(n), -1.0, 1.0)) == 0.0
    ou = ActionNoise("ou", sigma=1.0)  # as td3 with action_noise=ou, exploration_noise=1.0, from a zero actor
    assert 0.1 <= far_goal_reached(lambda n: np.clip(ou(n, 1, rng)[:, 0], -1.0, 1.0)) <= 0.3

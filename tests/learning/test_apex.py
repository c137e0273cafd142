"""Ape-X with 3 actor processes and one replay shard on the local backend: DQN solves CartPole-v1, TD3 solves
Pendulum-v1.

Actor processes interleave freely, so the runs are not bit-reproducible. Steps (and seconds) to solve measured
on this 2-core machine, greedy evaluation every 5,000 (CartPole) or 2,000 (Pendulum) steps:
- dqn, CartPole-v1: seed 0 45k (31 s), seed 1 30k (22 s), seed 2 30k (22 s); the budget of 100k steps leaves
  2.2x margin over the worst;
- td3, Pendulum-v1 (its defaults; actor 0 explores with σ = 0.2, the others with 0.2 · 0.4^3.5 and 0.2 · 0.4^7):
  seed 0 4,050 steps (14.6 s), seed 1 4,100 (13.7 s), seed 2 4,050 (16.6 s), as single-process TD3 (about 4k);
  the budget of 12k steps leaves 2.9x margin over the worst. (ddpg, seed 0: 4,150 steps, 15.4 s.)
"""

from __future__ import annotations

import pytest

from rlfleet.launch import train

pytestmark = pytest.mark.learning


def test_apex_dqn_with_three_actors_solves_cartpole(run_opts):
    result = train("dqn", "CartPole-v1", arch="apex", actors=3, steps=100_000, seed=0, eval_every=5_000, **run_opts)
    assert result["solved"], f"apex dqn: {result.result}"
    assert result["eval_return_mean"] >= 475  # over 10 greedy episodes (eval_episodes' default)


def test_apex_td3_with_three_actors_solves_pendulum(run_opts):
    result = train("td3", "Pendulum-v1", arch="apex", actors=3, steps=12_000, seed=0, eval_every=2_000, **run_opts)
    assert result["solved"], f"apex td3: {result.result}"
    assert result["eval_return_mean"] >= -250  # Pendulum-v1's solved return, over 10 greedy episodes

"""Ape-X DQN with 3 actor processes and one replay shard solves CartPole-v1 on the local backend.

Actor processes interleave freely, so the run is not bit-reproducible. Steps (and seconds) to solve measured on
this 2-core machine, greedy evaluation every 5,000 steps: seed 0 45k (31 s), seed 1 30k (22 s), seed 2 30k
(22 s); the budget of 100k steps leaves 2.2x margin over the worst.
"""

from __future__ import annotations

import pytest

from rlfleet.launch import train

pytestmark = pytest.mark.learning


def test_apex_dqn_with_three_actors_solves_cartpole(run_opts):
    result = train("dqn", "CartPole-v1", arch="apex", workers=3, steps=100_000, seed=0, eval_every=5_000, **run_opts)
    assert result["solved"], f"apex dqn: {result.result}"
    assert result["eval_return_mean"] >= 475  # over 10 greedy episodes (eval_episodes' default)

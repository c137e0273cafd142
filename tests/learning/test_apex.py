"""Ape-X with 3 actor processes and one replay shard on the local backend: DQN solves CartPole-v1, TD3 solves
Pendulum-v1.

Actor processes interleave freely, so the runs are not bit-reproducible.
"""

from __future__ import annotations

import pytest

from rlfleet.launch import train

pytestmark = pytest.mark.learning


@pytest.mark.slow  # -m slow: Ape-X DQN solves CartPole in CI in the shard-and-actor kill test and on two Ray nodes
def test_apex_dqn_with_three_actors_solves_cartpole(run_opts):
    # budget: 2.2x the most steps seeds 0-2 needed (docs/architectures/apex.md)
    result = train("dqn", "CartPole-v1", arch="apex", actors=3, steps=100_000, seed=0, eval_every=5_000, **run_opts)
    assert result["solved"], f"apex dqn: {result.result}"
    assert result["eval_return_mean"] >= 475  # over 10 greedy episodes (eval_episodes' default)


def test_apex_td3_with_three_actors_solves_pendulum(run_opts):
    # budget: 2.9x the most steps seeds 0-2 needed (docs/architectures/apex.md)
    result = train("td3", "Pendulum-v1", arch="apex", actors=3, steps=12_000, seed=0, eval_every=2_000, **run_opts)
    assert result["solved"], f"apex td3: {result.result}"
    assert result["eval_return_mean"] >= -250  # Pendulum-v1's solved return, over 10 greedy episodes

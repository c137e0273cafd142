"""GALA-A2C: 4 gossip learner processes on the directed ring solve CartPole-v1, the averaged model evaluated.

Measured on this 2-core machine (AMD EPYC, shared with other jobs), `rlfleet train a2c --arch gossip --learners 4
--env CartPole-v1 --eval-every 4000`, seeds 0-2: solved at 16,000 / 12,032 / 64,000 env steps, 18-20 s wall
each (about 8 s of it starting the four learner processes); the budget of 100,000 steps leaves 1.5x margin
over the slowest seed.
"""

from __future__ import annotations

import pytest

from rlfleet.launch import train

pytestmark = pytest.mark.learning


def test_gala_a2c_with_four_learners_solves_cartpole(run_opts):
    result = train("a2c", "CartPole-v1", arch="gossip", learners=4, steps=100_000, seed=0, eval_every=4_000,
                   **run_opts)  # fmt: skip
    assert result["solved"], f"a2c on gossip: {result.result}"
    assert result["eval_return_mean"] >= 475  # over 10 greedy episodes (eval_episodes' default) of the average

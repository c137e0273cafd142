"""GALA-A2C: 4 gossip learner processes on the directed ring solve CartPole-v1, the averaged model evaluated."""

from __future__ import annotations

from functools import partial

import pytest
from seeds import first_solving

from rlfleet.launch import train

pytestmark = pytest.mark.learning


def test_gala_a2c_with_four_learners_solves_cartpole(run_opts):
    # budget: 1.5x the most steps seeds 0-2 needed (docs/architectures/gossip.md). Up to three seeds: GALA's learners
    # mix whatever their neighbours posted last, an interleaving that varies with the machine's load (one run of a
    # loaded full test run peaked at 429.6 of 475 and ended at 151.8; a learning test asserts the algorithm, not one
    # run's luck)
    gala = partial(train, "a2c", "CartPole-v1", arch="gossip", learners=4, steps=100_000, eval_every=4_000, **run_opts)
    result, tried = first_solving(gala)
    assert result["solved"], f"a2c on gossip: {tried}"
    assert result["eval_return_mean"] >= 475  # over 10 greedy episodes (eval_episodes' default) of the average

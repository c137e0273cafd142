"""PALA: gossip learners as Ray actors, their parameters through a mailbox actor and the object store. With the
learning rate 0 every round is exactly X ← P X (the round order holds through the mailbox actor); PALA-A2C with 4
learners solves CartPole-v1."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.arch.gossip import GossipRunner, Topology, consensus_distance
from rlfleet.launch import train

pytestmark = pytest.mark.usefixtures("ray_instance")


def test_rounds_through_the_mailbox_actor_are_exactly_x_from_p_x(monkeypatch, run_opts):
    seen: dict[int, np.ndarray] = {}
    average_round = GossipRunner.average_round

    def record(self, round_, params):
        seen[round_] = params.copy()
        average_round(self, round_, params)

    monkeypatch.setattr(GossipRunner, "average_round", record)
    learners, rounds = 4, 20
    train("a2c", "CartPole-v1", arch="gossip", learners=learners, backend="ray", distinct_init=True, state_every=1,
          steps=learners * 8 * rounds, overrides={"n_envs": 2, "rollout_len": 4, "lr": 0.0},
          stop_return=float("inf"), eval_every=10**9, **run_opts)  # fmt: skip
    done = sorted(seen)
    assert done == list(range(len(done))) and len(done) >= rounds - 2
    p = Topology.make("ring", learners).matrix(0)
    for t in done[1:]:
        np.testing.assert_allclose(seen[t], p @ seen[t - 1].astype(np.float64), atol=2e-6, err_msg=f"round {t}")
    assert consensus_distance(seen[done[-1]]) < 0.01 * consensus_distance(seen[0])


@pytest.mark.learning
def test_pala_a2c_with_four_ray_actor_learners_solves_cartpole(run_opts):
    result = train("a2c", "CartPole-v1", arch="gossip", learners=4, backend="ray", steps=100_000, seed=0,
                   eval_every=4_000, **run_opts)  # fmt: skip
    assert result["solved"], f"a2c on gossip with ray: {result.result}"
    assert result["eval_return_mean"] >= 475

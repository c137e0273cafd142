"""A2C on the data_parallel, grad_parallel, async_grad and param_server architectures, and PPO on allreduce, solve
CartPole-v1 with 2 worker processes, and A2C with 2 workers on the serial backend (the ray backend's runs are in
tests/ray).

Worker processes interleave freely, so these runs are not bit-reproducible. Steps to solve measured here
over seeds 0-4 (2-core AMD EPYC, greedy evaluation every 5,000 steps): data_parallel 5k-40k; with A2C's own
RMSprop at the centre or servers (their default) grad_parallel 5k-35k, async_grad (one gradient per step)
5k-55k, param_server (2 servers) 5k-30k (with the Shared RMSProp, their default before: 45k-55k, 15k-35k,
35k-45k); PPO on allreduce 15k-40k (seed 0 in 10-11 s); the budgets leave 2.5-4x margin over the worst of them.
"""

from __future__ import annotations

import pytest

from rlfleet.launch import train

pytestmark = pytest.mark.learning

BUDGETS = {"data_parallel": 100_000, "grad_parallel": 150_000, "async_grad": 150_000, "param_server": 150_000}
OPTIONS = {"param_server": {"shards": 2}}


@pytest.mark.parametrize("arch", list(BUDGETS))
def test_a2c_solves_cartpole_with_two_worker_processes(arch, run_opts):
    result = train("a2c", "CartPole-v1", arch=arch, workers=2, steps=BUDGETS[arch], seed=0, eval_every=5_000,
                   **OPTIONS.get(arch, {}), **run_opts)  # fmt: skip
    assert result["solved"], f"a2c on {arch}: {result.result}"
    assert result["eval_return_mean"] >= 475


@pytest.mark.parametrize("arch", ["data_parallel", "async_grad", "param_server"])
def test_a2c_solves_cartpole_with_two_serial_workers(arch, run_opts):
    """The same runs, every role in this process one after another: deterministic for the seed."""
    result = train("a2c", "CartPole-v1", arch=arch, workers=2, backend="serial", steps=BUDGETS[arch], seed=0,
                   eval_every=5_000, **OPTIONS.get(arch, {}), **run_opts)  # fmt: skip
    assert result["solved"], f"a2c on {arch}, serial: {result.result}"
    assert result["eval_return_mean"] >= 475


def test_ppo_solves_cartpole_on_two_allreduce_learners(run_opts):
    """PPO's own update (10 epochs of minibatches) in 2 learner processes that average their gradients in every
    optimizer step."""
    result = train("ppo", "CartPole-v1", arch="allreduce", workers=2, steps=100_000, seed=0, eval_every=5_000,
                   **run_opts)  # fmt: skip
    assert result["solved"], f"ppo on allreduce: {result.result}"
    assert result["eval_return_mean"] >= 475  # over 10 greedy episodes (eval_episodes' default)

"""A2C on the data_parallel, grad_parallel, async_grad and param_server architectures, and PPO on allreduce, solve
CartPole-v1 with 2 worker processes, and A2C with 2 workers on the serial backend (the ray backend's runs are in
tests/ray).

Worker processes interleave freely, so these runs are not bit-reproducible.
"""

from __future__ import annotations

import pytest

from rlfleet.launch import train

pytestmark = pytest.mark.learning

# budgets (docs/architectures/<arch>.md, "Tests"): grad_parallel's processes solve at one step count for a seed, so
# its budget is a margin over seeds 0-4; the other three interleave differently from run to run, so theirs are over
# 2x the most steps in 50 or more runs of seed 0, quiet and with two runs side by side (data_parallel: 5k-135k)
BUDGETS = {"data_parallel": 300_000, "grad_parallel": 150_000, "async_grad": 300_000, "param_server": 300_000}
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
    # budget: 2.5x the most steps seeds 0-4 needed (docs/architectures/allreduce.md)
    result = train("ppo", "CartPole-v1", arch="allreduce", workers=2, steps=100_000, seed=0, eval_every=5_000,
                   **run_opts)  # fmt: skip
    assert result["solved"], f"ppo on allreduce: {result.result}"
    assert result["eval_return_mean"] >= 475  # over 10 greedy episodes (eval_episodes' default)

"""The serial and local backends run the same roles and the same coordinator loop: with one worker and a fixed
seed, a synchronous architecture ends with exactly the same weights on both (nothing interleaves when there is
one worker, so the order of items cannot differ)."""

from __future__ import annotations

import pytest
import torch

from rlfleet.launch import train
from rlfleet.run.checkpoint import load_checkpoint

RUNS = {  # (algorithm, architecture): steps
    ("a2c", "data_parallel"): 1_200,
    ("a2c", "grad_parallel"): 1_200,
}  # not replay on data_parallel: its samplers collect a block ahead, with whichever weights are newest then


def final_weights(run_opts, algo: str, arch: str, steps: int, backend: str, **extra: object) -> dict[str, torch.Tensor]:
    result = train(algo, "CartPole-v1", arch=arch, workers=1, backend=backend, steps=steps, seed=3, eval_every=steps,
                   eval_episodes=1, stop_return=1e9, name=backend, **extra, **run_opts)  # fmt: skip
    assert result["env_steps"] >= steps and result["updates"] > 0
    return load_checkpoint(result["checkpoint"])["algo"]["model"]


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(("algo", "arch"), list(RUNS))
def test_serial_and_local_backends_end_with_the_same_weights(algo, arch, run_opts):
    serial = final_weights(run_opts, algo, arch, RUNS[algo, arch], "serial")
    local = final_weights(run_opts, algo, arch, RUNS[algo, arch], "local")
    assert_same(serial, local)

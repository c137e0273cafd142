"""`benchmarks/device_learner.py updates` builds and runs every case it times (on the CPU here), so that the table the
GPU machine measures cannot rot: each case's learner is built as the benchmark builds it, and one call of it runs."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device_learner.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("device_learner", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_learner"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("device_learner", None)


def test_every_timed_case_runs_on_the_cpu(bench):
    assert len(bench.CASES) >= 10
    for make in bench.CASES.values():
        torch.manual_seed(0)
        step = make("cpu")
        step()
        step()  # a second call: what the timing loop repeats

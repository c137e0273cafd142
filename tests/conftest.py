"""Shared test settings: one torch thread (as in every rlfleet worker), quiet runs in a temp folder."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def run_opts(tmp_path):
    """Options for `rlfleet.train` that keep test runs quiet and inside the test's temp folder."""
    return {"logdir": str(tmp_path), "progress": False}

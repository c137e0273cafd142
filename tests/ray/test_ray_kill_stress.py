"""The fault drill of `drills.py` on the `ray` backend: each architecture's worker actors SIGKILLed at random
moments, then one SIGSTOPped (killed by `ray.kill` for want of a heartbeat), each restarted, and the run stops
cleanly on Ctrl-C. Ape-X and allreduce run by default (no other Ray test kills their workers); the
other architectures, whose workers' deaths other Ray tests cover, with `pytest -m slow`."""

from __future__ import annotations

import pytest
from drills import RUNS, drill_workers

DEFAULT = ("apex", "allreduce")
ON_RAY = [arch for arch in RUNS if arch != "hogwild"]  # hogwild shares memory: local only


@pytest.mark.parametrize(
    "arch", [arch if arch in DEFAULT else pytest.param(arch, marks=pytest.mark.slow) for arch in ON_RAY]
)
def test_worker_actors_killed_or_stopped_at_random_moments_are_always_restarted(tmp_path, arch):
    drill_workers(tmp_path, arch, kills=2, seed=list(RUNS).index(arch), backend="ray")

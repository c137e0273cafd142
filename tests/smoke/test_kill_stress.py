"""Workers SIGKILLed at random moments, again and again, then one SIGSTOPped, on every multi-process architecture of
the `local` backend (`drills.py`): the coordinator must notice every death and the hang, restart the worker and go
on, and still stop cleanly at the end.

The default run kills 1 worker and stops 1 per architecture (grad_parallel and async_grad, whose workers run in
data_parallel's pool, with `-m slow`); `pytest -m slow` runs the long version too (20 kills per architecture, 160
in all)."""

from __future__ import annotations

import pytest
from drills import RUNS, drill_workers

# grad_parallel and async_grad drive their workers through the same pool as data_parallel: slow (CI time)
SAME_POOL = {"grad_parallel", "async_grad"}


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a in SAME_POOL else a for a in RUNS])
def test_workers_killed_or_stopped_at_random_moments_are_always_restarted(tmp_path, arch):
    drill_workers(tmp_path, arch, kills=1, seed=list(RUNS).index(arch))


@pytest.mark.slow
@pytest.mark.parametrize("arch", RUNS)
def test_a_hundred_and_sixty_kills_across_the_architectures(tmp_path, arch):
    drill_workers(tmp_path, arch, kills=20, stops=0, seed=100 + list(RUNS).index(arch))

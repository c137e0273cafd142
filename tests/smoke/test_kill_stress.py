"""Workers SIGKILLed at random moments, again and again, then one SIGSTOPped, on every multi-process architecture of
the `local` backend (`drills.py`): the coordinator must notice every death and the hang, restart the worker and go
on, and still stop cleanly at the end.

The default run kills 1 worker and stops 1 per architecture; `pytest -m slow` runs the long version (20 kills per
architecture, 160 in all)."""

from __future__ import annotations

import pytest
from drills import RUNS, drill_workers


@pytest.mark.parametrize("arch", RUNS)
def test_workers_killed_or_stopped_at_random_moments_are_always_restarted(tmp_path, arch):
    drill_workers(tmp_path, arch, kills=1, seed=list(RUNS).index(arch))


@pytest.mark.slow
@pytest.mark.parametrize("arch", RUNS)
def test_a_hundred_and_sixty_kills_across_the_architectures(tmp_path, arch):
    drill_workers(tmp_path, arch, kills=20, stops=0, seed=100 + list(RUNS).index(arch))

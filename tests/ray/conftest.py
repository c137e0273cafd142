"""The `ray` backend's tests share one Ray instance per test module (starting one takes seconds). Its processes
must be able to import the tests' helper roles (`spawned`), so the tests folder is on their PYTHONPATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before ray is imported: every listener on 127.0.0.1
os.environ["RAY_AUTH_MODE"] = "token"  # read at import too: token authentication also for the simulated clusters
pytest.importorskip("ray", reason="the ray extra is not installed")

TESTS = str(Path(__file__).resolve().parents[1])


def with_tests_on_path(env: dict[str, str]) -> dict[str, str]:
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="module")
def ray_instance():
    """A private Ray instance on 127.0.0.1 for the module's tests (runs use it instead of starting their own)."""
    from rlfleet.backends.ray_instance import start_private_instance, stop_private_instance

    previous = os.environ.get("PYTHONPATH")
    os.environ.update(with_tests_on_path(dict(os.environ)))
    ray = start_private_instance(4)
    try:
        yield ray
    finally:
        stop_private_instance()
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous

"""The `ray` backend's tests share one Ray instance per test module (starting one takes seconds). Its processes
must be able to import the tests' helper roles (`spawned`), so the tests folder is on their PYTHONPATH. Under
pytest-xdist (`pytest -n 2`) one Ray module runs at a time, whichever worker has it: each instance and cluster is the
machine's only one while it runs, as the `auto` tests need (`one_ray_module_at_a_time`)."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
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


@pytest.fixture(scope="module", autouse=True)
def one_ray_module_at_a_time():
    """An exclusive lock on a file for as long as the module runs (autouse: set up before the module's Ray instance or
    cluster); a worker of another module waits for it. The lock goes with the process, should it die."""
    with open(Path(tempfile.gettempdir()) / "rlfleet-ray-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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


@pytest.fixture(autouse=True)
def cpus_of_the_last_test_given_back():
    """Before each test, wait (a minute at most) until the module's Ray instance has every CPU free again: the actors
    of the test before (a killed or hung one above all) may still hold theirs for a moment after it ended, and a run
    whose roles ask for all of them would wait for them past its start timeout."""
    import ray

    if ray.is_initialized():
        total = ray.cluster_resources().get("CPU", 0.0)
        deadline = time.monotonic() + 60
        while ray.available_resources().get("CPU", 0.0) < total and time.monotonic() < deadline:
            time.sleep(0.2)
    yield

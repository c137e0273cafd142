"""What workers and their coordinator share must never be locked: a worker killed at any instruction (SIGKILL, the
OOM killer) may not leave anything the coordinator then waits for. Real processes, really killed."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
import time

import pytest
from spawned import send_forever, send_items, send_then_hang

from rlfleet.backends.local import WorkerPool
from rlfleet.backends.shared_memory import StepCounter, StopFlag, WeightVersion

FORK = multiprocessing.get_context("fork")  # fast to start: these children only read shared memory
KILLS = 20


def _spin(read, shared, running) -> None:
    """Child: use the primitive as fast as possible (a worker's hot loop), forever."""
    read(shared)
    running.value = 1
    while True:
        read(shared)


def _finishes(action, timeout: float = 5.0) -> bool:
    """Does `action()` return within `timeout` seconds (run in a thread, so a hang cannot hang the test)?"""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive()


def _publish(weights: WeightVersion) -> int:
    with weights.writing():
        pass
    return weights.version


PRIMITIVES = {
    # name: (make it, what a worker does with it in its loop, what the coordinator then needs to do with it)
    "step-counter": (lambda: StepCounter(FORK, 3), lambda c: c.value, lambda c: (c.add(5), c.value)),
    "stop-flag": (lambda: StopFlag(FORK), lambda s: s.is_set(), lambda s: s.set()),
    "weight-version": (lambda: WeightVersion(FORK), lambda w: w.read(lambda: None), _publish),
}


@pytest.mark.parametrize("name", PRIMITIVES)
def test_a_reader_killed_at_any_moment_never_blocks_the_coordinator(name):
    make, read, coordinate = PRIMITIVES[name]
    rng = random.Random(0)
    for kill in range(KILLS):
        shared = make()
        running = FORK.RawValue("b", 0)
        child = FORK.Process(target=_spin, args=(read, shared, running), daemon=True)
        child.start()
        while not running.value:
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.01))  # a random moment of the hot loop
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL  # killed in its loop, not ended by an error
        assert _finishes(lambda shared=shared: coordinate(shared)), f"{name}: the coordinator hung after kill {kill}"


def test_pool_hands_out_credits_reports_a_crash_with_its_traceback_and_restarts_it():
    pool = WorkerPool(2, send_items, (["a", "b"], 1), credits=1)
    pool.start()
    try:
        first = [pool.get(w, timeout=60) for w in range(2)]
        assert sorted(first) == [(0, 0, "a"), (1, 0, "a")]
        assert pool.get(0, timeout=0.3) is None  # one credit: "b" waits until the coordinator used "a"
        pool.release(0, incarnation=0)
        assert pool.get(0, timeout=30) == (0, 0, "b")
        deadline = time.monotonic() + 30
        crashes = []
        while len(crashes) < 1 and time.monotonic() < deadline:  # worker 0 raises after its items
            crashes += [c for c in pool.check() if c.worker == 0]
            time.sleep(0.05)
        assert crashes and crashes[0].exitcode == 1 and "crashes on purpose" in crashes[0].traceback
        assert pool.incarnations[0] == 1 and pool.restarts >= 1
        assert pool.get(0, timeout=60) == (0, 1, "a")  # the next incarnation, with full credits
        pool.release(1, incarnation=0)  # worker 1 is still its first incarnation: it may send "b"
        assert pool.get(1, timeout=30) == (1, 0, "b")
    finally:
        pool.stop(timeout=1)
    assert pool.alive() == 0


def test_a_worker_killed_in_the_middle_of_a_message_cannot_stall_the_coordinator():
    """8 MB items take many pipe writes each: a SIGKILL lands inside one. The coordinator's reads never block on
    the dead worker's pipe; the half message is dropped and the restarted worker's items arrive."""
    pool = WorkerPool(1, send_forever, (8 << 20,), max_restarts=KILLS)
    pool.start()
    rng = random.Random(1)
    try:
        for _ in range(5):
            assert pool.get(0, timeout=60) is not None  # the worker is sending
            time.sleep(rng.uniform(0.0, 0.05))
            os.kill(pool.processes[0].pid, signal.SIGKILL)
            pool.processes[0].join(timeout=10)
            assert _finishes(lambda: [pool.get(0, timeout=0.5) for _ in range(3)])
            crashes = pool.check()
            assert [(c.worker, c.exitcode) for c in crashes] == [(0, -signal.SIGKILL)]
    finally:
        pool.stop(timeout=1)


def test_a_silent_worker_is_not_killed_while_a_service_it_calls_does_not_answer():
    """A worker blocked in a call to a hung service beats no more: its heartbeat is held while a service it calls
    (`waits_on`) does not answer, and counts again from the moment the service answers."""

    class Unwell:
        unwell_at = float("-inf")

    services = Unwell()
    pool = WorkerPool(1, send_then_hang, (), heartbeat_s=1.0)
    pool.waits_on = [services]
    pool.start()
    try:
        assert pool.get(0, timeout=60) == (0, 0)
        held_until = time.monotonic() + 3.0
        while time.monotonic() < held_until:
            services.unwell_at = time.monotonic()  # as `ServiceGroup.check` marks a service whose ping waits
            assert pool.check() == []
            time.sleep(0.1)
        recovered = time.monotonic()
        crashes = []
        while not crashes:
            assert time.monotonic() - recovered < 30
            crashes = pool.check()
            time.sleep(0.05)
        assert time.monotonic() - services.unwell_at >= 1.0 and "hung" in crashes[0].describe()
    finally:
        pool.stop(timeout=1)


def test_a_hung_worker_is_killed_for_want_of_a_heartbeat_and_restarted():
    """A worker that stays alive but silent (stuck in an env step, a deadlock) is not noticed by its exit code:
    after `heartbeat_s` without a beat it is killed, reported as hung, and its next incarnation starts."""
    pool = WorkerPool(1, send_then_hang, (), heartbeat_s=1.0)
    pool.start()
    try:
        assert pool.get(0, timeout=60) == (0, 0)
        deadline = time.monotonic() + 30
        crashes = []
        while not crashes and time.monotonic() < deadline:
            crashes = pool.check()
            time.sleep(0.1)
        assert [(c.worker, c.exitcode) for c in crashes] == [(0, -signal.SIGKILL)]
        assert "no heartbeat" in crashes[0].describe() and "hung" in crashes[0].describe()
        assert pool.get(0, timeout=60) == (0, 1)  # restarted
    finally:
        pool.stop(timeout=1)

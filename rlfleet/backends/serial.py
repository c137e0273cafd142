"""The `serial` backend: every role in the calling process, made on demand and produced one after another.

Deterministic for a fixed seed, and a role's exception surfaces where it happened: for tests and debugging.
`get(worker)` runs that worker's `produce` once (credits are not needed: nothing runs ahead), `get_any` takes
the workers in turn, and the shared state is the coordinator's own (networks as they are; the same lock-free
counters as the local backend, within one process). Services are plain objects in this process too: a handle's
`submit` runs the method at once, and its `Pending` holds the result (or the exception, raised by `result`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from rlfleet.backends.base import Backend, Crash, Pending, RoleGroup, ServiceGroup, ServiceHandle
from rlfleet.backends.shared_memory import StepCounter, StopFlag


class SerialGroup(RoleGroup):
    """N roles in this process, produced on demand."""

    def __init__(
        self,
        make_role: Callable[[int, int], Any],
        n_workers: int,
        counter: StepCounter,
        stop: StopFlag,
        total_steps: int,
    ):
        self.n_workers = n_workers
        self.incarnations = [0] * n_workers
        self.restarts = 0
        self.counter, self.stop_flag, self.total_steps = counter, stop, total_steps
        self.roles = [make_role(w, 0) for w in range(n_workers)]
        self._next = 0

    def get(self, worker_id: int, timeout: float) -> Any | None:
        if self.stop_flag.is_set() or self.counter.value >= self.total_steps:
            return None
        return self.roles[worker_id].produce(self.counter.value, self.stop_flag)

    def get_any(self, timeout: float) -> Any | None:
        worker_id = self._next
        self._next = (worker_id + 1) % self.n_workers
        return self.get(worker_id, timeout)

    def release(self, worker_id: int, incarnation: int) -> None:
        """Nothing to give back: a serial role never runs ahead."""

    def check(self) -> list[Crash]:
        return []  # a role's exception is raised where it happens

    def alive(self) -> int:
        return self.n_workers if self.roles else 0

    def stop(self) -> None:
        for role in self.roles:
            role.close()
        self.roles = []


class Done(Pending):
    """A call that has already run: its result, or the exception it raised."""

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class SerialHandle(ServiceHandle):
    """A service object of this process, called directly."""

    def __init__(self, index: int, service: Any):
        self.index = index
        self.service = service

    def submit(self, method: str, *args: Any) -> Pending:
        try:
            return Done(getattr(self.service, method)(*args))
        except Exception as exc:  # raised where the result is read, as a process's service does
            return Done(error=exc)


class SerialServices(ServiceGroup):
    """N service objects in this process; they cannot die apart from it."""

    def __init__(self, make_service: Callable[[int, int], Any], n: int):
        self.handles = [SerialHandle(i, make_service(i, 0)) for i in range(n)]
        self.incarnations = [0] * n
        self.restarts = 0

    def check(self) -> list[Crash]:
        return []

    def alive(self) -> int:
        return len(self.handles)

    def stop(self) -> None:
        self.handles = []


class SerialBackend(Backend):
    """Every role in the calling process."""

    name = "serial"
    in_process = True
    has_services = True

    def share(self, modules: dict[str, nn.Module]) -> dict[str, nn.Module]:
        return modules  # the roles live in this process: nothing needs to move to shared memory

    def start(
        self,
        make_role: Callable[[int, int], Any],
        n_workers: int,
        counter: StepCounter,
        stop: StopFlag,
        total_steps: int,
        credits: int | None = None,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        heartbeat_s: float | None = None,
    ) -> SerialGroup:
        return SerialGroup(make_role, n_workers, counter, stop, total_steps)

    def start_services(
        self,
        make_service: Callable[[int, int], Any],
        n: int,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        name: str = "service",
        heartbeat_s: float | None = None,
    ) -> SerialServices:
        return SerialServices(make_service, n)  # in this process: it cannot hang apart from the coordinator

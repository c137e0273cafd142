"""The backend interface: where an architecture's roles run, behind one small interface.

An architecture is written once, as its roles (samplers, gradient workers, actor-learners) and one coordinator
loop. A role is an object made by `make_role(worker_id, incarnation)` with `produce(global_steps, stop)` (the
next item for the coordinator, or None to stop) and `close()`. The backend starts N of them
(`Backend.start`), and the coordinator talks to the `RoleGroup` it gets back: `get(worker, timeout)` /
`get_any(timeout)` for the next item, `release(worker, incarnation)` to give a worker back the credit of an
item it has used (a worker is never more than `credits` items ahead), `check()` for the workers that died
(reported with their traceback and restarted, up to `max_restarts`: one `RestartBudget` for every group the backend
starts with that limit, roles and services together), `stop()`. The coordinator loop never asks which backend it
has.

- `serial`: every role in the calling process, produced on demand, deterministic (tests, debugging);
- `local`: one `spawn`ed process per role, shared memory for the networks, a pipe per worker (the default).

What the coordinator and its roles share (the networks, the step counter, the stop flag, the weight version)
comes from the backend too (`share`, `step_counter`, `stop_flag`, `weight_version`).

Services: long-lived objects that roles (and the coordinator) call directly, such as the shards of a parameter
server. `Backend.start_services(make_service, n, max_restarts)` builds `make_service(index, incarnation)` n
times (`serial`: in the calling process; `local`: one `spawn`ed process each) and returns a `ServiceGroup`:

- `handles[i]`: a picklable `ServiceHandle` of service i, to pass to roles (in any process) or use in the
  coordinator: `call(method, *args)` runs `service.method(*args)` and returns its result (or raises
  `ServiceError` with the service's traceback); `submit(method, *args)` sends the call and returns a
  `Pending` at once, whose `result(timeout=None)` waits for it (push to S services, then wait for all).
  A service runs its calls one at a time, in the order they arrive (as a Ray actor does). Arguments and
  results travel by value (pickled), never through shared memory.
- `check()`: the services that died since the last check (`Crash`, with their traceback where they raised),
  each restarted as its next incarnation (`make_service(index, incarnation + 1)`), up to `max_restarts` in
  all (the budget the backend's roles spend from too). Handles keep working across a restart: a call cut short by
  the service's death is sent again to each next incarnation (at least once), within the handle's `reconnect_s`
  (the restart limit, not the handle, ends a service that keeps dying); `result(timeout)` raises
  `TimeoutError` when its timeout comes first (the call stays pending), so a coordinator that restarts the
  services itself can wait in slices and `check()` in between.
- `stop()`: ends every service. Idempotent.

A backend that implements services says so (`has_services`); the base's `start_services` refuses.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from rlfleet.backends.mailboxes import Mailboxes, SharedMailboxes
from rlfleet.backends.shared_memory import StepCounter, StopFlag, WeightVersion

SPAWN = multiprocessing.get_context("spawn")
SLOW_S = 2.0
"""A service ping unanswered for this long holds the roles' heartbeat (they may be waiting on that service)."""
PING_EVERY_S = 1.0  # a service's next ping is sent this long after its last answer


def slow_after(heartbeat_s: float | None) -> float:
    """How long a ping may go unanswered before the service counts as not answering (`ServiceGroup.unwell_at`):
    `SLOW_S`, or half the heartbeat where that is shorter (the roles' clock is held before the service is killed)."""
    return SLOW_S if heartbeat_s is None else min(SLOW_S, heartbeat_s / 2)


class RunFailure(RuntimeError):
    """Something a run cannot go on past (workers that keep crashing, roles that cannot be placed, a gossip peer
    gone): the architecture stops cleanly (checkpoint, `result.json` with `stopped_by` "failure") and then raises
    it, with `run_dir` set to the run's folder."""

    run_dir: Path | None = None


class WorkerFailure(RunFailure):
    """Workers kept crashing: more restarts than the run allows."""


class StoppedWhileStarting(Exception):
    """The run's stop flag was set (a Ctrl-C) while a group waited for its roles to start: the roles it had started
    are stopped, and the run stops as on any stop request (`stopped_by` "interrupted")."""


class ServiceError(RuntimeError):
    """A service's method raised: the message's first line says what it raised, the rest is the service's traceback.
    Where the coordinator's call gets it, the run stops as on a `RunFailure` (`rlfleet.run.runner.FAILURES`)."""

    @classmethod
    def of(cls, index: int, method: str, traceback: str) -> ServiceError:
        """The error of service `index`'s `method`, which raised with `traceback` (as its process wrote it)."""
        raised = raised_line(traceback) or "an exception"
        return cls(f"service {index}'s {method} raised {raised}\n{traceback.rstrip()}")


def raised_line(traceback: str) -> str:
    """What a traceback says was raised: its last line ("ValueError: boom"); "" for none."""
    return (traceback.strip().splitlines() or [""])[-1].strip()


class ServiceUnavailable(ConnectionError):
    """A service could not be reached (dead and not restarted) for longer than its handle waits. Where the
    coordinator's call gets it, the run stops as on a `RunFailure` (`rlfleet.run.runner.FAILURES`)."""


class RestartBudget:
    """The restarts that the groups a backend starts with the same `limit` may make (`Backend.restart_budget`): a
    run starts all of its groups (roles, services, gossip mailboxes) with `--max-restarts`, so they share one budget.
    Each group's `check` spends one per crash it restarts (`spend`); the one past the limit is a `WorkerFailure`."""

    def __init__(self, limit: int):
        self.limit = limit
        self.spent = 0
        self.failure: WorkerFailure | None = None

    def spend(self, what: str, own: int, crash: Crash) -> None:
        """One restart of a group that names its crashes `what` ("workers", "replay shards") and has now restarted
        `own` times itself: a `WorkerFailure` if the budget is spent. Once spent, that same failure again, whatever
        crash is met next: the one past the limit is not restarted, so a later check meets it again and it is not
        another crash."""
        if self.failure is not None:
            raise self.failure
        self.spent += 1
        if self.spent <= self.limit:
            return
        counted = "once" if own == 1 else f"{own} times"
        if own != self.spent:
            counted += f", {self.spent} restarts in all with the run's other roles and services"
        self.failure = WorkerFailure(f"{what} crashed {counted} (limit {self.limit}); last: {crash.describe()}")
        raise self.failure


@dataclass
class Crash:
    worker: int
    exitcode: int | None
    traceback: str | None
    role: str = "worker"
    """What died: "worker" for a role, or the name its `ServiceGroup` was started with."""

    def describe(self) -> str:
        how = f" (exit code {self.exitcode})" if self.exitcode is not None else ""  # None: not a process we started
        if self.exitcode is not None and self.exitcode < 0:
            with contextlib.suppress(ValueError):
                how = f" (killed by {signal.Signals(-self.exitcode).name})"
        text = f"{self.role} {self.worker} died{how}"
        traceback = (self.traceback or "").strip()
        if not traceback:
            return text
        text = f"{text}: {raised_line(traceback)}"  # what it raised, or why (a hung process killed): the run's one line
        return text if "\n" not in traceback else f"{text}\n{traceback}"


class RoleGroup(ABC):
    """N running instances of one role, as the coordinator sees them."""

    n_workers: int
    incarnations: list[int]
    """How many times each worker has been restarted."""
    restarts: int
    """Restarts so far, over all workers."""
    waits_on: list[ServiceGroup] = []
    """The services the roles call: while one of them does not answer its pings (`ServiceGroup.unwell_at`), the
    roles' heartbeat is held (a role blocked in a call to a hung service is not hung itself)."""

    def excused_at(self) -> float:
        """The last time (`time.monotonic`) a service the roles call was seen not answering: a role's silence
        counts from its last sign of life or from then, whichever is later."""
        return max((services.unwell_at for services in self.waits_on), default=float("-inf"))

    @abstractmethod
    def get(self, worker_id: int, timeout: float) -> Any | None:
        """The next item of one worker's current incarnation, or None after `timeout` seconds."""

    @abstractmethod
    def get_any(self, timeout: float) -> Any | None:
        """The next item of whichever worker has one (taking turns), or None after `timeout` seconds."""

    @abstractmethod
    def release(self, worker_id: int, incarnation: int) -> None:
        """Give a worker back the credit of an item the coordinator has used (if that incarnation still runs)."""

    @abstractmethod
    def check(self) -> list[Crash]:
        """Workers that died since the last check; each is restarted (the next incarnation)."""

    @abstractmethod
    def alive(self) -> int:
        """Workers running now."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every worker (they watch the stop flag; what is left is terminated). Idempotent."""


class Pending(ABC):
    """A call sent to a service (`ServiceHandle.submit`) whose result has not been read yet."""

    @abstractmethod
    def result(self, timeout: float | None = None) -> Any:
        """The call's result; raises `ServiceError` if the method raised, `TimeoutError` after `timeout` seconds
        (the call stays pending: ask again), `ServiceUnavailable` if the service stayed unreachable."""


class ServiceHandle(ABC):
    """How a role or the coordinator reaches one service. Picklable: each process that unpickles one opens its own
    connection when it first calls."""

    index: int

    @abstractmethod
    def submit(self, method: str, *args: Any) -> Pending:
        """Send `service.method(*args)` and return at once."""

    def call(self, method: str, *args: Any) -> Any:
        """`service.method(*args)`, waited for."""
        return self.submit(method, *args).result()


class ServiceGroup(ABC):
    """N running services, as the coordinator sees them."""

    handles: list[ServiceHandle]
    incarnations: list[int]
    """How many times each service has been restarted."""
    restarts: int
    """Restarts so far, over all services."""
    unwell_at: float = float("-inf")
    """The last time (`time.monotonic`) `check()` saw a service's ping unanswered for `slow_after(heartbeat_s)`."""

    @abstractmethod
    def check(self) -> list[Crash]:
        """Services that died since the last check, and those that did not answer a ping for the heartbeat
        (killed as hung); each is restarted (the next incarnation)."""

    @abstractmethod
    def alive(self) -> int:
        """Services running now."""

    @abstractmethod
    def stop(self) -> None:
        """End every service. Idempotent."""


class Backend(ABC):
    """Starts roles and provides what the coordinator shares with them. Made from the run's architecture
    options (`opts`: the backend's own options are among them) and its folder (`run_dir`: where it may keep a log of
    its own; None outside a run); `close()` at the end of the run."""

    name: str
    in_process: bool
    """Roles run in the coordinator's process, one item when asked (a role should make its items small)."""
    shares_memory: bool = True
    """Roles see the coordinator's networks in place (one machine): what lock-free hogwild updates need."""
    host: str = "127.0.0.1"
    """The address at which roles reach a server the coordinator opens (a rendezvous store, for instance)."""
    has_services: bool = False
    """It implements `start_services` (architectures that need services refuse the others before they start)."""

    def __init__(self, opts: Any = None, run_dir: Path | None = None):
        self.opts = opts
        self.run_dir = run_dir
        self._budgets: dict[int, RestartBudget] = {}

    @classmethod
    def check_options(cls, opts: Any) -> None:
        """Refuse options this backend cannot run with, before the run writes anything (a `ConfigError`)."""
        return None  # serial and local run with any

    @classmethod
    def on_cluster(cls, opts: Any) -> bool:
        """Whether the roles go to a cluster whose own resources decide what fits (its scheduler places them, the
        others wait), not this machine's cores and GPUs."""
        return False  # serial and local: this machine

    def restart_budget(self, max_restarts: int) -> RestartBudget:
        """The one `RestartBudget` of every group this backend starts with `max_restarts`: a run's roles, services
        and gossip mailboxes, all started with `--max-restarts`, count their restarts together."""
        if max_restarts not in self._budgets:
            self._budgets[max_restarts] = RestartBudget(max_restarts)
        return self._budgets[max_restarts]

    def close(self) -> None:
        """Give back what the backend itself started (a Ray instance, for one). Idempotent."""
        return None  # serial and local start nothing beyond their roles, which `RoleGroup.stop` stops

    @abstractmethod
    def share(self, modules: dict[str, nn.Module]) -> dict[str, nn.Module]:
        """The algorithm's networks as the roles will see them (in shared memory where roles are processes)."""

    def step_counter(self, slots: int) -> StepCounter:
        """A global step counter with `slots` writers (`value`, `add(n, slot)`, `set(total)`); on one machine, a
        lock-free shared integer per slot."""
        return StepCounter(SPAWN, slots)

    def stop_flag(self) -> StopFlag:
        """The coordinator's "stop now" (`set()`, `is_set()`)."""
        return StopFlag(SPAWN)

    def weight_version(self) -> WeightVersion:
        """The version of the published weights (`version`, `set`, `writing()`, `read(copy, stop)`)."""
        return WeightVersion(SPAWN)

    def mailboxes(
        self,
        n: int,
        size: int,
        start_round: int = 0,
        rejoin_round: Callable[[], int] | None = None,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        heartbeat_s: float | None = None,
    ) -> Mailboxes:
        """Gossip mailboxes of `n` learners for flat parameter vectors of `size` floats, every learner having
        posted and read round `start_round - 1`; on one machine, shared memory with a semaphore per learner (no
        process of its own: nothing to watch). Where they are a process of their own, their `keeper` restarts it
        empty (up to `max_restarts` times; `pids_file` as for services) when it dies or does not answer for
        `heartbeat_s`, and every learner rejoins at the round `rejoin_round()` names then."""
        return SharedMailboxes(SPAWN, n, size, start_round)

    @abstractmethod
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
    ) -> RoleGroup:
        """Start `n_workers` roles made by `make_role(worker_id, incarnation)`; each produces items with the global
        step count of `counter` until it reaches `total_steps` or `stop` is set. A role that shows no sign of
        life for `heartbeat_s` seconds (hung, not dead) is killed and restarted like a crashed one."""

    def start_services(
        self,
        make_service: Callable[[int, int], Any],
        n: int,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        name: str = "service",
        heartbeat_s: float | None = None,
    ) -> ServiceGroup:
        """Start `n` services made by `make_service(index, incarnation)` (picklable where services are processes);
        `name` is what their crashes are reported as; `pids_file`, if given, holds `{index: pid}` of the live
        ones (where they are processes); a service that does not answer a ping for `heartbeat_s` seconds (hung,
        not dead) is killed and restarted like a crashed one. A backend without services says so."""
        raise NotImplementedError(f"the {self.name} backend cannot start {name}s (no services)")

"""The `local` backend: roles as worker processes on this machine — spawn, report crashes with their traceback,
restart, stop.

Every worker is a `spawn`ed process running `target(worker_id, incarnation, outbox, *args)` with one torch
thread and Ctrl-C ignored (the coordinator alone reacts to it, then stops the workers itself). A worker
that raises sends its traceback home before exiting; one that is killed (SIGKILL, out of memory) is
noticed by its exit code. `check()` reports both and restarts the worker (the next incarnation, so it can
reseed), up to `max_restarts` over the run (a `RestartBudget` shared with the run's services). A worker whose
coordinator dies without stopping it exits by itself (it watches the parent's sentinel).

Each incarnation of a worker sends to the coordinator through a pipe of its own (`Outbox`), read in the
coordinator by a thread of its own into an in-process queue. Nothing between a worker and the coordinator
is locked, so no worker can die holding something the coordinator needs: the coordinator holds no copy
of a pipe's write end, so when its worker dies the reading thread sees the end of the pipe (also in the
middle of a message, which is dropped) and leaves; the coordinator itself never reads a pipe. With
`credits=k` a worker also has a semaphore of k credits: it takes one before it makes an item, and the
coordinator gives it back once it has used the item (`release`), so a worker is never more than k items
ahead. A restarted worker gets a new pipe and full credits; what its dead incarnation sent is dropped.

Services (`start_services`) are processes too, reached through sockets: see `rlfleet.backends.services`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Semaphore
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp
from torch import nn

from rlfleet.backends.base import Backend, Crash, RestartBudget, RoleGroup, ServiceGroup
from rlfleet.backends.child import child_setup
from rlfleet.backends.shared_memory import StepCounter, StopFlag

STARTUP_GRACE_S = 60.0  # time a starting worker has, beyond the heartbeat interval, for its first beat


class Outbox:
    """A worker's end of its way to the coordinator: `put(item)` sends through the worker's own pipe, `take_credit`
    waits for one of its credits (always granted without credits), `beat()` says it is alive (its slot of the
    pool's heartbeat times). Picklable to the worker at its start."""

    def __init__(
        self,
        conn: Connection,
        credit: Semaphore | None = None,
        beats: ctypes.Array[ctypes.c_double] | None = None,
        slot: int = 0,
    ):
        self.conn = conn
        self.credit = credit
        self.beats = beats
        self.slot = slot

    def beat(self) -> None:
        if self.beats is not None:
            self.beats[self.slot] = time.monotonic()  # one clock for every process of the machine

    def put(self, item: Any) -> None:
        self.conn.send(("item", item))

    def error(self, text: str) -> None:
        self.conn.send(("error", text))

    def take_credit(self, stop: StopFlag, poll_s: float = 0.1) -> bool:
        """Take one credit, waiting while there is none; False if `stop` got set first."""
        if self.credit is None:
            return not stop.is_set()
        while not stop.is_set():
            self.beat()  # waiting for the coordinator is not hanging
            if self.credit.acquire(timeout=poll_s):
                return True
        return False


def _bootstrap(
    target: Callable[..., None], worker_id: int, incarnation: int, outbox: Outbox, args: tuple[Any, ...]
) -> None:
    """Process entry point: one thread, Ctrl-C ignored, gone with the coordinator, exceptions sent home with
    their traceback."""
    child_setup()
    try:
        target(worker_id, incarnation, outbox, *args)
    except BaseException:
        with contextlib.suppress(Exception):
            outbox.error(traceback.format_exc())
        raise SystemExit(1) from None


class WorkerPool(RoleGroup):
    """N worker processes running the same target, restarted when they die, and what they send home.

    `get(worker_id, timeout)` and `get_any(timeout)` return the items the live incarnations sent (`Outbox.put`);
    `release(worker_id)` gives a worker back a credit. `pids_file`, if given, always holds `{worker_id: pid}`
    of the live workers (tests kill them through it). Restarts are spent from `budget` (the backend's, shared with
    its other groups), or from a budget of the pool's own of `max_restarts`.
    """

    def __init__(
        self,
        n_workers: int,
        target: Callable[..., None],
        args: tuple[Any, ...],
        max_restarts: int = 10,
        pids_file: Path | None = None,
        credits: int | None = None,
        poll_s: float = 5e-4,
        heartbeat_s: float | None = None,
        budget: RestartBudget | None = None,
    ):
        self.ctx = mp.get_context("spawn")
        self.n_workers = n_workers
        self.target = target
        self.args = args
        self.budget = budget if budget is not None else RestartBudget(max_restarts)
        self.pids_file = pids_file
        self.n_credits = credits
        self.poll_s = poll_s
        self.heartbeat_s = heartbeat_s
        self.beats = self.ctx.RawArray("d", n_workers)  # when each worker last said it is alive (time.monotonic)
        self.hung: dict[int, float] = {}  # workers killed for want of a heartbeat: how long they were silent
        self.processes: dict[int, Any] = {}
        self.incarnations = [0] * n_workers
        self.credits: list[Any] = [None] * n_workers
        self.inboxes: list[queue.SimpleQueue[tuple[int, Any]]] = [queue.SimpleQueue() for _ in range(n_workers)]
        self.readers: dict[int, threading.Thread] = {}
        self.tracebacks: dict[tuple[int, int], str] = {}
        self.restarts = 0
        self.stopping = False
        self._next = 0

    def start(self) -> None:
        for wid in range(self.n_workers):
            self._start(wid)
        self._write_pids()

    def _start(self, wid: int) -> None:
        """Start one incarnation. Ctrl-C is ignored while it starts (restarts too): the child inherits that, so a
        Ctrl-C that reaches the whole process group while it still imports cannot kill it."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            self._spawn(wid)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def _spawn(self, wid: int) -> None:
        incarnation = self.incarnations[wid]
        reader, writer = self.ctx.Pipe(duplex=False)
        if self.n_credits:
            self.credits[wid] = self.ctx.Semaphore(self.n_credits)
        process = self.ctx.Process(
            target=_bootstrap,
            args=(self.target, wid, incarnation, Outbox(writer, self.credits[wid], self.beats, wid), self.args),
            name=f"rlfleet-worker-{wid}",
            daemon=True,
        )
        self.beats[wid] = time.monotonic() + STARTUP_GRACE_S  # imports and env building before the first beat
        process.start()
        writer.close()  # the worker holds the only write end: its death ends the pipe
        self.processes[wid] = process
        thread = threading.Thread(
            target=self._receive, args=(reader, wid, incarnation), name=f"rlfleet-inbox-{wid}", daemon=True
        )
        thread.start()
        self.readers[wid] = thread

    def _receive(self, reader: Connection, wid: int, incarnation: int) -> None:
        """A reading thread: one incarnation's messages into its worker's inbox, until its pipe ends."""
        try:
            while True:
                kind, payload = reader.recv()
                if kind == "error":
                    self.tracebacks[wid, incarnation] = payload
                else:
                    self.inboxes[wid].put((incarnation, payload))
        except Exception:  # the end of the pipe (EOFError, also mid-message), or a message that cannot be read
            pass
        finally:
            reader.close()

    def _write_pids(self) -> None:
        if self.pids_file is not None:
            pids = {str(w): p.pid for w, p in self.processes.items() if p.is_alive()}
            tmp = self.pids_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(pids))
            os.replace(tmp, self.pids_file)

    # ----------------------------------------------------------------------------------------- items
    def get(self, worker_id: int, timeout: float) -> Any | None:
        """The next item of one worker's live incarnation, or None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        inbox = self.inboxes[worker_id]
        while True:
            try:
                incarnation, item = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if incarnation == self.incarnations[worker_id]:
                return item

    def get_any(self, timeout: float) -> Any | None:
        """The next item of whichever worker has one (taking turns), or None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        n = self.n_workers
        while True:
            for i in range(n):
                wid = (self._next + i) % n
                item = self.get(wid, 0.0)
                if item is not None:
                    self._next = (wid + 1) % n
                    return item
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_s)

    def release(self, worker_id: int, incarnation: int) -> None:
        """Give a worker back the credit of an item the coordinator has used (if that incarnation still runs)."""
        if self.credits[worker_id] is not None and incarnation == self.incarnations[worker_id]:
            self.credits[worker_id].release()

    # ----------------------------------------------------------------------------------------- health
    def check(self, restart: bool = True) -> list[Crash]:
        """Crashed workers since the last check (restarted if `restart`); finished ones are not crashes."""
        if self.stopping:
            return []
        self._kill_hung()
        dead = [w for w, p in self.processes.items() if not p.is_alive() and p.exitcode != 0]
        crashes = []
        for wid in dead:
            process = self.processes[wid]
            process.join(timeout=1)
            self.readers[wid].join(timeout=1)  # the pipe has ended: its traceback, if any, is read
            text = self.tracebacks.pop((wid, self.incarnations[wid]), None)
            if wid in self.hung:
                text = f"no heartbeat for {self.hung.pop(wid):.0f} s (hung), so it was killed"
            crashes.append(Crash(wid, process.exitcode, text))
            if restart:
                self.restarts += 1
                self.budget.spend("workers", self.restarts, crashes[-1])
                self.incarnations[wid] += 1
                self._start(wid)
        if dead:
            self._write_pids()
        return crashes

    def _kill_hung(self) -> None:
        """SIGKILL every live worker that has not said it is alive for `heartbeat_s` (stuck in an env step, a
        deadlock): `check` then restarts it like any dead worker. Silence counts from the worker's last beat or
        from the last time a service it calls did not answer, whichever is later (`excused_at`): a worker
        blocked in a call to a hung service waits for the service to be killed and restarted."""
        if self.heartbeat_s is None:
            return
        now = time.monotonic()
        excused = self.excused_at()
        for wid, process in self.processes.items():
            silent = now - max(self.beats[wid], excused)
            if silent > self.heartbeat_s and process.is_alive():
                self.hung[wid] = silent
                process.kill()
                process.join(timeout=5)

    def alive(self) -> int:
        return sum(p.is_alive() for p in self.processes.values())

    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the workers to leave (they watch the stop flag), then terminate and kill what is left."""
        if self.stopping:
            return
        self.stopping = True
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self.processes.values():
            if process.is_alive():
                process.terminate()
                process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join(timeout=2)
        for thread in self.readers.values():
            thread.join(timeout=2)
        if self.pids_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.pids_file.unlink()


def role_process(
    worker_id: int,
    incarnation: int,
    outbox: Outbox,
    make_role: Callable[[int, int], Any],
    counter: StepCounter,
    stop: StopFlag,
    total_steps: int,
) -> None:
    """A `WorkerPool` target that runs a role: builds `make_role(worker_id, incarnation)` and sends its
    `produce(global_steps, stop)` items home, taking one credit for each, until the run's steps are consumed
    (`counter`), `stop` is set or the role has nothing more to give (None)."""
    role = make_role(worker_id, incarnation)
    try:
        while not stop.is_set() and counter.value < total_steps:
            outbox.beat()
            if not outbox.take_credit(stop):
                break
            item = role.produce(counter.value, stop)
            if item is None:
                break
            outbox.put(item)
    finally:
        role.close()


class LocalBackend(Backend):
    """Roles as `spawn`ed processes (one torch thread each), the networks in shared memory, the counters as
    lock-free shared integers."""

    name = "local"
    in_process = False
    has_services = True

    def share(self, modules: dict[str, nn.Module]) -> dict[str, nn.Module]:
        for module in modules.values():
            module.share_memory()
        return modules

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
    ) -> WorkerPool:
        pool = WorkerPool(
            n_workers,
            role_process,
            (make_role, counter, stop, total_steps),
            max_restarts=max_restarts,
            pids_file=pids_file,
            credits=credits,
            heartbeat_s=heartbeat_s,
            budget=self.restart_budget(max_restarts),
        )
        pool.start()
        return pool

    def start_services(
        self,
        make_service: Callable[[int, int], Any],
        n: int,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        name: str = "service",
        heartbeat_s: float | None = None,
    ) -> ServiceGroup:
        from rlfleet.backends.services import ProcessServices

        services = ProcessServices(
            make_service, n, max_restarts=max_restarts, pids_file=pids_file, name=name, heartbeat_s=heartbeat_s,
            budget=self.restart_budget(max_restarts),
        )  # fmt: skip
        services.start()
        return services

"""The `local` backend's services: long-lived objects in processes of their own that roles and the coordinator
call directly (the interface is in `rlfleet.backends.base`).

Each service is a `spawn`ed process (one torch thread, Ctrl-C ignored, gone with the coordinator) that builds
`make_service(index, incarnation)` and listens on a Unix socket of its own, at a fixed address per index (in a
folder only this run uses), authenticated with a key of the run. Every client process opens its own
connection; the service answers each connection in a thread of its own and runs the calls one at a time (an
in-process lock, held by the service's own threads only: a client killed mid-call ends its connection, and
its call, if it was running, simply finishes). Nothing is shared across processes but the sockets, so nothing
a dead process held can block another. Messages are pickled by value (`send_bytes`): tensors travel as bytes,
not as shared memory, as they would between machines.

A service that dies is noticed by `check()` (its exit code, and its traceback when it raised), which starts
its next incarnation at the same address. With `heartbeat_s`, `check()` also pings every service through a
connection of its own (one ping in flight per service, a new one `PING_EVERY_S` after each answer): the ping
is answered under the same lock as the calls, so a service stuck inside a call (or stopped) does not answer
it, and one that has not answered for `heartbeat_s` (its first ping: plus `STARTUP_GRACE_S`) is SIGKILLed and
reported as hung, then restarted like a dead one. A handle whose connection broke reconnects, one attempt each time
it is used, and sends again the calls that had no answer (at least once); it gives up with
`ServiceUnavailable` once the service has been unreachable for `reconnect_s`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any, cast

import torch.multiprocessing as mp

from rlfleet.backends.base import (
    PING_EVERY_S,
    Crash,
    Pending,
    RestartBudget,
    ServiceError,
    ServiceGroup,
    ServiceHandle,
    ServiceUnavailable,
    slow_after,
)
from rlfleet.backends.child import child_setup

RECONNECT_S = 60.0  # how long a handle keeps trying to reach a dead service before it gives up
POLL_S = 0.05  # a handle's wait between connection attempts, and its longest wait for a reply between checks
BROKEN = (OSError, EOFError, AuthenticationError)  # a connection that ended, or one that could not be opened
PING = "__ping__"  # the liveness probe of `ProcessServices.check`: answered under the calls' lock, by no method
STARTUP_GRACE_S = 60.0  # time a starting service has, beyond the heartbeat, to answer its first ping


def _answer(service: Any, lock: threading.Lock, conn: Connection, authkey: bytes) -> None:
    """A service thread: authenticate one client, then answer its calls until it leaves (or dies)."""
    try:
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
        while True:
            seq, method, args = pickle.loads(conn.recv_bytes())
            with lock:  # one call at a time, whichever connection it came through
                try:
                    reply = (seq, True, True if method == PING else getattr(service, method)(*args))
                except Exception:
                    reply = (seq, False, traceback.format_exc())
            try:
                data = pickle.dumps(reply)
            except Exception:
                data = pickle.dumps((seq, False, traceback.format_exc()))
            conn.send_bytes(data)
    except BROKEN:  # the client left, or died (also mid-message)
        pass
    finally:
        conn.close()


def _serve(
    make_service: Callable[[int, int], Any],
    index: int,
    incarnation: int,
    address: str,
    authkey: bytes,
    home: Connection,
) -> None:
    """Process entry point of one service: build it, listen, answer each client in a thread of its own."""
    child_setup()
    try:
        service = make_service(index, incarnation)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)  # the socket of a dead incarnation
        listener = Listener(address, family="AF_UNIX", backlog=64)
        home.send(("ready", os.getpid()))
        lock = threading.Lock()
        while True:
            conn = listener.accept()
            threading.Thread(target=_answer, args=(service, lock, conn, authkey), daemon=True).start()
    except BaseException:
        with contextlib.suppress(Exception):
            home.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None


class ProcessPending(Pending):
    def __init__(self, handle: ProcessHandle, seq: int, method: str):
        self.handle, self.seq, self.method = handle, seq, method

    def result(self, timeout: float | None = None) -> Any:
        ok, value = self.handle._wait(self.seq, timeout)
        if not ok:
            raise ServiceError.of(self.handle.index, self.method, value)
        return value


class ProcessHandle(ServiceHandle):
    """A client of one service process; picklable (the connection is opened by the process that uses it). For one
    thread at a time."""

    def __init__(self, index: int, address: str, authkey: bytes, reconnect_s: float = RECONNECT_S):
        self.index, self.address, self.authkey, self.reconnect_s = index, address, authkey, reconnect_s
        self._reset()

    def _reset(self) -> None:
        self._conn: Connection | None = None
        self._pid = os.getpid()
        self._seq = 0
        self._unanswered: dict[int, tuple[str, tuple[Any, ...]]] = {}  # sent (or to send) and not answered yet
        self._replies: dict[int, tuple[bool, Any]] = {}
        self._lost_at: float | None = None  # since when the service has been unreachable

    def __getstate__(self) -> dict[str, Any]:
        return {"index": self.index, "address": self.address, "authkey": self.authkey, "reconnect_s": self.reconnect_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        self._conn = None
        if self._lost_at is None:
            self._lost_at = time.monotonic()

    def _connect(self) -> bool:
        """One attempt to (re)connect; on success, every unanswered call is sent (again)."""
        if self._pid != os.getpid():  # a copy made by fork: the connection is the parent's
            self._reset()
        if self._conn is not None:
            return True
        try:
            self._conn = Client(self.address, family="AF_UNIX", authkey=self.authkey)
            for seq, (method, args) in sorted(self._unanswered.items()):
                self._conn.send_bytes(pickle.dumps((seq, method, args)))
        except BROKEN:
            self._drop()
            return False
        self._lost_at = None
        return True

    def submit(self, method: str, *args: Any) -> Pending:
        if self._pid != os.getpid():
            self._reset()
        seq = self._seq
        self._seq += 1
        self._unanswered[seq] = (method, args)
        if self._conn is None:
            self._connect()  # sends it; if the service cannot be reached now, `result` tries again
        else:
            try:
                self._conn.send_bytes(pickle.dumps((seq, method, args)))
            except BROKEN:
                self._drop()
        return ProcessPending(self, seq, method)

    def _wait(self, seq: int, timeout: float | None) -> tuple[bool, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        tried = False  # a reply that is there is read even with timeout=0
        while seq not in self._replies:
            now = time.monotonic()
            if deadline is not None and now >= deadline and tried:
                raise TimeoutError(f"service {self.index} did not answer within {timeout} s")
            if self._conn is None and not self._connect():
                if self._lost_at is not None and now - self._lost_at > self.reconnect_s:
                    raise ServiceUnavailable(f"service {self.index} unreachable for {self.reconnect_s:.0f} s")
                time.sleep(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - now)))
                tried = True
                continue
            assert self._conn is not None  # `_connect` returns True only with a connection
            tried = True
            try:
                if self._conn.poll(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - now))):
                    answered, ok, value = pickle.loads(self._conn.recv_bytes())
                    self._unanswered.pop(answered, None)
                    self._replies[answered] = (ok, value)
            except BROKEN:  # the service died: its next incarnation gets the unanswered calls
                self._drop()
        return self._replies.pop(seq)

    def close(self) -> None:
        self._drop()


class ProcessServices(ServiceGroup):
    """N service processes at fixed addresses, restarted when they die. `pids_file`, if given, always holds
    `{index: pid}` of the live ones. Restarts are spent from `budget` (the backend's, shared with its other groups),
    or from a budget of the group's own of `max_restarts`."""

    def __init__(
        self,
        make_service: Callable[[int, int], Any],
        n: int,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        name: str = "service",
        heartbeat_s: float | None = None,
        budget: RestartBudget | None = None,
    ):
        self.ctx = mp.get_context("spawn")
        self.make_service = make_service
        self.n = n
        self.budget = budget if budget is not None else RestartBudget(max_restarts)
        self.pids_file = pids_file
        self.name = name
        self.folder = tempfile.mkdtemp(prefix="rlfleet-services-")
        os.chmod(self.folder, 0o700)
        self.authkey = os.urandom(32)
        self.addresses = [os.path.join(self.folder, f"{i}.sock") for i in range(n)]
        self.handles = [ProcessHandle(i, a, self.authkey) for i, a in enumerate(self.addresses)]
        self.incarnations = [0] * n
        self.restarts = 0
        self.processes: dict[int, Any] = {}
        self.readers: dict[int, threading.Thread] = {}
        self.tracebacks: dict[tuple[int, int], str] = {}
        self.stopping = False
        self.heartbeat_s = heartbeat_s
        self.unwell_at = float("-inf")
        # liveness: the group's own handle of each service (the coordinator's thread only), its ping in flight
        # (pending, when sent), when it last answered (None: not yet, this incarnation), the hung ones killed
        self.pingers = [ProcessHandle(i, a, self.authkey) for i, a in enumerate(self.addresses)]
        self.pings: dict[int, tuple[Pending, float]] = {}
        self.answered: list[float | None] = [None] * n
        self.hung: dict[int, float] = {}

    def start(self) -> None:
        for index in range(self.n):
            self._start(index)
        self._write_pids()

    def _start(self, index: int) -> None:
        """Start one incarnation, Ctrl-C ignored meanwhile (the child inherits that while it imports)."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            incarnation = self.incarnations[index]
            reader, writer = self.ctx.Pipe(duplex=False)
            process = self.ctx.Process(
                target=_serve,
                args=(self.make_service, index, incarnation, self.addresses[index], self.authkey, writer),
                name=f"rlfleet-{self.name}-{index}",
                daemon=True,
            )
            process.start()
            writer.close()  # the service holds the only write end: its death ends the pipe
            self.processes[index] = process
            thread = threading.Thread(target=self._receive, args=(reader, index, incarnation), daemon=True)
            thread.start()
            self.readers[index] = thread
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def _receive(self, reader: Connection, index: int, incarnation: int) -> None:
        """A reading thread: one incarnation's traceback, if it raises, until its pipe ends."""
        try:
            while True:
                kind, payload = reader.recv()
                if kind == "error":
                    self.tracebacks[index, incarnation] = payload
        except Exception:
            pass
        finally:
            reader.close()

    def _write_pids(self) -> None:
        if self.pids_file is not None:
            pids = {str(i): p.pid for i, p in self.processes.items() if p.is_alive()}
            tmp = self.pids_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(pids))
            os.replace(tmp, self.pids_file)

    def _ping(self) -> None:
        """Read the pings that were answered, send the next ones, and SIGKILL each live service whose ping has
        gone unanswered for `heartbeat_s` (`check` then restarts it like a dead one)."""
        if self.heartbeat_s is None:
            return
        now = time.monotonic()
        for index, process in self.processes.items():
            if index not in self.pings:
                last = self.answered[index]
                if last is None or now - last >= PING_EVERY_S:
                    self.pings[index] = (self.pingers[index].submit(PING), now)
                continue
            pending, sent = self.pings[index]
            try:
                pending.result(timeout=0.0)
                del self.pings[index]
                self.answered[index] = now
                continue
            except TimeoutError:
                pass
            except (ServiceError, ServiceUnavailable):  # unreachable for long (dead, and noticed below): ask again
                self._new_pinger(index)
                continue
            silent = now - sent
            if silent >= slow_after(self.heartbeat_s):
                self.unwell_at = now
            limit = self.heartbeat_s + (0.0 if self.answered[index] is not None else STARTUP_GRACE_S)
            if silent > limit and process.is_alive():
                self.hung[index] = silent
                process.kill()  # also a stopped process
                process.join(timeout=5)

    def _new_pinger(self, index: int) -> None:
        """A fresh handle for the pings of service `index` (a new incarnation: nothing of the old one's resent)."""
        self.pingers[index].close()
        self.pingers[index] = ProcessHandle(index, self.addresses[index], self.authkey)
        self.pings.pop(index, None)

    def check(self) -> list[Crash]:
        if self.stopping:
            return []
        self._ping()
        dead = [i for i, p in self.processes.items() if not p.is_alive()]
        crashes = []
        for index in dead:
            process = self.processes[index]
            process.join(timeout=1)
            self.readers[index].join(timeout=1)  # the pipe has ended: its traceback, if any, is read
            text = self.tracebacks.pop((index, self.incarnations[index]), None)
            if index in self.hung:
                text = f"no answer for {self.hung.pop(index):.0f} s (hung), so it was killed"
            crashes.append(Crash(index, process.exitcode, text, role=self.name))
            self.restarts += 1
            self.budget.spend(f"{self.name}s", self.restarts, crashes[-1])
            self.incarnations[index] += 1
            self._new_pinger(index)
            self.answered[index] = None  # its first ping has the start-up grace
            self._start(index)
        if dead:
            self._write_pids()
        return crashes

    def alive(self) -> int:
        return sum(p.is_alive() for p in self.processes.values())

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        for handle in cast(list[ProcessHandle], self.handles) + self.pingers:  # as `__init__` made them
            handle.close()
        for process in self.processes.values():
            if process.is_alive():
                process.terminate()
        for process in self.processes.values():
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=2)
        for thread in self.readers.values():
            thread.join(timeout=2)
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.pids_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.pids_file.unlink()

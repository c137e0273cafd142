"""Worker processes for the parallel architectures: spawn, report crashes with their traceback, restart, stop.

Every worker is a `spawn`ed process running `target(worker_id, incarnation, *args)` with one torch
thread and Ctrl-C ignored (the coordinator alone reacts to it, then stops the workers itself). A
worker that raises sends its traceback through the pool's error queue before exiting; one that is
killed (SIGKILL, out of memory) is noticed by its exit code. `check()` reports both and restarts the
worker (the next incarnation, so it can reseed), up to `max_restarts` over the run. A worker whose
coordinator dies without stopping it exits by itself (it watches the parent's sentinel).

`WorkerQueues` carries data from the workers to the coordinator: one small bounded queue per worker, so
that a worker killed in the middle of a write spoils only its own queue, which is replaced before the
worker restarts.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


class WorkerFailure(RuntimeError):
    """Workers kept crashing: more restarts than the run allows."""


@dataclass
class Crash:
    worker: int
    exitcode: int | None
    traceback: str | None

    def describe(self) -> str:
        how = f"exit code {self.exitcode}"
        if self.exitcode is not None and self.exitcode < 0:
            with contextlib.suppress(ValueError):
                how = f"killed by {signal.Signals(-self.exitcode).name}"
        text = f"worker {self.worker} died ({how})"
        return text + (f":\n{self.traceback.rstrip()}" if self.traceback else "")


def _exit_with_parent() -> None:
    """Leave at once if the coordinator dies without stopping us (SIGKILL, out of memory): no orphans."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="rlfleet-parent-watch", daemon=True).start()


def _bootstrap(target: Callable, worker_id: int, incarnation: int, errors, args: tuple) -> None:
    """Process entry point: one thread, Ctrl-C ignored, gone with the coordinator, exceptions sent home with
    their traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    _exit_with_parent()
    try:
        target(worker_id, incarnation, *args)
    except BaseException:
        with contextlib.suppress(Exception):
            errors.put((worker_id, traceback.format_exc()))
            errors.close()
            errors.join_thread()
        raise SystemExit(1) from None


class WorkerPool:
    """N worker processes running the same target, restarted when they die.

    `pids_file`, if given, always holds `{worker_id: pid}` of the live workers (tests kill them through it).
    `on_restart(worker_id)`, if given, runs just before a crashed worker is started again (e.g. to give it
    a fresh queue: `args` are pickled again for every start, so a list inside them can be changed).
    """

    def __init__(
        self,
        n_workers: int,
        target: Callable,
        args: tuple,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        on_restart: Callable[[int], None] | None = None,
    ):
        self.ctx = mp.get_context("spawn")
        self.n_workers = n_workers
        self.target = target
        self.args = args
        self.max_restarts = max_restarts
        self.pids_file = pids_file
        self.on_restart = on_restart
        self.errors = self.ctx.Queue()
        self.processes: dict[int, Any] = {}
        self.incarnations = [0] * n_workers
        self.restarts = 0
        self.stopping = False

    def start(self) -> None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C during start-up must not reach them
        try:
            for wid in range(self.n_workers):
                self._start(wid)
        finally:
            signal.signal(signal.SIGINT, previous)
        self._write_pids()

    def _start(self, wid: int) -> None:
        process = self.ctx.Process(
            target=_bootstrap,
            args=(self.target, wid, self.incarnations[wid], self.errors, self.args),
            name=f"rlfleet-worker-{wid}",
            daemon=True,
        )
        process.start()
        self.processes[wid] = process

    def _write_pids(self) -> None:
        if self.pids_file is not None:
            pids = {str(w): p.pid for w, p in self.processes.items() if p.is_alive()}
            tmp = self.pids_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(pids))
            os.replace(tmp, self.pids_file)

    def _tracebacks(self) -> dict[int, str]:
        found: dict[int, str] = {}
        while True:
            try:
                wid, text = self.errors.get_nowait()
            except (queue.Empty, OSError, EOFError):
                return found
            found[wid] = text

    def check(self, restart: bool = True) -> list[Crash]:
        """Crashed workers since the last check (restarted if `restart`); finished ones are not crashes."""
        if self.stopping:
            return []
        dead = [w for w, p in self.processes.items() if not p.is_alive() and p.exitcode != 0]
        if not dead:
            return []
        time.sleep(0.05)  # let a dying worker's traceback reach the queue
        tracebacks = self._tracebacks()
        crashes = []
        for wid in dead:
            process = self.processes[wid]
            process.join(timeout=1)
            crashes.append(Crash(wid, process.exitcode, tracebacks.get(wid)))
            if restart:
                self.restarts += 1
                if self.restarts > self.max_restarts:
                    raise WorkerFailure(
                        f"workers crashed {self.restarts} times (limit {self.max_restarts}); "
                        f"last: {crashes[-1].describe()}"
                    )
                self.incarnations[wid] += 1
                if self.on_restart is not None:
                    self.on_restart(wid)
                self._start(wid)
        self._write_pids()
        return crashes

    def alive(self) -> int:
        return sum(p.is_alive() for p in self.processes.values())

    def stop(self, timeout: float = 10.0) -> None:
        """Wait for the workers to leave (they watch the stop signal), then terminate and kill what is left."""
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
        self._tracebacks()
        self.errors.close()
        self.errors.join_thread()
        if self.pids_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.pids_file.unlink()


def acquire_until_stopped(credit, stop, poll_s: float = 0.1) -> bool:
    """Take one credit (a semaphore of `WorkerQueues`), waiting while there is none; False if `stop` got set."""
    while not stop.is_set():
        if credit.acquire(timeout=poll_s):
            return True
    return False


def put_until_stopped(q, item: Any, stop, poll_s: float = 0.1) -> bool:
    """Put `item` into a bounded queue, waiting while it is full; False if `stop` got set first."""
    while not stop.is_set():
        try:
            q.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False


def producer_process(
    worker_id, incarnation, producer_cls, spec, shared, weights, counter, stop, queues, credits
) -> None:
    """A `WorkerPool` target for the producers of `WorkerQueues` (data_parallel's samplers, grad_parallel's
    gradient workers): builds `producer_cls(spec, shared, weights, worker_id, incarnation)` and puts its
    `produce(global_steps, stop)` items into its own bounded queue, taking one credit for each, until the
    run's steps are consumed (`counter`) or `stop` is set."""
    torch.manual_seed(spec.worker_seed(worker_id, incarnation))
    out, credit = queues[worker_id], credits[worker_id]
    producer = producer_cls(spec, shared, weights, worker_id, incarnation)
    try:
        while not stop.is_set() and counter.value < spec.total_steps:
            if not acquire_until_stopped(credit, stop):
                break
            item = producer.produce(counter.value, stop)
            if item is None or not put_until_stopped(out, item, stop):
                break
    finally:
        if stop.is_set():
            out.cancel_join_thread()  # the coordinator stopped reading: leave without flushing
        producer.close()


class WorkerQueues:
    """One bounded queue per worker (worker → coordinator), `maxsize` items each, and optional credits.

    A worker gets the whole list (`self.queues`) and puts into `queues[worker_id]`. Per-worker queues
    keep a crash local: a process killed while writing can leave its queue's write lock taken, so
    `replace(worker_id)` (a `WorkerPool` `on_restart` hook) swaps in a fresh queue for the next
    incarnation. Items that were in the old queue are dropped with it.

    With `credits=k`, each worker also has a semaphore of k credits (`self.credits`, a list passed the
    same way): the worker takes one before it starts producing an item (`acquire_until_stopped`), the
    coordinator gives it back once it has used the item (`release`). A queue bounds the items waiting;
    credits also count the one being made, so a worker is never more than k items ahead of the
    coordinator (and can wait to act with the weights that learned from its last item).
    """

    def __init__(self, ctx, n_workers: int, maxsize: int = 2, credits: int | None = None, poll_s: float = 5e-4):
        self.ctx = ctx
        self.maxsize = maxsize
        self.n_credits = credits
        self.poll_s = poll_s
        self.queues = [ctx.Queue(maxsize) for _ in range(n_workers)]
        self.credits = [ctx.Semaphore(credits) for _ in range(n_workers)] if credits else None
        self._next = 0

    def replace(self, worker_id: int) -> None:
        """A fresh queue (and full credits) for a worker that is about to restart."""
        old = self.queues[worker_id]
        self.queues[worker_id] = self.ctx.Queue(self.maxsize)
        old.close()
        if self.credits is not None:
            self.credits[worker_id] = self.ctx.Semaphore(self.n_credits)

    def release(self, worker_id: int) -> None:
        """Give a worker back the credit of an item the coordinator has used."""
        if self.credits is not None:
            self.credits[worker_id].release()

    def get(self, worker_id: int, timeout: float) -> Any | None:
        """The next item of one worker, or None after `timeout` seconds."""
        try:
            return self.queues[worker_id].get(timeout=timeout)
        except queue.Empty:
            return None

    def get_any(self, timeout: float) -> Any | None:
        """The next item of whichever worker has one (taking turns), or None after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        n = len(self.queues)
        while True:
            for i in range(n):
                wid = (self._next + i) % n
                try:
                    item = self.queues[wid].get_nowait()
                except queue.Empty:
                    continue
                self._next = (wid + 1) % n
                return item
            if time.monotonic() >= deadline:
                return None
            time.sleep(self.poll_s)

    def drain(self) -> None:
        """Drop whatever is queued (lets workers that are flushing their last items exit)."""
        for q in self.queues:
            with contextlib.suppress(queue.Empty, OSError, EOFError, ValueError):
                while True:
                    q.get_nowait()

    def close(self) -> None:
        for q in self.queues:
            q.close()
            q.join_thread()


def stop_workers(pool: WorkerPool, queues: WorkerQueues, timeout: float = 10.0) -> None:
    """Stop a pool whose workers watch a stop event that is already set, draining their queues meanwhile so
    that none waits to flush an item; then terminate what is left (`WorkerPool.stop`). Idempotent."""
    if pool.stopping:
        return
    deadline = time.monotonic() + timeout
    while pool.alive() and time.monotonic() < deadline:
        queues.drain()
        time.sleep(0.01)
    pool.stop()
    queues.drain()

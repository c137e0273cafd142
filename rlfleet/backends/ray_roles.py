"""The `ray` backend's roles (see `ray_backend`): each in an actor of its own (`RoleActor`), driven by the
coordinator's calls (`RayGroup`): credits, the weights each call carries, the heartbeat counted from when an actor
starts a call, restarts that hold up nothing (`Places` records where each actor runs when it answers), and a restart
that no node can start within the grace ending the run."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import time
import traceback
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from rlfleet.backends.base import Crash, RestartBudget, RoleGroup, StoppedWhileStarting, WorkerFailure
from rlfleet.backends.ray_instance import ANSI, sigint_deferred
from rlfleet.backends.shared_memory import IN_PROCESS, StepCounter, StopFlag

STARTUP_GRACE_S = 60.0  # time a new actor has, beyond the heartbeat interval, to start and answer its first call
WAIT_SLICE_S = 0.5  # the longest a wait for starting actors goes without looking at the run's stop flag
TASK_EVENTS = False
"""Whether Ray records an event for each call to rlfleet's actors (its dashboard's task timeline). Off: every item,
block, sample and gossip round is a call, and the GCS keeps each call's events (about 3.4 KB each, measured with
Ray 2.60: 60k calls grew the GCS from 43 to 250 MB, and to 45 MB with them off), so a long run's GCS grows to
Ray's cap of events instead of staying flat; calls are also about 10% faster without them."""
PLACEMENT_SHARE = 1e-3  # of a `--placement` resource each role asks for: many roles fit on one node


class RayHost(Protocol):
    """What the groups of actors need of the backend that starts them (`RayBackend`)."""

    ray: Any
    opts: Any
    modules: dict[str, nn.Module]
    weights: Any

    def publish(self, has: int) -> tuple[int, Any]: ...

    def actor_options(self, index: int) -> dict[str, Any]: ...

    def threads(self) -> int: ...

    def restart_budget(self, max_restarts: int) -> RestartBudget: ...


def module_state(modules: dict[str, nn.Module]) -> dict[str, dict[str, np.ndarray]]:
    """Every network's state dict as NumPy arrays (what is published)."""
    return {name: {k: v.detach().cpu().numpy() for k, v in m.state_dict().items()} for name, m in modules.items()}


@torch.no_grad()
def load_module_state(modules: dict[str, nn.Module], state: dict[str, dict[str, np.ndarray]]) -> None:
    """Copy a published state into the networks in place (the role's local copy keeps pointing at them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the object store's arrays are read-only: only read here
        for name, module in modules.items():
            for key, tensor in module.state_dict().items():
                tensor.copy_(torch.as_tensor(state[name][key]))


def where() -> dict[str, Any]:
    """The process and node of the actor it runs in."""
    import ray  # in an actor, where Ray is imported already

    ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # unannotated in Ray
    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "ip": ip}


@dataclass
class RoleError:
    """What a call returns when its role raised: the traceback, as the role's process wrote it."""

    traceback: str


class RoleActor:
    """One role in a Ray actor: its replica of the coordinator's networks and weight version, and the role."""

    def __init__(self, payload: bytes, worker_id: int, incarnation: int, threads: int):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(threads)
        make_role, self.modules, self.weights = pickle.loads(payload)  # one pickle: the role sees these objects
        self.version = -1
        self.role = make_role(worker_id, incarnation)
        self.stop = StopFlag(IN_PROCESS)  # never set: each call makes one item

    def where(self) -> dict[str, Any]:
        return where()

    def produce(self, global_steps: int, version: int, state: Any) -> bytes:
        if state is not None:
            with self.weights.writing():
                load_module_state(self.modules, state)
            self.weights.set(version)
            self.version = version
        try:
            item = self.role.produce(global_steps, self.stop)
        except Exception:
            item = RoleError(traceback.format_exc())  # sent home like an item; the coordinator restarts the actor
        return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)


class Places:
    """Where a group's actors run: `{index: pid}` in `pids_file` (tests kill them through it) and `{index: {pid,
    node, ip}}` in `places_file`, from each actor's `where()`. After a restart the new actor's answer is recorded
    when it comes (`poll`), so that neither the learner nor the healthy roles wait on a restart."""

    def __init__(self, ray: Any, pids_file: Path | None, places_file: Path | None):
        self.ray, self.pids_file, self.places_file = ray, pids_file, places_file
        self.places: dict[str, dict[str, Any]] = {}
        self.pending: dict[int, Any] = {}  # index -> the where() call of its newest actor
        self.asked: dict[int, float] = {}  # index -> when (time.monotonic) it was asked

    def ask(self, index: int, actor: Any) -> None:
        self.places.pop(str(index), None)
        self.pending[index] = actor.where.remote()
        self.asked[index] = time.monotonic()

    def check_started(self, name: str, incarnations: list[int], host: RayHost, service: bool = False) -> None:
        """A `WorkerFailure` for the first actor asked longer than `STARTUP_GRACE_S` ago that has not answered: not
        started (no node has what it needs, as when the only node with its `--placement` resource is gone) or stuck
        in its constructor. `name`: what the group's actors are reported as."""
        now = time.monotonic()
        late = [index for index in self.pending if now - self.asked[index] > STARTUP_GRACE_S]
        if late:
            which = f"{name} {late[0]}" + ("'s restart" if incarnations[late[0]] else "")
            raise WorkerFailure(f"{which} did not start within {STARTUP_GRACE_S:.0f} s: " + unplaceable(host, service))

    def wait_all(self, timeout: float, stop: Callable[[], bool] | None = None) -> int:
        """Wait up to `timeout` for every answer outstanding (in slices, until `stop()` where given), record them;
        returns how many did not come."""
        deadline = time.monotonic() + timeout
        stopped = stop or (lambda: False)
        while self.pending and time.monotonic() < deadline and not stopped():
            left = deadline - time.monotonic()
            self.ray.wait(list(self.pending.values()), num_returns=len(self.pending), timeout=min(left, WAIT_SLICE_S))
            self.poll()
        return len(self.pending)

    def poll(self) -> None:
        """Record the answers that have come (a dead actor's is dropped: the group reports it)."""
        if not self.pending:
            return
        ready, _ = self.ray.wait(list(self.pending.values()), num_returns=len(self.pending), timeout=0)
        if not ready:
            return
        for index, ref in list(self.pending.items()):
            if ref in ready:
                del self.pending[index]
                with contextlib.suppress(Exception):
                    self.places[str(index)] = self.ray.get(ref)
        self._write()

    def _write(self) -> None:
        if self.pids_file is None or self.places_file is None:  # both or neither
            return
        pids = {index: place["pid"] for index, place in self.places.items()}
        for path, data in ((self.pids_file, pids), (self.places_file, self.places)):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)


def unplaceable(backend: RayHost, service: bool = False) -> str:
    """Why an actor may not start: what it asks of the cluster (a service asks for no CPU), and what is free."""
    opts = backend.opts
    asks = [] if service else [f"{getattr(opts, 'cpus_per_role', 1.0)} CPU(s)",
                               f"{getattr(opts, 'gpus_per_role', 0.0)} GPU(s)"]  # fmt: skip
    if getattr(opts, "placement", ""):
        asks.append(f"a share of one of the resources {opts.placement} (--placement)")
    return (f"the Ray cluster may not have {' and '.join(asks)} free per {'service' if service else 'role'} (it "
            f"has {backend.ray.available_resources()}), or its constructor hangs")  # fmt: skip


class Worker:
    """The coordinator's record of one worker: its actor, its calls in flight (oldest first) and its state."""

    def __init__(self, actor: Any, incarnation: int, started: float):
        self.actor = actor
        self.incarnation = incarnation
        # its calls: (object ref, when the actor could start it: issued, or the call before ended)
        self.calls: deque[tuple[Any, float]] = deque()
        self.ready: deque[Any] = deque()  # items received and not yet handed out
        self.credits = 0  # calls it may still be given
        self.version = -1  # the weight version its actor has
        self.started = started
        self.answered = False  # has it finished a call yet (the grace for starting is over)
        self.finished = False  # its role said it has nothing more to give (None)
        self.failure: str | None = None


class RayGroup(RoleGroup):
    """N roles as Ray actors, driven by calls (see the module docstring)."""

    def __init__(self, backend: RayHost, make_role: Callable[[int, int], Any], n_workers: int, counter: StepCounter,
                 stop: StopFlag, total_steps: int, credits: int | None, max_restarts: int, pids_file: Path | None,
                 heartbeat_s: float | None):  # fmt: skip
        self.ray = backend.ray
        self.backend = backend
        self.make_role = make_role
        self.n_workers = n_workers
        self.counter, self.stop_flag, self.total_steps = counter, stop, total_steps
        self.n_credits = credits or 2  # without credits a worker keeps two calls in flight (pipelined)
        self.free_running = credits is None  # ... and gets a new call for each answer, not for each release
        self.budget = backend.restart_budget(max_restarts)  # shared with the backend's services and mailboxes
        self.pids_file = pids_file
        self.heartbeat_s = heartbeat_s
        self.incarnations = [0] * n_workers
        self.restarts = 0
        self.workers: list[Worker] = []
        self.crashes: list[Crash] = []
        self.stopping = False
        self._next = 0
        self.workers = [self._start(w) for w in range(n_workers)]
        self.places = Places(self.ray, pids_file, None if pids_file is None else pids_file.with_name("actors.json"))
        for wid, worker in enumerate(self.workers):
            self.places.ask(wid, worker.actor)
        missing = self.places.wait_all(STARTUP_GRACE_S, stop.is_set)
        if stop.is_set():  # a Ctrl-C while they started: nothing of the group keeps holding the cluster's CPUs
            self.stop()
            raise StoppedWhileStarting(f"{missing} of {n_workers} roles had not started")
        if missing:
            reason = unplaceable(backend)  # what is free with them still placed
            self.stop()  # nothing of a group that failed to start keeps holding the cluster's CPUs
            raise WorkerFailure(f"{missing} of {n_workers} roles did not start within {STARTUP_GRACE_S:.0f} s: "
                                + reason)  # fmt: skip
        for w in range(n_workers):
            self._issue(w)

    # ----------------------------------------------------------------------------------------- actors
    def _start(self, wid: int) -> Worker:
        payload = self.ray.cloudpickle.dumps((self.make_role, self.backend.modules, self.backend.weights))
        cls = self.ray.remote(RoleActor).options(**self.backend.actor_options(wid))
        incarnation = self.incarnations[wid]
        with sigint_deferred():
            actor = cls.remote(payload, wid, incarnation, self.backend.threads())
        worker = Worker(actor, incarnation, time.monotonic())
        worker.credits = self.n_credits
        return worker

    def _issue(self, wid: int) -> None:
        """Give a worker calls up to its credits, while the run wants more items."""
        worker = self.workers[wid]
        while worker.credits > 0 and not worker.finished and worker.failure is None and self._wanted():
            version, state = self.backend.publish(worker.version)
            ref = worker.actor.produce.remote(int(self.counter.value), version, state)
            worker.version = version
            worker.calls.append((ref, time.monotonic()))
            worker.credits -= 1

    def _wanted(self) -> bool:
        return not self.stopping and not self.stop_flag.is_set() and self.counter.value < self.total_steps

    def _collect(self, wid: int, ref: Any) -> None:
        """The result of a worker's oldest call, which has finished: an item, the end of the role, or a failure."""
        worker = self.workers[wid]
        worker.calls.popleft()
        worker.answered = True
        self.places.poll()  # a restarted actor answered its where() before this call
        if worker.calls:  # the actor runs one call at a time: the next one starts now, not when it was issued
            following, issued = worker.calls[0]
            worker.calls[0] = (following, max(issued, time.monotonic()))
        try:
            item = pickle.loads(self.ray.get(ref))
        except Exception as exc:  # the actor died (killed, out of memory, its node gone): Ray's reason
            self._fail(wid, ANSI.sub("", str(exc)))
            return
        if isinstance(item, RoleError):
            self._fail(wid, item.traceback)
        elif item is None:
            worker.finished = True
        else:
            worker.ready.append(item)
            if self.free_running:
                worker.credits += 1
                self._issue(wid)

    def _fail(self, wid: int, text: str) -> None:
        worker = self.workers[wid]
        if worker.failure is None:
            worker.failure = text
            worker.calls.clear()

    # ----------------------------------------------------------------------------------------- items
    def _pending(self) -> dict[Any, int]:
        return {w.calls[0][0]: wid for wid, w in enumerate(self.workers) if w.calls and w.failure is None}

    def get(self, worker_id: int, timeout: float) -> Any | None:
        worker = self.workers[worker_id]
        deadline = time.monotonic() + timeout
        while not worker.ready:
            if not worker.calls or worker.failure is not None:
                return None
            ref = worker.calls[0][0]
            ready, _ = self.ray.wait([ref], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            self._collect(worker_id, ref)
        return worker.ready.popleft()

    def get_any(self, timeout: float) -> Any | None:
        deadline = time.monotonic() + timeout
        while True:
            for i in range(self.n_workers):
                wid = (self._next + i) % self.n_workers
                if self.workers[wid].ready:
                    self._next = (wid + 1) % self.n_workers
                    return self.workers[wid].ready.popleft()
            pending = self._pending()
            remaining = deadline - time.monotonic()
            if not pending or remaining <= 0:
                return None
            ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=remaining)
            for ref in ready:
                self._collect(pending[ref], ref)

    def release(self, worker_id: int, incarnation: int) -> None:
        worker = self.workers[worker_id]
        if incarnation == worker.incarnation and not self.free_running:
            worker.credits += 1
            self._issue(worker_id)

    # ----------------------------------------------------------------------------------------- health
    def check(self) -> list[Crash]:
        if self.stopping:
            return []
        self._find_hung()
        crashes = []
        for wid, worker in enumerate(self.workers):
            if worker.failure is None:
                continue
            crashes.append(Crash(wid, None, worker.failure))
            self.restarts += 1
            self.budget.spend("workers", self.restarts, crashes[-1])
            with contextlib.suppress(Exception):
                self.ray.kill(worker.actor, no_restart=True)
            self.incarnations[wid] += 1
            self.workers[wid] = self._start(wid)
            self.places.ask(wid, self.workers[wid].actor)  # recorded when it answers: nobody waits on a restart
        for crash in crashes:
            self._issue(crash.worker)
        self.places.poll()
        self.places.check_started("worker", self.incarnations, self.backend)
        return crashes

    def _find_hung(self) -> None:
        """A call the actor has been on for longer than the heartbeat (the first one: plus the start-up grace) is
        a hung role: its actor is killed, and `check` restarts it. A call is timed from when the actor could start it
        (`_collect` moves the next call's clock to the end of the one before), since with several calls in flight
        each waits for the earlier ones."""
        if self.heartbeat_s is None:
            return
        now = time.monotonic()
        for wid, worker in enumerate(self.workers):
            if not worker.calls or worker.failure is not None:
                continue
            waited = now - max(worker.calls[0][1], self.excused_at())
            limit = self.heartbeat_s + (0.0 if worker.answered else STARTUP_GRACE_S)
            if waited > limit and not self.ray.wait([worker.calls[0][0]], timeout=0)[0]:
                self._fail(wid, f"no heartbeat for {waited:.0f} s (hung), so it was killed")

    def alive(self) -> int:
        return sum(w.failure is None and not w.finished for w in self.workers) if not self.stopping else 0

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.places.pending.clear()  # nothing more is recorded: the pids file goes
        for worker in self.workers:
            with contextlib.suppress(Exception):
                self.ray.kill(worker.actor, no_restart=True)
        if self.pids_file is not None:  # actors.json stays: where the workers ran
            with contextlib.suppress(FileNotFoundError):
                self.pids_file.unlink()

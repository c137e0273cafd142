"""The `ray` backend's services (see `ray_backend`): named actors (`RayServices`), reached by name from any
process (`RayServiceHandle`), pinged behind their calls, restarted under the same name when they die or hang; a
call cut short is sent again to the next incarnation (`RayPending`), and to the next, as long as the run restarts
the service (its restart limit, not the call, ends a service that keeps dying)."""

from __future__ import annotations

import contextlib
import pickle
import signal
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rlfleet.backends.base import (
    PING_EVERY_S,
    Crash,
    Pending,
    ServiceError,
    ServiceGroup,
    ServiceHandle,
    ServiceUnavailable,
    slow_after,
)
from rlfleet.backends.ray_instance import ANSI, sigint_deferred
from rlfleet.backends.ray_roles import STARTUP_GRACE_S, Places, RayHost, RoleError, where

RECONNECT_S = 60.0  # how long a handle waits for a dead service's next incarnation before it gives up


class ServiceActor:
    """One service in a Ray actor (one call at a time, in the order they arrive)."""

    def __init__(self, payload: bytes, index: int, incarnation: int, threads: int):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(threads)
        self.service = pickle.loads(payload)(index, incarnation)

    def where(self) -> dict[str, Any]:
        return where()

    def ping(self) -> bool:
        return True

    def call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.service, method)(*args)
        except Exception:
            return RoleError(traceback.format_exc())  # raised as ServiceError where the result is read


class RayPending(Pending):
    """A call sent to a service actor; sent again to the service's next incarnation (a new actor under its name) each
    time the actor dies first, as a call to a `local` service is: a service that dies under every incarnation (one
    that cannot start: out of threads or memory, a constructor that raises) is ended by the restart limit of the
    group that restarts it (`RayServices.check`: a `WorkerFailure` naming Ray's reason), not by the call. While the
    next incarnation is not there yet (the dead actor may keep its name a while, as when its node went), a wait with a
    timeout ends with `TimeoutError` like any other, so that a coordinator that restarts the services itself
    (`ServiceGroup.check`) does so between its waits; a service not restarted within `RECONNECT_S` (nobody restarts
    it) is a `ServiceUnavailable`."""

    def __init__(self, handle: RayServiceHandle, method: str, args: tuple[Any, ...]):
        self.handle, self.method, self.args = handle, method, args
        self.sent_to: Any = None  # the id of the actor the call went to last (the dead one, once `lost_at` is set)
        self.lost_at: float | None = None  # when that actor died under it (None: the call is with a live one)
        self.ref: Any = None
        self._send(None)

    def _send(self, deadline: float | None) -> bool:
        """Send the call to the actor under the name, unless it is the one that died under it; False if no other
        answered to the name by `deadline`."""
        while True:
            actor = self.handle.actor(deadline)
            if actor is None:
                return False
            if self.lost_at is None or actor._actor_id != self.sent_to:
                self.ref, self.lost_at = actor.call.remote(self.method, *self.args), None
                self.sent_to = actor._actor_id
                return True
            if self.lost_at is not None and time.monotonic() - self.lost_at > RECONNECT_S:
                raise ServiceUnavailable(f"service {self.handle.index} was not restarted within {RECONNECT_S:.0f} s")
            self.handle.lost()  # the dead actor still holds the name: look again, for its next incarnation
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def result(self, timeout: float | None = None) -> Any:
        import ray

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.lost_at is not None and not self._send(deadline):
                raise TimeoutError(f"service {self.handle.index}: not restarted within {timeout} s (yet)")
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                value = ray.get(self.ref, timeout=left)
                break
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(f"service {self.handle.index}: no answer within {timeout} s") from None
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self.lost_at = time.monotonic()
                self.handle.lost()  # its death is the coordinator's to report and restart: wait for that
        if isinstance(value, RoleError):
            raise ServiceError.of(self.handle.index, self.method, value.traceback)
        return value


class RayServiceHandle(ServiceHandle):
    """A service by its actor's name: whichever incarnation holds the name now answers. Picklable."""

    def __init__(self, index: int, name: str, namespace: str):
        self.index, self.name, self.namespace = index, name, namespace
        self._actor: Any = None  # the actor handle under the name, once looked up

    def __getstate__(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "namespace": self.namespace}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _actor=None)

    def actor(self, deadline: float | None = None) -> Any:
        """The actor under the name, waiting for one to hold it (a restarted one) up to `RECONNECT_S`, or until
        `deadline` (`time.monotonic`), then None."""
        import ray

        waited_since = time.monotonic()
        while self._actor is None:
            try:
                self._actor = ray.get_actor(self.name, namespace=self.namespace)
            except ValueError:  # not (yet) there: the coordinator restarts it
                if time.monotonic() - waited_since > RECONNECT_S:
                    raise ServiceUnavailable(f"service {self.index} unreachable for {RECONNECT_S:.0f} s") from None
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                time.sleep(0.1)
        return self._actor

    def lost(self) -> None:
        """The actor died: look the name up again (after a moment, for the restart)."""
        self._actor = None
        time.sleep(0.1)

    def submit(self, method: str, *args: Any) -> Pending:
        return RayPending(self, method, args)


class RayServices(ServiceGroup):
    """N services as named Ray actors, restarted (a new actor under the same name) when they die."""

    def __init__(self, backend: RayHost, make_service: Callable[[int, int], Any] | None, n: int, max_restarts: int,
                 pids_file: Path | None, name: str, heartbeat_s: float | None = None):  # fmt: skip
        self.ray, self.backend = backend.ray, backend
        self.heartbeat_s = heartbeat_s
        self.unwell_at = float("-inf")
        self.answered: list[bool] = [False] * n  # has this incarnation answered a ping yet (its start-up grace)
        self.make_service, self.n = make_service, n
        self.budget = backend.restart_budget(max_restarts)  # shared with the backend's roles and other services
        self.pids_file, self.name = pids_file, name
        # where each service runs, `{index: {pid, node, ip}}` (as `actors.json` for the workers): `shards.json`'s
        # is `shards_actors.json`
        self.places = Places(
            self.ray, pids_file, None if pids_file is None else pids_file.with_name(f"{pids_file.stem}_actors.json")
        )
        self.namespace = self.ray.get_runtime_context().namespace
        self.prefix = f"rlfleet-{uuid.uuid4().hex[:12]}-{name}"
        self.incarnations = [0] * n
        self.restarts = 0
        self.stopping = False
        self.actors = [self._start(i) for i in range(n)]
        self.handles = [RayServiceHandle(i, f"{self.prefix}-{i}", self.namespace) for i in range(n)]
        now = time.monotonic()
        self.pings = [(actor.ping.remote(), now) for actor in self.actors]  # (ping or None, sent / answered at)
        for index, actor in enumerate(self.actors):
            self.places.ask(index, actor)
        self.places.wait_all(STARTUP_GRACE_S)

    def _start(self, index: int) -> Any:
        """The next incarnation of service `index`: `make_service` pickled now, with what it holds now."""
        options = self.backend.actor_options(index)  # services reserve no CPU: light, and next to the workers
        options.update(name=f"{self.prefix}-{index}", namespace=self.namespace, num_cpus=0, num_gpus=0)
        payload = self.ray.cloudpickle.dumps(self.make_service)
        with sigint_deferred():
            return (
                self.ray.remote(ServiceActor)
                .options(**options)
                .remote(payload, index, self.incarnations[index], self.backend.threads())
            )

    def check(self) -> list[Crash]:
        """Each service answers a ping in turn (queued behind its calls, one in flight, the next `PING_EVERY_S`
        after an answer); one whose actor died, or that has not answered for `heartbeat_s` (hung: killed), is
        restarted."""
        if self.stopping:
            return []
        now = time.monotonic()
        in_flight = [ping for ping, _ in self.pings if ping is not None]
        ready, _ = self.ray.wait(in_flight, num_returns=len(in_flight), timeout=0) if in_flight else ([], [])
        crashes = []
        for index, (ping, since) in enumerate(self.pings):
            if ping is None:
                if now - since >= PING_EVERY_S:
                    self.pings[index] = (self.actors[index].ping.remote(), now)
                continue
            if ping in ready:
                try:
                    self.ray.get(ping)
                    self.pings[index] = (None, now)
                    self.answered[index] = True
                    continue
                except Exception as exc:
                    crashes.append(Crash(index, None, ANSI.sub("", str(exc)), role=self.name))
            else:
                silent = now - since
                if silent >= slow_after(self.heartbeat_s):
                    self.unwell_at = now
                limit = None if self.heartbeat_s is None else self.heartbeat_s + (
                    0.0 if self.answered[index] else STARTUP_GRACE_S)  # fmt: skip
                if limit is None or silent <= limit:
                    continue
                crashes.append(Crash(index, None, f"no answer for {silent:.0f} s (hung), so it was killed",
                                     role=self.name))  # fmt: skip
            self.restarts += 1
            self.budget.spend(f"{self.name}s", self.restarts, crashes[-1])
            with contextlib.suppress(Exception):
                self.ray.kill(self.actors[index], no_restart=True)
            self.incarnations[index] += 1
            self.actors[index] = self._start(index)
            self.pings[index] = (self.actors[index].ping.remote(), time.monotonic())
            self.answered[index] = False
            self.places.ask(index, self.actors[index])
        self.places.poll()
        self.places.check_started(self.name, self.incarnations, self.backend, service=True)
        return crashes

    def alive(self) -> int:
        return 0 if self.stopping else self.n

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.places.pending.clear()
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        if self.pids_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.pids_file.unlink()

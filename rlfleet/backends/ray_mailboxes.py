"""The `ray` backend's gossip mailboxes (see `ray_backend`): one asyncio actor next to the driver (`MailboxActor`,
PALA's data proxy), reached by name (`RayMailboxes`), watched as a service and restarted empty as the next
generation (`MailboxKeeper`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from rlfleet.backends.base import PING_EVERY_S, ServiceUnavailable
from rlfleet.backends.mailboxes import Mailboxes, MailboxesReset
from rlfleet.backends.ray_instance import sigint_deferred
from rlfleet.backends.ray_roles import TASK_EVENTS, RayHost, where
from rlfleet.backends.ray_services import RECONNECT_S, RayServiceHandle, RayServices


class MailboxActor:
    """Gossip mailboxes in one asyncio actor (PALA's data proxy): the slots hold the learners' parameter
    messages (NumPy arrays, which reach and leave it through the object store), the counters the rounds posted
    and read; each learner's doorbell is an `asyncio.Event` that `wait` awaits. `generation`: how many times the
    mailboxes were restarted before this actor (each restart starts empty at a later round)."""

    def __init__(self, n: int, start_round: int, generation: int):
        self.start, self.generation = start_round, generation
        self.slots: list[np.ndarray | None] = [None] * n
        self.written_rounds = [start_round - 1] * n
        self.read_rounds = [[start_round - 1] * n for _ in range(n)]
        self.bells = [asyncio.Event() for _ in range(n)]

    async def where(self) -> dict[str, Any]:
        return where()

    async def ping(self) -> bool:
        return True

    async def hello(self) -> tuple[int, int]:
        return self.generation, self.start

    async def counters(self) -> tuple[list[int], list[list[int]]]:
        return self.written_rounds, self.read_rounds

    async def post(self, sender: int, round_: int, params: np.ndarray, readers: list[int]) -> None:
        self.slots[sender] = params
        self.written_rounds[sender] = round_
        for reader in readers:
            self.bells[reader].set()

    async def take(self, reader: int, sender: int, round_: int) -> np.ndarray | None:
        self.read_rounds[reader][sender] = round_
        self.bells[sender].set()
        return self.slots[sender]

    async def latest(self, reader: int, sender: int) -> tuple[int, np.ndarray | None]:
        self.read_rounds[reader][sender] = self.written_rounds[sender]
        return self.written_rounds[sender], self.slots[sender]

    async def peek(self, sender: int) -> np.ndarray | None:
        return self.slots[sender] if self.written_rounds[sender] >= self.start else None

    async def wait(self, me: int, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.bells[me].wait(), timeout=max(0.0, timeout))
        self.bells[me].clear()  # no await since the wake: a ring after this is seen by the caller's next look


class RayMailboxes(Mailboxes):
    """`Mailboxes` behind a `MailboxActor`, reached through its keeper's handle (by its name): each call one actor
    call; the counters are fetched once per look and kept until the next `post`, `take` or `wait` (a look at several
    peers is one call). A call whose actor died waits (up to `RECONNECT_S`) for the next actor under the name; one
    of a later generation than this copy knew raises `MailboxesReset`. Picklable to the roles (without the
    `keeper`)."""

    def __init__(self, n: int, size: int):
        self.n, self.size = n, size
        self.handle: RayServiceHandle | None = None  # the keeper's, once it has started the actor
        self._actor: Any = None  # the actor handle, once reached
        self._counters: tuple[list[int], list[list[int]]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"handle": self.handle, "n": self.n, "size": self.size, "generation": self.generation,
                "_actor": None, "_counters": None}  # fmt: skip

    def _connect(self) -> Any:
        """The live actor under the name (the first one answering `hello`); `MailboxesReset` if it is of a later
        generation than the last one this copy reached."""
        import ray

        assert self.handle is not None  # the keeper sets it when it is made, before anyone calls
        waited_since = time.monotonic()
        while self._actor is None:
            actor = self.handle.actor()  # waits (up to `RECONNECT_S`) for an actor to hold the name
            try:
                generation, start = ray.get(actor.hello.remote(), timeout=PING_EVERY_S)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                    ray.exceptions.GetTimeoutError):  # fmt: skip  # the dead (or hung) one still holds the name
                if time.monotonic() - waited_since > RECONNECT_S:
                    raise ServiceUnavailable(f"the gossip mailboxes were unreachable for {RECONNECT_S:.0f} s") from None
                self.handle.lost()
                continue
            self._actor = actor
            if generation > self.generation:
                self.generation = generation
                raise MailboxesReset(start)
        return self._actor

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        while True:
            actor = self._connect()
            try:
                return ray.get(getattr(actor, method).remote(*args))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self._actor = self._counters = None  # its keeper restarts it: the next `_connect` waits for that
                assert self.handle is not None  # `_connect` has used it
                self.handle.lost()

    def _look(self) -> tuple[list[int], list[list[int]]]:
        if self._counters is None:
            self._counters = self._call("counters")
        return self._counters

    def written(self, sender: int) -> int:
        return self._look()[0][sender]

    def read(self, reader: int, sender: int) -> int:
        return self._look()[1][reader][sender]

    def post(self, sender: int, round_: int, params: torch.Tensor, readers: list[int]) -> None:
        self._counters = None
        self._call("post", sender, round_, params.numpy(), readers)

    def take(self, reader: int, sender: int, round_: int) -> torch.Tensor:
        self._counters = None
        return torch.tensor(self._call("take", reader, sender, round_))  # a copy: the store's is read-only

    def latest(self, reader: int, sender: int) -> tuple[int, torch.Tensor]:
        self._counters = None
        round_, message = self._call("latest", reader, sender)
        return round_, torch.tensor(message)  # a copy: the store's is read-only

    def peek(self, sender: int) -> torch.Tensor | None:
        message = self._call("peek", sender)
        return None if message is None else torch.tensor(message)

    def wait(self, me: int, timeout: float) -> None:
        self._counters = None
        self._call("wait", me, timeout)


class MailboxKeeper(RayServices):
    """The mailbox actor watched as a service (reported as "mailbox actor 0"): pinged behind its calls, and when
    it dies or does not answer for the heartbeat (killed), restarted empty next to the driver as the next
    generation, at the round `rejoin_round()` names (past every round the coordinator has seen). The
    coordinator's `mailboxes` carry that generation into the learners restarted later."""

    def __init__(self, backend: RayHost, mailboxes: RayMailboxes, start_round: int, rejoin_round: Callable[[], int],
                 max_restarts: int, pids_file: Path | None, heartbeat_s: float | None):  # fmt: skip
        self.mailboxes, self.start_round, self.rejoin_round = mailboxes, start_round, rejoin_round
        super().__init__(backend, None, 1, max_restarts, pids_file, "mailbox actor", heartbeat_s)
        mailboxes.handle = cast(RayServiceHandle, self.handles[0])  # what `RayServices` makes

    def _start(self, index: int) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        generation = self.incarnations[index]
        start = self.start_round if generation == 0 else self.rejoin_round()
        self.mailboxes.generation = generation
        here = NodeAffinitySchedulingStrategy(self.ray.get_runtime_context().get_node_id(), soft=True)
        options = dict(name=f"{self.prefix}-{index}", namespace=self.namespace, num_cpus=0, scheduling_strategy=here,
                       enable_task_events=TASK_EVENTS)  # fmt: skip
        with sigint_deferred():
            return self.ray.remote(MailboxActor).options(**options).remote(self.mailboxes.n, start, generation)

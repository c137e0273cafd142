"""Gossip mailboxes: where learners that average their parameters with their neighbours' (`gossip`) leave them
for each other, behind one small interface (`Mailboxes`), and its one-machine form (`SharedMailboxes`).

A learner posts its flat parameter vector to its own slot, tagged with the round; its out-neighbours take it
from there. Every reader records the last round of every sender it has taken, so a sender knows when all its
readers have read a round and it may post the next one. Waiting is blocking, never a busy spin: each learner
has a doorbell (a semaphore) that a peer rings after posting to it or taking from it, and a waiting learner
sleeps on its own doorbell until something it waits for may have changed, then looks again.

A restarted learner may also `peek` at a slot: a copy of what it holds, whatever the round, checked by the
slot's sequence number (odd while its sender writes), without recording a read. In GALA's order, where a sender
never waits for its readers and may overwrite a slot at any time, a reader takes the slot's `latest` message the
same way, and records its round as read.

Nothing is locked: the round counters are lock-free shared integers with one writer each (a slot's round and
sequence number by its sender, a reader's record by that reader), and a doorbell only wakes. A learner killed at
any instruction (SIGKILL, out of memory) leaves nothing that another learner or the coordinator has to get
back, and its next incarnation finds in the counters where it stopped.

Where the mailboxes live in a process of their own (an actor on `ray`), that process is watched as a service
(`keeper`): one that dies or stops answering is restarted empty, as the next `generation`, and a learner's next
call meets it as `MailboxesReset`, with the round at which every learner rejoins.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from multiprocessing.context import BaseContext
from typing import Any

import torch


class MailboxesReset(RuntimeError):
    """The store behind the mailboxes was restarted empty (its process died, or hung and was killed): every
    learner rejoins at `round_`, posting its own parameters as that round, as at the start of a run."""

    def __init__(self, round_: int):
        super().__init__(f"the gossip mailboxes were restarted empty: rejoin at round {round_}")
        self.round = round_


class Mailboxes(ABC):
    """Where gossiping learners leave their parameters for each other (`gossip`): one slot per sender, which
    holds the flat parameter vector it posted last and that round's number, and for every reader the last
    round of each sender it has read. The slot is the sender's message to all its out-neighbours of that round.

    Nothing here enforces an order: the learners do (`rlfleet.arch.gossip`), by posting round t only once its
    out-neighbours of round t-1 have read round t-1, and by reading a sender only once it has posted this
    round; `wait` blocks (no busy spin) until a peer posts to, or reads from, the caller. Picklable to the
    backend's roles."""

    n: int
    """Learners."""
    size: int
    """Length of the flat parameter vector."""
    generation: int = 0
    """How many times the store behind them has been restarted (empty), as this copy last saw it."""
    keeper: Any = None
    """A `ServiceGroup`: the coordinator's watch over the store's process, where it has one of its own (`ray`):
    `check()` restarts it empty when it dies or hangs; None where the mailboxes are the coordinator's shared memory."""

    @abstractmethod
    def written(self, sender: int) -> int:
        """The last round `sender` posted (the start round - 1 before it posted any)."""

    @abstractmethod
    def read(self, reader: int, sender: int) -> int:
        """The last round of `sender`'s slot that `reader` has taken."""

    @abstractmethod
    def post(self, sender: int, round_: int, params: Any, readers: list[int]) -> None:
        """Put `params` (a flat float32 tensor) in `sender`'s slot as round `round_`, and wake `readers`."""

    @abstractmethod
    def take(self, reader: int, sender: int, round_: int) -> Any:
        """A copy of `sender`'s slot, recorded as read by `reader` at `round_`; wakes `sender`."""

    @abstractmethod
    def latest(self, reader: int, sender: int) -> tuple[int, Any] | None:
        """A consistent copy of `sender`'s slot and the round it holds, recorded as read by `reader` at that round,
        whatever the sender does meanwhile (GALA's order, where senders overwrite their slot without waiting);
        None while a sender killed in the middle of a post leaves its slot torn (its next incarnation posts)."""

    @abstractmethod
    def peek(self, sender: int) -> Any | None:
        """A consistent copy of what `sender`'s slot holds now, whatever its round, without recording a read (a
        restarted learner's parameters); None if `sender` has posted nothing in this run or is posting now."""

    @abstractmethod
    def wait(self, me: int, timeout: float) -> None:
        """Block until a peer posts to or takes from learner `me` (or `timeout` seconds pass); may return early."""


class SharedMailboxes(Mailboxes):
    """`Mailboxes` of learners on one machine (processes of the `local` backend, or one process): the slots are
    one shared-memory tensor [n, size], the rounds lock-free shared integers (`RawArray`), the doorbells
    semaphores of the context `ctx`. Picklable to `spawn`ed processes at their start."""

    def __init__(self, ctx: BaseContext, n: int, size: int, start_round: int = 0):
        self.n, self.size = n, size
        self.slots: torch.Tensor = torch.zeros(n, size, dtype=torch.float32)
        self.slots.share_memory_()  # type: ignore[no-untyped-call]  # torch leaves share_memory_ unannotated
        self._start = start_round
        self._seq = ctx.RawArray("q", n)  # per slot: odd while its sender copies into it (a sequence lock)
        self._written = ctx.RawArray("q", [start_round - 1] * n)
        self._read = ctx.RawArray("q", [start_round - 1] * (n * n))  # [reader * n + sender]
        self._bells = [ctx.Semaphore(0) for _ in range(n)]

    def written(self, sender: int) -> int:
        return int(self._written[sender])

    def read(self, reader: int, sender: int) -> int:
        return int(self._read[reader * self.n + sender])

    def post(self, sender: int, round_: int, params: torch.Tensor, readers: list[int]) -> None:
        seq = self._seq[sender]
        self._seq[sender] = seq + 1 + seq % 2  # odd (also after an incarnation killed while it posted left it odd)
        self.slots[sender].copy_(params)
        self._written[sender] = round_  # after the copy: a reader that sees the round sees the parameters
        self._seq[sender] += 1  # even after the round too: a consistent copy has the round it holds
        for reader in readers:
            self._bells[reader].release()

    def take(self, reader: int, sender: int, round_: int) -> torch.Tensor:
        message = self.slots[sender].clone()
        self._read[reader * self.n + sender] = round_  # after the copy: the sender may now overwrite the slot
        self._bells[sender].release()
        return message

    def _consistent(self, sender: int, tries: int) -> tuple[int, torch.Tensor] | None:
        """The slot's round and a copy of it, kept if its sequence number was even and unchanged around them; a
        sender posting now (or killed while posting: its number stays odd) is given `tries` of 1 ms, then None."""
        for _ in range(tries):
            seq = self._seq[sender]
            if seq % 2 == 0:
                round_, copy = self._written[sender], self.slots[sender].clone()
                if self._seq[sender] == seq:
                    return round_, copy
            time.sleep(1e-3)
        return None

    def latest(self, reader: int, sender: int, tries: int = 50) -> tuple[int, torch.Tensor] | None:
        got = self._consistent(sender, tries)  # a live sender's copy takes well under a millisecond
        if got is not None:
            self._read[reader * self.n + sender] = got[0]
        return got

    def peek(self, sender: int, tries: int = 50) -> torch.Tensor | None:
        """A consistent copy of the slot (`_consistent`); None before `sender` posted in this run, or while a sender
        killed in the middle of a post leaves it torn."""
        if self._written[sender] < self._start:
            return None
        got = self._consistent(sender, tries)
        return None if got is None or got[0] < self._start else got[1]

    def wait(self, me: int, timeout: float) -> None:
        bell = self._bells[me]
        if bell.acquire(timeout=max(0.0, timeout)):
            while bell.acquire(block=False):  # rings that came meanwhile: the caller looks at the counters anyway
                pass

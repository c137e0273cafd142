"""Lock-free integers in shared memory that a coordinator and its worker processes on one machine share: the
global step count (`StepCounter`), the stop signal (`StopFlag`) and the version of the published weights
(`WeightVersion`, a sequence lock). None of them takes a lock: a worker may be killed (SIGKILL, out of memory)
at any instruction, and nothing it was touching may then block the coordinator. They work within one process
too (the serial backend uses them as they are).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import BaseContext
from types import SimpleNamespace
from typing import TypeAlias


class _InProcess:
    """A stand-in for a multiprocessing context whose `RawValue`/`RawArray` are plain objects of one process:
    the same primitives for a coordinator whose roles share nothing with it (Ray actors). Picklable."""

    @staticmethod
    def RawValue(typecode: str, value: int) -> SimpleNamespace:  # noqa: N802 (multiprocessing's name)
        return SimpleNamespace(value=value)

    @staticmethod
    def RawArray(typecode: str, size: int) -> list[int]:  # noqa: N802
        return [0] * size


IN_PROCESS = _InProcess()
Context: TypeAlias = BaseContext | _InProcess
"""Where the integers live: a multiprocessing context's shared memory, or `IN_PROCESS`."""


class StepCounter:
    """A global step count that several processes add to without a lock: one int64 slot per writer, summed by
    readers (`value`). Slot 0 is the coordinator's; a worker adds to its own slot (`add(n, slot)`), and a
    restarted worker takes over its dead predecessor's. Nothing is locked, so a process killed at any moment
    leaves nothing that another one waits for. Picklable to `spawn`ed processes (a shared `RawArray`).
    """

    def __init__(self, ctx: Context, slots: int = 1):
        self._slots = ctx.RawArray("q", slots)

    @property
    def value(self) -> int:
        return int(sum(self._slots))

    def add(self, n: int, slot: int = 0) -> None:
        """Add `n` to one slot; only one process may write each slot."""
        self._slots[slot] += n

    def set(self, total: int) -> None:
        """Start the count at `total` (restoring a checkpoint, before any worker runs)."""
        for i in range(len(self._slots)):
            self._slots[i] = 0
        self._slots[0] = total


class StopFlag:
    """The coordinator's "stop now" to its workers: set once, read constantly, never locked (unlike a
    `multiprocessing.Event`, whose readers take a lock that a killed reader can leave held).
    Picklable to `spawn`ed processes (a shared `RawValue`)."""

    def __init__(self, ctx: Context):
        self._flag = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)


class WeightVersion:
    """The version of weights that one writer updates in place and many processes read (a sequence lock).

    The writer wraps each update in `writing()`: the counter is odd while the weights change and even
    between updates, so `version` (counter // 2) is the number of finished updates. A reader copies the
    weights with `read(copy)`: it waits for an even counter, copies, and copies again if the counter moved
    meanwhile; it returns the version it copied, exactly. Neither side takes a lock: the writer never waits
    for readers, a reader waits at most until the writer pauses between updates, and a reader killed at any
    moment leaves nothing behind. Picklable to `spawn`ed processes (a shared `RawValue` with one writer).
    """

    def __init__(self, ctx: Context, version: int = 0):
        self._seq = ctx.RawValue("q", 2 * version)

    @property
    def version(self) -> int:
        seq: int = self._seq.value
        return seq // 2

    def set(self, version: int) -> None:
        self._seq.value = 2 * version

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Wrap one update of the weights (the only writer: the counter is odd meanwhile)."""
        self._seq.value += 1
        try:
            yield
        finally:
            self._seq.value += 1

    def read(self, copy: Callable[[], None], stop: StopFlag | None = None, poll_s: float = 2e-4) -> int | None:
        """Run `copy` until it saw one unchanged version and return that version (None if `stop` got set)."""
        while True:
            seq: int = self._seq.value
            if seq % 2 == 0:
                copy()
                if self._seq.value == seq:
                    return seq // 2
            if stop is not None and stop.is_set():
                return None
            time.sleep(poll_s)

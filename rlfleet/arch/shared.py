"""What processes share: an algorithm's networks in shared memory, worker-local copies of them, a version counter
that lets readers copy them consistently while one writer updates them, the global step count and the stop flag.

None of these takes a lock: a worker may be killed (SIGKILL, out of memory) at any instruction, and nothing
it was touching may then block the coordinator.

What is shared is read off the algorithm object itself: every `nn.Module` attribute. Modules with
trainable parameters (the model) are copied into each worker's own algorithm object at every sync and
receive the workers' gradients; modules without (target networks) are used in place by default, so that
one target network serves every worker, or copied like the model (`share_frozen=False`) where only one
writer may change them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch
from torch import nn


def algo_modules(algo) -> dict[str, nn.Module]:
    """The algorithm's networks by attribute name (model, target network, ...)."""
    return {name: value for name, value in vars(algo).items() if isinstance(value, nn.Module)}


def share_algo(algo) -> dict[str, nn.Module]:
    """Move the algorithm's networks into shared memory (in place) and return them by name."""
    modules = algo_modules(algo)
    for module in modules.values():
        module.share_memory()
    return modules


def trainable_params(modules: dict[str, nn.Module]) -> list[nn.Parameter]:
    return [p for module in modules.values() for p in module.parameters() if p.requires_grad]


def _frozen(module: nn.Module) -> bool:
    return not any(p.requires_grad for p in module.parameters())


class LocalCopy:
    """A worker's algorithm object tied to the shared networks: `pull()` copies the shared weights in,
    `push_grads()` hands the local gradients to the shared parameters (for an optimizer over them).

    `share_frozen=True` (hogwild) puts the shared target networks themselves into the local algorithm, so
    its schedule syncs the one target all workers use; `share_frozen=False` (data- and gradient-parallel
    runs, where only the learner changes weights) keeps the worker's own target networks and `pull()`
    copies the learner's into them.
    """

    def __init__(self, local_algo, shared: dict[str, nn.Module], share_frozen: bool = True):
        self.algo = local_algo
        local = algo_modules(local_algo)
        if set(local) != set(shared):
            raise ValueError(f"local networks {sorted(local)} do not match the shared ones {sorted(shared)}")
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.frozen_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for name, module in shared.items():
            if _frozen(module):
                if share_frozen:
                    setattr(local_algo, name, module)  # a target network: one for all workers
                else:  # parameters and buffers, as state_dict aliases of the live tensors
                    local_state, shared_state = local[name].state_dict(), module.state_dict()
                    self.frozen_pairs += [(local_state[k], shared_state[k]) for k in shared_state]
                continue
            for lp, sp in zip(local[name].parameters(), module.parameters(), strict=True):
                if sp.requires_grad:
                    self.pairs.append((lp, sp))
        self.local_params = [lp for lp, _ in self.pairs]
        self.shared_params = [sp for _, sp in self.pairs]

    @torch.no_grad()
    def pull(self) -> None:
        for lp, sp in self.pairs:
            lp.copy_(sp)
        for lt, st in self.frozen_pairs:
            lt.copy_(st)

    def push_grads(self) -> None:
        """Point each shared parameter's `.grad` at the local gradient (no copy; this process only)."""
        for lp, sp in self.pairs:
            sp.grad = lp.grad


class StepCounter:
    """A global step count that several processes add to without a lock: one int64 slot per writer, summed by
    readers (`value`). Slot 0 is the coordinator's; a worker adds to its own slot (`add(n, slot)`), and a
    restarted worker takes over its dead predecessor's. Nothing is locked, so a process killed at any moment
    leaves nothing that another one waits for. Picklable to `spawn`ed processes (a shared `RawArray`).
    """

    def __init__(self, ctx, slots: int = 1):
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

    def __init__(self, ctx):
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

    def __init__(self, ctx, version: int = 0):
        self._seq = ctx.RawValue("q", 2 * version)

    @property
    def version(self) -> int:
        return self._seq.value // 2

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

    def read(self, copy: Callable[[], None], stop=None, poll_s: float = 2e-4) -> int | None:
        """Run `copy` until it saw one unchanged version and return that version (None if `stop` got set)."""
        while True:
            seq = self._seq.value
            if seq % 2 == 0:
                copy()
                if self._seq.value == seq:
                    return seq // 2
            if stop is not None and stop.is_set():
                return None
            time.sleep(poll_s)

"""Parameters shared between processes: an algorithm's networks in shared memory, worker-local copies of them,
and a version counter that lets readers copy them consistently while one writer updates them.

What is shared is read off the algorithm object itself: every `nn.Module` attribute. Modules with
trainable parameters (the model) are copied into each worker's own algorithm object at every sync and
receive the workers' gradients; modules without (target networks) are used in place by default, so that
one target network serves every worker, or copied like the model (`share_frozen=False`) where only one
writer may change them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

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


class WeightVersion:
    """The version of weights that one writer updates in place and many processes read (a sequence lock).

    The writer wraps each update in `writing()`: the counter is odd while the weights change and even
    between updates, so `version` (counter // 2) is the number of finished updates. A reader copies the
    weights with `read(copy)`: it waits for an even counter, copies, and copies again if the counter moved
    meanwhile; it returns the version it copied, exactly. The writer never waits for readers; a reader
    waits at most until the writer pauses between updates.
    Picklable to `spawn`ed processes (a shared `multiprocessing.Value`).
    """

    def __init__(self, ctx, version: int = 0):
        self._seq = ctx.Value("q", 2 * version)

    @property
    def version(self) -> int:
        return self._seq.value // 2

    def set(self, version: int) -> None:
        self._seq.value = 2 * version

    def writing(self) -> _Writing:
        return _Writing(self._seq)

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


class _Writing:
    def __init__(self, seq):
        self._seq = seq

    def __enter__(self) -> None:
        with self._seq.get_lock():
            self._seq.value += 1

    def __exit__(self, *exc) -> None:
        with self._seq.get_lock():
            self._seq.value += 1

"""An algorithm's networks shared with its workers: the networks by name, in shared memory where the workers are
processes (`share_algo`), and a worker's local copy of them (`LocalCopy`).

What is shared is read off the algorithm object itself: every `nn.Module` attribute. Modules with
trainable parameters (the model) are copied into each worker's own algorithm object at every sync and
receive the workers' gradients; modules without (target networks) are used in place by default, so that
one target network serves every worker, or copied like the model (`share_frozen=False`) where only one
writer may change them.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch import nn

from rlfleet.algos.contract import Algorithm


def algo_modules(algo: Algorithm) -> dict[str, nn.Module]:
    """The algorithm's networks by attribute name (model, target network, ...)."""
    return {name: value for name, value in vars(algo).items() if isinstance(value, nn.Module)}


def share_algo(algo: Algorithm) -> dict[str, nn.Module]:
    """Move the algorithm's networks into shared memory (in place) and return them by name."""
    modules = algo_modules(algo)
    for module in modules.values():
        module.share_memory()
    return modules


def trainable_params(modules: dict[str, nn.Module]) -> list[nn.Parameter]:
    return [p for module in modules.values() for p in module.parameters() if p.requires_grad]


def _frozen(module: nn.Module) -> bool:
    return not any(p.requires_grad for p in module.parameters())


def frozen_state(modules: dict[str, nn.Module]) -> list[torch.Tensor]:
    """The state of the networks without trainable parameters (target networks and their sync clocks), as the
    live tensors of their `state_dict`s, in order: what a learner's `schedule` changes besides the learning rate."""
    return [t for module in modules.values() if _frozen(module) for t in module.state_dict().values()]


def untracked_state(modules: dict[str, nn.Module]) -> tuple[list[str], list[str]]:
    """What the networks with trainable parameters hold besides them, that no gradient carries from one process to
    another: (the modules with running statistics — BatchNorm's, moved by every forward in training mode —, the
    frozen parameters — a pretrained layer held fixed), each by its name in the network."""
    running, frozen = [], []
    for name, module in modules.items():
        if _frozen(module):
            continue
        for sub, m in module.named_modules(prefix=name):
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:
                running.append(sub)
        frozen += [f"{name}.{key}" for key, p in module.named_parameters() if not p.requires_grad]
    return running, frozen


class LocalCopy:
    """A worker's algorithm object tied to the shared networks: `pull()` copies the shared weights in (their whole
    state: frozen parameters and buffers such as BatchNorm's statistics too, so that every process acts with the
    learner's network), `push_grads()` hands the local gradients to the shared parameters (for an optimizer over
    them).

    `share_frozen=True` (hogwild) puts the shared target networks themselves into the local algorithm, so
    its schedule syncs the one target all workers use; `share_frozen=False` (data- and gradient-parallel
    runs, where only the learner changes weights) keeps the worker's own target networks and `pull()`
    copies the learner's into them.
    """

    def __init__(self, local_algo: Algorithm, shared: dict[str, nn.Module], share_frozen: bool = True):
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
            local_state, shared_state = local[name].state_dict(keep_vars=True), module.state_dict(keep_vars=True)
            self.frozen_pairs += [  # the rest of its state: copied, never given gradients
                (local_state[k].detach(), t.detach()) for k, t in shared_state.items() if not t.requires_grad
            ]
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


def to_bytes(state: dict[str, Any]) -> bytes:
    """A state dict serialised by `torch.save` (read back with `from_bytes`, `weights_only=True`)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> dict[str, Any]:
    """Read onto the CPU, whatever device the writer learned on (`load_state_dict` copies it where it goes)."""
    state: dict[str, Any] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return state


def pack_state(algo: Algorithm) -> bytes:
    """What makes learners identical: every network's state (parameters and buffers: targets, clocks) and the
    optimizer's, serialised (`to_bytes`)."""
    modules = {name: module.state_dict() for name, module in algo_modules(algo).items()}
    return to_bytes({"modules": modules, "optimizer": algo.optimizer.state_dict()})


def load_state(algo: Algorithm, data: bytes) -> None:
    """Load what `pack_state` wrote into `algo` (in place: shared networks stay shared)."""
    state = from_bytes(data)
    for name, module in algo_modules(algo).items():
        module.load_state_dict(state["modules"][name])
    algo.optimizer.load_state_dict(state["optimizer"])

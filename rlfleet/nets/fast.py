"""NumPy inference for small MLPs: acting on a handful of envs is dominated by PyTorch's per-op overhead.

A 64×64 actor-critic on a batch of 8 runs several times faster in NumPy than in eager PyTorch. Branches
with the same layout that read the same input (an actor and a critic) are fused into one stack of
wider matrices: the first layers are concatenated and the later ones made block-diagonal, so one pass
computes both. The fused matrices are rebuilt whenever a parameter changes (tracked through torch's
in-place version counters), so optimiser steps and `load_state_dict` are always seen. Only plain stacks
of Linear and element-wise activations are compiled; anything else (CNNs, LSTMs) returns None and the
caller uses PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

_ACTIVATIONS: dict[type, Callable[[np.ndarray], np.ndarray]] = {
    nn.Tanh: np.tanh,
    nn.ReLU: lambda x: np.maximum(x, 0.0),
    nn.ELU: lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}


def _flat_modules(module: nn.Module) -> list[nn.Module] | None:
    """The module as a flat list of Linear / activation layers (Flatten and Identity dropped), or None."""
    if isinstance(module, nn.Sequential):
        out: list[nn.Module] = []
        for child in module:
            sub = _flat_modules(child)
            if sub is None:
                return None
            out += sub
        return out
    if isinstance(module, nn.Flatten | nn.Identity):
        return []
    if isinstance(module, nn.Linear) or type(module) in _ACTIVATIONS:
        return [module]
    children = list(module.children())
    if len(children) == 1:
        return _flat_modules(children[0])
    return None


def _layout(modules: list[nn.Module]) -> list[type]:
    return [type(m) for m in modules]


class NumpyMLP:
    """Forward pass of one or more Linear/activation branches that share their input, in NumPy.

    Returns one array per branch. Branches with identical layouts are fused into a single pass.
    """

    def __init__(self, branches: list[list[nn.Module]]):
        self.branches = branches
        self.params = [p for branch in branches for m in branch for p in m.parameters()]
        self.fused = len(branches) > 1 and all(_layout(b) == _layout(branches[0]) for b in branches)
        self._key: list[tuple[int, int]] = []
        self._ops: list[list[tuple[np.ndarray | None, np.ndarray | None, Callable | None]]] = []
        self._splits: list[int] = []

    def __getstate__(self) -> dict:  # the compiled matrices are rebuilt after unpickling
        return {**self.__dict__, "_key": [], "_ops": [], "_splits": []}

    def _compile(self) -> None:
        key = [(p.data_ptr(), p._version) for p in self.params]
        if key == self._key:
            return
        with torch.no_grad():
            if self.fused:
                self._ops = [self._fused_ops()]
            else:
                self._ops = [self._branch_ops(b) for b in self.branches]
        self._key = key

    @staticmethod
    def _branch_ops(branch: list[nn.Module]):
        return [
            (m.weight.numpy().T, m.bias.numpy(), None)
            if isinstance(m, nn.Linear)
            else (None, None, _ACTIVATIONS[type(m)])
            for m in branch
        ]

    def _fused_ops(self):
        ops = []
        first_linear = True
        for layer in zip(*self.branches, strict=True):
            if not isinstance(layer[0], nn.Linear):
                ops.append((None, None, _ACTIVATIONS[type(layer[0])]))
                continue
            weights = [m.weight.numpy().T for m in layer]
            if first_linear:  # all branches read the same input: concatenate outputs
                w = np.concatenate(weights, axis=1)
                first_linear = False
            else:
                w = np.zeros((sum(x.shape[0] for x in weights), sum(x.shape[1] for x in weights)), np.float32)
                r = c = 0
                for x in weights:
                    w[r : r + x.shape[0], c : c + x.shape[1]] = x
                    r, c = r + x.shape[0], c + x.shape[1]
            ops.append((w, np.concatenate([m.bias.numpy() for m in layer]), None))
        widths = [[m for m in b if isinstance(m, nn.Linear)][-1].out_features for b in self.branches]
        self._splits = [int(x) for x in np.cumsum([0, *widths])]
        return ops

    @staticmethod
    def _run(ops, x: np.ndarray) -> np.ndarray:
        for w, b, act in ops:
            x = act(x) if act is not None else x @ w + b
        return x

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        x = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
        self._compile()
        if self.fused:
            out = self._run(self._ops[0], x)
            return [out[:, a:b] for a, b in zip(self._splits[:-1], self._splits[1:], strict=True)]
        return [self._run(ops, x) for ops in self._ops]


def compile_numpy(*branches: tuple[nn.Module, ...]) -> NumpyMLP | None:
    """NumPy forward for branches (each a tuple of modules applied in sequence) on one shared input.

    None if any part is not a plain MLP on float32 CPU parameters.
    """
    flat: list[list[nn.Module]] = []
    for branch in branches:
        modules: list[nn.Module] = []
        for module in branch:
            sub = _flat_modules(module)
            if sub is None:
                return None
            modules += sub
        flat.append(modules)
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for b in flat for m in b for p in m.parameters()):
        return None
    return NumpyMLP(flat)


def sample_categorical(logits: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample from softmax(logits) per row (Gumbel-max) and return (actions, log-probabilities)."""
    actions = (logits - np.log(-np.log(rng.random(logits.shape)))).argmax(-1)
    return actions, log_softmax(logits)[np.arange(len(actions)), actions]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))

"""NumPy inference for small MLPs: acting on a handful of envs is dominated by PyTorch's per-op overhead.

A 64×64 actor-critic on a batch of 8 runs several times faster in NumPy than in eager PyTorch. The
NumPy arrays are *views* of the live torch parameters (no copies), so optimiser steps, `load_state_dict`
and writes by other processes into shared memory are seen at once; if a parameter's storage moves (e.g.
`share_memory_()`), the views are taken again. Only plain stacks of Linear and element-wise activations
are compiled; anything else (CNNs, LSTMs) returns None and the caller uses PyTorch. Sampling (categorical and
diagonal Gaussian) uses the caller's NumPy generator.
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

Op = tuple[np.ndarray | None, np.ndarray | None, Callable[[np.ndarray], np.ndarray] | None]


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


class NumpyMLP:
    """Forward pass of one or more Linear/activation branches that share their input; one array per branch."""

    def __init__(self, branches: list[list[nn.Module]]):
        self.branches = branches
        self.params = [p for branch in branches for m in branch for p in m.parameters()]
        self._ptrs: list[int] = []
        self._ops: list[list[Op]] = []

    def __getstate__(self) -> dict:  # views and lambdas are rebuilt after unpickling
        return {**self.__dict__, "_ptrs": [], "_ops": []}

    def _views(self) -> list[list[Op]]:
        ptrs = [p.data_ptr() for p in self.params]
        if ptrs != self._ptrs:
            self._ops = [
                [
                    (m.weight.detach().numpy().T, m.bias.detach().numpy(), None)
                    if isinstance(m, nn.Linear)
                    else (None, None, _ACTIVATIONS[type(m)])
                    for m in branch
                ]
                for branch in self.branches
            ]
            self._ptrs = ptrs
        return self._ops

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        x = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
        outputs = []
        for ops in self._views():
            h = x
            for w, b, act in ops:
                h = act(h) if act is not None else h @ w + b
            outputs.append(h)
        return outputs


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


_HALF_LOG_2PI = 0.5 * np.log(2 * np.pi)


def gaussian_log_prob(actions: np.ndarray, mean: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """Log-density of `[B, A]` actions under a diagonal Gaussian, summed over the A dims (float32 `[B]`)."""
    z = (actions - mean) * np.exp(-log_std)
    return (-0.5 * z * z - log_std - _HALF_LOG_2PI).sum(-1).astype(np.float32)


def sample_gaussian(mean: np.ndarray, log_std: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample a diagonal Gaussian per row and return (float32 actions `[B, A]`, log-probabilities `[B]`)."""
    noise = rng.standard_normal(mean.shape, dtype=np.float32)
    actions = (mean + np.exp(log_std) * noise).astype(np.float32)
    return actions, (-0.5 * (noise * noise).sum(-1) - log_std.sum(-1) - mean.shape[-1] * _HALF_LOG_2PI).astype(
        np.float32
    )

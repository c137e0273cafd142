"""NumPy inference for small MLPs: acting on a handful of envs is dominated by PyTorch's per-op overhead.

A 64×64 actor-critic on a batch of 8 runs several times faster in NumPy than in eager PyTorch. The
NumPy arrays are *views* of the live torch parameters (no copies), so optimiser steps, `load_state_dict`
and writes by other processes into shared memory are seen at once; if a parameter's storage moves (e.g.
`share_memory_()`), the views are taken again. Only plain stacks of Linear and element-wise activations
are compiled (an MLP that starts with a `FlatInput` too: its one-hots are made in NumPy); anything else (CNNs,
LSTMs) returns None and the caller uses PyTorch. Sampling (categorical, factorised categorical, Bernoulli and
diagonal Gaussian) uses the caller's NumPy generator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from rlfleet.nets.encoders import FlatInput
from rlfleet.nets.user import UserModule

_ACTIVATIONS: dict[type, Callable[[np.ndarray], np.ndarray]] = {
    nn.Tanh: np.tanh,
    nn.ReLU: lambda x: np.maximum(x, 0.0),
    nn.ELU: lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))),
}

Op = tuple[np.ndarray | None, np.ndarray | None, Callable[[np.ndarray], np.ndarray] | None]


def _flat_modules(module: nn.Module) -> list[nn.Module] | None:
    """The module as a flat list of Linear / activation layers (Flatten and Identity dropped), or None (a user
    network always: its forward may be anything)."""
    if isinstance(module, UserModule):
        return None
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
    """Forward pass of one or more Linear/activation branches that share their input; one array per branch.
    Layers that every branch starts with (a body shared by a dueling head's two streams, or by an actor and a
    critic) run once.

    `inputs` (a `FlatInput`, or None for a `Box`'s flattening) turns the observations into the branches' input.
    """

    def __init__(self, branches: list[list[nn.Module]], inputs: FlatInput | None = None):
        self.inputs = inputs
        # the layers every branch starts with (the same module objects: a shared body) run once: the parts are
        # that trunk, then each branch's own layers
        shared = 0
        while all(len(b) > shared and b[shared] is branches[0][shared] for b in branches):
            shared += 1
        self.parts = [branches[0][:shared]] + [b[shared:] for b in branches]
        self.params = [p for part in self.parts for m in part for p in m.parameters()]
        self._ptrs: list[int] = []
        self._ops: list[list[Op]] = []

    def __getstate__(self) -> dict[str, Any]:  # views and lambdas are rebuilt after unpickling
        return {**self.__dict__, "_ptrs": [], "_ops": []}

    def _views(self) -> list[list[Op]]:
        ptrs = [p.data_ptr() for p in self.params]
        if ptrs != self._ptrs:
            self._ops = [
                [
                    (m.weight.detach().numpy().T, m.bias.detach().numpy(), None)
                    if isinstance(m, nn.Linear)
                    else (None, None, _ACTIVATIONS[type(m)])
                    for m in part
                ]
                for part in self.parts
            ]
            self._ptrs = ptrs
        return self._ops

    def __call__(self, x: Any) -> list[np.ndarray]:
        flat = self.inputs.numpy if self.inputs is not None else lambda o: np.asarray(o, np.float32).reshape(len(o), -1)
        trunk, *heads = self._views()
        x = _run(trunk, flat(x))
        return [_run(ops, x) for ops in heads]


def _run(ops: list[Op], h: np.ndarray) -> np.ndarray:
    for w, b, act in ops:
        h = act(h) if act is not None else h @ w + b
    return h


def compile_numpy(*branches: tuple[nn.Module, ...]) -> NumpyMLP | None:
    """NumPy forward for branches (each a tuple of modules applied in sequence) on one shared input.

    None if any part is not a plain MLP on float32 CPU parameters, or if the branches start with different
    `FlatInput`s (MLP encoders of other spaces than `Box`).
    """
    flat: list[list[nn.Module]] = []
    inputs: list[FlatInput | None] = []
    for branch in branches:
        modules: list[nn.Module] = []
        first = branch[0]
        inputs.append(getattr(first, "inputs", None))
        if inputs[-1] is not None:  # an MLP behind a FlatInput: its layers, with the FlatInput made in NumPy
            branch = (cast(nn.Module, first.net), *branch[1:])
        for module in branch:
            sub = _flat_modules(module)
            if sub is None:
                return None
            modules += sub
        flat.append(modules)
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for b in flat for m in b for p in m.parameters()):
        return None
    base = inputs[0]
    if any(type(i) is not type(base) or (i is not None and base is not None and i.space != base.space) for i in inputs):
        return None
    return NumpyMLP(flat, base)


def sample_categorical(logits: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample from softmax(logits) per row (Gumbel-max) and return (actions, log-probabilities)."""
    actions = (logits - np.log(-np.log(rng.random(logits.shape)))).argmax(-1)
    return actions, log_softmax(logits)[np.arange(len(actions)), actions]


def discrete_actions(
    kind: str, logits: np.ndarray, explore: bool, rng: np.random.Generator, sizes: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(actions, log-probabilities) of a discrete policy from its logits `[B, ...]`: sampled with `rng` when
    exploring, else the most probable ones.

    `kind` "categorical": `[B]` actions; "multi_categorical": `[B, K]` actions, factor k from its `sizes[k]`
    logits, log-probabilities summed over the factors; "bernoulli": `[B, K]` int8 bits with P(1) = sigmoid(logit),
    log-probabilities summed over the bits.
    """
    if kind == "categorical":
        if explore:
            return sample_categorical(logits, rng)
        actions = logits.argmax(-1)
        return actions, log_softmax(logits)[np.arange(len(actions)), actions]
    if kind == "multi_categorical":
        assert sizes is not None  # a factorised policy comes with its factors' sizes
        parts = [
            discrete_actions("categorical", part, explore, rng) for part in np.split(logits, np.cumsum(sizes)[:-1], -1)
        ]
        return np.stack([a for a, _ in parts], axis=-1), np.sum([lp for _, lp in parts], axis=0)
    if kind == "bernoulli":
        p_one = 1.0 / (1.0 + np.exp(-logits))
        bits = rng.random(logits.shape) < p_one if explore else logits > 0
        # log sigmoid(±l) = −log(1 + e^(∓l)), stable through logaddexp
        logp = -np.logaddexp(0.0, np.where(bits, -logits, logits)).sum(-1)
        return bits.astype(np.int8), logp.astype(np.float32)
    raise ValueError(f"unknown discrete policy kind {kind!r}")


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

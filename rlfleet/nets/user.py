"""Networks of your own: a torch module that maps observations to features, under rlfleet's heads.

A user network is named by an import path, `package.module:factory`, the factory called with the observation space
and keyword arguments (`net_kwargs`) and returning an `nn.Module`. The path, not the object, is what a run keeps: it
is saved in the algorithm's config, so every worker process and Ray actor, `--resume`, `eval` and `collect` build the
same network by importing it again. The module takes a batch of observations as tensors (float32 for float `Box`
spaces, the raw dtype otherwise: uint8 for images, which the module scales itself, int64 for `Discrete`; a dict of
them for a `Dict` space) and returns one feature vector per observation, `[batch, features]`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn


class NetError(ValueError):
    """A user network that cannot be imported, built or used: one line naming the path and the problem."""


def import_factory(path: str) -> Callable[..., Any]:
    """The callable that `path` ("package.module:factory", the factory possibly a dotted attribute) names; a
    `NetError` that says what is wrong with the path otherwise."""
    problem = factory_problem(path)
    if problem is not None:
        raise NetError(f"--net {path}: {problem}")
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for name in attr.split("."):
        obj = getattr(obj, name)
    factory: Callable[..., Any] = obj
    return factory


def factory_problem(path: str) -> str | None:
    """What is wrong with a user network's import path (None: it names a callable). The `checked` test of the
    algorithms' `net` field ("" for none is fine)."""
    if path == "":
        return None
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        return "is not package.module:factory (a module path, a colon, the factory's name in the module)"
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail in any way while it imports
        return f"does not import: module {module_name!r} raised {_one_line(exc)}"
    for name in attr.split("."):
        if not hasattr(obj, name):
            return f"does not import: module {module_name!r} has no {attr!r}"
        obj = getattr(obj, name)
    if not callable(obj):
        return f"names an object of type {type(obj).__name__}, not a callable that builds a torch module"
    return None


def net_path(net: Any) -> str:
    """The import path of a user network given as a path or as the factory itself (a class or a function defined at
    the top level of an importable module: the path is what runs keep and other processes import)."""
    if isinstance(net, str):
        return net
    module, name = getattr(net, "__module__", None), getattr(net, "__qualname__", None)
    if not callable(net) or not isinstance(module, str) or not isinstance(name, str):
        raise NetError(f"net={net!r}: give a factory (a class or function that builds a torch module) or its path")
    if "<" in name or module == "__main__":
        where = "a lambda or a local function" if "<" in name else "a class or function of the running script"
        raise NetError(
            f"net={module}.{name} is {where}, which other processes, --resume and eval cannot import: define it at "
            "the top level of a module on the Python path and pass it (or its path, package.module:factory)"
        )
    path = f"{module}:{name}"
    if import_factory(path) is not net:
        raise NetError(f"net={path} does not import back as the same object; pass its path instead")
    return path


class UserNet(nn.Module):
    """The module a user factory builds for an observation space, and its number of features (`out_dim`), found by
    passing two sample observations through it. rlfleet never re-initialises its parameters, and never acts
    through it in NumPy (the fast path is for the built-in MLPs)."""

    def __init__(self, obs_space: gym.Space[Any], path: str, kwargs: dict[str, Any] | None = None):
        super().__init__()
        factory = import_factory(path)
        try:
            module = factory(obs_space, **(kwargs or {}))
        except Exception as exc:  # the user's factory may raise anything
            raise NetError(f"--net {path}: the factory raised {_one_line(exc)}") from None
        if not isinstance(module, nn.Module):
            raise NetError(f"--net {path}: the factory returned a {type(module).__name__}, not a torch.nn.Module")
        self.path = path
        self.net = module
        self.out_dim = self._probe(obs_space)

    def _probe(self, obs_space: gym.Space[Any]) -> int:
        sample = sample_batch(obs_space, 2)
        try:
            with torch.no_grad():
                out = self.net(sample)
        except Exception as exc:  # the user's forward may raise anything
            raise NetError(
                f"--net {self.path}: its module failed on a batch of observations {_shapes(sample)} ({_one_line(exc)})"
            ) from None
        if isinstance(out, tuple):
            raise NetError(
                f"--net {self.path}: its module returned a tuple; a network here returns features only, "
                "[batch, features] (recurrence: --set lstm=N puts an LSTM core on top of it)"
            )
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2 or not out.is_floating_point():
            shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise NetError(
                f"--net {self.path}: its module maps observations {_shapes(sample)} to {shape}; the heads need "
                "floating-point features [batch, features], here [2, F]"
            )
        return int(out.shape[1])

    def forward(self, obs: Any) -> torch.Tensor:
        out: torch.Tensor = self.net(obs)
        return out


def sample_batch(space: gym.Space[Any], n: int) -> Any:
    """`n` observations of `space` as a network receives them: tensors, float64 made float32, a dict for a Dict."""
    if isinstance(space, gym.spaces.Dict):
        return {key: sample_batch(sub, n) for key, sub in space.spaces.items()}
    batch = torch.as_tensor(np.stack([np.asarray(space.sample()) for _ in range(n)]))
    return batch.float() if batch.dtype == torch.float64 else batch


def _shapes(batch: Any) -> str:
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{k}: {_shapes(v)}" for k, v in batch.items()) + "}"
    return f"{list(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"


def _one_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

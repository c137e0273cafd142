"""Networks of your own: a torch module that maps observations to features, under rlfleet's heads.

A user network is named by an import path, `package.module:factory`, the factory called with the observation space
and keyword arguments (`net_kwargs`) and returning an `nn.Module`. The path, not the object, is what a run keeps: it
is saved in the algorithm's config, so every worker process and Ray actor, `--resume`, `eval` and `collect` build the
same network by importing it again. The module takes a batch of observations as tensors (float32 for float `Box`
spaces, the raw dtype otherwise: uint8 for images, which the module scales itself, int64 for `Discrete`; a dict of
them for a `Dict` space) and returns one feature vector per observation, `[batch, features]`.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import pickle
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlfleet.data.batch import map_obs, stack_obs
from rlfleet.fields import error_line


class NetError(ValueError):
    """A user network that cannot be imported, built or used: one line naming the path and the problem."""


def import_factory(path: str, option: str = "--net") -> Callable[..., Any]:
    """The callable that `path` ("package.module:factory", the factory possibly a dotted attribute) names; a
    `NetError` that says what is wrong with the path (given as `option`) otherwise."""
    factory, problem = _resolve(path)
    if factory is None:
        raise NetError(f"{option} {path}: {problem}")
    return factory


def factory_problem(path: str) -> str | None:
    """What is wrong with a user network's import path (None: it names a callable). The `checked` test of the
    algorithms' `net` field ("" for none is fine)."""
    return None if path == "" else _resolve(path)[1]


def _resolve(path: str) -> tuple[Callable[..., Any] | None, str | None]:
    """(the callable `path` names, None), or (None, what is wrong with the path)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        return None, "is not package.module:factory (a module path, a colon, the factory's name in the module)"
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail in any way while it imports
        return None, f"does not import: module {module_name!r} raised {error_line(exc)}"
    for name in attr.split("."):
        if not hasattr(obj, name):
            return None, f"does not import: module {module_name!r} has no {attr!r}"
        obj = getattr(obj, name)
    if not callable(obj):
        return None, f"names an object of type {type(obj).__name__}, not a callable that builds a torch module"
    return obj, None


def net_path(net: Any, field: str = "net") -> str:
    """The import path of a user network given as a path or as the factory itself (a class or a function defined at
    the top level of an importable module: the path is what runs keep and other processes import)."""
    if isinstance(net, str):
        return net
    if isinstance(net, nn.Module):  # built already: each process and every resume must build its own
        cls = type(net)
        raise NetError(
            f"{field}= a {cls.__name__} object: give the factory that builds it (the class, {cls.__module__}."
            f"{cls.__qualname__}, or a function) or its path, package.module:factory"
        )
    module, name = getattr(net, "__module__", None), getattr(net, "__qualname__", None)
    if not callable(net) or not isinstance(module, str) or not isinstance(name, str):
        raise NetError(f"{field}={net!r}: give a factory (a class or function that builds a torch module) or its path")
    if "<" in name or module == "__main__":
        where = "a lambda or a local function" if "<" in name else "a class or function of the running script"
        raise NetError(
            f"{field}={module}.{name} is {where}, which other processes, --resume and eval cannot import: define it at "
            "the top level of a module on the Python path and pass it (or its path, package.module:factory)"
        )
    path = f"{module}:{name}"
    if import_factory(path) is not net:
        raise NetError(f"{field}={path} does not import back as the same object; pass its path instead")
    return path


PROBE_ROWS = (1, 2, 3)
"""The batch sizes a user module is tried on when it is built: one (a single env acts on a batch of one, which a
`squeeze()` turns into no batch) and two more, so that one that only works for a batch size it assumed fails here, in
one line, rather than in the run."""


class UserModule(nn.Module):
    """A module a user factory built (`net`: the module itself, `path`: its factory's import path). rlfleet never
    re-initialises its parameters, and never acts through it in NumPy (the fast path is for the built-in MLPs).

    Modes, as `train()`/`eval()` set them in PyTorch: the module acts in eval mode (rlfleet acts, evaluates and
    collects demonstrations under `torch.inference_mode()`), so Dropout is off and BatchNorm uses its running
    statistics without updating them; it learns in the mode it is in, training mode (targets computed in an update
    included)."""

    def __init__(self, path: str, kwargs: dict[str, Any] | None, args: tuple[Any, ...], option: str):
        super().__init__()
        factory = import_factory(path, option)
        try:
            module = factory(*args, **(kwargs or {}))
        except Exception as exc:  # the user's factory may raise anything
            raise NetError(f"{option} {path}: the factory raised {error_line(exc)}") from None
        if not isinstance(module, nn.Module):
            raise NetError(f"{option} {path}: the factory returned a {type(module).__name__}, not a torch.nn.Module")
        self.path, self.option, self.net = path, option, module

    def _call(self, *inputs: Any) -> torch.Tensor:
        """The module's output: in eval mode under inference mode (acting), else in its own mode (learning)."""
        if not torch.is_inference_mode_enabled():
            return cast(torch.Tensor, self.net(*inputs))
        with self._in_eval_mode():
            return cast(torch.Tensor, self.net(*inputs))

    @contextlib.contextmanager
    def _in_eval_mode(self) -> Iterator[None]:
        """The whole module in eval mode meanwhile, then each submodule back in the mode it was in: a part the user's
        factory put in eval mode (a pretrained backbone's BatchNorm, held fixed while the rest fine-tunes) stays so."""
        modes = [(m, m.training) for m in self.net.modules()]
        self.net.eval()
        try:
            yield
        finally:
            for m, training in modes:
                m.training = training

    def _probe(self, inputs: tuple[Any, ...], rows: int, shown: str) -> torch.Tensor:
        """The module's output for `rows` sample inputs (`shown` in messages), which must be one floating-point tensor
        with a row per sample. Taken in eval mode, as acting does: BatchNorm's statistics are not moved by it."""
        try:
            with torch.no_grad(), self._in_eval_mode():
                out = self.net(*inputs)
        except Exception as exc:  # the user's forward may raise anything
            raise NetError(f"{self.option} {self.path}: its module failed on {shown} ({error_line(exc)})") from None
        if isinstance(out, tuple):
            raise NetError(
                f"{self.option} {self.path}: its module returned a tuple; a network here returns one tensor "
                "(recurrence: --set lstm=N puts an LSTM core on top of a --net)"
            )
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or out.dim() == 0 or len(out) != rows:
            raise NetError(f"{self.option} {self.path}: its module maps {shown} to {_shown(out)}; {self.wanted}")
        return out

    wanted = ""
    """What the module must return, as its errors say."""


class UserNet(UserModule):
    """A user's network under the algorithm's heads (`--net`): the factory gets the observation space and the module
    maps a batch of observations to features; `out_dim`, their number, is found by passing two sample observations.
    As a whole actor (`--actor-net`, with `action_space` and `outputs`), the factory also gets the action space and the
    module must give `outputs` numbers per observation."""

    def __init__(
        self,
        obs_space: gym.Space[Any],
        path: str,
        kwargs: dict[str, Any] | None = None,
        action_space: gym.Space[Any] | None = None,
        outputs: int | None = None,
    ):
        option = "--net" if action_space is None else "--actor-net"
        args = (obs_space,) if action_space is None else (obs_space, action_space)
        super().__init__(path, kwargs, args, option)
        self.wanted = (
            "the heads need float32 features [batch, features], at least one feature, as many for every batch"
            if outputs is None
            else f"the actor must give [batch, {outputs}]"
        )
        widths = set()
        for rows in PROBE_ROWS:
            sample = sample_batch(obs_space, rows)
            shown = f"observations {_shapes(sample)}"
            out = self._probe((sample,), rows, shown)
            widths.add(out.shape[-1])
            if out.dim() != 2 or out.shape[1] < 1 or len(widths) > 1 or outputs not in (None, out.shape[1]):
                raise NetError(f"{option} {path}: its module maps {shown} to {_shown(out)}; {self.wanted}")
        self.out_dim = int(out.shape[1])

    def forward(self, obs: Any) -> torch.Tensor:
        return self._call(obs)


class UserCritic(UserModule):
    """A user's whole critic (`--critic-net`): the factory gets the observation and action spaces, and the module maps
    a batch of observations and one of actions (in [-1, 1], float32) to Q values, `[batch]` or `[batch, 1]`."""

    wanted = "a critic must give one value per pair, [batch] or [batch, 1]"

    def __init__(
        self, obs_space: gym.Space[Any], action_space: gym.Space[Any], path: str, kwargs: dict[str, Any] | None
    ):
        super().__init__(path, kwargs, (obs_space, action_space), "--critic-net")
        for rows in PROBE_ROWS:
            act = torch.as_tensor(np.stack([action_space.sample() for _ in range(rows)]), dtype=torch.float32)
            sample = sample_batch(obs_space, rows)
            shown = f"observations {_shapes(sample)} and actions {_shapes(act)}"
            out = self._probe((sample, act), rows, shown)
            if out.numel() != rows:
                raise NetError(f"--critic-net {path}: its module maps {shown} to {_shown(out)}; {self.wanted}")

    def forward(self, obs: Any, act: torch.Tensor) -> torch.Tensor:
        return self._call(obs, act).reshape(-1)


def sample_batch(space: gym.Space[Any], n: int) -> Any:
    """`n` observations of `space` as a network receives them: tensors, float64 made float32, a dict for a Dict."""

    def tensor(x: np.ndarray) -> torch.Tensor:
        t = torch.as_tensor(x)
        return t.float() if t.dtype == torch.float64 else t

    return map_obs(tensor, stack_obs([space.sample() for _ in range(n)]))


def _shown(out: Any) -> str:
    return _shapes(out) if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"


def _shapes(batch: Any) -> str:
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{k}: {_shapes(v)}" for k, v in batch.items()) + "}"
    return f"{list(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"


M = TypeVar("M", bound=nn.Module)


def target_copy(module: M) -> M:
    """A target network: a copy of `module` without gradients. A network of the user's in it that cannot be copied
    (it holds a lock, an open file) is one `NetError` naming it."""
    try:
        return copy.deepcopy(module).requires_grad_(False)
    except Exception as exc:  # what the user's module holds may refuse to be copied in any way
        user = next((m for m in module.modules() if isinstance(m, UserModule)), None)
        if user is None:
            raise
        raise NetError(f"{user.option} {user.path}: its module cannot be copied for a target network "
                       f"({error_line(exc)})") from None  # fmt: skip


def untravelled(module: nn.Module) -> str | None:
    """What keeps the user's networks in `module` from being sent to another process (pickled, as worker processes
    get them), in one line; None when nothing does."""
    for user in (m for m in module.modules() if isinstance(m, UserModule)):
        try:
            pickle.dump(user.net, _Discard(), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # a lambda, a lock, an open file: whatever pickle refuses
            return f"{user.option} {user.path}: its module cannot be sent to another process ({error_line(exc)})"
    return None


class _Discard:
    """A file that keeps nothing: what `untravelled` pickles into."""

    def write(self, data: bytes) -> int:
        return len(data)

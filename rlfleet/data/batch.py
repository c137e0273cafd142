"""Batch: a keyword container of equally long arrays or tensors, indexed and split along the first dim."""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Any, TypeVar, Union, overload

import numpy as np
import torch

Leaf = np.ndarray | torch.Tensor
Value = Union[Leaf, "Batch"]  # noqa: UP007 (forward reference)
LeafIn = TypeVar("LeafIn")
LeafOut = TypeVar("LeafOut")


def _as_value(value: Any) -> Value:
    """Turn a dict into a nested Batch; keep arrays, tensors and Batches; make anything else an array."""
    if isinstance(value, Batch | np.ndarray | torch.Tensor):
        return value
    if isinstance(value, Mapping):
        return Batch(value)
    return np.asarray(value)


def _to_tensor(leaf: Leaf, device: torch.device | str, float_dtype: torch.dtype | None) -> torch.Tensor:
    if isinstance(leaf, np.ndarray):
        if not leaf.flags.writeable or any(s < 0 for s in leaf.strides):
            leaf = np.array(leaf)  # torch cannot share read-only or negatively strided memory
        leaf = torch.from_numpy(leaf)
    if float_dtype is not None and leaf.is_floating_point():
        leaf = leaf.to(float_dtype)
    device = torch.device(device)
    if device.type == "cuda" and leaf.device.type == "cpu":  # staged through pinned memory, copied asynchronously
        return leaf.pin_memory().to(device, non_blocking=True)
    return leaf.to(device)


def _to_numpy(leaf: Leaf) -> np.ndarray:
    return leaf.detach().cpu().numpy() if isinstance(leaf, torch.Tensor) else leaf


class Batch:
    """Named arrays (NumPy or torch) sharing their first dimension; dict values become nested Batches.

    ``b.obs`` and ``b["obs"]`` read a value; ``b[idx]`` with an int, slice, int array or bool array
    indexes every leaf and returns a new Batch. Iterating a Batch yields its keys, like a dict.
    """

    _data: dict[str, Value]

    def __init__(self, data: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        object.__setattr__(self, "_data", {})
        for key, value in {**(data or {}), **kwargs}.items():
            self[key] = value

    # ---- dict-like access ---------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:  # Any, like `b["obs"]`: what a key holds is the caller's to know
        if name.startswith("__") or name == "_data":  # keeps copy/pickle from recursing
            raise AttributeError(name)
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(f"Batch has no key {name!r}; keys are {list(self._data)}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(type(self), name):
            raise ValueError(f"{name!r} is a Batch method; set it as a key instead: batch[{name!r}] = ...")
        self[name] = value

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str):
            return self._data[index]
        return self.apply(lambda leaf: leaf[_index_for(leaf, index)])

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"Batch keys must be strings, got {type(key).__name__}; index rows with b[idx]")
        self._data[key] = _as_value(value)

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def keys(self) -> KeysView[str]:
        return self._data.keys()

    def values(self) -> ValuesView[Value]:
        return self._data.values()

    def items(self) -> ItemsView[str, Value]:
        return self._data.items()

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict of the leaves (no copy)."""
        return {k: v.to_dict() if isinstance(v, Batch) else v for k, v in self._data.items()}

    # ---- length and shape ---------------------------------------------------------------------
    def _leaf_lengths(self, prefix: str = "") -> dict[str, int]:
        lengths: dict[str, int] = {}
        for key, value in self._data.items():
            if isinstance(value, Batch):
                lengths.update(value._leaf_lengths(f"{prefix}{key}."))
            elif value.ndim == 0:
                raise ValueError(f"Batch key {prefix}{key!r} is a scalar and has no length; give it a batch dim")
            else:
                lengths[prefix + key] = int(value.shape[0])
        return lengths

    def __len__(self) -> int:
        lengths = self._leaf_lengths()
        if len(set(lengths.values())) > 1:
            raise ValueError(f"Batch leaves disagree on their first dimension: {lengths}")
        return next(iter(lengths.values()), 0)

    def __repr__(self) -> str:
        lines = []
        for key, value in self._data.items():
            if isinstance(value, Batch):
                text = repr(value).replace("\n", "\n    ")
            else:
                dtype = str(value.dtype).removeprefix("torch.")
                kind = "tensor" if isinstance(value, torch.Tensor) else "array"
                text = f"{kind}({dtype}, shape={list(value.shape)})"
            lines.append(f"    {key}: {text},")
        return "Batch(\n" + "\n".join(lines) + "\n)" if lines else "Batch()"

    # ---- transforms ---------------------------------------------------------------------------
    def apply(self, fn: Callable[[Leaf], Any]) -> Batch:
        """New Batch with ``fn`` applied to every leaf (nesting kept)."""
        out = Batch()
        for key, value in self._data.items():
            out._data[key] = value.apply(fn) if isinstance(value, Batch) else _as_value(fn(value))
        return out

    def flatten_leading(self, n: int = 2) -> Batch:
        """Merge the first ``n`` dims of every leaf: ``[T, N, ...] -> [T * N, ...]``."""
        if n < 1:
            raise ValueError(f"flatten_leading needs n >= 1, got {n}")

        def flatten(leaf: Leaf) -> Leaf:
            if leaf.ndim < n:
                raise ValueError(f"cannot merge the first {n} dims of a leaf of shape {tuple(leaf.shape)}")
            return leaf.reshape(int(np.prod(leaf.shape[:n])), *leaf.shape[n:])

        return self.apply(flatten)

    def to_torch(self, device: torch.device | str = "cpu", float_dtype: torch.dtype | None = torch.float32) -> Batch:
        """Every leaf as a tensor on ``device``, sharing memory with NumPy leaves where possible.

        Floating leaves are cast to ``float_dtype`` (``None`` keeps them); integer and bool leaves keep
        their dtype.
        """
        return self.apply(lambda leaf: _to_tensor(leaf, device, float_dtype))

    def to_numpy(self) -> Batch:
        """Every leaf as a NumPy array (zero-copy for CPU tensors)."""
        return self.apply(_to_numpy)

    def split(self, size: int, shuffle: bool = True, rng: np.random.Generator | None = None) -> Iterator[Batch]:
        """Minibatches of at most ``size`` rows that together cover every row once."""
        if size < 1:
            raise ValueError(f"split size must be >= 1, got {size}")
        n = len(self)
        if not shuffle:
            for start in range(0, n, size):
                yield self[start : start + size]
            return
        order: np.ndarray | torch.Tensor = (rng if rng is not None else np.random.default_rng()).permutation(n)
        devices = {leaf.device if isinstance(leaf, torch.Tensor) else None for leaf in self._leaves()}
        if len(devices) == 1 and (device := devices.pop()) is not None and device.type != "cpu":
            order = torch.as_tensor(order, device=device)  # uploaded once: minibatches index with slices of it there
        for start in range(0, n, size):
            yield self[order[start : start + size]]

    def _leaves(self) -> Iterator[Leaf]:
        for value in self._data.values():
            if isinstance(value, Batch):
                yield from value._leaves()
            else:
                yield value

    # ---- combining ----------------------------------------------------------------------------
    @staticmethod
    def cat(batches: Sequence[Batch]) -> Batch:
        """Concatenate batches with the same keys along the first dimension."""
        return _combine(batches, np.concatenate, torch.cat, axis=0)

    @staticmethod
    def stack(batches: Sequence[Batch], axis: int = 0) -> Batch:
        """Stack batches with the same keys along a new dimension ``axis``."""
        return _combine(batches, np.stack, torch.stack, axis=axis)


def _index_for(leaf: Leaf, index: Any) -> Any:
    """Index a torch leaf with a NumPy index array by turning it into a tensor on the leaf's device, and a leaf with
    a tensor index on another device by bringing the index to it."""
    if isinstance(leaf, torch.Tensor) and isinstance(index, np.ndarray):
        return torch.as_tensor(index, device=leaf.device)
    if isinstance(index, torch.Tensor) and index.device != getattr(leaf, "device", torch.device("cpu")):
        return index.cpu().numpy() if isinstance(leaf, np.ndarray) else index.to(leaf.device)
    return index


def _combine(batches: Sequence[Batch], np_fn: Callable, torch_fn: Callable, axis: int) -> Batch:
    if len(batches) == 0:
        raise ValueError("need at least one Batch to combine")
    keys = list(batches[0].keys())
    for b in batches[1:]:
        if set(b.keys()) != set(keys):
            raise ValueError(f"cannot combine Batches with different keys: {keys} vs {list(b.keys())}")
    out = Batch()
    for key in keys:
        parts = [b[key] for b in batches]
        if isinstance(parts[0], Batch):
            out[key] = _combine(parts, np_fn, torch_fn, axis)
        elif isinstance(parts[0], torch.Tensor):
            out[key] = torch_fn([torch.as_tensor(p) for p in parts], dim=axis)
        else:
            out[key] = np_fn([_to_numpy(p) for p in parts], axis=axis)
    return out


# ---- observations: an array (tensor) per batch, or a dict (Batch) of them for Dict spaces ----------------------
@overload
def map_obs(fn: Callable[[Any], Any], obs: Batch) -> Batch: ...
@overload
def map_obs(fn: Callable[[LeafIn], LeafOut], obs: Mapping[str, LeafIn]) -> dict[str, LeafOut]: ...
@overload
def map_obs(fn: Callable[[LeafIn], LeafOut], obs: LeafIn) -> LeafOut: ...
def map_obs(fn: Callable[[Any], Any], obs: Any) -> Any:
    """`fn` applied to a batch of observations, or to each entry of a dict one (a Batch stays a Batch)."""
    if isinstance(obs, Batch):
        return obs.apply(fn)
    if isinstance(obs, Mapping):
        return {key: fn(value) for key, value in obs.items()}
    return fn(obs)


@overload
def obs_tensor(obs: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor: ...
@overload
def obs_tensor(obs: dict[str, np.ndarray], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]: ...
def obs_tensor(
    obs: np.ndarray | dict[str, np.ndarray], device: torch.device | str = "cpu"
) -> torch.Tensor | dict[str, torch.Tensor]:
    """A NumPy observation batch as a tensor on `device` (on the CPU a zero-copy view; floats as float32, images
    stay uint8); a dict of them for a dict one."""

    def tensor(x: np.ndarray) -> torch.Tensor:
        t = torch.as_tensor(x).to(device)
        return t.float() if t.dtype == torch.float64 else t

    return map_obs(tensor, obs)


def map_obs_pair(fn: Callable[[Any, Any], Any], first: Any, second: Any) -> Any:
    """`fn(first, second)` on two batches of observations, or entry by entry on dict ones (a dict comes back)."""
    if isinstance(first, Batch | Mapping):
        return {key: fn(first[key], second[key]) for key in first}
    return fn(first, second)


def stack_obs(observations: Sequence[Any]) -> Any:
    """Single observations (or other per-step values) as one batch: an array, or a dict of them entry by entry."""
    if isinstance(observations[0], Mapping):
        return {key: np.stack([np.asarray(o[key]) for o in observations]) for key in observations[0]}
    return np.stack([np.asarray(o) for o in observations])


def obs_len(obs: Any) -> int:
    """How many observations a batch of them holds (a dict one: the length of its entries)."""
    if isinstance(obs, Mapping):
        return len(next(iter(obs.values())))
    return len(obs)

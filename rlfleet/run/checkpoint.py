"""Checkpoints: state dicts written atomically with `torch.save`, read back with `weights_only=True`."""

from __future__ import annotations

import hashlib
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, or not an rlfleet checkpoint."""


REQUIRED = ("run_config", "algo_config", "algo")
"""Entries every checkpoint holds (state dicts and configs, each a dict)."""


def to_safe(obj: Any) -> Any:
    """Convert NumPy arrays/scalars (recursively) to tensors and plain numbers, which weights_only loading allows."""
    if isinstance(obj, np.ndarray) and obj.dtype.kind in "SU":  # text arrays (FrozenLake's map): raw bytes
        return {"__ndarray_bytes__": (obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes())}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj))}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: to_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_safe(v) for v in obj)
    return obj


def from_safe(obj: Any) -> Any:
    """Inverse of `to_safe`."""
    if isinstance(obj, dict):
        if set(obj) == {"__ndarray__"}:
            return obj["__ndarray__"].numpy()
        if set(obj) == {"__ndarray_bytes__"}:
            dtype, shape, data = obj["__ndarray_bytes__"]
            return np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        return {k: from_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(from_safe(v) for v in obj)
    return obj


def content_digest(obj: Any) -> str:
    """A digest of nested dicts, lists, tensors, arrays and plain values: equal for equal contents (dtypes and shapes
    included), whatever file or memory they came from. What a resumed run compares its inputs with (a dataset
    re-recorded to the same path, an expert that trained on)."""
    digest = hashlib.blake2b(digest_size=16)

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            digest.update(f"array {value.dtype.str} {value.shape}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, dict):
            digest.update(f"dict {len(value)}".encode())
            for key in sorted(value, key=str):
                digest.update(repr(key).encode())
                feed(value[key])
        elif isinstance(value, list | tuple):
            digest.update(f"seq {len(value)}".encode())
            for item in value:
                feed(item)
        else:
            digest.update(repr(value).encode())

    feed(obj)
    return digest.hexdigest()


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write `payload` to `path` atomically (temp file + rename), so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(to_safe({"format": "rlfleet-checkpoint-v1", **payload}), tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint`; clear `CheckpointError` for anything else. `mmap`: its tensors
    mapped rather than read (to look at its counters: a latest.pt may hold a replay of gigabytes)."""
    path = checkpoint_file(path)
    if not path.exists():
        best = path.with_name("best.pt")
        other = f" (the folder holds {best}: give that file)" if path.name == "latest.pt" and best.is_file() else ""
        raise CheckpointError(f"no checkpoint at {path}{other}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} is a folder, not a file (a run folder holds checkpoints/latest.pt)")
    try:
        with warnings.catch_warnings():  # foreign pickles make torch warn over several lines; we reject them anyway
            warnings.simplefilter("ignore")
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises several types for corrupt or foreign files
        # one line: torch's own messages run over many lines (and suggest weights_only=False, unsafe here)
        detail = "" if isinstance(exc, pickle.UnpicklingError) else (str(exc).strip().splitlines() or [""])[0]
        raise CheckpointError(
            f"cannot read checkpoint {path}: corrupt, or not written by rlfleet ({exc.__class__.__name__}"
            + (f": {detail})" if detail else ")")
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != "rlfleet-checkpoint-v1":
        raise CheckpointError(f"{path} is not an rlfleet checkpoint")
    missing = [key for key in REQUIRED if not isinstance(payload.get(key), dict)]
    if missing:
        raise CheckpointError(f"{path} is an incomplete rlfleet checkpoint (no {', '.join(missing)})")
    return from_safe(payload)


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint file `path` means: a run folder's `checkpoints/latest.pt`, the `latest.pt` of a run's
    `checkpoints/` folder, or `path` itself."""
    path = Path(path)
    if not path.is_dir():
        return path
    return path / "latest.pt" if _is_checkpoints_folder(path) else path / "checkpoints" / "latest.pt"


def _is_checkpoints_folder(path: Path) -> bool:
    return path.name == "checkpoints" and (path / "latest.pt").is_file()


def run_folder_of(path: str | Path) -> Path:
    """The run folder of a checkpoint: a folder itself (of its `checkpoints/` folder, the folder above), or `RUN`
    for a file `RUN/checkpoints/NAME.pt`.

    A checkpoint file anywhere else belongs to no run folder, and a resumed run must not write its files
    into whatever folder lies two levels above it."""
    path = Path(path)
    if path.is_dir():
        return path.parent if _is_checkpoints_folder(path) else path
    if path.parent.name != "checkpoints":
        raise CheckpointError(
            f"{path} lies outside a run folder: --resume takes a run folder or a checkpoint in its checkpoints/ "
            "(the resumed run writes into that run folder)"
        )
    return path.parent.parent


def load_algo_state(algo: Any, payload: dict[str, Any], checkpoint: str | Path, name: str) -> None:
    """`algo.load_state_dict(payload["algo"])`, a `CheckpointError` naming the checkpoint and the first problem when
    the saved state does not fit the algorithm (another version's networks or counters).

    The config decides the hyperparameters, the checkpoint the state: each optimizer keeps the hyperparameters of
    its parameter groups as the algorithm's config built them (`lr`, `betas`, ...; torch's `load_state_dict` would
    put the saved ones back), and takes its moments and step counts from the checkpoint. On a resume the two are
    the same; a run started from another run's checkpoint with another config (population-based training's
    exploit) trains with its own. A learning rate annealed over the run is set from the step count before each
    update either way."""
    optimizers = [v for v in vars(algo).values() if isinstance(v, torch.optim.Optimizer)]
    built = [[{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups] for opt in optimizers]
    try:
        algo.load_state_dict(payload["algo"])
    except MISFITS as exc:
        raise misfit(checkpoint, name, exc) from None
    for opt, groups in zip(optimizers, built, strict=True):
        for group, hyperparameters in zip(opt.param_groups, groups, strict=True):
            group.update(hyperparameters)


MISFITS = (TypeError, ValueError, KeyError, RuntimeError)
"""What building or loading an algorithm from another version's config or state raises."""


def misfit(checkpoint: str | Path, name: str, exc: Exception) -> CheckpointError:
    """The one line for a checkpoint whose config or state does not fit `name`: the exception's first line (for
    torch's "Error(s) in loading state_dict for ...", the first error under it: a missing key, or the first
    parameter whose shape differs)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()] or [""]
    detail = lines[1] if lines[0].startswith("Error(s) in loading state_dict") and len(lines) > 1 else lines[0]
    return CheckpointError(f"checkpoint {checkpoint} does not fit rlfleet's {name} ({type(exc).__name__}: {detail})")

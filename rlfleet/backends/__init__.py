"""Backends: where an architecture's roles and services run (`serial`: in the calling process; `local`: processes on
this machine; `ray`: Ray actors, on this machine or a cluster), behind the interface in `rlfleet.backends.base`.
Ray itself is imported only when a `ray` backend is made (it is an extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlfleet.backends.base import (
    Backend,
    Crash,
    Pending,
    RoleGroup,
    RunFailure,
    ServiceError,
    ServiceGroup,
    ServiceHandle,
    ServiceUnavailable,
    StoppedWhileStarting,
    WorkerFailure,
)
from rlfleet.backends.local import LocalBackend
from rlfleet.backends.ray_backend import RayBackend
from rlfleet.backends.serial import SerialBackend

BACKENDS: dict[str, type[Backend]] = {"serial": SerialBackend, "local": LocalBackend, "ray": RayBackend}


def make_backend(name: str, opts: Any = None, run_dir: Path | None = None) -> Backend:
    """The backend called `name` (see `BACKENDS`), made from the run's architecture options `opts`, for the run in
    `run_dir`."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name](opts, run_dir)


__all__ = [
    "BACKENDS",
    "Backend",
    "Crash",
    "Pending",
    "RoleGroup",
    "RunFailure",
    "ServiceError",
    "ServiceGroup",
    "ServiceHandle",
    "ServiceUnavailable",
    "StoppedWhileStarting",
    "WorkerFailure",
    "make_backend",
]

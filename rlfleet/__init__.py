"""rlfleet: deep reinforcement learning with clean algorithms and parallel actor-learner architectures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["train", "RunResult", "__version__"]

if TYPE_CHECKING:
    from rlfleet.run.train import RunResult, train


def __getattr__(name: str) -> Any:
    # lazy, so that importing a submodule (e.g. in env worker processes) doesn't pull in torch
    if name in ("train", "RunResult"):
        from rlfleet.run import train as train_module

        return getattr(train_module, name)
    raise AttributeError(f"module 'rlfleet' has no attribute {name!r}")

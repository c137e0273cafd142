"""rlfleet: deep reinforcement learning with clean algorithms and parallel actor-learner architectures."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["train", "tune", "RunResult", "__version__"]

if TYPE_CHECKING:
    from rlfleet.launch import train
    from rlfleet.run.runner import RunResult
    from rlfleet.tuning.sweep import tune


def __getattr__(name: str) -> Any:
    # lazy, so that importing a submodule (e.g. in env worker processes) doesn't pull in torch
    if name == "train":
        from rlfleet.launch import train

        return train
    if name == "tune":
        from rlfleet.tuning.sweep import tune

        return tune
    if name == "RunResult":
        from rlfleet.run.runner import RunResult

        return RunResult
    raise AttributeError(f"module 'rlfleet' has no attribute {name!r}")

"""On-policy rollout storage: preallocated `[T, N, ...]` arrays written in place, one row per vector-env step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.data.batch import Batch


class RolloutStorage:
    """Holds one segment of T steps from N envs.

    Fields are allocated on first write from the shapes and dtypes of the data, so the same storage
    serves vector observations, images and dict observations. `extras` are whatever the algorithm's
    `act` returned per step (log-probabilities, values, ...). `bootstrap[t, n]` is the value of the
    final observation when env n was truncated at step t (0 elsewhere); `last_obs` is the observation
    after the segment, from which the next segment starts.
    """

    def __init__(self, length: int, n_envs: int):
        if length < 1 or n_envs < 1:
            raise ValueError(f"rollout length and n_envs must be >= 1, got {length} and {n_envs}")
        self.length, self.n_envs = length, n_envs
        self._data: dict[str, np.ndarray | dict[str, np.ndarray]] = {}
        self.last_obs: np.ndarray | dict[str, np.ndarray] | None = None

    def _slot(self, key: str, value: np.ndarray) -> np.ndarray:
        arr = self._data.get(key)
        if arr is None:
            value = np.asarray(value)
            arr = np.zeros((self.length, *value.shape), dtype=value.dtype)
            self._data[key] = arr
        assert isinstance(arr, np.ndarray)  # a flat key's slot (dict observations are filled entry by entry)
        return arr

    def write(self, t: int, **fields: np.ndarray | dict[str, np.ndarray]) -> None:
        """Write step t of every named field (each with leading dim N); dict values are nested fields."""
        for key, value in fields.items():
            if isinstance(value, dict):
                nested = self._data.setdefault(key, {})
                for sub, v in value.items():
                    if sub not in nested:
                        v = np.asarray(v)
                        nested[sub] = np.zeros((self.length, *v.shape), dtype=v.dtype)
                    nested[sub][t] = v
            else:
                self._slot(key, value)[t] = value

    def batch(self) -> Batch:
        """The segment as a Batch of `[T, N, ...]` arrays (views, not copies)."""
        return Batch({k: (dict(v) if isinstance(v, dict) else v) for k, v in self._data.items()})


@dataclass
class Segment:
    """What an on-policy algorithm learns from: T steps of N envs and the value after the last step.

    `data` holds `[T, N]` arrays: obs, act, rew, terminated, truncated, bootstrap (value of the final
    observation where truncated), and the extras the algorithm's `act` returned. `last_value[n]` is the
    algorithm's bootstrap value of `last_obs[n]`; `initial_state` is a recurrent policy's state at t=0.
    """

    data: Batch
    last_obs: Any
    last_value: np.ndarray
    initial_state: Any = None

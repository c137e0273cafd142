"""Demonstrations: (observation, action) pairs of whole episodes, saved to and loaded from an `.npz` file.

The file holds plain arrays only (read with `allow_pickle=False`):

| key | shape | what |
|---|---|---|
| `obs` | `[N, *obs_shape]` | observations as the agent saw them (Dict observations: one `obs.KEY` per entry) |
| `act` | `[N]` int64 or `[N, A]` float32 | the actions taken, in the env's own space (Box actions within the bounds) |
| `rew` | `[N]` float32 | rewards received |
| `starts` | `[N]` bool | True where an observation begins an episode |
| `episode_returns` | `[E]` float64 | the return of every recorded episode (E = `starts.sum()`) |
| `env` | `[]` str | the env id the data was recorded on |
| `env_kwargs` | `[]` str | the env's keyword arguments (`--env-kwargs`) as JSON (older files: none) |
| `action_kind` | `[]` str | `discrete` or `box` |
| `action_n` / `action_low`, `action_high` | `[]` int / `[A]` float32 | the action space |
| `source` | `[]` str | what produced the data (a checkpoint path), may be empty |
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.data.batch import obs_len

FORMAT = "rlfleet-demos-v1"


class DatasetError(ValueError):
    """A demonstrations file is missing, unreadable, or does not fit the env it is used with."""


def action_space_kind(space: gym.Space) -> str:
    if isinstance(space, gym.spaces.Discrete):
        return "discrete"
    if isinstance(space, gym.spaces.Box):
        return "box"
    raise DatasetError(f"demonstrations need a Discrete or Box action space, got {space}")


@dataclass
class Demonstrations:
    """Whole episodes of (obs, act) pairs with their rewards, and the env and action space they come from."""

    obs: np.ndarray | dict[str, np.ndarray]
    act: np.ndarray
    rew: np.ndarray
    starts: np.ndarray
    env: str
    action_space: gym.spaces.Discrete | gym.spaces.Box
    source: str = ""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """The keyword arguments the env was built with (`--env-kwargs`): the variant of `env` recorded on."""

    def __post_init__(self) -> None:
        n = obs_len(self.obs)
        if not (len(self.act) == len(self.rew) == len(self.starts) == n):
            lengths = [n] + [len(x) for x in (self.act, self.rew, self.starts)]
            raise DatasetError(f"obs, act, rew and starts must be equally long, got {lengths}")
        if n and not self.starts[0]:
            raise DatasetError("the first observation of demonstrations must start an episode")
        action_space_kind(self.action_space)

    def __len__(self) -> int:
        return obs_len(self.obs)

    @property
    def action_kind(self) -> str:
        return action_space_kind(self.action_space)

    @property
    def episode_returns(self) -> np.ndarray:
        """The return of each episode (rewards summed between starts)."""
        episode = np.cumsum(self.starts) - 1
        return np.bincount(episode, weights=self.rew, minlength=int(self.starts.sum())).astype(np.float64)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        space = self.action_space
        meta: dict[str, np.ndarray] = {
            "format": np.array(FORMAT),
            "env": np.array(self.env),
            "env_kwargs": np.array(json.dumps(self.env_kwargs)),
            "action_kind": np.array(self.action_kind),
            "source": np.array(self.source),
        }
        if isinstance(space, gym.spaces.Discrete):
            meta["action_n"] = np.array(int(space.n))
        else:
            meta["action_low"] = np.asarray(space.low, dtype=np.float32)
            meta["action_high"] = np.asarray(space.high, dtype=np.float32)
        with open(path, "wb") as f:  # a file object: np.savez would append .npz to a name without it
            obs = {f"obs.{k}": v for k, v in self.obs.items()} if isinstance(self.obs, dict) else {"obs": self.obs}
            np.savez_compressed(
                f,
                **obs,
                act=self.act,
                rew=self.rew.astype(np.float32),
                starts=self.starts.astype(bool),
                episode_returns=self.episode_returns,
                **meta,
            )
        return path

    def check_fits(
        self, env: str, observation_space: gym.Space, action_space: gym.Space, env_kwargs: dict[str, Any] | None = None
    ) -> None:
        """A `DatasetError` naming the difference if these demonstrations were not recorded on `env` built with
        `env_kwargs`."""
        if self.env != env:
            raise DatasetError(f"dataset was recorded on {self.env!r}, not on {env!r}: train on --env {self.env}")
        env_kwargs = env_kwargs or {}
        if self.env_kwargs != env_kwargs:
            raise DatasetError(
                f"dataset was recorded on {env} with --env-kwargs {kwargs_items(self.env_kwargs)}, this run has "
                f"{kwargs_items(env_kwargs)}: give the same"
            )
        if not same_action_space(self.action_space, action_space):
            raise DatasetError(
                f"dataset actions are {self.action_space}, but {env} has {action_space}: record it again"
            )
        if observation_shapes(self.obs) != observation_shapes(observation_space):
            raise DatasetError(
                f"dataset observations have shape {observation_shapes(self.obs)}, but {env} has "
                f"{observation_shapes(observation_space)}: record it again"
            )


def observation_shapes(obs: np.ndarray | dict[str, np.ndarray] | gym.Space) -> tuple | dict[str, tuple]:
    """The shape of one observation of a batch of them or of a space (a dict of them for Dict observations)."""
    if isinstance(obs, gym.spaces.Dict):
        return {key: tuple(sub.shape or ()) for key, sub in obs.spaces.items()}
    if isinstance(obs, gym.Space):
        return tuple(obs.shape or ())
    if isinstance(obs, dict):
        return {key: tuple(value.shape[1:]) for key, value in obs.items()}
    return tuple(obs.shape[1:])


def same_action_space(a: gym.Space, b: gym.Space) -> bool:
    if isinstance(a, gym.spaces.Discrete) and isinstance(b, gym.spaces.Discrete):
        return int(a.n) == int(b.n) and int(a.start) == int(b.start)
    if isinstance(a, gym.spaces.Box) and isinstance(b, gym.spaces.Box):
        return a.shape == b.shape and np.allclose(a.low, b.low) and np.allclose(a.high, b.high)
    return False


def is_dataset_file(path: str | Path) -> bool:
    """Whether `path` is a file written by `Demonstrations.save` (reads only its format entry)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return isinstance(data, np.lib.npyio.NpzFile) and "format" in data.files and str(data["format"]) == FORMAT
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return False


def load_demonstrations(path: str | Path) -> Demonstrations:
    """Read a file written by `Demonstrations.save`; a one-line `DatasetError` for anything else."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"no dataset at {path}")
    if not path.is_file():
        raise DatasetError(f"dataset {path} is a folder, not a file (write one with rlfleet collect -o FILE)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetError(
            f"cannot read dataset {path}: not an .npz written by rlfleet collect ({exc.__class__.__name__})"
        ) from None
    required = {"format", "act", "rew", "starts", "env", "action_kind"}
    entries = {k.removeprefix("obs."): v for k, v in arrays.items() if k.startswith("obs.")}
    if str(arrays.get("format", "")) != FORMAT or required - set(arrays) or ("obs" not in arrays and not entries):
        raise DatasetError(f"{path} is not an rlfleet dataset (write one with rlfleet collect)")
    kind = str(arrays["action_kind"])
    try:
        if kind == "discrete":
            space: gym.Space = gym.spaces.Discrete(int(arrays["action_n"]))
        else:
            space = gym.spaces.Box(arrays["action_low"], arrays["action_high"], dtype=np.float32)
        return Demonstrations(
            obs=arrays.get("obs", entries),
            act=arrays["act"],
            rew=arrays["rew"],
            starts=arrays["starts"].astype(bool),
            env=str(arrays["env"]),
            action_space=space,
            source=str(arrays.get("source", "")),
            env_kwargs=_env_kwargs(arrays),
        )
    except (KeyError, ValueError) as exc:
        raise DatasetError(f"{path} is not a valid rlfleet dataset: {exc}") from None


def _env_kwargs(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The recorded env keyword arguments (none in files written before they were recorded)."""
    if "env_kwargs" not in arrays:
        return {}
    value = json.loads(str(arrays["env_kwargs"]))
    if not isinstance(value, dict):
        raise ValueError(f"env_kwargs is {value!r}, not a mapping")
    return value


def kwargs_items(env_kwargs: dict[str, Any]) -> str:
    """Keyword arguments as `--env-kwargs` items (`none` for none)."""
    return " ".join(f"{k}={v!r}" for k, v in env_kwargs.items()) or "none"

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
| `source` | `[]` str | what produced the data (`rlfleet collect`: the checkpoint file's absolute path), may be empty |
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.data.batch import obs_len
from rlfleet.fields import MAX_NESTING, nesting_depth
from rlfleet.nets.heads import ACTION_MASK, action_mask_of

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
        if isinstance(self.obs, dict) and len({len(v) for v in self.obs.values()}) > 1:
            entries = {key: len(value) for key, value in self.obs.items()}
            raise DatasetError(f"the entries of Dict observations must be equally long, got {entries}")
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
        obs = {f"obs.{k}": v for k, v in self.obs.items()} if isinstance(self.obs, dict) else {"obs": self.obs}
        arrays: dict[str, Any] = {  # one mapping: numpy's stubs read a `**` of arrays as maybe `allow_pickle`
            **obs,
            "act": self.act,
            "rew": self.rew.astype(np.float32),
            "starts": self.starts.astype(bool),
            "episode_returns": self.episode_returns,
            **meta,
        }
        # a temp file beside it, renamed over it once whole: a write cut short (Ctrl-C, a full disk, a kill) never
        # leaves half a file where an earlier dataset was (`rlfleet collect -o` over the last one)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a name without it
                np.savez_compressed(f, **arrays)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
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
        problem = observations_problem(self.obs, observation_space) or actions_problem(self.act, action_space)
        mask = self.obs.get(ACTION_MASK) if isinstance(self.obs, dict) else None
        if problem is None and mask is not None and isinstance(action_space, gym.spaces.Discrete):
            problem = illegal_actions_problem(self.act, mask, action_space)
        if problem is not None:
            raise DatasetError(f"dataset does not fit {env}: {problem}: record it again")


def observation_shapes(obs: np.ndarray | dict[str, np.ndarray] | gym.Space) -> tuple | dict[str, tuple]:
    """The shape of one observation of a batch of them or of a space (a dict of them for Dict observations)."""
    if isinstance(obs, gym.spaces.Dict):
        return {key: tuple(sub.shape or ()) for key, sub in obs.spaces.items()}
    if isinstance(obs, gym.Space):
        return tuple(obs.shape or ())
    if isinstance(obs, dict):
        return {key: tuple(value.shape[1:]) for key, value in obs.items()}
    return tuple(obs.shape[1:])


WHOLE_NUMBER_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
"""Spaces of whole numbers in a range: the networks one-hot them, so a value outside it fails inside an update."""


def actions_problem(act: np.ndarray, space: gym.Space) -> str | None:
    """What keeps a batch of actions (`[N, *space.shape]`) from being actions of `space`, or None: the dtype (whole
    numbers for Discrete, MultiDiscrete and MultiBinary, numbers for Box), the shape of each, and the range (a
    Discrete's start to start + n − 1, a MultiDiscrete's per entry, 0 or 1, a Box's finite bounds). Checked before
    training: an action the networks cannot take fails deep inside an update, after the run folder is written."""
    shape = tuple(space.shape or ())
    if act.ndim < 1 or act.shape[1:] != shape:
        return f"each action has shape {act.shape[1:]}, but {space} takes shape {shape}"
    if isinstance(space, gym.spaces.Box):
        if act.dtype.kind not in "iuf":
            return f"actions are {act.dtype}, but {space} takes numbers"
        low, high = np.broadcast_to(space.low, shape), np.broadcast_to(space.high, shape)
        return _first_outside(act, low, high, space)
    if not isinstance(space, WHOLE_NUMBER_SPACES):
        return f"{space} is not an action space of demonstrations"
    return _whole_numbers_problem(act, space, "action")


def illegal_actions_problem(act: np.ndarray, mask: np.ndarray, space: gym.spaces.Discrete) -> str | None:
    """The first action its observation's `action_mask` makes illegal, named (a row of zeros leaves every action
    legal, as the policies read it); None when there is none. The policies give an illegal action a logit of -1e8:
    bc trained on one with a loss of 1e8 that nothing moved, and said nothing."""
    index = act.astype(np.int64).reshape(-1) - int(space.start)
    legal = action_mask_of({ACTION_MASK: mask})  # the policies' own reading of a mask
    assert legal is not None  # given a mask
    bad = np.flatnonzero(~legal[np.arange(len(index)), index])
    if bad.size == 0:
        return None
    i = int(bad[0])
    return (
        f"action {i} is {int(act[i])}, illegal under its observation's {ACTION_MASK} ({int(bad.size)} of {len(act)} "
        "actions are)"
    )


def _whole_numbers_problem(values: np.ndarray, space: gym.Space, noun: str, where: str = "") -> str | None:
    """What keeps `values` (of the right shape) from being values of a `WHOLE_NUMBER_SPACES` space: their dtype, or
    the first outside its range; None if nothing does."""
    if values.dtype.kind not in "iub":
        return f"{noun}s{where} are {values.dtype}, but {space} takes whole numbers"
    shape = tuple(space.shape or ())
    if isinstance(space, gym.spaces.MultiBinary):
        return _first_outside(values, np.zeros(shape), np.ones(shape), space, noun, where)
    assert isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete)
    counts = space.n if isinstance(space, gym.spaces.Discrete) else space.nvec
    start = np.broadcast_to(np.asarray(space.start), shape)
    high = start + np.broadcast_to(np.asarray(counts), shape) - 1
    return _first_outside(values, start, high, space, noun, where)


def _rows(a: np.ndarray) -> np.ndarray:
    """`a` as one flat row per item, `[N, k]` (`[0, k]` for no items too, where `reshape(0, -1)` fails)."""
    return a.reshape(len(a), int(np.prod(a.shape[1:])))


def _first_outside(
    items: np.ndarray, low: np.ndarray, high: np.ndarray, space: gym.Space, noun: str = "action", where: str = ""
) -> str | None:
    """The first item (by index: an action, an observation) that is NaN or outside [low, high], named; None when
    there is none."""
    values = _rows(items.astype(np.float64))
    low, high = np.asarray(low, np.float64).reshape(-1), np.asarray(high, np.float64).reshape(-1)
    bad = np.isnan(values) | (values < low) | (values > high)
    rows = np.flatnonzero(bad.any(axis=1))
    if rows.size == 0:
        return None
    i = int(rows[0])
    return f"{noun} {i}{where} is {items[i].tolist()!r}, outside {space} ({int(rows.size)} of {len(items)} {noun}s are)"


def observations_problem(obs: np.ndarray | dict[str, np.ndarray], space: gym.Space | None = None) -> str | None:
    """What keeps dataset observations from being an agent's input, or None: every array holds numbers, and every
    float is finite (a NaN or inf in one minibatch makes every weight NaN, and the run would train on to the end
    with a model that acts at random); with the env's observation `space`, the values of a Discrete, MultiDiscrete or
    MultiBinary one (or Dict entry) are whole numbers within it (the networks one-hot them)."""
    arrays = obs.items() if isinstance(obs, dict) else [("", obs)]
    for key, value in arrays:
        where = f" (entry {key!r})" if key else ""
        if value.dtype.kind not in "biuf":
            return f"observations{where} are {value.dtype}, not numbers"
        subspace = space[key] if isinstance(space, gym.spaces.Dict) else space
        if isinstance(subspace, WHOLE_NUMBER_SPACES):
            problem = _whole_numbers_problem(value, subspace, "observation", where)
            if problem is not None:
                return problem
            continue
        if value.dtype.kind == "f":
            flat = _rows(value)
            rows = np.flatnonzero(~np.isfinite(flat).all(axis=1))
            if rows.size:
                i = int(rows[0])
                bad = flat[i][~np.isfinite(flat[i])][0]
                return (
                    f"observation {i}{where} holds {bad}, not a finite number ({int(rows.size)} of {len(value)} "
                    "observations do)"
                )
    return None


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
    if kind not in ("discrete", "box"):
        raise DatasetError(f"{path} is not a valid rlfleet dataset: action_kind is {kind!r}, not 'discrete' or 'box'")
    for name in ("act", "rew", "starts"):
        if np.ndim(arrays[name]) < 1 or (name != "act" and np.ndim(arrays[name]) != 1):
            shape = list(np.shape(arrays[name]))
            raise DatasetError(f"{path} is not a valid rlfleet dataset: {name} has shape {shape}, not one entry a step")
    try:
        if kind == "discrete":
            space: gym.spaces.Discrete | gym.spaces.Box = gym.spaces.Discrete(int(arrays["action_n"]))
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
    except (KeyError, ValueError, TypeError) as exc:  # TypeError: an entry of the wrong kind (a 0-d act)
        text = f"{exc.args[0]!r} is missing" if isinstance(exc, KeyError) else str(exc)  # a KeyError's text is the key
        raise DatasetError(f"{path} is not a valid rlfleet dataset: {text}") from None


def _env_kwargs(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The recorded env keyword arguments (none in files written before they were recorded)."""
    if "env_kwargs" not in arrays:
        return {}
    try:
        value = json.loads(str(arrays["env_kwargs"]))
    except RecursionError:  # the JSON nests deeper than Python's recursion limit
        raise ValueError(f"env_kwargs is nested more than {MAX_NESTING} deep") from None
    if nesting_depth(value) > MAX_NESTING:  # comparing or printing it would reach the recursion limit
        raise ValueError(f"env_kwargs is nested more than {MAX_NESTING} deep")
    if not isinstance(value, dict):
        raise ValueError(f"env_kwargs is {value!r}, not a mapping")
    return value


def kwargs_items(env_kwargs: dict[str, Any]) -> str:
    """Keyword arguments as `--env-kwargs` items (`none` for none)."""
    return " ".join(f"{k}={v!r}" for k, v in env_kwargs.items()) or "none"

"""Which spaces an algorithm takes (a clear error for the others), and Box actions: the policy's [-1, 1] space
rescaled to the env's bounds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from rlfleet.data.batch import Batch
from rlfleet.envs.wrappers import has_action_start
from rlfleet.nets.heads import ACTION_MASK, has_action_mask


class UnsupportedSpaceError(ValueError):
    """An algorithm was given an action or observation space it cannot handle."""


DISCRETE_ACTIONS = ("Discrete",)


BOX_ACTIONS = ("Box",)


POLICY_ACTIONS = ("Discrete", "MultiDiscrete", "MultiBinary", "Box")
"""The action spaces the policy-gradient family takes (pg, a2c, a3c, ppo): categorical, factorised categorical,
Bernoulli and Gaussian policies."""


OBSERVATION_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple")
"""The observation spaces every algorithm takes (`rlfleet.nets.encoders`)."""


_ACTION_WORDS: dict[tuple[str, ...], str] = {
    DISCRETE_ACTIONS: "discrete (Discrete)",
    BOX_ACTIONS: "continuous (1-D Box)",
}


def check_action_space(action_space: gym.Space[Any], algo: str, kinds: Sequence[str]) -> gym.Space[Any]:
    """The space itself if it is one of `kinds` (names of Gymnasium spaces; `MultiDiscrete`, `MultiBinary` and `Box`
    1-D, a `Box` of floats); otherwise an `UnsupportedSpaceError` naming the algorithm, the space and the
    algorithms that take it."""
    kind = type(action_space).__name__
    if kind not in kinds:
        words = _ACTION_WORDS.get(tuple(kinds), ", ".join(kinds[:-1]) + f" or 1-D {kinds[-1]}")
        takers = algorithms_taking(kind)
        hint = f"algorithms for {kind} actions: {', '.join(takers)}" if takers else "no algorithm takes it"
        raise UnsupportedSpaceError(
            f"algorithm {algo!r} takes {words} actions, but the env has {action_space}; {hint} (see `rlfleet spaces`)"
        )
    if kind != "Discrete" and len(action_space.shape or ()) != 1:
        raise UnsupportedSpaceError(f"algorithm {algo!r} takes 1-D {kind} actions, but the env has {action_space}")
    if kind == "Box" and not np.issubdtype(action_space.dtype, np.floating):
        raise UnsupportedSpaceError(f"algorithm {algo!r} needs float Box actions, got {action_space}")
    if has_action_start(action_space):
        raise UnsupportedSpaceError(
            f"algorithm {algo!r} takes actions that start at 0, but the env has {action_space}: wrap it in "
            "rlfleet.envs.wrappers.ZeroBasedActions (rlfleet's make_env does)"
        )
    return action_space


def check_action_mask(obs_space: gym.Space[Any], action_space: gym.Space[Any], algo: str) -> None:
    """Refuse observations that carry their legal actions (`has_action_mask`) where the algorithm would ignore
    them (actions other than `Discrete`: it would take illegal actions unawares) or misread them (a mask that is
    not one 0/1 entry per action; obs_norm leaves a mask as it is: `make_obs_stats`); an `UnsupportedSpaceError`
    naming the problem."""
    if not has_action_mask(obs_space):
        return
    mask = obs_space[ACTION_MASK]
    if not isinstance(action_space, gym.spaces.Discrete):
        raise UnsupportedSpaceError(
            f"algorithm {algo!r} would ignore the observations' {ACTION_MASK!r}: masks of legal actions are for "
            f"Discrete actions ({', '.join(algorithms_taking('Discrete'))}), but the env has {action_space}"
        )
    n = int(action_space.n)
    zero_one = isinstance(mask, gym.spaces.MultiBinary) or (
        isinstance(mask, gym.spaces.Box) and bool(np.all(mask.low >= 0) and np.all(mask.high <= 1))
    )
    if not zero_one or mask.shape != (n,):
        raise UnsupportedSpaceError(
            f"the observations' {ACTION_MASK!r} must be a Box of 0/1 or a MultiBinary of shape ({n},), one entry "
            f"per action of {action_space} (1: legal), got {mask}"
        )


def algorithms_taking(kind: str) -> list[str]:
    """The registered algorithms whose `action_spaces` hold the space named `kind`."""
    from rlfleet.algos import REGISTRY, resolve

    return [name for name in sorted(REGISTRY) if kind in resolve(name)[0].action_spaces]


class ActionBounds:
    """Maps a Gaussian policy's actions to a Box env's actions: [-1, 1] ↦ [low, high], then clip.

    The policy learns in a normalised space: its mean starts near 0 (the middle of the bounds) and σ is
    in units of half the range, whatever the env's scale. Sampled actions are left unclipped for the
    log-probability (algorithms store them as the `raw_act` extra); only the env sees
    `clip(offset + scale · raw, low, high)`. A dimension with an infinite bound is not rescaled (scale 1,
    offset 0) and is clipped only on its finite side.
    """

    def __init__(self, space: gym.spaces.Box):
        low = np.asarray(space.low, dtype=np.float64)
        high = np.asarray(space.high, dtype=np.float64)
        finite = np.isfinite(low) & np.isfinite(high)
        self.low, self.high = low.astype(np.float32), high.astype(np.float32)
        low, high = np.where(finite, low, -1.0), np.where(finite, high, 1.0)
        self.scale: npt.NDArray[np.float32] = ((high - low) / 2).astype(np.float32)
        self.offset: npt.NDArray[np.float32] = ((high + low) / 2).astype(np.float32)

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        actions: np.ndarray = np.clip(raw * self.scale + self.offset, self.low, self.high).astype(np.float32)
        return actions

    def normalize(self, actions: npt.NDArray[np.floating[Any]]) -> np.ndarray:
        """The inverse map, env actions ↦ the policy's space (a replay buffer holds what the env was given)."""
        return ((actions - self.offset) / self.scale).astype(np.float32)


def action_bounds(action_space: gym.Space[Any]) -> ActionBounds | None:
    """An `ActionBounds` for a Box action space, None for a discrete one."""
    return ActionBounds(action_space) if isinstance(action_space, gym.spaces.Box) else None


def to_env_actions(actions: np.ndarray, extras: dict[str, np.ndarray], bounds: ActionBounds | None) -> np.ndarray:
    """The actions to step the env with; for a Box space the policy's own actions go into `extras["raw_act"]`."""
    if bounds is None:
        return actions
    extras["raw_act"] = actions
    return bounds(actions)


def policy_actions(data: Batch) -> np.ndarray:
    """The actions a rollout's policy took, in the policy's space (`raw_act` for Box, else `act`)."""
    actions: np.ndarray = data.raw_act if "raw_act" in data else data.act
    return actions

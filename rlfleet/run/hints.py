"""What a finished run tells its user beyond its numbers: the hint of a continuous-control run whose best
evaluation never beat the policy that does nothing (its agent may not be exploring)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.algos.noise import EXPLORATION_OPTIONS
from rlfleet.data.batch import obs_len
from rlfleet.run.config import EVAL_MAX_STEPS
from rlfleet.run.evaluate import evaluate


class DoNothing:
    """The policy that does nothing: always the middle of a Box action space (0 where the bounds are symmetric;
    0 clipped to the bounds where a side is infinite)."""

    def __init__(self, space: gym.spaces.Box):
        low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        finite = np.isfinite(low) & np.isfinite(high)
        middle = np.where(finite, (np.where(finite, low, 0.0) + np.where(finite, high, 0.0)) / 2, np.clip(0, low, high))
        self.action = middle.astype(space.dtype)

    def act(self, obs: Any, state: Any = None, explore: bool = False) -> tuple[np.ndarray, dict[str, Any], Any]:
        return np.broadcast_to(self.action, (obs_len(obs), *self.action.shape)).copy(), {}, state


def exploration_hint(
    algo: str,
    best_return: float,
    action_space: gym.Space,
    make_envs: Callable[[], Any],
    n_episodes: int,
    seed: int,
    algo_cfg: Any = None,
    max_steps: int = EVAL_MAX_STEPS,
) -> str | None:
    """One line for a run of a continuous-control algorithm whose best evaluation never beat doing nothing
    (`DoNothing`, evaluated on envs from `make_envs` as the run's evaluations are), naming the exploration
    options; None when it did, or when the algorithm or the action space has no such options. `algo_cfg` (the
    run's config) tells whether the option was already on; `max_steps` bounds its episodes as the run's are."""
    if algo not in EXPLORATION_OPTIONS or not isinstance(action_space, gym.spaces.Box):
        return None
    envs = make_envs()
    try:
        baseline = float(evaluate(DoNothing(action_space), envs, n_episodes, seed, max_steps=max_steps).returns.mean())
    finally:
        envs.close()
    if best_return > baseline:
        return None
    option, more = EXPLORATION_OPTIONS[algo]
    already_on = getattr(algo_cfg, "sde", False) or getattr(algo_cfg, "action_noise", None) == "ou"
    if already_on:
        advice = f"even with {option.split()[-1]}: try {more}, a longer run or a per-env preset (rlfleet list)"
    elif algo == "sac" and bool(getattr(algo_cfg, "actor_net", None)):  # sde: rlfleet's own actor only
        advice = (
            "try a larger target entropy (--set target_entropy_scale=...), a longer run or a per-env preset "
            "(rlfleet list); sde, SAC's state-dependent noise, needs rlfleet's own actor, not --actor-net"
        )
    else:
        advice = (
            f"try {option} (correlated or state-dependent exploration noise: action_noise=ou for ddpg/td3, "
            "sde=true for sac/ppo/a2c) or a per-env preset (rlfleet list)"
        )
    return (
        f"hint: the best evaluation ({best_return:.2f}) never beat a policy that does nothing ({baseline:.2f}): "
        f"the agent may not be exploring; {advice}; see docs/continuous_control.md"
    )

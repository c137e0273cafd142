"""MinAtar (Young & Tian 2019): five Atari-like games on a 10×10 grid, pixel tasks that learn in minutes on a CPU.

The `minatar` package (the `minatar` extra) registers its Gymnasium ids (`MinAtar/Breakout-v1`, `-v0` with all
six actions, and Asterix, Freeway, Seaquest, SpaceInvaders) only when `minatar.gym.register_envs()` is called;
`resolve_env_spec` calls `register` here for any `MinAtar/...` id, so `--env MinAtar/Breakout-v1` works as is.

What an agent sees: the game's boolean `10×10×C` grid (one channel per kind of object: paddle, ball, trail and
bricks in Breakout) turned channels-first, `uint8` 0/1 of shape `(C, 10, 10)`, so replay stores one byte per
cell and the image encoders take it (the `minatar` encoder: the paper's one 16×3×3 convolution and 128 units).
No frame stack: the games draw a trail where motion matters. The package's defaults stay: sticky actions with
probability 0.1 and difficulty ramping (`--env-kwargs sticky_action_prob=0 difficulty_ramping=false` change
them). MinAtar sets no episode limit, and in Breakout a good agent can play for ever, so a MinAtar env ends
(truncates) an episode after `DEFAULT_MAX_EPISODE_STEPS` steps unless `max_episode_steps` says otherwise.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from rlfleet.fields import MissingExtraError

MINATAR_PREFIX = "MinAtar/"
MINATAR_INSTALL_HINT = 'pip install "rlfleet[minatar]"'
DEFAULT_MAX_EPISODE_STEPS = 10_000
"""Steps after which a MinAtar episode is truncated when no `max_episode_steps` is given (the games have none)."""


def is_minatar_id(env_id: str) -> bool:
    return env_id.startswith(MINATAR_PREFIX)


def is_minatar_spec(spec: EnvSpec) -> bool:
    entry_point = spec.entry_point
    return isinstance(entry_point, str) and entry_point.startswith("minatar")


def register(env_id: str) -> None:
    """Register MinAtar's ids with Gymnasium (once); a `MissingExtraError` with the install line without the
    package."""
    if env_id in gym.registry:
        return
    try:
        import minatar.gym
    except ImportError:
        raise MissingExtraError(
            f"{env_id!r} is a MinAtar env and needs minatar, which is not installed: {MINATAR_INSTALL_HINT}"
        ) from None
    if f"{MINATAR_PREFIX}Breakout-v1" not in gym.registry:
        minatar.gym.register_envs()


class ChannelsFirstGrid(gym.ObservationWrapper):
    """A boolean `H×W×C` grid as a `uint8` 0/1 image `(C, H, W)`, the layout the CNN encoders take."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
            raise ValueError(f"ChannelsFirstGrid expects an H×W×C Box observation, got {space}")
        height, width, channels = space.shape
        self.observation_space = gym.spaces.Box(0, 1, (channels, height, width), np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(observation, dtype=np.uint8).transpose(2, 0, 1))


class FreshStickyAction(gym.Wrapper):
    """Each episode starts with no action to repeat, as a new game does: the package's `reset` keeps the game's
    `last_action`, which its sticky actions may repeat on the first step, so the same seed gave another episode
    after an episode that ended on another action (an evaluation depended on how the one before it ended)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.unwrapped.game.last_action = 0  # type: ignore[attr-defined]
        return self.env.reset(**kwargs)


def make(spec: EnvSpec, render_mode: str | None, env_kwargs: dict[str, Any]) -> gym.Env:
    """The MinAtar env of `spec` with the package's options from `env_kwargs`, channels first, and an episode limit
    (`max_episode_steps`, default `DEFAULT_MAX_EPISODE_STEPS`)."""
    kwargs = dict(env_kwargs)
    kwargs.setdefault("max_episode_steps", spec.max_episode_steps or DEFAULT_MAX_EPISODE_STEPS)
    return ChannelsFirstGrid(FreshStickyAction(gym.make(spec.id, render_mode=render_mode, **kwargs)))

"""Small Gymnasium wrappers used by rlfleet's env construction: POMDP CartPole, life-loss terminals, seeding.

Also holds :class:`EnvPoolVectorEnv`, the adapter that makes an EnvPool batch look like a Gymnasium
``SAME_STEP`` vector env (see :mod:`rlfleet.envs.make` for the contract it follows).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import batch_space

__all__ = [
    "EnvPoolVectorEnv",
    "FlatDictObservation",
    "LiftEpisodeStatistics",
    "SeedOnFirstReset",
    "TerminalOnLifeLoss",
    "VelocityMaskedObservation",
    "ZeroBasedActions",
    "make_cartpole_no_velocity",
    "sign_reward",
]

# CartPole's state is (x, x_dot, theta, theta_dot); the POMDP keeps only the positions.
CARTPOLE_POSITION_INDICES: tuple[int, ...] = (0, 2)


def sign_reward(reward: SupportsFloat) -> float:
    """Clip a reward to its sign, -1, 0 or +1 (the DQN Atari convention); used with ``TransformReward``."""
    return float(np.sign(float(reward)))


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """The leaves of a (nested) Dict / Tuple space, or of an observation of one, keyed by their path: Tuple entries
    by position ("0", "1", ...), nested ones joined with "." ("arm.0")."""
    if isinstance(node, gym.spaces.Dict | gym.spaces.Tuple):
        node = node.spaces
    items: Iterable[tuple[Any, Any]]
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, tuple):
        items = ((str(i), sub) for i, sub in enumerate(node))
    else:
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, sub in items:
        out.update(_flatten(sub, f"{prefix}.{key}" if prefix else str(key)))
    return out


def needs_flat_dict(space: gym.Space) -> bool:
    """A Tuple observation space, or a Dict one with a Dict or Tuple inside."""
    if isinstance(space, gym.spaces.Tuple):
        return True
    return isinstance(space, gym.spaces.Dict) and any(
        isinstance(sub, gym.spaces.Dict | gym.spaces.Tuple) for sub in space.spaces.values()
    )


class FlatDictObservation(gym.ObservationWrapper):
    """Tuple and nested Dict observations as one flat Dict: what the replay buffers, rollout storage and encoders
    hold, one array per entry. Tuple entries are keyed by position ("0", "1", ...), nested entries by their path
    joined with "." (Dict(arm=Tuple(Box, Discrete)) becomes Dict("arm.0": Box, "arm.1": Discrete)); the entries
    themselves are unchanged. Blackjack-v1's Tuple(Discrete(32), Discrete(11), Discrete(2)) becomes
    Dict("0": Discrete(32), "1": Discrete(11), "2": Discrete(2))."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = gym.spaces.Dict(_flatten(env.observation_space))

    def observation(self, observation: Any) -> dict[str, Any]:
        return _flatten(observation)


IMAGE_CHANNELS = (1, 3, 4)
"""The channel counts of a channels-last image: grey, RGB, RGBA."""


def is_channels_last_image(space: gym.Space) -> bool:
    """A uint8 `(H, W, C)` image with C grey, RGB or RGBA channels and H, W larger than that: the layout of
    Gymnasium's pixel envs (CarRacing, the ALE's raw frames, pixel-observation wrappers). The CNN encoders take
    images channels first (`(C, H, W)`: the Atari and MinAtar pipelines' stacks), and would read H as the channels."""
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.uint8
        and len(space.shape) == 3
        and space.shape[2] in IMAGE_CHANNELS
        and min(space.shape[:2]) > max(IMAGE_CHANNELS)
    )


def has_channels_last_image(space: gym.Space) -> bool:
    """A channels-last image (`is_channels_last_image`), or a `Dict` with one as an entry."""
    if isinstance(space, gym.spaces.Dict):
        return any(is_channels_last_image(sub) for sub in space.spaces.values())
    return is_channels_last_image(space)


def channels_first_space(space: gym.Space) -> gym.Space:
    """`space` with its channels-last images (`is_channels_last_image`: itself, or a `Dict`'s entries) as `(C, H, W)`;
    any other space as it is."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({key: channels_first_space(sub) for key, sub in space.spaces.items()})
    if not is_channels_last_image(space):
        return space
    assert isinstance(space, gym.spaces.Box)
    return gym.spaces.Box(space.low.transpose(2, 0, 1), space.high.transpose(2, 0, 1), dtype=np.uint8)


def channels_first_observation(space: gym.Space, observation: Any) -> Any:
    """An observation of `space` as one of `channels_first_space(space)`: each `(H, W, C)` frame a contiguous
    `(C, H, W)` array."""
    if isinstance(space, gym.spaces.Dict) and isinstance(observation, dict):
        return {key: channels_first_observation(space[key], value) for key, value in observation.items()}
    if not is_channels_last_image(space):
        return observation
    return np.ascontiguousarray(np.asarray(observation).transpose(2, 0, 1))


class ChannelsFirstImages(gym.ObservationWrapper):
    """Channels-last uint8 images (`is_channels_last_image`; a `Dict`'s entries too) as `(C, H, W)`, the layout the
    CNN encoders take: a CarRacing frame `(96, 96, 3)` reaches the agent as `(3, 96, 96)`, and the replay, datasets
    and the networks hold it so. Rendering is the env's own, unchanged."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = channels_first_space(env.observation_space)

    def observation(self, observation: Any) -> Any:
        return channels_first_observation(self.env.observation_space, observation)


def has_action_start(space: gym.Space) -> bool:
    """A `Discrete` or `MultiDiscrete` action space whose values start anywhere but 0."""
    return isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete) and bool(np.any(space.start != 0))


class ZeroBasedActions(gym.ActionWrapper):
    """`Discrete(n, start)` and `MultiDiscrete(nvec, start)` actions as the agent's 0-based choices: the agent sees
    `Discrete(n)` (`MultiDiscrete(nvec)`) and picks k, the env gets start + k. A categorical head's outputs are the
    choices 0..n−1, so every algorithm, buffer and dataset keeps 0-based actions."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.action_space
        assert isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete)  # `has_action_start` spaces only
        self.start = space.start
        if isinstance(space, gym.spaces.Discrete):
            self.action_space = gym.spaces.Discrete(int(space.n))
        else:
            self.action_space = gym.spaces.MultiDiscrete(space.nvec, dtype=space.dtype)

    def action(self, action: Any) -> Any:
        return self.start + np.asarray(action, dtype=self.start.dtype)


class VelocityMaskedObservation(gym.ObservationWrapper):
    """Drop CartPole's two velocity entries, leaving ``(x, theta)``: a partially observable CartPole.

    The observation space shrinks from ``Box(4,)`` to ``Box(2,)`` with the matching bounds, so an agent
    has to infer velocities from its history (recurrent policies, frame stacking).
    """

    def __init__(self, env: gym.Env, keep_indices: tuple[int, ...] = CARTPOLE_POSITION_INDICES) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or space.shape != (4,):
            raise ValueError(f"VelocityMaskedObservation expects CartPole's Box(4,) observation space, got {space}")
        if not keep_indices or any(not 0 <= i < 4 for i in keep_indices):
            raise ValueError(f"keep_indices must be a non-empty tuple of indices in 0..3, got {keep_indices}")
        self.keep_indices = np.asarray(keep_indices, dtype=np.intp)
        self.observation_space = gym.spaces.Box(
            low=space.low[self.keep_indices],
            high=space.high[self.keep_indices],
            dtype=space.dtype,
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """Return only the kept (position) entries of the full CartPole state."""
        return np.asarray(observation, dtype=self.observation_space.dtype)[self.keep_indices]


def make_cartpole_no_velocity(render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Entry point of the registered id ``rlfleet/CartPoleNoVel-v1``: CartPole without velocities."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return VelocityMaskedObservation(CartPoleEnv(render_mode=render_mode, **kwargs))


class TerminalOnLifeLoss(gym.Wrapper):
    """End the *learning* episode when an Atari life is lost, but keep playing the same game.

    This is the DQN (Mnih et al., 2015) convention: ``step`` returns ``terminated=True`` on a life loss so
    the agent does not bootstrap through it, and the next ``reset()`` does not restart the game; it hands
    back the observation at the life loss and play continues. Only a real game over (or truncation, or a
    reset with an explicit ``seed``/``options``) resets the emulator.

    Gymnasium's ``AtariPreprocessing(terminal_on_life_loss=True)`` instead restarts the whole game on every
    life loss, so the agent never sees later lives; that is why rlfleet uses this wrapper.

    Place it *outside* ``RecordEpisodeStatistics`` so the recorded episode is the whole game.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if not hasattr(env.unwrapped, "ale"):
            raise ValueError(f"TerminalOnLifeLoss needs an ALE (Atari) env, got {env.unwrapped!r}")
        self._lives = 0
        self._continue_game = False
        self._obs_at_life_loss: Any = None
        self._info_at_life_loss: dict[str, Any] = {}

    def _ale_lives(self) -> int:
        return int(self.env.unwrapped.ale.lives())  # type: ignore[attr-defined]  # an ale_py env (untyped)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the game; report ``terminated=True`` on a life loss that is not a game over."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self._ale_lives()
        life_lost = 0 < lives < self._lives
        self._lives = lives
        self._continue_game = life_lost and not (terminated or truncated)
        if self._continue_game:
            terminated = True
            self._obs_at_life_loss = obs
            self._info_at_life_loss = {key: value for key, value in info.items() if key != "episode"}
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Continue the game after a life loss; otherwise really reset the emulator."""
        if self._continue_game and seed is None and options is None:
            self._continue_game = False
            return self._obs_at_life_loss, dict(self._info_at_life_loss)
        obs, info = self.env.reset(seed=seed, options=options)
        self._lives = self._ale_lives()
        self._continue_game = False
        return obs, info


class StickyActions(gym.Wrapper):
    """Sticky actions (Machado et al. 2018) at every emulator frame: with probability `p` a frame repeats the action
    the frame before took, else it takes the one given (NOOP before the first). The ALE's own do the same, but keep
    the action they repeat where the emulator's saved state (`cloneState`) does not: a restored env repeated NOOP at
    its first sticky frame, and its game went another way. Here it is plain data with its own RNG (seeded by the
    env's seed), which a snapshot records (`rlfleet.envs.snapshot`). Under `AtariPreprocessing`, which steps the
    env once per frame."""

    def __init__(self, env: gym.Env, p: float):
        super().__init__(env)
        self.p = float(p)
        self.last_action = 0
        self.rng = np.random.default_rng()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.last_action = 0  # the ALE's reset: NOOP
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.rng.random() >= self.p:
            self.last_action = int(action)
        return self.env.step(self.last_action)


class SeedOnFirstReset(gym.Wrapper):
    """Seed the env's first ``reset()`` (when called without a seed) and its action/observation spaces.

    Lets ``make_env(..., seed=s)`` hand out an env that is reproducible even when the caller never passes
    a seed to ``reset``; later resets continue the env's own random stream. An explicit ``reset(seed=...)``
    always wins.
    """

    def __init__(self, env: gym.Env, seed: int) -> None:
        super().__init__(env)
        if not isinstance(seed, int | np.integer):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self._pending_seed: int | None = int(seed)
        self.action_space.seed(int(seed))
        self.observation_space.seed(int(seed))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset, using the construction seed if this is the first reset and no seed was given."""
        if seed is None:
            seed = self._pending_seed
        self._pending_seed = None
        return self.env.reset(seed=seed, options=options)


def _lift_episode_info(info: dict[str, Any]) -> dict[str, Any]:
    """Copy ``info["final_info"]["episode"]`` (SAME_STEP layout) to ``info["episode"]`` if not present."""
    final_info = info.get("final_info")
    if "episode" in info or not isinstance(final_info, dict) or "episode" not in final_info:
        return info
    info["episode"] = final_info["episode"]
    info["_episode"] = final_info["_episode"]
    return info


class ForwardingVectorWrapper(VectorWrapper):
    """A vector wrapper that forwards attributes it does not have (``envs``, ``call``, ``get_attr``, ...)
    to the wrapped vector env; private names are not forwarded."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(self.env, name)


class LiftEpisodeStatistics(ForwardingVectorWrapper):
    """Expose finished-episode statistics at ``info["episode"]`` in a SAME_STEP vector env.

    With ``AutoresetMode.SAME_STEP`` Gymnasium puts the info of the step that ended an episode under
    ``info["final_info"]`` (the top level holds the *reset* info), so ``RecordEpisodeStatistics`` inside a
    sub-env shows up as ``info["final_info"]["episode"]``. This wrapper also places it at
    ``info["episode"]`` / ``info["_episode"]`` (dict of ``"r"``, ``"l"``, ``"t"`` arrays and a bool mask of
    the envs that finished), leaving ``final_info`` untouched.
    """

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step all sub-envs and lift episode statistics out of ``final_info``."""
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        return obs, rewards, terminations, truncations, _lift_episode_info(info)


class EnvPoolVectorEnv(VectorEnv):
    """Present an EnvPool batch with the same contract as rlfleet's Gymnasium vector envs.

    EnvPool auto-resets on the *next* step; this adapter resets finished sub-envs in the same ``step`` so
    that ``obs`` holds the reset observation and ``info["final_obs"]`` (mask ``info["_final_obs"]``) the
    true last observation. Finished episodes' raw (unclipped) return, length and wall time appear at
    ``info["episode"]`` (mask ``info["_episode"]``) and at ``info["final_info"]["episode"]``, like the
    Gymnasium path. Sub-env ``i`` is seeded with ``seed + i``; EnvPool fixes seeds at construction, so a
    ``reset(seed=...)`` rebuilds the pool.

    For Atari, build the pool without EnvPool's own ``episodic_life``/``reward_clip`` and let this adapter
    do both (``terminal_on_life_loss``/``clip_rewards``), so episode statistics stay the real game score
    and a life loss continues the game instead of restarting it.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        make_pool: Callable[[list[int] | None], Any],
        num_envs: int,
        *,
        seed: int | None = None,
        clip_rewards: bool = False,
        terminal_on_life_loss: bool = False,
        env_id: str | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self._make_pool = make_pool
        self.num_envs = num_envs
        self._clip_rewards = clip_rewards
        self._terminal_on_life_loss = terminal_on_life_loss
        self._pool = make_pool(self._seeds_for(seed))
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        if seed is not None:
            self.action_space.seed(seed)
            self.single_action_space.seed(seed)
        self.render_mode = None
        self.spec = gym.spec(env_id) if env_id is not None and env_id in gym.registry else None
        self._all_ids = np.arange(num_envs, dtype=np.int32)
        self._episode_returns = np.zeros(num_envs, dtype=np.float64)
        self._episode_lengths = np.zeros(num_envs, dtype=np.int64)
        self._episode_start = np.full(num_envs, time.perf_counter())
        self._lives = np.zeros(num_envs, dtype=np.int64)

    def _seeds_for(self, seed: int | None) -> list[int] | None:
        return None if seed is None else [seed + i for i in range(self.num_envs)]

    def _in_env_order(self, obs: np.ndarray, info: dict[str, Any], ids: np.ndarray) -> np.ndarray:
        """Reorder a batch returned by EnvPool so that row ``k`` belongs to ``ids[k]``."""
        returned = np.asarray(info["env_id"])
        if np.array_equal(returned, ids):
            return obs
        position = {int(env_id): row for row, env_id in enumerate(returned)}
        return obs[[position[int(env_id)] for env_id in ids]]

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every sub-env; a ``seed`` (int: ``seed + i`` per sub-env, or a list) rebuilds the pool."""
        if options is not None:
            raise ValueError(f"EnvPoolVectorEnv.reset does not support options, got {options}")
        if seed is not None:
            seeds = list(seed) if isinstance(seed, list | tuple) else self._seeds_for(int(seed))
            if seeds is None or len(seeds) != self.num_envs:
                raise ValueError(f"reset(seed=...) needs an int or {self.num_envs} seeds, got {seed}")
            self._pool.close()
            self._pool = self._make_pool(seeds)
            self.action_space.seed(seeds[0])
        obs, pool_info = self._pool.reset(self._all_ids)
        obs = self._in_env_order(obs, pool_info, self._all_ids)
        self._episode_returns[:] = 0.0
        self._episode_lengths[:] = 0
        self._episode_start[:] = time.perf_counter()
        info: dict[str, Any] = {}
        if "lives" in pool_info:
            self._lives[:] = np.asarray(pool_info["lives"])[np.argsort(pool_info["env_id"])]
            info["lives"] = self._lives.copy()
        return obs, info

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step all sub-envs; finished ones are reset now (SAME_STEP) with their last obs in ``info``."""
        obs, raw_rewards, terminated, truncated, pool_info = self._pool.step(np.asarray(actions), self._all_ids)
        order = np.argsort(pool_info["env_id"])
        obs = self._in_env_order(obs, pool_info, self._all_ids)
        if not obs.flags.writeable:
            obs = obs.copy()  # finished rows are overwritten with reset observations below
        raw_rewards = np.asarray(raw_rewards, dtype=np.float64)[order]
        terminated = np.asarray(terminated, dtype=np.bool_)[order]
        truncated = np.asarray(truncated, dtype=np.bool_)[order]
        game_over = terminated | truncated

        self._episode_returns += raw_rewards
        self._episode_lengths += 1
        info: dict[str, Any] = {}
        life_lost = np.zeros(self.num_envs, dtype=np.bool_)
        if "lives" in pool_info:
            lives = np.asarray(pool_info["lives"], dtype=np.int64)[order]
            if self._terminal_on_life_loss:
                life_lost = (lives > 0) & (lives < self._lives) & ~game_over
            self._lives = lives
            info["lives"] = lives.copy()

        ended = game_over | life_lost
        rewards = np.sign(raw_rewards) if self._clip_rewards else raw_rewards
        if ended.any():
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(ended):
                final_obs[i] = obs[i].copy()
            info["final_obs"], info["_final_obs"] = final_obs, ended.copy()
        if game_over.any():
            episode = self._finish_episodes(game_over)
            info["final_info"] = {"episode": episode, "_episode": game_over.copy()}
            info["_final_info"] = game_over.copy()
            info["episode"], info["_episode"] = episode, game_over.copy()
            reset_ids = self._all_ids[game_over]
            reset_obs, reset_info = self._pool.reset(reset_ids)
            obs[game_over] = self._in_env_order(reset_obs, reset_info, reset_ids)
            if "lives" in reset_info:
                reset_lives = np.asarray(reset_info["lives"])[np.argsort(reset_info["env_id"])]
                self._lives[game_over] = reset_lives
                info["lives"] = self._lives.copy()
        return obs, rewards, terminated | life_lost, truncated, info

    def _finish_episodes(self, done: np.ndarray) -> dict[str, np.ndarray]:
        """Gymnasium-style episode statistics for the sub-envs in ``done``; restarts their counters."""
        now = time.perf_counter()
        episode = {
            "r": np.where(done, self._episode_returns, 0.0),
            "l": np.where(done, self._episode_lengths, 0),
            "t": np.where(done, np.round(now - self._episode_start, 6), 0.0),
        }
        for key in ("r", "l", "t"):
            episode[f"_{key}"] = done.copy()
        self._episode_returns[done] = 0.0
        self._episode_lengths[done] = 0
        self._episode_start[done] = now
        return episode

    def close_extras(self, **kwargs: Any) -> None:
        """Release the EnvPool threads."""
        self._pool.close()

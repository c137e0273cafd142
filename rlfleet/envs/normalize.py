"""Observation and reward normalisation from running statistics of the training envs, as vector-env wrappers.

`RunningMeanStd` keeps the count, mean and variance of every observation seen, merging each `[N, ...]`
batch from N envs at once with the parallel form of Welford's update (Chan, Golub & LeVeque 1979).
`NormalizeObservation` wraps a vector env and returns `clip((obs - mean) / sqrt(var + eps), ±clip)`
as float32, for the observations of `reset` and `step` and for `info["final_obs"]` (the true last
observations of finished episodes, from which truncated episodes bootstrap). A training env's wrapper
updates the statistics before normalising; an evaluation env's wrapper shares the same statistics
object with `update_stats=False`, so evaluation never changes them and sees them frozen as they were.

`NormalizeReward` divides each training reward by the running standard deviation of the discounted
return `R_t = γ R_{t-1} + r_t` (one `R` per env, restarted when its episode ends), clipped to
`±reward_clip`, as PPO implementations do on MuJoCo (OpenAI baselines' VecNormalize, CleanRL, SB3): the
value targets then have about unit scale whatever the env's reward units. Only the learner sees scaled
rewards: episode returns are recorded inside each env (`RecordEpisodeStatistics`) and evaluation envs
are not wrapped.

A replay algorithm's training envs (`normalize_training_envs(..., raw=True)`) update the same statistics but pass
observations and rewards through raw: the policy acts on them normalised (`ObsNormalizedAgent`), the buffer keeps
them raw, and `ReplayNormalizer` normalises each sampled batch with the statistics as they are when it is drawn, as
SB3's `VecNormalize` does for off-policy algorithms. Stored normalised, a transition would keep the statistics of
the moment it was collected and drift from what the network now sees for the same state.

Every algorithm's `Config` inherits `NormOptions` (`--set obs_norm=true`, `--set reward_norm=true`, or a
preset); the run (`rlfleet.run.runner.RunBase`) builds the statistics, wraps its training (and, for observations,
evaluation) envs, and keeps the statistics in its checkpoints, from which `--resume` restores them. An
agent loaded from a checkpoint (`rlfleet eval`, `rlfleet.run.evaluate.load_agent`) acts on raw observations
through `ObsNormalizedAgent`, which normalises them with the checkpoint's frozen statistics exactly as the
run's evaluation envs did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import batch_space

from rlfleet.envs.wrappers import ForwardingVectorWrapper
from rlfleet.fields import bounded
from rlfleet.nets.heads import ACTION_MASK


@dataclass
class NormOptions:
    """Config fields every algorithm's `Config` inherits; the run, not the algorithm, acts on them."""

    obs_norm: bool = False
    """Normalise observations by the running mean and variance of the training observations: training
    env steps update them, evaluation uses them frozen, checkpoints keep them (float vector observations,
    single architecture; see `rlfleet.envs.normalize`)."""
    obs_clip: float = bounded(10.0, gt=0, needs="obs_norm")
    """With `obs_norm`: normalised observations are clipped to ± this."""
    reward_norm: bool = False
    """Divide training rewards by the running standard deviation of the discounted return (with the
    algorithm's γ); evaluation and logged episode returns stay raw (single architecture)."""
    reward_clip: float = bounded(10.0, gt=0, needs="reward_norm")
    """With `reward_norm`: scaled rewards are clipped to ± this."""


class RunningMeanStd:
    """Count, mean and (population) variance of all samples merged so far, per observation element.

    With no data the statistics are mean 0, variance 1: normalising is then the identity (up to clipping).
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8, name: str = "obs_clip"):
        if clip <= 0:
            raise ValueError(f"{name} must be positive, got {clip}")
        self.shape = tuple(shape)
        self.clip = float(clip)
        self.eps = float(eps)
        self.count = 0
        self.mean = np.zeros(self.shape, dtype=np.float64)
        self.var = np.ones(self.shape, dtype=np.float64)

    def update(self, batch: np.ndarray) -> None:
        """Merge a batch `[B, *shape]` into the statistics."""
        batch = np.asarray(batch, dtype=np.float64).reshape(-1, *self.shape)
        n = len(batch)
        if n == 0:
            return
        batch_mean = batch.mean(axis=0)
        batch_var = batch.var(axis=0)
        if self.count == 0:
            self.mean, self.var, self.count = batch_mean, batch_var, n
            return
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta**2 * (self.count * n / total)
        self.mean = self.mean + delta * (n / total)
        self.var = m2 / total
        self.count = total

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """`clip((obs - mean) / sqrt(var + eps), -clip, clip)` as float32."""
        return self.scale(np.asarray(obs, dtype=np.float64) - self.mean)

    def scale(self, x: np.ndarray) -> np.ndarray:
        """`clip(x / sqrt(var + eps), -clip, clip)` as float32: scaled by the spread, not centred."""
        out = np.asarray(x, dtype=np.float64) / np.sqrt(self.var + self.eps)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean.copy(), "var": self.var.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mean, var = np.asarray(state["mean"], dtype=np.float64), np.asarray(state["var"], dtype=np.float64)
        if mean.shape != self.shape or var.shape != self.shape:
            raise ValueError(f"observation statistics of shape {mean.shape} do not fit observations {self.shape}")
        self.count, self.mean, self.var = int(state["count"]), mean.copy(), var.copy()


class DictRunningMeanStd:
    """A `RunningMeanStd` per float `Box` entry of Dict observations; the other entries (one-hot codes, bits,
    images) pass through unchanged."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], clip: float = 10.0):
        self.entries = {key: RunningMeanStd(shape, clip) for key, shape in shapes.items()}
        self.clip = float(clip)

    def update(self, obs: dict[str, np.ndarray]) -> None:
        for key, stats in self.entries.items():
            stats.update(obs[key])

    def normalize(self, obs: dict[str, Any]) -> dict[str, Any]:
        return {key: self.entries[key].normalize(v) if key in self.entries else v for key, v in obs.items()}

    def state_dict(self) -> dict[str, Any]:
        return {key: stats.state_dict() for key, stats in self.entries.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.entries):
            raise ValueError(f"observation statistics of entries {sorted(state)} do not fit {sorted(self.entries)}")
        for key, stats in self.entries.items():
            stats.load_state_dict(state[key])


ObsStats = RunningMeanStd | DictRunningMeanStd


def _is_float_box(space: gym.Space) -> TypeGuard[gym.spaces.Box]:
    return isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating)


def make_obs_stats(space: gym.Space, clip: float) -> ObsStats:
    """Running statistics for observations of `space`: a float Box, or a Dict with float Box entries (those are
    normalised, but for its `action_mask`: a float 0/1 mask rescaled would read every action as legal); else a
    ValueError that says what obs_norm takes."""
    if _is_float_box(space):
        return RunningMeanStd(tuple(space.shape), clip)
    if isinstance(space, gym.spaces.Dict):
        shapes = {
            key: tuple(sub.shape) for key, sub in space.spaces.items() if _is_float_box(sub) and key != ACTION_MASK
        }
        if shapes:
            return DictRunningMeanStd(shapes, clip)
    raise ValueError(
        f"obs_norm normalises float vector observations (or the float Box entries of Dict ones), but the env has "
        f"{space}; leave obs_norm off for images and discrete observations"
    )


def stats_from_state(state: dict[str, Any], clip: float) -> ObsStats:
    """The statistics a checkpoint saved (`state_dict()` of either kind), restored."""
    if not isinstance(state.get("mean"), dict) and "mean" in state:  # a Dict's entry named "mean" holds a dict
        stats: ObsStats = RunningMeanStd(np.shape(state["mean"]), clip)
    else:
        stats = DictRunningMeanStd({key: np.shape(sub["mean"]) for key, sub in state.items()}, clip)
    stats.load_state_dict(state)
    return stats


def _normalized_space(space: gym.Space, stats: ObsStats) -> gym.Space:
    """The observation space after normalisation by `stats`: the normalised entries are Boxes of ± clip."""
    if isinstance(stats, RunningMeanStd):
        return gym.spaces.Box(-stats.clip, stats.clip, stats.shape, np.float32)
    assert isinstance(space, gym.spaces.Dict)  # dict statistics are of a Dict space's entries
    return gym.spaces.Dict(
        {
            key: _normalized_space(sub, stats.entries[key]) if key in stats.entries else sub
            for key, sub in space.spaces.items()
        }
    )


class NormalizeObservation(ForwardingVectorWrapper):
    """A vector env whose observations (and `info["final_obs"]`) are normalised by `stats`.

    `update_stats=True` (training envs) merges every batch of observations from `reset` and `step` into
    `stats` before normalising it; `update_stats=False` (evaluation envs) only reads them. The final
    observations of finished episodes are normalised with the same statistics as that step's
    observations, and are not merged (the statistics count each observation the policy acts on once).
    """

    def __init__(self, env: VectorEnv, stats: ObsStats, update_stats: bool = True):
        super().__init__(env)
        self.stats = stats
        self.update_stats = update_stats
        self.single_observation_space = _normalized_space(env.single_observation_space, stats)
        self.observation_space = batch_space(self.single_observation_space, env.num_envs)

    def _normalize(self, obs: Any) -> Any:  # an array, or a dict of them for dict statistics
        if self.update_stats:
            self.stats.update(obs)
        return self.stats.normalize(obs)

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        return self._normalize(obs), info

    def step(self, actions):
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        obs = self._normalize(obs)
        if "final_obs" in info:
            final = info["final_obs"].copy()
            for i in np.flatnonzero(info["_final_obs"]):
                final[i] = self.stats.normalize(final[i])
            info = {**info, "final_obs": final}
        return obs, rewards, terminations, truncations, info


class ObservationStatistics(ForwardingVectorWrapper):
    """A training vector env whose observations from `reset` and `step` are merged into `stats` and returned raw
    (a replay run's: its buffer keeps raw observations; final observations are not merged, as in
    `NormalizeObservation`)."""

    def __init__(self, env: VectorEnv, stats: ObsStats):
        super().__init__(env)
        self.stats = stats

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.stats.update(obs)
        return obs, info

    def step(self, actions):
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        self.stats.update(obs)
        return obs, rewards, terminations, truncations, info


def normalize_observations(envs: VectorEnv, stats: ObsStats | None, update_stats: bool) -> VectorEnv:
    """`envs` wrapped in `NormalizeObservation` with `stats`, or `envs` itself when `stats` is None."""
    return envs if stats is None else NormalizeObservation(envs, stats, update_stats)


class RewardNormalizer:
    """The state of reward normalisation: statistics of the discounted returns and each env's return so far."""

    def __init__(self, n_envs: int, gamma: float, clip: float = 10.0):
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"reward_norm needs a discount factor in [0, 1], got gamma={gamma}")
        self.gamma = float(gamma)
        self.stats = RunningMeanStd((), clip=clip, name="reward_clip")
        self.returns = np.zeros(n_envs, dtype=np.float64)

    def __call__(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        """The scaled rewards of one vector step; `done` (terminated or truncated) restarts those returns."""
        self.observe(rewards, done)
        return self.scale(rewards)

    def observe(self, rewards: np.ndarray, done: np.ndarray) -> None:
        """Merge one vector step's discounted returns into the statistics; `done` restarts those returns."""
        self.returns = self.returns * self.gamma + np.asarray(rewards, dtype=np.float64)
        self.stats.update(self.returns)
        self.returns[np.asarray(done, dtype=bool)] = 0.0

    def scale(self, rewards: np.ndarray) -> np.ndarray:
        """`clip(r / sqrt(Var[R] + eps), ±reward_clip)` as float32, with the statistics as they are now."""
        return self.stats.scale(rewards)

    def restart_returns(self) -> None:
        """Every env begins a new episode (envs rebuilt without their state): their returns start from 0."""
        self.returns[:] = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {**self.stats.state_dict(), "returns": self.returns.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        returns = np.asarray(state["returns"], dtype=np.float64)
        if returns.shape != self.returns.shape:
            raise ValueError(f"reward statistics of {len(returns)} envs do not fit a run of {len(self.returns)}")
        self.stats.load_state_dict(state)
        self.returns = returns.copy()


class NormalizeReward(ForwardingVectorWrapper):
    """A training vector env whose rewards are scaled by a `RewardNormalizer` (which the step updates); with
    `raw=True` the step only updates it and the rewards pass through raw (a replay run's)."""

    def __init__(self, env: VectorEnv, normalizer: RewardNormalizer, raw: bool = False):
        super().__init__(env)
        if len(normalizer.returns) != env.num_envs:
            raise ValueError(f"a reward normalizer for {len(normalizer.returns)} envs on {env.num_envs} envs")
        self.normalizer = normalizer
        self.raw = raw

    def step(self, actions):
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        done = np.logical_or(terminations, truncations)
        if self.raw:
            self.normalizer.observe(rewards, done)
        else:
            rewards = self.normalizer(rewards, done)
        return obs, rewards, terminations, truncations, info


def normalize_training_envs(
    envs: VectorEnv, obs_stats: ObsStats | None, reward_norm: RewardNormalizer | None, raw: bool
) -> VectorEnv:
    """A run's training envs with its observation statistics and reward normalisation (either may be None):
    normalising what they return, or with `raw=True` (replay) only updating the statistics, for the buffer
    to keep raw data that `ReplayNormalizer` normalises when it is sampled."""
    if obs_stats is not None:
        envs = ObservationStatistics(envs, obs_stats) if raw else NormalizeObservation(envs, obs_stats, True)
    return envs if reward_norm is None else NormalizeReward(envs, reward_norm, raw)


@dataclass
class ReplayNormalizer:
    """What a replay buffer of raw observations and rewards applies to each sample (`ReplayBuffer.normalizer`):
    the run's statistics as they are when the batch is drawn, so every transition is normalised as the policy
    now sees its state. Rewards are scaled one by one, before an n-step sum."""

    obs_stats: ObsStats | None = None
    reward_norm: RewardNormalizer | None = None

    def observations(self, obs: Any) -> Any:
        return obs if self.obs_stats is None else self.obs_stats.normalize(obs)

    def rewards(self, rew: np.ndarray) -> np.ndarray:
        return rew if self.reward_norm is None else self.reward_norm.scale(rew)


class ObsNormalizedAgent:
    """An algorithm trained with `obs_norm`, acting on raw observations: `act` and `value` normalise them with
    frozen statistics first (as the run's evaluation envs did); everything else is the algorithm's own."""

    def __init__(self, algo: Any, stats: ObsStats):
        self.algo = algo
        self.stats = stats

    @classmethod
    def from_checkpoint(cls, algo: Any, payload: dict[str, Any]) -> Any:
        """`algo` itself, or wrapped with the statistics of a checkpoint written by a run with `obs_norm`."""
        saved = payload.get("obs_norm")
        if saved is None:
            return algo
        return cls(algo, stats_from_state(saved, payload["algo_config"].get("obs_clip", 10.0)))

    def act(self, obs: Any, state: Any = None, explore: bool = True) -> tuple[np.ndarray, dict[str, Any], Any]:
        return self.algo.act(self.stats.normalize(obs), state, explore)

    def value(self, obs: Any, *state: Any) -> np.ndarray:
        return self.algo.value(self.stats.normalize(obs), *state)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.algo, name)

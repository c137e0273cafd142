"""Exploration noise for continuous control: the action noise of deterministic actors (DDPG, TD3), Gaussian or
Ornstein–Uhlenbeck, one process per env, reset where an episode starts; and when gSDE's noise matrices (SAC,
PPO, A2C) are drawn anew. Both keep their state in checkpoints.

The noise is added to the actor's action in the policy's normalised space ([-1, 1], units of half the action
range) and the sum is clipped back to [-1, 1]:

- "gaussian": ε_t ~ N(0, σ²) drawn afresh at every step (the TD3 paper's exploration);
- "ou": the Ornstein–Uhlenbeck process of the DDPG paper (Lillicrap et al. 2016), as Stable-Baselines3 and
  Tianshou write it: x_{t+1} = x_t + θ (μ − x_t) dt + σ √dt ε_t with μ = 0 and x = 0 at the start of each
  episode. Consecutive values are correlated over about 1 / (θ dt) steps (667 with θ = 0.15, dt = 0.01), so
  the actor is pushed the same way for long stretches, and its stationary std is σ / √(2θ − θ² dt) (about
  1.8 σ): a sparse reward behind a long run-up (MountainCarContinuous-v0) is found where independent
  Gaussian noise averages out.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from rlfleet.nets.heads import StateDependentNoise

ACTION_NOISES = ("gaussian", "ou")


class ActionNoise:
    """Per-env exploration noise for `[N, A]` actions: calling it with `(n, act_dim, rng)` draws the next step's
    values, `perturb(actions, rng)` adds them and clips, `reset(done)` puts the processes of the envs in the `[N]`
    mask `done` back at their start."""

    def __init__(self, kind: str, sigma: float, theta: float = 0.15, dt: float = 1e-2):
        if kind not in ACTION_NOISES:
            raise ValueError(f"unknown action noise {kind!r}; choose one of: {', '.join(ACTION_NOISES)}")
        if sigma < 0 or theta < 0 or dt <= 0:
            raise ValueError(f"action noise needs sigma >= 0, theta >= 0 and dt > 0, got {sigma}, {theta}, {dt}")
        self.kind = kind
        self.sigma = float(sigma)
        self.theta = float(theta)
        self.dt = float(dt)
        self.x: npt.NDArray[np.float32] | None = None
        """The OU processes' values `[N, A]` (None until the first draw; always None for Gaussian noise)."""

    def __call__(self, n: int, act_dim: int, rng: np.random.Generator) -> npt.NDArray[np.floating[Any]]:
        eps = rng.standard_normal((n, act_dim), dtype=np.float32)
        if self.kind == "gaussian":
            return self.sigma * eps
        if self.x is None or self.x.shape != (n, act_dim):
            self.x = np.zeros((n, act_dim), dtype=np.float32)
        self.x = (self.x + self.theta * (0.0 - self.x) * self.dt + self.sigma * math.sqrt(self.dt) * eps).astype(
            np.float32
        )
        return self.x

    def reset(self, done: np.ndarray) -> None:
        if self.x is not None and len(done) == len(self.x):
            self.x[np.asarray(done, dtype=bool)] = 0.0

    def perturb(self, actions: npt.NDArray[np.float32], rng: np.random.Generator) -> np.ndarray:
        """`clip(actions + noise, -1, 1)` for actions in the policy's space (unchanged when σ = 0)."""
        if self.sigma <= 0:
            return actions
        noise = self(len(actions), actions.shape[-1], rng)
        return np.clip(actions + noise, -1.0, 1.0).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"x": None if self.x is None else self.x.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        x = state.get("x")
        self.x = None if x is None else np.array(x, dtype=np.float32)


class SDEMatrices:
    """gSDE's noise matrices (`rlfleet.nets.heads.StateDependentNoise`), one per env, and when they are drawn anew.

    With a `period` (PPO and A2C: the rollout; SAC without `sde_sample_freq`: the `train_freq` steps between
    updates), as in Stable-Baselines3: at the start of every period of that many vector steps and, when
    `sample_freq` > 0, every `sample_freq` steps within it. Without one (`period` None): every `sample_freq`
    steps. The draws and the step count are in `state_dict()`, so a resumed run explores as the
    uninterrupted one.
    """

    def __init__(self, sample_freq: int, period: int | None):
        if period is None and sample_freq <= 0:
            raise ValueError("gSDE's noise matrices need a period or a sample_freq > 0")
        self.sample_freq = sample_freq
        self.period = None if period is None else max(1, period)
        self.steps = 0
        self.draws: np.ndarray | None = None
        """Standard normal draws ξ `[N, F, A]` of the current matrices θ = σ ⊙ ξ (None before the first step)."""

    def next(self, noise: StateDependentNoise, n: int, rng: np.random.Generator) -> np.ndarray:
        """The draws for this exploring step of `n` envs (new ones when due)."""
        t = self.steps if self.period is None else self.steps % self.period
        due = (self.period is not None and t == 0) or (self.sample_freq > 0 and t % self.sample_freq == 0)
        if due or self.draws is None or len(self.draws) != n:
            self.draws = noise.sample_draws(n, rng)
        self.steps += 1
        return self.draws

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "draws": None if self.draws is None else self.draws.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.draws = None if state["draws"] is None else np.array(state["draws"], dtype=np.float32)


EXPLORATION_OPTIONS = {
    "ddpg": ("--set action_noise=ou", "a larger exploration_noise"),
    "td3": ("--set action_noise=ou", "a larger exploration_noise"),
    "sac": ("--set sde=true", "a larger sde_init_std or sde_sample_freq"),
    "ppo": ("--set sde=true", "a larger init_std or sde_sample_freq"),
    "a2c": ("--set sde=true", "a larger init_std or sde_sample_freq"),
    "a3c": ("--set sde=true", "a larger init_std or sde_sample_freq"),
}
"""The exploration option of each continuous-control algorithm that has one, and the settings that give it more
noise (what a run that never beat doing nothing suggests: `rlfleet.run.hints.exploration_hint`)."""

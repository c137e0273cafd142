"""DDPG: deep deterministic policy gradient (Lillicrap et al. 2016) for Box actions.

A deterministic actor μ(s) = tanh(MLP(s)) in [-1, 1] (rescaled to the env's bounds by `ActionBounds`)
explores with Gaussian or Ornstein–Uhlenbeck noise (`rlfleet.algos.noise`); after a warm-up of uniform random
actions, every `train_freq` env steps the learner takes `gradient_steps` replay minibatches and

- regresses the critic on y = r + γ (1 − terminated) Q'(s', μ'(s'))   (bootstrapping on truncation),
- ascends the actor along Q(s, μ(s)),
- moves the target networks toward the online ones: θ' ← (1 − τ) θ' + τ θ.

As in the paper's Algorithm 1, each update steps the critic first and then the actor, whose loss reads the
critic as that step left it (through detached weights: its gradient reaches the actor only). One Adam holds
both networks' parameter groups; each step moves only the network that has gradients.

TD3 (Fujimoto et al. 2018) is this algorithm with three changes, so DDPG is built as TD3 without them, as
Stable-Baselines3 builds it: one critic instead of twin ones, an actor step and target update after every critic
step (no policy delay), and no target policy smoothing. The update itself is TD3's, in `rlfleet/algos/td3.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlfleet.algos.td3 import TD3, DPGOptions, apex_preset


@dataclass
class Config(DPGOptions):
    """DDPG hyperparameters; the defaults solve Pendulum-v1 (greedy mean ≥ −250) in ~4k env steps (preset: mujoco)."""


# MuJoCo locomotion (picked automatically for MuJoCo envs): CleanRL's and rl-zoo3's DDPG settings — replay of 1M
# transitions, 25k random steps first, minibatches of 256, Adam 3e-4, γ = 0.99, τ = 0.005, Gaussian
# exploration noise 0.1, 256-256 ReLU MLPs; the actor and targets step with every critic step, as in SB3's DDPG
# (CleanRL's step them every 2nd)
PRESETS: dict[str, dict[str, Any]] = {
    "mujoco": dict(
        n_envs=1,
        buffer_size=1_000_000,
        batch_size=256,
        learning_starts=25_000,
        random_steps=25_000,
        train_freq=1,
        gradient_steps=1,
        gamma=0.99,
        n_step=1,
        tau=0.005,
        hidden=(256, 256),
        activation="relu",
        actor_lr=3e-4,
        critic_lr=3e-4,
        exploration_noise=0.1,
        total_steps=1_000_000,
    ),
}
PRESETS["apex"] = apex_preset(PRESETS["mujoco"])  # Ape-X DPG, the paper's own algorithm


class DDPG(TD3):
    """Deterministic actor and one Q(s, a) critic with Polyak-averaged targets, over a replay buffer: TD3 with one
    critic, no policy delay and no target smoothing."""

    name = "ddpg"
    critics = 1

    def policy_delay(self) -> int:
        return 1

    def smooth(self, next_act: torch.Tensor) -> torch.Tensor:
        return next_act

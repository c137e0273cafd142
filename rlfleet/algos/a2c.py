"""A2C: synchronous advantage actor-critic (Mnih et al. 2016's A3C loss, one learner over N envs).

Per segment of T steps from N envs: returns by GAE(λ) (λ = 1 gives the paper's forward-view n-step
returns), then one gradient step on

    L = −E[log π(a|s) · A] + vf_coef · E[(R − V(s))²] − ent_coef · E[H(π(·|s))].

Run on the `hogwild` architecture this is A3C; the loss here is what every worker computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from rlfleet.algos.common import make_optimizer, optimize, policy_step, require_discrete, set_lr, state_values
from rlfleet.data.batch import Batch
from rlfleet.data.returns import gae
from rlfleet.data.rollout import Segment
from rlfleet.nets.models import ActorCritic


@dataclass
class Config:
    """A2C hyperparameters; the defaults solve CartPole-v1."""

    n_envs: int = 8
    """Parallel envs stepped in lockstep by one process."""
    rollout_len: int = 16
    """Steps per env per update (the paper's t_max)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.9
    """GAE λ; 1.0 gives plain n-step returns as in the A3C paper."""
    lr: float = 3e-3
    """Learning rate."""
    lr_anneal: bool = False
    """Anneal the learning rate linearly to 0 over the run's total steps (as the A3C paper does)."""
    optimizer: str = "rmsprop"
    """adam, rmsprop or sgd."""
    ent_coef: float = 0.0
    """Entropy bonus β (the A3C paper uses 0.01)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip; 0 disables it."""
    normalize_advantage: bool = True
    """Standardise advantages per segment."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the MLP encoder."""
    activation: str = "tanh"
    """MLP activation: tanh, relu or elu."""
    encoder: str = "auto"
    """auto (MLP for vectors, Nature CNN for images), mlp, mnih2013 or nature."""
    total_steps: int = 200_000
    """Default training budget in env steps."""


PRESETS = {
    "atari": dict(
        n_envs=16,
        rollout_len=5,
        lr=7e-4,
        ent_coef=0.01,
        max_grad_norm=0.5,
        encoder="mnih2013",
        lr_anneal=True,
        total_steps=10_000_000,
    ),
    "paper": dict(rollout_len=5, gae_lambda=1.0, lr=7e-4, ent_coef=0.01, lr_anneal=True, normalize_advantage=False),
}


class A2C:
    """Advantage actor-critic with a categorical policy."""

    data = "rollout"

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space, seed: int = 0):
        n_actions = require_discrete(action_space, "a2c")
        self.cfg = cfg
        image = len(obs_space.shape or ()) == 3
        self.model = ActorCritic(obs_space, n_actions, cfg.encoder, cfg.hidden, cfg.activation, shared=image)
        self.optimizer = make_optimizer(cfg.optimizer, self.model.parameters(), cfg.lr)
        self.params = list(self.model.parameters())
        self.rng = np.random.default_rng(seed)

    def act(self, obs: np.ndarray, state=None, explore: bool = True):
        action, _, value = policy_step(self.model, obs, explore, self.rng)
        return action, {"value": value}, state

    def value(self, obs: np.ndarray) -> np.ndarray:
        return state_values(self.model, obs)

    def schedule(self, env_steps: int, total_steps: int) -> None:
        if self.cfg.lr_anneal:
            set_lr(self.optimizer, self.cfg.lr * max(0.0, 1.0 - env_steps / total_steps))

    def process(self, segment: Segment) -> Batch:
        d = segment.data
        adv, ret = gae(
            d.rew,
            d.value,
            d.terminated,
            d.truncated,
            segment.last_value,
            self.cfg.gamma,
            self.cfg.gae_lambda,
            d.bootstrap,
        )
        return Batch(obs=d.obs, act=d.act, adv=adv, ret=ret).flatten_leading(2)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        b = batch.to_torch()
        dist, value = self.model(b.obs)
        adv = b.adv
        if self.cfg.normalize_advantage and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss = -(dist.log_prob(b.act) * adv).mean()
        value_loss = (b.ret - value).pow(2).mean()
        entropy = dist.entropy().mean()
        loss = policy_loss + self.cfg.vf_coef * value_loss - self.cfg.ent_coef * entropy
        metrics = {
            "policy_loss": policy_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy.item(),
        }
        return loss, metrics

    def update(self, segment: Segment) -> dict[str, float]:
        loss, metrics = self.loss(self.process(segment))
        metrics["grad_norm"] = optimize(self.optimizer, loss, self.params, self.cfg.max_grad_norm)
        return metrics

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]

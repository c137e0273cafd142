"""PG: REINFORCE (Williams 1992) with returns-to-go and an optional learned baseline.

Per segment: discounted returns-to-go G_t inside each episode, then `epochs` passes of minibatch SGD on
−E[log π(a|s) · (G − b(s))], with G − b(s) optionally standardised per minibatch. Without a baseline, the
steps of an episode still running at the segment end have no complete return yet and are left out of the
loss (the episode's later steps, in the next segment, are used), and a time-limit truncation ends the
return where it happens. With `baseline=True` a value network is
trained on G and bootstraps unfinished episodes and time-limit truncations instead. Box actions get a
diagonal Gaussian policy (learned in [-1, 1], rescaled to the env's bounds; see `ActionBounds`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlfleet.algos.acting import policy_step, state_values
from rlfleet.algos.contract import Metrics
from rlfleet.algos.options import ACTIVATION, ENCODER, LOG_STD, NetOptions
from rlfleet.algos.spaces import (
    POLICY_ACTIONS,
    action_bounds,
    check_action_mask,
    check_action_space,
    policy_actions,
    to_env_actions,
)
from rlfleet.algos.updates import clip_norm, minibatch_epochs
from rlfleet.data.batch import Batch
from rlfleet.data.returns import discounted_returns, episode_complete_mask
from rlfleet.data.rollout import Segment
from rlfleet.device import metric, place
from rlfleet.envs.normalize import NormOptions
from rlfleet.fields import MAX_ENVS, bounded, checked
from rlfleet.nets.encoders import has_image
from rlfleet.nets.models import ActorCritic
from rlfleet.optim.make import make_optimizer


@dataclass
class Config(NetOptions, NormOptions):
    """REINFORCE hyperparameters; the defaults solve CartPole-v1."""

    n_envs: int = bounded(8, ge=1, le=MAX_ENVS)
    """Parallel envs stepped in lockstep by one process."""
    rollout_len: int = bounded(32, ge=1)
    """Steps per env per update; episodes unfinished at the segment end are dropped without a baseline."""
    gamma: float = bounded(0.95, ge=0, le=1)
    """Discount factor."""
    lr: float = bounded(1e-3, ge=0)
    """Learning rate (Adam)."""
    epochs: int = bounded(2, ge=1)
    """Passes over each segment."""
    minibatch_size: int = bounded(64, ge=0)
    """Samples per gradient step; 0 uses the whole segment as one batch."""
    normalize_returns: bool = True
    """Standardise the returns (or advantages, with a baseline) per minibatch."""
    baseline: bool = False
    """Learn a state-value baseline (and bootstrap unfinished episodes from it)."""
    vf_coef: float = bounded(0.5, ge=0, needs="baseline")
    """Weight of the baseline's value loss."""
    max_grad_norm: float = bounded(0.0, ge=0)
    """Global gradient-norm clip; 0 disables it."""
    hidden: tuple[int, ...] = bounded((64, 64), ge=1, needs="net=")
    """Hidden layer sizes of the MLP encoder."""
    activation: str = checked("tanh", ACTIVATION, needs="net=")
    """MLP activation: tanh, relu or elu."""
    encoder: str = checked("auto", ENCODER, needs="net=")
    """auto (MLP for vectors, Nature CNN for images, MinAtar's under 36×36), mlp, mnih2013, nature or minatar."""
    log_std: str = checked("state_independent", LOG_STD)
    """Box actions: the Gaussian's σ — state_independent, state_dependent or softplus (see `GaussianHead`)."""
    init_std: float = bounded(1.0, gt=0)
    """Box actions: σ at initialisation, in units of half the action range."""
    total_steps: int = bounded(200_000, ge=1)
    """Default training budget in env steps."""


PRESETS: dict[str, dict[str, Any]] = {
    "atari": dict(n_envs=16, rollout_len=128, lr=2.5e-4, baseline=True, total_steps=10_000_000),
}
PRESETS["minatar"] = dict(PRESETS["atari"], encoder="minatar", total_steps=5_000_000)  # the MinAtar paper's network


class PG:
    """Policy gradient with Monte-Carlo returns."""

    data = "rollout"
    action_spaces = POLICY_ACTIONS

    def __init__(
        self, cfg: Config, obs_space: gym.Space[Any], action_space: gym.Space[Any], seed: int = 0, device: str = "cpu"
    ):
        action_space = check_action_space(action_space, "pg", self.action_spaces)
        check_action_mask(obs_space, action_space, "pg")
        self.cfg = cfg
        image = has_image(obs_space)
        self.model = ActorCritic(
            obs_space,
            action_space,
            cfg.encoder,
            cfg.hidden,
            cfg.activation,
            shared=image,
            critic=cfg.baseline,
            log_std=cfg.log_std,
            init_std=cfg.init_std,
            net=cfg.net,
            net_kwargs=cfg.net_kwargs,
        )
        self.bounds = action_bounds(action_space)
        self.device = place(self, device)  # networks on the learner's device before the optimizer
        self.optimizer = make_optimizer("adam", self.model.parameters(), cfg.lr)
        self.params = list(self.model.parameters())
        self.rng = np.random.default_rng(seed)

    def act(
        self, obs: np.ndarray, state: Any = None, explore: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        action, _, _, _ = policy_step(self.model, obs, explore, self.rng)
        extras: dict[str, np.ndarray] = {}
        return to_env_actions(action, extras, self.bounds), extras, state

    def value(self, obs: np.ndarray, state: Any = None) -> np.ndarray:
        return state_values(self.model, obs)

    def schedule(self, env_steps: int, total_steps: int) -> None:
        pass

    def process(self, segment: Segment) -> Batch:
        d = segment.data
        ret = discounted_returns(
            d.rew,
            d.terminated,
            d.truncated,
            segment.last_value,
            self.cfg.gamma,
            d.bootstrap if self.cfg.baseline else None,
        )
        batch = Batch(obs=d.obs, act=policy_actions(d), ret=ret)
        if not self.cfg.baseline:
            complete: Batch = batch[episode_complete_mask(d.terminated, d.truncated).astype(bool)]
            return complete
        return batch.flatten_leading(2)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        b = batch.to_torch(self.device)
        dist, value = self.model(b.obs)
        adv = b.ret if value is None else b.ret - value.detach()
        if self.cfg.normalize_returns and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss = -(dist.log_prob(b.act) * adv).mean()
        metrics = {"policy_loss": metric(policy_loss), "entropy": metric(dist.entropy().mean())}
        loss = policy_loss
        if value is not None:
            value_loss = (b.ret - value).pow(2).mean()
            loss = loss + self.cfg.vf_coef * value_loss
            metrics["value_loss"] = metric(value_loss)
        return loss, metrics

    def lr_at(self, env_steps: int, total_steps: int) -> float:
        return self.cfg.lr  # constant

    max_grad_norm = property(clip_norm)

    @property
    def one_gradient(self) -> bool:
        """`update` is one optimizer step on the segment's loss only with one epoch over the whole batch."""
        size = self.cfg.minibatch_size
        return self.cfg.epochs == 1 and (size == 0 or size >= self.cfg.rollout_len * self.cfg.n_envs)

    def uneven_updates(self) -> str | None:
        if self.cfg.baseline:
            return None
        return "without a baseline it learns from complete episodes only: use --set baseline=true"

    def update(self, segment: Segment) -> Metrics:
        batch = self.process(segment)
        if len(batch) == 0:
            return {}
        size = self.cfg.minibatch_size or len(batch)
        return minibatch_epochs(self, batch, self.cfg.epochs, size, self.rng)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]

"""A2C: synchronous advantage actor-critic (Mnih et al. 2016's A3C loss, one learner over N envs).

Per segment of T steps from N envs: returns by GAE(λ) (λ = 1 gives the paper's forward-view n-step
returns), then one gradient step on

    L = −E[log π(a|s) · A] + vf_coef · E[(R − V(s))²] − ent_coef · E[H(π(·|s))].

The policy is categorical for Discrete actions and a diagonal Gaussian for Box actions (learned in
[-1, 1] and rescaled to the env's bounds, see `ActionBounds`; with `sde`, exploring with gSDE's
state-dependent noise, `StateDependentNoise`). With `lstm` > 0 an LSTM core sits after
the encoder: `act` carries its state across steps, the collector resets it where episodes end
(`reset_state`), and `loss` replays each env's segment from the stored initial state, zeroing the
state where episodes start, so training sees the states acting saw.

Run on the `hogwild` architecture this is A3C; the loss here is what every worker computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

from rlfleet.algos.acting import policy_step, state_values
from rlfleet.algos.contract import Metrics
from rlfleet.algos.noise import SDEMatrices
from rlfleet.algos.options import ACTIVATION, ENCODER, LOG_STD, OPTIMIZER, NetOptions, SDEOptions
from rlfleet.algos.spaces import (
    POLICY_ACTIONS,
    action_bounds,
    check_action_mask,
    check_action_space,
    policy_actions,
    to_env_actions,
)
from rlfleet.algos.updates import clip_norm, sequence_batch, unroll_sequences
from rlfleet.data.batch import Batch, obs_len
from rlfleet.data.returns import gae
from rlfleet.data.rollout import Segment
from rlfleet.device import metric, place
from rlfleet.envs.normalize import NormOptions
from rlfleet.fields import MAX_ENVS, bounded, checked
from rlfleet.nets.encoders import has_image
from rlfleet.nets.heads import SDEGaussianHead
from rlfleet.nets.models import ActorCritic
from rlfleet.nets.recurrent import LSTMCore, State
from rlfleet.optim.make import make_optimizer
from rlfleet.optim.step import optimize, set_lr


@dataclass
class Config(NetOptions, NormOptions, SDEOptions):
    """A2C hyperparameters; the defaults solve CartPole-v1 (presets: atari, paper, continuous, lstm)."""

    n_envs: int = bounded(8, ge=1, le=MAX_ENVS)
    """Parallel envs stepped in lockstep by one process."""
    rollout_len: int = bounded(16, ge=1)
    """Steps per env per update (the paper's t_max)."""
    gamma: float = bounded(0.99, ge=0, le=1)
    """Discount factor."""
    gae_lambda: float = bounded(0.9, ge=0, le=1)
    """GAE λ; 1.0 gives plain n-step returns as in the A3C paper."""
    reward_scale: float = bounded(1.0, gt=0)
    """Rewards are multiplied by this before returns are computed (values are learned in these units)."""
    lr: float = bounded(3e-3, ge=0)
    """Learning rate."""
    lr_anneal: bool = False
    """Anneal the learning rate linearly to 0 over the run's total steps (as the A3C paper does)."""
    optimizer: str = checked("rmsprop", OPTIMIZER)
    """adam, rmsprop or sgd."""
    ent_coef: float = bounded(0.0, ge=0)
    """Entropy bonus β (the A3C paper uses 0.01)."""
    vf_coef: float = bounded(0.5, ge=0)
    """Weight of the value loss."""
    max_grad_norm: float = bounded(0.5, ge=0)
    """Global gradient-norm clip; 0 disables it."""
    normalize_advantage: bool = True
    """Standardise advantages per segment."""
    hidden: tuple[int, ...] = bounded((64, 64), ge=1, needs="net=")
    """Hidden layer sizes of the MLP encoder."""
    activation: str = checked("tanh", ACTIVATION, needs="net=")
    """MLP activation: tanh, relu or elu."""
    encoder: str = checked("auto", ENCODER, needs="net=")
    """auto (MLP for vectors, Nature CNN for images, MinAtar's under 36×36), mlp, mnih2013, nature or minatar."""
    shared: bool = False
    """One encoder for policy and value also for vector observations (images and `lstm` always share)."""
    lstm: int = bounded(0, ge=0)
    """0: feed-forward; N: an LSTM core of N cells after the encoder, shared by policy and value."""
    log_std: str = checked("state_independent", LOG_STD, needs="sde=False")
    """Box actions: the Gaussian's σ — state_independent (learned vector), state_dependent (linear in the
    features) or softplus (σ² = softplus(linear), the A3C paper's head)."""
    init_std: float = bounded(1.0, gt=0)
    """Box actions: σ at initialisation, in units of half the action range (with `sde`: σ of each entry of the
    noise matrix)."""
    ortho_init: bool = True
    """Orthogonal initialisation of the layers (gains √2, 0.01 for the policy's output, 1 for the value's); False:
    PyTorch's default initialisation, as Stable-Baselines3's `ortho_init=False` (σ keeps `init_std`)."""
    total_steps: int = bounded(200_000, ge=1)
    """Default training budget in env steps."""


PRESETS: dict[str, dict[str, Any]] = {
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
    # The A3C paper's continuous agent: separate policy and value MLPs of one 200-unit ReLU layer, σ² by
    # softplus, entropy weight 1e-4; the rest tuned for one process on Pendulum-v1 (docs/algorithms.md,
    # "Measured"). Every learning setting is spelled out so the preset means the same under `a3c`.
    "continuous": dict(
        hidden=(200,),
        activation="relu",
        log_std="softplus",
        init_std=0.3,
        ent_coef=1e-4,
        n_envs=8,
        rollout_len=8,
        gamma=0.9,
        gae_lambda=0.9,
        reward_scale=0.01,
        normalize_advantage=True,
        optimizer="rmsprop",
        lr=5e-4,
        lr_anneal=True,
        max_grad_norm=0.5,
        total_steps=300_000,
    ),
    # The A3C paper's recurrent agent for low-dimensional observations: 128 LSTM cells after the encoder.
    # Rewards scaled by 0.1 keep the value loss from swamping the policy gradient in the shared trunk
    # (measured with and without: docs/algorithms.md, "Recurrent policies").
    "lstm": dict(
        lstm=128,
        reward_scale=0.1,
        n_envs=8,
        rollout_len=16,
        gamma=0.99,
        gae_lambda=0.9,
        normalize_advantage=True,
        optimizer="rmsprop",
        lr=3e-3,
        ent_coef=0.0,
    ),
}
# MinAtar (Young & Tian 2019): the Atari settings on the MinAtar paper's network
PRESETS["minatar"] = dict(PRESETS["atari"], encoder="minatar", total_steps=5_000_000)


# A3C (Mnih et al. 2016, Algorithm S3) is this loss run by asynchronous workers (`a3c`, default architecture
# `hogwild`): the paper's settings — t_max = 5, one env per worker, forward-view n-step returns, entropy
# β = 0.01, η = 3e-3 (inside the paper's LogUniform(1e-4, 1e-2)) annealed to 0 — and the gradient norm
# clipped at 40, as in a3c's Atari preset (why: docs/architectures/hogwild.md#the-a3c-algorithm).
A3C_VARIANT: dict[str, Any] = dict(
    n_envs=1,
    rollout_len=5,
    gamma=0.99,
    gae_lambda=1.0,
    ent_coef=0.01,
    normalize_advantage=False,
    lr=3e-3,
    lr_anneal=True,
    max_grad_norm=40.0,
)

# Presets of `a3c`, on top of its variant.
A3C_PRESETS: dict[str, dict[str, Any]] = {
    # the paper's Atari settings: Mnih 2013 network, η = 7e-4 annealed over the run, gradients clipped at 40
    "atari": dict(lr=7e-4, encoder="mnih2013", max_grad_norm=40.0, total_steps=40_000_000),
    # MinAtar: the paper's Atari settings on the MinAtar paper's network
    "minatar": dict(lr=7e-4, encoder="minatar", max_grad_norm=40.0, total_steps=5_000_000),
    # the paper's recurrent agent for low-dimensional input: 128 LSTM cells after the encoder
    "lstm": dict(PRESETS["lstm"]),
    # the paper's continuous agent (separate 200-unit policy and value networks, σ² by softplus, β = 1e-4);
    # each worker steps its own 8 envs and updates as often as one a2c process does, so 2 workers make
    # twice the updates per global step: half the learning rate, over a longer run
    "continuous": dict(PRESETS["continuous"], lr=2.5e-4, total_steps=500_000),
}


class A2C:
    """Advantage actor-critic with a categorical or Gaussian policy and an optional LSTM core."""

    data = "rollout"
    action_spaces = POLICY_ACTIONS

    def __init__(
        self, cfg: Config, obs_space: gym.Space[Any], action_space: gym.Space[Any], seed: int = 0, device: str = "cpu"
    ):
        action_space = check_action_space(action_space, "a2c", self.action_spaces)
        check_action_mask(obs_space, action_space, "a2c")
        self.cfg = cfg
        image = has_image(obs_space)
        self.model = ActorCritic(
            obs_space,
            action_space,
            cfg.encoder,
            cfg.hidden,
            cfg.activation,
            shared=image or cfg.shared,
            log_std=cfg.log_std,
            init_std=cfg.init_std,
            lstm=cfg.lstm,
            sde=cfg.sde,
            ortho_init=cfg.ortho_init,
            net=cfg.net,
            net_kwargs=cfg.net_kwargs,
        )
        self.bounds = action_bounds(action_space)
        self.device = place(self, device)  # networks on the learner's device before the optimizer
        self.optimizer = make_optimizer(cfg.optimizer, self.model.parameters(), cfg.lr)
        self.params = list(self.model.parameters())
        self.rng = np.random.default_rng(seed)
        self.sde_matrices = SDEMatrices(cfg.sde_sample_freq, cfg.rollout_len)

    def act(
        self, obs: np.ndarray, state: Any = None, explore: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        draws = None
        if explore and self.model.sde:  # gSDE: this step's noise matrices, one per env
            noise = cast(SDEGaussianHead, self.model.policy).noise
            draws = self.sde_matrices.next(noise, obs_len(obs), self.rng)
        action, _, value, state = policy_step(self.model, obs, explore, self.rng, state, draws)
        assert value is not None  # the model has a critic
        extras = {"value": value}
        return to_env_actions(action, extras, self.bounds), extras, state

    def reset_state(self, state: State, done: np.ndarray) -> State:
        """The recurrent state with the envs in `done` (their episodes just ended) back at zeros."""
        return LSTMCore.reset(state, done)

    def value(self, obs: np.ndarray, state: Any = None) -> np.ndarray:
        return state_values(self.model, obs, state)

    def schedule(self, env_steps: int, total_steps: int) -> None:
        if self.cfg.lr_anneal:
            set_lr(self.optimizer, self.lr_at(env_steps, total_steps))

    def lr_at(self, env_steps: int, total_steps: int) -> float:
        """`lr`, annealed linearly to 0 over the run with `lr_anneal` (as the A3C paper does)."""
        return self.cfg.lr * max(0.0, 1.0 - env_steps / total_steps) if self.cfg.lr_anneal else self.cfg.lr

    def process(self, segment: Segment) -> Batch:
        d = segment.data
        adv, ret = gae(
            d.rew * self.cfg.reward_scale if self.cfg.reward_scale != 1.0 else d.rew,
            d.value,
            d.terminated,
            d.truncated,
            segment.last_value,
            self.cfg.gamma,
            self.cfg.gae_lambda,
            d.bootstrap,
        )
        batch = Batch(obs=d.obs, act=policy_actions(d), adv=adv, ret=ret)
        if self.model.core is None:
            return batch.flatten_leading(2)
        return sequence_batch(batch, d.starts, segment.initial_state, self.model.core)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        b = batch.to_torch(self.device)
        if self.model.core is None:
            dist, value = self.model(b.obs)
        else:
            dist, value, b = unroll_sequences(self.model, b)
        adv = b.adv
        if self.cfg.normalize_advantage and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        policy_loss = -(dist.log_prob(b.act) * adv).mean()
        value_loss = (b.ret - value).pow(2).mean()
        entropy = dist.entropy().mean()
        loss = policy_loss + self.cfg.vf_coef * value_loss - self.cfg.ent_coef * entropy
        metrics = {
            "policy_loss": metric(policy_loss),
            "value_loss": metric(value_loss),
            "entropy": metric(entropy),
        }
        return loss, metrics

    one_gradient = True
    """`update` is one optimizer step on the segment's loss."""

    def uneven_updates(self) -> str | None:
        return None  # one optimizer step per segment

    max_grad_norm = property(clip_norm)

    def update(self, segment: Segment) -> Metrics:
        loss, metrics = self.loss(self.process(segment))
        metrics["grad_norm"] = optimize(self.optimizer, loss, self.params, self.cfg.max_grad_norm)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "sde": self.sde_matrices.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        if "sde" in state:
            self.sde_matrices.load_state_dict(state["sde"])

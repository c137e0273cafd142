"""PPO: proximal policy optimisation with the clipped surrogate (Schulman et al. 2017).

Per segment: GAE(λ) advantages with the values recorded while acting, then `epochs` passes of
minibatch SGD on

    L = −E[min(ρ A, clip(ρ, 1 ± ε) A)] + vf_coef · E[(R − V)²] − ent_coef · E[H],   ρ = π/π_old,

with optional per-minibatch advantage normalisation and value clipping. Logged per update, as SB3 and CleanRL do:
`approx_kl` (the mean of (ρ − 1) − log ρ over the minibatches, an estimate of KL(π_old ‖ π)), `clip_fraction`
and the segment's `explained_variance` (1 − Var(R − V)/Var(R) of the values recorded while acting). With
`target_kl` > 0 a segment's epochs stop at the first minibatch whose `approx_kl` exceeds 1.5 × target_kl,
before its step (SB3's rule). Box actions get a diagonal
Gaussian policy (learned in [-1, 1], rescaled to the env's bounds; see `ActionBounds`), which explores with
independent noise or, with `sde`, with gSDE's state-dependent noise (`StateDependentNoise`). With `lstm` > 0
the minibatches are whole env sequences, replayed through the LSTM from the segment's initial state.
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
from rlfleet.algos.options import ACTIVATION, ENCODER, LOG_STD, NetOptions, SDEOptions
from rlfleet.algos.spaces import (
    POLICY_ACTIONS,
    action_bounds,
    check_action_mask,
    check_action_space,
    policy_actions,
    to_env_actions,
)
from rlfleet.algos.updates import (
    clip_norm,
    explained_variance,
    linear,
    minibatch_epochs,
    sequence_batch,
    unroll_sequences,
)
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
from rlfleet.optim.step import set_lr


@dataclass
class Config(NetOptions, NormOptions, SDEOptions):
    """PPO hyperparameters; the defaults solve CartPole-v1 (presets: atari, continuous, mujoco)."""

    n_envs: int = bounded(8, ge=1, le=MAX_ENVS)
    """Parallel envs stepped in lockstep by one process."""
    rollout_len: int = bounded(32, ge=1)
    """Steps per env per update."""
    gamma: float = bounded(0.98, ge=0, le=1)
    """Discount factor."""
    gae_lambda: float = bounded(0.8, ge=0, le=1)
    """GAE λ."""
    lr: float = bounded(1e-3, ge=0)
    """Learning rate (Adam)."""
    lr_anneal: bool = True
    """Anneal the learning rate linearly to 0 over the run's total steps."""
    epochs: int = bounded(10, ge=1)
    """Passes over each segment."""
    minibatch_size: int = bounded(64, ge=1)
    """Samples per gradient step (with `lstm`, rounded to whole sequences of `rollout_len` steps)."""
    clip: float = bounded(0.2, gt=0)
    """Surrogate clipping ε."""
    value_clip: float = bounded(0.0, ge=0)
    """Clip the value update to ± this around the old value (0 disables)."""
    ent_coef: float = bounded(0.0, ge=0)
    """Entropy bonus."""
    vf_coef: float = bounded(0.5, ge=0)
    """Weight of the value loss."""
    max_grad_norm: float = bounded(0.5, ge=0)
    """Global gradient-norm clip; 0 disables it."""
    target_kl: float = bounded(0.0, ge=0)
    """0: every epoch runs; else a segment's epochs stop at the first minibatch whose approx_kl exceeds 1.5 ×
    target_kl, before its step (SB3's rule; CleanRL checks once an epoch)."""
    normalize_advantage: bool = True
    """Standardise advantages per minibatch."""
    hidden: tuple[int, ...] = bounded((64, 64), ge=1, needs="net=")
    """Hidden layer sizes of the MLP encoder."""
    activation: str = checked("tanh", ACTIVATION, needs="net=")
    """MLP activation: tanh, relu or elu."""
    encoder: str = checked("auto", ENCODER, needs="net=")
    """auto (MLP for vectors, Nature CNN for images, MinAtar's under 36×36), mlp, mnih2013, nature or minatar."""
    lstm: int = bounded(0, ge=0)
    """0: feed-forward; N: an LSTM core of N cells after the encoder, shared by policy and value."""
    log_std: str = checked("state_independent", LOG_STD, needs="sde=False")
    """Box actions: the Gaussian's σ — state_independent, state_dependent or softplus (see `GaussianHead`)."""
    init_std: float = bounded(1.0, gt=0)
    """Box actions: σ at initialisation, in units of half the action range (with `sde`: σ of each entry of the
    noise matrix)."""
    ortho_init: bool = True
    """Orthogonal initialisation of the layers (gains √2, 0.01 for the policy's output, 1 for the value's); False:
    PyTorch's default initialisation, as Stable-Baselines3's `ortho_init=False` (σ keeps `init_std`)."""
    total_steps: int = bounded(100_000, ge=1)
    """Default training budget in env steps."""


PRESETS: dict[str, dict[str, Any]] = {
    "atari": dict(
        n_envs=8,
        rollout_len=128,
        gamma=0.99,
        gae_lambda=0.95,
        lr=2.5e-4,
        epochs=4,
        minibatch_size=256,
        clip=0.1,
        value_clip=0.1,
        ent_coef=0.01,
        total_steps=10_000_000,
    ),
    # MinAtar (Young & Tian 2019): the settings of pgx's MinAtar PPO example (Koyamada et al. 2023, after
    # PureJaxRL): 128-step segments, 3 epochs, clip 0.2, entropy 0.01, Adam 3e-4, gradient norm 0.5, with 8 envs
    # and minibatches of 256 where it steps 4,096 envs on an accelerator; the MinAtar paper's network; the learning
    # rate annealed to 0 over the run (rlfleet's PPO default), where pgx keeps it constant.
    # Measured: docs/minatar.md.
    "minatar": dict(
        n_envs=8,
        rollout_len=128,
        gamma=0.99,
        gae_lambda=0.95,
        lr=3e-4,
        epochs=3,
        minibatch_size=256,
        clip=0.2,
        value_clip=0.0,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        encoder="minatar",
        total_steps=10_000_000,
    ),
    # low-dimensional continuous control (Box actions): long segments, γ = 0.9, a state-independent log σ,
    # rewards scaled by the running std of the discounted return (measured: docs/algorithms.md, "Measured")
    "continuous": dict(
        reward_norm=True,
        n_envs=8,
        rollout_len=256,
        gamma=0.9,
        gae_lambda=0.95,
        lr=1e-3,
        epochs=10,
        minibatch_size=256,
        log_std="state_independent",
        total_steps=150_000,
    ),
    # MuJoCo locomotion and balance (picked automatically for MuJoCo envs): the settings of rl-zoo3 and
    # CleanRL's ppo_continuous_action — one env, 2,048-step segments, 10 epochs of 64-sample minibatches,
    # Adam 3e-4 annealed to 0, γ = 0.99, λ = 0.95, a state-independent log σ starting at σ = 1 (in units of
    # half the action range), observations normalised by running statistics and rewards scaled by the
    # running std of the discounted return (CleanRL's NormalizeObservation and NormalizeReward wrappers); no
    # value clipping, as in rl-zoo3 (CleanRL clips the value at ±0.2)
    "mujoco": dict(
        obs_norm=True,
        reward_norm=True,
        n_envs=1,
        rollout_len=2048,
        gamma=0.99,
        gae_lambda=0.95,
        lr=3e-4,
        lr_anneal=True,
        epochs=10,
        minibatch_size=64,
        clip=0.2,
        value_clip=0.0,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        normalize_advantage=True,
        hidden=(64, 64),
        activation="tanh",
        log_std="state_independent",
        init_std=1.0,
        total_steps=1_000_000,
    ),
}


class PPO:
    """Clipped-surrogate PPO with a categorical or Gaussian policy and an optional LSTM core."""

    data = "rollout"
    action_spaces = POLICY_ACTIONS

    def __init__(
        self, cfg: Config, obs_space: gym.Space[Any], action_space: gym.Space[Any], seed: int = 0, device: str = "cpu"
    ):
        action_space = check_action_space(action_space, "ppo", self.action_spaces)
        check_action_mask(obs_space, action_space, "ppo")
        if cfg.minibatch_size < 1 or cfg.epochs < 1:
            raise ValueError("minibatch_size and epochs must be >= 1")
        self.cfg = cfg
        image = has_image(obs_space)
        self.model = ActorCritic(
            obs_space,
            action_space,
            cfg.encoder,
            cfg.hidden,
            cfg.activation,
            shared=image,
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
        self.optimizer = make_optimizer("adam", self.model.parameters(), cfg.lr)
        self.params = list(self.model.parameters())
        self.rng = np.random.default_rng(seed)
        self.sde_matrices = SDEMatrices(cfg.sde_sample_freq, cfg.rollout_len)
        self.clip = cfg.clip

    def act(
        self, obs: np.ndarray, state: Any = None, explore: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        draws = None
        if explore and self.model.sde:  # gSDE: this step's noise matrices, one per env
            noise = cast(SDEGaussianHead, self.model.policy).noise
            draws = self.sde_matrices.next(noise, obs_len(obs), self.rng)
        action, logp, value, state = policy_step(self.model, obs, explore, self.rng, state, draws)
        assert value is not None  # the model has a critic
        extras = {"value": value, "logp": logp.astype(np.float32)}
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
        """`lr`, annealed linearly to 0 over the run with `lr_anneal`."""
        return linear(self.cfg.lr, 0.0, total_steps, env_steps) if self.cfg.lr_anneal else self.cfg.lr

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
        batch = Batch(obs=d.obs, act=policy_actions(d), logp=d.logp, value=d.value, adv=adv, ret=ret)
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
        log_ratio = dist.log_prob(b.act) - b.logp
        ratio = log_ratio.exp()
        surrogate = torch.min(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
        policy_loss = -surrogate.mean()
        if self.cfg.value_clip > 0:
            clipped = b.value + (value - b.value).clamp(-self.cfg.value_clip, self.cfg.value_clip)
            value_loss = torch.max((b.ret - value).pow(2), (b.ret - clipped).pow(2)).mean()
        else:
            value_loss = (b.ret - value).pow(2).mean()
        entropy = dist.entropy().mean()
        loss = policy_loss + self.cfg.vf_coef * value_loss - self.cfg.ent_coef * entropy
        with torch.no_grad():
            clip_frac = metric(((ratio - 1).abs() > self.clip).float().mean())
            approx_kl = metric(((ratio - 1) - log_ratio).mean())
        metrics = {
            "policy_loss": metric(policy_loss),
            "value_loss": metric(value_loss),
            "entropy": metric(entropy),
            "clip_fraction": clip_frac,
            "approx_kl": approx_kl,
        }
        return loss, metrics

    max_grad_norm = property(clip_norm)

    @property
    def one_gradient(self) -> bool:
        """`update` is one optimizer step on the segment's loss only with one epoch of one minibatch."""
        return self.cfg.epochs == 1 and self.cfg.minibatch_size >= self.cfg.rollout_len * self.cfg.n_envs

    def uneven_updates(self) -> str | None:
        if self.cfg.target_kl <= 0:
            return None
        return f"target_kl={self.cfg.target_kl} stops each learner's epochs at its own minibatch: use --set target_kl=0"

    def update(self, segment: Segment) -> dict[str, float]:
        batch = self.process(segment)
        size = self.cfg.minibatch_size
        if self.model.core is not None:  # the batch is N sequences of rollout_len steps
            size = max(1, size // self.cfg.rollout_len)
        stop_kl = 1.5 * self.cfg.target_kl if self.cfg.target_kl > 0 else None
        metrics = minibatch_epochs(self, batch, self.cfg.epochs, size, self.rng, stop_kl=stop_kl)
        metrics["explained_variance"] = explained_variance(batch.value, batch.ret)
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

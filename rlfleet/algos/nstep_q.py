"""One-step Q, one-step Sarsa and n-step Q (Mnih et al. 2016, Algorithms 1 and S2): value learning on short
on-policy segments with a target network and no replay.

Every env acts ε-greedily with its own final ε (drawn from {0.1, 0.01, 0.5} w.p. {0.4, 0.3, 0.3},
annealed from 1); after a segment of `rollout_len` steps (the paper's t_max / I_AsyncUpdate) from each of
the N envs, one gradient step is taken on the mean of (y − Q(s, a))² over the segment's T·N steps, with

    one-step Q:      y_t = r_t + γ max_a' Q⁻(s_{t+1}, a')
    one-step Sarsa:  y_t = r_t + γ Q⁻(s_{t+1}, a_{t+1})          (a_{t+1} the action taken next)
    n-step Q:        y_t = r_t + γ r_{t+1} + … + γ^{k−1} r_{t+k−1} + γ^k max_a' Q⁻(s_{t+k}, a')
                     (s_{t+k} the observation after the segment: the longest return inside it)

The paper accumulates the sum, dθ += ∂(y − Q)²/∂θ; with a fixed segment size the mean differs from it by
the constant factor 1/(T·N), which the learning rate (and `max_grad_norm`) absorbs.

Terminations bootstrap 0, time-limit truncations bootstrap from the final observation. For Sarsa the
action after the segment's last step is drawn from the same ε-greedy policy. The three variants are
registered as `onestep_q`, `sarsa` and `nstep_q`; on the `hogwild` architecture they are the paper's
asynchronous methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch

from rlfleet.algos.acting import epsilon_greedy, q_values, sample_final_epsilons
from rlfleet.algos.contract import Metrics
from rlfleet.algos.options import ACTIVATION, ENCODER, OPTIMIZER, NetOptions
from rlfleet.algos.spaces import DISCRETE_ACTIONS, check_action_mask, check_action_space
from rlfleet.algos.updates import SyncClock, clip_norm, hard_update, linear
from rlfleet.data.batch import Batch, map_obs
from rlfleet.data.returns import discounted_returns, td_targets
from rlfleet.data.rollout import Segment
from rlfleet.device import metric, place
from rlfleet.envs.normalize import NormOptions
from rlfleet.fields import MAX_ENVS, NAMES_ALGORITHM, bounded, checked, one_of
from rlfleet.nets.heads import action_mask_of, masked_logits
from rlfleet.nets.models import QNetwork
from rlfleet.nets.user import target_copy
from rlfleet.optim.make import make_optimizer
from rlfleet.optim.step import optimize, set_lr

TARGETS = ("onestep_q", "sarsa", "nstep_q")


@dataclass
class Config(NetOptions, NormOptions):
    """Hyperparameters of the A3C paper's value-based methods; the defaults solve CartPole-v1."""

    target: str = checked("nstep_q", one_of(TARGETS), **{NAMES_ALGORITHM: True})
    """onestep_q, sarsa or nstep_q."""
    n_envs: int = bounded(8, ge=1, le=MAX_ENVS)
    """Parallel envs (each with its own final ε)."""
    rollout_len: int = bounded(5, ge=1)
    """Steps per env between updates: t_max for n-step Q, I_AsyncUpdate for the one-step methods."""
    gamma: float = bounded(0.99, ge=0, le=1)
    """Discount factor."""
    lr: float = bounded(1e-3, ge=0)
    """Learning rate."""
    lr_anneal: bool = False
    """Anneal the learning rate linearly to 0 over the run (the paper does)."""
    optimizer: str = checked("adam", OPTIMIZER)
    """adam, rmsprop or sgd."""
    target_update_every: int = bounded(1_000, ge=1)
    """Env steps between target-network copies (paper: 40,000 frames)."""
    eps_start: float = bounded(1.0, ge=0, le=1)
    """Initial ε of every env."""
    eps_final_choices: tuple[float, ...] = bounded((0.1, 0.01, 0.5), ge=0, le=1)
    """Final ε values an env can draw (paper: 0.1, 0.01, 0.5)."""
    eps_final_probs: tuple[float, ...] = bounded((0.4, 0.3, 0.3), ge=0, le=1)
    """Probabilities of those values (paper: 0.4, 0.3, 0.3)."""
    eps_anneal_steps: int = bounded(10_000, ge=0)
    """Env steps over which ε decays from eps_start to each env's final ε (paper: 4M frames)."""
    max_grad_norm: float = bounded(10.0, ge=0)
    """Global gradient-norm clip; 0 disables it."""
    hidden: tuple[int, ...] = bounded((128, 128), ge=1, needs="net=")
    """Hidden layer sizes of the MLP encoder."""
    activation: str = checked("relu", ACTIVATION, needs="net=")
    """MLP activation."""
    dueling: bool = False
    """Dueling value/advantage head."""
    encoder: str = checked("auto", ENCODER, needs="net=")
    """auto (MLP for vectors, Nature CNN for images, MinAtar's under 36×36), mlp, mnih2013, nature or minatar."""
    total_steps: int = bounded(200_000, ge=1)
    """Default training budget in env steps."""


# The paper's Atari setup: 16 actor-learners, t_max = 5, RMSProp with the learning rate annealed to 0, the
# Mnih 2013 network; the shared target network every 40,000 frames and ε annealed over the first 4M frames,
# here in env steps (each is ATARI_FRAME_SKIP = 4 frames): 10,000 and 1,000,000
PRESETS: dict[str, dict[str, Any]] = {
    "atari": dict(
        n_envs=16,
        rollout_len=5,
        lr=7e-4,
        optimizer="rmsprop",
        lr_anneal=True,
        target_update_every=10_000,
        eps_anneal_steps=1_000_000,
        encoder="mnih2013",
        total_steps=10_000_000,
    ),
}
# MinAtar: the Atari settings on the MinAtar paper's network, ε annealed over the MinAtar paper's 100k steps
PRESETS["minatar"] = dict(PRESETS["atari"], eps_anneal_steps=100_000, encoder="minatar", total_steps=5_000_000)


class NStepQ:
    """Segment-based Q-learning / Sarsa with a target network and per-env ε."""

    data = "rollout"
    action_spaces = DISCRETE_ACTIONS

    def __init__(
        self, cfg: Config, obs_space: gym.Space[Any], action_space: gym.Space[Any], seed: int = 0, device: str = "cpu"
    ):
        if cfg.target not in TARGETS:
            raise ValueError(f"unknown target {cfg.target!r}; choose one of {TARGETS}")
        discrete = cast(gym.spaces.Discrete, check_action_space(action_space, cfg.target, self.action_spaces))
        check_action_mask(obs_space, action_space, cfg.target)
        self.cfg = cfg
        self.q = QNetwork(
            obs_space,
            int(discrete.n),
            cfg.encoder,
            cfg.hidden,
            cfg.activation,
            cfg.dueling,
            net=cfg.net,
            net_kwargs=cfg.net_kwargs,
        )
        self.q_target = target_copy(self.q)
        self.target_clock = SyncClock(cfg.target_update_every)
        self.device = place(self, device)  # networks on the learner's device before the optimizer
        self.optimizer = make_optimizer(cfg.optimizer, self.q.parameters(), cfg.lr)
        self.params = list(self.q.parameters())
        self.rng = np.random.default_rng(seed)
        self.eps_final = sample_final_epsilons(cfg.n_envs, cfg.eps_final_choices, cfg.eps_final_probs, self.rng)
        self.eps = np.full(cfg.n_envs, cfg.eps_start)

    def act(
        self, obs: np.ndarray, state: Any = None, explore: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        eps = self.eps if explore else 0.0
        return epsilon_greedy(q_values(self.q, obs), eps, self.rng, action_mask_of(obs)), {}, state

    def _target_values(self, obs: np.ndarray, actions: np.ndarray | None = None) -> np.ndarray:
        """Q⁻ of observations at `actions`, or its max over each one's legal actions (all, without a mask)."""
        q = q_values(self.q_target, obs)
        legal = masked_logits(q, action_mask_of(obs))
        values: np.ndarray = legal.max(-1) if actions is None else q[np.arange(len(q)), actions]
        return values

    def value(self, obs: np.ndarray, state: Any = None) -> np.ndarray:
        """Bootstrap value of observations (one per env): max_a Q⁻, or Q⁻ at an ε-greedy action for Sarsa."""
        if self.cfg.target == "sarsa":
            actions, _, _ = self.act(obs)
            return self._target_values(obs, actions)
        return self._target_values(obs)

    def schedule(self, env_steps: int, total_steps: int) -> None:
        c = self.cfg
        frac = min(1.0, env_steps / c.eps_anneal_steps) if c.eps_anneal_steps > 0 else 1.0
        self.eps = c.eps_start + (self.eps_final - c.eps_start) * frac
        if c.lr_anneal:
            set_lr(self.optimizer, self.lr_at(env_steps, total_steps))
        if self.target_clock.due(env_steps):  # every `target_update_every` global steps
            hard_update(self.q_target, self.q)

    def process(self, segment: Segment) -> Batch:
        d, c = segment.data, self.cfg
        if c.target == "nstep_q":
            y = discounted_returns(d.rew, d.terminated, d.truncated, segment.last_value, c.gamma, d.bootstrap)
        else:
            flat_obs = map_obs(lambda x: x.reshape(-1, *x.shape[2:]), d.obs)
            actions = d.act.reshape(-1) if c.target == "sarsa" else None
            values = self._target_values(flat_obs, actions).reshape(d.rew.shape)
            y = td_targets(d.rew, values, d.terminated, d.truncated, segment.last_value, c.gamma, d.bootstrap)
        return Batch(obs=d.obs, act=d.act, target=y).flatten_leading(2)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        b = batch.to_torch(self.device)
        q = self.q(b.obs).gather(1, b.act.long().unsqueeze(1)).squeeze(1)
        loss = (b.target - q).pow(2).mean()
        return loss, {"loss": metric(loss), "q": metric(q.mean()), "epsilon": float(np.mean(self.eps))}

    one_gradient = True
    """`update` is one optimizer step on the segment's loss."""

    def uneven_updates(self) -> str | None:
        return None  # one optimizer step per segment

    def lr_at(self, env_steps: int, total_steps: int) -> float:
        """`lr`, annealed linearly to 0 over the run with `lr_anneal` (as the A3C paper does)."""
        return linear(self.cfg.lr, 0.0, total_steps, env_steps) if self.cfg.lr_anneal else self.cfg.lr

    max_grad_norm = property(clip_norm)

    def update(self, segment: Segment) -> Metrics:
        loss, metrics = self.loss(self.process(segment))
        metrics["grad_norm"] = optimize(self.optimizer, loss, self.params, self.cfg.max_grad_norm)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "q": self.q.state_dict(),
            "q_target": self.q_target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "eps_final": torch.as_tensor(self.eps_final),
            "target_clock": self.target_clock.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.eps_final = state["eps_final"].numpy()
        self.target_clock.load_state_dict(state["target_clock"])

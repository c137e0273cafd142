"""DQN with its common extensions: target network, n-step returns, Double Q, Dueling, prioritized replay.

Transitions from N envs go into a replay buffer; every `train_freq` vector steps the learner takes
`gradient_steps` minibatches and regresses Q(s, a) on

    y = R^(n) + γ^k (1 − terminated) Q_target(s', argmax_a' Q(s', a'))   (Double DQN)

with the Huber loss, weighted by importance weights under prioritized replay; |y − Q| are the new
priorities. The target network is a hard copy refreshed every `target_update_every` gradient steps.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from rlfleet.algos.common import (
    epsilon_greedy,
    hard_update,
    linear,
    make_optimizer,
    optimize,
    q_values,
    require_discrete,
)
from rlfleet.data.batch import Batch
from rlfleet.data.buffer import PrioritizedReplayBuffer, ReplayBuffer
from rlfleet.envs.normalize import ObsNormOptions
from rlfleet.nets.models import QNetwork


@dataclass
class Config(ObsNormOptions):
    """DQN hyperparameters; the defaults (double + dueling + prioritized, 3-step) solve CartPole-v1."""

    n_envs: int = 4
    """Parallel envs stepped in lockstep by one process."""
    buffer_size: int = 50_000
    """Replay capacity in transitions."""
    batch_size: int = 64
    """Minibatch size."""
    learning_starts: int = 1_000
    """Env steps collected before the first update."""
    train_freq: int = 16
    """Vector-env steps between training phases."""
    gradient_steps: int = 16
    """Gradient steps per training phase."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 3
    """Steps of real reward before bootstrapping."""
    lr: float = 1e-3
    """Learning rate (Adam)."""
    target_update_every: int = 100
    """Gradient steps between hard target-network copies."""
    double: bool = True
    """Double Q-learning: the online net picks the next action, the target net evaluates it."""
    dueling: bool = True
    """Dueling value/advantage head."""
    prioritized: bool = True
    """Prioritized replay (proportional)."""
    alpha: float = 0.6
    """Priority exponent."""
    beta: float = 0.4
    """Initial importance-sampling exponent, annealed to 1 over the run."""
    eps_start: float = 1.0
    """Initial exploration rate."""
    eps_final: float = 0.05
    """Final exploration rate."""
    eps_anneal_steps: int = 10_000
    """Env steps over which ε decays linearly."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip; 0 disables it."""
    hidden: tuple[int, ...] = (128, 128)
    """Hidden layer sizes of the MLP encoder."""
    activation: str = "relu"
    """MLP activation."""
    encoder: str = "auto"
    """auto (MLP for vectors, Nature CNN for images), mlp, mnih2013 or nature."""
    total_steps: int = 100_000
    """Default training budget in env steps."""


PRESETS = {
    "atari": dict(
        n_envs=4,
        buffer_size=100_000,
        batch_size=32,
        learning_starts=20_000,
        train_freq=1,
        gradient_steps=1,
        lr=1e-4,
        target_update_every=2_000,
        eps_final=0.01,
        eps_anneal_steps=250_000,
        encoder="nature",
        total_steps=10_000_000,
    ),
}


class DQN:
    """Deep Q-network over a replay buffer."""

    data = "replay"

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space, seed: int = 0):
        require_discrete(action_space, "dqn")
        if cfg.target_update_every < 1 or cfg.batch_size < 1:
            raise ValueError("target_update_every and batch_size must be >= 1")
        self.cfg = cfg
        self.q = QNetwork(obs_space, int(action_space.n), cfg.encoder, cfg.hidden, cfg.activation, cfg.dueling)
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        self.optimizer = make_optimizer("adam", self.q.parameters(), cfg.lr)
        self.params = list(self.q.parameters())
        self.rng = np.random.default_rng(seed)
        self.eps = cfg.eps_start
        self.updates = 0

    def make_buffer(self, n_envs: int, total_steps: int, seed: int = 0) -> ReplayBuffer:
        common = dict(capacity=self.cfg.buffer_size, n_envs=n_envs, n_step=self.cfg.n_step, gamma=self.cfg.gamma)
        if not self.cfg.prioritized:
            return ReplayBuffer(**common, seed=seed)
        updates = max(1, (total_steps - self.cfg.learning_starts) // (self.cfg.train_freq * n_envs))
        return PrioritizedReplayBuffer(
            **common,
            alpha=self.cfg.alpha,
            beta=self.cfg.beta,
            beta_final=1.0,
            beta_anneal_steps=updates * self.cfg.gradient_steps,
            seed=seed,
        )

    def act(self, obs: np.ndarray, state=None, explore: bool = True):
        eps = self.eps if explore else 0.0
        return epsilon_greedy(q_values(self.q, obs), eps, self.rng), {}, state

    def schedule(self, env_steps: int, total_steps: int) -> None:
        self.eps = linear(self.cfg.eps_start, self.cfg.eps_final, self.cfg.eps_anneal_steps, env_steps)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float], np.ndarray]:
        b = batch.to_torch()
        n = len(b.act)
        if self.cfg.double:  # one pass of the online net over s and s' (it picks the next action)
            q_all = self.q(torch.cat([b.obs, b.next_obs]))
            q_next_online = q_all[n:].detach()
        else:
            q_all = self.q(b.obs)
        q = q_all[:n].gather(1, b.act.long().unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_q_target = self.q_target(b.next_obs)
            if self.cfg.double:
                next_v = next_q_target.gather(1, q_next_online.argmax(1, keepdim=True)).squeeze(1)
            else:
                next_v = next_q_target.max(1).values
            y = b.rew + b.discount * (1.0 - b.terminated.float()) * next_v
        td = y - q
        loss = (b.weight * F.smooth_l1_loss(q, y, reduction="none")).mean()
        metrics = {"loss": loss.item(), "q": q.mean().item(), "epsilon": self.eps}
        return loss, metrics, td.detach().abs().numpy()

    def update(self, batch: Batch) -> dict:
        loss, metrics, td_abs = self.loss(batch)
        metrics["grad_norm"] = optimize(self.optimizer, loss, self.params, self.cfg.max_grad_norm)
        self.updates += 1
        if self.updates % self.cfg.target_update_every == 0:
            hard_update(self.q_target, self.q)
        metrics["priorities"] = td_abs
        return metrics

    def state_dict(self) -> dict:
        return {
            "q": self.q.state_dict(),
            "q_target": self.q_target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.updates = int(state["updates"])

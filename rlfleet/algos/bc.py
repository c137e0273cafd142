"""BC: behaviour cloning — supervised learning of an expert's actions from demonstrations (imitation).

The policy is an `ActorCritic` without a critic. For Discrete actions it is a classifier trained with
cross-entropy, −E[log π(a_expert|s)]; for Box actions its Gaussian mean is regressed with the MSE
E[‖μ(s) − a‖²] onto the expert's actions mapped into the policy's normalised space (the inverse of `ActionBounds`:
[low, high] ↦ [−1, 1]), so acting rescales μ back to the bounds exactly as the RL agents do. Acting is
always greedy (argmax, or the mean): a cloned policy has no exploration of its own.

BC learns from a fixed dataset (`data = "dataset"`) on the `offline` architecture, where `total_steps`
counts gradient steps; with an expert checkpoint that runner also does DAgger (`dagger_*` fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlfleet.algos.acting import policy_step
from rlfleet.algos.contract import Metrics
from rlfleet.algos.options import ACTIVATION, ENCODER, NetOptions
from rlfleet.algos.spaces import action_bounds, check_action_mask, check_action_space, to_env_actions
from rlfleet.algos.updates import linear
from rlfleet.data.batch import Batch
from rlfleet.device import metric, place
from rlfleet.fields import bounded, checked
from rlfleet.nets.models import ActorCritic
from rlfleet.optim.make import make_optimizer
from rlfleet.optim.step import optimize, set_lr


@dataclass
class Config(NetOptions):
    """BC hyperparameters; the defaults clone a CartPole-v1 expert from 20 episodes."""

    batch_size: int = bounded(64, ge=1)
    """Demonstrations per gradient step (drawn without replacement, reshuffled every epoch)."""
    lr: float = bounded(1e-3, ge=0)
    """Learning rate (Adam)."""
    lr_anneal: bool = False
    """Anneal the learning rate linearly to 0 over the run's gradient steps."""
    weight_decay: float = bounded(0.0, ge=0)
    """Adam's L2 weight decay."""
    max_grad_norm: float = bounded(1.0, ge=0)
    """Global gradient-norm clip; 0 disables it."""
    hidden: tuple[int, ...] = bounded((64, 64), ge=1, needs="net=")
    """Hidden layer sizes of the MLP encoder."""
    activation: str = checked("tanh", ACTIVATION, needs="net=")
    """MLP activation: tanh, relu or elu."""
    encoder: str = checked("auto", ENCODER, needs="net=")
    """auto (MLP for vectors, Nature CNN for images, MinAtar's under 36×36), mlp, mnih2013, nature or minatar."""
    total_steps: int = bounded(5_000, ge=1)
    """Default budget in gradient steps (the offline runner counts gradient steps, not env steps)."""
    dagger_iterations: int = bounded(4, ge=0)
    """With an expert (`--expert`): DAgger rounds. The budget is split into `dagger_iterations` + 1 equal
    phases; after each phase but the last the learner runs `dagger_episodes` episodes, the expert labels
    every state visited, and those pairs join the training data."""
    dagger_episodes: int = bounded(10, ge=1)
    """With an expert: learner episodes per DAgger round (run side by side, greedily)."""


PRESETS: dict[str, dict[str, Any]] = {}


class BC:
    """Behaviour cloning: a classifier (Discrete) or regressor in [-1, 1] (Box) of the demonstrated actions."""

    data = "dataset"
    action_spaces = ("Discrete", "Box")

    def __init__(
        self, cfg: Config, obs_space: gym.Space[Any], action_space: gym.Space[Any], seed: int = 0, device: str = "cpu"
    ):
        action_space = check_action_space(action_space, "bc", self.action_spaces)
        check_action_mask(obs_space, action_space, "bc")
        self.cfg = cfg
        self.model = ActorCritic(
            obs_space,
            action_space,
            cfg.encoder,
            cfg.hidden,
            cfg.activation,
            critic=False,
            net=cfg.net,
            net_kwargs=cfg.net_kwargs,
        )
        self.bounds = action_bounds(action_space)
        self.device = place(self, device)  # networks on the learner's device before the optimizer
        self.optimizer = make_optimizer("adam", self.model.parameters(), cfg.lr, weight_decay=cfg.weight_decay)
        self.params = list(self.model.parameters())
        self.rng = np.random.default_rng(seed)

    def act(
        self, obs: np.ndarray, state: Any = None, explore: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        """Greedy actions whatever `explore` says (argmax, or the Gaussian mean rescaled to the bounds)."""
        action, _, _, state = policy_step(self.model, obs, False, self.rng, state)
        return to_env_actions(action, {}, self.bounds), {}, state

    def schedule(self, steps: int, total_steps: int) -> None:
        if self.cfg.lr_anneal:
            set_lr(self.optimizer, linear(self.cfg.lr, 0.0, total_steps, steps))

    def process(self, demos: Batch) -> Batch:
        """Demonstrations (`obs`, env actions `act`) as training data: class indices, or targets in [-1, 1]."""
        if self.bounds is None:
            return Batch(obs=demos.obs, act=np.asarray(demos.act, dtype=np.int64))
        b = self.bounds  # the inverse of acting's rescaling: [low, high] ↦ [-1, 1]
        act = np.clip(np.asarray(demos.act, dtype=np.float32), b.low, b.high)
        return Batch(obs=demos.obs, act=((act - b.offset) / b.scale).astype(np.float32))

    def loss(self, batch: Batch) -> tuple[torch.Tensor, Metrics]:
        b = batch.to_torch(self.device)
        dist, _ = self.model(b.obs)
        if self.bounds is not None:
            loss = (dist.mean - b.act).pow(2).sum(-1).mean()
            return loss, {"mse": metric(loss)}
        loss = -dist.log_prob(b.act).mean()
        with torch.no_grad():
            accuracy = metric((dist.logits.argmax(-1) == b.act).float().mean())
        return loss, {"cross_entropy": metric(loss), "accuracy": accuracy}

    def update(self, batch: Batch) -> Metrics:
        """One gradient step on a minibatch of processed demonstrations."""
        loss, metrics = self.loss(batch)
        metrics["grad_norm"] = optimize(self.optimizer, loss, self.params, self.cfg.max_grad_norm)
        return metrics

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

"""SAC: soft actor-critic (Haarnoja et al. 2018, with the automatic temperature of the follow-up paper).

A tanh-squashed Gaussian policy a = tanh(μ(s) + σ(s) ε) in [-1, 1] (rescaled to the env's bounds by
`ActionBounds`; with `sde`, exploring with gSDE's state-dependent noise, `StateDependentNoise`) acts after a
warm-up of uniform random actions; every `train_freq` env steps the learner takes `gradient_steps` replay
minibatches and

- regresses twin critics on y = r + γ (1 − terminated) (min_k Q'_k(s', a') − α log π(a'|s')), a' ~ π(·|s'),
- minimises the policy loss E[α log π(a|s) − min_k Q_k(s, a)] with reparameterised a ~ π(·|s), where
  log π includes the tanh correction −Σ log(1 − tanh(u)²) (`squashed_gaussian_log_prob`),
- tunes α by descending −log α · (log π(a|s) + H̄), H̄ = −target_entropy_scale · |A| (or keeps α fixed),
- moves the target critics toward the online ones: θ' ← (1 − τ) θ' + τ θ.

The three are updated in the order of the paper's Algorithm 1 (Haarnoja et al. 2018b): a critic step, then
a policy step whose loss reads the critics as that step left them (through detached weights: its gradient
reaches the policy only), then an α step on log π of fresh actions from the updated policy; α is the
pre-update constant in the critic and policy losses. (The original implementation computes all three
gradients from the pre-update parameters at once.) One Adam holds the parameter groups; each step moves
only the network that has gradients. a' ~ π(·|s') for the target is sampled without a graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlfleet.algos.acting import uniform_actions
from rlfleet.algos.contract import Metrics
from rlfleet.algos.noise import SDEMatrices
from rlfleet.algos.options import ACTIVATION, ActorCriticNetOptions, ReplayOptions
from rlfleet.algos.spaces import BOX_ACTIONS, ActionBounds, check_action_mask, check_action_space, to_env_actions
from rlfleet.algos.updates import soft_update
from rlfleet.cuda_graph import StepGraph
from rlfleet.data.batch import Batch, obs_len
from rlfleet.data.buffer import ReplayBuffer
from rlfleet.device import acting, place
from rlfleet.envs.normalize import NormOptions
from rlfleet.fields import NEEDS, bounded, checked
from rlfleet.nets.continuous import QEnsemble, SquashedGaussianActor
from rlfleet.nets.user import target_copy
from rlfleet.optim.make import make_optimizer
from rlfleet.optim.step import optimize


@dataclass
class Config(ActorCriticNetOptions, NormOptions, ReplayOptions):
    """SAC hyperparameters; the defaults solve Pendulum-v1 (greedy mean ≥ −250) in ~4k env steps (preset: mujoco)."""

    tau: float = bounded(0.01, gt=0, le=1)
    """Polyak rate of the target critics: θ' ← (1 − τ) θ' + τ θ after every update."""
    actor_lr: float = bounded(1e-3, ge=0)
    """Learning rate of the policy (Adam)."""
    critic_lr: float = bounded(1e-3, ge=0)
    """Learning rate of the twin critics (Adam)."""
    alpha: float = bounded(0.2, gt=0)
    """Entropy temperature α: its initial value with `auto_alpha`, else the fixed value."""
    auto_alpha: bool = True
    """Tune α so that the policy's entropy tracks the target (False: keep `alpha` fixed)."""
    alpha_lr: float = bounded(1e-3, ge=0, needs="auto_alpha")
    """Learning rate of log α (Adam)."""
    target_entropy_scale: float = field(default=1.0, metadata={NEEDS: "auto_alpha"})
    """The target entropy is −target_entropy_scale · |A| nats (the paper's heuristic: −|A|)."""
    sde: bool = False
    """Explore with generalized state-dependent exploration (gSDE, Raffin et al. 2021): the noise before the
    squashing is a function of the policy's features, θᵀ z(s), with the matrix θ drawn anew every
    `sde_sample_freq` steps (see `StateDependentNoise`), instead of independent noise at every step."""
    sde_sample_freq: int = bounded(-1, ge=-1, needs="sde")
    """gSDE: vector-env steps between new noise matrices; -1 or 0: at the start of each collection of
    `train_freq` steps (Stable-Baselines3's SAC resamples there whatever this is)."""
    sde_init_std: float = bounded(0.05, gt=0, needs="sde")
    """gSDE: σ of each entry of the noise matrix at initialisation (Stable-Baselines3's exp(log_std_init); its
    default for SAC is exp(−3) ≈ 0.05)."""
    hidden: tuple[int, ...] = bounded((64, 64), ge=1)
    """Hidden layer sizes of the policy and the critic MLPs."""
    activation: str = checked("relu", ACTIVATION)
    """MLP activation: relu, tanh or elu."""
    total_steps: int = bounded(50_000, ge=1)
    """Default training budget in env steps."""


# MuJoCo locomotion (picked automatically for MuJoCo envs): rl-zoo3's SAC settings (Stable-Baselines3's defaults
# and 10k random steps first) — replay of 1M transitions, minibatches of 256, Adam 3e-4, γ = 0.99, τ = 0.005,
# 256-256 ReLU MLPs, α tuned toward −|A| nats from 1 (SB3's `ent_coef="auto"`; CleanRL's log α = 0 too);
# observations are not normalised. (CleanRL's differ in its critic's lr 1e-3, a policy step every 2nd update and
# 5k random steps.)
PRESETS: dict[str, dict[str, Any]] = {
    "mujoco": dict(
        n_envs=1,
        buffer_size=1_000_000,
        batch_size=256,
        learning_starts=10_000,
        random_steps=10_000,
        train_freq=1,
        gradient_steps=1,
        gamma=0.99,
        n_step=1,
        tau=0.005,
        hidden=(256, 256),
        activation="relu",
        actor_lr=3e-4,
        critic_lr=3e-4,
        alpha=1.0,
        alpha_lr=3e-4,
        auto_alpha=True,
        total_steps=1_000_000,
    ),
}


class SAC:
    """Squashed Gaussian policy, twin Q(s, a) critics with Polyak targets and a tuned temperature, over replay."""

    data = "replay"
    action_spaces = BOX_ACTIONS

    def __init__(
        self, cfg: Config, obs_space: gym.Space[Any], action_space: gym.Space[Any], seed: int = 0, device: str = "cpu"
    ):
        box = cast(gym.spaces.Box, check_action_space(action_space, "sac", self.action_spaces))
        check_action_mask(obs_space, action_space, "sac")
        self.act_dim = int(box.shape[0])
        obs_dim = obs_space  # any space: the networks take it through a FlatInput
        if cfg.batch_size < 1 or not 0.0 < cfg.tau <= 1.0 or cfg.alpha <= 0:
            raise ValueError("batch_size must be >= 1, tau in (0, 1] and alpha > 0")
        self.cfg = cfg
        self.bounds = ActionBounds(box)
        user = cfg.user_nets()
        self.actor = SquashedGaussianActor(
            obs_dim, self.act_dim, cfg.hidden, cfg.activation, cfg.sde, cfg.sde_init_std, user
        )
        self.critic = QEnsemble(obs_dim, self.act_dim, cfg.hidden, cfg.activation, 2, user)
        self.critic_target = target_copy(self.critic)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.alpha)), requires_grad=cfg.auto_alpha)
        self.target_entropy = -cfg.target_entropy_scale * self.act_dim
        self.device = place(self, device)  # networks on the learner's device before the optimizer
        groups: list[dict[str, Any]] = [
            {"params": list(self.actor.parameters()), "lr": cfg.actor_lr},
            {"params": list(self.critic.parameters()), "lr": cfg.critic_lr},
        ]
        if cfg.auto_alpha:
            groups.append({"params": [self.log_alpha], "lr": cfg.alpha_lr})
        self.graph = StepGraph(self.device, cfg.cuda_graph)
        self.optimizer = make_optimizer("adam", groups, cfg.critic_lr, **self.graph.optimizer_options)
        self.params: list[nn.Parameter] = [p for g in groups for p in g["params"]]
        self._critic_params = list(self.critic.parameters())
        self._targets = list(self.critic_target.parameters())
        self.rng = np.random.default_rng(seed)
        # gSDE: a new noise matrix every `sde_sample_freq` steps, else at the start of every collection
        self.sde_matrices = SDEMatrices(cfg.sde_sample_freq, None if cfg.sde_sample_freq > 0 else cfg.train_freq)
        self.env_steps = 0
        self.updates = 0

    def make_buffer(self, n_envs: int, total_steps: int, seed: int = 0) -> ReplayBuffer:
        cfg = self.cfg
        return ReplayBuffer(cfg.buffer_size, n_envs=n_envs, n_step=cfg.n_step, gamma=cfg.gamma, seed=seed)

    def act(
        self, obs: np.ndarray, state: Any = None, explore: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        if explore and self.env_steps < self.cfg.random_steps:
            raw = uniform_actions(obs_len(obs), self.act_dim, self.rng)
        else:
            draws = None
            if explore and self.actor.noise is not None:  # gSDE: this step's noise matrices, one per env
                draws = self.sde_matrices.next(self.actor.noise, obs_len(obs), self.rng)
            raw = acting(self.actor).numpy_act(obs, explore, self.rng, draws)  # greedy: tanh of the mean
        extras: dict[str, np.ndarray] = {}
        return to_env_actions(raw, extras, self.bounds), extras, state

    def schedule(self, env_steps: int, total_steps: int) -> None:
        self.env_steps = env_steps

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    def td_target(self, b: Batch, next_act: torch.Tensor, next_logp: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """y = r + γ^k (1 − terminated) (min_k Q'_k(s', a') − α log π(a'|s')) for sampled a' ~ π(·|s')."""
        with torch.no_grad():
            next_v = self.critic_target(b.next_obs, next_act).min(0).values - alpha * next_logp
            y: torch.Tensor = b.rew + b.discount * (1.0 - b.terminated) * next_v
            return y

    def update(self, batch: Batch) -> Metrics:
        """A critic step, a policy step on the updated critics, an α step on the updated policy, then the soft
        target update; 0-dim tensor metrics."""
        b = Batch(batch.to_dict(), act=self.bounds.normalize(batch.act)).to_torch(self.device)
        metrics = self.graph(self._learn, b, self.optimizer)  # on CUDA: a replayed graph
        self.updates += 1
        return metrics

    def _learn(self, b: Batch) -> Metrics:
        """`update`'s tensor work on a batch on the device, with actions in the policy's [-1, 1]."""
        act = b.act
        alpha = self.log_alpha.detach().exp()
        # a ~ π(·|s) for the policy step, sampled before the critics step (the policy is the same then); a' ~
        # π(·|s') without a graph, so the policy's backward runs over B rows, not 2B of which half are zeros.
        actions, logp = self.actor.sample(b.obs)
        with torch.no_grad():
            next_act, next_logp = self.actor.sample(b.next_obs)
        y = self.td_target(b, next_act, next_logp, alpha)
        q = self.critic(b.obs, act)  # [2, B]
        critic_loss = 0.5 * (q - y).pow(2).mean(1).sum()
        optimize(self.optimizer, critic_loss, self.params, None)  # only the critics have gradients
        q_pi = self.critic(b.obs, actions, detach=True).min(0).values  # the critics after their step
        actor_loss = (alpha * logp - q_pi).mean()
        optimize(self.optimizer, actor_loss, self.params, None)  # only the policy has gradients
        if self.cfg.auto_alpha:
            with torch.no_grad():
                _, new_logp = self.actor.sample(b.obs)  # the policy after its step
            alpha_loss = -self.log_alpha * (new_logp.mean() + self.target_entropy)
            optimize(self.optimizer, alpha_loss, self.params, None)  # only log α has a gradient
        soft_update(self._targets, self._critic_params, self.cfg.tau)
        return {
            "critic_loss": critic_loss.detach(),
            "actor_loss": actor_loss.detach(),
            "alpha": alpha,
            "entropy": -logp.detach().mean(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "sde": self.sde_matrices.state_dict(),
            "env_steps": self.env_steps,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.graph.reset(self.optimizer)  # new state tensors, and the options of the run that saved them
        self.rng.bit_generator.state = state["rng"]
        if "sde" in state:
            self.sde_matrices.load_state_dict(state["sde"])
        self.env_steps = int(state["env_steps"])
        self.updates = int(state["updates"])

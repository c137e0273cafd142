"""TD3: twin delayed DDPG (Fujimoto et al. 2018) for Box actions.

DDPG's deterministic actor in [-1, 1] (rescaled to the env's bounds by `ActionBounds`) with Gaussian or
Ornstein–Uhlenbeck exploration noise (`rlfleet.algos.noise`) and a uniform random warm-up, plus the paper's
three changes:

- clipped double Q: two critics, both regressed on y = r + γ (1 − terminated) min_k Q'_k(s', ã');
- target policy smoothing: ã' = clip(μ'(s') + clip(ε, −c, c), −1, 1), ε ~ N(0, σ̃²) (σ̃ = 0.2, c = 0.5);
- delayed policy updates: the actor (along Q_1(s, μ(s))) and the Polyak-averaged targets move only every
  `policy_delay`-th critic update.

As in the paper's Algorithm 1, an update steps the critics first; the actor's loss is then computed with
the critics as that step left them (through detached weights: its gradient reaches the actor only), and
the targets move last. The twin critics are one `QEnsemble` (one batched pass for both); one Adam holds
both networks' parameter groups, and each step moves only the network that has gradients.

`rlfleet.algos.ddpg.DDPG` is this class without the three changes (`critics`, `policy_delay`, `smooth`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlfleet.algos.acting import uniform_actions
from rlfleet.algos.contract import Metrics
from rlfleet.algos.noise import ACTION_NOISES, ActionNoise
from rlfleet.algos.options import ACTIVATION, ActorCriticNetOptions, PriorityOptions, ReplayOptions, make_replay_buffer
from rlfleet.algos.spaces import BOX_ACTIONS, ActionBounds, check_action_mask, check_action_space, to_env_actions
from rlfleet.algos.updates import soft_update
from rlfleet.cuda_graph import StepGraph
from rlfleet.data.batch import Batch, obs_len
from rlfleet.data.buffer import ReplayBuffer
from rlfleet.device import acting, host, place
from rlfleet.envs.normalize import NormOptions
from rlfleet.fields import bounded, checked, one_of
from rlfleet.nets.continuous import DeterministicActor, QEnsemble
from rlfleet.nets.user import target_copy
from rlfleet.optim.make import make_optimizer
from rlfleet.optim.step import optimize


@dataclass
class DPGOptions(ActorCriticNetOptions, PriorityOptions, NormOptions, ReplayOptions):
    """What DDPG and TD3 share (with DDPG's defaults): the deterministic actor and its exploration noise, the
    critics' learning rate and targets, the networks, over replay."""

    tau: float = bounded(0.01, gt=0, le=1)
    """Polyak rate of the target networks: θ' ← (1 − τ) θ' + τ θ at every actor update."""
    actor_lr: float = bounded(1e-3, ge=0)
    """Learning rate of the actor (Adam)."""
    critic_lr: float = bounded(1e-3, ge=0)
    """Learning rate of the critic (Adam)."""
    action_noise: str = checked("gaussian", one_of(ACTION_NOISES))
    """Exploration noise added to μ(s): gaussian (drawn afresh every step) or ou (Ornstein–Uhlenbeck: correlated
    over about 1 / (ou_theta · ou_dt) steps and reset at each episode's start; for sparse rewards behind a long
    run-up, see `rlfleet.algos.noise`)."""
    exploration_noise: float = bounded(0.1, ge=0)
    """σ of the exploration noise (gaussian: its std; ou: the process's σ), in units of half the action range."""
    ou_theta: float = bounded(0.15, ge=0, needs="action_noise=ou")
    """ou noise: θ, how fast the process is pulled back to 0 (per unit of time, `ou_dt` per step)."""
    ou_dt: float = bounded(1e-2, gt=0, needs="action_noise=ou")
    """ou noise: dt, the time one env step advances the process by."""
    hidden: tuple[int, ...] = bounded((64, 64), ge=1)
    """Hidden layer sizes of the actor and the critic MLPs."""
    activation: str = checked("relu", ACTIVATION)
    """MLP activation: relu, tanh or elu."""
    total_steps: int = bounded(50_000, ge=1)
    """Default training budget in env steps."""


@dataclass
class Config(DPGOptions):
    """TD3 hyperparameters; the defaults solve Pendulum-v1 (greedy mean ≥ −250) in ~4k env steps (preset: mujoco)."""

    tau: float = bounded(0.02, gt=0, le=1)
    """Polyak rate of the target networks: θ' ← (1 − τ) θ' + τ θ at every policy update (every
    `policy_delay` critic updates, so about DDPG's 0.01 per update)."""
    actor_lr: float = bounded(2e-3, ge=0)
    """Learning rate of the actor (Adam)."""
    critic_lr: float = bounded(2e-3, ge=0)
    """Learning rate of the twin critics (Adam)."""
    exploration_noise: float = bounded(0.2, ge=0)
    """σ of the exploration noise (gaussian: its std; ou: the process's σ), in units of half the action range."""
    policy_delay: int = bounded(2, ge=1)
    """Critic updates per actor (and target) update."""
    target_noise: float = bounded(0.2, ge=0)
    """σ̃ of the target policy smoothing noise (normalised action units)."""
    target_noise_clip: float = bounded(0.5, ge=0)
    """c: the smoothing noise is clipped to [−c, c]."""


# MuJoCo locomotion (picked automatically for MuJoCo envs): CleanRL's settings and the TD3 author's later code's
# (the paper itself has 400-300 networks, Adam 1e-3 and minibatches of 100) — replay of
# 1M transitions, 25k random steps first, minibatches of 256, Adam 3e-4, γ = 0.99, τ = 0.005, exploration
# noise 0.1, policy delay 2, target smoothing noise 0.2 clipped at 0.5, 256-256 ReLU MLPs
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
        policy_delay=2,
        target_noise=0.2,
        target_noise_clip=0.5,
        total_steps=1_000_000,
    ),
}


def apex_preset(mujoco: dict[str, Any]) -> dict[str, Any]:
    """Ape-X DPG (Horgan et al. 2018, section 4.2 and appendix) over a MuJoCo preset: batch 512, 5-step returns,
    proportional priorities α = 0.6 with β = 0.4 fixed, a replay of 1M transitions (the paper's continuous-control
    replay is smaller than its Atari one; its exact size is not restated here beyond that: 1M, the MuJoCo preset's,
    is kept). Kept from the MuJoCo preset, unlike the paper: Polyak targets (τ = 0.005; the paper copies the targets
    every 100 updates), Adam 3e-4 and no gradient clip. The `apex` architecture picks it by itself on MuJoCo envs."""
    return dict(mujoco, batch_size=512, n_step=5, buffer_size=1_000_000, prioritized=True, alpha=0.6, beta=0.4,
                beta_anneal=False)  # fmt: skip


PRESETS["apex"] = apex_preset(PRESETS["mujoco"])


class TD3:
    """Deterministic actor, twin Q(s, a) critics, delayed policy updates and smoothed targets, over replay."""

    data = "replay"
    action_spaces = BOX_ACTIONS
    name = "td3"
    critics = 2
    """Q networks, each regressed on the same target (the smallest of the target critics' values)."""

    def __init__(
        self, cfg: Config, obs_space: gym.Space[Any], action_space: gym.Space[Any], seed: int = 0, device: str = "cpu"
    ):
        box = cast(gym.spaces.Box, check_action_space(action_space, self.name, self.action_spaces))
        check_action_mask(obs_space, action_space, self.name)
        self.act_dim = int(box.shape[0])
        obs_dim = obs_space  # any space: the networks take it through a FlatInput
        self.cfg = cfg
        if cfg.batch_size < 1 or self.policy_delay() < 1 or not 0.0 < cfg.tau <= 1.0:
            raise ValueError("batch_size and policy_delay must be >= 1 and tau in (0, 1]")
        self.bounds = ActionBounds(box)
        user = cfg.user_nets()
        self.actor = DeterministicActor(obs_dim, self.act_dim, cfg.hidden, cfg.activation, user)
        self.critic = QEnsemble(obs_dim, self.act_dim, cfg.hidden, cfg.activation, self.critics, user)
        self.actor_target = target_copy(self.actor)
        self.critic_target = target_copy(self.critic)
        self.device = place(self, device)  # networks on the learner's device before the optimizer
        groups: list[dict[str, Any]] = [
            {"params": list(self.actor.parameters()), "lr": cfg.actor_lr},
            {"params": list(self.critic.parameters()), "lr": cfg.critic_lr},
        ]
        self.graph = StepGraph(self.device, cfg.cuda_graph)
        self.optimizer = make_optimizer("adam", groups, cfg.critic_lr, **self.graph.optimizer_options)
        self.params: list[nn.Parameter] = [p for g in groups for p in g["params"]]
        self._targets = [*self.actor_target.parameters(), *self.critic_target.parameters()]
        self.noise = ActionNoise(cfg.action_noise, cfg.exploration_noise, cfg.ou_theta, cfg.ou_dt)
        self.rng = np.random.default_rng(seed)
        self.env_steps = 0
        self.updates = 0
        self.policy_updates = 0

    def make_buffer(self, n_envs: int, total_steps: int, seed: int = 0) -> ReplayBuffer:
        return make_replay_buffer(self.cfg, n_envs, total_steps, seed)

    def act(
        self, obs: np.ndarray, state: Any = None, explore: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        if explore and self.env_steps < self.cfg.random_steps:
            raw = uniform_actions(obs_len(obs), self.act_dim, self.rng)
        else:
            raw = acting(self.actor).numpy_act(obs)
            if explore:
                raw = self.noise.perturb(raw, self.rng)
        extras: dict[str, np.ndarray] = {}
        return to_env_actions(raw, extras, self.bounds), extras, state

    replays_sequences = False  # (an Ape-X actor's question) it learns from single transitions

    def fix_exploration(self, level: float, share: float) -> float:
        """Act with a fixed exploration from now on (an Ape-X actor's rung of the ladder): Gaussian noise of
        σ = share × `exploration_noise` (`share` in (0, 1]: the rung's ε over the ladder's top), of the
        configured kind. Returns σ."""
        cfg = self.cfg
        self.noise = ActionNoise(cfg.action_noise, share * cfg.exploration_noise, cfg.ou_theta, cfg.ou_dt)
        return self.noise.sigma

    def reset_noise(self, done: np.ndarray) -> None:
        """The exploration noise of the envs in `done` (their next observation begins an episode) back at its start."""
        self.noise.reset(done)

    def schedule(self, env_steps: int, total_steps: int) -> None:
        self.env_steps = env_steps

    def policy_delay(self) -> int:
        """Critic updates per actor (and target) update."""
        return self.cfg.policy_delay

    def smooth(self, next_act: torch.Tensor) -> torch.Tensor:
        """Target policy smoothing: ã' = clip(μ'(s') + clip(ε, −c, c), −1, 1), ε ~ N(0, σ̃²)."""
        cfg = self.cfg
        noise = (torch.randn_like(next_act) * cfg.target_noise).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
        return (next_act + noise).clamp(-1.0, 1.0)

    def td_target(self, b: Batch) -> torch.Tensor:
        """y = r + γ^k (1 − terminated) min_k Q'_k(s', ã'), ã' the smoothed target action."""
        with torch.no_grad():
            next_act = self.smooth(self.actor_target(b.next_obs))
            next_q = self.critic_target(b.next_obs, next_act).min(0).values
            y: torch.Tensor = b.rew + b.discount * (1.0 - b.terminated) * next_q
            return y

    def update(self, batch: Batch) -> Metrics:
        """One critic step; every `policy_delay`-th then an actor step on the updated critic and the soft
        target update. `priorities` are the critics' mean |TD errors| of the critic step."""
        b = self._torch_batch(batch)
        self.updates += 1
        policy_step = self.updates % self.policy_delay() == 0
        learn = functools.partial(self._learn, policy_step=policy_step)
        metrics = self.graph(learn, b, self.optimizer, variant=policy_step)  # on CUDA: a replayed graph
        self.policy_updates += policy_step
        return metrics  # its priorities on the device: a prioritized replay reads them (`PriorityState.checked`)

    def _learn(self, b: Batch, policy_step: bool) -> Metrics:
        """`update`'s tensor work on a batch on the device, with actions in the policy's [-1, 1]."""
        y = self.td_target(b)
        q = self.critic(b.obs, b.act)  # [critics, B]
        td = q - y
        critic_loss = (b.weight * td.pow(2)).mean(1).sum()  # importance weights: ones unless prioritized
        optimize(self.optimizer, critic_loss, self.params, None)  # only the critics have gradients
        metrics = {"critic_loss": critic_loss.detach(), "q": q.detach()[0].mean(), "priorities": _td_abs(td.detach())}
        if not policy_step:
            return metrics
        actor_loss = -self.critic(b.obs, self.actor(b.obs), detach=True)[0].mean()
        optimize(self.optimizer, actor_loss, self.params, None)  # only the actor has gradients
        soft_update(self._targets, self.params, self.cfg.tau)
        metrics["actor_loss"] = actor_loss.detach()
        return metrics

    def _torch_batch(self, batch: Batch) -> Batch:
        """The batch as tensors on the device, its actions in the policy's normalised space."""
        return Batch(batch.to_dict(), act=self.bounds.normalize(batch.act)).to_torch(self.device)

    @torch.no_grad()
    def priorities(self, batch: Batch) -> np.ndarray:
        """The twin critics' mean |y − Q_k(s, a)| of each transition under the current networks (y with its own
        draw of smoothing noise): the priorities `update` writes back, without learning (an Ape-X actor's)."""
        b = self._torch_batch(batch)
        return host(_td_abs(self.critic(b.obs, b.act) - self.td_target(b)))

    def state_dict(self) -> dict[str, Any]:
        return {
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "actor_target": self.actor_target.state_dict(),
            "critic_target": self.critic_target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "noise": self.noise.state_dict(),
            "env_steps": self.env_steps,
            "updates": self.updates,
            "policy_updates": self.policy_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.actor_target.load_state_dict(state["actor_target"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.graph.reset(self.optimizer)  # new state tensors, and the options of the run that saved them
        self.rng.bit_generator.state = state["rng"]
        self.noise.load_state_dict(state.get("noise", {}))
        self.env_steps = int(state["env_steps"])
        self.updates = int(state["updates"])
        self.policy_updates = int(state["policy_updates"])


def _td_abs(td: torch.Tensor) -> torch.Tensor:
    """`[B]` priorities from the critics' `[critics, B]` TD errors: the mean of their absolute values."""
    return td.abs().mean(0)

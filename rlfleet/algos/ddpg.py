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
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from rlfleet.algos.common import (
    BOX_ACTIONS,
    ActionBounds,
    PriorityOptions,
    ReplayOptions,
    check_action_space,
    make_optimizer,
    make_replay_buffer,
    optimize,
    soft_update,
    to_env_actions,
    uniform_actions,
)
from rlfleet.algos.noise import ACTION_NOISES, ActionNoise
from rlfleet.data.batch import Batch, obs_len
from rlfleet.data.buffer import ReplayBuffer
from rlfleet.device import acting, host, place
from rlfleet.envs.normalize import NormOptions
from rlfleet.fields import bounded, checked, one_of
from rlfleet.nets.continuous import DeterministicActor, QEnsemble


@dataclass
class Config(PriorityOptions, NormOptions, ReplayOptions):
    """DDPG hyperparameters; the defaults solve Pendulum-v1 (greedy mean ≥ −250) in ~4k env steps (preset: mujoco)."""

    tau: float = bounded(0.01, gt=0, le=1)
    """Polyak rate of the target networks: θ' ← (1 − τ) θ' + τ θ after every update."""
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
    ou_theta: float = bounded(0.15, ge=0)
    """ou noise: θ, how fast the process is pulled back to 0 (per unit of time, `ou_dt` per step)."""
    ou_dt: float = bounded(1e-2, gt=0)
    """ou noise: dt, the time one env step advances the process by."""
    hidden: tuple[int, ...] = bounded((64, 64), ge=1)
    """Hidden layer sizes of the actor and the critic MLPs."""
    activation: str = "relu"
    """MLP activation: relu, tanh or elu."""
    total_steps: int = bounded(50_000, ge=1)
    """Default training budget in env steps."""


# MuJoCo locomotion (picked automatically for MuJoCo envs): CleanRL's DDPG settings — replay of 1M
# transitions, 25k random steps first, minibatches of 256, Adam 3e-4, γ = 0.99, τ = 0.005, Gaussian
# exploration noise 0.1, 256-256 ReLU MLPs
PRESETS: dict[str, dict] = {
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
# Ape-X DPG (Horgan et al. 2018, section 4.2 and appendix) over the MuJoCo preset: batch 512, 5-step returns,
# proportional priorities α = 0.6 with β = 0.4 fixed, a replay of 1M transitions (the paper's continuous-control
# replay is smaller than its Atari one; its exact size is not restated here beyond that: 1M, the MuJoCo
# preset's, is kept). Kept from the MuJoCo preset, unlike the paper: Polyak targets (τ = 0.005; the paper copies
# the targets every 100 updates), Adam 3e-4 and no gradient clip. The `apex` architecture picks it by itself on
# MuJoCo envs.
PRESETS["apex"] = dict(
    PRESETS["mujoco"],
    batch_size=512,
    n_step=5,
    buffer_size=1_000_000,
    prioritized=True,
    alpha=0.6,
    beta=0.4,
    beta_anneal=False,
)


class DDPG:
    """Deterministic actor and one Q(s, a) critic with Polyak-averaged targets, over a replay buffer."""

    data = "replay"
    action_spaces = BOX_ACTIONS

    def __init__(self, cfg: Config, obs_space: gym.Space, action_space: gym.Space, seed: int = 0, device: str = "cpu"):
        self.act_dim = int(check_action_space(action_space, "ddpg", self.action_spaces).shape[0])
        obs_dim = obs_space  # any space: the networks take it through a FlatInput
        if cfg.batch_size < 1 or not 0.0 < cfg.tau <= 1.0:
            raise ValueError("batch_size must be >= 1 and tau in (0, 1]")
        self.cfg = cfg
        self.bounds = ActionBounds(action_space)
        self.actor = DeterministicActor(obs_dim, self.act_dim, cfg.hidden, cfg.activation)
        self.critic = QEnsemble(obs_dim, self.act_dim, cfg.hidden, cfg.activation, n=1)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.device = place(self, device)  # networks on the learner's device before the optimizer
        groups = [
            {"params": list(self.actor.parameters()), "lr": cfg.actor_lr},
            {"params": list(self.critic.parameters()), "lr": cfg.critic_lr},
        ]
        self.optimizer = make_optimizer("adam", groups, cfg.critic_lr)
        self.params = [p for g in groups for p in g["params"]]
        self._targets = [*self.actor_target.parameters(), *self.critic_target.parameters()]
        self.noise = ActionNoise(cfg.action_noise, cfg.exploration_noise, cfg.ou_theta, cfg.ou_dt)
        self.rng = np.random.default_rng(seed)
        self.env_steps = 0
        self.updates = 0

    def make_buffer(self, n_envs: int, total_steps: int, seed: int = 0) -> ReplayBuffer:
        return make_replay_buffer(self.cfg, n_envs, total_steps, seed)

    def act(self, obs: np.ndarray, state=None, explore: bool = True):
        if explore and self.env_steps < self.cfg.random_steps:
            raw = uniform_actions(obs_len(obs), self.act_dim, self.rng)
        else:
            raw = acting(self.actor).numpy_act(obs)
            if explore:
                raw = self.noise.perturb(raw, self.rng)
        extras: dict[str, np.ndarray] = {}
        return to_env_actions(raw, extras, self.bounds), extras, state

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

    def td_target(self, b: Batch) -> torch.Tensor:
        """y = r + γ^k (1 − terminated) Q'(s', μ'(s')) for a torch batch."""
        with torch.no_grad():
            next_q = self.critic_target(b.next_obs, self.actor_target(b.next_obs))[0]
            return b.rew + b.discount * (1.0 - b.terminated) * next_q

    def update(self, batch: Batch) -> dict:
        """A critic step, then an actor step on the updated critic, then the soft target update (the paper's
        Algorithm 1); metrics are 0-dim tensors, and `priorities` the |TD errors| of the critic step."""
        b, act = self._torch_batch(batch)
        y = self.td_target(b)
        q = self.critic(b.obs, act)[0]
        td = q - y
        critic_loss = (b.weight * td.pow(2)).mean()  # importance weights: ones unless the replay is prioritized
        optimize(self.optimizer, critic_loss, self.params, None)  # only the critic has gradients
        actor_loss = -self.critic(b.obs, self.actor(b.obs), detach=True)[0].mean()
        optimize(self.optimizer, actor_loss, self.params, None)  # only the actor has gradients
        soft_update(self._targets, self.params, self.cfg.tau)
        self.updates += 1
        return {
            "critic_loss": critic_loss.detach(),
            "actor_loss": actor_loss.detach(),
            "q": q.detach().mean(),
            "priorities": host(td.abs()),
        }

    def _torch_batch(self, batch: Batch) -> tuple[Batch, torch.Tensor]:
        """The batch as tensors, and its actions in the policy's normalised space."""
        return batch.to_torch(self.device), torch.as_tensor(self.bounds.normalize(batch.act), device=self.device)

    @torch.no_grad()
    def priorities(self, batch: Batch) -> np.ndarray:
        """|y − Q(s, a)| of each transition under the current networks: the priorities `update` writes back,
        without learning (an Ape-X actor's initial priorities)."""
        b, act = self._torch_batch(batch)
        return host((self.critic(b.obs, act)[0] - self.td_target(b)).abs())

    def state_dict(self) -> dict:
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
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.actor_target.load_state_dict(state["actor_target"])
        self.critic_target.load_state_dict(state["critic_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.noise.load_state_dict(state.get("noise", {}))
        self.env_steps = int(state["env_steps"])
        self.updates = int(state["updates"])

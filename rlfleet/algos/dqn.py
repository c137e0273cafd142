"""DQN with its common extensions: target network, n-step returns, Double Q, Dueling, prioritized replay.

Transitions from N envs go into a replay buffer; every `train_freq` vector steps the learner takes
`gradient_steps` minibatches and regresses Q(s, a) on

    y = R^(n) + γ^k (1 − terminated) Q_target(s', argmax_a' Q(s', a'))   (Double DQN)

with the Huber loss, weighted by importance weights under prioritized replay; |y − Q| are the new
priorities. The target network is a hard copy refreshed every `target_update_every` gradient steps.

With `lstm` > 0 (recurrent replay, as R2D2): an LSTM core sits between encoder and head, `act` carries
its state per env (reset at episode ends by the collector, `reset_state`), and replay holds sequences of
`burn_in + train_len` steps of one env's stream with the state acting had at their first step (or zeros
without `stored_state`). Online and target net unroll from that state, zeroing it where episodes
start; the first `burn_in` steps only warm the state up (no gradient, no loss) and the loss is on the
remaining `train_len` steps, with n-step Double-Q targets computed inside the sequence: a target
bootstraps from the net's Q at the next observation, continued one step from the state after the last
summed step (the final observation of a truncated episode included).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from rlfleet.algos.acting import epsilon_greedy, q_values
from rlfleet.algos.contract import Metrics
from rlfleet.algos.options import ACTIVATION, ENCODER, NetOptions, PriorityOptions, make_replay_buffer
from rlfleet.algos.spaces import DISCRETE_ACTIONS, check_action_mask, check_action_space
from rlfleet.algos.updates import hard_update, linear
from rlfleet.data.batch import Batch, map_obs, obs_tensor
from rlfleet.data.buffer import ReplayBuffer, SequenceReplayBuffer
from rlfleet.data.returns import sequence_nstep
from rlfleet.device import acting, host, metric, module_device, place
from rlfleet.envs.normalize import NormOptions
from rlfleet.fields import MAX_ENVS, NEEDS, bounded, checked
from rlfleet.nets.heads import action_mask_of, masked_logits
from rlfleet.nets.models import QNetwork
from rlfleet.nets.recurrent import LSTMCore, State
from rlfleet.nets.user import target_copy
from rlfleet.optim.make import make_optimizer
from rlfleet.optim.step import optimize


@dataclass
class Config(NetOptions, PriorityOptions, NormOptions):
    """DQN hyperparameters; the defaults (double + dueling + prioritized, 3-step) solve CartPole-v1."""

    n_envs: int = bounded(4, ge=1, le=MAX_ENVS)
    """Parallel envs stepped in lockstep by one process."""
    buffer_size: int = bounded(50_000, ge=1)
    """Replay capacity in transitions."""
    batch_size: int = bounded(64, ge=1)
    """Minibatch size (in sequences when `lstm` > 0)."""
    learning_starts: int = bounded(1_000, ge=0)
    """Env steps collected before the first update."""
    train_freq: int = bounded(16, ge=1)
    """Vector-env steps between training phases."""
    gradient_steps: int = bounded(16, ge=1)
    """Gradient steps per training phase."""
    gamma: float = bounded(0.99, ge=0, le=1)
    """Discount factor."""
    n_step: int = bounded(3, ge=1)
    """Steps of real reward before bootstrapping."""
    lr: float = bounded(1e-3, ge=0)
    """Learning rate (Adam)."""
    target_update_every: int = bounded(100, ge=1)
    """Gradient steps between hard target-network copies."""
    double: bool = True
    """Double Q-learning: the online net picks the next action, the target net evaluates it."""
    dueling: bool = True
    """Dueling value/advantage head."""
    prioritized: bool = field(default=True, metadata={NEEDS: "lstm=0"})
    """Prioritized replay (proportional); feed-forward only: with `lstm` > 0 sequences are drawn uniformly."""
    # as in `PriorityOptions`, and idle with an LSTM too
    alpha: float = bounded(0.6, ge=0, needs=("prioritized", "lstm=0"))
    beta: float = bounded(0.4, ge=0, le=1, needs=("prioritized", "lstm=0"))
    beta_anneal: bool = field(default=True, metadata={NEEDS: ("prioritized", "lstm=0")})
    eps_start: float = bounded(1.0, ge=0, le=1)
    """Initial exploration rate."""
    eps_final: float = bounded(0.05, ge=0, le=1)
    """Final exploration rate."""
    eps_anneal_steps: int = bounded(10_000, ge=0)
    """Env steps over which ε decays linearly."""
    max_grad_norm: float = bounded(10.0, ge=0)
    """Global gradient-norm clip; 0 disables it."""
    hidden: tuple[int, ...] = bounded((128, 128), ge=1, needs="net=")
    """Hidden layer sizes of the MLP encoder."""
    activation: str = checked("relu", ACTIVATION, needs="net=")
    """MLP activation."""
    encoder: str = checked("auto", ENCODER, needs="net=")
    """auto (MLP for vectors, Nature CNN for images, MinAtar's under 36×36), mlp, mnih2013, nature or minatar."""
    lstm: int = bounded(0, ge=0)
    """0: feed-forward; N: an LSTM core of N cells between encoder and head, trained on replayed sequences."""
    burn_in: int = bounded(8, ge=0, needs="lstm")
    """Recurrent: steps at the start of each replayed sequence that only warm up the state (no loss)."""
    train_len: int = bounded(8, ge=1, needs="lstm")
    """Recurrent: steps per replayed sequence that the loss is computed on (after the burn-in)."""
    stored_state: bool = field(default=True, metadata={NEEDS: "lstm"})
    """Recurrent: start each sequence from the state acting had there (R2D2's stored state); False: zeros."""
    total_steps: int = bounded(100_000, ge=1)
    """Default training budget in env steps."""


PRESETS: dict[str, dict[str, Any]] = {
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
    # Ape-X DQN (Horgan et al. 2018, appendix), over the Atari preset: batch 512, 3-step double dueling Q,
    # target copied every 2,500 updates, gradient norm clipped at 40, a replay of 2M transitions, proportional
    # priorities α = 0.6 with β = 0.4 fixed (not annealed), learning once 50,000 transitions are stored, learning
    # rate 0.00025/4. Differences: the paper's learner uses centered RMSProp (decay 0.95, ε 1.5e-7), this one
    # Adam (ε 1e-5); the paper's learner is not paced, this one replays each transition about once (one update
    # of 512 per 128 steps of the 4 envs; the paper's ~19 batches/s against ~12.5k env steps/s is ~0.8). The
    # `apex` architecture picks it by itself on Atari envs; 2M stored transitions of 84×84×4 frames (obs and
    # next_obs) take ~110 GB: `--set buffer_size=...` on a smaller machine (the rows are filled as they come).
    "apex": dict(
        n_envs=4,
        buffer_size=2_000_000,
        batch_size=512,
        learning_starts=50_000,
        train_freq=128,
        gradient_steps=1,
        n_step=3,
        lr=0.00025 / 4,
        target_update_every=2_500,
        max_grad_norm=40.0,
        double=True,
        dueling=True,
        prioritized=True,
        alpha=0.6,
        beta=0.4,
        beta_anneal=False,
        eps_final=0.01,
        eps_anneal_steps=250_000,
        encoder="nature",
        total_steps=10_000_000,
    ),
    # MinAtar (Young & Tian 2019), the paper's DQN: its network (one 16×3×3 convolution, 128 units), one env, one
    # update of 32 per step from a replay of 100k transitions once 5,000 are stored, target copied every 1,000
    # updates, ε from 1 to 0.1 over the first 100k steps, γ 0.99, one-step targets without double, dueling or
    # prioritized replay, 5M steps. Difference: Adam (ε 1e-5) at the paper's learning rate, where it uses
    # RMSProp (centred moments 0.95, ε 0.01). Measured: docs/minatar.md.
    "minatar": dict(
        n_envs=1,
        buffer_size=100_000,
        batch_size=32,
        learning_starts=5_000,
        train_freq=1,
        gradient_steps=1,
        n_step=1,
        lr=2.5e-4,
        target_update_every=1_000,
        double=False,
        dueling=False,
        prioritized=False,
        eps_start=1.0,
        eps_final=0.1,
        eps_anneal_steps=100_000,
        max_grad_norm=0.0,
        encoder="minatar",
        total_steps=5_000_000,
    ),
    # Recurrent replay for partially observed vector tasks: 64 LSTM cells after one 64-unit layer, sequences
    # of 8 burn-in + 8 trained steps. Each update trains on 32 x 8 steps, so fewer, larger updates than the
    # feed-forward default (8 per 64 env steps instead of 16 on 64 samples each). The target period was
    # measured: docs/algorithms.md, "Recurrent DQN".
    "lstm": dict(
        lstm=64,
        hidden=(64,),
        batch_size=32,
        burn_in=8,
        train_len=8,
        train_freq=16,
        gradient_steps=8,
        target_update_every=400,
        lr=1e-3,
    ),
}


class DQN:
    """Deep Q-network over a replay buffer."""

    data = "replay"
    action_spaces = DISCRETE_ACTIONS

    def __init__(
        self, cfg: Config, obs_space: gym.Space[Any], action_space: gym.Space[Any], seed: int = 0, device: str = "cpu"
    ):
        discrete = cast(gym.spaces.Discrete, check_action_space(action_space, "dqn", self.action_spaces))
        check_action_mask(obs_space, action_space, "dqn")
        if cfg.target_update_every < 1 or cfg.batch_size < 1:
            raise ValueError("target_update_every and batch_size must be >= 1")
        if cfg.lstm < 0 or cfg.burn_in < 0 or cfg.train_len < 1:
            raise ValueError("lstm and burn_in must be >= 0 and train_len >= 1")
        self.cfg = cfg
        self.q = QNetwork(
            obs_space,
            int(discrete.n),
            cfg.encoder,
            cfg.hidden,
            cfg.activation,
            cfg.dueling,
            cfg.lstm,
            cfg.net,
            cfg.net_kwargs,
        )
        self.q_target = target_copy(self.q)
        self.device = place(self, device)  # networks on the learner's device before the optimizer
        self.optimizer = make_optimizer("adam", self.q.parameters(), cfg.lr)
        self.params = list(self.q.parameters())
        self.rng = np.random.default_rng(seed)
        self.eps = cfg.eps_start
        self.fixed_eps: float | None = None  # set by `fix_exploration`
        self.updates = 0

    def make_buffer(self, n_envs: int, total_steps: int, seed: int = 0) -> ReplayBuffer:
        if self.cfg.lstm > 0:
            return SequenceReplayBuffer(
                self.cfg.buffer_size,
                n_envs,
                seq_len=self.cfg.burn_in + self.cfg.train_len,
                state_size=self.cfg.lstm if self.cfg.stored_state else 0,
                seed=seed,
            )
        return make_replay_buffer(self.cfg, n_envs, total_steps, seed)

    def act(
        self, obs: np.ndarray, state: Any = None, explore: bool = True
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
        eps = self.eps if explore else 0.0
        legal = action_mask_of(obs)
        if self.q.core is None:
            return epsilon_greedy(q_values(self.q, obs), eps, self.rng, legal), {}, state
        q_net = acting(self.q)
        with torch.inference_mode():
            q, state = q_net.unroll(obs_tensor(obs, module_device(q_net)), state)
        return epsilon_greedy(host(q), eps, self.rng, legal), {}, state

    def reset_state(self, state: State, done: np.ndarray) -> State:
        """The recurrent state with the envs in `done` (their episodes just ended) back at zeros."""
        return LSTMCore.reset(state, done)

    @property
    def replays_sequences(self) -> bool:
        """Recurrent DQN (`lstm` > 0) learns from replayed sequences, not single transitions."""
        return self.cfg.lstm > 0

    def fix_exploration(self, level: float, share: float) -> float:
        """Act with a fixed exploration from now on (an Ape-X actor's rung of the ladder): ε-greedy with ε = `level`;
        `schedule` leaves it alone. Returns ε."""
        self.fixed_eps = self.eps = float(level)
        return self.eps

    def schedule(self, env_steps: int, total_steps: int) -> None:
        if self.fixed_eps is not None:
            return
        self.eps = linear(self.cfg.eps_start, self.cfg.eps_final, self.cfg.eps_anneal_steps, env_steps)

    def td_loss(self, batch: Batch) -> tuple[torch.Tensor, Metrics, torch.Tensor]:
        """The loss, its metrics and the batch's `[B]` |TD errors| (on the learner's device: read on the host only
        where they are needed, after the step is queued)."""
        if self.q.core is not None:
            return self._sequence_loss(batch)
        b = batch.to_torch(self.device)
        q = self.q(b.obs).gather(1, b.act.long().unsqueeze(1)).squeeze(1)
        with torch.no_grad():  # the online net's pass over s' (double) keeps no graph: the backward is over B rows
            next_q_online = self.q(b.next_obs) if self.cfg.double else None
            next_v = self._next_value(self.q_target(b.next_obs), next_q_online, b.next_obs)
            y = b.rew + b.discount * (1.0 - b.terminated.float()) * next_v
        td = y - q
        loss = (b.weight * F.smooth_l1_loss(q, y, reduction="none")).mean()
        metrics = {"loss": metric(loss), "q": metric(q.mean()), "epsilon": self.eps}
        return loss, metrics, td.abs().detach()

    def _sequence_loss(self, batch: Batch) -> tuple[torch.Tensor, Metrics, torch.Tensor]:
        """The recurrent loss over `[B, burn_in + train_len]` sequences (`SequenceReplayBuffer.sample`)."""
        burn = self.cfg.burn_in
        ret, last, bootstrap = sequence_nstep(
            batch.rew[:, burn:], batch.terminated[:, burn:], batch.truncated[:, burn:], self.cfg.n_step, self.cfg.gamma
        )
        b = batch.to_torch(self.device)
        obs, next_obs = (map_obs(lambda x: x.transpose(0, 1), o) for o in (b.obs, b.next_obs))  # time-major
        starts = b.starts.transpose(0, 1)
        state = (b.h0, b.c0) if "h0" in b else None
        with torch.no_grad():
            _, (th, tc) = self.q_target.unroll(obs, state, starts)
            if burn > 0:  # warm the online state up on the burn-in steps
                _, (h, c) = self.q.unroll(obs[:burn], state, starts[:burn])
                state = (h[-1], c[-1])
        q_all, (h, c) = self.q.unroll(obs[burn:], state, starts[burn:])
        q = q_all.gather(2, b.act[:, burn:].T.long().unsqueeze(2)).squeeze(2).T  # [B, train_len]
        with torch.no_grad():
            # Q at each step's next observation, one step on from the state after that step
            nxt = map_obs(lambda x: x.flatten(0, 1), next_obs[burn:])
            next_q_target = self.q_target.unroll(nxt, (th[burn:].flatten(0, 1), tc[burn:].flatten(0, 1)))[0]
            next_q_online = self.q.unroll(nxt, (h.flatten(0, 1), c.flatten(0, 1)))[0] if self.cfg.double else None
            next_v = self._next_value(next_q_target, next_q_online, nxt)
            next_v = next_v.reshape(h.shape[:2]).T  # [B, train_len]
            ret_t, bootstrap_t, last_t = (torch.as_tensor(x, device=self.device) for x in (ret, bootstrap, last))
            y = ret_t + bootstrap_t * next_v.gather(1, last_t)
        td = y - q
        loss = (b.weight.unsqueeze(1) * F.smooth_l1_loss(q, y, reduction="none")).mean()
        metrics = {"loss": metric(loss), "q": metric(q.mean()), "epsilon": self.eps}
        return loss, metrics, td.abs().mean(1).detach()

    def _next_value(
        self, next_q_target: torch.Tensor, next_q_online: torch.Tensor | None, next_obs: Any
    ) -> torch.Tensor:
        """The target net's value `[B]` of each next observation from its Q `[B, A]`: at the online net's best action
        (Double DQN: its Q `next_q_online`) or its own max; over the legal actions where the observations carry them
        (a terminal one that allows none counts as allowing all: it is not bootstrapped from anyway)."""
        legal = action_mask_of(next_obs)
        if next_q_online is not None:  # the online net picks the next action, the target net values it
            best = masked_logits(next_q_online, legal).argmax(1, keepdim=True)
            return next_q_target.gather(1, best).squeeze(1)
        values: torch.Tensor = masked_logits(next_q_target, legal).max(1).values
        return values

    @torch.no_grad()
    def priorities(self, batch: Batch) -> np.ndarray:
        """|TD error| of each transition of `batch` (its `weight` column included, as `loss` reads it) under the
        current online and target networks: the priorities `update` would write back, computed by `loss`
        without learning (an Ape-X actor's initial priorities)."""
        return host(self.td_loss(batch)[2])

    def update(self, batch: Batch) -> Metrics:
        loss, metrics, td_abs = self.td_loss(batch)
        metrics["grad_norm"] = optimize(self.optimizer, loss, self.params, self.cfg.max_grad_norm)
        self.updates += 1
        if self.updates % self.cfg.target_update_every == 0:
            hard_update(self.q_target, self.q)
        metrics["priorities"] = td_abs
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "q": self.q.state_dict(),
            "q_target": self.q_target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.updates = int(state["updates"])

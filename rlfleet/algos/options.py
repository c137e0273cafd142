"""Config mixins the algorithms share (a user network, gSDE, replay, prioritized replay), and the replay buffer their
fields ask for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlfleet.data.buffer import PrioritizedReplayBuffer, ReplayBuffer
from rlfleet.envs.kwargs import keyword_args_problem
from rlfleet.fields import MAX_ENVS, NEEDS, bounded, checked, one_of
from rlfleet.nets.continuous import UserNets
from rlfleet.nets.encoders import ACTIVATIONS, ENCODERS
from rlfleet.nets.heads import LOG_STDS
from rlfleet.nets.user import factory_problem
from rlfleet.optim.make import OPTIMIZERS

# the `checked` tests of the algorithms' named choices: a name the networks do not know is refused with the rest of
# the config, also where this run would not read it (`activation` under a network of the user's own, `log_std` on
# Discrete actions), rather than kept in its config.json as if it meant something
ACTIVATION = one_of(tuple(ACTIVATIONS))
ENCODER = one_of(("auto", *sorted(ENCODERS)))
LOG_STD = one_of(LOG_STDS)
OPTIMIZER = one_of(tuple(OPTIMIZERS))


@dataclass
class NetOptions:
    """The fields every algorithm's `Config` has for a network of the user's own (`rlfleet.nets.user`)."""

    net: str = checked("", check=factory_problem)
    """A network of your own as the encoder: `package.module:factory`, called with the observation space and
    `net_kwargs`, returning a torch module that maps a batch of observations to features `[batch, F]`; the
    algorithm's heads (and an LSTM core with `lstm`) sit on top. "": the built-in encoders (`encoder`, `hidden`)."""
    net_kwargs: dict[str, Any] = checked(check=keyword_args_problem, default_factory=dict, needs="net")
    """Keyword arguments of the `net` factory (bools, numbers, strings, None, and lists and dicts of them)."""


@dataclass
class ActorCriticNetOptions(NetOptions):
    """The user-network fields of the algorithms with a separate actor and critics (ddpg, td3, sac): whole modules of
    the user's own in their place, as Stable-Baselines3 and Tianshou allow."""

    actor_net: str = checked("", check=factory_problem)
    """A whole actor of your own: `package.module:factory`, called with the observation space, the policy's action
    space ([-1, 1]^A) and `actor_net_kwargs`, returning a module from observations to A numbers (ddpg, td3: the
    action before the tanh) or 2A (sac: the Gaussian's mean and log σ before the squashing); in place of `net` for the
    actor. "": the built-in actor."""
    actor_net_kwargs: dict[str, Any] = checked(check=keyword_args_problem, default_factory=dict, needs="actor_net")
    """Keyword arguments of the `actor_net` factory."""
    critic_net: str = checked("", check=factory_problem)
    """A whole critic of your own: `package.module:factory`, called with the observation and action spaces and
    `critic_net_kwargs` once per critic (TD3 and SAC have two), returning a module from a batch of observations and
    one of actions (in [-1, 1]) to Q values, `[batch]` or `[batch, 1]`. "": the built-in critics. With both
    `actor_net` and `critic_net`, `net` has nothing left to sit in (a new run refuses it)."""
    critic_net_kwargs: dict[str, Any] = checked(check=keyword_args_problem, default_factory=dict, needs="critic_net")
    """Keyword arguments of the `critic_net` factory."""

    def user_nets(self) -> UserNets:
        """The user's networks these fields name, as the continuous agents' networks take them."""
        return UserNets(
            self.net, self.net_kwargs, self.actor_net, self.actor_net_kwargs, self.critic_net, self.critic_net_kwargs
        )


@dataclass
class SDEOptions:
    """The gSDE fields of the on-policy algorithms' `Config`s (a2c, ppo)."""

    sde: bool = False
    """Box actions: explore with generalized state-dependent exploration (gSDE, Raffin et al. 2021) instead of
    independent Gaussian noise: the noise is a function of the policy's features, θᵀ z(s), with the matrix θ
    drawn anew every `sde_sample_freq` steps (see `StateDependentNoise`); `log_std` is then unused and
    `init_std` is σ of each entry of θ."""
    sde_sample_freq: int = bounded(-1, ge=-1, needs="sde")
    """gSDE: steps between new noise matrices; -1 or 0: only at the start of each rollout."""


@dataclass
class ReplayOptions:
    """The replay-loop fields the continuous off-policy algorithms' `Config`s share (ddpg, td3, sac)."""

    n_envs: int = bounded(1, ge=1, le=MAX_ENVS)
    """Parallel envs stepped in lockstep by one process."""
    buffer_size: int = bounded(100_000, ge=1)
    """Replay capacity in transitions; at least `batch_size` and `learning_starts` (see `replay_problem`)."""
    batch_size: int = bounded(64, ge=1)
    """Minibatch size."""
    learning_starts: int = bounded(1_000, ge=0)
    """Env steps collected before the first update (the replay must hold that many)."""
    random_steps: int = bounded(1_000, ge=0)
    """Env steps of uniformly random actions at the start (exploration warm-up)."""
    train_freq: int = bounded(1, ge=1)
    """Vector-env steps between training phases."""
    gradient_steps: int = bounded(1, ge=1)
    """Gradient steps per training phase."""
    gamma: float = bounded(0.98, ge=0, le=1)
    """Discount factor."""
    n_step: int = bounded(1, ge=1)
    """Steps of real reward before bootstrapping."""
    cuda_graph: bool = True
    """With the learner on a CUDA device, replay each update as a CUDA graph (`rlfleet.cuda_graph`): one launch for
    its few hundred small kernels, whose launching bounds the update of MLPs this size on a GPU. No effect on the
    CPU."""


@dataclass
class PriorityOptions:
    """Prioritized replay's fields (dqn, ddpg, td3). The `apex` architecture's replay is always prioritized and
    reads `alpha` and `beta` from here."""

    prioritized: bool = False
    """Prioritized replay (proportional, Schaul et al. 2016): transitions drawn in proportion to |TD error|^α,
    the loss weighted by importance weights."""
    alpha: float = bounded(0.6, ge=0, needs="prioritized")
    """Priority exponent."""
    beta: float = bounded(0.4, ge=0, le=1, needs="prioritized")
    """Importance-sampling exponent: its value at the start, annealed to 1 over the run if `beta_anneal`."""
    beta_anneal: bool = field(default=True, metadata={NEEDS: "prioritized"})
    """Anneal β linearly from `beta` to 1 over the run (Schaul et al.); False: β stays `beta` (Ape-X, Horgan et
    al. 2018, and the `apex` presets)."""


def make_replay_buffer(cfg: Any, n_envs: int, total_steps: int, seed: int = 0) -> ReplayBuffer:
    """The n-step replay of a `ReplayOptions` + `PriorityOptions` config: prioritized (β annealed to 1 over the
    run's updates if `cfg.beta_anneal`) when `cfg.prioritized`, uniform otherwise."""
    common = dict(capacity=cfg.buffer_size, n_envs=n_envs, n_step=cfg.n_step, gamma=cfg.gamma, seed=seed)
    if not cfg.prioritized:
        return ReplayBuffer(**common)
    anneal = beta_anneal_steps(cfg, n_envs, total_steps)
    return PrioritizedReplayBuffer(**common, alpha=cfg.alpha, beta=cfg.beta, beta_final=1.0, beta_anneal_steps=anneal)


def beta_anneal_steps(cfg: Any, n_envs: int, total_steps: int) -> int:
    """The `sample` calls over which β anneals to 1 (0: it stays `beta`): the run's updates, `gradient_steps` for
    every `train_freq` steps of its `n_envs` envs. A buffer whose columns are not the envs (a multi-agent policy's:
    one per env copy and agent) takes the number of env copies here, not its columns."""
    if not cfg.beta_anneal:
        return 0
    updates = max(1, (total_steps - cfg.learning_starts) // (cfg.train_freq * n_envs))
    return int(updates * cfg.gradient_steps)


def replay_problem(cfg: Any) -> str | None:
    """What keeps a replay algorithm's config from ever updating, or None: learning starts once the replay holds
    max(`batch_size`, `learning_starts`) transitions (`ReplayBuffer.ready`; where the replay holds sequences, the
    batch counts sequences and the replay their steps), and a replay holds at most `buffer_size` of them: a larger
    batch or `learning_starts` and the run would step its envs to the end without one update. (Its rows round
    `buffer_size` down to a multiple of the env columns: where that falls below either, it learns once full.)"""
    size = getattr(cfg, "buffer_size", None)
    if size is None:
        return None
    batch, starts = cfg.batch_size, cfg.learning_starts
    if batch > size:
        return (
            f"buffer_size={size} holds fewer transitions than a batch (batch_size={batch}), so the run would never "
            f"update: set buffer_size >= {batch}"
        )
    if starts > size:
        return (
            f"learning_starts={starts} is more than buffer_size={size} ever holds, so the run would never update: set "
            f"buffer_size >= {starts} or learning_starts <= {size}"
        )
    return None

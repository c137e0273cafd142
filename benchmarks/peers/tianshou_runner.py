"""Time-to-solve CartPole-v1 or Pendulum-v1 for one Tianshou 2.0.1 run, with the settings of Tianshou's own tests;
or the final return after a fixed budget (``--steps``), also on Hopper-v5 and HalfCheetah-v5 with the settings
of Tianshou's MuJoCo examples (``MUJOCO_BUILDERS``: see the end of this docstring).

Hyperparameters: the ``get_args()`` defaults of Tianshou's test scripts for that algorithm on that env
(thu-ml/tianshou, ``test/`` folder, Tianshou 2.0 API: ``tianshou.algorithm``, ``*TrainerParams``; these scripts
are not shipped in the 2.0.1 wheel or sdist), one builder per (algo, env) in ``BUILDERS``.

CartPole-v1 (``test/discrete/``). The PG test is ``test_pg.py`` (called ``test_reinforce.py`` in later
revisions: PGPolicy became ``Reinforce`` in 2.0) and the A2C test is ``test_a2c_with_il.py`` (its A2C stage):

- ppo (test/discrete/test_ppo.py): lr=3e-4, gamma=0.99, num_train_envs=20, collection_step_num_env_steps=2000,
  update_step_num_repetitions=10, batch_size=64, hidden_sizes=[64, 64] shared by DiscreteActor and
  DiscreteCritic, orthogonal init (gain 1, zero bias), vf_coef=0.5, ent_coef=0.0, eps_clip=0.2,
  max_grad_norm=0.5, gae_lambda=0.95, return_scaling=False, advantage_normalization=False,
  recompute_advantage=False, dual_clip=None, value_clip=False, buffer_size=20000;
  budget max_epochs=10 x epoch_num_steps=50000.
- a2c (test/discrete/test_a2c_with_il.py): lr=1e-3, gamma=0.9, num_train_envs=16,
  collection_step_num_episodes=16, update_step_num_repetitions=1, batch_size=64, hidden_sizes=[64, 64]
  shared by DiscreteActor and DiscreteCritic (default init), vf_coef=0.5, ent_coef=0.0, max_grad_norm=None,
  gae_lambda=1.0, return_scaling=False, buffer_size=20000; budget 10 x 50000.
- dqn (test/discrete/test_dqn.py): lr=1e-3, gamma=0.9, n_step_return_horizon=3, target_update_freq=320,
  num_train_envs=10, collection_step_num_env_steps=10, update_per_step=0.1, batch_size=64,
  hidden_sizes=[128, 128, 128, 128], eps_train=0.1 annealed by env step (0.1 up to 10k steps, linearly to
  0.01 at 50k, then 0.01), eps_test=0.05, plain VectorReplayBuffer(20000), is_double=True (DQN default),
  prefill of batch_size x num_train_envs = 640 steps before training; budget 20 x 10000.
- pg (test/discrete/test_pg.py): Reinforce, lr=1e-3, gamma=0.95, num_train_envs=8,
  collection_step_num_episodes=8, update_step_num_repetitions=2, batch_size=64, Net(hidden_sizes=[64, 64],
  softmax=True), orthogonal init (gain sqrt(2), zero bias), return_standardization=True, buffer_size=20000;
  budget 10 x 40000.

Pendulum-v1 (``test/continuous/``; the SAC test is the SAC stage of ``test_sac_with_il.py``; tianshou.utils.net
continuous nets: ContinuousActorProbabilistic, ContinuousActorDeterministic, ContinuousCritic on a Net of the
concatenated observation and action):

- sac (test/continuous/test_sac_with_il.py): actor_lr=1e-3, critic_lr=1e-3, gamma=0.99, tau=0.005,
  auto_alpha=1 (AutoAlpha: target entropy -dim(A) = -1, initial log alpha 0, alpha_lr=3e-4; the fixed
  alpha=0.2 is unused), n_step_return_horizon=3, num_train_envs=10, collection_step_num_env_steps=10,
  update_per_step=0.1, batch_size=128, hidden_sizes=[128, 128] for the actor (unbounded Gaussian, squashed by
  SACPolicy's tanh) and each of the two critics, buffer_size=20000; budget max_epochs=10 x epoch_num_steps=24000.
- td3 (test/continuous/test_td3.py): actor_lr=1e-4, critic_lr=1e-3, gamma=0.99, tau=0.005,
  exploration_noise=GaussianNoise(sigma=0.1), policy_noise=0.2, noise_clip=0.5, update_actor_freq=2,
  n_step_return_horizon=3, num_train_envs=8, collection_step_num_env_steps=8, update_per_step=0.125,
  batch_size=128, hidden_sizes=[128, 128] for the actor (max_action=2, i.e. 2·tanh, then the policy's default
  clip to [-1, 1] and scaling to the action range, as in the test: Tianshou warns about it) and each of the
  two critics, buffer_size=20000; budget 5 x 20000.
- ddpg (test/continuous/test_ddpg.py): the td3 settings without the TD3 parts: actor_lr=1e-4,
  critic_lr=1e-3, gamma=0.99, tau=0.005, exploration_noise=GaussianNoise(sigma=0.1), n_step_return_horizon=3,
  num_train_envs=8, collection_step_num_env_steps=8, update_per_step=0.125, batch_size=128,
  hidden_sizes=[128, 128] for the actor (max_action=2, as for td3) and the critic, buffer_size=20000;
  budget 5 x 20000. (The test's ``--return_scaling`` flag is parsed but passed to nothing.)
- ppo (test/continuous/test_ppo.py): lr=1e-3, gamma=0.95, num_train_envs=16, collection_step_num_episodes=16,
  update_step_num_repetitions=2, batch_size=128, hidden_sizes=[64, 64] for the actor (unbounded Gaussian,
  state-independent sigma, ``Independent(Normal)``) and a separate [64, 64] critic, orthogonal init (gain 1,
  zero bias), vf_coef=0.25, ent_coef=0.0, eps_clip=0.2, max_grad_norm=0.5, gae_lambda=0.95,
  return_scaling=True, advantage_normalization=True, recompute_advantage=False, dual_clip=None,
  value_clip=True, buffer_size=20000, the policy's default action clipping to [-1, 1] and scaling to the
  action range; budget 5 x 150000.

The sac and ddpg values are those of 2.0-API revisions of their tests. For test_td3.py and test_ppo.py the
values are those of the latest revisions consulted, from before these two files were ported to the 2.0 API
(test_ppo.py: a revision in the middle of the 2.0 renaming; test_td3.py: a 1.x revision), written here with
the 2.0 API like the others.

All use Adam (AdamOptimizerFactory), a DummyVectorEnv of gymnasium envs, a VectorReplayBuffer and the seeding
of the tests (np.random.seed, torch.manual_seed, train_envs.seed) with the run's seed instead of the tests'
default. The step limit is each test's budget (max_epochs x epoch_num_steps).

What differs from the tests, all for the shared protocol (benchmarks/README.md): ``torch.set_num_threads(1)``
and CPU; the tests' 100-episode test collector, their reward threshold (195 for CartPole-v1, -250 for
Pendulum-v1) and ``test_in_train`` are replaced by a greedy evaluation (``deterministic_eval=True`` for the
actor policies: for PPO on Pendulum-v1 too, where the test samples; SACPolicy's default; no exploration noise
for DQN, TD3 and DDPG) of 10 episodes side by side, one in each of 10 separate envs, run at the first
training-step boundary at or past every 2,000 env steps, whose time counts; the run stops at the first
evaluation with mean return >= the env's solved return (475, -250) or at the wall-clock limit. The SAC test's
imitation-learning stage is not run. Training is driven by Tianshou's own trainer (``algorithm.create_trainer``
then ``reset`` and ``execute_epoch``), with epochs sized so that the evaluations, run between epochs, fall on
schedule (see ``epoch_num_steps``); epochs have no other effect on these algorithms. (PPO on Pendulum-v1
collects 16 whole 200-step episodes, exactly 3,200 env steps, per epoch: it is evaluated every 3,200 steps.)

Fixed budget (``--steps N``): the same builders (and ``MUJOCO_BUILDERS`` on Hopper-v5 and HalfCheetah-v5),
training until the first epoch end at or past N env steps (prefill included), then one greedy evaluation of
10 episodes as above. On the MuJoCo envs, the ``get_args()`` defaults of ``examples/mujoco/mujoco_sac.py`` and
``mujoco_ppo.py`` (sac: 1 env, replay 1M, 10,000 random steps first, 1 update per step, batch 256, Adam 1e-3,
fixed alpha 0.2, Net [256, 256]; ppo: 8 envs, 2,048-step collections, 10 repetitions, batch 64, Adam 3e-4
decayed to 0 over N, Net [64, 64] tanh, observation normalisation), with a DummyVectorEnv instead of the
examples' ShmemVectorEnv; where the values come from, and every one of them: benchmarks/mujoco_return.py.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import gymnasium as gym
import numpy as np
import torch
from common import (
    CONTINUOUS_ENV_ID,
    ENV_ID,
    EVAL_EPISODES,
    EVAL_EVERY_STEPS,
    EVAL_SEED_OFFSET,
    MUJOCO_ENV_IDS,
    Clock,
    Tracker,
    arg_parser,
    emit,
    final_return_result,
    library_versions,
    parse_run_args,
)
from tianshou.algorithm import A2C, DDPG, DQN, PPO, SAC, TD3, Algorithm, Reinforce
from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
from tianshou.algorithm.modelfree.sac import AutoAlpha, SACPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory, LRSchedulerFactoryLinear
from tianshou.data import Collector, CollectStats, VectorReplayBuffer
from tianshou.env import BaseVectorEnv, DummyVectorEnv, VectorEnvNormObs
from tianshou.exploration import GaussianNoise
from tianshou.trainer import OffPolicyTrainerParams, OnlineTrainerParams, OnPolicyTrainerParams, Trainer
from tianshou.utils.net.common import ActorCritic, Net
from tianshou.utils.net.continuous import ContinuousActorDeterministic, ContinuousActorProbabilistic, ContinuousCritic
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic
from torch import nn
from torch.distributions import Distribution, Independent, Normal

BUFFER_SIZE = 20_000


@dataclass
class Setup:
    """Everything a run needs once built: the algorithm, its training collector and trainer parameters."""

    algorithm: Algorithm
    training_collector: Collector[CollectStats]
    trainer_params: OnlineTrainerParams
    step_limit: int
    prefill_steps: int = 0
    """Env steps collected before the trainer starts (DQN's replay-buffer prefill, SAC's random warm-up on
    MuJoCo); collected after the clock starts and counted as training steps."""
    prefill_random: bool = False
    """Prefill with uniformly random actions (the MuJoCo examples' ``start_timesteps``), else with the policy."""
    normalized_envs: VectorEnvNormObs | None = None
    """The training envs when they normalize observations: the evaluation envs then read their statistics."""


def make_envs(num: int, seed: int, env_id: str = ENV_ID) -> DummyVectorEnv:
    envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(num)])
    envs.seed(seed)
    return envs


def training_collector(
    algorithm: Algorithm, envs: BaseVectorEnv, *, exploration_noise: bool = False, buffer_size: int = BUFFER_SIZE
) -> Collector[CollectStats]:
    return Collector[CollectStats](
        algorithm, envs, VectorReplayBuffer(buffer_size, len(envs)), exploration_noise=exploration_noise
    )


def env_spaces() -> tuple[tuple[int, ...], gym.spaces.Discrete]:
    """CartPole's observation shape and action space, as the tests read them from a probe env."""
    env = gym.make(ENV_ID)
    assert env.observation_space.shape is not None and isinstance(env.action_space, gym.spaces.Discrete)
    return env.observation_space.shape, env.action_space


def box_env_spaces(env_id: str = CONTINUOUS_ENV_ID) -> tuple[tuple[int, ...], gym.spaces.Box]:
    """A Box-action env's (Pendulum's by default) observation shape and action space, read from a probe env."""
    env = gym.make(env_id)
    assert env.observation_space.shape is not None and isinstance(env.action_space, gym.spaces.Box)
    return env.observation_space.shape, env.action_space


def epoch_num_steps(collection_steps: int | None, prefill_steps: int = 0) -> int:
    """Env steps per trainer epoch, so that the protocol's evaluations (run between epochs) are on schedule.

    With fixed-size collections: the largest count whose epoch ends fall on every multiple of 2,000 env
    steps, prefill included (fewest epochs: each costs some trainer bookkeeping). With whole-episode
    collections, of unpredictable length: 1, i.e. one collection per epoch.
    """
    if collection_steps is None:
        return 1
    steps = math.gcd(EVAL_EVERY_STEPS, prefill_steps % EVAL_EVERY_STEPS)  # gcd(n, 0) == n
    assert steps % collection_steps == 0, "collections must not straddle an evaluation point"
    return steps


def on_policy_params(
    collector: Collector[CollectStats],
    *,
    batch_size: int,
    repetitions: int,
    env_steps: int | None = None,
    episodes: int | None = None,
    epoch_steps: int | None = None,
) -> OnPolicyTrainerParams:
    """``epoch_steps``: env steps per epoch, by default as :func:`epoch_num_steps` says."""
    return OnPolicyTrainerParams(
        training_collector=collector,
        epoch_num_steps=epoch_steps or epoch_num_steps(env_steps),
        max_epochs=sys.maxsize,
        collection_step_num_env_steps=env_steps,
        collection_step_num_episodes=episodes,
        update_step_num_repetitions=repetitions,
        batch_size=batch_size,
        verbose=False,
        show_progress=False,
    )


def orthogonal_init(module: torch.nn.Module, gain: float = 1.0) -> None:
    """Orthogonal weights (with this gain) and zero biases for every linear layer of ``module``."""
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.orthogonal_(m.weight, gain=gain)
            torch.nn.init.zeros_(m.bias)


def build_ppo(seed: int) -> Setup:
    obs_shape, action_space = env_spaces()
    train_envs = make_envs(20, seed)
    net = Net(state_shape=obs_shape, hidden_sizes=[64, 64])
    actor = DiscreteActor(preprocess_net=net, action_shape=int(action_space.n))
    critic = DiscreteCritic(preprocess_net=net)
    orthogonal_init(ActorCritic(actor, critic))
    policy = ProbabilisticActorPolicy(
        actor=actor,
        dist_fn=torch.distributions.Categorical,
        action_scaling=False,
        action_space=action_space,
        deterministic_eval=True,
    )
    algorithm = PPO(
        policy=policy,
        critic=critic,
        optim=AdamOptimizerFactory(lr=3e-4),
        gamma=0.99,
        max_grad_norm=0.5,
        eps_clip=0.2,
        vf_coef=0.5,
        ent_coef=0.0,
        gae_lambda=0.95,
        return_scaling=False,
        dual_clip=None,
        value_clip=False,
        advantage_normalization=False,
        recompute_advantage=False,
    )
    collector = training_collector(algorithm, train_envs)
    params = on_policy_params(collector, batch_size=64, repetitions=10, env_steps=2000)
    return Setup(algorithm, collector, params, step_limit=10 * 50_000)


def build_a2c(seed: int) -> Setup:
    obs_shape, action_space = env_spaces()
    train_envs = make_envs(16, seed)
    net = Net(state_shape=obs_shape, hidden_sizes=[64, 64])
    actor = DiscreteActor(preprocess_net=net, action_shape=int(action_space.n))
    critic = DiscreteCritic(preprocess_net=net)
    policy = ProbabilisticActorPolicy(
        actor=actor,
        dist_fn=torch.distributions.Categorical,
        action_scaling=False,
        action_space=action_space,
        deterministic_eval=True,
    )
    algorithm = A2C(
        policy=policy,
        critic=critic,
        optim=AdamOptimizerFactory(lr=1e-3),
        gamma=0.9,
        gae_lambda=1.0,
        vf_coef=0.5,
        ent_coef=0.0,
        max_grad_norm=None,
        return_scaling=False,
    )
    collector = training_collector(algorithm, train_envs)
    params = on_policy_params(collector, batch_size=64, repetitions=1, episodes=16)
    return Setup(algorithm, collector, params, step_limit=10 * 50_000)


def build_pg(seed: int) -> Setup:
    obs_shape, action_space = env_spaces()
    train_envs = make_envs(8, seed)
    net = Net(state_shape=obs_shape, action_shape=int(action_space.n), hidden_sizes=[64, 64], softmax=True)
    policy = ProbabilisticActorPolicy(
        actor=net,
        dist_fn=torch.distributions.Categorical,
        action_scaling=False,
        action_space=action_space,
        deterministic_eval=True,
    )
    algorithm = Reinforce(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.95, return_standardization=True)
    orthogonal_init(net, gain=np.sqrt(2))
    collector = training_collector(algorithm, train_envs)
    params = on_policy_params(collector, batch_size=64, repetitions=2, episodes=8)
    return Setup(algorithm, collector, params, step_limit=10 * 40_000)


def dqn_eps_schedule(policy: DiscreteQLearningPolicy, eps_train: float) -> Callable[[int, int], None]:
    """test_dqn.py's ``train_fn``: epsilon by env step, called by the trainer before each collection."""

    def training_fn(epoch: int, env_step: int) -> None:
        if env_step <= 10_000:
            policy.set_eps_training(eps_train)
        elif env_step <= 50_000:
            policy.set_eps_training(eps_train - (env_step - 10_000) / 40_000 * (0.9 * eps_train))
        else:
            policy.set_eps_training(0.1 * eps_train)

    return training_fn


def build_dqn(seed: int) -> Setup:
    obs_shape, action_space = env_spaces()
    train_envs = make_envs(10, seed)
    net = Net(state_shape=obs_shape, action_shape=int(action_space.n), hidden_sizes=[128, 128, 128, 128])
    policy = DiscreteQLearningPolicy(model=net, action_space=action_space, eps_training=0.1, eps_inference=0.05)
    algorithm = DQN(
        policy=policy,
        optim=AdamOptimizerFactory(lr=1e-3),
        gamma=0.9,
        n_step_return_horizon=3,
        target_update_freq=320,
    )
    collector = training_collector(algorithm, train_envs, exploration_noise=True)
    prefill_steps = 64 * len(train_envs)
    params = OffPolicyTrainerParams(
        training_collector=collector,
        epoch_num_steps=epoch_num_steps(10, prefill_steps),
        max_epochs=sys.maxsize,
        collection_step_num_env_steps=10,
        update_step_num_gradient_steps_per_sample=0.1,
        batch_size=64,
        training_fn=dqn_eps_schedule(policy, eps_train=0.1),
        verbose=False,
        show_progress=False,
    )
    return Setup(algorithm, collector, params, step_limit=20 * 10_000, prefill_steps=prefill_steps)


def off_policy_params(
    collector: Collector[CollectStats],
    *,
    env_steps: int,
    updates_per_step: float,
    batch_size: int,
    epoch_steps: int | None = None,
) -> OffPolicyTrainerParams:
    """``epoch_steps``: env steps per epoch, by default as :func:`epoch_num_steps` says."""
    return OffPolicyTrainerParams(
        training_collector=collector,
        epoch_num_steps=epoch_steps or epoch_num_steps(env_steps),
        max_epochs=sys.maxsize,
        collection_step_num_env_steps=env_steps,
        update_step_num_gradient_steps_per_sample=updates_per_step,
        batch_size=batch_size,
        verbose=False,
        show_progress=False,
    )


def q_critic(obs_shape: tuple[int, ...], action_space: gym.spaces.Box, hidden_sizes: list[int]) -> ContinuousCritic:
    """Q(s, a): an MLP on the concatenated observation and action, as in the tests."""
    net = Net(state_shape=obs_shape, action_shape=action_space.shape, hidden_sizes=hidden_sizes, concat=True)
    return ContinuousCritic(preprocess_net=net)


def sac_algorithm(
    actor: ContinuousActorProbabilistic,
    obs_shape: tuple[int, ...],
    action_space: gym.spaces.Box,
    hidden_sizes: list[int],
    alpha: float | AutoAlpha,
    n_step: int,
) -> SAC:
    """SAC as the SAC test and the MuJoCo example share it: Adam 1e-3 for the actor and for each of the two
    critics (on Net ``hidden_sizes``), tau 0.005, gamma 0.99; SACPolicy's greedy (mean) evaluation."""
    return SAC(
        policy=SACPolicy(actor=actor, action_space=action_space),  # deterministic_eval=True: the default
        policy_optim=AdamOptimizerFactory(lr=1e-3),
        critic=q_critic(obs_shape, action_space, hidden_sizes),
        critic_optim=AdamOptimizerFactory(lr=1e-3),
        critic2=q_critic(obs_shape, action_space, hidden_sizes),
        critic2_optim=AdamOptimizerFactory(lr=1e-3),
        tau=0.005,
        gamma=0.99,
        alpha=alpha,
        n_step_return_horizon=n_step,
    )


def build_sac_pendulum(seed: int) -> Setup:
    obs_shape, action_space = box_env_spaces()
    train_envs = make_envs(10, seed, CONTINUOUS_ENV_ID)
    net = Net(state_shape=obs_shape, hidden_sizes=[128, 128])
    actor = ContinuousActorProbabilistic(preprocess_net=net, action_shape=action_space.shape, unbounded=True)
    alpha = AutoAlpha(
        target_entropy=-float(np.prod(action_space.shape)), log_alpha=0.0, optim=AdamOptimizerFactory(lr=3e-4)
    )
    algorithm = sac_algorithm(actor, obs_shape, action_space, [128, 128], alpha, n_step=3)
    collector = training_collector(algorithm, train_envs, exploration_noise=True)
    params = off_policy_params(collector, env_steps=10, updates_per_step=0.1, batch_size=128)
    return Setup(algorithm, collector, params, step_limit=10 * 24_000)


def deterministic_policy(obs_shape: tuple[int, ...], action_space: gym.spaces.Box) -> ContinuousDeterministicPolicy:
    """The TD3 and DDPG tests' actor, tanh-bounded to the action range, and its Gaussian exploration noise."""
    net = Net(state_shape=obs_shape, hidden_sizes=[128, 128])
    max_action = float(np.max(action_space.high))
    actor = ContinuousActorDeterministic(preprocess_net=net, action_shape=action_space.shape, max_action=max_action)
    return ContinuousDeterministicPolicy(
        actor=actor, exploration_noise=GaussianNoise(sigma=0.1), action_space=action_space
    )


def build_td3_pendulum(seed: int) -> Setup:
    obs_shape, action_space = box_env_spaces()
    train_envs = make_envs(8, seed, CONTINUOUS_ENV_ID)
    policy = deterministic_policy(obs_shape, action_space)
    algorithm = TD3(
        policy=policy,
        policy_optim=AdamOptimizerFactory(lr=1e-4),
        critic=q_critic(obs_shape, action_space, [128, 128]),
        critic_optim=AdamOptimizerFactory(lr=1e-3),
        critic2=q_critic(obs_shape, action_space, [128, 128]),
        critic2_optim=AdamOptimizerFactory(lr=1e-3),
        tau=0.005,
        gamma=0.99,
        policy_noise=0.2,
        update_actor_freq=2,
        noise_clip=0.5,
        n_step_return_horizon=3,
    )
    collector = training_collector(algorithm, train_envs, exploration_noise=True)
    params = off_policy_params(collector, env_steps=8, updates_per_step=0.125, batch_size=128)
    return Setup(algorithm, collector, params, step_limit=5 * 20_000)


def build_ddpg_pendulum(seed: int) -> Setup:
    obs_shape, action_space = box_env_spaces()
    train_envs = make_envs(8, seed, CONTINUOUS_ENV_ID)
    policy = deterministic_policy(obs_shape, action_space)
    algorithm = DDPG(
        policy=policy,
        policy_optim=AdamOptimizerFactory(lr=1e-4),
        critic=q_critic(obs_shape, action_space, [128, 128]),
        critic_optim=AdamOptimizerFactory(lr=1e-3),
        tau=0.005,
        gamma=0.99,
        n_step_return_horizon=3,
    )
    collector = training_collector(algorithm, train_envs, exploration_noise=True)
    params = off_policy_params(collector, env_steps=8, updates_per_step=0.125, batch_size=128)
    return Setup(algorithm, collector, params, step_limit=5 * 20_000)


def independent_normal(loc_scale: tuple[torch.Tensor, torch.Tensor]) -> Distribution:
    """A diagonal Gaussian over the action dimensions (the PPO test's ``dist``)."""
    loc, scale = loc_scale
    return Independent(Normal(loc, scale), 1)


def build_ppo_pendulum(seed: int) -> Setup:
    obs_shape, action_space = box_env_spaces()
    train_envs = make_envs(16, seed, CONTINUOUS_ENV_ID)
    net = Net(state_shape=obs_shape, hidden_sizes=[64, 64])
    actor = ContinuousActorProbabilistic(preprocess_net=net, action_shape=action_space.shape, unbounded=True)
    critic = ContinuousCritic(preprocess_net=Net(state_shape=obs_shape, hidden_sizes=[64, 64]))
    orthogonal_init(ActorCritic(actor, critic))
    policy = ProbabilisticActorPolicy(
        actor=actor, dist_fn=independent_normal, action_space=action_space, deterministic_eval=True
    )
    algorithm = PPO(
        policy=policy,
        critic=critic,
        optim=AdamOptimizerFactory(lr=1e-3),
        gamma=0.95,
        max_grad_norm=0.5,
        eps_clip=0.2,
        vf_coef=0.25,
        ent_coef=0.0,
        gae_lambda=0.95,
        return_scaling=True,
        dual_clip=None,
        value_clip=True,
        advantage_normalization=True,
        recompute_advantage=False,
    )
    collector = training_collector(algorithm, train_envs)
    params = on_policy_params(collector, batch_size=128, repetitions=2, episodes=16)
    return Setup(algorithm, collector, params, step_limit=5 * 150_000)


MUJOCO_START_TIMESTEPS = 10_000
"""mujoco_sac.py's ``start_timesteps``: uniformly random env steps before learning (within the budget here)."""
PPO_MUJOCO_COLLECTION_STEPS = 2048
MUJOCO_PPO_SETTINGS = {
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "max_grad_norm": 0.5,
    "vf_coef": 0.25,
    "ent_coef": 0.0,
    "return_scaling": True,
    "eps_clip": 0.2,
    "value_clip": False,
    "dual_clip": None,
    "advantage_normalization": False,
    "recompute_advantage": True,
}
"""mujoco_ppo.py's PPO arguments (its ``get_args()`` defaults)."""


def build_sac_mujoco(env_id: str, seed: int, steps: int) -> Setup:
    """examples/mujoco/mujoco_sac.py's defaults, on ``steps`` env steps (random warm-up included)."""
    obs_shape, action_space = box_env_spaces(env_id)
    train_envs = make_envs(1, seed, env_id)
    net = Net(state_shape=obs_shape, hidden_sizes=[256, 256])
    actor = ContinuousActorProbabilistic(
        preprocess_net=net, action_shape=action_space.shape, unbounded=True, conditioned_sigma=True
    )
    algorithm = sac_algorithm(actor, obs_shape, action_space, [256, 256], alpha=0.2, n_step=1)
    collector = training_collector(algorithm, train_envs, exploration_noise=True, buffer_size=1_000_000)
    prefill = min(MUJOCO_START_TIMESTEPS, steps)
    # epochs of at most 2,000 steps, the last one ending exactly on the budget
    epoch_steps = math.gcd(2_000, steps - prefill)
    params = off_policy_params(collector, env_steps=1, updates_per_step=1, batch_size=256, epoch_steps=epoch_steps)
    return Setup(algorithm, collector, params, step_limit=steps, prefill_steps=prefill, prefill_random=True)


def build_ppo_mujoco(env_id: str, seed: int, steps: int) -> Setup:
    """examples/mujoco/mujoco_ppo.py's defaults, the learning rate decaying to 0 over ``steps`` env steps."""
    obs_shape, action_space = box_env_spaces(env_id)
    train_envs = VectorEnvNormObs(make_envs(8, seed, env_id))
    actor = ContinuousActorProbabilistic(
        preprocess_net=Net(state_shape=obs_shape, hidden_sizes=[64, 64], activation=nn.Tanh),
        action_shape=action_space.shape,
        unbounded=True,
    )
    critic = ContinuousCritic(preprocess_net=Net(state_shape=obs_shape, hidden_sizes=[64, 64], activation=nn.Tanh))
    torch.nn.init.constant_(actor.sigma_param, -0.5)
    orthogonal_init(ActorCritic(actor, critic), gain=np.sqrt(2))
    # the example's last policy layer scaling: initial actions close to 0 mean
    for m in actor.mu.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.zeros_(m.bias)
            m.weight.data.copy_(0.01 * m.weight.data)
    optim = AdamOptimizerFactory(lr=3e-4)
    optim.with_lr_scheduler_factory(
        LRSchedulerFactoryLinear(
            max_epochs=1, epoch_num_steps=steps, collection_step_num_env_steps=PPO_MUJOCO_COLLECTION_STEPS
        )
    )
    policy = ProbabilisticActorPolicy(
        actor=actor,
        dist_fn=independent_normal,
        action_scaling=True,
        action_bound_method="clip",
        action_space=action_space,
        deterministic_eval=True,
    )
    algorithm = PPO(policy=policy, critic=critic, optim=optim, **MUJOCO_PPO_SETTINGS)
    collector = training_collector(algorithm, train_envs, exploration_noise=True, buffer_size=4096)
    params = on_policy_params(
        collector,
        batch_size=64,
        repetitions=10,
        env_steps=PPO_MUJOCO_COLLECTION_STEPS,
        epoch_steps=PPO_MUJOCO_COLLECTION_STEPS,
    )
    return Setup(algorithm, collector, params, step_limit=steps, normalized_envs=train_envs)


BUILDERS: dict[tuple[str, str], Callable[[int], Setup]] = {
    ("ppo", ENV_ID): build_ppo,
    ("a2c", ENV_ID): build_a2c,
    ("dqn", ENV_ID): build_dqn,
    ("pg", ENV_ID): build_pg,
    ("sac", CONTINUOUS_ENV_ID): build_sac_pendulum,
    ("td3", CONTINUOUS_ENV_ID): build_td3_pendulum,
    ("ddpg", CONTINUOUS_ENV_ID): build_ddpg_pendulum,
    ("ppo", CONTINUOUS_ENV_ID): build_ppo_pendulum,
}
"""One builder per (algo, env): the settings of Tianshou's test of that algorithm on that env."""
MUJOCO_BUILDERS: dict[tuple[str, str], Callable[[int, int], Setup]] = {
    **{("sac", env): partial(build_sac_mujoco, env) for env in MUJOCO_ENV_IDS},
    **{("ppo", env): partial(build_ppo_mujoco, env) for env in MUJOCO_ENV_IDS},
}
"""One builder per (algo, MuJoCo env), called with the seed and the budget (``--steps``): the settings of
Tianshou's MuJoCo example of that algorithm."""


def start_training(setup: Setup, trainer: Trainer) -> int:
    """Prefill (if any), then reset the trainer; return the env steps taken so far."""
    if setup.prefill_steps:
        setup.training_collector.reset()
        setup.training_collector.collect(n_step=setup.prefill_steps, random=setup.prefill_random)
    trainer.reset()  # resets the collectors' envs and counters, not the buffer (as run_training does)
    return setup.prefill_steps


def train_epoch(setup: Setup, trainer: Trainer) -> int:
    """Run one trainer epoch; return the env steps taken so far (prefill included)."""
    return setup.prefill_steps + trainer.execute_epoch().info_stat.train_step


def main() -> None:
    algos = sorted({algo for algo, _ in [*BUILDERS, *MUJOCO_BUILDERS]})
    args = parse_run_args(arg_parser("tianshou", algos), BUILDERS.keys() | MUJOCO_BUILDERS.keys())
    torch.set_num_threads(1)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    key = (args.algo, args.env)
    setup = MUJOCO_BUILDERS[key](args.seed, args.steps) if key in MUJOCO_BUILDERS else BUILDERS[key](args.seed)
    # one env per evaluation episode: the collector runs one episode in each
    eval_envs: BaseVectorEnv = make_envs(EVAL_EPISODES, args.seed + EVAL_SEED_OFFSET, args.env)
    if setup.normalized_envs is not None:  # the training envs' observation statistics, read-only
        eval_envs = VectorEnvNormObs(eval_envs, update_obs_rms=False)
        eval_envs.set_obs_rms(setup.normalized_envs.get_obs_rms())
    eval_collector = Collector[CollectStats](setup.algorithm, eval_envs)
    trainer = setup.algorithm.create_trainer(setup.trainer_params)
    run = {
        "framework": "tianshou",
        "version": library_versions("tianshou")["tianshou"],
        "algo": args.algo,
        "seed": args.seed,
        "libraries": library_versions("torch", "gymnasium", "numpy", "mujoco"),
    }

    if args.steps is not None:  # fixed budget, then one greedy evaluation
        clock = Clock()
        clock.start()
        env_steps = start_training(setup, trainer)
        while env_steps < args.steps:
            env_steps = train_epoch(setup, trainer)
        stats = eval_collector.collect(n_episode=EVAL_EPISODES, reset_before_collect=True)
        emit(final_return_result(clock, stats.returns, env=args.env, steps=args.steps, env_steps=env_steps, **run))
        return

    tracker = Tracker(args.env, args.time_limit, step_limit=setup.step_limit)
    tracker.start()
    start_training(setup, trainer)
    while True:
        env_steps = train_epoch(setup, trainer)
        if not tracker.eval_due(env_steps):
            continue
        stats = eval_collector.collect(n_episode=EVAL_EPISODES, reset_before_collect=True)
        assert stats.returns_stat is not None
        if tracker.record(env_steps, stats.returns_stat.mean):
            break
    emit(tracker.result(env_steps=env_steps, **run))


if __name__ == "__main__":
    with contextlib.redirect_stdout(sys.stderr):
        main()

"""Time-to-solve CartPole-v1 or Pendulum-v1 for one Tianshou 2.0.1 run, with the settings of Tianshou's own tests.

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
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from common import (
    CONTINUOUS_ENV_ID,
    ENV_ID,
    EVAL_EPISODES,
    EVAL_EVERY_STEPS,
    EVAL_SEED_OFFSET,
    Tracker,
    arg_parser,
    emit,
    library_versions,
    parse_run_args,
)
from tianshou.algorithm import A2C, DDPG, DQN, PPO, SAC, TD3, Algorithm, Reinforce
from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
from tianshou.algorithm.modelfree.sac import AutoAlpha, SACPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.exploration import GaussianNoise
from tianshou.trainer import OffPolicyTrainerParams, OnlineTrainerParams, OnPolicyTrainerParams
from tianshou.utils.net.common import ActorCritic, Net
from tianshou.utils.net.continuous import ContinuousActorDeterministic, ContinuousActorProbabilistic, ContinuousCritic
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic
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
    """Env steps collected before the trainer starts (DQN's replay-buffer prefill); collected after the
    clock starts and counted as training steps."""


def make_envs(num: int, seed: int, env_id: str = ENV_ID) -> DummyVectorEnv:
    envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(num)])
    envs.seed(seed)
    return envs


def training_collector(
    algorithm: Algorithm, envs: DummyVectorEnv, *, exploration_noise: bool = False
) -> Collector[CollectStats]:
    return Collector[CollectStats](
        algorithm, envs, VectorReplayBuffer(BUFFER_SIZE, len(envs)), exploration_noise=exploration_noise
    )


def env_spaces() -> tuple[tuple[int, ...], gym.spaces.Discrete]:
    """CartPole's observation shape and action space, as the tests read them from a probe env."""
    env = gym.make(ENV_ID)
    assert env.observation_space.shape is not None and isinstance(env.action_space, gym.spaces.Discrete)
    return env.observation_space.shape, env.action_space


def box_env_spaces() -> tuple[tuple[int, ...], gym.spaces.Box]:
    """Pendulum's observation shape and action space, as the tests read them from a probe env."""
    env = gym.make(CONTINUOUS_ENV_ID)
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
) -> OnPolicyTrainerParams:
    return OnPolicyTrainerParams(
        training_collector=collector,
        epoch_num_steps=epoch_num_steps(env_steps),
        max_epochs=sys.maxsize,
        collection_step_num_env_steps=env_steps,
        collection_step_num_episodes=episodes,
        update_step_num_repetitions=repetitions,
        batch_size=batch_size,
        verbose=False,
        show_progress=False,
    )


def build_ppo(seed: int) -> Setup:
    obs_shape, action_space = env_spaces()
    train_envs = make_envs(20, seed)
    net = Net(state_shape=obs_shape, hidden_sizes=[64, 64])
    actor = DiscreteActor(preprocess_net=net, action_shape=int(action_space.n))
    critic = DiscreteCritic(preprocess_net=net)
    for m in ActorCritic(actor, critic).modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.orthogonal_(m.weight)
            torch.nn.init.zeros_(m.bias)
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
    for m in net.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.orthogonal_(m.weight, gain=np.sqrt(2))
            torch.nn.init.zeros_(m.bias)
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
    collector: Collector[CollectStats], *, env_steps: int, updates_per_step: float, batch_size: int
) -> OffPolicyTrainerParams:
    return OffPolicyTrainerParams(
        training_collector=collector,
        epoch_num_steps=epoch_num_steps(env_steps),
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


def build_sac_pendulum(seed: int) -> Setup:
    obs_shape, action_space = box_env_spaces()
    train_envs = make_envs(10, seed, CONTINUOUS_ENV_ID)
    net = Net(state_shape=obs_shape, hidden_sizes=[128, 128])
    actor = ContinuousActorProbabilistic(preprocess_net=net, action_shape=action_space.shape, unbounded=True)
    critic1 = q_critic(obs_shape, action_space, [128, 128])
    critic2 = q_critic(obs_shape, action_space, [128, 128])
    alpha = AutoAlpha(
        target_entropy=-float(np.prod(action_space.shape)), log_alpha=0.0, optim=AdamOptimizerFactory(lr=3e-4)
    )
    algorithm = SAC(
        policy=SACPolicy(actor=actor, action_space=action_space),  # deterministic_eval=True: the default
        policy_optim=AdamOptimizerFactory(lr=1e-3),
        critic=critic1,
        critic_optim=AdamOptimizerFactory(lr=1e-3),
        critic2=critic2,
        critic2_optim=AdamOptimizerFactory(lr=1e-3),
        tau=0.005,
        gamma=0.99,
        alpha=alpha,
        n_step_return_horizon=3,
    )
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
    for m in ActorCritic(actor, critic).modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.orthogonal_(m.weight)
            torch.nn.init.zeros_(m.bias)
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


def main() -> None:
    algos = sorted({algo for algo, _ in BUILDERS})
    args = parse_run_args(arg_parser("tianshou", algos), BUILDERS.keys())
    torch.set_num_threads(1)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    setup = BUILDERS[(args.algo, args.env)](args.seed)
    # one env per evaluation episode: the collector runs one episode in each
    eval_envs = make_envs(EVAL_EPISODES, args.seed + EVAL_SEED_OFFSET, args.env)
    eval_collector = Collector[CollectStats](setup.algorithm, eval_envs)
    trainer = setup.algorithm.create_trainer(setup.trainer_params)
    tracker = Tracker(args.env, args.time_limit, step_limit=setup.step_limit)

    tracker.start()
    if setup.prefill_steps:
        setup.training_collector.reset()
        setup.training_collector.collect(n_step=setup.prefill_steps)
    trainer.reset()  # resets the collectors' envs and counters, not the buffer (as run_training does)
    while True:
        env_steps = setup.prefill_steps + trainer.execute_epoch().info_stat.train_step
        if not tracker.eval_due(env_steps):
            continue
        stats = eval_collector.collect(n_episode=EVAL_EPISODES, reset_before_collect=True)
        assert stats.returns_stat is not None
        if tracker.record(env_steps, stats.returns_stat.mean):
            break

    emit(
        tracker.result(
            framework="tianshou",
            version=library_versions("tianshou")["tianshou"],
            algo=args.algo,
            seed=args.seed,
            env_steps=env_steps,
            libraries=library_versions("torch", "gymnasium", "numpy"),
        )
    )


if __name__ == "__main__":
    with contextlib.redirect_stdout(sys.stderr):
        main()

"""Time-to-solve CartPole-v1 for one Tianshou 2.0.1 run, with the hyperparameters of Tianshou's own tests.

Hyperparameters: the ``get_args()`` defaults of Tianshou's CartPole-v1 test scripts (thu-ml/tianshou,
``test/`` folder, Tianshou 2.0 API; these scripts are not shipped in the 2.0.1 wheel or sdist).
The PG test is ``test/discrete/test_pg.py`` (called ``test_reinforce.py`` in later revisions: PGPolicy became
``Reinforce`` in 2.0) and the A2C test is ``test/discrete/test_a2c_with_il.py`` (its A2C stage):

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

All use Adam (AdamOptimizerFactory), a DummyVectorEnv of gymnasium CartPole-v1 envs and the seeding of the
tests (np.random.seed, torch.manual_seed, train_envs.seed). The step limit is each test's budget
(max_epochs x epoch_num_steps).

What differs from the tests, all for the shared protocol (benchmarks/README.md): ``torch.set_num_threads(1)``
and CPU; the tests' 100-episode test collector, their 195 reward threshold and ``test_in_train`` are replaced
by a greedy evaluation (``deterministic_eval=True`` for the actor policies, no exploration noise for DQN) of
10 episodes side by side, one in each of 10 separate CartPole-v1 envs, run at the first training-step
boundary at or past every 2,000 env steps, whose time counts; the run stops at the first evaluation with mean
return >= 475 or at the wall-clock limit. Training is driven by Tianshou's own trainer
(``algorithm.create_trainer`` then ``reset`` and ``execute_epoch``), with epochs sized so that the
evaluations, run between epochs, fall on schedule (see ``epoch_num_steps``); epochs have no other effect on
these algorithms.
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
    ENV_ID,
    EVAL_EPISODES,
    EVAL_EVERY_STEPS,
    EVAL_SEED_OFFSET,
    Tracker,
    arg_parser,
    emit,
    library_versions,
)
from tianshou.algorithm import A2C, DQN, PPO, Algorithm, Reinforce
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams, OnlineTrainerParams, OnPolicyTrainerParams
from tianshou.utils.net.common import ActorCritic, Net
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

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


def make_envs(num: int, seed: int) -> DummyVectorEnv:
    envs = DummyVectorEnv([lambda: gym.make(ENV_ID) for _ in range(num)])
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


BUILDERS: dict[str, Callable[[int], Setup]] = {
    "ppo": build_ppo,
    "a2c": build_a2c,
    "dqn": build_dqn,
    "pg": build_pg,
}


def main() -> None:
    args = arg_parser("tianshou", list(BUILDERS)).parse_args()
    torch.set_num_threads(1)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    setup = BUILDERS[args.algo](args.seed)
    # one env per evaluation episode: the collector runs one episode in each
    eval_collector = Collector[CollectStats](setup.algorithm, make_envs(EVAL_EPISODES, args.seed + EVAL_SEED_OFFSET))
    trainer = setup.algorithm.create_trainer(setup.trainer_params)
    tracker = Tracker(args.time_limit, step_limit=setup.step_limit)

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

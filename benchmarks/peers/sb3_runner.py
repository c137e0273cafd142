"""Time-to-solve CartPole-v1, Pendulum-v1 or MountainCarContinuous-v0, or final return after a fixed budget on
Hopper-v5 or HalfCheetah-v5, for one Stable-Baselines3 run, with rl-zoo3's tuned hyperparameters.

Hyperparameters: the env's entry (``CartPole-v1``, ``Pendulum-v1``; ``Hopper-v4`` and ``HalfCheetah-v4`` for the
-v5 envs, the zoo having no -v5 entries: ``ZOO_ENTRIES``) of ``rl_zoo3/hyperparams/{algo}.yml``
as shipped inside the installed rl-zoo3 2.9.2 package (read at run time, not copied), pre-processed the way
rl-zoo3's ``ExperimentManager`` does it (``n_envs``, ``n_timesteps``, ``lin_<x>`` schedules, ``normalize``,
``policy_kwargs`` strings, ``train_freq`` lists, ``env_kwargs``, ``noise_type``/``noise_std`` ->
``NormalActionNoise`` or ``OrnsteinUhlenbeckActionNoise`` with that std on every action dimension). Other keys
(``use_sde``, ``sde_sample_freq``, ...) go to the model's constructor as they are. With rl-zoo3 2.9.2 these are:

CartPole-v1:

- ppo: n_envs=8, n_timesteps=1e5, policy=MlpPolicy, n_steps=32, batch_size=256, gae_lambda=0.8,
  gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate=lin_0.001, clip_range=lin_0.2
- a2c: n_envs=8, n_timesteps=5e5, policy=MlpPolicy, ent_coef=0.0 (everything else SB3's A2C defaults)
- dqn: n_envs=1, n_timesteps=5e4, policy=MlpPolicy, learning_rate=2.3e-3, batch_size=64,
  buffer_size=100000, learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
  gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
  policy_kwargs="dict(net_arch=[256, 256])"
- pg: SB3 has no vanilla policy gradient (REINFORCE); not run.

Pendulum-v1:

- sac: n_timesteps=20000, policy=MlpPolicy, learning_rate=1e-3 (everything else SB3's SAC defaults: 1 env,
  buffer_size=1e6, learning_starts=100, batch_size=256, tau=0.005, gamma=0.99, train_freq=1,
  gradient_steps=1, ent_coef="auto" (target entropy -1), net_arch=[256, 256])
- td3: n_timesteps=20000, policy=MlpPolicy, gamma=0.98, buffer_size=200000, learning_starts=10000,
  noise_type=normal, noise_std=0.1, gradient_steps=1, train_freq=1, learning_rate=1e-3,
  policy_kwargs="dict(net_arch=[400, 300])" (SB3 defaults: 1 env, batch_size=256, tau=0.005,
  policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5)
- ddpg: the same entry as td3 (SB3's DDPG is its TD3 with one critic, policy_delay=1 and the target policy
  noise clipped to 0)
- ppo: n_envs=4, n_timesteps=1e5, policy=MlpPolicy, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10,
  ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4 (SB3 defaults:
  batch_size=64, net_arch 64-64 for policy and value)

MountainCarContinuous-v0 (exploration; rlfleet runs its per-env presets there):

- td3: n_timesteps=300000, policy=MlpPolicy, noise_type=ornstein-uhlenbeck, noise_std=0.5, gradient_steps=1,
  train_freq=1, learning_rate=1e-3, batch_size=256, policy_kwargs="dict(net_arch=[400, 300])" (SB3 defaults:
  1 env, buffer_size=1e6, learning_starts=100, tau=0.005, gamma=0.99, policy_delay=2; OU theta=0.15, dt=1e-2)
- sac: n_timesteps=50000, policy=MlpPolicy, learning_rate=3e-4, buffer_size=50000, batch_size=512,
  ent_coef=0.1, train_freq=32, gradient_steps=32, gamma=0.9999, tau=0.01, learning_starts=0, use_sde=True,
  policy_kwargs="dict(log_std_init=-3.67, net_arch=[64, 64], use_expln=True)"
- ppo: normalize=true, n_envs=1, n_timesteps=20000, policy=MlpPolicy, batch_size=256, n_steps=8, gamma=0.9999,
  learning_rate=7.77e-05, ent_coef=0.00429, clip_range=0.1, n_epochs=10, gae_lambda=0.9, max_grad_norm=5,
  vf_coef=0.19, use_sde=True, policy_kwargs="dict(log_std_init=-3.29, ortho_init=False)"

Hopper-v5 and HalfCheetah-v5 (fixed budget only; the ``Hopper-v4`` and ``HalfCheetah-v4`` entries):

- sac, both envs: n_timesteps=1e6, policy=MlpPolicy, learning_starts=10000 (everything else SB3's SAC defaults:
  1 env, buffer_size=1e6, batch_size=256, learning_rate=3e-4, tau=0.005, gamma=0.99, train_freq=1,
  gradient_steps=1, ent_coef="auto" (initial alpha 1, target entropy -dim(A)), net_arch=[256, 256] ReLU)
- ppo, Hopper-v4: normalize=true, n_envs=1, policy=MlpPolicy, n_timesteps=1e6, batch_size=32, n_steps=512,
  gamma=0.999, learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2, n_epochs=5, gae_lambda=0.99,
  max_grad_norm=0.7, vf_coef=0.835671, policy_kwargs="dict(log_std_init=-2, ortho_init=False,
  activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256]))"
- ppo, HalfCheetah-v4: normalize=true, n_envs=1, policy=MlpPolicy, n_timesteps=1e6, batch_size=64,
  n_steps=512, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1, n_epochs=20,
  gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096, the same policy_kwargs

(``normalize=true``: ``VecNormalize`` of observations and rewards with the entry's gamma, as rl-zoo3 does; the
evaluation env reads the training env's observation statistics, frozen, and reports raw rewards.)

As in rl-zoo3, training envs are ``make_vec_env(n_envs, seed=seed)`` (DummyVecEnv + Monitor) and the
model gets ``seed=seed``. Time-to-solve: ``model.learn(total_timesteps=n_timesteps)`` keeps the schedules exactly
as tuned, so ``n_timesteps`` is also the run's step limit. Fixed budget (``--steps N``):
``model.learn(total_timesteps=N)`` instead of the entry's ``n_timesteps`` (a ``lin_`` schedule would decay over
N; the MuJoCo entries have none), then one greedy evaluation of 10 episodes (``evaluate_policy``, as below).

Protocol (benchmarks/README.md): ``torch.set_num_threads(1)``, CPU; a callback evaluates the greedy policy
(``deterministic=True``: the mean action for the Gaussian policies, without action noise) every 2,000 env
steps: 10 episodes side by side, one in each of 10 separate envs, the evaluation time counting; the run stops
at the first evaluation with mean return >= the env's solved return (475 for CartPole-v1, -250 for
Pendulum-v1), or at the wall-clock limit.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import torch
import yaml
from common import (
    CONTINUOUS_ENV_ID,
    ENV_ID,
    EVAL_EPISODES,
    EVAL_SEED_OFFSET,
    MUJOCO_ALGOS,
    MUJOCO_ENV_IDS,
    SPARSE_ENV_ID,
    Clock,
    Tracker,
    arg_parser,
    emit,
    final_return_result,
    library_versions,
    parse_run_args,
)
from gymnasium import spaces
from rl_zoo3.utils import SimpleLinearSchedule
from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.noise import ActionNoise, NormalActionNoise, OrnsteinUhlenbeckActionNoise
from stable_baselines3.common.utils import ConstantSchedule
from stable_baselines3.common.vec_env import VecEnv, VecNormalize, sync_envs_normalization

ALGOS: dict[str, type[BaseAlgorithm]] = {"ppo": PPO, "a2c": A2C, "dqn": DQN, "sac": SAC, "td3": TD3, "ddpg": DDPG}
SUPPORTED = (
    {(algo, ENV_ID) for algo in ("ppo", "a2c", "dqn")}
    | {(algo, CONTINUOUS_ENV_ID) for algo in ("sac", "td3", "ddpg", "ppo")}
    | {(algo, SPARSE_ENV_ID) for algo in ("td3", "sac", "ppo")}
    | {(algo, env) for algo in MUJOCO_ALGOS for env in MUJOCO_ENV_IDS}
)
"""(algo, env) pairs run by this runner: those with an rl-zoo3 entry that a benchmark runs."""
ZOO_ENTRIES = {"Hopper-v5": "Hopper-v4", "HalfCheetah-v5": "HalfCheetah-v4"}
"""The zoo entry used for an env that has none of its own (rl-zoo3 2.9.2 tunes the -v4 MuJoCo envs only)."""
SCHEDULE_KEYS = ("learning_rate", "clip_range", "clip_range_vf")
PYTHON_STRING_KEYS = ("policy_kwargs", "replay_buffer_kwargs")
UNSUPPORTED_KEYS = ("env_wrapper", "vec_env_wrapper", "frame_stack", "callback", "monitor_kwargs")


def load_zoo_hyperparams(algo: str, env_id: str) -> dict[str, Any]:
    """The ``env_id`` entry (or ``ZOO_ENTRIES[env_id]``'s) of the installed rl-zoo3's ``hyperparams/{algo}.yml``."""
    with (resources.files("rl_zoo3") / "hyperparams" / f"{algo}.yml").open() as f:
        return dict(yaml.safe_load(f)[ZOO_ENTRIES.get(env_id, env_id)])


@dataclass
class ZooConfig:
    """A zoo entry split the way rl-zoo3 uses it: env creation, training length, model constructor kwargs."""

    n_envs: int
    n_timesteps: int
    normalize_kwargs: dict[str, Any] | None
    """VecNormalize kwargs, None when the entry does not normalize."""
    env_kwargs: dict[str, Any]
    noise: tuple[str, float] | None
    """``(noise_type, noise_std)`` of the exploration noise of off-policy algorithms, None when there is none."""
    model_kwargs: dict[str, Any]


def eval_zoo_string(expression: str) -> Any:
    """Evaluate a Python expression of a zoo entry (``"dict(net_arch=[256, 256])"``), as rl-zoo3 does."""
    return eval(expression, {"dict": dict, "nn": torch.nn, "th": torch})


def preprocess(hyperparams: dict[str, Any]) -> ZooConfig:
    """Split and convert a zoo entry.

    Mirrors ``rl_zoo3.exp_manager.ExperimentManager._preprocess_hyperparams`` for the keys a classic-control
    entry can hold; the wrapper/callback keys it also supports are refused rather than silently ignored.
    """
    hp = dict(hyperparams)
    unsupported = [key for key in UNSUPPORTED_KEYS if key in hp]
    if unsupported:
        raise NotImplementedError(f"rl-zoo3 keys not handled by this runner: {unsupported}")
    n_envs = int(hp.pop("n_envs", 1))
    n_timesteps = int(hp.pop("n_timesteps"))
    env_kwargs = dict(hp.pop("env_kwargs", {}))
    for key in SCHEDULE_KEYS:
        value = hp.get(key)
        if isinstance(value, str):  # "lin_0.001": linear decay from 0.001 to 0 over training
            hp[key] = SimpleLinearSchedule(float(value.split("_")[1]))
        elif isinstance(value, int | float) and value >= 0:  # negative: "disabled", left as is
            hp[key] = ConstantSchedule(float(value))
    normalize = hp.pop("normalize", False)
    normalize_kwargs: dict[str, Any] | None = None
    if normalize:
        if isinstance(normalize, str):
            normalize_kwargs = eval_zoo_string(normalize)  # e.g. "dict(norm_obs=True, norm_reward=False)"
        else:
            normalize_kwargs = dict(normalize) if isinstance(normalize, dict) else {}
        if "gamma" in hp:
            normalize_kwargs["gamma"] = hp["gamma"]
    for key in PYTHON_STRING_KEYS:
        if isinstance(hp.get(key), str):
            hp[key] = eval_zoo_string(hp[key])
    if isinstance(hp.get("train_freq"), list):
        hp["train_freq"] = tuple(hp["train_freq"])
    noise = (hp.pop("noise_type").strip(), float(hp.pop("noise_std"))) if hp.get("noise_type") else None
    return ZooConfig(n_envs, n_timesteps, normalize_kwargs, env_kwargs, noise, hp)


def action_noise(noise_type: str, noise_std: float, action_space: spaces.Space) -> ActionNoise:
    """rl-zoo3's action noise: zero mean and ``noise_std`` on every dimension of the Box action space."""
    assert isinstance(action_space, spaces.Box), f"action noise needs Box actions, not {action_space}"
    mean, sigma = np.zeros(action_space.shape[0]), noise_std * np.ones(action_space.shape[0])
    if "normal" in noise_type:
        return NormalActionNoise(mean=mean, sigma=sigma)
    if "ornstein-uhlenbeck" in noise_type:
        return OrnsteinUhlenbeckActionNoise(mean=mean, sigma=sigma)
    raise ValueError(f"unknown rl-zoo3 noise_type {noise_type!r}")


def greedy_returns(model: BaseAlgorithm, train_env: VecEnv, eval_env: VecEnv) -> list[float]:
    """The returns of ``EVAL_EPISODES`` greedy episodes, one in each env of ``eval_env``.

    The evaluation env first gets the training env's normalization statistics (``VecNormalize``), if any."""
    sync_envs_normalization(train_env, eval_env)
    returns, _ = evaluate_policy(
        model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True, return_episode_rewards=True
    )
    return [float(r) for r in returns]


class TimeToSolveCallback(BaseCallback):
    """Greedy evaluation every 2,000 env steps on ``eval_env``; stops training when the tracker says so.

    ``eval_env`` has one env per evaluation episode, so ``evaluate_policy`` runs one episode in each.
    """

    def __init__(self, tracker: Tracker, eval_env: VecEnv) -> None:
        super().__init__()
        self.tracker = tracker
        self.eval_env = eval_env

    def _on_step(self) -> bool:
        if not self.tracker.eval_due(self.num_timesteps):
            return True
        mean_return = float(np.mean(greedy_returns(self.model, self.training_env, self.eval_env)))
        return not self.tracker.record(self.num_timesteps, mean_return)


def main() -> None:
    args = parse_run_args(arg_parser("sb3", list(ALGOS)), SUPPORTED)
    torch.set_num_threads(1)
    config = preprocess(load_zoo_hyperparams(args.algo, args.env))

    train_env: VecEnv = make_vec_env(args.env, n_envs=config.n_envs, seed=args.seed, env_kwargs=config.env_kwargs)
    eval_env: VecEnv = make_vec_env(
        args.env, n_envs=EVAL_EPISODES, seed=args.seed + EVAL_SEED_OFFSET, env_kwargs=config.env_kwargs
    )
    if config.normalize_kwargs is not None:
        train_env = VecNormalize(train_env, **config.normalize_kwargs)
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False, **config.normalize_kwargs)
    model_kwargs = dict(config.model_kwargs)
    if config.noise is not None:
        model_kwargs["action_noise"] = action_noise(*config.noise, train_env.action_space)
    model = ALGOS[args.algo](env=train_env, seed=args.seed, device="cpu", verbose=0, **model_kwargs)
    run = {
        "framework": "sb3",
        "version": library_versions("stable-baselines3")["stable-baselines3"],
        "algo": args.algo,
        "seed": args.seed,
        "libraries": library_versions("rl-zoo3", "torch", "gymnasium", "numpy", "mujoco"),
    }

    if args.steps is not None:  # fixed budget, then one greedy evaluation
        clock = Clock()
        clock.start()
        model.learn(total_timesteps=args.steps)
        returns = greedy_returns(model, train_env, eval_env)
        emit(final_return_result(clock, returns, env=args.env, steps=args.steps, env_steps=model.num_timesteps, **run))
        return

    tracker = Tracker(args.env, args.time_limit, step_limit=config.n_timesteps)
    callback = TimeToSolveCallback(tracker, eval_env)
    tracker.start()
    model.learn(total_timesteps=config.n_timesteps, callback=callback)
    emit(tracker.result(env_steps=model.num_timesteps, **run))


if __name__ == "__main__":
    with contextlib.redirect_stdout(sys.stderr):
        main()

"""PPO's diagnostics (approx_kl, explained_variance, the epochs made) and target_kl's early stop of the epochs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos.ppo import PPO, Config
from rlfleet.algos.updates import explained_variance
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs import make_vector_env
from rlfleet.run.collector import Collector


def test_explained_variance_against_hand_computed_values():
    target = np.array([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target) == 1.0
    assert explained_variance(np.full(4, 2.5), target) == pytest.approx(0.0)  # a constant explains nothing
    # residuals (0.5, -0.5, 0.5, -0.5): Var 0.25 against Var(target) 1.25
    assert explained_variance(target - np.array([0.5, -0.5, 0.5, -0.5]), target) == pytest.approx(1 - 0.25 / 1.25)
    # tensors too; a prediction off by a constant explains as much as a perfect one (variances, not squares)
    assert explained_variance(torch.tensor(target) + 3, torch.tensor(target)) == pytest.approx(1.0)
    assert np.isnan(explained_variance(np.zeros(3), np.ones(3)))


def segment_of(cfg: Config, seed: int = 0):
    envs = make_vector_env("CartPole-v1", cfg.n_envs, seed=seed)
    algo = PPO(cfg, envs.single_observation_space, envs.single_action_space, seed=seed)
    storage = RolloutStorage(cfg.rollout_len, cfg.n_envs)
    segment = Collector(envs, algo).collect_rollout(storage)
    envs.close()
    return algo, segment


def adam_steps(algo: PPO) -> int:
    return int(next(iter(algo.optimizer.state.values()))["step"])


def test_approx_kl_is_zero_before_the_first_step_and_logged_with_the_segments_explained_variance():
    cfg = Config(n_envs=2, rollout_len=32, epochs=3, minibatch_size=16)
    algo, segment = segment_of(cfg)
    batch = algo.process(segment)
    _, first = algo.loss(batch)  # the policy that acted: ρ = 1 everywhere
    assert first["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    metrics = algo.update(segment)
    assert metrics["epochs"] == 3 and adam_steps(algo) == 3 * 4
    assert metrics["approx_kl"] > 0  # the later minibatches see a changed policy
    assert metrics["explained_variance"] == pytest.approx(explained_variance(batch.value, batch.ret))


def test_target_kl_stops_the_epochs_at_the_first_minibatch_past_one_and_a_half_times_it():
    # a learning rate this large moves the policy in one step: the second minibatch is past any small target
    cfg = Config(n_envs=2, rollout_len=32, epochs=3, minibatch_size=16, lr=0.5, target_kl=1e-9)
    algo, segment = segment_of(cfg)
    metrics = algo.update(segment)
    assert adam_steps(algo) == 1  # the first minibatch steps (ρ = 1), the second stops the segment before its step
    assert metrics["epochs"] == pytest.approx(1 / 4)
    # a target no minibatch reaches changes nothing: every epoch runs, as with target_kl 0
    cfg = Config(n_envs=2, rollout_len=32, epochs=3, minibatch_size=16, target_kl=1e9)
    algo, segment = segment_of(cfg)
    assert algo.update(segment)["epochs"] == 3 and adam_steps(algo) == 12


def test_a_box_action_policy_reports_the_same_diagnostics():
    env = gym.make("Pendulum-v1")
    cfg = Config(n_envs=1, rollout_len=16, epochs=1, minibatch_size=16)
    algo = PPO(cfg, env.observation_space, env.action_space, seed=0)
    envs = make_vector_env("Pendulum-v1", 1, seed=0)
    segment = Collector(envs, algo).collect_rollout(RolloutStorage(16, 1))
    envs.close()
    metrics = algo.update(segment)
    assert {"approx_kl", "clip_fraction", "explained_variance", "epochs"} <= set(metrics)

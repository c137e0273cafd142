"""Collector: rollouts with truncation bootstrap values, replay collection by steps and by episodes, LSTM core."""

import gymnasium as gym
import numpy as np
import torch

from rlfleet.data import ReplayBuffer
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs import make_vector_env
from rlfleet.nets import LSTMCore
from rlfleet.run.collector import Collector


class ConstantPolicy:
    """Always action 0; the value of an observation is its first entry plus 100 (easy to recognise)."""

    def act(self, obs, state=None, explore=True):
        return np.zeros(len(obs), dtype=np.int64), {"value": np.full(len(obs), -1.0, np.float32)}, state

    def value(self, obs):
        return obs[:, 0] + 100.0


def short_cartpole():
    return gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, max_episode_steps=4)


def test_rollout_writes_bootstrap_values_on_truncation():
    envs = make_vector_env(short_cartpole, 2, seed=0, mode="sync")
    collector = Collector(envs, ConstantPolicy(), seed=0)
    storage = RolloutStorage(6, 2)
    segment = collector.collect_rollout(storage)
    d = segment.data
    assert d.obs.shape == (6, 2, 4) and d.act.shape == (6, 2)
    # with a time limit of 4 and action 0 (CartPole falls after ~9 steps), step index 3 is a truncation
    assert d.truncated[3].all() and not d.terminated[3].any()
    assert np.all(d.bootstrap[3] > 90)  # value(final obs) = obs[0] + 100
    assert np.all(d.bootstrap[[0, 1, 2, 4, 5]] == 0)
    np.testing.assert_allclose(segment.last_value, collector.obs[:, 0] + 100.0)
    assert collector.env_steps == 12
    assert collector.episodes == 2 and list(collector.lengths) == [4, 4]
    np.testing.assert_allclose(d.value, -1.0)  # extras from act are stored
    envs.close()


def test_collect_into_replay_by_steps_and_episodes():
    envs = make_vector_env("CartPole-v1", 2, seed=0, mode="sync")
    collector = Collector(envs, ConstantPolicy(), seed=0)
    buffer = ReplayBuffer(1000, n_envs=2)
    assert collector.collect(buffer, n_step=10) == 10
    assert len(buffer) == 10
    before = collector.episodes
    collector.collect(buffer, n_episode=3)
    assert collector.episodes - before >= 3
    batch = buffer.sample(0)
    assert batch.terminated.sum() >= 3  # the episodes' ends are in the buffer
    envs.close()


def test_lstm_core_resets_state_at_episode_starts():
    torch.manual_seed(0)
    core = LSTMCore(3, hidden=8)
    x = torch.randn(5, 2, 3)
    starts = torch.zeros(5, 2)
    starts[2, 0] = 1.0
    h0 = core.initial_state(2)
    h0 = (torch.randn_like(h0[0]), torch.randn_like(h0[1]))
    out, _ = core(x, h0, starts)
    # env 0 restarts at t=2: its outputs from t=2 on equal a fresh run from a zero state
    fresh, _ = core(x[2:, :1], core.initial_state(1), torch.zeros(3, 1))
    torch.testing.assert_close(out[2:, :1], fresh)
    # env 1 never restarts: its output at t=2 depends on the initial state
    other, _ = core(x[2:, 1:], core.initial_state(1), torch.zeros(3, 1))
    assert not torch.allclose(out[2:, 1:], other)
    # one step at a time gives the same as a whole sequence
    state = h0
    for t in range(5):
        step_out, state = core(x[t], state, starts[t])
        torch.testing.assert_close(step_out, out[t])

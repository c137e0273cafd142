"""Observation and reward normalisation: running statistics against NumPy and reference loops, the vector-env
wrappers."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.data.buffer import ReplayBuffer, SequenceReplayBuffer
from rlfleet.envs import make_vector_env
from rlfleet.envs.make import finished_episodes
from rlfleet.envs.normalize import (
    NormalizeObservation,
    NormalizeReward,
    ReplayNormalizer,
    RewardNormalizer,
    RunningMeanStd,
    make_obs_stats,
    stats_from_state,
)
from rlfleet.launch import train
from rlfleet.run.checkpoint import from_safe, to_safe


@pytest.mark.parametrize("batch_sizes", [[1] * 7, [4] * 25, [1, 3, 100, 2, 17, 1, 64]])
def test_running_statistics_match_numpy_over_the_concatenated_data(batch_sizes: list[int]):
    rng = np.random.default_rng(0)
    batches = [rng.normal([3.0, -50.0, 0.0], [0.1, 20.0, 1e-3], size=(n, 3)) for n in batch_sizes]
    stats = RunningMeanStd((3,))
    for batch in batches:
        stats.update(batch)
    data = np.concatenate(batches)
    assert stats.count == len(data)
    np.testing.assert_allclose(stats.mean, data.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.var, data.var(axis=0), rtol=1e-9, atol=1e-15)


def test_running_statistics_of_multi_dimensional_observations():
    rng = np.random.default_rng(1)
    batches = [rng.uniform(-5, 5, size=(8, 2, 3)) for _ in range(10)]
    stats = RunningMeanStd((2, 3))
    for batch in batches:
        stats.update(batch)
    data = np.concatenate(batches)
    np.testing.assert_allclose(stats.mean, data.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats.var, data.var(axis=0), rtol=1e-10)


def test_normalize_identity_without_data_then_standardised_and_clipped():
    stats = RunningMeanStd((2,), clip=5.0)
    x = np.array([[0.5, -2.0]])
    np.testing.assert_allclose(stats.normalize(x), x, rtol=1e-6)
    data = np.random.default_rng(2).normal([10.0, -1.0], [2.0, 0.5], size=(1000, 2))
    stats.update(data)
    z = stats.normalize(data)
    assert z.dtype == np.float32
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(z.std(axis=0), 1.0, atol=1e-4)
    far = stats.normalize(np.array([[1e6, -1e6]]))
    np.testing.assert_array_equal(far, [[5.0, -5.0]])


def test_state_dict_round_trip_through_checkpoint_conversion():
    stats = RunningMeanStd((3,))
    stats.update(np.random.default_rng(3).normal(size=(50, 3)))
    restored = RunningMeanStd((3,))
    restored.load_state_dict(from_safe(to_safe(stats.state_dict())))
    assert restored.count == stats.count
    np.testing.assert_array_equal(restored.mean, stats.mean)
    np.testing.assert_array_equal(restored.var, stats.var)
    with pytest.raises(ValueError, match="do not fit"):
        RunningMeanStd((4,)).load_state_dict(stats.state_dict())


def test_only_float_box_observations_and_dict_ones_with_float_box_entries_are_normalizable():
    import gymnasium as gym

    assert make_obs_stats(gym.spaces.Box(-1, 1, (4,)), 10.0).shape == (4,)
    with pytest.raises(ValueError, match="obs_norm"):
        make_obs_stats(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), 10.0)
    with pytest.raises(ValueError, match="obs_norm"):
        make_obs_stats(gym.spaces.Discrete(3), 10.0)
    with pytest.raises(ValueError, match="obs_norm"):
        make_obs_stats(gym.spaces.Dict({"a": gym.spaces.Discrete(3)}), 10.0)
    mixed = gym.spaces.Dict({"cue": gym.spaces.Discrete(3), "x": gym.spaces.Box(-5, 5, (2,))})
    assert sorted(make_obs_stats(mixed, 10.0).entries) == ["x"]


def test_dict_observations_have_their_float_box_entries_normalized_and_the_rest_passed_through():
    import gymnasium as gym

    space = gym.spaces.Dict({"cue": gym.spaces.Discrete(3), "x": gym.spaces.Box(-50, 50, (2,))})
    stats = make_obs_stats(space, 10.0)
    rng = np.random.default_rng(0)
    x = rng.normal([20.0, -3.0], [5.0, 0.5], size=(1000, 2))
    cue = rng.integers(3, size=1000)
    stats.update({"cue": cue, "x": x})
    out = stats.normalize({"cue": cue[:500], "x": x[:500]})
    assert np.array_equal(out["cue"], cue[:500])  # untouched
    assert np.allclose(out["x"], (x[:500] - x.mean(0)) / x.std(0), atol=1e-5)
    restored = stats_from_state(stats.state_dict(), 10.0)
    assert np.array_equal(restored.normalize({"cue": cue, "x": x})["x"], stats.normalize({"cue": cue, "x": x})["x"])


def test_the_statistics_of_a_dict_with_an_entry_named_mean_are_restored_as_a_dicts():
    """A Dict observation whose entry is called "mean" saves per-entry statistics that hold a "mean" key too: they are
    read back as a Dict's (what `rlfleet eval`, `collect` and `--expert` do), not taken for one Box's."""
    import gymnasium as gym

    space = gym.spaces.Dict({"mean": gym.spaces.Box(-5, 5, (2,)), "x": gym.spaces.Box(-5, 5, (3,))})
    stats = make_obs_stats(space, 10.0)
    rng = np.random.default_rng(0)
    obs = {"mean": rng.normal(2.0, 1.0, (100, 2)), "x": rng.normal(-1.0, 3.0, (100, 3))}
    stats.update(obs)
    restored = stats_from_state(stats.state_dict(), 10.0)
    for key in obs:
        np.testing.assert_array_equal(restored.normalize(obs)[key], stats.normalize(obs)[key])


def test_training_wrapper_updates_evaluation_wrapper_reads_and_final_obs_are_normalised():
    stats = RunningMeanStd((4,))
    raw = make_vector_env("CartPole-v1", 3, seed=0, mode="sync")
    train_envs = NormalizeObservation(make_vector_env("CartPole-v1", 3, seed=0, mode="sync"), stats)
    eval_envs = NormalizeObservation(make_vector_env("CartPole-v1", 2, seed=5, mode="sync"), stats, update_stats=False)
    seen = [raw.reset(seed=0)[0]]
    obs, _ = train_envs.reset(seed=0)
    assert stats.count == 3
    np.testing.assert_array_equal(obs, stats.normalize(seen[0]))
    finals = 0
    for _ in range(60):
        actions = np.ones(3, dtype=np.int64)
        raw_obs, _, _, _, raw_info = raw.step(actions)
        obs, _, _, _, info = train_envs.step(actions)
        seen.append(raw_obs)
        np.testing.assert_array_equal(obs, stats.normalize(raw_obs))
        if "final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):
                np.testing.assert_array_equal(info["final_obs"][i], stats.normalize(raw_info["final_obs"][i]))
                finals += 1
    assert finals > 0, "no episode ended: the final observations were not checked"
    data = np.concatenate(seen).astype(np.float64)
    assert stats.count == len(data)
    np.testing.assert_allclose(stats.mean, data.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stats.var, data.var(axis=0), rtol=1e-9, atol=1e-12)
    before = stats.state_dict()
    eval_envs.reset(seed=1)
    eval_envs.step(np.zeros(2, dtype=np.int64))
    assert stats.count == before["count"] and np.array_equal(stats.mean, before["mean"])
    assert train_envs.single_observation_space.shape == (4,)
    for envs in (raw, train_envs, eval_envs):
        envs.close()


def reference_reward_scaling(rewards: np.ndarray, dones: np.ndarray, gamma: float, clip: float) -> np.ndarray:
    """The scaled rewards by a plain loop: each reward over the population std of every discounted return so far
    (this step's included), returns restarted after an episode's last step."""
    steps, n_envs = rewards.shape
    running, seen, out = np.zeros(n_envs), [], np.zeros_like(rewards, dtype=np.float64)
    for t in range(steps):
        for i in range(n_envs):
            running[i] = gamma * running[i] + rewards[t, i]
        seen.extend(running)
        out[t] = np.clip(rewards[t] / np.sqrt(np.var(seen) + 1e-8), -clip, clip)
        running[dones[t]] = 0.0
    return out


def test_reward_scaling_matches_a_reference_loop_with_episode_ends_and_clipping():
    rng = np.random.default_rng(4)
    rewards = rng.normal(-2.0, 3.0, size=(200, 3))
    rewards[150, 1] = 400.0  # an outlier far beyond clip * std: clipped
    dones = rng.random((200, 3)) < 0.05
    normalizer = RewardNormalizer(3, gamma=0.9, clip=5.0)
    scaled = np.stack([normalizer(rewards[t], dones[t]) for t in range(len(rewards))])
    expected = reference_reward_scaling(rewards, dones, 0.9, 5.0)
    np.testing.assert_allclose(scaled, expected, rtol=1e-5, atol=1e-6)
    assert scaled[150, 1] == pytest.approx(5.0)
    assert normalizer.stats.count == rewards.size
    # returns of envs whose episode just ended start again from 0; the others carry on
    np.testing.assert_array_equal(normalizer.returns[dones[-1]], 0.0)


def test_reward_normalizer_state_round_trip_and_bad_settings():
    normalizer = RewardNormalizer(2, gamma=0.99)
    for r in np.random.default_rng(5).normal(size=(30, 2)):
        normalizer(r, np.array([False, False]))
    restored = RewardNormalizer(2, gamma=0.99)
    restored.load_state_dict(from_safe(to_safe(normalizer.state_dict())))
    np.testing.assert_array_equal(restored.returns, normalizer.returns)
    assert restored.stats.count == normalizer.stats.count and restored.stats.var == normalizer.stats.var
    nxt = np.array([0.3, -1.0])
    np.testing.assert_array_equal(restored(nxt, np.zeros(2, bool)), normalizer(nxt, np.zeros(2, bool)))
    with pytest.raises(ValueError, match="do not fit"):
        RewardNormalizer(3, gamma=0.99).load_state_dict(normalizer.state_dict())
    with pytest.raises(ValueError, match="gamma"):
        RewardNormalizer(2, gamma=1.5)
    with pytest.raises(ValueError, match="reward_clip must be positive"):
        RewardNormalizer(2, gamma=0.9, clip=0.0)


def test_reward_wrapper_scales_training_rewards_and_leaves_episode_returns_raw():
    raw = make_vector_env("Pendulum-v1", 2, seed=0, mode="sync")
    normalizer = RewardNormalizer(2, gamma=0.9)
    envs = NormalizeReward(make_vector_env("Pendulum-v1", 2, seed=0, mode="sync"), normalizer)
    raw.reset(seed=0)
    envs.reset(seed=0)
    actions = np.random.default_rng(6).uniform(-2, 2, size=(450, 2, 1)).astype(np.float32)
    raw_rewards, dones, scaled, episodes = [], [], [], []
    for a in actions:
        _, r, term, trunc, _ = raw.step(a)
        _, s, term2, trunc2, info = envs.step(a)
        np.testing.assert_array_equal(term | trunc, term2 | trunc2)
        raw_rewards.append(r)
        dones.append(term | trunc)
        scaled.append(s)
        episodes += finished_episodes(info)
    expected = reference_reward_scaling(np.array(raw_rewards), np.array(dones), 0.9, 10.0)
    np.testing.assert_allclose(np.array(scaled), expected, rtol=1e-5, atol=1e-6)
    # Pendulum episodes end by truncation at 200 steps: two per env, their recorded returns the raw sums
    assert len(episodes) == 4
    assert all(length == 200 for _, _, length in episodes)
    first = {i: ret for i, ret, _ in reversed(episodes)}  # each env's first episode
    for i, ret in first.items():
        assert ret == pytest.approx(float(np.sum(np.array(raw_rewards)[:200, i])), rel=1e-5)
    with pytest.raises(ValueError, match="envs"):
        NormalizeReward(make_vector_env("Pendulum-v1", 3, seed=0, mode="sync"), normalizer)
    raw.close()
    envs.close()


def filled(buffer: ReplayBuffer, obs: np.ndarray, rew: np.ndarray, terminated: np.ndarray) -> ReplayBuffer:
    """`buffer` holding one env's stream: obs[t] -> obs[t + 1] with rew[t], ending where terminated."""
    for t in range(len(rew)):
        buffer.add(obs[t : t + 1], np.zeros(1, np.int64), rew[t : t + 1], obs[t + 1 : t + 2], terminated[t : t + 1],
                   np.zeros(1, bool))  # fmt: skip
    return buffer


def test_a_replay_of_raw_data_is_normalised_when_sampled_with_the_statistics_as_they_are_then():
    """A replay run keeps raw observations and rewards; each sample is normalised with the statistics of the
    moment it is drawn, each reward scaled (and clipped) before the n-step sum."""
    rng = np.random.default_rng(7)
    stats, rewards_norm = RunningMeanStd((2,)), RewardNormalizer(1, gamma=0.9, clip=3.0)
    stats.update(rng.normal([5.0, -3.0], [2.0, 0.5], size=(50, 2)))
    for r in rng.normal(-1.0, 1.0, size=40):
        rewards_norm.observe(np.array([r]), np.array([False]))
    obs = rng.normal([5.0, -3.0], [2.0, 0.5], size=(21, 2)).astype(np.float32)
    rew = rng.normal(-1.0, 1.0, size=20).astype(np.float32)
    rew[6] = 500.0  # far beyond reward_clip standard deviations: clipped before the sum
    terminated = np.zeros(20, dtype=bool)
    terminated[11] = True
    buffer = filled(ReplayBuffer(100, n_step=3, gamma=0.9, seed=0), obs, rew, terminated)
    sequences = filled(SequenceReplayBuffer(100, seq_len=4, seed=0), obs, rew, terminated)
    raw = buffer.sample(0)
    np.testing.assert_array_equal(raw.obs, obs[:20])  # without a normalizer: what was stored, raw
    for b in (buffer, sequences):
        b.normalizer = ReplayNormalizer(stats, rewards_norm)
    for _ in range(2):  # and again after the statistics moved: normalised with them as they are now
        batch = buffer.sample(0)
        # the same stream stored as normalised now: the buffer's own n-step sums of the scaled rewards
        expected = filled(ReplayBuffer(100, n_step=3, gamma=0.9), stats.normalize(obs), rewards_norm.scale(rew),
                          terminated).sample(0)  # fmt: skip
        np.testing.assert_allclose(batch.rew, expected.rew, rtol=1e-6)
        np.testing.assert_array_equal(batch.obs, stats.normalize(obs[:20]))
        np.testing.assert_array_equal(batch.next_obs, expected.next_obs)
        assert rewards_norm.scale(rew)[6] == pytest.approx(3.0)
        seq = sequences.sample(0)
        np.testing.assert_array_equal(seq.obs[0], stats.normalize(obs[:4]))
        np.testing.assert_array_equal(seq.rew[3], rewards_norm.scale(rew[3:7]))
        stats.update(rng.normal([50.0, 10.0], 1.0, size=(30, 2)))
        rewards_norm.observe(np.array([-40.0]), np.array([True]))
    assert not np.allclose(stats.normalize(obs[:20]), batch.obs)  # the moved statistics changed the next sample


def test_a_replay_runs_buffer_keeps_raw_data_and_its_policy_acts_on_normalised_observations(tmp_path):
    """DQN on MountainCar-v0 (velocities within ±0.07, every reward −1) with both normalisations: the buffer holds
    what the env gave, the policy acts on observations normalised as the evaluation envs' are."""
    runs = []
    train("dqn", "MountainCar-v0", seed=0, steps=600, eval_every=10**9, logdir=str(tmp_path), progress=False,
          overrides={"obs_norm": "true", "reward_norm": "true", "learning_starts": 200},
          callbacks=[lambda info: runs.append(info["trainer"])])  # fmt: skip
    run = runs[-1]
    stored = run.buffer.sample(0)
    run.buffer.normalizer = None
    raw = run.buffer.sample(0)
    assert np.abs(raw.obs[:, 1]).max() <= 0.07 and np.abs(raw.obs[:, 0] + 0.3).max() <= 0.9
    gamma, n_step = run.algo_cfg.gamma, run.algo_cfg.n_step
    sums = [-sum(gamma**k for k in range(n)) for n in range(1, n_step + 1)]  # rewards of -1 to a done or n_step
    assert n_step > 1 and np.isin(raw.rew, np.float32(sums)).all() and (raw.rew == np.float32(sums[-1])).any()
    np.testing.assert_array_equal(stored.obs, run.obs_stats.normalize(raw.obs))
    assert np.abs(stored.obs[:, 1]).max() > 0.5  # normalised velocities are of unit scale
    obs = run.collector.obs
    np.testing.assert_array_equal(
        run.collector.algo.act(obs, explore=False)[0], run.algo.act(run.obs_stats.normalize(obs), explore=False)[0]
    )

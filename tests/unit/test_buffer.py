"""Tests for ReplayBuffer and PrioritizedReplayBuffer against naive per-env reference loops."""

import io

import numpy as np
import pytest
import torch

from rlfleet.data import Batch, PrioritizedReplayBuffer, ReplayBuffer
from rlfleet.envs.normalize import ReplayNormalizer, RewardNormalizer, RunningMeanStd


def add_step(buf, obs, act, rew, next_obs, terminated, truncated, **kwargs):
    return buf.add(
        obs if isinstance(obs, dict) else np.asarray(obs),
        np.asarray(act),
        np.asarray(rew, dtype=np.float32),
        next_obs if isinstance(next_obs, dict) else np.asarray(next_obs),
        np.asarray(terminated, dtype=bool),
        np.asarray(truncated, dtype=bool),
        **kwargs,
    )


class Stream:
    """Random vector-env transitions plus, per env, the full chronological list the buffer should mirror."""

    def __init__(self, n_envs: int, steps: int, seed: int, obs_shape=(2,), p_term=0.15, p_trunc=0.1):
        rng = np.random.default_rng(seed)
        self.n_envs, self.steps = n_envs, steps
        self.rew = rng.normal(size=(steps, n_envs)).astype(np.float32)
        self.term = rng.random((steps, n_envs)) < p_term
        self.trunc = (rng.random((steps, n_envs)) < p_trunc) & ~self.term
        # obs value encodes (step, env) so every frame is distinguishable; next_obs = obs + 0.5
        base = np.arange(steps)[:, None] * 10 + np.arange(n_envs)[None, :]
        self.obs = np.zeros((steps, n_envs, *obs_shape), np.float32) + base.reshape(
            steps, n_envs, *[1] * len(obs_shape)
        )
        self.next_obs = self.obs + 0.5
        self.act = rng.integers(0, 4, size=(steps, n_envs))

    def fill(self, buf):
        for t in range(self.steps):
            add_step(buf, self.obs[t], self.act[t], self.rew[t], self.next_obs[t], self.term[t], self.trunc[t])

    def done(self, t, e):
        return bool(self.term[t, e] or self.trunc[t, e])

    def reference(self, t, e, kept_from, n_step, gamma, frame_stack):
        """Expected sample for transition (t, e) when steps [kept_from, steps) are stored, by plain loops."""
        ret, k = 0.0, 0
        for j in range(n_step):
            if t + j >= self.steps:
                break
            ret += gamma**j * float(self.rew[t + j, e])
            k += 1
            if self.done(t + j, e):
                break
        last = t + k - 1

        def stack_at(s):
            frames = []
            for back in range(frame_stack):
                pos = s
                for _ in range(back):
                    if pos - 1 >= kept_from and not self.done(pos - 1, e):
                        pos -= 1
                frames.append(self.obs[pos, e])
            return np.stack(frames[::-1])

        if frame_stack == 1:
            obs, next_obs = self.obs[t, e], self.next_obs[last, e]
        else:
            obs = stack_at(t)
            next_obs = np.concatenate([stack_at(last)[1:], self.next_obs[last, e][None]])
        return dict(
            obs=obs,
            act=self.act[t, e],
            rew=ret,
            next_obs=next_obs,
            terminated=float(self.term[last, e]),
            discount=gamma**k,
        )


def assert_matches_reference(batch: Batch, stream: Stream, buf: ReplayBuffer, kept_from: int):
    for i in range(len(batch)):
        flat = int(batch.index[i])
        # the obs encodes its (step, env): recover which transition this is
        step, env = divmod(int(round(float(batch.obs[i].reshape(-1)[-1]))), 10)
        assert flat % buf.n_envs == env
        ref = stream.reference(step, env, kept_from, buf.n_step, buf.gamma, buf.frame_stack)
        np.testing.assert_array_equal(batch.obs[i], ref["obs"])
        np.testing.assert_array_equal(batch.next_obs[i], ref["next_obs"])
        assert batch.act[i] == ref["act"]
        assert batch.rew[i] == pytest.approx(ref["rew"], rel=1e-5, abs=1e-5)
        assert batch.terminated[i] == ref["terminated"]
        assert batch.discount[i] == pytest.approx(ref["discount"], rel=1e-6)


# ---- layout, ring buffer, sample(0) -------------------------------------------------------------


def test_wrap_around_overwrites_oldest():
    buf = ReplayBuffer(10, seed=0)
    for t in range(25):
        add_step(buf, [[t]], [t], [t], [[t + 1]], [False], [False])
    assert len(buf) == 10
    everything = buf.sample(0)
    assert everything.obs[:, 0].tolist() == list(range(15, 25))  # oldest first
    assert everything.act.tolist() == list(range(15, 25))
    drawn = buf.sample(500)
    assert set(drawn.act.tolist()) == set(range(15, 25))


def test_sample_zero_returns_everything_oldest_first_time_major():
    buf = ReplayBuffer(12, n_envs=3, seed=0)
    for t in range(6):
        add_step(buf, np.arange(3)[:, None] + 10 * t, np.arange(3), np.ones(3), np.zeros((3, 1)), [0] * 3, [0] * 3)
    everything = buf.sample(0)
    assert len(everything) == 12
    expected = [10 * t + e for t in range(2, 6) for e in range(3)]
    assert everything.obs[:, 0].tolist() == expected
    assert everything.weight.tolist() == [1.0] * 12


def test_capacity_rounds_down_to_rows_and_rejects_too_small():
    assert ReplayBuffer(11, n_envs=4).capacity == 8
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(3, n_envs=4)


def test_add_checks_leading_dim_and_shapes():
    buf = ReplayBuffer(8, n_envs=2)
    with pytest.raises(ValueError, match="n_envs=2"):
        add_step(buf, np.zeros((3, 4)), [0, 0], [0, 0], np.zeros((2, 4)), [0, 0], [0, 0])
    add_step(buf, np.zeros((2, 4)), [0, 0], [0, 0], np.zeros((2, 4)), [0, 0], [0, 0])
    with pytest.raises(ValueError, match="earlier data"):
        add_step(buf, np.zeros((2, 5)), [0, 0], [0, 0], np.zeros((2, 5)), [0, 0], [0, 0])
    assert len(buf) == 2
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(8).sample(4)


def test_sample_keys_and_dtypes():
    buf = ReplayBuffer(8, n_envs=2, seed=0)
    add_step(buf, np.zeros((2, 3), np.uint8), [1, 2], [0.5, 1.0], np.ones((2, 3), np.uint8), [True, False], [0, 0])
    b = buf.sample(5)
    assert list(b.keys()) == ["obs", "act", "rew", "next_obs", "terminated", "discount", "weight", "index"]
    assert b.obs.dtype == np.uint8 and b.obs.shape == (5, 3)
    assert b.rew.dtype == b.discount.dtype == b.weight.dtype == b.terminated.dtype == np.float32
    assert b.index.dtype == np.int64
    np.testing.assert_allclose(b.discount, 0.99)


def test_float64_observations_are_stored_as_float32_unless_normalised_when_sampled():
    """MuJoCo's float64 observations took twice the memory the networks' float32 needs; with obs_norm they are
    normalised when sampled, and one far from zero keeps its small changes only in float64."""
    obs = np.full((2, 3), 1.7e9) + np.arange(3)  # a timestamp-like observation: float32 rounds its changes away
    for normalizer, dtype in ((None, np.float32), (ReplayNormalizer(RunningMeanStd((3,), 10.0)), np.float64)):
        buf = ReplayBuffer(8, n_envs=2, seed=0)
        buf.normalizer = normalizer
        add_step(buf, obs, np.zeros((2, 1)), [0, 0], obs + 1, [0, 0], [0, 0])
        stored = {k: v.numpy() for k, v in buf.state_dict()["storage"].items()}
        assert stored["obs"].dtype == stored["next_obs"].dtype == dtype
        assert stored["act"].dtype == np.float64  # actions keep their own dtype
    np.testing.assert_array_equal(stored["obs"][0], obs)
    reward_only = ReplayBuffer(8, n_envs=2, seed=0)
    reward_only.normalizer = ReplayNormalizer(None, RewardNormalizer(2, gamma=0.99))
    add_step(reward_only, obs, [0, 0], [0, 0], obs, [0, 0], [0, 0])
    assert reward_only.state_dict()["storage"]["obs"].dtype == torch.float32


# ---- n-step returns -----------------------------------------------------------------------------


def test_multi_env_streams_are_never_mixed_in_n_step_sums():
    buf = ReplayBuffer(40, n_envs=2, n_step=5, gamma=1.0, seed=0)
    for t in range(30):  # env 0 earns 1 per step, env 1 earns 100 per step; no episode ends
        add_step(buf, [[t], [t]], [0, 1], [1.0, 100.0], [[t + 1], [t + 1]], [0, 0], [0, 0])
    b = buf.sample(0)
    env = b.index % 2
    assert (b.act == env).all()
    np.testing.assert_allclose(b.rew[env == 0] % 1.0, 0.0)
    np.testing.assert_allclose(b.rew[env == 1] % 100.0, 0.0)
    np.testing.assert_allclose(b.rew[env == 0][:-4], 5.0)  # all full windows sum env 0's rewards only
    np.testing.assert_allclose(b.rew[env == 1][:-4], 500.0)


def test_n_step_truncation_bootstraps_and_termination_does_not():
    g = 0.9
    buf = ReplayBuffer(20, n_step=3, gamma=g, seed=0)
    # t:       0      1      2(trunc) 3      4(term) 5      6
    term = [0, 0, 0, 0, 1, 0, 0]
    trunc = [0, 0, 1, 0, 0, 0, 0]
    for t in range(7):
        add_step(buf, [[t]], [0], [t + 1.0], [[t + 100]], [term[t]], [trunc[t]])
    b = buf.sample(0)
    # from t=0: rewards 1,2,3 (3 is the truncated step) -> next_obs is t=2's, bootstrap gamma^3
    assert b.rew[0] == pytest.approx(1 + g * 2 + g**2 * 3)
    assert b.discount[0] == pytest.approx(g**3) and b.terminated[0] == 0.0 and b.next_obs[0, 0] == 102
    # from t=1: stops at the truncation after 2 rewards
    assert b.rew[1] == pytest.approx(2 + g * 3)
    assert b.discount[1] == pytest.approx(g**2) and b.terminated[1] == 0.0 and b.next_obs[1, 0] == 102
    # from t=3: stops at the termination after 2 rewards, terminated set
    assert b.rew[3] == pytest.approx(4 + g * 5)
    assert b.discount[3] == pytest.approx(g**2) and b.terminated[3] == 1.0 and b.next_obs[3, 0] == 104
    # from t=5 and t=6: only written data is used (newest transition is t=6)
    assert b.rew[5] == pytest.approx(6 + g * 7) and b.discount[5] == pytest.approx(g**2)
    assert b.rew[6] == pytest.approx(7.0) and b.discount[6] == pytest.approx(g) and b.next_obs[6, 0] == 106


def test_n_step_never_reads_unwritten_or_stale_rows():
    buf = ReplayBuffer(6, n_step=4, gamma=1.0, seed=0)
    for t in range(9):  # 6 rows, wrapped: stored t = 3..8, row of t=8 is just before the oldest (t=3)
        add_step(buf, [[t]], [0], [1.0], [[t + 1]], [0], [0])
    b = buf.sample(0)
    assert b.obs[:, 0].tolist() == [3, 4, 5, 6, 7, 8]
    assert b.rew.tolist() == [4, 4, 4, 3, 2, 1]
    assert b.next_obs[:, 0].tolist() == [7, 8, 9, 9, 9, 9]


@pytest.mark.parametrize(("n_envs", "n_step", "capacity"), [(1, 1, 50), (1, 3, 30), (3, 4, 45), (2, 5, 1000)])
def test_n_step_matches_reference_loop(n_envs, n_step, capacity):
    stream = Stream(n_envs, steps=40, seed=n_envs * 10 + n_step)
    buf = ReplayBuffer(capacity, n_envs=n_envs, n_step=n_step, gamma=0.95, seed=0)
    stream.fill(buf)
    kept_from = max(0, stream.steps - capacity // n_envs)
    everything = buf.sample(0)
    assert len(everything) == (stream.steps - kept_from) * n_envs
    assert_matches_reference(everything, stream, buf, kept_from)
    assert_matches_reference(buf.sample(64), stream, buf, kept_from)


def test_mark_boundary_ends_the_stored_episodes_of_the_given_columns():
    """After a restart the envs of some columns begin new episodes: n-step sums and frame stacks stop at the
    boundary, which bootstraps like a truncation (the old episode went on from next_obs)."""
    g = 0.5
    buf = ReplayBuffer(40, n_envs=3, n_step=3, gamma=g, frame_stack=2, seed=0)
    buf.mark_boundary([0, 1, 2])  # nothing stored yet: nothing to mark
    for t in range(2):
        add_step(buf, [[t]] * 3, [0] * 3, [1.0] * 3, [[t + 0.5]] * 3, [0, 0, 0], [0, 0, 0])
    buf.mark_boundary(np.array([1, 2]))
    for t in range(2, 4):  # column 1 and 2's envs start new episodes here
        add_step(buf, [[t]] * 3, [0] * 3, [1.0] * 3, [[t + 0.5]] * 3, [0, 0, 0], [0, 0, 0])
    b = buf.sample(0)  # rows oldest first, columns in order
    np.testing.assert_allclose(b.rew[[0, 1, 2]], [1 + g + g**2, 1 + g, 1 + g])
    np.testing.assert_allclose(b.discount[[0, 1, 2]], [g**3, g**2, g**2])
    assert b.terminated[[0, 1, 2]].tolist() == [0.0, 0.0, 0.0]  # a boundary bootstraps
    assert b.next_obs[1, :, 0].tolist() == [1.0, 1.5]  # from the old episode's own next observation
    assert b.obs[[6, 7], :, 0].tolist() == [[1, 2], [2, 2]]  # no frame of the old episode in column 1's stack
    stored = buf.state_dict()["storage"]
    assert stored["truncated"][:, 1].tolist() == [False, True, False, False]


def test_mark_boundary_keeps_a_termination_and_rejects_unknown_columns():
    buf = ReplayBuffer(10, n_envs=2, seed=0)
    add_step(buf, [[0], [0]], [0, 0], [1.0, 1.0], [[1], [1]], [1, 0], [0, 0])
    buf.mark_boundary([0, 1])
    stored = buf.state_dict()["storage"]
    assert stored["terminated"][0].tolist() == [True, False] and stored["truncated"][0].tolist() == [False, True]
    with pytest.raises(ValueError, match="columns"):
        buf.mark_boundary([2])


def test_ready_counts_transitions_against_learning_starts_and_the_batch_size():
    buf = ReplayBuffer(100, n_envs=4, seed=0)
    assert not buf.ready(batch_size=1)
    for t in range(3):
        add_step(buf, [[t]] * 4, [0] * 4, [0.0] * 4, [[t]] * 4, [0] * 4, [0] * 4)
    assert buf.ready(batch_size=12) and not buf.ready(batch_size=13)
    assert buf.ready(batch_size=4, learning_starts=12) and not buf.ready(batch_size=4, learning_starts=13)


def test_a_full_replay_is_ready_where_rounding_to_rows_left_it_below_learning_starts():
    """buffer_size 1,000 over 3 envs holds 999 transitions: with learning_starts 1,000 (a size the config check lets
    through) the run never updated; it learns once the replay is full."""
    buf = ReplayBuffer(1_000, n_envs=3, seed=0)
    for t in range(333):
        assert not buf.ready(batch_size=64, learning_starts=1_000)
        add_step(buf, [[t]] * 3, [0] * 3, [0.0] * 3, [[t]] * 3, [0] * 3, [0] * 3)
    assert len(buf) == buf.capacity == 999 and buf.ready(batch_size=64, learning_starts=1_000)


# ---- frame stacking -----------------------------------------------------------------------------


def test_frame_stack_repeats_first_frame_and_stops_at_episode_boundaries():
    buf = ReplayBuffer(20, frame_stack=3, seed=0)
    # one env; episode ends (terminated) at t=2 and (truncated) at t=4
    term = [0, 0, 1, 0, 0, 0, 0]
    trunc = [0, 0, 0, 0, 1, 0, 0]
    for t in range(7):
        add_step(buf, [[t]], [0], [0.0], [[t + 0.5]], [term[t]], [trunc[t]])
    b = buf.sample(0)
    frames = b.obs[:, :, 0].tolist()
    assert frames == [[0, 0, 0], [0, 0, 1], [0, 1, 2], [3, 3, 3], [3, 3, 4], [5, 5, 5], [5, 5, 6]]
    nxt = b.next_obs[:, :, 0].tolist()
    assert nxt[0] == [0, 0, 0.5] and nxt[1] == [0, 1, 1.5] and nxt[2] == [1, 2, 2.5]
    assert nxt[3] == [3, 3, 3.5] and nxt[4] == [3, 4, 4.5] and nxt[6] == [5, 6, 6.5]


def test_frame_stack_never_reads_overwritten_frames():
    buf = ReplayBuffer(4, frame_stack=3, seed=0)
    for t in range(6):  # stored t = 2..5, no episode ends
        add_step(buf, [[t]], [0], [0.0], [[t + 1]], [0], [0])
    b = buf.sample(0)
    assert b.obs[:, :, 0].tolist() == [[2, 2, 2], [2, 2, 3], [2, 3, 4], [3, 4, 5]]
    assert b.next_obs[:, :, 0].tolist() == [[2, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6]]


@pytest.mark.parametrize(
    ("n_envs", "n_step", "frame_stack", "capacity"), [(1, 1, 4, 25), (3, 3, 4, 60), (2, 4, 2, 200)]
)
def test_frame_stack_with_n_step_matches_reference_loop(n_envs, n_step, frame_stack, capacity):
    stream = Stream(n_envs, steps=35, seed=7 + n_envs, obs_shape=(2, 3))
    buf = ReplayBuffer(capacity, n_envs=n_envs, n_step=n_step, gamma=0.9, frame_stack=frame_stack, seed=1)
    stream.fill(buf)
    kept_from = max(0, stream.steps - capacity // n_envs)
    b = buf.sample(0)
    assert b.obs.shape == (len(b), frame_stack, 2, 3)
    assert_matches_reference(b, stream, buf, kept_from)
    assert_matches_reference(buf.sample(50), stream, buf, kept_from)


# ---- dict observations --------------------------------------------------------------------------


def test_dict_observations_are_stored_per_key_and_returned_nested():
    buf = ReplayBuffer(10, n_envs=2, n_step=2, gamma=0.5, frame_stack=2, seed=0)
    for t in range(4):
        obs = {"image": np.full((2, 3, 3), t, np.uint8), "pos": np.array([[t, 0.0], [t, 1.0]])}
        nxt = {"pos": np.array([[t + 1, 0.0], [t + 1, 1.0]]), "image": np.full((2, 3, 3), t + 1, np.uint8)}
        add_step(buf, obs, [0, 1], [1.0, 2.0], nxt, [t == 1, False], [False, False])
    b = buf.sample(0)
    assert isinstance(b.obs, Batch) and set(b.obs.keys()) == {"image", "pos"}
    assert b.obs.image.shape == (8, 2, 3, 3) and b.obs.image.dtype == np.uint8
    assert b.next_obs.pos.shape == (8, 2, 2)
    # env 0, t = 1 (row 1) ended its episode: next stack is [1, 2] from obs 1 and the final obs 2
    assert b.obs.pos[2, :, 0].tolist() == [0, 1] and b.next_obs.pos[2, :, 0].tolist() == [1, 2]
    assert b.obs.image[4, :, 0, 0].tolist() == [2, 2]  # env 0, t = 2 starts a new episode
    assert b.obs.pos[:, -1, 1].tolist() == [0, 1] * 4  # env columns kept apart
    with pytest.raises(ValueError, match="obs"):
        add_step(buf, np.zeros((2, 2)), [0, 1], [1.0, 2.0], np.zeros((2, 2)), [0, 0], [0, 0])


# ---- checkpoints --------------------------------------------------------------------------------


def round_trip(state: dict) -> dict:
    blob = io.BytesIO()
    torch.save(state, blob)
    blob.seek(0)
    return torch.load(blob, weights_only=True)


@pytest.mark.parametrize("dict_obs", [False, True])
def test_state_dict_round_trip_gives_identical_samples(dict_obs):
    stream = Stream(2, steps=15, seed=3)
    buf = ReplayBuffer(40, n_envs=2, n_step=3, frame_stack=2, seed=5)
    for t in range(stream.steps):
        obs = {"x": stream.obs[t], "y": stream.act[t]} if dict_obs else stream.obs[t]
        nxt = {"x": stream.next_obs[t], "y": stream.act[t]} if dict_obs else stream.next_obs[t]
        add_step(buf, obs, stream.act[t], stream.rew[t], nxt, stream.term[t], stream.trunc[t])
    buf.sample(7)  # advance the RNG: the loaded copy must continue from the same state
    loaded = ReplayBuffer(40, n_envs=2, n_step=3, frame_stack=2, seed=999)
    loaded.load_state_dict(round_trip(buf.state_dict()))
    assert len(loaded) == len(buf)
    # adding after a load keeps writing at the right row
    obs = {"x": stream.obs[0], "y": stream.act[0]} if dict_obs else stream.obs[0]
    for target in (buf, loaded):
        add_step(target, obs, [1, 1], [9.0, 9.0], obs, [0, 0], [0, 0])
    for _ in range(3):
        a, b = buf.sample(16), loaded.sample(16)
        for key in ("act", "rew", "terminated", "discount", "index"):
            np.testing.assert_array_equal(a[key], b[key])
        a_obs, b_obs = (a.obs.x, b.obs.x) if dict_obs else (a.obs, b.obs)
        np.testing.assert_array_equal(a_obs, b_obs)
    np.testing.assert_array_equal(buf.sample(0).rew, loaded.sample(0).rew)


def test_load_state_dict_rejects_other_sizes():
    buf = ReplayBuffer(10)
    add_step(buf, [[0]], [0], [0.0], [[1]], [0], [0])
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(20).load_state_dict(buf.state_dict())


# ---- prioritized replay -------------------------------------------------------------------------


def filled_per(n: int = 4, **kwargs) -> PrioritizedReplayBuffer:
    buf = PrioritizedReplayBuffer(n, **kwargs)
    for t in range(n):
        add_step(buf, [[t]], [t], [0.0], [[t + 1]], [0], [0])
    return buf


def test_per_sampling_frequencies_follow_priority_to_the_alpha():
    alpha = 0.6
    buf = filled_per(4, alpha=alpha, seed=0)
    priorities = np.array([1.0, 2.0, 3.0, 4.0])
    buf.update_priorities(np.arange(4), priorities)
    counts = np.zeros(4)
    for _ in range(25):
        counts += np.bincount(buf.sample(8_000).index, minlength=4)
    expected = priorities**alpha / (priorities**alpha).sum()
    np.testing.assert_allclose(counts / counts.sum(), expected, atol=0.01)


def test_per_sampling_is_stratified():
    buf = filled_per(8, alpha=1.0, seed=0)  # equal priorities: one draw per eighth of the mass hits each once
    for _ in range(5):
        assert sorted(buf.sample(8).index.tolist()) == list(range(8))


def test_per_importance_weights_match_hand_computation():
    buf = filled_per(4, alpha=1.0, beta=0.5, eps=1e-6, seed=0)
    buf.update_priorities(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]) - 1e-6)  # priorities 1, 2, 3, 4
    b = buf.sample(0)
    # P = p / 10, N = 4: w_i = (4 P_i)^-0.5 / max_j (4 P_j)^-0.5 = (p_i / p_min)^-0.5
    np.testing.assert_allclose(b.weight, [1.0, 0.5**0.5, 3**-0.5, 0.5], rtol=1e-6)
    assert b.weight.dtype == np.float32
    assert (buf.sample(64).weight <= 1.0).all()


def test_per_new_transitions_get_the_max_priority_and_explicit_priorities():
    buf = filled_per(8, alpha=1.0, eps=1e-6, seed=0)  # full: the next adds overwrite rows 0, 1, 2
    buf.update_priorities(np.array([0]), np.array([5.0]))
    idx = add_step(buf, [[9]], [9], [0.0], [[10]], [0], [0])
    assert buf._sum_tree[idx][0] == pytest.approx(5.0 + 1e-6)
    idx = add_step(buf, [[9]], [9], [0.0], [[10]], [0], [0], priority=np.array([-7.0]))  # |td| is used
    assert buf._sum_tree[idx][0] == pytest.approx(7.0 + 1e-6)
    idx = add_step(buf, [[9]], [9], [0.0], [[10]], [0], [0])
    assert buf._sum_tree[idx][0] == pytest.approx(7.0 + 1e-6)


def test_per_update_priorities_changes_sampling():
    buf = filled_per(16, alpha=1.0, seed=0)
    before = np.bincount(buf.sample(1600).index, minlength=16)
    assert before.min() > 50
    buf.update_priorities(np.arange(16), np.where(np.arange(16) == 3, 100.0, 0.01))
    after = np.bincount(buf.sample(1600).index, minlength=16)
    assert after[3] > 1500
    with pytest.raises(ValueError, match="stored"):
        filled_per(4).update_priorities(np.array([4]), np.array([1.0]))


def test_per_with_several_envs_maps_indices_to_transitions():
    buf = PrioritizedReplayBuffer(12, n_envs=3, alpha=1.0, seed=0)
    for t in range(4):
        add_step(
            buf,
            np.array([[t * 10 + e] for e in range(3)]),
            [0, 1, 2],
            [0, 0, 0],
            np.zeros((3, 1)),
            [0] * 3,
            [0] * 3,
        )
    buf.update_priorities(np.arange(12), np.where(np.arange(12) == 7, 1000.0, 1e-3))  # row 2, env 1
    b = buf.sample(100)
    assert (b.index == 7).mean() > 0.95
    assert (b.obs[b.index == 7, 0] == 21).all() and (b.act[b.index == 7] == 1).all()


def test_per_beta_annealing_and_set_beta():
    buf = filled_per(4, alpha=1.0, beta=0.2, beta_final=1.0, beta_anneal_steps=4, seed=0)
    buf.update_priorities(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    seen = []
    for _ in range(6):
        beta = buf.beta
        seen.append(beta)
        b = buf.sample(0)
        p = buf._sum_tree[b.index]
        np.testing.assert_allclose(b.weight, (p / p.min()) ** -beta, rtol=1e-5)
    np.testing.assert_allclose(seen, [0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    buf.set_beta(0.3)
    buf.sample(2)
    assert buf.beta == 0.3


def test_per_schedule_state_carries_the_beta_annealing_to_an_empty_buffer():
    """A run that does not save its replay data (data_parallel) still resumes β where it was."""
    buf = filled_per(4, beta=0.2, beta_final=1.0, beta_anneal_steps=4, seed=0)
    for _ in range(3):
        buf.sample(2)
    fresh = PrioritizedReplayBuffer(4, beta=0.2, beta_anneal_steps=4)
    fresh.load_schedule_state(round_trip(buf.schedule_state()))
    assert fresh.beta == pytest.approx(0.8) and len(fresh) == 0
    assert ReplayBuffer(4).schedule_state() == {}


def test_per_a_resumed_schedule_anneals_beta_over_the_new_budget():
    """A run resumed with more steps builds its buffer to anneal β over them: 3 of 8 calls made, not 3 of 4 (the
    resume warns that annealed settings follow the new budget)."""
    buf = filled_per(4, beta=0.2, beta_final=1.0, beta_anneal_steps=4, seed=0)
    for _ in range(3):
        buf.sample(2)
    longer = PrioritizedReplayBuffer(4, beta=0.2, beta_anneal_steps=8)
    longer.load_state_dict(round_trip(buf.state_dict()))
    assert longer.beta == pytest.approx(0.2 + 3 / 8 * 0.8)
    longer.anneal_beta_over(0)
    assert longer.beta == pytest.approx(0.2)


def test_per_state_dict_round_trip():
    buf = filled_per(8, alpha=0.7, beta=0.4, beta_anneal_steps=10, n_step=2, seed=1)
    buf.update_priorities(np.arange(8), np.arange(1.0, 9.0))
    buf.sample(4)
    loaded = PrioritizedReplayBuffer(8, alpha=0.7, beta=0.4, beta_anneal_steps=10, n_step=2, seed=2)
    loaded.load_state_dict(round_trip(buf.state_dict()))
    assert loaded.beta == pytest.approx(buf.beta)
    for _ in range(3):
        a, b = buf.sample(32), loaded.sample(32)
        np.testing.assert_array_equal(a.index, b.index)
        np.testing.assert_array_equal(a.weight, b.weight)
        np.testing.assert_array_equal(a.rew, b.rew)
    idx = add_step(loaded, [[0]], [0], [0.0], [[1]], [0], [0])
    assert loaded._sum_tree[idx][0] == pytest.approx((8.0 + 1e-6) ** 0.7)  # max priority restored

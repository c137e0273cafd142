"""Recurrent replay: SequenceReplayBuffer against the stream it was fed, n-step sums inside sequences, and
recurrent DQN's loss (burn-in steps carry no loss, stored states are the states acting had)."""

import io

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos.dqn import DQN, Config
from rlfleet.data import SequenceReplayBuffer
from rlfleet.data.returns import sequence_nstep
from rlfleet.envs import make_vector_env
from rlfleet.launch import train
from rlfleet.run.collector import Collector

H = 3  # stored state size in the buffer tests


def fill(buf, steps, n_envs, seed=0, p_done=0.1):
    """Feed `steps` vector steps; obs[t, e] = (t, e), the stored h = t + e / 10. Returns the dones [T, N]."""
    rng = np.random.default_rng(seed)
    term = rng.random((steps, n_envs)) < p_done
    trunc = (rng.random((steps, n_envs)) < p_done / 2) & ~term
    for t in range(steps):
        obs = np.stack([np.full(n_envs, t), np.arange(n_envs)], axis=1).astype(np.float32)
        h = np.repeat((t + np.arange(n_envs) / 10)[:, None], H, axis=1).astype(np.float32)
        state = None if t == 0 else (h, -h)
        buf.add(obs, np.full(n_envs, t % 2), np.full(n_envs, float(t), np.float32), obs + 0.5, term[t], trunc[t], state)
    return term | trunc


def test_shapes_and_dtypes():
    buf = SequenceReplayBuffer(200, n_envs=2, seq_len=5, state_size=H, seed=0)
    fill(buf, 30, 2)
    b = buf.sample(7)
    assert b.obs.shape == (7, 5, 2) and b.next_obs.shape == (7, 5, 2)
    for key in ("act", "rew", "terminated", "truncated", "starts"):
        assert b[key].shape == (7, 5), key
    assert b.h0.shape == b.c0.shape == (7, H)
    assert b.weight.shape == b.index.shape == (7,)
    assert b.rew.dtype == b.starts.dtype == b.terminated.dtype == np.float32
    assert b.index.dtype == np.int64
    plain = SequenceReplayBuffer(200, n_envs=2, seq_len=5, seed=0)
    fill(plain, 30, 2)
    assert "h0" not in plain.sample(3)


def test_sequences_are_contiguous_pieces_of_one_env_stream():
    buf = SequenceReplayBuffer(400, n_envs=4, seq_len=6, state_size=H, seed=1)
    done = fill(buf, 50, 4)
    b = buf.sample(300)
    t0, env = b.obs[:, 0, 0].astype(int), b.obs[:, 0, 1].astype(int)
    np.testing.assert_array_equal(b.obs[:, :, 0], t0[:, None] + np.arange(6))  # consecutive steps
    np.testing.assert_array_equal(b.obs[:, :, 1], np.repeat(env[:, None], 6, axis=1))  # of one env
    np.testing.assert_array_equal(b.next_obs, b.obs + 0.5)
    np.testing.assert_array_equal(b.rew, b.obs[:, :, 0])
    np.testing.assert_array_equal(b.index, t0 * 4 + env)
    # stored state of the first step (zeros for the run's first step, given as None)
    expected_h = np.where(t0 == 0, 0.0, t0 + env / 10).astype(np.float32)
    np.testing.assert_allclose(b.h0, np.repeat(expected_h[:, None], H, axis=1))
    np.testing.assert_allclose(b.c0, -b.h0)
    # dones are those of the stream
    steps = t0[:, None] + np.arange(6)
    np.testing.assert_array_equal(b.terminated + b.truncated > 0, done[steps, env[:, None]])


def test_starts_mark_episode_boundaries():
    buf = SequenceReplayBuffer(400, n_envs=3, seq_len=8, state_size=H, seed=2)
    done = fill(buf, 60, 3, p_done=0.2)
    b = buf.sample(0)  # every valid start
    t0, env = b.obs[:, 0, 0].astype(int), b.obs[:, 0, 1].astype(int)
    steps = t0[:, None] + np.arange(8)
    prev_done = np.where(steps > 0, done[np.maximum(steps - 1, 0), env[:, None]], True)
    np.testing.assert_array_equal(b.starts, prev_done.astype(np.float32))
    assert b.starts[:, 1:].sum() > 0  # sequences do cross episode ends


def test_ring_wrap_around_keeps_sequences_in_order_and_behind_the_newest_row():
    rows, n_envs, seq_len = 10, 2, 4
    buf = SequenceReplayBuffer(rows * n_envs, n_envs=n_envs, seq_len=seq_len, state_size=H, seed=3)
    done = fill(buf, 27, n_envs)  # rows hold steps 17..26, the newest (26) in row 6
    b = buf.sample(0)
    t0 = b.obs[:, 0, 0].astype(int)
    assert sorted(set(t0)) == list(range(17, 27 - seq_len + 1))  # 7 valid starts, oldest first
    assert len(b.index) == 7 * n_envs
    np.testing.assert_array_equal(b.obs[:, :, 0], t0[:, None] + np.arange(seq_len))  # across the ring's end
    # the oldest stored step's predecessor is overwritten: its sequences go on from its stored state, which was
    # zeroed as a start (so the whole state of a sequence that began mid-episode was lost)
    oldest = t0 == 17
    np.testing.assert_array_equal(b.starts[oldest, 0], 0.0)
    later = t0 > 17
    env = b.obs[:, 0, 1].astype(int)
    np.testing.assert_array_equal(b.starts[later, 0], done[t0[later] - 1, env[later]].astype(np.float32))
    np.testing.assert_allclose(b.h0[:, 0], t0 + env / 10, rtol=1e-6)


def test_sampling_is_uniform_over_valid_starts():
    rows, n_envs, seq_len = 20, 3, 5
    buf = SequenceReplayBuffer(rows * n_envs, n_envs=n_envs, seq_len=seq_len, seed=4)
    fill(buf, 33, n_envs)  # wrapped; valid starts: steps 13..28 in each env
    draws = 64_000
    b = buf.sample(draws)
    t0, env = b.obs[:, 0, 0].astype(int), b.obs[:, 0, 1].astype(int)
    assert t0.min() == 13 and t0.max() == 28
    counts = np.zeros((16, n_envs))
    np.add.at(counts, (t0 - 13, env), 1)
    expected = draws / counts.size
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 100  # 47 degrees of freedom: p < 1e-4 above 100
    assert counts.min() > 0.8 * expected and counts.max() < 1.2 * expected


def test_too_short_buffer_and_bad_sizes_fail_clearly():
    buf = SequenceReplayBuffer(100, n_envs=2, seq_len=6, state_size=H)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1)
    fill(buf, 5, 2)
    with pytest.raises(ValueError, match="seq_len"):
        buf.sample(1)
    with pytest.raises(ValueError, match="seq_len"):
        SequenceReplayBuffer(10, n_envs=2, seq_len=6)
    with pytest.raises(ValueError, match="state"):
        buf.add(
            np.zeros((2, 2)),
            np.zeros(2),
            np.zeros(2),
            np.zeros((2, 2)),
            np.zeros(2),
            np.zeros(2),
            (np.zeros((2, 4)),) * 2,
        )


def test_ready_needs_a_whole_sequence_in_every_env_column():
    """learning_starts counts transitions over all columns; a sequence needs seq_len steps of one column."""
    buf = SequenceReplayBuffer(10_000, n_envs=64, seq_len=6)
    fill(buf, 5, 64)
    assert len(buf) == 320 and not buf.ready(batch_size=4, learning_starts=100)
    fill(buf, 1, 64)
    assert buf.ready(batch_size=4, learning_starts=100)
    buf.sample(4)


def test_a_marked_boundary_starts_the_next_step_of_a_sequence():
    buf = SequenceReplayBuffer(100, n_envs=2, seq_len=4, state_size=H)
    fill(buf, 2, 2, p_done=0.0)
    buf.mark_boundary([1])
    fill(buf, 2, 2, p_done=0.0)
    b = buf.sample(0)  # one sequence per column: steps 0..3
    assert b.starts[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert b.starts[1].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert b.truncated[1].tolist() == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("arch", ["single", "data_parallel"])
def test_recurrent_dqn_learns_once_every_column_holds_a_sequence(arch, run_opts):
    """64 env columns and 2 steps a round: the first round's 128 transitions pass learning_starts=100, but a
    sequence of 6 steps is only there after the third round."""
    overrides = {"lstm": 8, "hidden": "16", "burn_in": 2, "train_len": 4, "train_freq": 2, "learning_starts": 100,
                 "batch_size": 4, "gradient_steps": 1}  # fmt: skip
    n_envs = 64 if arch == "single" else 32
    parallel = {} if arch == "single" else {"workers": 2, "backend": "serial"}
    result = train("dqn", "rlfleet/CartPoleNoVel-v1", arch=arch, n_envs=n_envs, steps=640, eval_every=10**9,
                   eval_episodes=1, stop_return=1e9, overrides=overrides, **parallel, **run_opts)  # fmt: skip
    assert result["env_steps"] == 640 and result.algo.updates == 3  # gradient steps in rounds 3, 4 and 5


def test_state_dict_round_trip_continues_the_same_samples():
    buf = SequenceReplayBuffer(60, n_envs=3, seq_len=4, state_size=H, seed=5)
    fill(buf, 25, 3)
    data = io.BytesIO()
    torch.save(buf.state_dict(), data)
    data.seek(0)
    other = SequenceReplayBuffer(60, n_envs=3, seq_len=4, state_size=H, seed=99)
    other.load_state_dict(torch.load(data, weights_only=True))
    a, b = buf.sample(16), other.sample(16)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    with pytest.raises(ValueError, match="state_size"):
        SequenceReplayBuffer(60, n_envs=3, seq_len=4).load_state_dict(buf.state_dict())


def naive_nstep(rew, term, trunc, n, gamma):
    batch, steps = rew.shape
    ret = np.zeros((batch, steps))
    last = np.zeros((batch, steps), dtype=int)
    boot = np.zeros((batch, steps))
    for i in range(batch):
        for t in range(steps):
            total, k = 0.0, 0
            while True:
                total += gamma**k * rew[i, t + k]
                if term[i, t + k] or trunc[i, t + k] or k + 1 == n or t + k + 1 == steps:
                    break
                k += 1
            ret[i, t], last[i, t] = total, t + k
            boot[i, t] = 0.0 if term[i, t + k] else gamma ** (k + 1)
    return ret, last, boot


@pytest.mark.parametrize("n", [1, 3, 5])
def test_sequence_nstep_matches_a_naive_loop(n):
    rng = np.random.default_rng(n)
    rew = rng.normal(size=(6, 12)).astype(np.float32)
    term = rng.random((6, 12)) < 0.15
    trunc = (rng.random((6, 12)) < 0.1) & ~term
    ret, last, boot = sequence_nstep(rew, term.astype(np.float32), trunc.astype(np.float32), n, 0.9)
    ref_ret, ref_last, ref_boot = naive_nstep(rew, term, trunc, n, 0.9)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(last, ref_last)
    np.testing.assert_allclose(boot, ref_boot, rtol=1e-6)


# ---------------------------------------------------------------------------------------- recurrent DQN
OBS = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
ACTS = gym.spaces.Discrete(3)


def recurrent_dqn(actions=ACTS, **kwargs):
    cfg = Config(lstm=8, hidden=(16,), burn_in=4, train_len=5, n_step=2, **kwargs)
    return DQN(cfg, OBS, actions, seed=0)


def sequence_batch(seed=0, batch=6, steps=9):
    rng = np.random.default_rng(seed)
    term = (rng.random((batch, steps)) < 0.1).astype(np.float32)
    trunc = ((rng.random((batch, steps)) < 0.1) & (term == 0)).astype(np.float32)
    starts = np.zeros((batch, steps), np.float32)
    starts[:, 1:] = np.maximum(term, trunc)[:, :-1]
    from rlfleet.data import Batch

    return Batch(
        obs=rng.normal(size=(batch, steps, 2)).astype(np.float32),
        act=rng.integers(0, 3, size=(batch, steps)),
        rew=rng.normal(size=(batch, steps)).astype(np.float32),
        next_obs=rng.normal(size=(batch, steps, 2)).astype(np.float32),
        terminated=term,
        truncated=trunc,
        starts=starts,
        h0=rng.normal(size=(batch, 8)).astype(np.float32),
        c0=rng.normal(size=(batch, 8)).astype(np.float32),
        weight=np.ones(batch, np.float32),
        index=np.arange(batch),
    )


def test_burn_in_steps_carry_no_loss():
    algo = recurrent_dqn()
    batch = sequence_batch()
    loss, _, _ = algo.td_loss(batch)
    changed = sequence_batch()
    burn = algo.cfg.burn_in
    changed.rew[:, :burn] += 100.0  # rewards, actions and dones of burn-in steps are not in the loss
    changed.act[:, :burn] = (changed.act[:, :burn] + 1) % 3
    changed.terminated[:, :burn] = 1.0 - changed.terminated[:, :burn]
    assert algo.td_loss(changed)[0].item() == pytest.approx(loss.item(), rel=1e-6)
    changed.rew[:, burn] += 1.0  # the first trained step's reward is
    assert algo.td_loss(changed)[0].item() != pytest.approx(loss.item(), rel=1e-6)


def test_burn_in_observations_only_warm_the_state_up_without_gradient():
    algo = recurrent_dqn(double=False)
    batch = sequence_batch()
    torch_batch = batch.to_torch()
    obs = torch_batch.obs.clone().requires_grad_(True)
    # rebuild the loss on a batch whose obs is a leaf tensor: gradient flows into the trained steps only
    from rlfleet.data import Batch

    leafy = Batch({k: (obs if k == "obs" else v) for k, v in torch_batch.items()})
    leafy.rew, leafy.terminated, leafy.truncated = batch.rew, batch.terminated, batch.truncated
    loss, _, _ = algo.td_loss(leafy)
    loss.backward()
    burn = algo.cfg.burn_in
    assert obs.grad[:, :burn].abs().sum() == 0
    assert obs.grad[:, burn:].abs().sum() > 0
    changed = sequence_batch()
    changed.obs[:, 0] += 1.0  # burn-in observations still shape the state the loss starts from
    assert algo.td_loss(changed)[0].item() != pytest.approx(loss.item(), rel=1e-6)


def test_zero_state_sequences_without_stored_state():
    algo = recurrent_dqn(stored_state=False)
    buf = algo.make_buffer(n_envs=2, total_steps=1_000)
    assert buf.state_size == 0 and buf.seq_len == 9
    batch = sequence_batch()
    del batch["h0"], batch["c0"]
    loss, metrics, priorities = algo.td_loss(batch)
    assert np.isfinite(loss.item()) and priorities.shape == (6,)


def test_collected_states_are_the_states_acting_had():
    algo = recurrent_dqn(gym.spaces.Discrete(2))
    envs = make_vector_env("rlfleet/CartPoleNoVel-v1", 2, seed=0, mode="sync")
    try:
        buf = algo.make_buffer(n_envs=2, total_steps=1_000)
        Collector(envs, algo, seed=0).collect(buf, n_step=120)
    finally:
        envs.close()
    b = buf.sample(0)
    h0, c0 = torch.from_numpy(b.h0), torch.from_numpy(b.c0)
    starts = b.starts[:, 0] > 0
    assert starts.any()
    assert (h0[torch.from_numpy(starts)] == 0).all()  # an episode start acts from zeros
    # continuing the stored state over a sequence's steps gives the states stored for the next rows
    with torch.no_grad():
        _, (hs, _) = algo.q.unroll(torch.from_numpy(b.obs).transpose(0, 1), (h0, c0), torch.from_numpy(b.starts).T)
    seq, n_envs = buf.seq_len, 2
    by_index = {int(i): k for k, i in enumerate(b.index)}
    checked = 0
    for k, i in enumerate(b.index):
        nxt = by_index.get(int(i) + n_envs)  # the same env's next row
        if nxt is not None and not b.starts[nxt, 0]:
            torch.testing.assert_close(hs[0, k], h0[nxt])
            checked += 1
    assert checked > 20 and seq == 9


def test_recurrent_act_carries_and_resets_state():
    algo = recurrent_dqn()
    obs = np.zeros((3, 2), np.float32)
    _, _, state = algo.act(obs, None, explore=False)
    assert state[0].shape == (3, 8)
    reset = algo.reset_state(state, np.array([True, False, False]))
    assert (reset[0][0] == 0).all() and torch.equal(reset[0][1:], state[0][1:])


def test_targets_bootstrap_from_the_final_observation_on_truncation_but_not_on_termination():
    algo = recurrent_dqn()
    algo.cfg.n_step = 1
    k = algo.cfg.burn_in + 2  # a trained step

    def loss_with(ended: str, shift: float) -> float:
        batch = sequence_batch()
        batch.terminated[:], batch.truncated[:], batch.starts[:] = 0.0, 0.0, 0.0
        batch[ended][:, k] = 1.0
        batch.starts[:, k + 1] = 1.0
        batch.next_obs[:, k] += shift
        return algo.td_loss(batch)[0].item()

    assert loss_with("terminated", 5.0) == pytest.approx(loss_with("terminated", 0.0), rel=1e-6)
    assert loss_with("truncated", 5.0) != pytest.approx(loss_with("truncated", 0.0), rel=1e-6)

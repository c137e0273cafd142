"""n-step returns, GAE and TD targets against naive per-env reference loops, truncation included."""

import numpy as np
import pytest

from rlfleet.data.returns import discounted_returns, episode_complete_mask, gae, td_targets


def reference_returns(rew, term, trunc, boot, last_value, gamma):
    """Walk each env's stream forward and sum discounted rewards until an episode end or the segment end."""
    T, N = rew.shape
    out = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                total += discount * rew[k, n]
                discount *= gamma
                if term[k, n]:
                    break
                if trunc[k, n]:
                    total += discount * boot[k, n]
                    break
                if k == T - 1:
                    total += discount * last_value[n]
            out[t, n] = total
    return out


def reference_gae(rew, values, term, trunc, boot, last_value, gamma, lam):
    T, N = rew.shape
    adv = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if term[t, n]:
                next_v, cont = 0.0, 0.0
            elif trunc[t, n]:
                next_v, cont = boot[t, n], 0.0
            else:
                next_v = values[t + 1, n] if t < T - 1 else last_value[n]
                cont = 1.0
            delta = rew[t, n] + gamma * next_v - values[t, n]
            running = delta + gamma * lam * cont * running
            adv[t, n] = running
    return adv


@pytest.fixture
def segment():
    rng = np.random.default_rng(0)
    T, N = 12, 3
    rew = rng.normal(size=(T, N)).astype(np.float32)
    term = np.zeros((T, N), dtype=bool)
    trunc = np.zeros((T, N), dtype=bool)
    term[3, 0] = True
    trunc[7, 0] = True
    trunc[5, 1] = True
    term[5, 1] = True  # both set: termination wins, nothing bootstrapped
    term[11, 2] = True  # ends exactly at the segment end
    trunc[2, 2] = True
    boot = np.where(trunc, rng.normal(size=(T, N)), 0.0).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    last_value = rng.normal(size=N).astype(np.float32)
    return rew, term, trunc, boot, values, last_value


def test_discounted_returns_match_reference(segment):
    rew, term, trunc, boot, _, last_value = segment
    got = discounted_returns(rew, term, trunc, last_value, 0.9, boot)
    want = reference_returns(rew, term, trunc, np.where(term, 0, boot), last_value, 0.9)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_hand_computed_returns():
    # one env: r = 1, 2, 3 with a truncation after step 1 (final-obs value 10) and last value 5
    rew = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    term = np.zeros((3, 1), bool)
    trunc = np.array([[False], [True], [False]])
    boot = np.array([[0.0], [10.0], [0.0]], dtype=np.float32)
    got = discounted_returns(rew, term, trunc, np.array([5.0], np.float32), 0.5, boot)
    np.testing.assert_allclose(got[:, 0], [1 + 0.5 * (2 + 0.5 * 10), 2 + 0.5 * 10, 3 + 0.5 * 5])
    term[1, 0] = True  # a termination at the same place bootstraps nothing
    got = discounted_returns(rew, term, trunc, np.array([5.0], np.float32), 0.5, boot)
    np.testing.assert_allclose(got[:, 0], [1 + 0.5 * 2, 2, 3 + 0.5 * 5])


@pytest.mark.parametrize("lam", [0.0, 0.8, 1.0])
def test_gae_matches_reference(segment, lam):
    rew, term, trunc, boot, values, last_value = segment
    adv, ret = gae(rew, values, term, trunc, last_value, 0.95, lam, boot)
    want = reference_gae(rew, values, term, trunc, np.where(term, 0, boot), last_value, 0.95, lam)
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want + values, rtol=1e-5, atol=1e-5)


def test_gae_lambda_one_equals_discounted_returns(segment):
    rew, term, trunc, boot, values, last_value = segment
    _, ret = gae(rew, values, term, trunc, last_value, 0.9, 1.0, boot)
    np.testing.assert_allclose(ret, discounted_returns(rew, term, trunc, last_value, 0.9, boot), atol=1e-5)


def test_td_targets(segment):
    rew, term, trunc, boot, values, last_value = segment
    got = td_targets(rew, values, term, trunc, last_value, 0.9, boot)
    T, N = rew.shape
    for t in range(T):
        for n in range(N):
            if term[t, n]:
                nv = 0.0
            elif trunc[t, n]:
                nv = boot[t, n]
            else:
                nv = values[t + 1, n] if t < T - 1 else last_value[n]
            assert got[t, n] == pytest.approx(rew[t, n] + 0.9 * nv, abs=1e-5)


def test_episode_complete_mask():
    term = np.array([[0, 0], [1, 0], [0, 0], [0, 1], [0, 0]], dtype=bool)
    trunc = np.zeros_like(term)
    trunc[2, 0] = True
    mask = episode_complete_mask(term, trunc)
    np.testing.assert_array_equal(mask[:, 0], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(mask[:, 1], [1, 1, 1, 1, 0])


def test_returns_ignore_garbage_free_memory():
    """Without values, entries that are never read must not leak into results (regression: uninitialised memory)."""
    rew = np.ones((64, 4), np.float32)
    term = np.zeros((64, 4), bool)
    trunc = np.zeros((64, 4), bool)
    for _ in range(20):
        np.full((64, 4), np.nan, np.float32)  # leave NaNs in recently freed memory
        ret = discounted_returns(rew, term, trunc, np.zeros(4, np.float32), 0.9)
        assert np.isfinite(ret).all()

"""DQN's loss: the (double) Q-learning target and the Huber loss against values computed by hand, and the
online network's graph built over the B sampled states only."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from rlfleet.algos import resolve
from rlfleet.data.batch import Batch
from rlfleet.launch import train

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
B = 8


def make_dqn(**overrides):
    algo_cls, config_cls, _, _ = resolve("dqn")
    return algo_cls(config_cls(**overrides), OBS_SPACE, gym.spaces.Discrete(3), seed=0)


def batch() -> Batch:
    rng = np.random.default_rng(0)
    return Batch(
        obs=rng.uniform(-1, 1, (B, 4)).astype(np.float32),
        act=rng.integers(0, 3, B),
        rew=rng.standard_normal(B).astype(np.float32),
        next_obs=rng.uniform(-1, 1, (B, 4)).astype(np.float32),
        terminated=(np.arange(B) % 3 == 0).astype(np.float32),
        discount=np.full(B, 0.9**3, np.float32),
        weight=rng.uniform(0.5, 1.0, B).astype(np.float32),
    )


@pytest.mark.parametrize("double", [True, False])
def test_loss_is_the_weighted_huber_loss_to_the_q_learning_target(double):
    """y = r + γⁿ (1 − terminated) Q'(s', a*), a* = argmax_a Q(s', a) (double) or argmax_a Q'(s', a);
    loss = mean(w · huber(Q(s, a), y)); the TD errors give the priorities."""
    algo = make_dqn(double=double)
    with torch.no_grad():
        for p in algo.q_target.parameters():
            p.mul_(-1.5)  # the target net differs from the online net, so the two targets differ
    data = batch()
    loss, _, td_abs = algo.td_loss(data)
    b = data.to_torch()
    with torch.no_grad():
        q = algo.q(b.obs)[torch.arange(B), b.act.long()]
        q_next_target = algo.q_target(b.next_obs)
        best = (algo.q(b.next_obs) if double else q_next_target).argmax(1)
        y = b.rew + b.discount * (1 - b.terminated) * q_next_target[torch.arange(B), best]
        want = (b.weight * F.smooth_l1_loss(q, y, reduction="none")).mean()
    torch.testing.assert_close(loss.detach(), want)
    np.testing.assert_allclose(td_abs, (y - q).abs().numpy(), rtol=1e-5, atol=1e-6)
    if double:  # the test's premise: the online net's argmax is not the target net's on some s'
        assert not torch.equal(best, q_next_target.argmax(1))


def test_the_online_nets_graph_covers_the_sampled_states_only():
    """Double DQN passes the online net over s' too, without a graph: the backward then runs over B rows,
    not over 2B of which the s' half carries no gradient."""
    algo = make_dqn(double=True)
    calls = []
    algo.q.register_forward_hook(lambda module, inputs, out: calls.append((len(out), torch.is_grad_enabled())))
    loss, _, _ = algo.td_loss(batch())
    assert sorted(calls) == [(B, False), (B, True)]
    assert loss.requires_grad


def test_a_single_run_counts_a_pass_of_updates_only_once_its_replay_holds_enough(tmp_path):
    """`updates` in result.json counts gradient steps (gradient_steps per pass), as on every architecture: none for
    the iterations before learning_starts, which only collect."""
    result = train("dqn", "CartPole-v1", seed=0, steps=3_000, eval_every=10**9, overrides={"learning_starts": 2_000},
                   logdir=str(tmp_path), progress=False)  # fmt: skip
    cfg = result.algo.cfg
    iterations = result["env_steps"] // (cfg.train_freq * cfg.n_envs)
    assert 0 < result["updates"] < iterations / 2 * cfg.gradient_steps
    assert result["updates"] == result.algo.updates  # the gradient steps DQN counted itself

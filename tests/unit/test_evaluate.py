"""Greedy evaluation ends: an episode of an env without a time limit is cut at the bound, counted with the return
it had and reported; an env's own time limit ends its episodes first."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlfleet.envs import make_vector_env
from rlfleet.run.config import EVAL_MAX_STEPS
from rlfleet.run.evaluate import episode_bound, evaluate
from rlfleet.run.recording import ENVS, EpisodeRecorder, record_episodes


class Endless(gym.Env):
    """Two states and no end: action 0 goes back and forth between them, -1 a step; action 1 ends the episode
    from state 1 (a policy that always picks 0 loops forever)."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = 0
        return self.state, {}

    def step(self, action):
        if action == 1 and self.state == 1:
            return self.state, 0.0, True, False, {}
        self.state = 1 - self.state
        return self.state, -1.0, False, False, {}


class Loops:
    """A greedy policy that never leaves the loop, or (`finish_in=k`) one that ends the episode after k steps."""

    def __init__(self, finish_in: int | None = None):
        self.finish_in, self.t = finish_in, 0

    def act(self, obs, state=None, explore=False):
        self.t += 1
        finish = self.finish_in is not None and self.t >= self.finish_in and obs[0] == 1
        return np.full(len(obs), int(finish)), {}, state


class Balances:
    """CartPole's pole kept up for far longer than 20 steps: push towards the side it leans to."""

    def act(self, obs, state=None, explore=False):
        return (obs[:, 2] + obs[:, 3] > 0).astype(np.int64), {}, state


def test_an_endless_episode_is_cut_at_the_bound_with_the_return_it_had():
    envs = make_vector_env(Endless, 3, seed=0, mode="sync", training=False)
    try:
        result = evaluate(Loops(), envs, 2, seed=0, max_steps=50)
    finally:
        envs.close()
    assert result.cut == 2 and result.max_steps == 50
    np.testing.assert_array_equal(result.returns, [-50.0, -50.0])


def test_an_episode_that_ends_is_not_cut():
    envs = make_vector_env(Endless, 2, seed=0, mode="sync", training=False)
    try:
        result = evaluate(Loops(finish_in=10), envs, 2, seed=0, max_steps=50)
    finally:
        envs.close()
    assert result.cut == 0 and np.all(result.returns > -50)


def test_recorded_episodes_end_at_the_cut():
    """Demonstrations (collect, DAgger) of a cut episode hold its steps up to the bound, then the next episode."""
    recorder = EpisodeRecorder()
    result = record_episodes(Loops(), Endless, 3, 0, recorder, max_steps=7)
    obs, act, rew, starts = recorder.arrays()
    assert result.cut == 3 and len(rew) == 3 * 7 and starts.sum() == 3
    assert np.flatnonzero(starts).tolist() == [0, 7, 14]


class PushesLeft:
    """CartPole's cart pushed left every step: episodes of about 10 steps, their lengths varying with the seed."""

    def act(self, obs, state=None, explore=False):
        return np.zeros(len(obs), dtype=np.int64), {}, state


def steps_since_reset():
    """`Labels` with a memory, as a recurrent expert's: each env's label is the steps it has seen since its last
    episode ended (0 at every episode's first step, where its state starts afresh)."""
    seen = None

    def labels(obs, done):
        nonlocal seen
        if seen is None:
            seen = np.zeros(len(done), np.int64)
        out = seen.copy()
        seen += 1
        seen[done] = 0
        return out

    return labels


def test_each_group_of_recorded_episodes_is_labelled_from_no_state():
    """More episodes than envs are recorded in groups; envs whose episode ended early step on uncounted meanwhile.
    A recurrent labeller (DAgger's expert) starts each group from no state, so every episode's first label is a
    fresh state's, not one carried from the steps before the group's reset."""
    recorder = EpisodeRecorder(labeller=steps_since_reset)
    record_episodes(PushesLeft(), "CartPole-v1", ENVS + 4, 0, recorder)
    _, act, _, starts = recorder.arrays()
    assert starts.sum() == ENVS + 4
    assert (act[starts] == 0).all(), act[starts]
    assert act.max() > 5  # the labels did count the steps within episodes


def test_the_bound_is_the_envs_own_time_limit_where_it_is_shorter():
    assert episode_bound(500, EVAL_MAX_STEPS) == 500
    assert episode_bound(None, 123) == 123
    assert episode_bound(500, 20) == 20  # --eval-max-steps 20 on CartPole-v1 cuts its episodes at 20
    envs = make_vector_env("CartPole-v1", 2, seed=0, mode="sync", training=False)
    try:
        result = evaluate(Balances(), envs, 2, seed=0, max_steps=episode_bound(500, 20))
    finally:
        envs.close()
    assert result.cut == 2 and np.all(result.returns == 20)
    envs = make_vector_env("CliffWalking-v1", 2, seed=0, mode="sync", training=False, max_episode_steps=20)
    try:
        result = evaluate(Loops(), envs, 2, seed=0, max_steps=episode_bound(20, 1_000))
    finally:
        envs.close()
    assert result.cut == 0  # the env's TimeLimit truncated them: the env's own end, not a cut
    assert np.all(result.returns <= -20)

"""Continuous and recurrent actor-critics: the Gaussian head against torch.distributions.Normal, action
rescaling to a Box's bounds, the NumPy acting path, which algorithms accept which spaces, and the LSTM
state that training replays from a segment's stored initial state and episode starts."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Normal

from rlfleet.algos import resolve
from rlfleet.algos.acting import policy_step
from rlfleet.algos.spaces import ActionBounds, UnsupportedSpaceError
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs import make_vector_env
from rlfleet.nets.fast import gaussian_log_prob, sample_gaussian
from rlfleet.nets.heads import MIN_VARIANCE, DiagGaussian, GaussianHead
from rlfleet.nets.models import ActorCritic
from rlfleet.run.collector import Collector
from rlfleet.run.evaluate import evaluate

OBS = gym.spaces.Box(-1, 1, (3,), np.float32)
PENDULUM_ACTIONS = gym.spaces.Box(-2, 2, (1,), np.float32)
TWO_D = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 0.5], np.float32))


def make_algo(name, action_space, obs_space=OBS, **overrides):
    cls, config_cls, _, variant = resolve(name)
    return cls(config_cls(**{**variant, **overrides}), obs_space, action_space, seed=0)


# ----------------------------------------------------------------------------------------------- Gaussian
def test_diag_gaussian_matches_torch_normal():
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(5, 3, generator=gen)
    log_std = torch.randn(5, 3, generator=gen) * 0.5
    actions = torch.randn(5, 3, generator=gen) * 2
    dist = DiagGaussian(mean, log_std)
    normal = Normal(mean, log_std.exp())
    torch.testing.assert_close(dist.log_prob(actions), normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.entropy(), normal.entropy().sum(-1))
    assert dist.log_prob(actions).shape == (5,) and dist.entropy().shape == (5,)
    # the A3C paper's entropy: −½(log(2πσ²) + 1) is its cost, per dim
    torch.testing.assert_close(dist.entropy(), (0.5 * (torch.log(2 * math.pi * log_std.exp() ** 2) + 1)).sum(-1))
    # a state-independent log σ (one vector) broadcasts over the batch
    shared = DiagGaussian(mean, torch.zeros(3))
    torch.testing.assert_close(shared.entropy(), torch.full((5,), 3 * (0.5 + 0.5 * math.log(2 * math.pi))))


def test_numpy_gaussian_sampling_matches_torch_log_prob_and_moments():
    rng = np.random.default_rng(0)
    mean = np.array([[0.5, -1.0]] * 100_000, np.float32)
    log_std = np.log(np.array([[0.2, 1.5]] * 100_000, np.float32))
    actions, logp = sample_gaussian(mean, log_std, rng)
    assert actions.dtype == np.float32 and actions.shape == (100_000, 2) and logp.shape == (100_000,)
    np.testing.assert_allclose(actions.mean(0), [0.5, -1.0], atol=0.02)
    np.testing.assert_allclose(actions.std(0), [0.2, 1.5], rtol=0.02)
    reference = Normal(torch.as_tensor(mean), torch.as_tensor(log_std).exp()).log_prob(torch.as_tensor(actions))
    np.testing.assert_allclose(logp, reference.sum(-1).numpy(), atol=1e-4)
    np.testing.assert_allclose(gaussian_log_prob(actions, mean, log_std), logp, atol=1e-4)


@pytest.mark.parametrize("kind", ["state_independent", "state_dependent", "softplus"])
def test_gaussian_head_kinds_and_initial_std(kind):
    torch.manual_seed(0)
    head = GaussianHead(4, 2, kind, init_std=0.5)
    dist = head(torch.randn(6, 4))
    assert dist.mean.shape == (6, 2) and dist.log_prob(torch.zeros(6, 2)).shape == (6,)
    torch.testing.assert_close(dist.std, torch.full((6, 2), 0.5), atol=0.02, rtol=0)


def test_softplus_head_variance_is_positive_even_for_extreme_features():
    torch.manual_seed(0)
    head = GaussianHead(4, 2, "softplus")
    with torch.no_grad():
        head.std_linear.weight.fill_(1.0)
    features = torch.cat([torch.full((1, 4), -1e4), torch.full((1, 4), 1e4), torch.randn(8, 4)])
    dist = head(features)
    variance = dist.std**2
    assert torch.all(variance > 0) and torch.all(torch.isfinite(dist.log_prob(torch.zeros(10, 2))))
    torch.testing.assert_close(variance[0], torch.full((2,), MIN_VARIANCE))  # softplus(-4e4) underflows to 0
    # σ² = softplus(linear(features)) (+ the floor)
    expected = torch.nn.functional.softplus(head.std_linear(features[2:])) + MIN_VARIANCE
    torch.testing.assert_close(variance[2:], expected)


def test_unknown_log_std_kind_is_rejected():
    with pytest.raises(ValueError, match="softplus"):
        GaussianHead(4, 2, "learned")


# ----------------------------------------------------------------------------------------------- rescaling
def test_action_bounds_rescale_and_clip():
    bounds = ActionBounds(TWO_D)  # dim 0: [-1, 3], dim 1: [0, 0.5]
    raw = np.array([[-1, -1], [0, 0], [1, 1], [5, -7]], np.float32)
    np.testing.assert_allclose(bounds(raw), [[-1, 0], [1, 0.25], [3, 0.5], [3, 0]])
    assert bounds(raw).dtype == np.float32
    unbounded = ActionBounds(gym.spaces.Box(np.array([-np.inf, 0], np.float32), np.array([np.inf, np.inf], np.float32)))
    np.testing.assert_allclose(unbounded(np.array([[7.0, -3.0]], np.float32)), [[7.0, 0.0]])  # no rescale


@pytest.mark.parametrize("name", ["pg", "a2c", "ppo"])
def test_box_actions_reach_the_env_rescaled_and_the_raw_sample_is_kept(name):
    algo = make_algo(name, TWO_D)
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 3)).astype(np.float32)
    actions, extras, state = algo.act(obs)
    assert state is None and actions.dtype == np.float32 and actions.shape == (64, 2)
    assert np.all(actions >= TWO_D.low) and np.all(actions <= TWO_D.high)
    raw = extras["raw_act"]
    assert raw.dtype == np.float32 and raw.shape == (64, 2)
    np.testing.assert_allclose(actions, np.clip(raw * [2.0, 0.25] + [1.0, 0.25], TWO_D.low, TWO_D.high), atol=1e-6)
    assert np.any(np.abs(raw) > 1)  # unclipped: σ starts at half the range
    # greedy: the mean, which starts near the middle of the range
    greedy, _, _ = algo.act(obs, explore=False)
    np.testing.assert_allclose(greedy, np.tile([1.0, 0.25], (64, 1)), atol=0.1)


@pytest.mark.parametrize("kind", ["state_independent", "state_dependent", "softplus"])
def test_numpy_acting_path_matches_torch_for_gaussian_policies(kind):
    model = ActorCritic(OBS, TWO_D, log_std=kind, hidden=(16,), activation="relu")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # away from the near-constant initial σ
    obs = np.random.default_rng(1).uniform(-1, 1, (7, 3)).astype(np.float32)
    (mean, log_std), value = model.numpy_forward(obs)
    dist, value_t = model(torch.as_tensor(obs))
    np.testing.assert_allclose(mean, dist.mean.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(log_std, dist.log_std.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(value, value_t.detach().numpy(), atol=1e-5)
    # the sampled actions' log-probabilities are the torch policy's
    actions, logp, _, _ = policy_step(model, obs, True, np.random.default_rng(2))
    np.testing.assert_allclose(logp, dist.log_prob(torch.as_tensor(actions)).detach().numpy(), atol=1e-4)


# ----------------------------------------------------------------------------------------------- spaces
@pytest.mark.parametrize("name", ["pg", "a2c", "ppo"])
@pytest.mark.parametrize("space", [PENDULUM_ACTIONS, gym.spaces.Discrete(3)], ids=["box", "discrete"])
def test_policy_gradient_family_accepts_box_and_discrete(name, space):
    algo = make_algo(name, space)
    actions, _, _ = algo.act(np.zeros((4, 3), np.float32))
    assert len(actions) == 4


@pytest.mark.parametrize("name", ["dqn", "nstep_q", "onestep_q", "sarsa"])
def test_discrete_only_algorithms_reject_box_clearly(name):
    with pytest.raises(UnsupportedSpaceError, match=r"discrete.*Box"):
        make_algo(name, PENDULUM_ACTIONS)


@pytest.mark.parametrize("name", ["pg", "a2c", "ppo"])
def test_unsupported_action_spaces_are_rejected(name):
    with pytest.raises(UnsupportedSpaceError, match="takes 1-D Box actions"):
        make_algo(name, gym.spaces.Box(-1, 1, (2, 2), np.float32))
    with pytest.raises(UnsupportedSpaceError, match="takes 1-D MultiDiscrete actions"):
        make_algo(name, gym.spaces.MultiDiscrete([[2, 3], [2, 3]]))
    with pytest.raises(UnsupportedSpaceError, match=r"Discrete, MultiDiscrete, MultiBinary or 1-D Box.*Text"):
        make_algo(name, gym.spaces.Text(5))


def test_box_rollouts_store_float32_actions_and_a2c_learns_from_them():
    envs = make_vector_env("Pendulum-v1", 3, seed=0, mode="sync")
    algo = make_algo("a2c", envs.single_action_space, envs.single_observation_space, log_std="softplus")
    segment = Collector(envs, algo, seed=0).collect_rollout(RolloutStorage(5, 3))
    d = segment.data
    assert d.act.dtype == np.float32 and d.act.shape == (5, 3, 1)
    assert d.raw_act.dtype == np.float32 and d.raw_act.shape == (5, 3, 1)
    assert np.all(np.abs(d.act) <= 2)
    batch = algo.process(segment)
    assert batch.act.shape == (15, 1)
    np.testing.assert_array_equal(batch.act, d.raw_act.reshape(15, 1))  # the log-prob uses the raw sample
    before = [p.detach().clone() for p in algo.params]
    metrics = algo.update(segment)
    assert np.isfinite(metrics["policy_loss"]) and any(
        not torch.equal(a, b) for a, b in zip(before, algo.params, strict=True)
    )
    envs.close()


# ----------------------------------------------------------------------------------------------- LSTM
class RecordingPolicy:
    """Wraps an algorithm and records what the collector asks of it."""

    def __init__(self, algo):
        self.algo, self.resets, self.states = algo, [], []

    def act(self, obs, state=None, explore=True):
        self.states.append(state)
        return self.algo.act(obs, state, explore)

    def reset_state(self, state, done):
        self.resets.append(done.copy())
        return self.algo.reset_state(state, done)

    def value(self, obs, state=None):
        return self.algo.value(obs, state)


@pytest.mark.parametrize("name", ["a2c", "ppo"])
def test_lstm_replay_gives_the_values_and_policy_acting_saw(name):
    """Acting carries the LSTM state step by step (reset where episodes end); training replays each env's
    segment from the stored initial state with the stored starts and must see the very same values."""
    torch.manual_seed(0)
    envs = make_vector_env("rlfleet/CartPoleNoVel-v1", 4, seed=0, mode="sync")
    algo = make_algo(name, envs.single_action_space, envs.single_observation_space, lstm=16, hidden=(8,))
    policy = RecordingPolicy(algo)
    collector = Collector(envs, policy, seed=0)
    storage = RolloutStorage(30, 4)  # random CartPole episodes last ~10-40 steps: several end per segment
    for k in range(3):
        segment = collector.collect_rollout(storage)
        d = segment.data
        assert d.starts.shape == (30, 4) and d.starts.dtype == bool
        if k == 0:
            assert segment.initial_state is None and d.starts[0].all()
        else:
            assert segment.initial_state is not None and torch.any(segment.initial_state[0] != 0)
        done = d.terminated | d.truncated
        np.testing.assert_array_equal(d.starts[1:], done[:-1])  # a step starts an episode after one ended
        assert done[:-1].any()
        batch = algo.process(segment).to_torch()
        assert batch.obs.shape == (4, 30, 2) and batch.h0.shape == (4, 16)  # N sequences of T steps
        with torch.no_grad():
            dist, value, _ = algo.model.unroll(batch.obs.transpose(0, 1), (batch.h0, batch.c0), batch.starts.T)
        np.testing.assert_allclose(value.numpy(), d.value.reshape(-1), atol=1e-5)
        if name == "ppo":  # the log-probabilities of the actions taken, too
            logp = dist.log_prob(torch.as_tensor(d.act.reshape(-1)))
            np.testing.assert_allclose(logp.numpy(), d.logp.reshape(-1), atol=1e-5)
        # replaying without the resets gives other values: the starts matter
        with torch.no_grad():
            _, no_reset, _ = algo.model.unroll(batch.obs.transpose(0, 1), (batch.h0, batch.c0))
        assert not np.allclose(no_reset.numpy(), d.value.reshape(-1), atol=1e-3)
        loss, _ = algo.loss(algo.process(segment))
        assert torch.isfinite(loss)
    # every reset zeroed exactly the envs that had just finished
    assert len(policy.resets) > 0 and all(r.any() for r in policy.resets)
    for state in policy.states[1:]:
        assert state[0].shape == (4, 16)
    envs.close()


def test_reset_state_zeroes_only_finished_envs_and_leaves_the_input_alone():
    algo = make_algo("a2c", gym.spaces.Discrete(2), lstm=8)
    _, _, state = algo.act(np.ones((3, 3), np.float32))
    h, c = state
    reset = algo.reset_state(state, np.array([False, True, False]))
    assert torch.all(reset[0][1] == 0) and torch.all(reset[1][1] == 0)
    torch.testing.assert_close(reset[0][[0, 2]], h[[0, 2]])
    assert torch.any(h[1] != 0)  # not modified in place: a stored initial state must stay what it was


def test_recurrent_truncation_bootstrap_uses_the_state_of_the_finished_episode():
    def short():
        return gym.wrappers.TimeLimit(gym.make("rlfleet/CartPoleNoVel-v1").unwrapped, max_episode_steps=3)

    class Probe(RecordingPolicy):
        def value(self, obs, state=None):
            self.states.append(("value", state))
            return self.algo.value(obs, state)

    envs = make_vector_env(short, 2, seed=0, mode="sync")
    algo = make_algo("a2c", envs.single_action_space, envs.single_observation_space, lstm=8)
    probe = Probe(algo)
    segment = Collector(envs, probe, seed=0).collect_rollout(RolloutStorage(4, 2))
    d = segment.data
    assert d.truncated[2].all()
    # the value of the final observation comes from the state that went with it (after 3 steps), not a
    # reset one
    value_states = [x[1] for x in probe.states if isinstance(x, tuple) and x[0] == "value"]
    assert torch.any(value_states[0][0] != 0)
    with torch.no_grad():
        batch = algo.process(segment).to_torch()
        _, _, state = algo.model.unroll(batch.obs.transpose(0, 1)[:3], (batch.h0, batch.c0), batch.starts.T[:3])
    np.testing.assert_allclose(value_states[0][0].numpy(), state[0].numpy(), atol=1e-6)
    envs.close()


def test_evaluate_resets_the_recurrent_state_when_an_episode_ends():
    class CountingResets:
        def __init__(self, algo):
            self.algo, self.calls = algo, 0

        def act(self, obs, state=None, explore=True):
            return self.algo.act(obs, state, explore)

        def reset_state(self, state, done):
            self.calls += 1
            assert done.any()
            return self.algo.reset_state(state, done)

    envs = make_vector_env("rlfleet/CartPoleNoVel-v1", 3, seed=0, mode="sync", training=False)
    policy = CountingResets(make_algo("a2c", envs.single_action_space, envs.single_observation_space, lstm=8))
    returns = evaluate(policy, envs, 3, seed=1).returns
    assert returns.shape == (3,) and np.all(returns > 0)
    assert policy.calls >= 1
    envs.close()

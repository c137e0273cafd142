"""Exploration for continuous control against values computed by hand: Ornstein–Uhlenbeck action noise (its
recurrence, its reset where episodes start, its checkpoint) and gSDE's state-dependent noise (a deterministic
function of the state for a fixed noise matrix, new when resampled, its log-probability and entropy, the
squashed version, greedy actions, its checkpoint)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos import resolve
from rlfleet.algos.noise import ActionNoise, SDEMatrices
from rlfleet.envs import make_vector_env
from rlfleet.fields import ConfigError
from rlfleet.nets.continuous import SquashedGaussianActor, squashed_gaussian_log_prob
from rlfleet.nets.heads import SDE_EPSILON, SDEGaussianHead, StateDependentNoise
from rlfleet.nets.models import ActorCritic
from rlfleet.run.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.run.collector import Collector
from rlfleet.run.config import build_algo_config

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))


def make(name: str, seed: int = 0, obs_space=OBS, action_space=ACT, **overrides):
    algo_cls, config_cls, _, variant = resolve(name)
    torch.manual_seed(seed)
    return algo_cls(config_cls(**{**variant, **overrides}), obs_space, action_space, seed=seed)


def round_trip(algo, tmp_path, name: str, **overrides):
    """A fresh algorithm loaded from `algo`'s state dict written to and read from a checkpoint file."""
    save_checkpoint(tmp_path / "c.pt", {"run_config": {}, "algo_config": {}, "algo": algo.state_dict()})
    fresh = make(name, seed=99, **overrides)
    fresh.load_state_dict(load_checkpoint(tmp_path / "c.pt")["algo"])
    return fresh


# ----------------------------------------------------------------------------------------------- OU noise
def test_ou_noise_follows_its_recurrence_by_hand():
    sigma, theta, dt = 0.5, 0.15, 0.01
    noise = ActionNoise("ou", sigma, theta, dt)
    rng, reference = np.random.default_rng(3), np.random.default_rng(3)
    x = np.zeros((2, 3))
    for _ in range(50):
        out = noise(2, 3, rng)
        eps = reference.standard_normal((2, 3), dtype=np.float32).astype(np.float64)
        x = x + theta * (0.0 - x) * dt + sigma * math.sqrt(dt) * eps
        np.testing.assert_allclose(out, x, rtol=1e-5, atol=1e-6)
    # consecutive values are strongly correlated (independent Gaussian noise would not be)
    assert np.all(np.abs(x) > 0) and noise.x.dtype == np.float32


def test_ou_noise_resets_only_the_envs_whose_episode_started():
    noise = ActionNoise("ou", 0.5)
    rng = np.random.default_rng(0)
    for _ in range(10):
        noise(3, 2, rng)
    before = noise.x.copy()
    noise.reset(np.array([False, True, False]))
    np.testing.assert_array_equal(noise.x[[0, 2]], before[[0, 2]])
    np.testing.assert_array_equal(noise.x[1], 0.0)


def test_gaussian_noise_is_independent_sigma_eps():
    noise = ActionNoise("gaussian", 0.2)
    out = noise(4, 2, np.random.default_rng(1))
    np.testing.assert_allclose(out, 0.2 * np.random.default_rng(1).standard_normal((4, 2), dtype=np.float32))
    assert noise.x is None


def test_unknown_action_noise_is_one_clear_line():
    with pytest.raises(ConfigError) as error:
        build_algo_config("td3", None, {"action_noise": "pink"})
    assert str(error.value) == "td3 config action_noise='pink' must be one of: gaussian, ou"


@pytest.mark.parametrize("name", ["ddpg", "td3"])
def test_deterministic_actors_add_ou_noise_and_act_greedily_without_it(name):
    algo = make(name, action_noise="ou", exploration_noise=0.5, random_steps=0)
    obs = np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)
    reference = np.random.default_rng(0)  # the algorithm's rng, seed 0
    x = np.zeros((2, 2), np.float32)
    for _ in range(5):
        _, extras, _ = algo.act(obs)
        x = x - 0.15 * x * 0.01 + 0.5 * 0.1 * reference.standard_normal((2, 2), dtype=np.float32)
        expected = np.clip(algo.actor.numpy_act(obs) + x, -1, 1)
        np.testing.assert_allclose(algo.bounds.normalize(algo.bounds(expected)), expected, atol=1e-5)
        np.testing.assert_allclose(extras["raw_act"], expected, atol=1e-5)
    state = algo.noise.x.copy()
    greedy, _, _ = algo.act(obs, explore=False)  # evaluation: μ(s), the noise neither used nor advanced
    np.testing.assert_allclose(greedy, algo.bounds(algo.actor.numpy_act(obs)), atol=1e-6)
    np.testing.assert_array_equal(algo.noise.x, state)


def test_collector_resets_the_noise_of_envs_whose_episode_ended():
    # Pendulum-v1 episodes end after 200 steps; the two envs end together: their noise starts again from 0
    envs = make_vector_env("Pendulum-v1", 2, seed=0)
    algo = make("td3", obs_space=envs.single_observation_space, action_space=envs.single_action_space,
                action_noise="ou", exploration_noise=0.5, random_steps=0)  # fmt: skip
    collector = Collector(envs, algo, seed=0)
    for _ in range(199):
        collector.step()
    assert np.all(np.abs(algo.noise.x) > 0)
    step = collector.step()
    assert step.truncated.all()
    np.testing.assert_array_equal(algo.noise.x, 0.0)
    collector.step()  # the next episode's first step: one increment from 0, σ √dt ε
    assert np.all(np.abs(algo.noise.x) < 0.5 * 0.1 * 5)
    envs.close()


@pytest.mark.parametrize("name", ["ddpg", "td3"])
def test_ou_noise_survives_a_checkpoint_round_trip_exactly(name, tmp_path):
    opts = dict(action_noise="ou", exploration_noise=0.5, random_steps=0)
    algo = make(name, **opts)
    obs = np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)
    for _ in range(20):
        algo.act(obs)
    fresh = round_trip(algo, tmp_path, name, **opts)
    np.testing.assert_array_equal(fresh.noise.x, algo.noise.x)
    for _ in range(5):
        np.testing.assert_array_equal(fresh.act(obs)[0], algo.act(obs)[0])


# ----------------------------------------------------------------------------------------------- gSDE
def hand_log_std(features: np.ndarray, log_sigma: np.ndarray) -> np.ndarray:
    """log sqrt(Σ_j z_j² σ_ji² + ε) with explicit sums, float64."""
    batch, (n_features, act_dim) = len(features), log_sigma.shape
    out = np.zeros((batch, act_dim))
    for b in range(batch):
        for i in range(act_dim):
            variance = sum(features[b, j] ** 2 * math.exp(2 * log_sigma[j, i]) for j in range(n_features))
            out[b, i] = 0.5 * math.log(variance + SDE_EPSILON)
    return out


def randomised_head(in_dim=4, act_dim=2, seed=0) -> SDEGaussianHead:
    torch.manual_seed(seed)
    head = SDEGaussianHead(in_dim, act_dim, init_std=0.3)
    with torch.no_grad():
        head.noise.log_std.add_(torch.randn_like(head.noise.log_std) * 0.5)
        head.mean.weight.add_(torch.randn_like(head.mean.weight))
    return head


def test_sde_log_prob_and_entropy_match_the_gaussian_computed_by_hand():
    head = randomised_head()
    features = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    actions = torch.randn(5, 2, generator=torch.Generator().manual_seed(2))
    dist = head(features)
    log_std = hand_log_std(features.numpy().astype(np.float64), head.noise.log_std.detach().numpy())
    np.testing.assert_allclose(dist.log_std.detach().numpy(), log_std, rtol=1e-5)
    mean = features.numpy() @ head.mean.weight.detach().numpy().T + head.mean.bias.detach().numpy()
    std = np.exp(log_std)
    logp = (-0.5 * ((actions.numpy() - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    np.testing.assert_allclose(dist.log_prob(actions).detach().numpy(), logp, rtol=1e-5)
    entropy = (log_std + 0.5 + 0.5 * math.log(2 * math.pi)).sum(-1)
    np.testing.assert_allclose(dist.entropy().detach().numpy(), entropy, rtol=1e-5)
    # the std's gradient reaches σ, not the features (detached, as in SB3's on-policy agents)
    features.requires_grad_(True)
    head(features).log_std.sum().backward()
    assert features.grad is None or torch.all(features.grad == 0)
    assert head.noise.log_std.grad is not None and torch.any(head.noise.log_std.grad != 0)


def test_sde_noise_is_a_deterministic_function_of_the_state_until_resampled():
    noise = StateDependentNoise(4, 2, init_std=0.5)
    rng = np.random.default_rng(0)
    draws = noise.sample_draws(3, rng)
    z = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    eps = noise.numpy_noise(z, draws)
    np.testing.assert_array_equal(noise.numpy_noise(z.copy(), draws), eps)  # same state, same matrix: same noise
    theta = 0.5 * draws.astype(np.float64)  # θ = σ ⊙ ξ
    np.testing.assert_allclose(eps, np.einsum("nf,nfa->na", z, theta), rtol=1e-5)
    np.testing.assert_allclose(noise.numpy_noise(2 * z, draws), 2 * eps, rtol=1e-5)  # linear in the features
    assert not np.allclose(noise.numpy_noise(z, noise.sample_draws(3, rng)), eps)  # resampled: other noise


def test_sde_matrices_are_resampled_on_schedule():
    noise = StateDependentNoise(4, 1)
    every4 = SDEMatrices(sample_freq=4, period=16)
    per_period = SDEMatrices(sample_freq=-1, period=16)
    rng = np.random.default_rng(0)
    seen4 = [every4.next(noise, 2, rng).copy() for _ in range(32)]
    seen = [per_period.next(noise, 2, rng).copy() for _ in range(32)]
    new4 = [t for t in range(1, 32) if not np.array_equal(seen4[t], seen4[t - 1])]
    new = [t for t in range(1, 32) if not np.array_equal(seen[t], seen[t - 1])]
    assert new4 == [4, 8, 12, 16, 20, 24, 28] and new == [16]
    every5 = SDEMatrices(sample_freq=5, period=None)  # SAC with sde_sample_freq: whatever train_freq is
    seen5 = [every5.next(noise, 2, rng).copy() for _ in range(12)]
    assert [t for t in range(1, 12) if not np.array_equal(seen5[t], seen5[t - 1])] == [5, 10]


@pytest.mark.parametrize("name", ["ppo", "a2c"])
def test_sde_policy_acts_the_same_in_a_state_until_resampled_and_greedy_is_the_mean(name):
    algo = make(name, sde=True, sde_sample_freq=4, rollout_len=16, init_std=0.5, n_envs=2)
    obs = np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)
    raws = [algo.act(obs)[1]["raw_act"] for _ in range(8)]
    for t in (1, 2, 3, 5, 6, 7):
        np.testing.assert_array_equal(raws[t], raws[t - 1])
    assert not np.allclose(raws[4], raws[3])  # a new matrix at step 4
    (mean, _, _), _ = algo.model.numpy_forward(obs)
    assert not np.allclose(raws[0], mean)
    steps = algo.sde_matrices.steps
    greedy, extras, _ = algo.act(obs, explore=False)
    np.testing.assert_allclose(extras["raw_act"], mean, atol=1e-6)
    assert algo.sde_matrices.steps == steps  # evaluation neither uses nor advances the noise


def test_sde_numpy_acting_matches_torch_and_logp_is_the_policys():
    model = ActorCritic(OBS, ACT, hidden=(16,), activation="tanh", sde=True, init_std=0.4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    obs = np.random.default_rng(1).uniform(-1, 1, (7, 3)).astype(np.float32)
    (mean, log_std, features), value = model.numpy_forward(obs)
    dist, value_t = model(torch.as_tensor(obs))
    np.testing.assert_allclose(mean, dist.mean.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(log_std, dist.log_std.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(features, dist.features.numpy(), atol=1e-5)
    np.testing.assert_allclose(value, value_t.detach().numpy(), atol=1e-5)
    from rlfleet.algos.acting import policy_step

    draws = model.policy.noise.sample_draws(7, np.random.default_rng(2))
    actions, logp, _, _ = policy_step(model, obs, True, np.random.default_rng(3), sde_draws=draws)
    np.testing.assert_allclose(actions, mean + model.policy.noise.numpy_noise(features, draws), atol=1e-6)
    np.testing.assert_allclose(logp, dist.log_prob(torch.as_tensor(actions)).detach().numpy(), atol=1e-4)


def test_squashed_sde_actor_log_prob_by_hand_and_greedy_tanh_of_the_clipped_mean():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, 2, (8,), sde=True, sde_init_std=0.2)
    with torch.no_grad():
        actor.head.weight.mul_(20.0)  # some means beyond the ±2 clip
    obs = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (6, 3)).astype(np.float32))
    mean, log_std = actor(obs)
    features = actor.body(obs).detach().numpy().astype(np.float64)
    np.testing.assert_allclose(
        log_std.detach().numpy(), hand_log_std(features, actor.noise.log_std.detach().numpy()), rtol=1e-5
    )
    raw_mean = features @ actor.head.weight.detach().numpy().T.astype(np.float64) + actor.head.bias.detach().numpy()
    assert np.any(np.abs(raw_mean) > 2)
    np.testing.assert_allclose(mean.detach().numpy(), np.clip(raw_mean, -2, 2), rtol=1e-5)
    u = mean + log_std.exp() * torch.randn_like(mean)
    std = log_std.exp()
    hand = (
        -0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi) - torch.log(1 - torch.tanh(u) ** 2)
    ).sum(-1)
    torch.testing.assert_close(squashed_gaussian_log_prob(u, mean, log_std), hand, rtol=1e-4, atol=1e-4)
    # the policy loss trains the features too (SB3's SAC: learn_features)
    actor.sample(obs)[1].sum().backward()
    assert actor.body.net[1].weight.grad is not None
    # greedy: tanh of the clipped mean; exploring with fixed draws: tanh(μ + θᵀ z)
    rng = np.random.default_rng(0)
    np.testing.assert_allclose(actor.numpy_act(obs.numpy(), False, rng), np.tanh(np.clip(raw_mean, -2, 2)), atol=1e-5)
    draws = actor.noise.sample_draws(6, rng)
    explored = actor.numpy_act(obs.numpy(), True, rng, draws)
    expected = np.tanh(mean.detach().numpy() + actor.noise.numpy_noise(features.astype(np.float32), draws))
    np.testing.assert_allclose(explored, expected, atol=1e-5)


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("ppo", dict(sde=True, sde_sample_freq=3, rollout_len=8)),
        ("a2c", dict(sde=True, sde_sample_freq=3, rollout_len=8)),
        ("sac", dict(sde=True, sde_sample_freq=3, random_steps=0)),
    ],
)
def test_sde_state_survives_a_checkpoint_round_trip_exactly(name, overrides, tmp_path):
    algo = make(name, **overrides)
    obs = np.random.default_rng(0).uniform(-1, 1, (2, 3)).astype(np.float32)
    for _ in range(5):  # mid-way between two resamples
        algo.act(obs)
    fresh = round_trip(algo, tmp_path, name, **overrides)
    assert fresh.sde_matrices.steps == algo.sde_matrices.steps == 5
    np.testing.assert_array_equal(fresh.sde_matrices.draws, algo.sde_matrices.draws)
    for _ in range(6):  # through the next resample
        np.testing.assert_array_equal(fresh.act(obs)[0], algo.act(obs)[0])


@pytest.mark.parametrize("name", ["ppo", "a2c"])
def test_sde_needs_box_actions(name):
    with pytest.raises(ValueError, match="sde .*needs Box actions"):
        make(name, action_space=gym.spaces.Discrete(3), sde=True)

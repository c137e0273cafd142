"""DDPG, TD3 and SAC pieces against values computed by hand: the squashed-Gaussian log-probability, TD3's
clipped double-Q target with clipped smoothing noise, Polyak updates, delayed policy updates, actions
rescaled into the bounds, the temperature, state_dict round trips and checkpoint -> eval."""

from __future__ import annotations

import copy
import io
import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rlfleet import train
from rlfleet.algos import resolve
from rlfleet.algos.spaces import ActionBounds, UnsupportedSpaceError
from rlfleet.algos.updates import soft_update
from rlfleet.data.batch import Batch
from rlfleet.data.buffer import ReplayBuffer
from rlfleet.nets.continuous import QEnsemble, SquashedGaussianActor, squashed_gaussian_log_prob

CONTINUOUS = ("ddpg", "td3", "sac")
OBS_SPACE = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
ACT_SPACE = gym.spaces.Box(np.array([-2.0, 0.0], dtype=np.float32), np.array([2.0, 10.0], dtype=np.float32))


def make(name: str, seed: int = 0, **overrides):
    algo_cls, config_cls, _, _ = resolve(name)
    torch.manual_seed(seed)
    return algo_cls(config_cls(**overrides), OBS_SPACE, ACT_SPACE, seed=seed)


def filled_buffer(algo, n: int = 256, seed: int = 0) -> ReplayBuffer:
    """Random transitions with env-scaled actions (what the collector stores)."""
    rng = np.random.default_rng(seed)
    buffer = algo.make_buffer(1, 10_000, seed=seed)
    for _ in range(n):
        obs = rng.uniform(-1, 1, (1, 3)).astype(np.float32)
        act = algo.bounds(rng.uniform(-1, 1, (1, 2)).astype(np.float32))
        next_obs = rng.uniform(-1, 1, (1, 3)).astype(np.float32)
        buffer.add(obs, act, rng.standard_normal(1), next_obs, rng.random(1) < 0.1, np.zeros(1, bool))
    return buffer


def params_of(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def changed(before: list[torch.Tensor], module: nn.Module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


# ------------------------------------------------------------------------------------ squashed Gaussian
def test_squashed_log_prob_matches_the_change_of_variables():
    torch.manual_seed(0)
    mean = torch.randn(5, 3, dtype=torch.float64)
    log_std = torch.randn(5, 3, dtype=torch.float64) * 0.5
    u = mean + log_std.exp() * torch.randn(5, 3, dtype=torch.float64)
    direct = torch.distributions.Normal(mean, log_std.exp()).log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)
    assert torch.allclose(squashed_gaussian_log_prob(u, mean, log_std), direct.sum(-1), atol=1e-10)


def test_squashed_log_prob_one_dimension_by_hand():
    # u = 0.5, μ = 0, σ = 1: log N(0.5) = −0.125 − ½ log 2π; log(1 − tanh²(0.5)) = log(sech² 0.5)
    expected = -0.125 - 0.5 * math.log(2 * math.pi) - math.log(1 - math.tanh(0.5) ** 2)
    got = squashed_gaussian_log_prob(torch.tensor([[0.5]]), torch.zeros(1, 1), torch.zeros(1, 1))
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_squashed_log_prob_stays_finite_where_tanh_saturates():
    u = torch.tensor([[30.0], [-30.0]])
    out = squashed_gaussian_log_prob(u, u.clone(), torch.zeros_like(u))
    # −log(1 − tanh²(u)) ≈ 2|u| − 2 log 2 for large |u|
    expected = -0.5 * math.log(2 * math.pi) - (2 * math.log(2) - 60.0)
    assert torch.isfinite(out).all()
    assert out[0].item() == pytest.approx(expected, rel=1e-5) and out[1].item() == pytest.approx(expected, rel=1e-5)


def test_actor_sample_is_tanh_of_the_reparameterised_gaussian():
    actor = SquashedGaussianActor(3, 2, (16, 16))
    obs = torch.randn(7, 3)
    torch.manual_seed(3)
    actions, logp = actor.sample(obs)
    torch.manual_seed(3)
    mean, log_std = actor(obs)
    u = mean + log_std.exp() * torch.randn_like(mean)
    assert torch.allclose(actions, torch.tanh(u))
    assert torch.allclose(logp, squashed_gaussian_log_prob(u, mean, log_std))
    assert (actions.abs() < 1).all() and logp.shape == (7,)


# ------------------------------------------------------------------------------------ critics, targets
def test_q_ensemble_members_are_independent_mlps():
    critic = QEnsemble(3, 2, (8, 8), n=2)
    obs, act = torch.randn(4, 3), torch.randn(4, 2)
    out = critic(obs, act)
    assert out.shape == (2, 4)
    x = torch.cat([obs, act], -1)
    for k in range(2):
        h = x
        for i, (w, b) in enumerate(zip(critic.weights, critic.biases, strict=True)):
            h = h @ w[k] + b[k]
            if i < 2:
                h = torch.relu(h)
        assert torch.allclose(out[k], h.squeeze(-1), atol=1e-6)


def test_detached_critic_passes_gradients_to_actions_only():
    critic = QEnsemble(3, 2, (8, 8), n=2)
    act = torch.randn(4, 2, requires_grad=True)
    critic(torch.randn(4, 3), act, detach=True).sum().backward()
    assert act.grad is not None and act.grad.abs().sum() > 0
    assert all(p.grad is None for p in critic.parameters())


def test_soft_update_is_polyak_averaging():
    target, source = [torch.zeros(3), torch.full((2,), 4.0)], [torch.ones(3), torch.zeros(2)]
    soft_update(target, source, 0.1)
    assert torch.allclose(target[0], torch.full((3,), 0.1)) and torch.allclose(target[1], torch.full((2,), 3.6))
    soft_update(target, source, 0.1)  # 0.9 · 0.1 + 0.1 · 1
    assert torch.allclose(target[0], torch.full((3,), 0.19))


@pytest.mark.parametrize("name", CONTINUOUS)
def test_targets_move_by_tau_toward_the_updated_online_nets(name):
    algo = make(name, tau=0.25, policy_delay=1) if name == "td3" else make(name, tau=0.25)
    batch = filled_buffer(algo).sample(32)
    target = algo.critic_target
    before = params_of(target)
    algo.update(batch)
    for old, new, online in zip(before, target.parameters(), algo.critic.parameters(), strict=True):
        assert torch.allclose(new, 0.75 * old + 0.25 * online.detach(), atol=1e-7)


class ConstantActor(nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.full((len(obs), 2), self.value)


class LinearTwins(nn.Module):
    """Q1 = 3 · mean(a), Q2 = 2 · mean(a) + 0.5: which of the two is smaller depends on the action."""

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        a = act.mean(-1)
        return torch.stack([3 * a, 2 * a + 0.5])


def td3_batch() -> Batch:
    return Batch(
        obs=np.zeros((4, 3), np.float32),
        act=np.zeros((4, 2), np.float32),
        rew=np.array([1.0, -1.0, 0.0, 2.0], np.float32),
        next_obs=np.zeros((4, 3), np.float32),
        terminated=np.array([0.0, 0.0, 1.0, 0.0], np.float32),
        discount=np.full(4, 0.9, np.float32),
    ).to_torch()


def test_td3_target_without_noise_is_the_min_of_the_twins():
    algo = make("td3", target_noise=0.0)
    algo.actor_target, algo.critic_target = ConstantActor(0.9), LinearTwins()
    y = algo.td_target(td3_batch())
    # a' = 0.9: Q1 = 2.7, Q2 = 2.3 -> 2.3; terminated rows do not bootstrap
    assert torch.allclose(y, torch.tensor([1 + 0.9 * 2.3, -1 + 0.9 * 2.3, 0.0, 2 + 0.9 * 2.3]))


def test_td3_smoothing_noise_is_clipped_and_the_action_kept_in_bounds():
    algo = make("td3", target_noise=100.0, target_noise_clip=0.5)  # every noise sample is clipped to ±0.5
    algo.actor_target, algo.critic_target = ConstantActor(0.9), LinearTwins()
    torch.manual_seed(0)
    y = algo.td_target(td3_batch())
    torch.manual_seed(0)
    sign = torch.randn(4, 2).sign()  # the same draws td_target made
    # a' = clip(0.9 ± 0.5, −1, 1) per dim: 1.0 or 0.4; min(3a, 2a + 0.5) of their mean
    a = torch.where(sign > 0, torch.tensor(1.0), torch.tensor(0.4)).mean(-1)
    q = torch.minimum(3 * a, 2 * a + 0.5)
    expected = torch.tensor([1.0, -1.0, 0.0, 2.0]) + 0.9 * torch.tensor([1.0, 1.0, 0.0, 1.0]) * q
    assert torch.allclose(y, expected)


def test_td3_updates_the_policy_every_policy_delay_critic_updates():
    algo = make("td3", policy_delay=2)
    buffer = filled_buffer(algo)
    for i in range(1, 7):
        actor, actor_target, critic = params_of(algo.actor), params_of(algo.actor_target), params_of(algo.critic)
        metrics = algo.update(buffer.sample(32))
        policy_step = i % 2 == 0
        assert changed(critic, algo.critic)
        assert changed(actor, algo.actor) == policy_step
        assert changed(actor_target, algo.actor_target) == policy_step
        assert ("actor_loss" in metrics) == policy_step
    assert algo.updates == 6 and algo.policy_updates == 3


# ------------------------------------------------------------------------------------ SAC temperature
def test_sac_fixed_alpha_stays_and_auto_alpha_targets_minus_action_dims():
    fixed = make("sac", auto_alpha=False, alpha=0.3)
    buffer = filled_buffer(fixed)
    for _ in range(3):
        fixed.update(buffer.sample(32))
    assert fixed.alpha == pytest.approx(0.3)
    assert all(p is not fixed.log_alpha for p in fixed.params)

    auto = make("sac", alpha=0.3)
    assert auto.target_entropy == -2.0
    metrics = auto.update(buffer.sample(32))
    # a fresh policy's entropy is far above −2 nats: α must go down
    assert float(metrics["entropy"]) > auto.target_entropy
    assert auto.alpha < 0.3


def record_steps(algo) -> list[dict[str, list[torch.Tensor | None]]]:
    """Make every optimizer step first record the gradients it applies (per network), then step as usual."""
    steps: list[dict[str, list[torch.Tensor | None]]] = []
    real_step = algo.optimizer.step
    nets = {"actor": list(algo.actor.parameters()), "critic": list(algo.critic.parameters())}
    if hasattr(algo, "log_alpha"):
        nets["log_alpha"] = [algo.log_alpha]

    def step(*args, **kwargs):
        steps.append({k: [None if p.grad is None else p.grad.clone() for p in ps] for k, ps in nets.items()})
        return real_step(*args, **kwargs)

    algo.optimizer.step = step
    return steps


def only(step: dict[str, list[torch.Tensor | None]]) -> set[str]:
    """The networks that have gradients in a recorded step."""
    return {k for k, grads in step.items() if any(g is not None for g in grads)}


def assert_grads_close(got: list[torch.Tensor], want: tuple[torch.Tensor, ...]) -> None:
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-6)


@pytest.mark.parametrize("name", ["ddpg", "td3"])
def test_actor_step_reads_the_critic_after_its_step(name):
    """As in DDPG's and TD3's Algorithm 1: the critic steps first, then the actor ascends the UPDATED critic,
    ∇φ Q_1(s, μφ(s)), with μ at its parameters from before the update."""
    algo = make(name)
    batch = filled_buffer(algo).sample(32)
    if name == "td3":
        algo.update(batch)  # the first of policy_delay = 2 updates moves the critics only
    actor_before, critic_before = copy.deepcopy(algo.actor), copy.deepcopy(algo.critic)
    steps = record_steps(algo)
    metrics = algo.update(batch)
    assert [only(step) for step in steps] == [{"critic"}, {"actor"}]
    assert changed(params_of(critic_before), algo.critic)

    obs = batch.to_torch().obs

    def actor_grads(critic):
        actor = copy.deepcopy(actor_before)
        loss = -critic(obs, actor(obs))[0].mean()
        return loss, torch.autograd.grad(loss, list(actor.parameters()))

    loss, want = actor_grads(algo.critic)  # the critic as the critic step left it
    assert_grads_close(steps[1]["actor"], want)
    assert float(metrics["actor_loss"]) == pytest.approx(loss.item(), abs=1e-6)
    _, stale = actor_grads(critic_before)  # what the actor read before: distinguishable
    assert any(not torch.allclose(g, w, atol=1e-6) for g, w in zip(steps[1]["actor"], stale, strict=True))


@pytest.mark.parametrize("auto_alpha", [True, False])
def test_sac_steps_critics_then_policy_then_temperature(auto_alpha):
    """SAC's Algorithm 1 (Haarnoja et al. 2018): a critic step on J_Q, then a policy step on J_π through the
    UPDATED critics, then (auto_alpha) an α step on J(α) with log π of the UPDATED policy; each step moves
    only its own network, with the gradient of its own loss."""
    algo = make("sac", auto_alpha=auto_alpha)
    batch = filled_buffer(algo).sample(16)
    before = copy.deepcopy(algo)  # networks, targets and α as the update finds them
    actor_before, critic_before = before.actor, before.critic
    alpha = algo.log_alpha.detach().exp()
    steps = record_steps(algo)
    torch.manual_seed(1)
    algo.update(batch)
    assert [only(step) for step in steps] == [{"critic"}, {"actor"}, {"log_alpha"}][: 2 + auto_alpha]

    b = batch.to_torch()
    act = torch.from_numpy(algo.bounds.normalize(batch.act))
    torch.manual_seed(1)  # the same noise draws, in the same order, as the update: a ~ π(·|s), then a' ~ π(·|s')
    actions, logp = actor_before.sample(b.obs)
    next_actions, next_logp = actor_before.sample(b.next_obs)
    y = before.td_target(b, next_actions.detach(), next_logp.detach(), alpha)
    critic_loss = 0.5 * (critic_before(b.obs, act) - y).pow(2).mean(1).sum()
    assert_grads_close(steps[0]["critic"], torch.autograd.grad(critic_loss, list(critic_before.parameters())))

    actor_loss = (alpha * logp - algo.critic(b.obs, actions).min(0).values).mean()
    want = torch.autograd.grad(actor_loss, list(actor_before.parameters()), retain_graph=True)
    assert_grads_close(steps[1]["actor"], want)
    stale_loss = (alpha * logp - critic_before(b.obs, actions).min(0).values).mean()
    stale = torch.autograd.grad(stale_loss, list(actor_before.parameters()))
    assert any(not torch.allclose(g, w, atol=1e-6) for g, w in zip(steps[1]["actor"], stale, strict=True))

    if auto_alpha:  # ∂/∂log α of −log α (log π + H̄) = −(E[log π(a|s)] + H̄), a ~ the updated policy
        with torch.no_grad():
            _, new_logp = algo.actor.sample(b.obs)
        torch.testing.assert_close(steps[2]["log_alpha"][0], -(new_logp.mean() + algo.target_entropy))


def test_sac_builds_the_policys_graph_over_the_sampled_states_only():
    """a' ~ π(·|s') for the target is drawn without a graph, so the policy's backward runs over the B sampled
    states, not over 2B of which the s' half carries no gradient."""
    algo = make("sac", auto_alpha=False)
    calls = []
    algo.actor.register_forward_hook(lambda module, inputs, out: calls.append((len(out[0]), torch.is_grad_enabled())))
    algo.update(filled_buffer(algo).sample(16))
    assert sorted(calls) == [(16, False), (16, True)]


# ------------------------------------------------------------------------------------ acting
def test_action_bounds_normalize_inverts_the_rescaling():
    bounds = ActionBounds(ACT_SPACE)
    raw = np.array([[-1.0, -1.0], [0.0, 0.5], [1.0, 1.0]], np.float32)
    env = bounds(raw)
    assert np.allclose(env, [[-2.0, 0.0], [0.0, 7.5], [2.0, 10.0]])
    assert np.allclose(bounds.normalize(env), raw)


@pytest.mark.parametrize("name", CONTINUOUS)
def test_actions_are_rescaled_into_the_bounds(name):
    algo = make(name, random_steps=0)
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 3)).astype(np.float32)
    for explore in (True, False):
        act, extras, state = algo.act(obs, explore=explore)
        assert act.shape == (64, 2) and act.dtype == np.float32 and state is None
        assert (act >= ACT_SPACE.low).all() and (act <= ACT_SPACE.high).all()
        assert np.allclose(act, algo.bounds(extras["raw_act"]))
    greedy, _, _ = algo.act(obs, explore=False)
    with torch.no_grad():
        t = torch.from_numpy(obs)
        mu = algo.actor(t) if name != "sac" else torch.tanh(algo.actor(t)[0])
    assert np.allclose(greedy, np.array([0.0, 5.0]) + np.array([2.0, 5.0]) * mu.numpy(), atol=1e-5)


@pytest.mark.parametrize("name", CONTINUOUS)
def test_warm_up_actions_are_uniform_over_the_bounds(name):
    algo = make(name, random_steps=1_000)
    algo.schedule(0, 10_000)
    act, _, _ = algo.act(np.zeros((4_000, 3), np.float32))
    low, high = ACT_SPACE.low, ACT_SPACE.high
    assert np.allclose(act.mean(0), (low + high) / 2, atol=0.15)
    assert np.allclose(act.min(0), low, atol=0.05) and np.allclose(act.max(0), high, atol=0.05)
    algo.schedule(1_000, 10_000)  # after the warm-up: the policy (with noise)
    greedy, _, _ = algo.act(np.zeros((2, 3), np.float32), explore=False)
    assert np.allclose(greedy[0], greedy[1])


@pytest.mark.parametrize("name", CONTINUOUS)
def test_discrete_actions_are_rejected(name):
    algo_cls, config_cls, _, _ = resolve(name)
    with pytest.raises(UnsupportedSpaceError, match=f"'{name}'.*continuous.*Discrete"):
        algo_cls(config_cls(), OBS_SPACE, gym.spaces.Discrete(3))


# ------------------------------------------------------------------------------------ state
@pytest.mark.parametrize("name", CONTINUOUS)
def test_state_dict_round_trip_continues_identically(name):
    algo = make(name, seed=1)
    buffer = filled_buffer(algo)
    for _ in range(5):
        algo.update(buffer.sample(32))
    blob = io.BytesIO()
    torch.save(algo.state_dict(), blob)
    blob.seek(0)
    copy = make(name, seed=7)
    copy.load_state_dict(torch.load(blob, weights_only=True))
    batch = buffer.sample(32)
    obs = np.random.default_rng(2).uniform(-1, 1, (5, 3)).astype(np.float32)
    for a in (algo, copy):
        a.schedule(5_000, 10_000)
    assert np.array_equal(algo.act(obs)[0], copy.act(obs)[0])  # the exploration rng came along too
    torch.manual_seed(3)
    m1 = algo.update(batch)
    torch.manual_seed(3)
    m2 = copy.update(batch)
    assert all(torch.equal(torch.as_tensor(m1[k]), torch.as_tensor(m2[k])) for k in m1)
    for mine, theirs in zip(algo.state_dict()["critic"].values(), copy.state_dict()["critic"].values(), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("name", CONTINUOUS)
def test_checkpoint_then_eval(name, tmp_path, capsys):
    from rlfleet.cli import main

    overrides = {"learning_starts": 100, "random_steps": 100}
    result = train(
        name, "Pendulum-v1", steps=300, eval_episodes=2, logdir=str(tmp_path), progress=False, overrides=overrides
    )
    assert result["stop_return"] == -250.0  # Pendulum-v1's solved return without --stop-return
    assert result["updates"] > 0 and result["env_steps"] == 300
    capsys.readouterr()
    assert main(["eval", str(result.run_dir), "--episodes", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["algo"] == name and out["env"] == "Pendulum-v1" and len(out["returns"]) == 2
    assert all(-2_000 < r <= 0 for r in out["returns"])  # 200 steps of rewards in [−16.3, 0]


# ------------------------------------------------------------------------------ priorities (prioritized replay)
def critic_td_by_hand(algo, batch: Batch) -> torch.Tensor:
    """`[K, B]` TD errors Q_k(s, a) − y of the K critics, with y = r + γ^n (1 − terminated) min_k Q'_k(s', μ'(s'))."""
    b = batch.to_torch()
    act = torch.from_numpy(algo.bounds.normalize(batch.act))
    with torch.no_grad():
        next_q = algo.critic_target(b.next_obs, algo.actor_target(b.next_obs)).min(0).values
        y = b.rew + b.discount * (1 - b.terminated) * next_q
        return algo.critic(b.obs, act) - y


@pytest.mark.parametrize("name", ["ddpg", "td3"])
def test_priorities_are_the_critics_absolute_td_errors_and_update_writes_the_same(name):
    algo = make(name, target_noise=0.0) if name == "td3" else make(name)
    with torch.no_grad():
        for p in algo.critic_target.parameters():
            p.mul_(-1.5)  # the target differs from the online critic: the bootstrap is visible
    batch = filled_buffer(algo).sample(32)
    want = critic_td_by_hand(algo, batch).abs().mean(0).numpy()  # td3: the mean over its twins
    np.testing.assert_allclose(algo.priorities(batch), want, rtol=1e-5, atol=1e-6)
    out = algo.update(batch)  # the priorities of its critic step: the networks before it
    np.testing.assert_allclose(out["priorities"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["ddpg", "td3"])
def test_importance_weights_scale_each_transitions_critic_loss(name):
    algo = make(name, target_noise=0.0) if name == "td3" else make(name)
    batch = filled_buffer(algo).sample(16)
    weight = np.random.default_rng(1).uniform(0, 1, 16).astype(np.float32)
    batch["weight"] = weight
    td = critic_td_by_hand(algo, batch)
    want = (torch.from_numpy(weight) * td.pow(2)).mean(1).sum()  # per critic, summed over td3's twins
    assert float(algo.update(batch)["critic_loss"]) == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("name", ["ddpg", "td3"])
def test_prioritized_replay_is_an_option_and_runs(name, tmp_path):
    from rlfleet.data.buffer import PrioritizedReplayBuffer

    assert type(make(name).make_buffer(1, 1_000)) is ReplayBuffer  # off by default
    algo = make(name, prioritized=True, target_noise=0.0) if name == "td3" else make(name, prioritized=True)
    buffer = filled_buffer(algo)
    assert isinstance(buffer, PrioritizedReplayBuffer)
    batch = buffer.sample(32)
    td = algo.update(batch)["priorities"]
    buffer.update_priorities(batch.index, td)
    np.testing.assert_allclose(buffer._sum_tree[batch.index], (td + buffer.eps) ** buffer.alpha, rtol=1e-6)
    overrides = {"prioritized": True, "learning_starts": 100, "random_steps": 100}
    result = train(name, "Pendulum-v1", steps=400, logdir=str(tmp_path), progress=False, overrides=overrides)
    assert result["updates"] >= 300 and result["env_steps"] == 400


@pytest.mark.parametrize("name", ["ddpg", "td3"])
def test_fixed_exploration_scales_the_noise_and_keeps_its_kind(name):
    algo = make(name, action_noise="ou", exploration_noise=0.3, ou_theta=0.5)
    assert algo.fix_exploration(0.016, share=0.04) == pytest.approx(0.012)
    assert algo.noise.kind == "ou" and algo.noise.sigma == pytest.approx(0.012) and algo.noise.theta == 0.5

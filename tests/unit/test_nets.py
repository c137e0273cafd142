"""Networks: encoder shapes, the NumPy fast path against PyTorch (and after updates), sampling statistics."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.nets import Mnih2013CNN, NatureCNN, fast
from rlfleet.nets.fast import log_softmax, sample_categorical
from rlfleet.nets.models import ActorCritic, QNetwork

BOX = gym.spaces.Box(-1, 1, (4,), np.float32)


@pytest.mark.parametrize("cls, out", [(Mnih2013CNN, 256), (NatureCNN, 512)])
def test_atari_cnns(cls, out):
    net = cls(4)
    frames = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    assert net(frames).shape == (3, out)


@pytest.mark.parametrize("critic", [True, False])
def test_actor_critic_numpy_matches_torch_and_follows_updates(critic):
    torch.manual_seed(0)
    model = ActorCritic(BOX, 3, critic=critic)
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5, fused=True)  # fused kernels skip version counters
    for _ in range(3):
        logits, value = model.numpy_forward(obs)
        dist, value_t = model(torch.as_tensor(obs))
        # float32 agreement: the large steps (lr 0.5) make log-probabilities of tens, so the tolerance is
        # relative too; a NumPy path on stale weights would be off by whole units
        np.testing.assert_allclose(log_softmax(logits), dist.logits.detach().numpy(), rtol=1e-5, atol=1e-5)
        if critic:
            np.testing.assert_allclose(value, value_t.detach().numpy(), rtol=1e-5, atol=1e-5)
        else:
            assert value is None
        loss = dist.logits.sum() + (value_t.sum() if critic else 0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # the NumPy path must see the new weights next time


@pytest.mark.parametrize("dueling", [False, True])
def test_q_network_numpy_matches_torch(dueling):
    q = QNetwork(BOX, 3, dueling=dueling)
    obs = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(q.numpy_forward(obs), q(torch.as_tensor(obs)).detach().numpy(), atol=1e-5)
    q.load_state_dict({k: v + 0.01 for k, v in q.state_dict().items()})
    np.testing.assert_allclose(q.numpy_forward(obs), q(torch.as_tensor(obs)).detach().numpy(), atol=1e-5)


@pytest.mark.parametrize("build", ["dueling", "shared_actor_critic"])
def test_numpy_path_runs_a_shared_body_once(build, monkeypatch):
    """The body that a dueling head's two streams (or an actor and a critic) share is computed once per call."""
    calls = []
    monkeypatch.setitem(fast._ACTIVATIONS, torch.nn.Tanh, lambda x: calls.append(x.shape) or np.tanh(x))
    monkeypatch.setitem(fast._ACTIVATIONS, torch.nn.ReLU, lambda x: calls.append(x.shape) or np.maximum(x, 0.0))
    obs = np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32)
    if build == "dueling":
        net = QNetwork(BOX, 3, dueling=True)
        np.testing.assert_allclose(net.numpy_forward(obs), net(torch.as_tensor(obs)).detach().numpy(), atol=1e-5)
    else:
        net = ActorCritic(BOX, 3, shared=True)
        logits, value = net.numpy_forward(obs)
        dist, value_t = net(torch.as_tensor(obs))
        np.testing.assert_allclose(log_softmax(logits), dist.logits.detach().numpy(), atol=1e-5)
        np.testing.assert_allclose(value, value_t.detach().numpy(), atol=1e-5)
    calls.clear()
    net.numpy_forward(obs)
    hidden = [m for m in net.modules() if isinstance(m, torch.nn.Tanh | torch.nn.ReLU)]
    assert len(calls) == len(hidden)  # each activation layer once, not once per stream


def test_cnn_models_fall_back_to_torch():
    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert ActorCritic(image, 6, shared=True).numpy_forward(np.zeros((1, 4, 84, 84), np.uint8)) is None


def test_sample_categorical_frequencies_and_logp():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.1, 0.3, 0.6]] * 200_000, dtype=np.float32))
    actions, logp = sample_categorical(logits, rng)
    np.testing.assert_allclose(np.bincount(actions) / len(actions), [0.1, 0.3, 0.6], atol=0.005)
    np.testing.assert_allclose(logp, np.log([0.1, 0.3, 0.6])[actions], atol=1e-5)


def test_softmax_categorical_agrees_with_torchs_categorical():
    """Log-probabilities, log_prob, entropy and their gradients as torch.distributions.Categorical gives them (to
    float32 rounding), and a masked action (logit −inf) with probability and entropy term 0."""
    from torch.distributions import Categorical

    from rlfleet.nets.heads import SoftmaxCategorical

    torch.manual_seed(0)
    raw = (torch.randn(64, 3) * 5).requires_grad_()
    raw_ref = raw.detach().clone().requires_grad_()
    actions = torch.randint(0, 3, (64,))
    ours, ref = SoftmaxCategorical(raw), Categorical(logits=raw_ref, validate_args=False)
    torch.testing.assert_close(ours.logits, ref.logits)
    torch.testing.assert_close(ours.probs, ref.probs)
    torch.testing.assert_close(ours.log_prob(actions), ref.log_prob(actions))
    torch.testing.assert_close(ours.entropy(), ref.entropy())
    (ours.log_prob(actions).sum() + ours.entropy().sum()).backward()
    (ref.log_prob(actions).sum() + ref.entropy().sum()).backward()
    torch.testing.assert_close(raw.grad, raw_ref.grad)
    assert torch.equal(ours.mode, raw.argmax(-1))
    masked = SoftmaxCategorical(torch.tensor([[0.0, 0.0, -float("inf")]]))
    torch.testing.assert_close(masked.probs, torch.tensor([[0.5, 0.5, 0.0]]))
    torch.testing.assert_close(masked.entropy(), torch.tensor([np.log(2.0)], dtype=torch.float32))
    draws = SoftmaxCategorical(torch.log(torch.tensor([0.2, 0.8])).expand(4000, 2)).sample()
    assert draws.shape == (4000,) and abs(draws.float().mean().item() - 0.8) < 0.03


@pytest.mark.parametrize("log_std, sde", [("state_independent", False), ("state_dependent", False), ("", True)])
def test_ortho_init_false_gives_pytorchs_default_initialisation_and_keeps_sigma(log_std, sde):
    """Orthogonal layers: W Wᵀ = gain² I (√2 for the hidden layers) and zero biases; with ortho_init=False every
    layer has nn.Linear's own initialisation, U(−1/√fan_in, 1/√fan_in) for weights and biases, and σ still
    starts at init_std (a σ layer keeps the bias that carries it; gSDE's σ is a parameter of its own)."""
    obs, act = gym.spaces.Box(-1, 1, (6,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)
    kwargs = dict(hidden=(16, 16), init_std=0.2, sde=sde, **({"log_std": log_std} if log_std else {}))
    ortho = ActorCritic(obs, act, **kwargs)
    for layer in [m for m in ortho.actor_body.modules() if isinstance(m, torch.nn.Linear)]:
        w = layer.weight.detach()
        gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        torch.testing.assert_close(gram, 2.0 * torch.eye(len(gram)), atol=1e-5, rtol=0)
        assert torch.all(layer.bias == 0)

    default = ActorCritic(obs, act, ortho_init=False, **kwargs)
    std_linear = getattr(default.policy, "std_linear", None)
    for layer in [m for m in default.modules() if isinstance(m, torch.nn.Linear)]:
        if layer is std_linear:
            torch.testing.assert_close(layer.bias.detach(), torch.full((2,), float(np.log(0.2))))
            continue
        bound = 1 / np.sqrt(layer.in_features)
        assert layer.weight.abs().max() <= bound and layer.bias.abs().max() <= bound
        assert layer.bias.abs().max() > 0 and layer.weight.std() > bound / 3  # not orthogonal with gain 0.01
    if sde:
        torch.testing.assert_close(default.policy.noise.log_std.detach().exp(), torch.full((16, 2), 0.2))
    else:
        dist, _ = default(torch.zeros(1, 6))
        torch.testing.assert_close(dist.std.detach(), torch.full((1, 2), 0.2), atol=1e-2, rtol=0)

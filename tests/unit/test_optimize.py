"""The optimisation step the algorithms share (`optimize`, `clip_grad_norm`): the same numbers, bit for bit, as
torch's zero_grad / clip_grad_norm_ / Adam step it replaces."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from rlfleet.optim.make import FusedAdam, make_optimizer
from rlfleet.optim.step import clip_grad_norm, optimize, set_lr


def grads_of(params: list[nn.Parameter]) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in params]


@pytest.mark.parametrize("max_norm", [0.5, 1e6, 0.0])
def test_clip_grad_norm_gives_torchs_norm_and_gradients(max_norm):
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(shape)) for shape in [(64, 4), (64,), (2, 64), (2,)]]
    params.append(nn.Parameter(torch.randn(3)))  # no gradient: left out, as torch leaves it out
    for p in params[:-1]:
        p.grad = torch.randn_like(p)
    reference = [nn.Parameter(p.detach().clone()) for p in params]
    for r, p in zip(reference, params, strict=True):
        r.grad = None if p.grad is None else p.grad.clone()
    want = nn.utils.clip_grad_norm_(reference, max_norm if max_norm > 0 else float("inf"))
    got = clip_grad_norm(params, max_norm)
    assert torch.equal(got, want)
    for g, w in zip(grads_of(params), grads_of(reference), strict=True):
        assert (g is None and w is None) or torch.equal(g, w)
    if max_norm == 0.5:  # it did clip
        assert float(got) > 0.5
        assert float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads_of(params)[:-1]]))) <= 0.5 + 1e-5


def test_clip_grad_norm_hands_mixed_dtypes_to_torch():
    a = nn.Parameter(torch.ones(2))
    b = nn.Parameter(torch.ones(2, dtype=torch.float64))
    a.grad, b.grad = torch.full((2,), 3.0), torch.full((2,), 4.0, dtype=torch.float64)
    norm = clip_grad_norm([a, b], 1.0)
    assert float(norm) == pytest.approx(50**0.5)
    assert float(torch.cat([a.grad, b.grad.float()]).norm()) == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("max_grad_norm", [0.5, 0.0])
def test_optimize_takes_the_steps_of_zero_grad_backward_clip_grad_norm_and_step(max_grad_norm):
    """Ten Adam steps of a small actor-critic-sized MLP through `optimize` and through torch's own calls."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))
    ref = copy.deepcopy(net)
    opt, ref_opt = make_optimizer("adam", net.parameters(), 1e-3), make_optimizer("adam", ref.parameters(), 1e-3)
    params, ref_params = list(net.parameters()), list(ref.parameters())
    for step in range(10):
        x, y = torch.randn(64, 4), torch.randn(64, 3)
        norm = optimize(opt, (net(x) - y).pow(2).mean(), params, max_grad_norm)
        ref_opt.zero_grad(set_to_none=True)
        (ref(x) - y).pow(2).mean().backward()
        ref_norm = nn.utils.clip_grad_norm_(ref_params, max_grad_norm if max_grad_norm > 0 else float("inf"))
        ref_opt.step()
        assert norm == float(ref_norm), step
        for p, r in zip(params, ref_params, strict=True):
            assert torch.equal(p, r), step


def two_nets(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    return net, copy.deepcopy(net)


def adam_groups(net: nn.Module) -> list[dict]:
    """Two parameter groups with their own lr and weight decay (as the continuous off-policy algorithms build)."""
    first, last = net[0], net[2]
    return [{"params": list(first.parameters()), "lr": 3e-3}, {"params": list(last.parameters()), "weight_decay": 0.1}]


def train_steps(net: nn.Module, opt: torch.optim.Optimizer, steps: int = 8) -> None:
    torch.manual_seed(1)
    for step in range(steps):
        x = torch.randn(16, 4)
        opt.zero_grad(set_to_none=True)
        out = net(x) if step % 3 else net[2](torch.randn(16, 32))  # every third step: no gradient for net[0]
        out.pow(2).mean().backward()
        set_lr(opt, 1e-3 * (1 - step / steps))
        opt.step()


def test_make_optimizer_gives_fused_adam_for_cpu_float32_parameters():
    net, _ = two_nets()
    assert isinstance(make_optimizer("adam", net.parameters(), 1e-3), FusedAdam)
    assert not isinstance(make_optimizer("adam", net.double().parameters(), 1e-3), FusedAdam)


def test_fused_adam_steps_as_torchs_fused_adam_bit_for_bit():
    net, ref = two_nets()
    opt = FusedAdam(adam_groups(net), lr=1e-3, eps=1e-5)
    ref_opt = torch.optim.Adam(adam_groups(ref), lr=1e-3, eps=1e-5, fused=True)
    torch_steps = []
    torch_step = opt._torch_step
    opt._torch_step = lambda closure: torch_steps.append(1) or torch_step(closure)
    train_steps(net, opt)
    train_steps(ref, ref_opt)
    assert len(torch_steps) == 2  # only while a parameter had no moments yet (net[0] first has a gradient at step 1)
    for p, r in zip(net.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, r)
    for s, r in zip(opt.state_dict()["state"].values(), ref_opt.state_dict()["state"].values(), strict=True):
        assert all(torch.equal(s[k], r[k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def test_fused_adam_calls_step_hooks_and_steps_the_same():
    net, ref = two_nets()
    opt = FusedAdam(net.parameters(), lr=1e-3)
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    train_steps(net, opt, steps=3)
    train_steps(ref, torch.optim.Adam(ref.parameters(), lr=1e-3, fused=True), steps=3)
    assert calls == ["pre", "post"] * 3
    assert all(torch.equal(p, r) for p, r in zip(net.parameters(), ref.parameters(), strict=True))


def test_fused_adam_resumes_from_a_torch_adam_state():
    """Checkpoints hold torch's Adam state layout: one saved by a plain Adam loads and goes on identically."""
    net, ref = two_nets()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    train_steps(ref, ref_opt, steps=4)
    net.load_state_dict(ref.state_dict())
    opt = FusedAdam(net.parameters(), lr=1e-3)
    opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))  # (a loaded state shares the saved tensors)
    follow = torch.optim.Adam(ref.parameters(), lr=1e-3, fused=True)
    follow.load_state_dict(copy.deepcopy(ref_opt.state_dict()))
    for group in follow.param_groups:  # the loaded groups say fused=None (the plain Adam's): torch would go on with
        group["fused"] = True  # its foreach loop, which rounds differently from the fused kernel on AVX-512 CPUs
    train_steps(net, opt, steps=4)
    train_steps(ref, follow, steps=4)
    assert all(torch.equal(p, r) for p, r in zip(net.parameters(), ref.parameters(), strict=True))

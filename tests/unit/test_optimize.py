"""The optimisation step the algorithms share (`optimize`, `clip_grad_norm`): the same numbers, bit for bit, as
torch's zero_grad / clip_grad_norm_ it replaces."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from rlfleet.algos.common import clip_grad_norm, make_optimizer, optimize


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

"""The optimizer step every update takes (`optimize`: zero, backward, an architecture's gradient hook, clip, step), the
global-norm clip, and setting a learning rate."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
from torch import nn

from rlfleet.device import metric, note_step

GradientHook = Callable[[Sequence[nn.Parameter]], None]


_GRADIENT_HOOKS: weakref.WeakKeyDictionary[torch.optim.Optimizer, GradientHook] = weakref.WeakKeyDictionary()


def set_gradient_hook(optimizer: torch.optim.Optimizer, hook: GradientHook | None) -> None:
    """Have every `optimize` step of `optimizer` call `hook(params)` between the backward pass and the clip (None:
    no hook again). An architecture's way to combine the gradients of several learners in every optimizer step of
    the algorithm's own update (the `allreduce` learners average theirs) without the algorithm knowing of it."""
    if hook is None:
        _GRADIENT_HOOKS.pop(optimizer, None)
    else:
        _GRADIENT_HOOKS[optimizer] = hook


def gradient_hook(optimizer: torch.optim.Optimizer) -> GradientHook | None:
    """The hook `set_gradient_hook` gave `optimizer`, if any."""
    return _GRADIENT_HOOKS.get(optimizer)


def optimize(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    params: Sequence[nn.Parameter],
    max_grad_norm: float | None,
) -> float | torch.Tensor:
    """zero_grad, backward, the optimizer's gradient hook if it has one (`set_gradient_hook`), clip the global
    gradient norm (if > 0), step; returns the pre-clip norm (a float on the CPU, a 0-dim tensor on a device:
    `rlfleet.device.metric`).

    `max_grad_norm` None neither clips nor measures (NaN comes back): the cheapest step, for small
    replay updates taken every env step."""
    if type(optimizer).zero_grad is torch.optim.Optimizer.zero_grad:
        for group in optimizer.param_groups:  # zero_grad(set_to_none=True) without its profiling scope
            for p in group["params"]:
                p.grad = None
    else:
        optimizer.zero_grad(set_to_none=True)
    loss.backward()
    hook = _GRADIENT_HOOKS.get(optimizer)
    if hook is not None:
        hook(params)
    if max_grad_norm is None:
        optimizer.step()
        note_step(optimizer)
        return float("nan")
    norm = clip_grad_norm(params, max_grad_norm)
    optimizer.step()
    note_step(optimizer)
    return metric(norm)


def clip_grad_norm(params: Sequence[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale the gradients to a global 2-norm of at most `max_norm` (0: measure only); returns the norm before.

    `nn.utils.clip_grad_norm_`'s result bit for bit, in four tensor ops when the gradients share one device and
    dtype (torch's version regroups them by device and dtype on every call, which costs as much as the
    arithmetic for the small nets here); other gradients go to torch's version.
    """
    grads = [p.grad for p in params if p.grad is not None]
    first = grads[0] if grads else None
    if first is None or any(g.device != first.device or g.dtype != first.dtype or g.is_sparse for g in grads):
        return nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    with torch.no_grad():
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        if max_norm > 0:
            torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr

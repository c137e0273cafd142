"""The algorithms' own optimizers, made by name (`make_optimizer`): Adam (fused on the CPU: `FusedAdam`), RMSProp and
SGD."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.optim.optimizer as _torch_optimizer
from torch import nn


class FusedAdam(torch.optim.Adam):
    """`torch.optim.Adam(fused=True)`: one kernel updates every parameter (CPU float32 parameters), ~3x faster
    steps than the per-tensor loop for small nets. Its `step` goes straight to that kernel: the same update, bit
    for bit, without the ~0.1 ms of Python that torch's `step` spends per call around it (profiling scope, hook
    dispatch, regrouping the tensors by device), about as long as the kernel itself takes for a 64x64 net. A
    closure, registered step hooks, amsgrad, maximize, a gradient scaler or a parameter whose moments do not
    exist yet (the first step) take torch's own `step`."""

    def __init__(self, params, lr: float, **kwargs):
        super().__init__(params, lr=lr, **{**kwargs, "fused": True})  # `fused` given too: a copy from its defaults

    def step(self, closure=None):
        if closure is not None or self._step_hooked():
            return self._torch_step(closure)
        groups = []
        for group in self.param_groups:
            if any(group.get(key) for key in ("amsgrad", "maximize", "differentiable", "capturable")):
                return self._torch_step(closure)
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.get(p)
                if not state:
                    return self._torch_step(closure)
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if params:
                groups.append((group, params, grads, exp_avgs, exp_avg_sqs, steps))
        with torch.no_grad():
            for group, params, grads, exp_avgs, exp_avg_sqs, steps in groups:  # what torch.optim.adam._fused_adam does
                beta1, beta2 = group["betas"]
                torch._foreach_add_(steps, 1)
                fused = torch._fused_adamw_ if group.get("decoupled_weight_decay") else torch._fused_adam_
                fused(
                    params,
                    grads,
                    exp_avgs,
                    exp_avg_sqs,
                    [],
                    steps,
                    amsgrad=False,
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=False,
                    grad_scale=None,
                    found_inf=None,
                )
        return None

    step.hooked = True  # type: ignore[attr-defined]  # torch wraps only unhooked steps in its profiling/hook wrapper

    def _step_hooked(self) -> bool:
        return bool(
            self._optimizer_step_pre_hooks
            or self._optimizer_step_post_hooks
            or _torch_optimizer._global_optimizer_pre_hooks
            or _torch_optimizer._global_optimizer_post_hooks
            or getattr(self, "grad_scale", None) is not None
            or getattr(self, "found_inf", None) is not None
        )

    def _torch_step(self, closure):
        """torch's `Adam.step`, within its hooks and profiling scope (torch adds them to `Adam.step` itself only
        once a plain `Adam` has been made)."""
        step = torch.optim.Adam.step
        if not getattr(step, "hooked", False):
            step = self.profile_hook_step(step)
        return step(self, closure)


OPTIMIZERS = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop, "sgd": torch.optim.SGD}


def make_optimizer(
    name: str, params: Iterable[nn.Parameter | dict[str, Any]], lr: float, **kwargs: Any
) -> torch.optim.Optimizer:
    """`name` over parameters or parameter groups (dicts with "params" and their own "lr", as in torch)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)}")
    if name == "rmsprop":
        kwargs = {"alpha": 0.99, "eps": 1e-5, **kwargs}
    if name == "adam":
        kwargs = {"eps": 1e-5, **kwargs}
        params = list(params)
        tensors = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
        if "fused" not in kwargs and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in tensors):
            return FusedAdam(params, lr=lr, **kwargs)
        if "fused" not in kwargs and all(p.device.type == "cuda" and p.dtype == torch.float32 for p in tensors):
            kwargs["fused"] = True  # one kernel for every parameter, as on the CPU
    return OPTIMIZERS[name](params, lr=lr, **kwargs)

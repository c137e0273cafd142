"""Optimisers for lock-free ("Hogwild!") actor-learners: Shared RMSProp, momentum SGD and Shared Adam, plus
`build_optimizer`, which also builds `"algo"`: a fresh copy of an algorithm's own optimizer (`OptimizerRecipe`).

The A3C paper (Mnih et al. 2016, Supplementary 7) compares three optimisers, all applied without locks to
parameters shared by every actor-learner:

- **momentum SGD**, with a momentum vector m per worker (`"momentum_sgd"`):
  m ← αm + (1−α)Δθ, θ ← θ − ηm;
- RMSProp with per-worker statistics g (`"rmsprop"`);
- **Shared RMSProp**, whose statistics g are shared by all workers and updated without locks
  (`"shared_rmsprop"`, the paper's choice and the most robust of the three):
  g ← αg + (1−α)Δθ², θ ← θ − ηΔθ/√(g+ε), all elementwise.

`"shared_adam"` is Adam with its moments and step count shared the same way (a common A3C variant).

`"algo"` is the algorithm's own optimizer: the class and hyperparameters its single-process `update` steps with
(A2C's `torch.optim.RMSprop` with α 0.99 and ε 1e-5 outside the root, PPO's and PG's Adam with ε 1e-5, ...: see
`make_optimizer` in `rlfleet/optim/make.py`), built afresh over the parameters given (`OptimizerRecipe`). It is
RLlib's choice (its AsyncGradientsOptimizer applies each gradient with the policy's own optimizer) and Lapan's
(his gradient-parallel centre steps the agent's Adam), and the default of `async_grad`, `grad_parallel` and
`param_server`; `hogwild` keeps the A3C paper's `"shared_rmsprop"`. Its state is not shared: in `hogwild` it is a
per-worker kind, like `"rmsprop"`.

Who builds what (`is_shared(name)` tells the two kinds apart):

- **Shared kinds** (`"shared_rmsprop"`, `"shared_adam"`): the coordinator process calls `share_memory()` on
  the model, builds the optimizer ONCE over the model's parameters, and passes that optimizer object to every
  worker process (`torch.multiprocessing`, `spawn` start method). The optimizer state is created eagerly in
  `__init__` and moved to shared memory there, so pickling it to a worker sends handles to the same memory:
  every worker updates the same statistics. The parameters and the state must travel in the same pickle (the
  same `Process(args=...)`) so that the worker's state is keyed by the worker's copies of the parameters:
  passing the optimizer alone is enough, its `param_groups` hold the parameters.
- **Per-worker kinds** (`"rmsprop"`, `"momentum_sgd"`, `"algo"`): each worker calls `build_optimizer` itself over
  the shared parameters it received; its statistics (square averages, momentum) live in that worker only.

The name `"sgd"` is refused: it used to be `torch.optim.SGD(momentum=0.9)`, whose step under a steady
gradient is η/(1−α) = 10× the paper's rule; the error says to use `"momentum_sgd"` (with 10× the learning
rate for the old step size).

Hyperparameters live in `param_groups`, which are plain Python dicts: after pickling, each process holds its
own copy, so a learning-rate schedule must be applied by every worker to its own optimizer (e.g. from the
shared global step counter); changing `lr` in the coordinator changes nothing in the workers.

Nothing is locked: concurrent updates of the same element may overwrite each other, and the shared step
counters may miss increments. That is the paper's design, not a bug.

`state_dict()` uses torch's layout (the state keys of `torch.optim.RMSprop` / `torch.optim.Adam`;
`MomentumSGD` has torch SGD's `momentum_buffer` plus `step`), so checkpoints save and load as usual.
`load_state_dict()` copies the loaded values INTO the existing shared tensors instead of replacing them, so
resuming keeps the state shared with workers already holding it.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer

HOGWILD_OPTIMIZERS = ("shared_rmsprop", "rmsprop", "momentum_sgd", "shared_adam")
ALGO = "algo"
"""`--optimizer algo`: the algorithm's own optimizer (class and hyperparameters), built afresh (`OptimizerRecipe`)."""
OPTIMIZER_CHOICES = (ALGO, *HOGWILD_OPTIMIZERS)
"""What `--optimizer` takes."""
_SHARED = ("shared_rmsprop", "shared_adam")
ELEMENTWISE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop, torch.optim.SGD, torch.optim.Adagrad)
"""torch optimizers whose step and state are per element (a step count aside): they step a flat shard of the
parameters as they step the whole (`param_server`; torch's fused CPU Adam rounds a tensor's last elements that
do not fill a vector differently, so with it a shard's last elements may differ from the whole's by an ulp)."""


OPTIONS_NOT_TAKEN: dict[str, Any] = {"centered": False, "momentum": 0, "nesterov": False, "dampening": 0,
                                     "amsgrad": False, "maximize": False, "decoupled_weight_decay": False}  # fmt: skip
"""Options of torch's optimizers that the shared ones do not take (unless among their own defaults), each with the
value at which it changes nothing: a state saved with another value is refused."""


class _SharedStateOptimizer(Optimizer, metaclass=ABCMeta):
    """Base of the Hogwild optimisers: eager per-parameter state in shared memory, loaded by copying in place,
    and one `step` (closure, weight decay, sparse check) around each optimiser's own `_update` rule. A
    per-worker kind keeps its state in shared memory too, but only the worker that built it holds it."""

    @abstractmethod
    def _new_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        """The zeroed state tensors of one parameter (moved to shared memory by the caller)."""

    @abstractmethod
    def _update(self, param: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor], group: dict) -> None:
        """Apply one step to `param` in place, `grad` already including the weight decay."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                if group["weight_decay"] != 0.0:
                    grad = grad.add(param, alpha=group["weight_decay"])
                self._update(param, grad, self._shared_state(param), group)
        return loss

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        for param in self.param_groups[-1]["params"]:
            if param not in self.state or not self.state[param]:
                self.state[param] = {key: t.share_memory_() for key, t in self._new_state(param).items()}

    def _shared_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state.get(param)
        if not state:
            raise RuntimeError(
                f"{type(self).__name__} has no state for a parameter of shape {tuple(param.shape)}; pass the "
                "optimizer to worker processes in the same pickle as its parameters (or pass the optimizer "
                "alone and read the parameters from its param_groups)"
            )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does (checks, hyperparameters), then copy the values into the existing shared tensors. A
        torch optimizer's state loads where its options step as this one does (`torch.optim.Adam`'s into
        `SharedAdam`); one saved with an option this class does not take (`centered`, `momentum`, `amsgrad`, ...),
        or `torch.optim.RMSprop`'s (its ε is added outside the square root), is a `ValueError`."""
        name = type(self).__name__
        for group in state_dict.get("param_groups", ()):
            for key, neutral in OPTIONS_NOT_TAKEN.items():
                if key not in self.defaults and group.get(key, neutral) != neutral:
                    raise ValueError(f"{name}.load_state_dict: the state was saved with {key}={group[key]!r}, "
                                     f"which {name} does not take")  # fmt: skip
            if isinstance(self, SharedRMSprop) and "centered" in group:
                raise ValueError(f"{name}.load_state_dict: the state is torch.optim.RMSprop's, whose eps is added "
                                 "outside the square root (here: inside)")  # fmt: skip
        live = {param: dict(state) for param, state in self.state.items()}
        super().load_state_dict(state_dict)
        for param, tensors in live.items():
            loaded = self.state.get(param, {})
            for key, tensor in tensors.items():
                if key not in loaded:
                    tensor.zero_()  # a parameter without saved state had never been stepped
                    continue
                value = torch.as_tensor(loaded[key])
                if value.shape != tensor.shape:
                    raise ValueError(
                        f"{type(self).__name__}.load_state_dict: state {key!r} has shape {tuple(value.shape)} "
                        f"but the parameter's is {tuple(tensor.shape)}; the checkpoint is for another model"
                    )
                tensor.copy_(value)
            self.state[param] = tensors


class SharedRMSprop(_SharedStateOptimizer):
    """The A3C paper's Shared RMSProp: g ← αg + (1−α)Δθ², θ ← θ − ηΔθ/√(g+ε), with g in shared memory.

    Note that ε sits INSIDE the square root (the paper's Eq. S3), unlike `torch.optim.RMSprop`, which divides
    by √g + ε.

    Args:
        params: the (shared) parameters, or parameter groups.
        lr: η. The paper samples η from LogUniform(1e-4, 1e-2) per run and anneals it linearly to 0; 7e-4 is a
            fixed value inside that range.
        alpha: α, the decay of the statistic g; the paper uses 0.99 in every experiment.
        eps: ε, added to g inside the square root; the paper gives no value. 1e-10 (√ε = 1e-5) makes the
            step what `torch.optim.RMSprop(eps=1e-5)` takes in a single-process run, so a learning rate tuned
            there carries over. With 1e-5 (√ε ≈ 3e-3) every gradient whose √g is below 3e-3 got a smaller
            step than that: the continuous agent on Pendulum-v1 (rewards × 0.01) did not solve seeds 1
            and 2 in 500k steps at η = 5e-4, nor both at 2e-4; with 1e-10 and 2.5e-4, seeds 1-3 solved in
            200k-375k. Large values (0.1, common in Atari A3C code) turn it into plain
            SGD with step η/√ε whenever g ≪ ε.
        weight_decay: L2 penalty added to the gradient before the update (the paper uses none).

    State per parameter, created at construction in shared memory: `square_avg` (g) and `step` (number of
    updates applied, a float tensor as in torch; may miss increments under concurrent steps).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 7e-4,
        alpha: float = 0.99,
        eps: float = 1e-10,
        weight_decay: float = 0.0,
    ):
        if lr < 0.0:
            raise ValueError(f"SharedRMSprop: lr must be >= 0, got {lr}")
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"SharedRMSprop: alpha must be in [0, 1), got {alpha}")
        if eps <= 0.0:
            raise ValueError(f"SharedRMSprop: eps must be > 0 (it keeps √(g+ε) away from 0), got {eps}")
        if weight_decay < 0.0:
            raise ValueError(f"SharedRMSprop: weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay})

    def _new_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "step": torch.zeros((), dtype=torch.float32),
            "square_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
        }

    def _update(self, param, grad, state, group) -> None:
        state["step"].add_(1)
        square_avg = state["square_avg"]
        square_avg.mul_(group["alpha"]).addcmul_(grad, grad, value=1.0 - group["alpha"])
        param.addcdiv_(grad, square_avg.add(group["eps"]).sqrt_(), value=-group["lr"])


class MomentumSGD(_SharedStateOptimizer):
    """The A3C paper's momentum SGD (Supplementary 7): m ← αm + (1−α)Δθ, θ ← θ − ηm, m starting at 0.

    m is an exponential average of the gradients, so under a steady gradient the step tends to ηΔθ. This is
    not `torch.optim.SGD(momentum=α)`, which accumulates m ← αm + Δθ and so steps up to η/(1−α)·Δθ (10× at
    α = 0.9); it is `torch.optim.SGD(momentum=α, dampening=α)` except on the first step, where torch starts
    m at Δθ and the paper's rule at (1−α)Δθ. In the paper each worker keeps its own m: build one per worker
    (`build_optimizer("momentum_sgd", ...)` in the worker).

    Args:
        params: the (shared) parameters, or parameter groups.
        lr: η.
        momentum: α, the decay of m. The paper gives no value; 0.9 (the common momentum) averages the
            gradients of about the last 10 updates.
        weight_decay: L2 penalty added to the gradient before the update (the paper uses none).

    State per parameter, created at construction (in shared memory, like the shared kinds'): `momentum_buffer`
    (m, the key `torch.optim.SGD` uses) and `step` (number of updates applied, a float tensor).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
    ):
        if lr < 0.0:
            raise ValueError(f"MomentumSGD: lr must be >= 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"MomentumSGD: momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"MomentumSGD: weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    def _new_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "step": torch.zeros((), dtype=torch.float32),
            "momentum_buffer": torch.zeros_like(param, memory_format=torch.preserve_format),
        }

    def _update(self, param, grad, state, group) -> None:
        state["step"].add_(1)
        momentum = state["momentum_buffer"]
        momentum.lerp_(grad, 1.0 - group["momentum"])  # αm + (1−α)Δθ
        param.add_(momentum, alpha=-group["lr"])


class SharedAdam(_SharedStateOptimizer):
    """Adam (bias-corrected, as `torch.optim.Adam`) with its moments and step count in shared memory.

    Args:
        params: the (shared) parameters, or parameter groups.
        lr: step size.
        betas: decays of the first and second moment estimates.
        eps: added to the bias-corrected √v in the denominator.
        weight_decay: L2 penalty added to the gradient (as `torch.optim.Adam`, not decoupled).

    State per parameter, created at construction in shared memory: `step` (a float tensor; concurrent steps
    may miss increments), `exp_avg` (m) and `exp_avg_sq` (v), the keys `torch.optim.Adam` uses.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        if lr < 0.0:
            raise ValueError(f"SharedAdam: lr must be >= 0, got {lr}")
        if not all(0.0 <= beta < 1.0 for beta in betas) or len(betas) != 2:
            raise ValueError(f"SharedAdam: betas must be two numbers in [0, 1), got {betas}")
        if eps < 0.0:
            raise ValueError(f"SharedAdam: eps must be >= 0, got {eps}")
        if weight_decay < 0.0:
            raise ValueError(f"SharedAdam: weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    def _new_state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "step": torch.zeros((), dtype=torch.float32),
            "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
        }

    def _update(self, param, grad, state, group) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        step = state["step"].add_(1).item()
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        step_size = lr / (1.0 - beta1**step)
        denom = (exp_avg_sq.sqrt() / (1.0 - beta2**step) ** 0.5).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)


@dataclass(frozen=True)
class OptimizerRecipe:
    """What builds a fresh optimizer like a given one: its class and the hyperparameters of its one parameter group
    (picklable, so that processes that do not hold the algorithm, `param_server`'s servers, can build it too)."""

    cls: type
    hyperparameters: dict[str, Any]
    """The constructor's keywords (the keys of the optimizer's `defaults`) as its parameter group has them."""

    @classmethod
    def of(cls, optimizer: Optimizer | OptimizerRecipe) -> OptimizerRecipe:
        """The recipe of `optimizer` (an algorithm's own); a ValueError for one of several parameter groups, which
        a copy over other parameters could not tell apart."""
        if isinstance(optimizer, OptimizerRecipe):
            return optimizer
        if len(optimizer.param_groups) != 1:
            raise ValueError(
                f"the algorithm's {type(optimizer).__name__} has {len(optimizer.param_groups)} parameter groups; "
                "optimizer 'algo' copies one group's hyperparameters: choose another --optimizer"
            )
        group = optimizer.param_groups[0]
        return cls(type(optimizer), {key: group[key] for key in optimizer.defaults if key in group})

    @property
    def elementwise(self) -> bool:
        """Whether the optimizer steps each element on its own (`ELEMENTWISE`, or one of this module's)."""
        return issubclass(self.cls, (*ELEMENTWISE, _SharedStateOptimizer))

    @property
    def name(self) -> str:
        return self.cls.__name__

    def build(self, params: Iterable[torch.Tensor], lr: float | None = None, **kwargs: Any) -> Optimizer:
        """A fresh optimizer of the class over `params`: the recipe's hyperparameters, `lr` (if given) and `kwargs`
        over them."""
        hyperparameters = {**self.hyperparameters, **kwargs}
        if lr is not None:
            hyperparameters["lr"] = lr
        return self.cls(params, **hyperparameters)


def _check_name(name: str) -> None:
    if name == "sgd":
        raise ValueError(
            "optimizer 'sgd' is now 'momentum_sgd', the A3C paper's m ← αm + (1−α)Δθ, θ ← θ − ηm; the old 'sgd' "
            "(torch's SGD, momentum 0.9) stepped 10x as far: use 'momentum_sgd' with 10x the learning rate for "
            "the same step"
        )
    if name not in OPTIMIZER_CHOICES:
        raise ValueError(
            f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZER_CHOICES)} (algo: the algorithm's own)"
        )


def is_shared(name: str) -> bool:
    """True if the optimizer `name` keeps its statistics in shared memory (build once, pass to the workers)."""
    _check_name(name)
    return name in _SHARED


def build_optimizer(
    name: str,
    params: Iterable[torch.Tensor],
    lr: float,
    *,
    algo_optimizer: Optimizer | OptimizerRecipe | None = None,
    **kwargs: Any,
) -> Optimizer:
    """The optimizer `name` (one of `OPTIMIZER_CHOICES`) over `params`; `kwargs` override its defaults.

    - `"algo"`: a fresh optimizer of `algo_optimizer`'s class with its hyperparameters (the algorithm's own
      optimizer, or its `OptimizerRecipe`; required for this name), at `lr`;
    - `"shared_rmsprop"`: `SharedRMSprop` (α=0.99, ε=1e-10 inside the root), the paper's default;
    - `"shared_adam"`: `SharedAdam` (betas (0.9, 0.999), ε=1e-8);
    - `"rmsprop"`: the same update as `SharedRMSprop`, but each worker builds its own, so the statistics stay
      per worker (nobody else holds them);
    - `"momentum_sgd"`: `MomentumSGD` (α=0.9), the paper's momentum SGD; each worker builds its own, so the
      momentum stays per worker.
    """
    _check_name(name)
    if name == ALGO:
        if algo_optimizer is None:
            raise ValueError("optimizer 'algo' copies the algorithm's own: pass it as algo_optimizer")
        return OptimizerRecipe.of(algo_optimizer).build(params, lr, **kwargs)
    if name == "shared_rmsprop":
        return SharedRMSprop(params, lr=lr, **kwargs)
    if name == "shared_adam":
        return SharedAdam(params, lr=lr, **kwargs)
    if name == "rmsprop":
        return SharedRMSprop(params, lr=lr, **kwargs)  # built in each worker: its g is that worker's alone
    return MomentumSGD(params, lr=lr, **kwargs)  # built in each worker: its m is that worker's alone

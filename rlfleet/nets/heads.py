"""Heads that turn encoder features into a policy, a value, or action values."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributions import Categorical
from torch.nn import functional as F

from rlfleet.nets.encoders import layer_init


class CategoricalHead(nn.Module):
    """Logits for a discrete policy (small initial weights so the first policy is near uniform)."""

    def __init__(self, in_dim: int, n_actions: int):
        super().__init__()
        self.linear = layer_init(nn.Linear(in_dim, n_actions), gain=0.01)

    def forward(self, features: torch.Tensor) -> Categorical:
        return Categorical(logits=self.linear(features), validate_args=False)


LOG_STDS = ("state_independent", "state_dependent", "softplus")
LOG_STD_RANGE = (-5.0, 2.0)  # clamp of a state-dependent log σ: σ from 0.007 to 7.4
MIN_VARIANCE = 1e-6  # floor of the softplus σ², so that log σ² stays finite when softplus underflows
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class DiagGaussian:
    """Diagonal Gaussian over `[..., A]` actions; log-probabilities and entropies sum over the A dims.

    Written out by hand (no `torch.distributions.Normal` and its argument checks) because it is built on
    every forward pass; `tests/unit/test_gaussian.py` checks it against `Normal`.
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean = mean
        self.log_std = log_std.expand_as(mean)
        self.std = self.log_std.exp()

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        z = (actions - self.mean) / self.std
        return (-0.5 * z.pow(2) - self.log_std - _HALF_LOG_2PI).sum(-1)

    def entropy(self) -> torch.Tensor:
        """½ log(2πeσ²) per dim, summed (the A3C paper's entropy cost is its negative)."""
        return (self.log_std + 0.5 + _HALF_LOG_2PI).sum(-1)

    def sample(self) -> torch.Tensor:
        return self.mean + self.std * torch.randn_like(self.mean)

    @property
    def mode(self) -> torch.Tensor:
        return self.mean


class GaussianHead(nn.Module):
    """Diagonal Gaussian policy for `act_dim` continuous actions: a linear mean and one of three σ's.

    `log_std`:

    - "state_independent": log σ is a learned vector, the same in every state (PPO's usual choice);
    - "state_dependent": log σ = linear(features), clamped to `LOG_STD_RANGE`;
    - "softplus": σ² = softplus(linear(features)) (+ `MIN_VARIANCE`), the A3C paper's continuous head.

    `init_std` sets σ at initialisation (small initial weights make it the same in every state).
    """

    def __init__(self, in_dim: int, act_dim: int, log_std: str = "state_independent", init_std: float = 1.0):
        super().__init__()
        if log_std not in LOG_STDS:
            raise ValueError(f"unknown log_std {log_std!r}; choose one of {list(LOG_STDS)}")
        if init_std <= 0:
            raise ValueError(f"init_std must be positive, got {init_std}")
        self.kind = log_std
        self.mean = layer_init(nn.Linear(in_dim, act_dim), gain=0.01)
        self.log_std: nn.Parameter | None = None
        self.std_linear: nn.Linear | None = None
        if log_std == "state_independent":
            self.log_std = nn.Parameter(torch.full((act_dim,), math.log(init_std)))
        elif log_std == "state_dependent":
            self.std_linear = layer_init(nn.Linear(in_dim, act_dim), gain=0.01, bias=math.log(init_std))
        else:  # softplus(b) = σ²  ⇔  b = log(exp(σ²) − 1)
            bias = math.log(math.expm1(max(init_std**2 - MIN_VARIANCE, 1e-8)))
            self.std_linear = layer_init(nn.Linear(in_dim, act_dim), gain=0.01, bias=bias)

    def log_std_from(self, std_out: torch.Tensor | None) -> torch.Tensor:
        """log σ from the σ layer's output (None for the state-independent vector)."""
        if self.kind == "state_independent":
            return self.log_std
        if self.kind == "state_dependent":
            return std_out.clamp(*LOG_STD_RANGE)
        return 0.5 * (F.softplus(std_out) + MIN_VARIANCE).log()

    def forward(self, features: torch.Tensor) -> DiagGaussian:
        std_out = None if self.std_linear is None else self.std_linear(features)
        return DiagGaussian(self.mean(features), self.log_std_from(std_out))


class ValueHead(nn.Module):
    """State value V(s) as a `[B]` tensor."""

    def __init__(self, in_dim: int):
        super().__init__()
        self.linear = layer_init(nn.Linear(in_dim, 1), gain=1.0)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features).squeeze(-1)


class QHead(nn.Module):
    """Action values Q(s, ·) as `[B, A]`."""

    def __init__(self, in_dim: int, n_actions: int):
        super().__init__()
        self.linear = nn.Linear(in_dim, n_actions)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear(features)


class DuelingQHead(nn.Module):
    """Dueling action values: Q = V + A − mean(A) (Wang et al. 2016), one hidden layer per stream."""

    def __init__(self, in_dim: int, n_actions: int, hidden: int | None = None):
        hidden = hidden or in_dim
        super().__init__()
        self.value = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.advantage = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        adv = self.advantage(features)
        return self.value(features) + adv - adv.mean(dim=-1, keepdim=True)

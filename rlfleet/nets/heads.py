"""Heads that turn encoder features into a policy, a value, or action values."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributions import Categorical

from rlfleet.nets.encoders import layer_init


class CategoricalHead(nn.Module):
    """Logits for a discrete policy (small initial weights so the first policy is near uniform)."""

    def __init__(self, in_dim: int, n_actions: int):
        super().__init__()
        self.linear = layer_init(nn.Linear(in_dim, n_actions), gain=0.01)

    def forward(self, features: torch.Tensor) -> Categorical:
        return Categorical(logits=self.linear(features), validate_args=False)


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

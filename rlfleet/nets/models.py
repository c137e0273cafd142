"""Complete networks built from an encoder and heads: an actor-critic and a Q-network."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from rlfleet.nets.encoders import make_encoder
from rlfleet.nets.fast import compile_numpy
from rlfleet.nets.heads import CategoricalHead, DuelingQHead, QHead, ValueHead


class ActorCritic(nn.Module):
    """Categorical policy and state value, with a shared trunk (images) or separate ones (vectors)."""

    def __init__(
        self,
        obs_space: gym.Space,
        n_actions: int,
        encoder: str = "auto",
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        shared: bool = False,
        critic: bool = True,
    ):
        super().__init__()
        self.actor_body = make_encoder(obs_space, encoder, hidden, activation)
        self.policy = CategoricalHead(self.actor_body.out_dim, n_actions)
        self.shared = shared
        self.critic_body = None
        self.value_head = None
        if critic:
            if not shared:
                self.critic_body = make_encoder(obs_space, encoder, hidden, activation)
            self.value_head = ValueHead(self.actor_body.out_dim)

    def forward(self, obs: torch.Tensor) -> tuple[Categorical, torch.Tensor | None]:
        features = self.actor_body(obs)
        dist = self.policy(features)
        if self.value_head is None:
            return dist, None
        critic_features = features if self.critic_body is None else self.critic_body(obs)
        return dist, self.value_head(critic_features)

    def numpy_forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None] | None:
        """(logits, values) computed in NumPy for MLP bodies (fast acting), or None for other encoders."""
        if not hasattr(self, "_np"):
            branches = [(self.actor_body, self.policy.linear)]
            if self.value_head is not None:
                critic_body = self.critic_body if self.critic_body is not None else self.actor_body
                branches.append((critic_body, self.value_head.linear))
            self._np = compile_numpy(*branches)
        if self._np is None:
            return None
        out = self._np(obs)
        return out[0], (out[1][:, 0] if len(out) > 1 else None)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.value_head is None:
            return torch.zeros(obs.shape[0])
        body = self.actor_body if self.critic_body is None else self.critic_body
        return self.value_head(body(obs))


class QNetwork(nn.Module):
    """Q(s, ·) for discrete actions, optionally with a dueling head."""

    def __init__(
        self,
        obs_space: gym.Space,
        n_actions: int,
        encoder: str = "auto",
        hidden: Sequence[int] = (128, 128),
        activation: str = "relu",
        dueling: bool = False,
    ):
        super().__init__()
        self.body = make_encoder(obs_space, encoder, hidden, activation)
        head = DuelingQHead if dueling else QHead
        self.head = head(self.body.out_dim, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(obs))

    def numpy_forward(self, obs: np.ndarray) -> np.ndarray | None:
        """Q(s, ·) computed in NumPy for MLP bodies (fast acting), or None for other encoders."""
        if not hasattr(self, "_np"):
            if isinstance(self.head, DuelingQHead):
                self._np = compile_numpy((self.body, self.head.value), (self.body, self.head.advantage))
            else:
                self._np = compile_numpy((self.body, self.head.linear))
        if self._np is None:
            return None
        out = self._np(obs)
        if len(out) == 1:
            return out[0]
        value, adv = out
        return value + adv - adv.mean(-1, keepdims=True)

"""Networks of the off-policy continuous-control agents (DDPG, TD3, SAC): a deterministic tanh actor, a
tanh-squashed Gaussian actor (optionally exploring with gSDE), and K critics Q_k(s, a) evaluated together in
one batched pass.

Actions are in the policy's normalised space [-1, 1] (`ActionBounds` maps them to the env's bounds). The
actors are plain MLPs, so acting runs in NumPy (`rlfleet.nets.fast`) without PyTorch's per-op overhead.
Observations are given as a size (a flat `Box`) or as their space: any space `FlatInput` takes (one-hots,
dict entries side by side) reaches the actors and critics as one float vector. With `net` (a user network's import
path, `rlfleet.nets.user`), the actor's body is the user's network and each critic has one of its own, whose
features the critic's MLP takes beside the action (as Stable-Baselines3's features extractor); `UserNets` may also
name a whole actor and whole critics of the user's. Actors with a user's network act through PyTorch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlfleet.data.batch import obs_len, obs_tensor
from rlfleet.device import host, module_device
from rlfleet.nets.encoders import ACTIVATIONS, MLP, FlatInput, flat_size
from rlfleet.nets.fast import compile_numpy
from rlfleet.nets.heads import LOG_STD_RANGE, StateDependentNoise
from rlfleet.nets.user import UserCritic, UserNet

_LOG_2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def squashed_gaussian_log_prob(u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log π(tanh(u)) for u ~ N(mean, σ²) per dim, summed over the last dim (SAC, Haarnoja et al. 2018, App. C).

    The change of variables a = tanh(u) subtracts log(1 − tanh(u)²) per dim, computed in the stable form
    2 (log 2 − u − softplus(−2u)), which stays finite where tanh(u) rounds to ±1.
    """
    z = (u - mean) * torch.exp(-log_std)
    gaussian = -0.5 * z.pow(2) - log_std - _HALF_LOG_2PI
    return (gaussian - 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)


Obs = int | gym.Space


def flat_inputs(obs: Obs) -> FlatInput | None:
    """The `FlatInput` of observations given as a space other than a `Box` (None: a flat `Box` or its size)."""
    return FlatInput(obs) if isinstance(obs, gym.Space) and not isinstance(obs, gym.spaces.Box) else None


def obs_size(obs: Obs) -> int:
    """The size of one observation as the networks take it: flattened, one-hot, or dict entries side by side."""
    return obs if isinstance(obs, int) else flat_size(obs)


def _flat_mlp(obs: Obs, hidden: Sequence[int], activation: str) -> MLP:
    """An MLP with PyTorch's default Linear initialisation (what DDPG/TD3/SAC implementations use)."""
    body = MLP(obs_size(obs), hidden, activation, inputs=flat_inputs(obs))
    for module in body.modules():
        if isinstance(module, nn.Linear):
            module.reset_parameters()
    return body


@dataclass(frozen=True)
class UserNets:
    """The user's networks of an off-policy continuous agent (`rlfleet.nets.user`), each an import path: an encoder
    under the built-in heads (`net`), a whole actor (`actor`) and whole critics (`critic`, one built per member)."""

    net: str = ""
    net_kwargs: dict[str, Any] = field(default_factory=dict)
    actor: str = ""
    actor_kwargs: dict[str, Any] = field(default_factory=dict)
    critic: str = ""
    critic_kwargs: dict[str, Any] = field(default_factory=dict)


def _space(obs: Obs, path: str) -> gym.Space[Any]:
    if not isinstance(obs, gym.Space):
        raise ValueError(f"a user network ({path}) needs the observation space, not a size ({obs})")
    return obs


def _policy_space(act_dim: int) -> gym.spaces.Box:
    """The actions the networks see: the policy's [-1, 1]^A (`ActionBounds` maps them to the env's)."""
    return gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)


def _actor_parts(
    obs: Obs, act_dim: int, outputs: int, hidden: Sequence[int], activation: str, user: UserNets
) -> tuple[MLP | UserNet, nn.Module]:
    """An actor's body and head: the user's whole actor (its `outputs` numbers, no head), a linear head on the user's
    encoder, or on `_flat_mlp`."""
    if user.actor:
        actor = UserNet(_space(obs, user.actor), user.actor, user.actor_kwargs, _policy_space(act_dim), outputs)
        return actor, nn.Identity()
    body = UserNet(_space(obs, user.net), user.net, user.net_kwargs) if user.net else _flat_mlp(obs, hidden, activation)
    return body, nn.Linear(body.out_dim, outputs)


class DeterministicActor(nn.Module):
    """μ(s) = tanh(MLP(s)) in [-1, 1]^A (DDPG, TD3); with `user.net`, tanh of a linear head on the user's network;
    with `user.actor`, tanh of the user's actor."""

    def __init__(
        self,
        obs: Obs,
        act_dim: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        user: UserNets | None = None,
    ):
        super().__init__()
        self.body, self.head = _actor_parts(obs, act_dim, act_dim, hidden, activation, user or UserNets())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.body(obs)))

    def numpy_act(self, obs: np.ndarray) -> np.ndarray:
        """μ(obs) as a float32 NumPy array (NumPy forward for MLP bodies, else PyTorch in inference mode)."""
        if not hasattr(self, "_np"):
            self._np = compile_numpy((self.body, self.head))
        if self._np is not None:
            return np.tanh(self._np(obs)[0])
        with torch.inference_mode():
            return host(self(obs_tensor(obs, module_device(self))))


SDE_MEAN_CLIP = 2.0  # gSDE: μ before the squashing is clipped to ±this (Stable-Baselines3's clip_mean)


class SquashedGaussianActor(nn.Module):
    """π(·|s) = tanh(N(μ(s), σ(s)²)) (SAC): one linear head gives μ and log σ (clamped to `LOG_STD_RANGE`).

    With `sde`, gSDE (`StateDependentNoise`, as Stable-Baselines3's SAC has it): the head gives μ only,
    clipped to ±`SDE_MEAN_CLIP`, and σ(s)² = Σ_j z_j(s)² σ_ji² of the body's features z, which the policy
    loss trains too (`learn_features`); `sde_init_std` is σ of every entry at initialisation. Exploring
    acts with the noise θᵀ z(s) of the algorithm's noise matrices; training samples the same Gaussian with
    fresh noise per sample.
    """

    def __init__(
        self,
        obs: Obs,
        act_dim: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        sde: bool = False,
        sde_init_std: float = math.exp(-3),
        user: UserNets | None = None,
    ):
        super().__init__()
        user = user or UserNets()
        if sde and user.actor:
            raise ValueError(f"sde makes its noise from the actor's features, which --actor-net {user.actor} keeps")
        self.act_dim = act_dim
        self.body, self.head = _actor_parts(obs, act_dim, act_dim if sde else 2 * act_dim, hidden, activation, user)
        self.sde = sde
        self.noise = StateDependentNoise(self.body.out_dim, act_dim, sde_init_std) if sde else None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log σ) of the Gaussian before the squashing."""
        features = self.body(obs)
        if self.noise is not None:
            mean = self.head(features).clamp(-SDE_MEAN_CLIP, SDE_MEAN_CLIP)
            return mean, self.noise.log_std_of(features)
        mean, log_std = self.head(features).split(self.act_dim, dim=-1)
        return mean, log_std.clamp(*LOG_STD_RANGE)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised actions a = tanh(μ + σ ε) and their log-probabilities log π(a|s) (`[B]`)."""
        mean, log_std = self(obs)
        u = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(u), squashed_gaussian_log_prob(u, mean, log_std)

    def numpy_act(
        self, obs: np.ndarray, explore: bool, rng: np.random.Generator, sde_draws: np.ndarray | None = None
    ) -> np.ndarray:
        """tanh of a sample (explore) or of the mean, as float32 NumPy actions; with gSDE the sample is
        μ + θᵀ z(s) for the noise matrices whose standard normal draws are `sde_draws` `[B, F, A]`."""
        if not hasattr(self, "_np"):
            self._np = compile_numpy((self.body,) if self.sde else (self.body, self.head))
        if self._np is not None:
            out = self._np(obs)[0]
        else:
            with torch.inference_mode():
                out = self.body(obs_tensor(obs, module_device(self)))
                out = host(out if self.sde else self.head(out))
        if self.noise is not None:
            features = out
            assert isinstance(self.head, nn.Linear)  # gSDE: never a user's whole actor
            weight, bias = host(self.head.weight), host(self.head.bias)
            mean = np.clip(features @ weight.T + bias, -SDE_MEAN_CLIP, SDE_MEAN_CLIP)
            if explore:
                assert sde_draws is not None  # exploring with gSDE: the algorithm's noise matrices
                mean = mean + self.noise.numpy_noise(features, sde_draws)
            return np.tanh(mean).astype(np.float32)
        mean = out[:, : self.act_dim]
        if explore:
            log_std = np.clip(out[:, self.act_dim :], *LOG_STD_RANGE)
            mean = mean + np.exp(log_std) * rng.standard_normal(mean.shape, dtype=np.float32)
        return np.tanh(mean).astype(np.float32)


class QEnsemble(nn.Module):
    """K critics Q_k(s, a), MLPs on [s, a], computed together: each layer is one batched matmul over k.

    `forward(obs, act)` returns `[K, B]`. Twin critics (TD3, SAC) cost one pass instead of two. With
    `detach=True` the weights are detached: gradients reach the actions (an actor's loss) but not the
    critics. Each member is initialised as an independent `nn.Linear` stack (PyTorch's default init). With
    `user.net`, each member has the user's network of its own (`encoders`), and its MLP takes those features beside
    the action; with `user.critic`, the members are the user's whole critics (`members`), called one after another.
    """

    def __init__(
        self,
        obs: Obs,
        act_dim: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        n: int = 2,
        user: UserNets | None = None,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
        if n < 1:
            raise ValueError(f"a critic ensemble needs n >= 1 members, got {n}")
        self.n = n
        self.activation = ACTIVATIONS[activation]()
        self.inputs = flat_inputs(obs)
        user = user or UserNets()
        critic_space = _space(obs, user.critic) if user.critic else None
        self.members = nn.ModuleList(
            [UserCritic(critic_space, _policy_space(act_dim), user.critic, user.critic_kwargs) for _ in range(n)]
            if critic_space is not None
            else []
        )
        own_encoders = user.net and not user.critic
        encoders = [UserNet(_space(obs, user.net), user.net, user.net_kwargs) for _ in range(n)] if own_encoders else []
        self.encoders = nn.ModuleList(encoders)
        features = encoders[0].out_dim if encoders else obs_size(obs)
        sizes = [] if user.critic else [features + act_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default: U(−1/√fan_in, 1/√fan_in) for both
            self.weights.append(nn.Parameter(torch.empty(n, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(n, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, act: torch.Tensor, detach: bool = False) -> torch.Tensor:
        if len(self.members):  # the user's whole critics, one after another
            return torch.stack([_call(member, (obs, act), detach) for member in self.members])
        if len(self.encoders):  # each critic's features of its own, beside the action
            with torch.set_grad_enabled(torch.is_grad_enabled() and not detach):
                features = torch.stack([encoder(obs) for encoder in self.encoders])
            h = torch.cat([features, act.unsqueeze(0).expand(self.n, *act.shape)], dim=-1)
        else:
            flat = self.inputs(obs) if self.inputs is not None else obs.reshape(obs_len(obs), -1).float()
            x = torch.cat([flat, act], dim=-1)
            h = x.unsqueeze(0).expand(self.n, *x.shape)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            if detach:
                w, b = w.detach(), b.detach()
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = self.activation(h)
        return h.squeeze(-1)


def _call(module: nn.Module, args: tuple[Any, ...], detach: bool) -> torch.Tensor:
    """`module(*args)`, with its parameters detached if `detach` (gradients reach the inputs, not the module)."""
    if not detach:
        out: torch.Tensor = module(*args)
        return out
    params = {name: p.detach() for name, p in module.named_parameters()}
    detached: torch.Tensor = torch.func.functional_call(module, params, args)
    return detached

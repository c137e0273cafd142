"""Heads that turn encoder features into a policy, a value, or action values, and gSDE's state-dependent noise.

Policies for every action space the on-policy agents take: categorical (`Discrete`), factorised categorical
(`MultiDiscrete`: one categorical per entry), Bernoulli (`MultiBinary`: one per bit) and diagonal Gaussian
(`Box`). The factorised ones sum log-probabilities and entropies over their factors, as `DiagGaussian` sums over
its dims.

Legal actions: a `Dict` observation with an `ACTION_MASK` entry (turn-based games) says which of a `Discrete`
action space's actions each observation allows; `action_mask_of` reads it and `masked_logits` takes the others out
of a categorical policy (`ActorCritic`) or of Q values (ε-greedy acting and the Q-learners' targets), for acting and
learning alike."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard, TypeVar, cast, overload

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlfleet.data.batch import Batch
from rlfleet.device import host
from rlfleet.nets.encoders import layer_init

ACTION_MASK = "action_mask"
"""The `Dict` observation entry that holds the legal actions, `[n]` of 0/1 (1: legal), PettingZoo's name for it."""
MASKED_LOGIT = -1e8
"""The logit (or Q value) of an illegal action: its probability is exactly 0 and nothing argmax-es to it, yet it stays
finite, so entropies, log-probabilities and their gradients do too (−inf gives 0 · −inf = NaN in an entropy, and
a float's lowest value overflows to −inf once two illegal log-probabilities are summed in a mean)."""
Logits = TypeVar("Logits", np.ndarray, torch.Tensor)


def has_action_mask(space: gym.Space[Any]) -> TypeGuard[gym.spaces.Dict]:
    """Observations of `space` carry their legal actions (a `Dict` with an `ACTION_MASK` entry)."""
    return isinstance(space, gym.spaces.Dict) and ACTION_MASK in space.spaces


@overload
def action_mask_of(obs: np.ndarray | Mapping[str, np.ndarray]) -> np.ndarray | None: ...
@overload
def action_mask_of(obs: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor | None: ...
@overload
def action_mask_of(obs: Batch) -> Any: ...
def action_mask_of(obs: Any) -> Any:
    """The legal actions of a batch of observations as a bool `[..., n]` array or tensor (as the observations are),
    or None when they carry none.

    A row with no legal action counts as all legal: an agent's last observation in a turn-based game (it lost, or
    the game ended on another's move) may allow nothing, and its values are never bootstrapped from, but a max or a
    softmax over no action at all would be −∞ or NaN."""
    if not isinstance(obs, Batch | Mapping) or ACTION_MASK not in obs:
        return None
    mask = obs[ACTION_MASK]
    if isinstance(mask, torch.Tensor):
        legal = mask != 0
        return legal | ~legal.any(-1, keepdim=True)
    legal = np.asarray(mask) != 0
    return legal | ~legal.any(-1, keepdims=True)


def masked_logits(logits: Logits, mask: Logits | None) -> Logits:
    """`[..., n]` logits (or Q values) with those of the actions `mask` (bool, from `action_mask_of`) leaves out
    set to `MASKED_LOGIT`; unchanged without a mask. A softmax over them is the policy restricted to the legal
    actions, an argmax or a max picks among those only, and no gradient reaches the illegal outputs."""
    if mask is None:
        return logits
    if isinstance(logits, torch.Tensor):
        assert isinstance(mask, torch.Tensor)  # masks come as the observations are, logits as the network is
        return logits.masked_fill(~mask, MASKED_LOGIT)
    return np.where(mask, logits, np.asarray(MASKED_LOGIT, dtype=logits.dtype))


class SoftmaxCategorical:
    """Categorical distribution over the last dim with probabilities softmax(logits): `logits` are the
    log-probabilities (normalised, as `torch.distributions.Categorical.logits`).

    Written out by hand, like `DiagGaussian`, because it is built on every forward pass: torch's Categorical
    normalises with logsumexp, a composite of about seven ops forward and as many backward, and broadcasts its
    arguments in Python; one log_softmax does the normalisation here (PPO's updates on CartPole-v1 ~14%
    faster). The values agree with torch's Categorical to float32 rounding (`tests/unit/test_nets.py`).
    """

    def __init__(self, logits: torch.Tensor):
        self.logits = torch.log_softmax(logits, dim=-1)

    @property
    def probs(self) -> torch.Tensor:
        return self.logits.exp()

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        """−Σ p log p (a log-probability of −inf counts as the float's lowest value, so 0 · log 0 = 0)."""
        logits = self.logits.clamp(min=torch.finfo(self.logits.dtype).min)
        return -(logits * self.probs).sum(-1)

    def sample(self) -> torch.Tensor:
        flat = self.probs.reshape(-1, self.logits.shape[-1])
        return torch.multinomial(flat, 1).reshape(self.logits.shape[:-1])

    @property
    def mode(self) -> torch.Tensor:
        return self.logits.argmax(-1)


class LogitsHead(nn.Module):
    """A linear layer of `n` logits with small initial weights, so that the first policy is near uniform, made into
    the subclass's `distribution`."""

    distribution: Callable[[torch.Tensor], Any]

    def __init__(self, in_dim: int, n: int):
        super().__init__()
        self.linear = layer_init(nn.Linear(in_dim, n), gain=0.01)

    def forward(self, features: torch.Tensor) -> Any:
        return self.distribution(self.linear(features))


class CategoricalHead(LogitsHead):
    """Logits for a discrete policy; with a bool `mask` of the legal actions, the policy over those only."""

    distribution = SoftmaxCategorical

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> SoftmaxCategorical:
        return SoftmaxCategorical(masked_logits(self.linear(features), mask))


class MultiCategorical:
    """Independent categoricals over `[..., K]` actions, factor k with `sizes[k]` choices; the logits of all
    factors side by side, `[..., sum(sizes)]`. Log-probabilities and entropies are summed over the factors."""

    def __init__(self, logits: torch.Tensor, sizes: list[int]):
        self.logits = logits
        self.sizes = sizes
        self.factors = [SoftmaxCategorical(part) for part in logits.split(sizes, dim=-1)]

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, sum(factor.log_prob(actions[..., k]) for k, factor in enumerate(self.factors)))

    def entropy(self) -> torch.Tensor:
        return cast(torch.Tensor, sum(factor.entropy() for factor in self.factors))

    def sample(self) -> torch.Tensor:
        return torch.stack([factor.sample() for factor in self.factors], dim=-1)

    @property
    def mode(self) -> torch.Tensor:
        return torch.stack([factor.mode for factor in self.factors], dim=-1)


class MultiCategoricalHead(LogitsHead):
    """Logits of a factorised categorical policy for `MultiDiscrete` actions, `sizes[k]` for factor k."""

    def __init__(self, in_dim: int, sizes: list[int]):
        super().__init__(in_dim, sum(int(n) for n in sizes))
        self.sizes = [int(n) for n in sizes]

    def distribution(self, logits: torch.Tensor) -> MultiCategorical:
        return MultiCategorical(logits, self.sizes)


class Bernoulli:
    """Independent bits `[..., K]` with P(bit = 1) = sigmoid(logits); log-probabilities and entropies summed over
    the bits."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return -F.binary_cross_entropy_with_logits(self.logits, actions.to(self.logits.dtype), reduction="none").sum(-1)

    def entropy(self) -> torch.Tensor:
        p = torch.sigmoid(self.logits)
        return F.binary_cross_entropy_with_logits(self.logits, p, reduction="none").sum(-1)

    def sample(self) -> torch.Tensor:
        return torch.bernoulli(torch.sigmoid(self.logits))

    @property
    def mode(self) -> torch.Tensor:
        return (self.logits > 0).to(self.logits.dtype)


class BernoulliHead(LogitsHead):
    """Logits of a Bernoulli policy for `MultiBinary` actions, one per bit."""

    distribution = Bernoulli


LOG_STDS = ("state_independent", "state_dependent", "softplus")
LOG_STD_RANGE = (-5.0, 2.0)  # clamp of a state-dependent log σ: σ from 0.007 to 7.4
MIN_VARIANCE = 1e-6  # floor of the softplus σ², so that log σ² stays finite when softplus underflows
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class DiagGaussian:
    """Diagonal Gaussian over `[..., A]` actions; log-probabilities and entropies sum over the A dims.

    Written out by hand (no `torch.distributions.Normal` and its argument checks) because it is built on
    every forward pass; `tests/unit/test_gaussian.py` checks it against `Normal`.
    """

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor, features: torch.Tensor | None = None):
        self.mean = mean
        self.log_std = log_std.expand_as(mean)
        self.std = self.log_std.exp()
        self.features = features
        """gSDE: the features z(s) the exploration noise is a function of (`SDEGaussianHead`); else None."""

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
        if self.log_std is not None:  # state-independent
            return self.log_std
        assert std_out is not None  # the σ layer's output
        if self.kind == "state_dependent":
            return std_out.clamp(*LOG_STD_RANGE)
        return 0.5 * (F.softplus(std_out) + MIN_VARIANCE).log()

    def forward(self, features: torch.Tensor) -> DiagGaussian:
        std_out = None if self.std_linear is None else self.std_linear(features)
        return DiagGaussian(self.mean(features), self.log_std_from(std_out))


SDE_LOG_STD_RANGE = (-20.0, 2.0)  # clamp of gSDE's log σ entries (Stable-Baselines3's LOG_STD_MIN/MAX)
SDE_EPSILON = 1e-6  # added to gSDE's variance Σ_j z_j² σ_ji² (as in Stable-Baselines3), so that its log is finite


class StateDependentNoise(nn.Module):
    """Generalized state-dependent exploration (gSDE, Raffin et al. 2021): noise that is a function of the state.

    The exploration noise of action dim i is ε_i(s) = Σ_j θ_ji z_j(s), linear in the policy's features z(s),
    with a noise matrix θ_ji ~ N(0, σ_ji²) that the algorithm draws anew only every `sde_sample_freq` steps:
    in between, the same state gets the same noise and nearby states similar noise, so exploration is smooth
    and consistent rather than white. σ is learned, one entry per feature and action dim (Stable-Baselines3's
    `full_std`), as log σ clamped to `SDE_LOG_STD_RANGE`.

    For a fresh θ the action is Gaussian with mean μ(s) and variance Σ_j z_j(s)² σ_ji² per dim: the
    distribution whose log-probabilities and entropy the losses use (`log_std_of`). The algorithms keep θ as
    standard normal draws ξ `[N, F, A]`, one matrix per env, and act with θ = σ ⊙ ξ for the current σ
    (`numpy_noise`).
    """

    def __init__(self, feature_dim: int, act_dim: int, init_std: float = 1.0):
        super().__init__()
        if init_std <= 0:
            raise ValueError(f"init_std must be positive, got {init_std}")
        self.feature_dim, self.act_dim = feature_dim, act_dim
        self.log_std = nn.Parameter(torch.full((feature_dim, act_dim), math.log(init_std)))

    def std(self) -> torch.Tensor:
        """σ, `[F, A]`."""
        return self.log_std.clamp(*SDE_LOG_STD_RANGE).exp()

    def log_std_of(self, features: torch.Tensor) -> torch.Tensor:
        """log of the action's std, ½ log(Σ_j z_j² σ_ji² + `SDE_EPSILON`), `[B, A]` for `[B, F]` features."""
        variance = features.pow(2) @ self.std().pow(2)
        return 0.5 * (variance + SDE_EPSILON).log()

    def numpy_log_std(self, features: np.ndarray) -> np.ndarray:
        """`log_std_of` in NumPy (acting)."""
        std = host(self.std())
        return (0.5 * np.log(np.square(features) @ np.square(std) + SDE_EPSILON)).astype(np.float32)

    def numpy_noise(self, features: np.ndarray, draws: np.ndarray) -> np.ndarray:
        """ε(s) = θᵀ z(s) per env: `[N, F]` features, `[N, F, A]` standard normal draws ξ, θ = σ ⊙ ξ; `[N, A]`."""
        theta = draws * host(self.std())
        return np.matmul(features[:, None, :], theta)[:, 0].astype(np.float32)

    def sample_draws(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """New standard normal draws ξ for `n` envs' noise matrices, `[n, F, A]` float32."""
        return rng.standard_normal((n, self.feature_dim, self.act_dim), dtype=np.float32)


class SDEGaussianHead(nn.Module):
    """Diagonal Gaussian policy that explores with gSDE (`StateDependentNoise`): a linear mean, as
    `GaussianHead`, and the std sqrt(Σ_j z_j² σ_ji²) of the features z, detached as in Stable-Baselines3's
    on-policy agents (`learn_features=False`: the noise shapes σ, not the features). `init_std` is σ of every
    entry at initialisation (Stable-Baselines3's exp(log_std_init)); the action std is then about
    init_std · |z(s)|."""

    kind = "sde"

    def __init__(self, in_dim: int, act_dim: int, init_std: float = 1.0, learn_features: bool = False):
        super().__init__()
        self.mean = layer_init(nn.Linear(in_dim, act_dim), gain=0.01)
        self.noise = StateDependentNoise(in_dim, act_dim, init_std)
        self.learn_features = learn_features

    def forward(self, features: torch.Tensor) -> DiagGaussian:
        z = features if self.learn_features else features.detach()
        return DiagGaussian(self.mean(features), self.noise.log_std_of(z), z)


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

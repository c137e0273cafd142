"""Acting: a policy's step (categorical, Gaussian, gSDE, recurrent), state and Q values of observations, ε-greedy and
uniform actions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from rlfleet.data.batch import obs_len, obs_tensor
from rlfleet.device import acting, host, module_device
from rlfleet.nets.fast import (
    discrete_actions,
    gaussian_log_prob,
    sample_gaussian,
)
from rlfleet.nets.heads import MultiCategoricalHead, SDEGaussianHead, masked_logits
from rlfleet.nets.models import ActorCritic, QNetwork


def epsilon_greedy(
    q: np.ndarray, eps: np.ndarray | float, rng: np.random.Generator, mask: np.ndarray | None = None
) -> np.ndarray:
    """Greedy actions from `[B, A]` values, each replaced by a uniform one with probability eps (per row); with
    a bool `[B, A]` `mask` of legal actions (`action_mask_of`), both the greedy and the uniform one among those.

    With eps 0 in every row (evaluation) nothing is drawn: evaluating, however often, never moves the
    exploration stream, so a run that evaluates once more (stopping at its time limit) explores on as one
    that did not."""
    actions: np.ndarray = masked_logits(q, mask).argmax(-1)
    if not np.any(eps):
        return actions
    batch, n_actions = q.shape
    explore = rng.random(batch) < eps
    if np.any(explore):
        if mask is None:
            uniform = rng.integers(n_actions, size=batch)
        else:  # the k-th legal action of each row, k uniform below the row's count of them (at least 1)
            legal = mask.sum(-1)
            k = np.minimum((rng.random(batch) * legal).astype(np.int64), legal - 1)  # u · n may round up to n
            uniform = (mask.cumsum(-1) > k[:, None]).argmax(-1)
        actions = np.where(explore, uniform, actions)
    return actions


def sample_final_epsilons(
    n: int, choices: Sequence[float], probs: Sequence[float], rng: np.random.Generator
) -> np.ndarray:
    """Per-actor final exploration rates, drawn as in the A3C paper ({0.1, 0.01, 0.5} w.p. {0.4, 0.3, 0.3})."""
    if len(choices) != len(probs) or not np.isclose(sum(probs), 1.0):
        raise ValueError(f"epsilon choices {choices} and probabilities {probs} must match and sum to 1")
    return rng.choice(np.asarray(choices, dtype=np.float64), size=n, p=np.asarray(probs, dtype=np.float64))


def policy_step(
    model: ActorCritic,
    obs: np.ndarray,
    explore: bool,
    rng: np.random.Generator,
    state: Any = None,
    sde_draws: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, Any]:
    """Act with an ActorCritic: (actions, log-probabilities, values or None, state), NumPy in and out.

    Feed-forward MLP policies run in NumPy (see `rlfleet.nets.fast`); CNN and LSTM ones in PyTorch
    (an LSTM one step from `state`, None meaning zeros; feed-forward models pass `state` through).
    Exploring samples the policy with `rng`; otherwise a categorical policy takes its most probable action
    (each factor of a factorised one its own, each bit of a Bernoulli one its likelier value) and a Gaussian
    its mean. Gaussian actions are float32 `[B, A]` in the policy's normalised space. A gSDE
    policy (`model.sde`) explores with the noise θᵀ z(s) of the noise matrices whose standard normal draws
    are `sde_draws` `[B, F, A]` (see `StateDependentNoise`).
    """
    model = acting(model)
    fast = model.numpy_forward(obs)
    if fast is not None:
        params, value = fast
    else:
        with torch.inference_mode():
            x = obs_tensor(obs, module_device(model))
            if model.core is None:
                dist, value_t = model(x)
            else:
                dist, value_t, state = model.unroll(x, state)
            if model.sde:
                params = (host(dist.mean), host(dist.log_std), host(dist.features))
            else:
                params = (host(dist.mean), host(dist.log_std)) if model.continuous else host(dist.logits)
            value = None if value_t is None else host(value_t)
    if model.continuous:
        mean, log_std = params[0], params[1]
        if explore and model.sde:
            assert sde_draws is not None, "an exploring gSDE policy acts with the draws of its noise matrices"
            noise = cast(SDEGaussianHead, model.policy).noise.numpy_noise(params[2], sde_draws)
            actions = (mean + noise).astype(np.float32)
            return actions, gaussian_log_prob(actions, mean, log_std), value, state
        if explore:
            return (*sample_gaussian(mean, log_std, rng), value, state)
        mean = mean.astype(np.float32)
        return mean, gaussian_log_prob(mean, mean, log_std), value, state
    kind = model.action_kind
    assert kind is not None  # ActorCritic refuses action spaces it has no policy for
    sizes = cast(MultiCategoricalHead, model.policy).sizes if kind == "multi_categorical" else None
    return (*discrete_actions(kind, params, explore, rng, sizes), value, state)


def state_values(model: ActorCritic, obs: np.ndarray, state: Any = None) -> np.ndarray:
    """V(obs) of an ActorCritic as a NumPy array (zeros without a critic); an LSTM one continues from `state`."""
    model = acting(model)
    if model.core is not None:
        if model.value_head is None:
            return np.zeros(obs_len(obs), dtype=np.float32)
        with torch.inference_mode():
            value = model.unroll(obs_tensor(obs, module_device(model)), state)[1]
            assert value is not None  # it has a value head
            return host(value)
    fast = model.numpy_forward(obs)
    if fast is not None:
        return fast[1] if fast[1] is not None else np.zeros(obs_len(obs), dtype=np.float32)
    with torch.inference_mode():
        return host(model.value(obs_tensor(obs, module_device(model))))


def q_values(model: QNetwork, obs: np.ndarray) -> np.ndarray:
    """Q(obs, ·) of a QNetwork as a NumPy array."""
    model = acting(model)
    fast = model.numpy_forward(obs)
    if fast is not None:
        return fast
    with torch.inference_mode():
        return host(model(obs_tensor(obs, module_device(model))))


def uniform_actions(n: int, act_dim: int, rng: np.random.Generator) -> np.ndarray:
    """`[n, act_dim]` float32 actions drawn uniformly from [-1, 1] (the warm-up of off-policy continuous agents)."""
    return rng.uniform(-1.0, 1.0, size=(n, act_dim)).astype(np.float32)

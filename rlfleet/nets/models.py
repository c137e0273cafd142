"""Complete networks built from an encoder, an optional LSTM core and heads: an actor-critic and a Q-network."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlfleet.data.batch import map_obs, obs_len
from rlfleet.device import module_device
from rlfleet.nets.encoders import Encoder, make_encoder
from rlfleet.nets.fast import NumpyMLP, compile_numpy
from rlfleet.nets.heads import (
    LOG_STD_RANGE,
    MIN_VARIANCE,
    BernoulliHead,
    CategoricalHead,
    DiagGaussian,
    DuelingQHead,
    GaussianHead,
    LogitsHead,
    MultiCategoricalHead,
    QHead,
    SDEGaussianHead,
    SoftmaxCategorical,
    ValueHead,
    action_mask_of,
    has_action_mask,
    masked_logits,
)
from rlfleet.nets.recurrent import LSTMCore, State
from rlfleet.nets.user import UserModule


def leading_dims(obs: Any, space: gym.Space) -> int:
    """How many batch dims a batch of observations of `space` has (`[B, ...]`: 1, `[T, B, ...]`: 2)."""
    if isinstance(space, gym.spaces.Dict):
        key = next(iter(space.spaces))
        return obs[key].dim() - len(space[key].shape or ())
    return obs.dim() - len(space.shape or ())


ACTION_KINDS = {
    gym.spaces.Discrete: "categorical",
    gym.spaces.MultiDiscrete: "multi_categorical",
    gym.spaces.MultiBinary: "bernoulli",
    gym.spaces.Box: "gaussian",
}


def _leading_shape(obs: Any) -> tuple[int, int]:
    """(T, B) of `[T, B, ...]` observations (a dict's: of its entries)."""
    first = obs if isinstance(obs, torch.Tensor) else next(iter(obs.values()))
    return first.shape[0], first.shape[1]


def torch_default_init(model: nn.Module) -> None:
    """PyTorch's own initialisation for every linear, convolutional and LSTM layer instead of the orthogonal one
    (Stable-Baselines3's `ortho_init=False`). σ keeps `init_std`: the state-independent log σ and gSDE's are
    parameters of their own, and a σ layer (`GaussianHead.std_linear`) keeps its initialisation, whose bias
    carries it."""
    keep = {id(m.std_linear) for m in model.modules() if isinstance(m, GaussianHead) and m.std_linear is not None}
    keep |= {
        id(m) for user in model.modules() if isinstance(user, UserModule) for m in user.modules()
    }  # the user's own
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Conv2d | nn.LSTMCell) and id(module) not in keep:
            module.reset_parameters()


class ActorCritic(nn.Module):
    """A policy and a state value over a feed-forward or recurrent trunk.

    The policy is categorical for a `Discrete` action space (or an int: the number of actions), factorised
    categorical for a 1-D `MultiDiscrete` one, Bernoulli for a 1-D `MultiBinary` one (`action_kind` says which),
    and a diagonal Gaussian (`GaussianHead`, with `log_std` and `init_std`; with `sde`, a `SDEGaussianHead` that
    explores with gSDE, its σ entries starting at `init_std`) for a 1-D `Box`. Vector
    observations get separate actor and critic encoders unless `shared`; images share one CNN. With
    `lstm` > 0, one encoder and an `LSTMCore` of that many cells feed both heads: call `unroll` with the
    recurrent state instead of `forward`. The layers are initialised orthogonally (the LSTM core keeps PyTorch's
    default, as sb3-contrib's RecurrentPPO); `ortho_init=False` gives them PyTorch's default initialisation
    (`torch_default_init`). With `net` (`package.module:factory`), the user's
    network is the encoder (`UserNet`, built with `net_kwargs`), left as its factory initialised it.

    Observations that carry their legal actions (`has_action_mask`; a categorical policy only) get the policy
    over those: every pass, PyTorch or NumPy, masks the logits (`masked_logits`), so acting, the log-probabilities
    it records and the losses all see the same restricted policy.
    """

    def __init__(
        self,
        obs_space: gym.Space,
        action_space: gym.Space | int,
        encoder: str = "auto",
        hidden: Sequence[int] = (64, 64),
        activation: str = "tanh",
        shared: bool = False,
        critic: bool = True,
        log_std: str = "state_independent",
        init_std: float = 1.0,
        lstm: int = 0,
        sde: bool = False,
        ortho_init: bool = True,
        net: str = "",
        net_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__()
        if isinstance(action_space, int):
            action_space = gym.spaces.Discrete(action_space)
        self.action_kind = ACTION_KINDS.get(type(action_space))
        if self.action_kind is None or (self.action_kind != "categorical" and len(action_space.shape or ()) != 1):
            raise ValueError(
                f"the policy heads take Discrete, 1-D MultiDiscrete, 1-D MultiBinary and 1-D Box actions, "
                f"not {action_space}"
            )
        self.masked = has_action_mask(obs_space)
        if self.masked and self.action_kind != "categorical":
            raise ValueError(f"the observations' legal-action mask is for Discrete actions, not {action_space}")
        self.obs_space = obs_space
        self.actor_body = make_encoder(obs_space, encoder, hidden, activation, net, net_kwargs)
        features = self.actor_body.out_dim
        self.core: LSTMCore | None = None
        if lstm > 0:
            self.core = LSTMCore(features, lstm)
            features, shared = lstm, True
        self.continuous = isinstance(action_space, gym.spaces.Box)
        if sde and not self.continuous:
            raise ValueError(f"sde (state-dependent exploration) needs Box actions, not {action_space}")
        self.sde = sde
        self.policy: SDEGaussianHead | GaussianHead | LogitsHead
        if isinstance(action_space, gym.spaces.Box):
            act_dim = int(np.prod(action_space.shape))
            if sde:
                self.policy = SDEGaussianHead(features, act_dim, init_std)
            else:
                self.policy = GaussianHead(features, act_dim, log_std, init_std)
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            self.policy = MultiCategoricalHead(features, list(action_space.nvec))
        elif isinstance(action_space, gym.spaces.MultiBinary):
            self.policy = BernoulliHead(features, int(cast(int, action_space.n)))  # 1-D: n is the number of bits
        else:
            self.policy = CategoricalHead(features, int(cast(gym.spaces.Discrete, action_space).n))
        self.shared = shared
        self.critic_body: Encoder | None = None
        self.value_head: ValueHead | None = None
        if critic:
            if not shared:
                self.critic_body = make_encoder(obs_space, encoder, hidden, activation, net, net_kwargs)
            self.value_head = ValueHead(features)
        if not ortho_init:
            torch_default_init(self)

    def forward(self, obs: Any) -> tuple[SoftmaxCategorical | DiagGaussian, torch.Tensor | None]:
        if self.core is not None:
            raise ValueError("this ActorCritic has an LSTM core: call unroll(obs, state, starts)")
        features = self.actor_body(obs)
        dist = self._policy(features, obs)
        if self.value_head is None:
            return dist, None
        critic_features = features if self.critic_body is None else self.critic_body(obs)
        return dist, self.value_head(critic_features)

    def unroll(
        self, obs: torch.Tensor, state: State | None, starts: torch.Tensor | None = None
    ) -> tuple[SoftmaxCategorical | DiagGaussian, torch.Tensor | None, State]:
        """Run the LSTM trunk over `[T, B, ...]` observations (or one step of `[B, ...]`).

        `state` is the state before the first step (None: zeros); `starts[t, b]` = 1 zeroes it before
        step t (an episode begins there). The policy and values are over the `T * B` steps, time-major
        (row t * B + b); the state after the last step comes back for the next call.
        """
        if self.core is None:
            raise ValueError("unroll needs an ActorCritic with an LSTM core (lstm > 0)")
        if leading_dims(obs, self.obs_space) == 1:
            obs = map_obs(lambda x: x.unsqueeze(0), obs)
            starts = None if starts is None else starts.unsqueeze(0)
        steps, batch = _leading_shape(obs)
        if state is None:
            state = self.core.initial_state(batch)
        features = self.actor_body(map_obs(lambda x: x.reshape(steps * batch, *x.shape[2:]), obs))
        out, state = self.core(features.reshape(steps, batch, -1), state, starts)
        out = out.reshape(steps * batch, -1)
        value = None if self.value_head is None else self.value_head(out)
        return self._policy(out, obs), value, state

    def _policy(self, features: torch.Tensor, obs: Any) -> Any:
        """The policy of `[B, F]` features, over the legal actions of the observations (any leading dims, B in
        all) that carry them."""
        if not self.masked:
            return self.policy(features)
        mask = action_mask_of(obs)
        mask = None if mask is None else mask.reshape(features.shape[0], -1)
        return cast(CategoricalHead, self.policy)(features, mask)

    def numpy_forward(self, obs: np.ndarray) -> tuple[Any, np.ndarray | None] | None:
        """(policy parameters, values) computed in NumPy for MLP bodies (fast acting), or None otherwise.

        The policy parameters are the logits for a categorical policy, `(mean, log_std)` for a Gaussian and
        `(mean, log_std, features)` for a gSDE one (its noise is a function of the features).
        """
        if not hasattr(self, "_np"):
            self._np = self._compile_numpy()
        if self._np is None:
            return None
        out = self._np(obs)
        value = out.pop()[:, 0] if self.value_head is not None else None
        if not self.continuous:
            return (masked_logits(out[0], action_mask_of(obs)) if self.masked else out[0]), value
        policy = self.policy
        if isinstance(policy, SDEGaussianHead):  # the branch gives the features; the mean and std are functions of them
            features = out[0]
            mean = features @ policy.mean.weight.detach().numpy().T + policy.mean.bias.detach().numpy()
            return (mean, policy.noise.numpy_log_std(features), features), value
        assert isinstance(policy, GaussianHead)  # continuous
        mean = out[0]
        if policy.log_std is not None:  # state-independent
            log_std = np.broadcast_to(policy.log_std.detach().numpy(), mean.shape)
        elif policy.kind == "state_dependent":
            log_std = np.clip(out[1], *LOG_STD_RANGE)
        else:
            log_std = 0.5 * np.log(np.logaddexp(0.0, out[1]) + MIN_VARIANCE)
        return (mean, log_std), value

    def _compile_numpy(self) -> NumpyMLP | None:
        if self.core is not None:
            return None
        policy = self.policy
        branches: list[tuple[nn.Module, ...]]
        if isinstance(policy, SDEGaussianHead):
            branches = [(self.actor_body,)]
        elif isinstance(policy, GaussianHead):
            branches = [(self.actor_body, policy.mean)]
            if policy.std_linear is not None:
                branches.append((self.actor_body, policy.std_linear))
        else:
            branches = [(self.actor_body, policy.linear)]
        if self.value_head is not None:
            critic_body = self.critic_body if self.critic_body is not None else self.actor_body
            branches.append((critic_body, self.value_head.linear))
        return compile_numpy(*branches)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.value_head is None:
            return torch.zeros(obs_len(obs), device=module_device(self))
        if self.core is not None:
            raise ValueError("this ActorCritic has an LSTM core: its values come from unroll(obs, state, starts)")
        body = self.actor_body if self.critic_body is None else self.critic_body
        return self.value_head(body(obs))


class QNetwork(nn.Module):
    """Q(s, ·) for discrete actions, optionally with a dueling head.

    With `lstm` > 0 an `LSTMCore` of that many cells sits between the encoder and the head: call `unroll`
    with the recurrent state instead of `forward`. With `net`, the user's network (`UserNet`) is the encoder.
    """

    def __init__(
        self,
        obs_space: gym.Space,
        n_actions: int,
        encoder: str = "auto",
        hidden: Sequence[int] = (128, 128),
        activation: str = "relu",
        dueling: bool = False,
        lstm: int = 0,
        net: str = "",
        net_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__()
        self.obs_space = obs_space
        self.body = make_encoder(obs_space, encoder, hidden, activation, net, net_kwargs)
        self.core: LSTMCore | None = LSTMCore(self.body.out_dim, lstm) if lstm > 0 else None
        head = DuelingQHead if dueling else QHead
        self.head = head(self.body.out_dim if self.core is None else lstm, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.core is not None:
            raise ValueError("this QNetwork has an LSTM core: call unroll(obs, state, starts)")
        return self.head(self.body(obs))

    def unroll(
        self, obs: torch.Tensor, state: State | None, starts: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, State]:
        """Q over `[T, B, ...]` observations from `state` (None: zeros), `[T, B, A]`, and the state after every
        step, `(h, c)` each `[T, B, H]`; `starts[t, b]` = 1 zeroes the state before step t. One step of
        `[B, ...]` observations gives `[B, A]` and the next state, `[B, H]` each."""
        if self.core is None:
            raise ValueError("unroll needs a QNetwork with an LSTM core (lstm > 0)")
        single = leading_dims(obs, self.obs_space) == 1
        if single:
            obs = map_obs(lambda x: x.unsqueeze(0), obs)
            starts = None if starts is None else starts.unsqueeze(0)
        steps, batch = _leading_shape(obs)
        if state is None:
            state = self.core.initial_state(batch)
        flat = map_obs(lambda x: x.reshape(steps * batch, *x.shape[2:]), obs)
        features = self.body(flat).reshape(steps, batch, -1)
        hs, cs = self.core.states(features, state, starts)
        q = self.head(hs.reshape(steps * batch, -1)).reshape(steps, batch, -1)
        return (q[0], (hs[0], cs[0])) if single else (q, (hs, cs))

    def numpy_forward(self, obs: np.ndarray) -> np.ndarray | None:
        """Q(s, ·) computed in NumPy for MLP bodies (fast acting), or None for other encoders and LSTM cores."""
        if self.core is not None:
            return None
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

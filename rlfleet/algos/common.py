"""Small functions the algorithms share: space checks, acting with an ActorCritic (categorical, Gaussian, LSTM),
action rescaling, recurrent batches, optimisation step, ε-greedy, schedules, target sync (hard and Polyak)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.optim.optimizer as _torch_optimizer
from torch import nn

from rlfleet.data.batch import Batch, map_obs, obs_len
from rlfleet.data.buffer import PrioritizedReplayBuffer, ReplayBuffer
from rlfleet.device import acting, host, module_device, note_step
from rlfleet.envs.wrappers import has_action_start
from rlfleet.fields import MAX_ENVS, bounded
from rlfleet.nets.fast import (
    discrete_actions,
    gaussian_log_prob,
    sample_gaussian,
)
from rlfleet.nets.recurrent import LSTMCore


@dataclass
class SDEOptions:
    """The gSDE fields of the on-policy algorithms' `Config`s (a2c, ppo)."""

    sde: bool = False
    """Box actions: explore with generalized state-dependent exploration (gSDE, Raffin et al. 2021) instead of
    independent Gaussian noise: the noise is a function of the policy's features, θᵀ z(s), with the matrix θ
    drawn anew every `sde_sample_freq` steps (see `StateDependentNoise`); `log_std` is then unused and
    `init_std` is σ of each entry of θ."""
    sde_sample_freq: int = bounded(-1, ge=-1)
    """gSDE: steps between new noise matrices; -1 or 0: only at the start of each rollout."""


@dataclass
class ReplayOptions:
    """The replay-loop fields the continuous off-policy algorithms' `Config`s share (ddpg, td3, sac)."""

    n_envs: int = bounded(1, ge=1, le=MAX_ENVS)
    """Parallel envs stepped in lockstep by one process."""
    buffer_size: int = bounded(100_000, ge=1)
    """Replay capacity in transitions."""
    batch_size: int = bounded(64, ge=1)
    """Minibatch size."""
    learning_starts: int = bounded(1_000, ge=0)
    """Env steps collected before the first update."""
    random_steps: int = bounded(1_000, ge=0)
    """Env steps of uniformly random actions at the start (exploration warm-up)."""
    train_freq: int = bounded(1, ge=1)
    """Vector-env steps between training phases."""
    gradient_steps: int = bounded(1, ge=1)
    """Gradient steps per training phase."""
    gamma: float = bounded(0.98, ge=0, le=1)
    """Discount factor."""
    n_step: int = bounded(1, ge=1)
    """Steps of real reward before bootstrapping."""


@dataclass
class PriorityOptions:
    """Prioritized replay's fields (dqn, ddpg, td3). The `apex` architecture's replay is always prioritized and
    reads `alpha` and `beta` from here."""

    prioritized: bool = False
    """Prioritized replay (proportional, Schaul et al. 2016): transitions drawn in proportion to |TD error|^α,
    the loss weighted by importance weights."""
    alpha: float = bounded(0.6, ge=0)
    """Priority exponent."""
    beta: float = bounded(0.4, ge=0, le=1)
    """Importance-sampling exponent: its value at the start, annealed to 1 over the run if `beta_anneal`."""
    beta_anneal: bool = True
    """Anneal β linearly from `beta` to 1 over the run (Schaul et al.); False: β stays `beta` (Ape-X, Horgan et
    al. 2018, and the `apex` presets)."""


def make_replay_buffer(cfg, n_envs: int, total_steps: int, seed: int = 0) -> ReplayBuffer:
    """The n-step replay of a `ReplayOptions` + `PriorityOptions` config: prioritized (β annealed to 1 over the
    run's updates if `cfg.beta_anneal`) when `cfg.prioritized`, uniform otherwise."""
    common = dict(capacity=cfg.buffer_size, n_envs=n_envs, n_step=cfg.n_step, gamma=cfg.gamma, seed=seed)
    if not cfg.prioritized:
        return ReplayBuffer(**common)
    updates = max(1, (total_steps - cfg.learning_starts) // (cfg.train_freq * n_envs))
    anneal = updates * cfg.gradient_steps if cfg.beta_anneal else 0  # 0: β stays `beta`
    return PrioritizedReplayBuffer(**common, alpha=cfg.alpha, beta=cfg.beta, beta_final=1.0, beta_anneal_steps=anneal)


class UnsupportedSpaceError(ValueError):
    """An algorithm was given an action or observation space it cannot handle."""


DISCRETE_ACTIONS = ("Discrete",)
BOX_ACTIONS = ("Box",)
POLICY_ACTIONS = ("Discrete", "MultiDiscrete", "MultiBinary", "Box")
"""The action spaces the policy-gradient family takes (pg, a2c, a3c, ppo): categorical, factorised categorical,
Bernoulli and Gaussian policies."""
OBSERVATION_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple")
"""The observation spaces every algorithm takes (`rlfleet.nets.encoders`)."""
_ACTION_WORDS = {DISCRETE_ACTIONS: "discrete (Discrete)", BOX_ACTIONS: "continuous (1-D Box)"}


def check_action_space(action_space: gym.Space, algo: str, kinds: Sequence[str]) -> gym.Space:
    """The space itself if it is one of `kinds` (names of Gymnasium spaces; `MultiDiscrete`, `MultiBinary` and `Box`
    1-D, a `Box` of floats); otherwise an `UnsupportedSpaceError` naming the algorithm, the space and the
    algorithms that take it."""
    kind = type(action_space).__name__
    if kind not in kinds:
        words = _ACTION_WORDS.get(tuple(kinds), ", ".join(kinds[:-1]) + f" or 1-D {kinds[-1]}")
        takers = algorithms_taking(kind)
        hint = f"algorithms for {kind} actions: {', '.join(takers)}" if takers else "no algorithm takes it"
        raise UnsupportedSpaceError(
            f"algorithm {algo!r} takes {words} actions, but the env has {action_space}; {hint} (see `rlfleet spaces`)"
        )
    if kind != "Discrete" and len(action_space.shape) != 1:
        raise UnsupportedSpaceError(f"algorithm {algo!r} takes 1-D {kind} actions, but the env has {action_space}")
    if kind == "Box" and not np.issubdtype(action_space.dtype, np.floating):
        raise UnsupportedSpaceError(f"algorithm {algo!r} needs float Box actions, got {action_space}")
    if has_action_start(action_space):
        raise UnsupportedSpaceError(
            f"algorithm {algo!r} takes actions that start at 0, but the env has {action_space}: wrap it in "
            "rlfleet.envs.wrappers.ZeroBasedActions (rlfleet's make_env does)"
        )
    return action_space


def algorithms_taking(kind: str) -> list[str]:
    """The registered algorithms whose `action_spaces` hold the space named `kind`."""
    from rlfleet.algos import REGISTRY, resolve

    return [name for name in sorted(REGISTRY) if kind in resolve(name)[0].action_spaces]


class ActionBounds:
    """Maps a Gaussian policy's actions to a Box env's actions: [-1, 1] ↦ [low, high], then clip.

    The policy learns in a normalised space: its mean starts near 0 (the middle of the bounds) and σ is
    in units of half the range, whatever the env's scale. Sampled actions are left unclipped for the
    log-probability (algorithms store them as the `raw_act` extra); only the env sees
    `clip(offset + scale · raw, low, high)`. A dimension with an infinite bound is not rescaled (scale 1,
    offset 0) and is clipped only on its finite side.
    """

    def __init__(self, space: gym.spaces.Box):
        low = np.asarray(space.low, dtype=np.float64)
        high = np.asarray(space.high, dtype=np.float64)
        finite = np.isfinite(low) & np.isfinite(high)
        self.low, self.high = low.astype(np.float32), high.astype(np.float32)
        low, high = np.where(finite, low, -1.0), np.where(finite, high, 1.0)
        self.scale = ((high - low) / 2).astype(np.float32)
        self.offset = ((high + low) / 2).astype(np.float32)

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        return np.clip(raw * self.scale + self.offset, self.low, self.high).astype(np.float32)

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        """The inverse map, env actions ↦ the policy's space (a replay buffer holds what the env was given)."""
        return ((actions - self.offset) / self.scale).astype(np.float32)


def action_bounds(action_space: gym.Space) -> ActionBounds | None:
    """An `ActionBounds` for a Box action space, None for a discrete one."""
    return ActionBounds(action_space) if isinstance(action_space, gym.spaces.Box) else None


def to_env_actions(actions: np.ndarray, extras: dict, bounds: ActionBounds | None) -> np.ndarray:
    """The actions to step the env with; for a Box space the policy's own actions go into `extras["raw_act"]`."""
    if bounds is None:
        return actions
    extras["raw_act"] = actions
    return bounds(actions)


def policy_actions(data: Batch) -> np.ndarray:
    """The actions a rollout's policy took, in the policy's space (`raw_act` for Box, else `act`)."""
    return data.raw_act if "raw_act" in data else data.act


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
    name: str, params: Iterable[nn.Parameter] | Iterable[dict], lr: float, **kwargs
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


def optimize(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    params: Sequence[nn.Parameter],
    max_grad_norm: float | None,
) -> float:
    """zero_grad, backward, the optimizer's gradient hook if it has one (`set_gradient_hook`), clip the global
    gradient norm (if > 0), step; returns the pre-clip norm.

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
    return float(norm)


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


def minibatch_epochs(
    algo, batch, epochs: int, minibatch_size: int, rng: np.random.Generator, stop_kl: float | None = None
) -> dict[str, float]:
    """`epochs` shuffled passes of `algo.loss` + optimiser step over minibatches; mean metrics of the steps taken,
    and `epochs`, the passes made (fractional when stopped). With `stop_kl`, the passes end at the first minibatch
    whose `approx_kl` metric exceeds it, before that minibatch's step."""
    totals: dict[str, float] = {}
    steps = 0
    if algo.device.type != "cpu":  # on the learner's device once; minibatches are slices of it there
        batch = batch.to_torch(algo.device)

    def summary(passes: float) -> dict[str, float]:
        return {**{k: v / max(steps, 1) for k, v in totals.items()}, "epochs": passes}

    for epoch in range(epochs):
        minibatches = list(batch.split(minibatch_size, shuffle=True, rng=rng))
        for i, minibatch in enumerate(minibatches):
            loss, metrics = algo.loss(minibatch)
            if stop_kl is not None and metrics["approx_kl"] > stop_kl:
                return summary(epoch + i / len(minibatches))
            metrics["grad_norm"] = optimize(algo.optimizer, loss, algo.params, algo.cfg.max_grad_norm)
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + v
            steps += 1
    return summary(float(epochs))


def explained_variance(predicted: np.ndarray | torch.Tensor, target: np.ndarray | torch.Tensor) -> float:
    """1 − Var(target − predicted) / Var(target): 1 for perfect values, 0 for a constant, below 0 for worse; NaN
    when the targets do not vary."""
    predicted, target = (
        np.asarray(host(x) if isinstance(x, torch.Tensor) else x, np.float64) for x in (predicted, target)
    )
    variance = np.var(target)
    return float("nan") if variance == 0 else float(1 - np.var(target - predicted) / variance)


def clip_norm(algo) -> float:
    """The global gradient-norm clip of an algorithm's own update (0: none): the contract's `max_grad_norm`."""
    return algo.cfg.max_grad_norm


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def linear(start: float, end: float, duration: int, t: int) -> float:
    """Linear interpolation from start to end over `duration` steps, then constant."""
    if duration <= 0:
        return end
    return start + (end - start) * min(1.0, t / duration)


def epsilon_greedy(q: np.ndarray, eps: np.ndarray | float, rng: np.random.Generator) -> np.ndarray:
    """Greedy actions from `[B, A]` values, each replaced by a uniform one with probability eps (per row).

    With eps 0 in every row (evaluation) nothing is drawn: evaluating, however often, never moves the
    exploration stream, so a run that evaluates once more (stopping at its time limit) explores on as one
    that did not."""
    actions = q.argmax(-1)
    if not np.any(eps):
        return actions
    batch, n_actions = q.shape
    explore = rng.random(batch) < eps
    if explore.any():
        actions = np.where(explore, rng.integers(n_actions, size=batch), actions)
    return actions


def sample_final_epsilons(
    n: int, choices: Sequence[float], probs: Sequence[float], rng: np.random.Generator
) -> np.ndarray:
    """Per-actor final exploration rates, drawn as in the A3C paper ({0.1, 0.01, 0.5} w.p. {0.4, 0.3, 0.3})."""
    if len(choices) != len(probs) or not np.isclose(sum(probs), 1.0):
        raise ValueError(f"epsilon choices {choices} and probabilities {probs} must match and sum to 1")
    return rng.choice(np.asarray(choices, dtype=np.float64), size=n, p=np.asarray(probs, dtype=np.float64))


def policy_step(model, obs: np.ndarray, explore: bool, rng: np.random.Generator, state=None, sde_draws=None):
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
            actions = (mean + model.policy.noise.numpy_noise(params[2], sde_draws)).astype(np.float32)
            return actions, gaussian_log_prob(actions, mean, log_std), value, state
        if explore:
            return (*sample_gaussian(mean, log_std, rng), value, state)
        mean = mean.astype(np.float32)
        return mean, gaussian_log_prob(mean, mean, log_std), value, state
    sizes = model.policy.sizes if model.action_kind == "multi_categorical" else None
    return (*discrete_actions(model.action_kind, params, explore, rng, sizes), value, state)


def state_values(model, obs: np.ndarray, state=None) -> np.ndarray:
    """V(obs) of an ActorCritic as a NumPy array (zeros without a critic); an LSTM one continues from `state`."""
    model = acting(model)
    if model.core is not None:
        if model.value_head is None:
            return np.zeros(obs_len(obs), dtype=np.float32)
        with torch.inference_mode():
            return host(model.unroll(obs_tensor(obs, module_device(model)), state)[1])
    fast = model.numpy_forward(obs)
    if fast is not None:
        return fast[1] if fast[1] is not None else np.zeros(obs_len(obs), dtype=np.float32)
    with torch.inference_mode():
        return host(model.value(obs_tensor(obs, module_device(model))))


def sequence_batch(batch: Batch, starts: np.ndarray, initial_state, core: LSTMCore) -> Batch:
    """A `[T, N, ...]` segment batch as N sequences for an LSTM policy to replay.

    Every leaf becomes `[N, T, ...]`, so splitting the Batch splits whole sequences; `starts` (1 where an
    episode begins) and the state before the segment, `h0`/`c0` `[N, H]` (zeros when `initial_state` is
    None: the run's first segment), go with them.
    """
    n = starts.shape[1]
    out = batch.apply(lambda leaf: leaf.swapaxes(0, 1))
    h, c = initial_state if initial_state is not None else core.initial_state(n)
    out["starts"] = starts.swapaxes(0, 1)
    out["h0"], out["c0"] = host(h), host(c)
    return out


def unroll_sequences(model, b: Batch):
    """Replay a (torch) `sequence_batch` through an LSTM ActorCritic.

    Returns (policy, values, steps): the policy and values over the T * N steps, time-major, and a Batch
    of the other `[N, T, ...]` leaves flattened in the same order.
    """

    def time_major(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)

    dist, value, _ = model.unroll(map_obs(time_major, b.obs), (b.h0, b.c0), time_major(b.starts))
    rest = Batch({k: v for k, v in b.items() if k not in ("obs", "starts", "h0", "c0")})
    steps = rest.apply(lambda x: time_major(x).reshape(-1, *x.shape[2:]))
    return dist, value, steps


def q_values(model, obs: np.ndarray) -> np.ndarray:
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


def hard_update(target: nn.Module, source: nn.Module) -> None:
    target.load_state_dict(source.state_dict())


class SyncClock(nn.Module):
    """When a target network was last copied, on the global step clock: `due(step)` is True once for every
    multiple of `every` that `step` has reached since the last copy. The step lives in a module buffer, so an
    architecture shares or copies it exactly as it does the target network (hogwild: one clock for all
    workers, as there is one target network; so the copies follow the global step, not each worker's)."""

    def __init__(self, every: int):
        super().__init__()
        self.every = every
        self.register_buffer("synced_at", torch.zeros((), dtype=torch.int64))

    def due(self, step: int) -> bool:
        mark = step if self.every <= 0 else step // self.every * self.every
        if mark <= int(self.synced_at) and self.every > 0:
            return False
        self.synced_at.fill_(mark)
        return True


def soft_update(target: Sequence[torch.Tensor], source: Sequence[torch.Tensor], tau: float) -> None:
    """Polyak averaging of target parameters toward the online ones: θ' ← (1 − τ) θ' + τ θ, in one fused op."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target), list(source), tau)


def obs_tensor(
    obs: np.ndarray | dict[str, np.ndarray], device: torch.device | str = "cpu"
) -> torch.Tensor | dict[str, torch.Tensor]:
    """A NumPy observation batch as a tensor on `device` (on the CPU a zero-copy view; floats as float32, images
    stay uint8); a dict of them for a dict one."""

    def tensor(x: np.ndarray) -> torch.Tensor:
        t = torch.as_tensor(x).to(device)
        return t.float() if t.dtype == torch.float64 else t

    return map_obs(tensor, obs)

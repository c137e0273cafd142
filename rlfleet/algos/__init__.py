"""The algorithm registry. Each algorithm lives in one module with a `Config` dataclass, `PRESETS`, and a class.

Every number field of a `Config` declares the values it allows where it is declared
(`gamma: float = bounded(0.99, ge=0, le=1)`, see `rlfleet.fields`); `rlfleet.run.config.build_algo_config`
checks type, finiteness and range of every field before a run starts.

The contract every algorithm class keeps (architectures call nothing else):

- `__init__(cfg, obs_space, action_space, seed, device="cpu")`; raises `UnsupportedSpaceError` for spaces it can't
  handle; puts its networks on `device` (`rlfleet.device.place`, before its optimizer is built) and keeps it as
  `device`: its updates move their batches there (`Batch.to_torch(self.device)`), and every tensor it makes in an
  update is made there; `act` goes through `rlfleet.device.acting` (a CPU copy of an MLP on a device) and brings
  results back with `rlfleet.device.host`;
- `act(obs, state=None, explore=True) -> (actions, extras, state)` batched over envs; `extras` is a dict
  of per-env arrays stored with the rollout (values, log-probabilities);
- `schedule(env_steps, total_steps)`: exploration, learning-rate and target-network schedules;
- `data`: "rollout" (on-policy segments) or "replay";
- rollout algorithms: `value(obs)` (bootstrap value), `process(segment) -> Batch`, `loss(batch)`,
  `update(segment) -> metrics`, and `one_gradient`: True when `update(segment)` is exactly one optimizer
  step on `loss(process(segment))` (the architectures that apply one gradient per segment, hogwild and
  grad_parallel, run only those), `lr` (the learning rate its schedule set) and `max_grad_norm` (the
  global-norm clip of its update, 0: none), which those architectures apply to their own optimizer; every
  optimizer step of `update` goes through `optimize(self.optimizer, ...)` (`rlfleet.algos.common`), which calls
  the gradient hook an architecture may set on that optimizer (`set_gradient_hook`) between the backward pass
  and the clip (the `allreduce` learners average their gradients there);
- replay algorithms: `make_buffer(n_envs, total_steps, seed)`, `loss(batch)`, `update(batch) -> metrics`
  (with "priorities" for prioritized replay);
- dataset (imitation) algorithms, run by the `offline` architecture: `process(demos) -> Batch` (a Batch of
  `obs` and env actions `act` as training data), `loss(batch)`, `update(minibatch) -> metrics` (one
  gradient step);
- `state_dict()` / `load_state_dict()`, plus `cfg`, `optimizer`, `params`.

Recurrent algorithms (`act` returns a state that is not None; state None means "zeros"):

- `reset_state(state, done) -> state`: a new state with the envs of the `[N]` bool mask `done` (their
  episode just ended) reset; the given state is not modified. Whoever steps envs calls it after every
  step in which an env finished (`Collector`, `evaluate`);
- `value(obs, state)`: the bootstrap value continued from `state`;
- `process(segment)` reads `segment.data.starts` (`[T, N]`, 1 where an observation begins an episode)
  and `segment.initial_state` (the state before the segment's first step; None: zeros).

Algorithms whose exploration noise has a state per env (Ornstein–Uhlenbeck noise): `reset_noise(done)` puts
the noise of the envs in the `[N]` bool mask `done` (their episode just ended) back at its start; the
`Collector` calls it after every step in which an env finished. The noise state is part of `state_dict()`.

Replay algorithms an `apex` actor runs (dqn, ddpg, td3): `priorities(batch) -> [B]` (the |TD errors| `update`
would write back, computed without learning: an actor's initial priorities) and `fix_exploration(level, share)
-> float` (act from then on with one rung of the exploration ladder: ε-greedy algorithms take ε = `level`,
noise-driven ones scale their noise by `share`, the rung over the ladder's top; returns the ε or σ used).

Box actions: `act` returns env-ready actions (rescaled to the bounds and clipped) and puts the policy's
own, unclipped sample into `extras["raw_act"]`, from which the loss takes its log-probabilities.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

# name -> (module, class, the variant: config overrides or the name of the module's dict of them[, name of the
# module's presets if not PRESETS])
REGISTRY: dict[str, tuple] = {
    "pg": ("rlfleet.algos.pg", "PG", {}),
    "a2c": ("rlfleet.algos.a2c", "A2C", {}),
    "ppo": ("rlfleet.algos.ppo", "PPO", {}),
    "dqn": ("rlfleet.algos.dqn", "DQN", {}),
    "onestep_q": ("rlfleet.algos.nstep_q", "NStepQ", {"target": "onestep_q"}),
    "sarsa": ("rlfleet.algos.nstep_q", "NStepQ", {"target": "sarsa"}),
    "nstep_q": ("rlfleet.algos.nstep_q", "NStepQ", {"target": "nstep_q"}),
    "bc": ("rlfleet.algos.bc", "BC", {}),
    "ddpg": ("rlfleet.algos.ddpg", "DDPG", {}),
    "td3": ("rlfleet.algos.td3", "TD3", {}),
    "sac": ("rlfleet.algos.sac", "SAC", {}),
    "a3c": ("rlfleet.algos.a2c", "A2C", "A3C_VARIANT", "A3C_PRESETS"),
}

# what `rlfleet list` says of a name that runs another's module (else the module docstring's first line)
SUMMARIES: dict[str, str] = {
    "a3c": "A3C: asynchronous advantage actor-critic (Mnih et al. 2016): a2c's loss on hogwild actor-learners "
    "(1 env per worker, 5-step segments, Shared RMSProp, annealed learning rate).",
    "onestep_q": "One-step Q-learning (Mnih et al. 2016, Algorithm 1): per-env ε from {0.1, 0.01, 0.5}, target net.",
    "sarsa": "One-step Sarsa (Mnih et al. 2016): the one-step target with the action taken next, per-env ε.",
    "nstep_q": "n-step Q-learning (Mnih et al. 2016, Algorithm S2): n-step returns on short segments, per-env ε.",
}
# the architecture an algorithm runs on when none is given
DEFAULT_ARCH: dict[str, str] = {"a3c": "hogwild", "bc": "offline"}


class UnknownAlgorithmError(ValueError):
    """The algorithm name is not registered."""


def algorithm_names() -> list[str]:
    return sorted(REGISTRY)


def resolve(name: str) -> tuple[type, type, dict[str, dict[str, Any]], dict[str, Any]]:
    """(algorithm class, Config class, PRESETS, variant overrides) for a registered name."""
    if name not in REGISTRY:
        raise UnknownAlgorithmError(f"unknown algorithm {name!r}; choose one of {', '.join(algorithm_names())}")
    module_name, cls_name, variant, *presets = REGISTRY[name]
    module = importlib.import_module(module_name)
    presets = getattr(module, presets[0] if presets else "PRESETS", {})
    variant = getattr(module, variant) if isinstance(variant, str) else variant
    return getattr(module, cls_name), module.Config, presets, dict(variant)


def summary(name: str) -> str:
    """One line on a registered algorithm, as `rlfleet list` shows it."""
    cls = resolve(name)[0]
    return SUMMARIES.get(name) or (importlib.import_module(cls.__module__).__doc__ or "").strip().splitlines()[0]


def config_fields(config_cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(config_cls)}

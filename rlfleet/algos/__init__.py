"""The algorithm registry. Each algorithm lives in one module with a `Config` dataclass, `PRESETS`, and a class.

The contract every algorithm class keeps (architectures call nothing else):

- `__init__(cfg, obs_space, action_space, seed)`; raises `UnsupportedSpaceError` for spaces it can't handle;
- `act(obs, state=None, explore=True) -> (actions, extras, state)` batched over envs; `extras` is a dict
  of per-env arrays stored with the rollout (values, log-probabilities);
- `schedule(env_steps, total_steps)`: exploration, learning-rate and target-network schedules;
- `data`: "rollout" (on-policy segments) or "replay";
- rollout algorithms: `value(obs)` (bootstrap value), `process(segment) -> Batch`, `loss(batch)`,
  `update(segment) -> metrics`;
- replay algorithms: `make_buffer(n_envs, total_steps, seed)`, `loss(batch)`, `update(batch) -> metrics`
  (with "priorities" for prioritized replay);
- `state_dict()` / `load_state_dict()`, plus `cfg`, `optimizer`, `params`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

# name -> (module, class, config overrides that define the variant)
REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "pg": ("rlfleet.algos.pg", "PG", {}),
    "a2c": ("rlfleet.algos.a2c", "A2C", {}),
    "ppo": ("rlfleet.algos.ppo", "PPO", {}),
    "dqn": ("rlfleet.algos.dqn", "DQN", {}),
    "onestep_q": ("rlfleet.algos.nstep_q", "NStepQ", {"target": "onestep_q"}),
    "sarsa": ("rlfleet.algos.nstep_q", "NStepQ", {"target": "sarsa"}),
    "nstep_q": ("rlfleet.algos.nstep_q", "NStepQ", {"target": "nstep_q"}),
}


class UnknownAlgorithmError(ValueError):
    """The algorithm name is not registered."""


def algorithm_names() -> list[str]:
    return sorted(REGISTRY)


def resolve(name: str) -> tuple[type, type, dict[str, dict[str, Any]], dict[str, Any]]:
    """(algorithm class, Config class, PRESETS, variant overrides) for a registered name."""
    if name not in REGISTRY:
        raise UnknownAlgorithmError(f"unknown algorithm {name!r}; choose one of {', '.join(algorithm_names())}")
    module_name, cls_name, variant = REGISTRY[name]
    module = importlib.import_module(module_name)
    return getattr(module, cls_name), module.Config, getattr(module, "PRESETS", {}), dict(variant)


def config_fields(config_cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(config_cls)}

"""The algorithm registry. Each algorithm lives in one module with a `Config` dataclass, `PRESETS`, and a class.

Every number field of a `Config` declares the values it allows where it is declared
(`gamma: float = bounded(0.99, ge=0, le=1)`, see `rlfleet.fields`); `rlfleet.run.config.build_algo_config`
checks type, finiteness and range of every field before a run starts.

The contract every algorithm class keeps (architectures call nothing else) is written as `typing.Protocol`s in
`rlfleet/algos/contract.py`: `RolloutAlgorithm`, `ReplayAlgorithm` or `DatasetAlgorithm` by its `data`, with
`ApexActor` and `Recurrent` where they apply.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

# name -> (module, class, the variant: config overrides or the name of the module's dict of them[, name of the
# module's presets if not PRESETS])
REGISTRY: dict[str, tuple[str, str, dict[str, Any] | str, *tuple[str, ...]]] = {
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


def resolve(name: str) -> tuple[type[Any], type, dict[str, dict[str, Any]], dict[str, Any]]:
    """(algorithm class, Config class, PRESETS, variant overrides) for a registered name."""
    if name not in REGISTRY:
        raise UnknownAlgorithmError(f"unknown algorithm {name!r}; choose one of {', '.join(algorithm_names())}")
    module_name, cls_name, variant, *presets_name = REGISTRY[name]
    module = importlib.import_module(module_name)
    presets = getattr(module, presets_name[0] if presets_name else "PRESETS", {})
    variant = getattr(module, variant) if isinstance(variant, str) else variant
    return getattr(module, cls_name), module.Config, presets, dict(variant)


def summary(name: str) -> str:
    """One line on a registered algorithm, as `rlfleet list` shows it."""
    cls = resolve(name)[0]
    return SUMMARIES.get(name) or (importlib.import_module(cls.__module__).__doc__ or "").strip().splitlines()[0]


def config_fields(config_cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(config_cls)}

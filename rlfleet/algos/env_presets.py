"""Per-env presets: tuned settings for named envs that the family presets do not serve, read from the data file
`env_presets.toml` beside this module.

The file holds one table per (algorithm, env id), `[td3."MountainCarContinuous-v0"]`, whose keys are fields of
the algorithm's `Config`. A run with no `--preset` whose env id matches an entry starts from that entry (over
the algorithm's defaults, not over a family preset); `--preset` picks another, and `--set` still overrides
single fields. The entries and what each was measured against are in docs/continuous_control.md.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import resources
from typing import Any

PRESETS_FILE = "env_presets.toml"


@functools.cache
def _table() -> dict[str, dict[str, dict[str, Any]]]:
    text = resources.files("rlfleet.algos").joinpath(PRESETS_FILE).read_text(encoding="utf-8")
    table = tomllib.loads(text)
    # TOML has arrays, the configs tuples (hidden sizes)
    return {
        algo: {
            env: {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()} for env, entry in envs.items()
        }
        for algo, envs in table.items()
    }


def env_id_of(env: str) -> str:
    """The id an entry is looked up by: the env string without a `module:` prefix (`pkg:Env-v0` -> `Env-v0`); a
    PettingZoo env's whole (`pettingzoo:mpe2.simple_spread_v3`: its prefix is what makes it one)."""
    return env if env.startswith("pettingzoo:") else env.split(":")[-1]


def env_preset(algo: str, env: str) -> dict[str, Any] | None:
    """The settings tuned for `algo` on `env` (a copy), or None when the table has no entry."""
    entry = _table().get(algo, {}).get(env_id_of(env))
    return None if entry is None else dict(entry)


def env_preset_names(algo: str) -> list[str]:
    """The env ids with an entry for `algo`, sorted."""
    return sorted(_table().get(algo, {}))


def all_env_presets() -> dict[str, list[str]]:
    """algorithm -> the env ids it has entries for (what `rlfleet list` shows)."""
    return {algo: sorted(envs) for algo, envs in sorted(_table().items())}


def describe(algo: str, env: str, settings: dict[str, Any]) -> str:
    """The line a run prints at its start: `preset for ENV: algo with key=value, ...`."""
    shown = ", ".join(f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in settings.items())
    return f"preset for {env_id_of(env)}: {algo} with {shown} (--preset default: the algorithm's own defaults)"

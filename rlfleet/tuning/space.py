"""A sweep's search space: `--search NAME=DIST(ARGS)` items, parsed and checked against the field each one sets.

    lr=loguniform(1e-4,1e-2)      a float field, drawn log-uniformly between the ends
    ent_coef=uniform(0,0.02)      a float field, drawn uniformly
    rollout_len=randint(32,256)   an int field, drawn uniformly from the ends, both included
    gamma=choice(0.99,0.995)      any field: one of the values, each typed as --set types it
    env_kwargs.KEY=choice(...)    an entry of --env-kwargs (typed as --env-kwargs types it)

NAME is a field of the algorithm's `Config` (`--set`), a run option (`seed`, `steps`, `n_envs`, ...; as
`rlfleet train --help` lists them, underscores for dashes), an option of the run's architecture (`workers`), or
`env_kwargs.KEY`. Every value a distribution can draw (both ends of a range, every choice) is checked against the
field's declared type and range before anything runs: `lr=uniform(-1,1)` is one line naming `lr`'s range.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from typing import Any

from rlfleet.algos import config_fields, resolve
from rlfleet.envs.kwargs import parse_env_value
from rlfleet.fields import BOUNDS, CHECK, ConfigError, check_value
from rlfleet.run.config import RunConfig, parse_field, parse_value

DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")
ENV_KWARGS = "env_kwargs."
NOT_SEARCHED = frozenset({"algo", "env", "env_kwargs", "options", "overrides", "logdir", "name", "progress", "arch"})
"""Run options a sweep fixes for all its trials (the sweep's folder, its algorithm, env and architecture)."""
SPEC = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*=\s*([a-z]+)\s*\((.*)\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class Param:
    """One searched name: where its value goes (`kind`: algo, run, option or env), its distribution and the
    distribution's arguments, typed."""

    name: str
    kind: str
    dist: str
    args: tuple[Any, ...]
    text: str  # as the user wrote it, for messages and the sweep's record

    @property
    def log_scale(self) -> bool:
        return self.dist == "loguniform"

    def values(self) -> list[Any]:
        """The values a sweep checks before it runs: every choice, once (a choice's values need not share a field's
        valid range or an env's accepted set, and there are few of them), or a range's two ends (the fields' limits
        are intervals, so a draw between the ends lies within them)."""
        if self.dist != "choice":
            return list(self.args)
        out: list[Any] = []
        for value in self.args:
            if not any(type(v) is type(value) and v == value for v in out):  # True and 1 are different choices
                out.append(value)
        return out

    def mutation(self) -> Any:
        """What PBT's explore step changes this parameter with (`hyperparam_mutations`): a choice's values as a list,
        which Ray Tune moves along (to the value before or after in the order given, or a fresh draw) instead of
        multiplying them as it does a domain's; a range's domain, which it multiplies by 1.2 or 0.8 or draws afresh
        from, and `within` brings back between the ends."""
        return list(self.args) if self.dist == "choice" else self.domain()

    def within(self, value: Any) -> Any:
        """A value PBT made from this range's by a factor, brought back between the range's ends (which were checked
        against the field's limits) and, for randint, to an integer."""
        low, high = self.args
        value = min(max(value, low), high)
        return int(round(value)) if self.dist == "randint" else float(value)

    def domain(self) -> Any:
        """The Ray Tune domain that draws this parameter's values."""
        from ray import tune

        if self.dist == "uniform":
            return tune.uniform(*self.args)
        if self.dist == "loguniform":
            return tune.loguniform(*self.args)
        if self.dist == "randint":
            return tune.randint(self.args[0], self.args[1] + 1)  # Tune's upper end is excluded, ours included
        return tune.choice(list(self.args))


@dataclass(frozen=True)
class KeptInRange:
    """PBT's explore step finished (`custom_explore_fn`): each searched range's value back within its ends. Ray Tune
    multiplies a range's value by 1.2 or 0.8 and knows nothing of its ends, nor of the field's limits: gamma 0.99 x 1.2
    is a trial that cannot run. A class, not a closure, as Ray Tune keeps its scheduler with the experiment."""

    ranges: tuple[Param, ...]

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for p in self.ranges:
            if p.name in config:
                config[p.name] = p.within(config[p.name])
        return config


def _split_args(text: str) -> list[str]:
    """Comma-separated arguments, commas inside brackets or quotes kept (`choice((64,64),(128,128))`)."""
    parts, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    if current.strip() or parts:
        parts.append(current.strip())
    return parts


@dataclass(frozen=True)
class Target:
    """The field a searched name sets: its type, range and own check, and how text becomes its value."""

    kind: str
    label: str
    annotation: Any
    bounds: Any
    check: Any

    def parse(self, text: str, algo: str, name: str) -> Any:
        if self.kind == "env":
            return parse_env_value(text)
        if self.kind == "algo":
            return parse_field(algo, name, text)
        return parse_value(text, self.annotation, name)


def _field_target(kind: str, label: str, cls: type, f: dataclasses.Field[Any]) -> Target:
    return Target(kind, label, typing.get_type_hints(cls)[f.name], f.metadata.get(BOUNDS), f.metadata.get(CHECK))


def target_of(name: str, algo: str, options_cls: type) -> Target:
    """The field `name` sets: the algorithm's config field first, then a run option, then an option of the
    architecture (`options_cls`), or an env keyword (`env_kwargs.KEY`); anything else is one `ConfigError` naming
    where names come from."""
    if name.startswith(ENV_KWARGS):
        if not name[len(ENV_KWARGS) :]:
            raise ConfigError(f"--search {name}: name the keyword (env_kwargs.KEY)")
        return Target("env", f"--env-kwargs {name[len(ENV_KWARGS) :]}", Any, None, None)
    _, config_cls, _, _ = resolve(algo)
    fields = config_fields(config_cls)
    if name in fields:
        return _field_target("algo", f"{algo} config {name}", config_cls, fields[name])
    run = {f.name: f for f in dataclasses.fields(RunConfig) if f.name not in NOT_SEARCHED}
    if name in run:
        return _field_target("run", "--" + name.replace("_", "-"), RunConfig, run[name])
    options = {f.name: f for f in dataclasses.fields(options_cls)}
    if name in options:
        return _field_target("option", "--" + name.replace("_", "-"), options_cls, options[name])
    if name in NOT_SEARCHED:
        raise ConfigError(f"--search {name}: a sweep's trials share their {name.replace('_', '-')}; it is not searched")
    raise ConfigError(
        f"--search {name}: not a field of {algo}'s config, a run option or an option of the architecture, nor "
        f"env_kwargs.KEY (config fields: {', '.join(sorted(fields))}; run options: {', '.join(sorted(run))}"
        + (f"; architecture options: {', '.join(sorted(options))})" if options else ")")
    )


def _number(text: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--search {spec}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"--search {spec}: the ends of a range must be finite, not {text}")
    return value


def parse_param(spec: str, algo: str, options_cls: type) -> Param:
    """One `--search NAME=DIST(ARGS)` item, its values checked against the field `NAME` sets."""
    match = SPEC.match(spec)
    if match is None:
        raise ConfigError(
            f"--search {spec!r} is not NAME=DIST(ARGS): write e.g. lr=loguniform(1e-4,1e-2) or gamma=choice(0.99,0.995)"
            f" (distributions: {', '.join(DISTRIBUTIONS)})"
        )
    name, dist, inner = match.groups()
    if dist not in DISTRIBUTIONS:
        raise ConfigError(f"--search {spec}: unknown distribution {dist!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    target = target_of(name, algo, options_cls)
    texts = _split_args(inner)
    if dist == "choice":
        if not texts or any(not t for t in texts):
            raise ConfigError(f"--search {spec}: choice takes one or more values, comma-separated")
        try:
            args = tuple(target.parse(t, algo, name) for t in texts)
        except ConfigError as exc:
            raise ConfigError(f"--search {spec}: {exc}") from None
    else:
        if len(texts) != 2:
            raise ConfigError(f"--search {spec}: {dist} takes two numbers, its low and high end (LOW,HIGH)")
        low, high = (_number(t, spec) for t in texts)
        if dist == "randint":
            if not (low.is_integer() and high.is_integer()):
                raise ConfigError(f"--search {spec}: randint takes two integers")
            low, high = int(low), int(high)
            if high < low:
                raise ConfigError(f"--search {spec}: the high end {high} is below the low end {low}")
        elif high <= low:
            raise ConfigError(f"--search {spec}: the high end must be above the low end")
        if dist == "loguniform" and low <= 0:
            raise ConfigError(f"--search {spec}: loguniform's low end must be above 0")
        numeric = typing.get_args(target.annotation) or (target.annotation,)
        wanted = int if dist == "randint" else float
        if target.annotation is not Any and wanted not in numeric and not (wanted is int and float in numeric):
            kind = "an int" if int in numeric else "a " + getattr(target.annotation, "__name__", "non-numeric")
            use = "randint or choice" if int in numeric else "choice"
            raise ConfigError(f"--search {spec}: {target.label} is {kind} field; {dist} draws {wanted.__name__}s "
                              f"(use {use})")  # fmt: skip
        args = (low, high)
    for value in args:
        try:
            check_value(target.label, value, target.annotation, target.bounds, target.check)
        except ConfigError as exc:
            raise ConfigError(f"--search {spec}: {exc}") from None
    return Param(name, target.kind, dist, args, spec.strip())


def parse_space(specs: list[str], algo: str, options_cls: type) -> list[Param]:
    """Every `--search` item, parsed and checked; a name searched twice is one `ConfigError`."""
    params = [parse_param(spec, algo, options_cls) for spec in specs]
    seen: set[str] = set()
    for p in params:
        if p.name in seen:
            raise ConfigError(f"--search {p.name} is given twice")
        seen.add(p.name)
    return params


def apply(params: list[Param], sample: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The `rlfleet.train` options of a trial: the sweep's fixed `options` with each searched name set to the
    trial's `sample` value (an algorithm field in `overrides`, an env keyword in `env_kwargs`)."""
    out = dict(options)
    out["overrides"] = dict(options.get("overrides") or {})
    out["env_kwargs"] = dict(options.get("env_kwargs") or {})
    for p in params:
        value = sample[p.name]
        if isinstance(value, list):  # a tuple choice comes back from Tune's JSON as a list
            value = tuple(value)
        if p.kind == "algo":
            out["overrides"][p.name] = value
        elif p.kind == "env":
            out["env_kwargs"][p.name[len(ENV_KWARGS) :]] = value
        else:
            out[p.name] = value
    if not out["env_kwargs"]:
        del out["env_kwargs"]
    return out

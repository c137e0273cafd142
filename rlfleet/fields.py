"""Config fields that declare the values they allow, and the one check of them: type, finiteness, range.

A field says what it allows where it is declared::

    gamma: float = bounded(0.99, ge=0, le=1)
    \"\"\"Discount factor.\"\"\"
    name: str | None = checked(None, single_folder_name)

and `check_fields(cfg, label)` walks `dataclasses.fields(cfg)` once: every value must have the field's
annotated type (an int passes for a float, a bool not for an int), every float must be finite (NaN never;
±inf only where the field says `finite=False`), every number (each entry of a tuple) must lie in the declared
range, and a `checked` field's own check must pass. The first problem is raised as a one-line `ConfigError`
with the allowed range in it: "ppo config gamma=1.5 is out of range: must be in [0, 1]".

This module sits below every other (algorithms, envs and run services import it; it imports none of them).
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import math
import numbers
import reprlib
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

BOUNDS = "rlfleet.bounds"

MAX_ROLES = 1024
"""The most processes or threads one count may ask for (workers, learners, actors, shards, torch threads): far
past the cores of any one machine, so that an absurd count (`--learners 1e9`, `--torch-threads 1e6`) is one line
instead of an allocator error, a K x K matrix of 10^18 entries or a crash inside OpenMP."""
MAX_ENVS = 4096
"""The most envs one count may ask for (`--n-envs`, `n_envs`, `--eval-episodes`: one env each, a process each in
async mode)."""
CHECK = "rlfleet.check"


class ConfigError(ValueError):
    """A bad hyperparameter, preset or run option."""


def error_line(exc: BaseException) -> str:
    """An error in one line, for a message of ours: its type and its message's first line ("ValueError: bad")."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class MissingExtraError(ImportError):
    """An optional package that an env or a way of running envs needs (an extra: ale-py, minatar, mujoco, envpool)
    is not installed; the message names the env and the `pip install` line."""


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


@dataclass(frozen=True)
class Bounds:
    """The range of a number field: `ge`/`gt` (low end, closed/open), `le`/`lt` (high end, closed/open);
    `finite=False` lets a float be ±inf (NaN is never allowed)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    finite: bool = True

    def __post_init__(self) -> None:
        if (self.ge is not None and self.gt is not None) or (self.le is not None and self.lt is not None):
            raise TypeError("a range has one low end (ge or gt) and one high end (le or lt)")

    def contains(self, x: float) -> bool:
        return (
            (self.ge is None or x >= self.ge)
            and (self.gt is None or x > self.gt)
            and (self.le is None or x <= self.le)
            and (self.lt is None or x < self.lt)
        )

    @property
    def low(self) -> float | None:
        return self.ge if self.ge is not None else self.gt

    def __str__(self) -> str:
        low, high = self.low, self.le if self.le is not None else self.lt
        if low is not None and high is not None:
            left, right = "[" if self.ge is not None else "(", "]" if self.le is not None else ")"
            return f"in {left}{_number(low)}, {_number(high)}{right}"
        if low is not None:
            return f"{'>=' if self.ge is not None else '>'} {_number(low)}"
        if high is not None:
            return f"{'<=' if self.le is not None else '<'} {_number(high)}"
        return "finite" if self.finite else "a number"


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    finite: bool = True,
    **metadata: Any,
) -> Any:
    """A dataclass field with a declared range (for a tuple field: the range of each entry).

    `bounded(0.99, ge=0, le=1)` allows [0, 1]; `bounded(0.01, gt=0, le=1)` allows (0, 1]; `bounded(8, ge=1)`
    allows 1, 2, ...; `finite=False` also allows ±inf. Other keywords go into the field's metadata."""
    return dataclasses.field(
        default=default, metadata={BOUNDS: Bounds(ge=ge, gt=gt, le=le, lt=lt, finite=finite), **metadata}
    )


def checked(
    default: Any = dataclasses.MISSING,
    check: Callable[[Any], str | None] | None = None,
    *,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    **metadata: Any,
) -> Any:
    """A dataclass field with its own check: `check(value)` returns None when the value is fine, else what the
    value must be ("must be one of: auto, sync"). A mutable default comes from `default_factory`."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={CHECK: check, **metadata})


def field_bounds(f: dataclasses.Field) -> Bounds | None:
    """The range a field declares (None: none declared)."""
    return f.metadata.get(BOUNDS)


def one_of(choices: Sequence[str]) -> Callable[[Any], str | None]:
    """A `checked` test: the value is one of `choices`."""

    def check(value: Any) -> str | None:
        return None if value in choices else f"must be one of: {', '.join(choices)}"

    return check


def non_empty(value: Any) -> str | None:
    """A `checked` test: a string that is not empty."""
    return None if value else "must not be empty"


def single_folder_name(value: Any) -> str | None:
    """A `checked` test: one path component (no separator, not `.` or `..`, not empty, no NUL), so that the
    folder it names stays inside its parent. None passes (the field's default applies)."""
    if value is None:
        return None
    if value in ("", ".", "..") or any(c in value for c in "/\\\0"):
        return "is not a single folder name: it must not be '', '.' or '..' nor hold '/', '\\' or NUL"
    return None


MAX_NESTING = 100
"""How deep lists, tuples and dicts may nest in a value a run keeps (`--env-kwargs`, a dataset's env_kwargs): far
deeper than any env keyword needs, and far from Python's recursion limit, which comparing, printing or saving a
value nested thousands deep would reach (a RecursionError, not a line naming the value)."""


def nesting_depth(value: Any, limit: int = MAX_NESTING) -> int:
    """How deep lists, tuples and dicts nest in `value` (0 for a plain value), counted without recursion and only up
    to `limit` + 1: a value nested thousands deep costs no more than one just over the limit."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, depth = todo.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            todo.extend((v, depth + 1) for v in item)
    return deepest


def nesting_problem(value: Any) -> str | None:
    """A `checked` test: lists, tuples and dicts nested at most `MAX_NESTING` deep."""
    if nesting_depth(value) > MAX_NESTING:
        return f"is nested more than {MAX_NESTING} deep (lists, tuples or dicts inside each other)"
    return None


def parse_count(text: str) -> int:
    """An integer from text (`--set n_envs=8`, `--steps 1e6`): float notation is fine for a whole number;
    anything else is a ValueError."""
    try:
        if "e" in text.lower() and not text.lower().startswith("0x"):
            value = float(text)
            if not value.is_integer():
                raise ValueError(text)
            return int(value)
        return int(text)
    except (ValueError, OverflowError):
        raise ValueError(f"invalid int value: {text!r}") from None


# ----------------------------------------------------------------------------------------------- types
@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # None is the default, not worth a word
        return " or ".join(_type_name(a) for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is tuple:
        return f"tuple of {_type_name(typing.get_args(annotation)[0])}"
    if typing.get_origin(annotation) is dict:
        return "dict"
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def _has_type(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if origin is tuple:
        inner = typing.get_args(annotation)[0]
        return isinstance(value, tuple | list) and all(_has_type(v, inner) for v in value)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, annotation) if isinstance(annotation, type) else True


def _article(name: str) -> str:
    return "an" if name[:1] in "aeiou" else "a"


# ----------------------------------------------------------------------------------------------- the check
def _shown(value: Any) -> Any:
    """A value as a message shows it: text quoted; a value nested too deep to print whole, its first levels."""
    if isinstance(value, str):
        return repr(value)
    if nesting_depth(value) > MAX_NESTING:
        return reprlib.repr(value)
    return value


def check_value(
    label: str,
    value: Any,
    annotation: Any,
    bounds: Bounds | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> None:
    """Check one value as `check_fields` checks a field (for options that are no dataclass field: `rlfleet
    eval --episodes`); `label` names it in the message."""
    shown = _shown(value)
    if not _has_type(value, annotation):
        name = _type_name(annotation)
        raise ConfigError(f"{label}={shown!s} is not {_article(name)} {name}")
    entries = value if isinstance(value, tuple | list) else (value,)
    numbers_ = [v for v in entries if isinstance(v, numbers.Real) and not isinstance(v, bool)]
    bounds = bounds or Bounds()
    ranged = bounds.low is not None or bounds.le is not None or bounds.lt is not None
    allowed = f": must be {bounds}" if ranged else ""
    for v in numbers_:
        if math.isnan(v) or (bounds.finite and math.isinf(v)):
            what = "a finite number" if bounds.finite else "a number"
            raise ConfigError(f"{label}={shown} is not {what}{allowed}")
    for v in numbers_:
        if not bounds.contains(cast(float, v)):  # a Real (a NumPy scalar too): compares as a float does
            every = "every entry " if isinstance(value, tuple | list) else ""
            low = bounds.low
            issue = "is negative" if v < 0 and low is not None and low >= 0 else "is out of range"
            raise ConfigError(f"{label}={shown} {issue}: {every}must be {bounds}")
    if check is not None:
        problem = check(value)
        if problem is not None:
            raise ConfigError(f"{label}={shown} {problem}")


def check_fields(obj: Any, label: Callable[[dataclasses.Field], str]) -> None:
    """Check every field of the dataclass `obj` for type, finiteness, range and its own check; the first
    problem is a one-line `ConfigError` whose subject is `label(field)` ("ppo config gamma")."""
    cls: type = type(obj)
    hints = _hints(cls)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        check_value(label(f), value, hints[f.name], f.metadata.get(BOUNDS), f.metadata.get(CHECK))
        plain = _python_number(value)
        if plain is not value:  # kept as the Python number it stands for: what the envs and JSON take
            setattr(obj, f.name, plain)


def _python_number(value: Any) -> Any:
    """`value` with its NumPy scalars (`np.int64(3)`, as `np.arange` gives) as Python numbers, tuples and lists entry
    by entry; `value` itself where it holds none."""
    if isinstance(value, tuple | list):
        plain = [_python_number(v) for v in value]
        return value if all(p is v for p, v in zip(plain, value, strict=True)) else type(value)(plain)
    return value.item() if type(value).__module__ == "numpy" and hasattr(value, "item") else value


NEEDS = "needs"
"""A field's metadata key naming the switch (a bool or count field of the same config) without which the field has no
effect: `bounded(10.0, gt=0, needs="obs_norm")`; or `FIELD=VALUE` where it needs a field to have one value
(`needs="action_noise=ou"`), `FIELD=` for an empty one (`needs="net="`: the built-in networks' sizes, idle beside a
network of the user's); or a tuple of these, every one needed (`needs=("prioritized", "lstm=0")`)."""


NAMES_ALGORITHM = "names_algorithm"
"""A field's metadata key: the field's values are the names of registered algorithms that share one module and
config (`target` of `onestep_q`, `sarsa` and `nstep_q`). The name a run is trained under sets it: `--set` may not
give it another, which would run one algorithm under another's name."""


_SEARCHED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("searched", default=frozenset())


@contextlib.contextmanager
def searched_fields(names: Iterable[str]) -> Iterator[None]:
    """While the block runs, `names` are fields a sweep searches (`rlfleet tune --search`): one idle in a trial
    because its switch, searched too, is off there is no error (`idle_setting`); the trials where it is on use it."""
    token = _SEARCHED.set(frozenset(names))
    try:
        yield
    finally:
        _SEARCHED.reset(token)


def needs_of(cls: type, name: str) -> tuple[str, ...]:
    """The conditions (`NEEDS`) field `name` of the dataclass `cls` declares (none: an empty tuple)."""
    f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    conditions = None if f is None else f.metadata.get(NEEDS)
    return () if conditions is None else (conditions,) if isinstance(conditions, str) else tuple(conditions)


def unmet_need(cls: type, name: str, values: Callable[[str], Any], on: Sequence[str] = ()) -> str | None:
    """The first condition (`NEEDS`) of field `name` of the dataclass `cls` that the config whose field values
    `values` gives does not meet, e.g. "obs_norm" or "net="; None when the field acts (or declares none). `on`:
    conditions taken as met."""
    for needs in needs_of(cls, name):
        switch, valued, wanted = needs.partition("=")
        value = values(switch)
        if needs not in on and ((str(value) != wanted) if valued else not value):
            return needs
    return None


def idle_setting(obj: Any, given: dict[str, Any], label: str, on: Sequence[str] = ()) -> None:
    """A setting the user gave (`given`: field name to value, as `--set` gives them) for a field of the dataclass
    `obj` whose switch (`NEEDS`) is off in `obj`: one `ConfigError` that says so, since the value would do nothing.
    `on`: switches the caller turns on whatever `obj` says (the `apex` architecture's replay is always
    prioritized). A sweep's field whose switch the sweep searches too is no error here (`searched_fields`): the sweep
    checks that some trial turns it on."""
    searched = _SEARCHED.get()
    for name in given:
        met = (*on, *(c for c in needs_of(type(obj), name) if name in searched and c.partition("=")[0] in searched))
        needs = unmet_need(type(obj), name, lambda switch: getattr(obj, switch), met)
        if needs is None:
            continue
        switch, valued, wanted = needs.partition("=")
        how = "--search" if name in searched else label
        advice = (
            f"leave {name} out, or {switch}"
            if valued and not wanted
            else f"set {needs if wanted else switch} too, or leave {name} out"
        )
        value = getattr(obj, switch)
        raise ConfigError(f"{how} {name}={given[name]} has no effect while {switch}={value!r}: {advice}")


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under its declaration), from `cls` and its dataclass bases;
    read from the source, since Python keeps no field docstrings at run time (the CLI's help comes from here)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


@functools.cache
def _own_field_docs(klass: type) -> dict[str, str]:
    """The docstrings of the fields `klass` itself declares. Cached: finding a class's source parses its whole
    module, and the CLI asks for the help of some 200 options, most of them declared in a handful of classes."""
    docs: dict[str, str] = {}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError):
        return docs
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs

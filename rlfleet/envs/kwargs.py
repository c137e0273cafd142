"""An env's keyword arguments for a run (`--env-kwargs KEY=VALUE`, `env_kwargs={...}`): the items parsed and their
values typed, the dict checked as a run option, and the env built with them once before a run writes anything, so
that an unknown keyword or a value the env rejects is one line."""

from __future__ import annotations

import ast
import difflib
import inspect
import io
import tokenize
from collections.abc import Callable
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from rlfleet.envs import env_spec_info, make_env, make_vector_env, resolve_env_spec
from rlfleet.envs.make import _is_atari_spec
from rlfleet.envs.pettingzoo import PettingZooError, is_pettingzoo_id, pettingzoo_info
from rlfleet.fields import ConfigError, nesting_problem

__all__ = ["env_info", "env_keywords", "env_kwargs_problem", "parse_env_kwargs", "parse_env_value"]

OPTION = "--env-kwargs"
NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _named_parameters(function: Callable[..., Any]) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values() if p.kind in NAMED]


RESERVED = tuple(sorted({*_named_parameters(make_env), *_named_parameters(make_vector_env)}))
"""Names the run passes to `make_env`/`make_vector_env` itself (seed, render_mode, ...): no env keyword takes them."""
MAKE_KEYWORDS = tuple(n for n in _named_parameters(gym.make) if n != "id")
"""The keywords `gymnasium.make` takes for every env (max_episode_steps, disable_env_checker)."""
PLAIN = (bool, int, float, str, type(None))


def parse_env_value(text: str) -> Any:
    """An item's value, typed without a field to say its type: true/false (any case) -> bool, none/null -> None,
    a Python literal (`5`, `5.0`, `1e-3`, `'quoted'`, `[1, 2]`) -> that value, inf/nan -> float; anything else
    is the text itself (`8x8`)."""
    word = text.lower()
    if word in ("true", "false"):
        return word == "true"
    if word in ("none", "null"):
        return None
    try:
        value = ast.literal_eval(_python_words(text))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, tokenize.TokenError):
        if word.lstrip("+-") in ("inf", "infinity", "nan"):
            return float(text)
        return text
    return value if _plain_data(value) else text  # 1j, b'x', {1, 2}: kept as written


WORDS = {"true": "True", "false": "False", "none": "None", "null": "None"}
"""The words typed inside a list or dict as they are alone (any case): `flags=[false, true]`."""


def _python_words(text: str) -> str:
    """`text` with the bare words of `WORDS` (not those in quotes) as Python's literals, each as long as the word it
    replaces, so that `ast.literal_eval` reads `[false, null]` as it reads `[False, None]`."""
    tokens = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME and token.string.lower() in WORDS:
            token = token._replace(string=WORDS[token.string.lower()])
        tokens.append(token)
    return tokenize.untokenize(tokens)


def parse_env_kwargs(items: list[str], option: str = OPTION) -> dict[str, Any]:
    """`KEY=VALUE` items (`is_slippery=false`, `map_name=8x8`) as keyword arguments; a malformed item, a key that
    is not a keyword name, an empty value or a key given twice is a one-line `ConfigError` naming `option`."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise ConfigError(f"{option} expects KEY=VALUE items (e.g. is_slippery=false), got {item!r}")
        if not key.isidentifier():
            raise ConfigError(f"{option} {item!r}: {key!r} is not a keyword argument name")
        if not value:
            raise ConfigError(f"{option} {item!r} has no value (write {key}='' for an empty string)")
        if key in out:
            raise ConfigError(f"{option} gives {key!r} twice")
        out[key] = parse_env_value(value)
    return out


def _plain_data(value: Any) -> bool:
    """What a run saves in config.json and its checkpoints as it is: bools, numbers, strings, None, and lists,
    tuples and dicts (string keys) of them."""
    if isinstance(value, PLAIN):
        return True
    if isinstance(value, list | tuple):
        return all(_plain_data(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_data(v) for k, v in value.items())
    return False


def env_kwargs_problem(value: Any) -> str | None:
    """The `checked` test of `RunConfig.env_kwargs`: `keyword_args_problem`, and none that the run passes itself."""
    return keyword_args_problem(value, RESERVED)


def keyword_args_problem(value: Any, reserved: tuple[str, ...] = ()) -> str | None:
    """The `checked` test of keyword arguments a run keeps in its config (a dict, which `check_fields` has made
    sure of: `--env-kwargs`, `--net-kwargs`): keyword names, none of `reserved`, and values it can save with its
    config, nested no deeper than `rlfleet.fields.MAX_NESTING` (deeper, checking them would itself reach Python's
    recursion limit)."""
    deep = nesting_problem(value)
    if deep is not None:
        return deep
    for key, item in value.items():
        if not isinstance(key, str) or not key.isidentifier():
            return f"has the key {key!r}, which is not a keyword argument name"
        if key in reserved:
            return f"cannot set {key!r}: the run sets it itself (it sets {', '.join(reserved)})"
        if not _plain_data(item):
            return (
                f"has a value for {key!r} that the run cannot save with its config ({type(item).__name__}): "
                "allowed are bools, numbers, strings, None, and lists, tuples and dicts of them"
            )
    return None


def env_keywords(env: str) -> list[str] | None:
    """The keyword arguments a (non-Atari) env id takes: its constructor's, then `gymnasium.make`'s; None when
    they cannot be read (a constructor with `**kwargs`, or no signature) and for Atari ids (whose keywords are
    `ATARI_OPTIONS`, which `make_env` checks itself)."""
    spec = resolve_env_spec(env)
    if _is_atari_spec(spec):
        return None
    entry = spec.entry_point
    if entry is None:  # nothing to read
        return None
    try:
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
        parameters = inspect.signature(creator).parameters.values()
    except (ImportError, AttributeError, ValueError, TypeError):
        return None
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    own = [p.name for p in parameters if p.kind in NAMED and p.name not in RESERVED]
    return own + [n for n in MAKE_KEYWORDS if n not in own]


def _unknown_keywords(env: str, env_kwargs: dict[str, Any]) -> str | None:
    """The line for keywords the env does not take, if its signature says so (None: it does not say)."""
    keywords = env_keywords(env)
    if keywords is None:
        return None
    unknown = [k for k in env_kwargs if k not in keywords]
    if not unknown:
        return None
    which = "argument " + repr(unknown[0]) if len(unknown) == 1 else "arguments " + ", ".join(map(repr, unknown))
    close = [m for k in unknown for m in difflib.get_close_matches(k, keywords, n=1)]
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    return f"env {env} does not take the keyword {which}{hint} (its keyword arguments: {', '.join(keywords)})"


def _step_once(env: str, env_kwargs: dict[str, Any]) -> None:
    """Reset the env and take one random step: a value the constructor keeps but the dynamics reject fails here."""
    built = make_env(env, seed=0, **env_kwargs)
    try:
        built.reset()
        built.step(built.action_space.sample())
    finally:
        built.close()


def env_info(env: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """`env_spec_info` of the env built with the run's keyword arguments: its spaces and family are those of the
    variant. With keyword arguments the env is also reset and stepped once; a keyword it does not take or a
    value it rejects is a one-line `ConfigError` (an unknown id or a missing dependency keeps its own error).
    A PettingZoo id (`pettingzoo:MODULE`) gives `pettingzoo_info`."""
    if is_pettingzoo_id(env):
        try:
            return pettingzoo_info(env, env_kwargs)
        except PettingZooError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if not env_kwargs:
        try:
            return env_spec_info(env)
        except AssertionError as exc:  # Gymnasium's env checker asserts what it finds wrong with an env's spaces
            raise ConfigError(f"env {env} fails Gymnasium's env checker: {str(exc).strip() or 'assertion'}") from None
    resolve_env_spec(env)  # an unknown id is reported as such
    try:
        info = env_spec_info(env, **env_kwargs)
        _step_once(env, env_kwargs)
    except (ImportError, gym.error.DependencyNotInstalled):
        raise
    except Exception as exc:  # an env may raise anything for a value it does not expect
        unknown = _unknown_keywords(env, env_kwargs) if isinstance(exc, TypeError) else None
        if unknown is not None:
            raise ConfigError(unknown) from None
        given = " ".join(f"{k}={v!r}" for k, v in env_kwargs.items())
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"env {env} rejects {OPTION} {given}: {type(exc).__name__}: {detail}") from None
    return info

"""Snapshots of a synchronous vector env's state, so a resumed run continues exactly where it stopped.

The state of classic-control style envs (and of Gymnasium's wrappers and SyncVectorEnv) is plain data
held in attributes: numbers, NumPy arrays, random generators, small deques and dicts, and objects made of them (a
wrapper's running statistics). `snapshot` walks every sub-env's wrapper chain and records those attributes; `restore`
writes them back into freshly built envs. A MinAtar env keeps its game one object further in (`game`, and the game
its own `env`): the walk goes on through those, whose state is plain data and a legacy `RandomState` (sticky
actions, spawns), restored in place because the game and its env share it. Two C engines are recorded through their
own APIs: a MuJoCo env's `MjData` (its integration state, and every array of it: an env reads body positions before
a step, which `mj_step` left one substep behind the state) and an Atari env's emulator (`cloneState`, with the RNG of
its sticky actions).

What holds no state is left out: spaces, specs, enums, classes, callables, MuJoCo's model, renderers, and toy
text's transition tables (fixed when the env is made). Anything else
(another C engine's objects, such as Box2D's world in LunarLander) cannot be recorded, and neither can envs in their
own processes (async): `snapshot` then returns None, `uncaptured` says why, and a resumed run starts new episodes
there instead (the `SingleRunner` then ends the episodes stored in its replay buffer at the checkpoint and restarts
reward normalisation's running returns).
"""

from __future__ import annotations

import enum
import types
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

from rlfleet.envs.wrappers import EnvPoolVectorEnv

_PLAIN = (int, float, bool, str, bytes, type(None))
_STATELESS = (gym.Space, EnvSpec, enum.Enum, type, types.ModuleType)
_STATELESS_MODULES = ("pygame", "gymnasium.envs.mujoco.mujoco_rendering")  # rendering: screens, clocks, viewers
_FIXED = {"gymnasium.envs.toy_text": ("P",)}  # set up once: toy text's transition table (Taxi's: 2 MB for 8 envs)
_DEPTH = 6  # how far the walk follows containers and objects into an attribute (a deque of frames: 1 level)


class _Opaque(Exception):
    """State that cannot be recorded (the message names it)."""


_SKIP = object()  # an attribute that holds no state


def _stateless(value: Any) -> bool:
    if isinstance(value, _STATELESS) or callable(value):
        return True
    kind, module = type(value).__name__, _module(value)
    return module.startswith(_STATELESS_MODULES) or (kind == "MjModel" and module.startswith("mujoco"))  # fixed


def _module(value: Any) -> str:
    return getattr(type(value), "__module__", None) or ""  # some C extension types have none


def _capture(value: Any, where: str, depth: int = 0) -> Any:
    """`value` as plain data, or `_SKIP` if it holds no state; `_Opaque` if it holds state that can't be recorded."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value.copy()
    if isinstance(value, np.random.Generator):
        return {"__generator__": value.bit_generator.state}
    if isinstance(value, np.random.RandomState):
        name, keys, pos, has_gauss, cached = value.get_state(legacy=True)
        return {"__randomstate__": [name, np.array(keys), int(pos), int(has_gauss), float(cached)]}
    if _stateless(value):
        return _SKIP
    if depth >= _DEPTH:
        raise _Opaque(f"{where} is nested too deep")
    if isinstance(value, deque | list | tuple):
        items = [_capture(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        if any(v is _SKIP for v in items):  # configuration that holds code (a list of env factories)
            return _SKIP
        kind = "deque" if isinstance(value, deque) else type(value).__name__
        return {"__seq__": kind, "items": items, "maxlen": getattr(value, "maxlen", None)}
    if isinstance(value, dict) and all(isinstance(k, _PLAIN) for k in value):  # toy text's transition table too
        entries = {k: _capture(v, f"{where}[{k!r}]", depth + 1) for k, v in value.items()}
        if any(v is _SKIP for v in entries.values()):  # a wrapper's saved arguments, among them a function
            return _SKIP
        return {"__mapping__": entries}
    if type(value).__dict__.get("__slots__") is None and hasattr(value, "__dict__"):  # a plain Python object
        return {"__object__": _attributes(value, where, depth + 1)}
    raise _Opaque(f"{where} is a {_module(value)}.{type(value).__name__}")


def _attributes(obj: Any, where: str, depth: int, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    state = {}
    fixed = next((names for module, names in _FIXED.items() if _module(obj).startswith(module)), ())
    for key, value in vars(obj).items():
        if key in skip or key in fixed:
            continue
        try:
            captured = _capture(value, f"{where}.{key}", depth)
        except _Opaque as exc:  # named by the attribute of the env itself, where a user would look
            raise (exc if depth else _Opaque(f"{where}.{key} is a {_module(value)}.{type(value).__name__}")) from None
        if captured is not _SKIP:
            state[key] = captured
    return state


def _release(value: Any, current: Any) -> Any:
    """The value a snapshot recorded, written into `current` in place where objects share it."""
    if isinstance(value, dict) and "__generator__" in value:
        gen = current if isinstance(current, np.random.Generator) else np.random.default_rng()
        gen.bit_generator.state = value["__generator__"]
        return gen
    if isinstance(value, dict) and "__randomstate__" in value:  # in place: objects sharing it keep sharing it
        legacy = current if isinstance(current, np.random.RandomState) else np.random.RandomState()
        legacy.set_state(tuple(value["__randomstate__"]))
        return legacy
    if isinstance(value, dict) and "__seq__" in value:
        now = list(current) if isinstance(current, deque | list | tuple) else []
        now = now if len(now) == len(value["items"]) else [None] * len(value["items"])
        items = [_release(v, o) for v, o in zip(value["items"], now, strict=True)]
        if value["__seq__"] == "deque":
            return deque(items, maxlen=value["maxlen"])
        return tuple(items) if value["__seq__"] == "tuple" else items
    if isinstance(value, dict) and "__mapping__" in value:
        held = current if isinstance(current, dict) else {}
        return {k: _release(v, held.get(k)) for k, v in value["__mapping__"].items()}
    if isinstance(value, dict) and "__object__" in value:  # into the envs' own object, built as the snapshot's was
        if current is None:
            raise ValueError("the snapshot holds an object the envs it is restored into do not have")
        for key, item in value["__object__"].items():
            setattr(current, key, _release(item, getattr(current, key, None)))
        return current
    return value


def _inner(layer: Any) -> Any:
    """The object `layer` keeps its env in: a wrapper's `env`, MinAtar's `game` (and the game's `env`); or None."""
    for name in _WALKED:
        inner = getattr(layer, name, None)
        if inner is not None and hasattr(inner, "__dict__") and not isinstance(inner, type):
            return inner
    return None


_WALKED = ("env", "game")


def _layers(env: gym.Env) -> list[Any]:
    layers = [env]
    while (inner := _inner(layers[-1])) is not None:
        layers.append(inner)
    return layers


_MUJOCO_KEY = "__mujoco_state__"
_MUJOCO_ARRAYS = "__mujoco_arrays__"
_ALE_KEY = "__ale_state__"


def _engine(obj: Any, name: str, kind: str, module: str) -> Any:
    """The `name` attribute of an env layer if it is the C engine `module`.`kind`, else None."""
    value = vars(obj).get(name)
    return value if type(value).__name__ == kind and _module(value).startswith(module) else None


def _layer_state(obj: Any, where: str) -> dict[str, Any]:
    data = _engine(obj, "data", "MjData", "mujoco")
    ale = _engine(obj, "ale", "ALEInterface", "ale_py")
    state = _attributes(obj, where, 0, skip=_WALKED + ("data",) * (data is not None) + ("ale",) * (ale is not None))
    if data is not None:  # positions, velocities, actuator state, warm start, controls, time...
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        full = np.empty(mujoco.mj_stateSize(obj.model, spec), dtype=np.float64)
        mujoco.mj_getState(obj.model, data, full, spec)
        state[_MUJOCO_KEY] = full
        # ... and the derived quantities as the last step left them (Ant's reward reads xpos before its step)
        arrays = {name: getattr(data, name) for name in dir(data) if not name.startswith("_")}
        state[_MUJOCO_ARRAYS] = {k: v.copy() for k, v in arrays.items() if isinstance(v, np.ndarray)}
    if ale is not None:
        # with sticky actions' RNG; pickle's state: bytes, or a tuple of them before ale-py 0.11 (serialize() was str)
        state[_ALE_KEY] = ale.cloneState(include_rng=True).__getstate__()
    return state


def _restore_engines(obj: Any, state: dict[str, Any]) -> None:
    if _MUJOCO_KEY in state:
        import mujoco

        data = vars(obj)["data"]
        full = np.asarray(state[_MUJOCO_KEY], dtype=np.float64)
        mujoco.mj_setState(obj.model, data, full, mujoco.mjtState.mjSTATE_INTEGRATION)
        mujoco.mj_forward(obj.model, data)
        for name, value in state.get(_MUJOCO_ARRAYS, {}).items():
            target = getattr(data, name, None)
            if isinstance(target, np.ndarray) and target.shape == np.shape(value):  # sized by contacts: recomputed
                target[...] = value
    if _ALE_KEY in state:
        import ale_py

        emulator = ale_py.ALEState.__new__(ale_py.ALEState)
        emulator.__setstate__(state[_ALE_KEY])
        vars(obj)["ale"].restoreState(emulator)


def _base_vector_env(envs: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """The vector env under any vector wrappers (e.g. `make_vector_env`'s LiftEpisodeStatistics)."""
    while isinstance(envs, gym.vector.VectorWrapper):
        envs = envs.env
    return envs


def _record(envs: gym.vector.VectorEnv) -> dict[str, Any]:
    base = _base_vector_env(envs)
    if not isinstance(base, gym.vector.SyncVectorEnv):
        where = "in EnvPool's own threads" if isinstance(base, EnvPoolVectorEnv) else "in processes of their own"
        raise _Opaque(f"the envs run {where}; --vector-mode sync keeps them in the run's")
    return {
        "vector": _attributes(base, type(base).__name__, 0, skip=("envs",)),
        "envs": [[_layer_state(layer, type(layer).__name__) for layer in _layers(env)] for env in base.envs],
    }


def snapshot(envs: gym.vector.VectorEnv) -> dict[str, Any] | None:
    """Plain-data state of a SyncVectorEnv and all its sub-envs, or None if it can't be captured (`uncaptured`)."""
    try:
        return _record(envs)
    except _Opaque:
        return None


def uncaptured(envs: gym.vector.VectorEnv) -> str | None:
    """What keeps `snapshot` from recording these envs (None if nothing does)."""
    try:
        _record(envs)
    except _Opaque as exc:
        return str(exc)
    return None


def restore(envs: gym.vector.VectorEnv, state: dict[str, Any] | None) -> bool:
    """Write a snapshot back into envs built the same way; False if there was nothing to restore."""
    envs = _base_vector_env(envs)
    if state is None or not isinstance(envs, gym.vector.SyncVectorEnv):
        return False
    if len(state["envs"]) != len(envs.envs):
        raise ValueError(f"snapshot has {len(state['envs'])} envs, the vector env has {len(envs.envs)}")
    targets = [(envs, state["vector"])]
    for env, layer_states in zip(envs.envs, state["envs"], strict=True):
        targets += list(zip(_layers(env), layer_states, strict=True))
    for obj, layer_state in targets:
        for key, value in layer_state.items():
            if key not in (_MUJOCO_KEY, _MUJOCO_ARRAYS, _ALE_KEY):
                setattr(obj, key, _release(value, getattr(obj, key, None)))
        _restore_engines(obj, layer_state)
    return True

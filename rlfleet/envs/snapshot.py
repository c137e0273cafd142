"""Snapshots of a synchronous vector env's state, so a resumed run continues exactly where it stopped.

The state of classic-control style envs (and of Gymnasium's wrappers and SyncVectorEnv) is plain data
held in attributes: numbers, NumPy arrays, random generators, small deques. `snapshot` walks every
sub-env's wrapper chain and records those attributes; `restore` writes them back into freshly built
envs. A MinAtar env keeps its game one object further in (`game`, and the game its own `env`): the walk goes
on through those, whose state is plain data and a legacy `RandomState` (sticky actions, spawns), restored in
place because the game and its env share it. A MuJoCo env's physics (its `MjData`) is recorded too, as
MuJoCo's full integration state. Envs
whose state lives elsewhere (a C emulator, a subprocess) are not captured: `snapshot` returns None and a
resumed run starts new episodes there instead (the `SingleRunner` then ends the episodes stored in its replay
buffer at the checkpoint and restarts reward normalisation's running returns).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

_PLAIN = (int, float, bool, str, type(None))


def _capture(value: Any) -> tuple[bool, Any]:
    if isinstance(value, _PLAIN):
        return True, value
    if isinstance(value, np.generic):
        return True, value.item()
    if isinstance(value, np.ndarray) and value.dtype != object:
        return True, value.copy()
    if isinstance(value, np.random.Generator):
        return True, {"__generator__": value.bit_generator.state}
    if isinstance(value, np.random.RandomState):
        name, keys, pos, has_gauss, cached = value.get_state(legacy=True)
        return True, {"__randomstate__": [name, np.array(keys), int(pos), int(has_gauss), float(cached)]}
    if isinstance(value, deque | list | tuple):
        items = [_capture(v) for v in value]
        if all(ok for ok, _ in items):
            kind = "deque" if isinstance(value, deque) else type(value).__name__
            return True, {
                "__seq__": kind,
                "items": [v for _, v in items],
                "maxlen": getattr(value, "maxlen", None),
            }
    return False, None


def _release(value: Any, current: Any) -> Any:
    if isinstance(value, dict) and "__generator__" in value:
        gen = current if isinstance(current, np.random.Generator) else np.random.default_rng()
        gen.bit_generator.state = value["__generator__"]
        return gen
    if isinstance(value, dict) and "__randomstate__" in value:  # in place: objects sharing it keep sharing it
        legacy = current if isinstance(current, np.random.RandomState) else np.random.RandomState()
        legacy.set_state(tuple(value["__randomstate__"]))
        return legacy
    if isinstance(value, dict) and "__seq__" in value:
        items = [_release(v, None) for v in value["items"]]
        if value["__seq__"] == "deque":
            return deque(items, maxlen=value["maxlen"])
        return tuple(items) if value["__seq__"] == "tuple" else items
    return value


def _inner(layer: Any) -> Any:
    """The object `layer` keeps its env in: a wrapper's `env`, MinAtar's `game` (and the game's `env`); or None."""
    for name in ("env", "game"):
        inner = getattr(layer, name, None)
        if inner is not None and hasattr(inner, "__dict__") and not isinstance(inner, type):
            return inner
    return None


def _layers(env: gym.Env) -> list[Any]:
    layers = [env]
    while (inner := _inner(layers[-1])) is not None:
        layers.append(inner)
    return layers


_MUJOCO_KEY = "__mujoco_state__"


def _mujoco(obj: Any) -> tuple[Any, Any, Any] | None:
    """(mujoco module, MjModel, MjData) of a MuJoCo env layer, else None."""
    data = vars(obj).get("data")
    if type(data).__name__ != "MjData" or not type(data).__module__.startswith("mujoco"):
        return None
    import mujoco

    return mujoco, obj.model, data


def _layer_state(obj: Any) -> dict[str, Any]:
    state = {}
    for key, value in vars(obj).items():
        ok, captured = _capture(value)
        if ok:
            state[key] = captured
    physics = _mujoco(obj)
    if physics is not None:  # positions, velocities, actuator state, warm start, controls, time...
        mujoco, model, data = physics
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        full = np.empty(mujoco.mj_stateSize(model, spec), dtype=np.float64)
        mujoco.mj_getState(model, data, full, spec)
        state[_MUJOCO_KEY] = full
    return state


def _base_vector_env(envs: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """The vector env under any vector wrappers (e.g. `make_vector_env`'s LiftEpisodeStatistics)."""
    while isinstance(envs, gym.vector.VectorWrapper):
        envs = envs.env
    return envs


def snapshot(envs: gym.vector.VectorEnv) -> dict[str, Any] | None:
    """Plain-data state of a SyncVectorEnv and all its sub-envs, or None if it can't be captured."""
    envs = _base_vector_env(envs)
    if not isinstance(envs, gym.vector.SyncVectorEnv):
        return None
    if any(hasattr(layer, "ale") for env in envs.envs for layer in _layers(env)):
        return None
    return {
        "vector": _layer_state(envs),
        "envs": [[_layer_state(layer) for layer in _layers(env)] for env in envs.envs],
    }


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
            if key == _MUJOCO_KEY:
                physics = _mujoco(obj)
                assert physics is not None  # the same env layer as the snapshot's, which had MuJoCo state
                mujoco, model, data = physics
                full = np.asarray(value, dtype=np.float64)
                mujoco.mj_setState(model, data, full, mujoco.mjtState.mjSTATE_INTEGRATION)
                mujoco.mj_forward(model, data)
                continue
            setattr(obj, key, _release(value, getattr(obj, key, None)))
    return True

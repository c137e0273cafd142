"""Env snapshots (`rlfleet.envs.snapshot`): fresh envs given one step exactly as the originals, or the snapshot
says it cannot be taken and names what holds the state; it never claims a restore it did not make."""

from __future__ import annotations

import array
import functools
import io
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.envs import make_vector_env
from rlfleet.envs import snapshot as env_state
from rlfleet.envs.wrappers import StickyActions
from rlfleet.run.checkpoint import from_safe, to_safe


def _through_a_checkpoint(state: Any) -> Any:
    """What a checkpoint gives back: saved as `save_checkpoint` does, loaded with `weights_only=True`."""
    file = io.BytesIO()
    torch.save(to_safe(state), file)
    file.seek(0)
    return from_safe(torch.load(file, weights_only=True))


def _steps_alike(make: Callable[[int], gym.vector.VectorEnv], warm: int = 60, steps: int = 300) -> int:
    """Step envs `warm` steps, restore their snapshot into fresh envs seeded otherwise, then step both alike:
    every observation, reward and end must agree. Returns how many episodes ended after the restore."""
    envs, fresh = make(0), make(7)
    envs.reset(seed=0)
    fresh.reset(seed=7)
    envs.action_space.seed(0)
    for _ in range(warm):
        envs.step(envs.action_space.sample())
    assert env_state.uncaptured(envs) is None
    assert env_state.restore(fresh, _through_a_checkpoint(env_state.snapshot(envs)))
    ends = 0
    for _ in range(steps):
        actions = envs.action_space.sample()
        a, b = envs.step(actions), fresh.step(actions)
        for x, y in zip(a[:4], b[:4], strict=True):
            np.testing.assert_array_equal(x, y)
        ends += int((a[2] | a[3]).sum())
    envs.close()
    fresh.close()
    return ends


def test_a_toy_text_env_goes_on_exactly():
    """Taxi's transition table (a dict keyed by ints, fixed once made) is left out; the rest of its state is not."""
    assert _steps_alike(lambda seed: make_vector_env("Taxi-v4", 2, seed=seed, mode="sync"), steps=500) > 0


def test_a_wrapper_with_a_statistics_object_goes_on_exactly():
    """Gymnasium's NormalizeObservation holds its running mean and variance in an object of its own: the walk goes
    into it (before, the object was left out and the fresh envs normalised with fresh statistics)."""

    def normalised() -> gym.Env:
        return gym.wrappers.NormalizeObservation(gym.make("CartPole-v1"))

    assert _steps_alike(lambda seed: make_vector_env(normalised, 2, seed=seed, mode="sync")) > 0


def test_an_atari_emulator_goes_on_exactly():
    """The ALE's state (with the RNG of its sticky actions) is recorded through `cloneState`; the life-loss wrapper's
    saved info (a dict) too: fresh envs play on alike across lost lives."""
    pytest.importorskip("ale_py", reason='needs ALE: pip install "rlfleet[atari]"')
    make = functools.partial(make_vector_env, "ALE/Breakout-v5", 1, mode="sync", terminal_on_life_loss=True)
    assert _steps_alike(lambda seed: make(seed=seed), warm=40, steps=400) > 0


def test_an_atari_env_cut_after_an_action_repeats_that_action_at_its_first_sticky_frame():
    """The ALE's saved state leaves out the action its sticky actions repeat: a fresh env given the snapshot of one
    cut after an action other than NOOP repeated NOOP at its first sticky frame, and its game went another way (46
    of the next 300 frames differed here). rlfleet's own sticky actions keep it with their RNG."""
    pytest.importorskip("ale_py", reason='needs ALE: pip install "rlfleet[atari]"')
    actions = np.random.default_rng(0).integers(0, 4, size=600)[:, None]
    envs, fresh = (make_vector_env("ALE/Breakout-v5", 1, seed=2, mode="sync") for _ in range(2))
    envs.reset()
    fresh.reset()
    for action in actions[:300]:
        envs.step(action)
    assert env_state.restore(fresh, _through_a_checkpoint(env_state.snapshot(envs)))
    for action in actions[300:]:
        np.testing.assert_array_equal(envs.step(action)[0], fresh.step(action)[0])
    envs.close()
    fresh.close()


class Recorder(gym.Env[np.ndarray, int]):
    """Keeps the actions it is stepped with."""

    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.taken: list[int] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(1, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.taken.append(int(action))
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_sticky_actions_repeat_the_last_frame_s_action_with_their_probability():
    env = StickyActions(Recorder(), 0.25)
    env.reset(seed=0)
    given = np.arange(20_000) % 2  # every frame asks for another action than the last one took
    for action in given:
        env.step(int(action))
    taken = np.array(env.unwrapped.taken)
    assert taken[0] in (0, given[0])  # NOOP (0) before the first frame
    # a frame takes another action than asked where it sticks to the last frame's, and that frame took the one it
    # was asked for (it did not stick itself): m = p (1 - m), m = p / (1 + p) = 0.2
    assert abs((taken != given).mean() - 0.2) < 0.015  # about 5 standard deviations
    again = StickyActions(Recorder(), 0.25)
    again.reset(seed=0)
    for action in given[:100]:
        again.step(int(action))
    assert again.unwrapped.taken == list(taken[:100])  # seeded by the env's seed


class CBufferEnv(gym.Env[np.ndarray, int]):
    """An env whose state lives in a C buffer (as Box2D's world or an emulator's memory would), beside a spec, spaces
    and a callable, which hold none."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)
        self.action_space = gym.spaces.Discrete(2)
        self.shaping: Callable[[float], float] = abs
        self.position = array.array("d", [0.0])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.position[0] = float(self.np_random.uniform(-1, 1))
        return np.array(self.position), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.position[0] += 0.1 if action else -0.1
        return np.array(self.position), -self.shaping(self.position[0]), abs(self.position[0]) > 2, False, {}


def test_state_that_cannot_be_recorded_gives_no_snapshot_and_is_named():
    envs = make_vector_env(CBufferEnv, 2, seed=0, mode="sync")
    envs.reset(seed=0)
    assert env_state.snapshot(envs) is None
    assert env_state.uncaptured(envs) == "CBufferEnv.position is a array.array"
    assert not env_state.restore(envs, env_state.snapshot(envs))
    envs.close()


def test_envs_in_processes_of_their_own_give_no_snapshot():
    envs = make_vector_env("CartPole-v1", 2, seed=0, mode="async")
    envs.reset(seed=0)
    assert env_state.snapshot(envs) is None
    assert "processes of their own" in (env_state.uncaptured(envs) or "")
    envs.close()


def test_envpool_envs_give_no_snapshot_and_say_they_run_in_its_threads():
    pytest.importorskip("envpool")
    envs = make_vector_env("CartPole-v1", 2, seed=0, mode="envpool")
    envs.reset(seed=0)
    assert env_state.snapshot(envs) is None
    assert "in EnvPool's own threads" in (env_state.uncaptured(envs) or "")
    envs.close()

"""Environment construction: single envs (with DQN Atari preprocessing) and SAME_STEP vector envs.

Public entry points: :func:`make_env`, :func:`make_vector_env`, :func:`env_spec_info`,
:func:`resolve_env_spec` and :func:`finished_episodes`.

Vector-env contract (every backend: ``"sync"``, ``"async"``, ``"envpool"``)
--------------------------------------------------------------------------
* Autoreset is ``gymnasium.vector.AutoresetMode.SAME_STEP``: when sub-env ``i`` terminates or truncates
  during ``step``, it is reset inside that same ``step``. The returned ``obs[i]`` is already the first
  observation of the next episode; the true last observation of the finished episode is in
  ``info["final_obs"][i]`` (an object array, ``None`` for sub-envs that did not finish) with the bool mask
  ``info["_final_obs"]``. ``rewards[i]``, ``terminated[i]`` and ``truncated[i]`` belong to the finished
  episode. A training loop therefore bootstraps a *truncated* transition from ``info["final_obs"][i]``
  (never from ``obs[i]``) and does not bootstrap a *terminated* one. The keys are only present on steps
  where at least one sub-env finished.
* Finished-episode statistics are the **raw** (unclipped) game return and length, at
  ``info["episode"]`` = ``{"r": returns, "l": lengths, "t": seconds}`` (arrays of length ``n_envs``)
  with mask ``info["_episode"]``. Gymnasium itself puts them under ``info["final_info"]["episode"]`` in
  SAME_STEP mode; :class:`~rlfleet.envs.wrappers.LiftEpisodeStatistics` copies them to the top level.
  :func:`finished_episodes` turns either layout into ``[(env_index, return, length), ...]``.
* Sub-env ``i`` is seeded with ``seed + i`` (first reset and action space); the batched action space is
  seeded with ``seed``. ``vec.reset(seed=s)`` re-seeds sub-env ``i`` with ``s + i``.
* With Atari ``terminal_on_life_loss=True`` a life loss is reported as ``terminated`` (with a
  ``final_obs``) but the game continues after the autoreset; ``info["episode"]`` only appears when the
  whole game ends, so it is always the real game score.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import logging
import multiprocessing
import os
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.wrappers import (
    AtariPreprocessing,
    FrameStackObservation,
    RecordEpisodeStatistics,
    TimeLimit,
    TransformReward,
)

from rlfleet.envs.minatar import is_minatar_id, is_minatar_spec
from rlfleet.envs.minatar import make as make_minatar
from rlfleet.envs.minatar import register as register_minatar
from rlfleet.envs.processes import ENV_TIMEOUT_S, WatchedAsyncVectorEnv
from rlfleet.envs.wrappers import (
    ChannelsFirstImages,
    EnvPoolVectorEnv,
    FlatDictObservation,
    LiftEpisodeStatistics,
    SeedOnFirstReset,
    StickyActions,
    TerminalOnLifeLoss,
    ZeroBasedActions,
    has_action_start,
    has_channels_last_image,
    needs_flat_dict,
    sign_reward,
)
from rlfleet.fields import ConfigError, MissingExtraError, error_line

log = logging.getLogger(__name__)

__all__ = [
    "ATARI_OPTIONS",
    "CARTPOLE_NO_VELOCITY_ID",
    "VECTOR_MODES",
    "UnknownEnvError",
    "env_spec_info",
    "finished_episodes",
    "make_env",
    "make_vector_env",
    "resolve_vector_mode",
    "resolve_env_spec",
]

EnvSource = str | Callable[[], gym.Env]

CARTPOLE_NO_VELOCITY_ID = "rlfleet/CartPoleNoVel-v1"
KNOWN_REWARD_THRESHOLDS: dict[str, float] = {"Pendulum-v1": -250.0}
"""The "solved" return of ids whose Gymnasium spec has none (Pendulum: Tianshou's and the seed's −250)."""
VECTOR_MODES: tuple[str, ...] = ("auto", "sync", "async", "envpool")
ATARI_OPTIONS: tuple[str, ...] = (
    "frame_stack",
    "terminal_on_life_loss",
    "noop_max",
    "repeat_action_probability",
    "full_action_space",
    "clip_rewards",
    "max_episode_steps",
)
ATARI_FRAME_SKIP = 4
ATARI_SCREEN_SIZE = 84
ATARI_INSTALL_HINT = 'pip install "rlfleet[atari]"'
ENVPOOL_INSTALL_HINT = 'pip install "rlfleet[envpool]"'
MUJOCO_INSTALL_HINT = 'pip install "rlfleet[mujoco]"'


class UnknownEnvError(ValueError):
    """Raised when an environment id is not in Gymnasium's registry; the message suggests close matches."""


@dataclass(frozen=True)
class AtariOptions:
    """Validated Atari preprocessing options (see :func:`make_env`)."""

    frame_stack: int = 4
    terminal_on_life_loss: bool = False
    noop_max: int = 30
    repeat_action_probability: float | None = None
    full_action_space: bool = False
    clip_rewards: bool | None = None
    max_episode_steps: int | None = None

    def __post_init__(self) -> None:
        if not _whole(self.frame_stack) or self.frame_stack < 1:
            raise ValueError(f"frame_stack must be an int >= 1, got {self.frame_stack!r}")
        if not _whole(self.noop_max) or self.noop_max < 0:
            raise ValueError(f"noop_max must be an int >= 0, got {self.noop_max!r}")
        for name in ("terminal_on_life_loss", "full_action_space", "clip_rewards"):  # "no" would be true
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "clip_rewards" and value is None):
                raise ValueError(f"{name} must be true or false, got {value!r}")
        probability = self.repeat_action_probability  # a number, not a bool (`true` would be 1: every action sticks)
        if probability is not None and (
            isinstance(probability, bool) or not isinstance(probability, int | float) or not 0.0 <= probability <= 1.0
        ):
            raise ValueError(
                f"repeat_action_probability must be in [0, 1] (or None for the id's default), "
                f"got {self.repeat_action_probability!r}"
            )
        if self.max_episode_steps is not None and (not _whole(self.max_episode_steps) or self.max_episode_steps < 1):
            raise ValueError(f"max_episode_steps must be an int >= 1 or None, got {self.max_episode_steps!r}")


def _whole(value: Any) -> bool:
    """An int, not a bool (which Python counts as one: `frame_stack=true`)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _atari_options(env_id: str, env_kwargs: dict[str, Any]) -> AtariOptions:
    unknown = sorted(set(env_kwargs) - set(ATARI_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for Atari env {env_id!r}; valid options: {ATARI_OPTIONS}")
    return AtariOptions(**env_kwargs)


def _register_rlfleet_envs() -> None:
    """Register rlfleet's own ids (idempotent; called lazily, never at import time)."""
    if CARTPOLE_NO_VELOCITY_ID not in gym.registry:
        gym.register(
            id=CARTPOLE_NO_VELOCITY_ID,
            entry_point="rlfleet.envs.wrappers:make_cartpole_no_velocity",
            max_episode_steps=500,
            reward_threshold=475.0,
        )


def _import_ale() -> bool:
    """Import ale-py so that its ``ALE/...`` and ``...-v4`` ids are registered; False if not installed."""
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def resolve_env_spec(env_id: str) -> EnvSpec:
    """Return the registered ``EnvSpec`` of ``env_id``, registering ALE and rlfleet ids on demand.

    Raises:
        UnknownEnvError: ``env_id`` is not registered; the message lists close matches.
        MissingExtraError: an ``ALE/...`` id was asked for but ale-py is not installed.
    """
    if not isinstance(env_id, str) or not env_id:
        raise TypeError(f"env id must be a non-empty string, got {env_id!r}")
    _register_rlfleet_envs()
    if ":" in env_id:  # Gymnasium's "module:EnvId": importing the module registers the id
        module, _, env_id = env_id.partition(":")
        try:
            importlib.import_module(module)
        except (ImportError, TypeError, ValueError) as exc:  # TypeError, ValueError: a relative or empty name
            raise UnknownEnvError(f"cannot import {module!r}, the module of env id {module}:{env_id}: {exc}") from None
    if is_minatar_id(env_id):
        register_minatar(env_id)
    if env_id in gym.registry:
        return gym.spec(env_id)
    ale_available = _import_ale()
    if env_id.startswith("ALE/") and not ale_available:
        raise MissingExtraError(
            f"{env_id!r} is an Atari env and needs ale-py, which is not installed: {ATARI_INSTALL_HINT}"
        )
    if env_id in gym.registry:
        return gym.spec(env_id)
    matches = difflib.get_close_matches(env_id, list(gym.registry), n=5, cutoff=0.6)
    message = f"unknown environment id {env_id!r}"
    message += f"; did you mean {', '.join(repr(m) for m in matches)}?" if matches else "."
    if not ale_available:
        message += f" (Atari ids are only registered when ale-py is installed: {ATARI_INSTALL_HINT})"
    raise UnknownEnvError(message)


def _entry_point_name(spec: EnvSpec) -> str:
    entry_point = spec.entry_point
    if isinstance(entry_point, str):
        return entry_point
    return f"{getattr(entry_point, '__module__', '')}:{getattr(entry_point, '__qualname__', '')}"


def _is_atari_spec(spec: EnvSpec) -> bool:
    return _entry_point_name(spec).startswith("ale_py")


def _is_mujoco_spec(spec: EnvSpec) -> bool:
    return _entry_point_name(spec).startswith("gymnasium.envs.mujoco")


def _has_wrapper(env: gym.Env, wrapper_type: type[gym.Wrapper]) -> bool:
    layer: gym.Env = env
    while isinstance(layer, gym.Wrapper):
        if isinstance(layer, wrapper_type):
            return True
        layer = layer.env
    return False


def _quiet_ale() -> None:
    """Keep ALE's banner ("A.L.E: Arcade Learning Environment ...", "[Powered by Stella]") off the terminal.

    The emulator prints it when the first ``ALEInterface`` of a process is made, one line before ale-py's
    ``AtariEnv`` lowers the log level to errors, so a run printed it once per process: 12 times for PPO's
    8 async envs plus evaluation. Setting the (process-wide, static) level first, to the level AtariEnv sets
    anyway, keeps errors and drops the banner."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


def sticky_probability(spec: EnvSpec, options: AtariOptions) -> float:
    """The probability of a sticky action: `repeat_action_probability` given, else the id's own (0 for -v4 ids,
    0.25 for ALE/*-v5 ones, the ALE's default where an id names none)."""
    if options.repeat_action_probability is not None:
        return float(options.repeat_action_probability)
    return float(spec.kwargs.get("repeat_action_probability", 0.25))


def _make_atari(spec: EnvSpec, options: AtariOptions, *, training: bool, render_mode: str | None) -> gym.Env:
    """Build the DQN-preprocessed Atari env from Gymnasium's wrappers (see :func:`make_env`)."""
    _quiet_ale()
    ale_kwargs: dict[str, Any] = {
        "frameskip": 1,
        "full_action_space": options.full_action_space,
        "render_mode": render_mode,
    }
    sticky = sticky_probability(spec, options)
    ale_kwargs["repeat_action_probability"] = 0.0  # sticky actions of its own, whose state a snapshot keeps
    if options.max_episode_steps is not None:  # the TimeLimit below ends episodes: the ALE's own cap (0: none) would
        ale_kwargs["max_num_frames_per_episode"] = 0  # cut a longer bound at 108k frames, unlike EnvPool's adapter
    env = gym.make(spec.id, **ale_kwargs)
    if sticky > 0:
        env = StickyActions(env, sticky)
    env = AtariPreprocessing(
        env,
        noop_max=options.noop_max,
        frame_skip=ATARI_FRAME_SKIP,
        screen_size=ATARI_SCREEN_SIZE,
        terminal_on_life_loss=False,  # handled by TerminalOnLifeLoss, which does not restart the game
        grayscale_obs=True,
        scale_obs=False,
    )
    if options.max_episode_steps is not None:
        env = TimeLimit(env, max_episode_steps=options.max_episode_steps)  # counts agent steps
    env = RecordEpisodeStatistics(env)  # sees raw rewards and whole games
    env = FrameStackObservation(env, stack_size=options.frame_stack)
    if training and options.terminal_on_life_loss:
        env = TerminalOnLifeLoss(env)
    clip_rewards = training if options.clip_rewards is None else options.clip_rewards
    if training and clip_rewards:
        env = TransformReward(env, sign_reward)
    return env


def route_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to the `rlfleet.envs` logger instead of stderr and a `MUJOCO_LOG.TXT` in the working
    folder (MuJoCo's own handler writes both): a deprecation in a model file Gymnasium ships (HalfCheetah's
    `settotalmass`) at DEBUG level, any other warning (an unstable simulation) once per text at WARNING level.
    Set when the first MuJoCo env is built, not at import; a `MissingExtraError` without MuJoCo."""
    try:
        import mujoco
    except ImportError:
        raise MissingExtraError(f"MuJoCo envs need mujoco, which is not installed: {MUJOCO_INSTALL_HINT}") from None
    except Exception as exc:  # the renderer MUJOCO_GL names does not load (osmesa without libOSMesa)
        raise ConfigError(
            f"MuJoCo does not load with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r} ({error_line(exc)}): "
            "leave MUJOCO_GL unset to train and evaluate without rendering, or install that renderer"
        ) from None

    if mujoco.get_mju_user_warning() is not None:  # set already (by rlfleet, or by the user's own handler)
        return
    seen: set[str] = set()

    def warn(text: str) -> None:
        text = text.strip()
        if "deprecated" in text:
            log.debug(f"MuJoCo: {text}")
        elif text not in seen:
            seen.add(text)
            log.warning(f"MuJoCo: {text}")

    mujoco.set_mju_user_warning(warn)


def make_env(
    env: EnvSource,
    *,
    seed: int | None = None,
    training: bool = True,
    render_mode: str | None = None,
    **env_kwargs: Any,
) -> gym.Env:
    """Build one environment, wrapped in ``RecordEpisodeStatistics``.

    Args:
        env: a Gymnasium id (``"CartPole-v1"``, ``"ALE/Pong-v5"``, ``"PongNoFrameskip-v4"``,
            ``"MinAtar/Breakout-v1"`` (see :mod:`rlfleet.envs.minatar`), ``"rlfleet/CartPoleNoVel-v1"``) or a
            zero-argument callable returning a ``gymnasium.Env``
            (then ``env_kwargs`` and ``render_mode`` must be left out; put them in the callable).
        seed: seeds the env's first ``reset()`` and its action/observation spaces (``None``: unseeded).
        training: for Atari, a training env clips rewards to their sign and may end episodes on life
            loss; an evaluation env (``False``) always gives raw rewards and whole games, and the
            training-only options ``clip_rewards``/``terminal_on_life_loss`` are ignored.
        render_mode: passed to ``gymnasium.make``.
        **env_kwargs: for Atari ids, the options in ``ATARI_OPTIONS``:
            ``frame_stack`` (4), ``terminal_on_life_loss`` (False), ``noop_max`` (30),
            ``repeat_action_probability`` (None: the id's own default, 0.25 for ``-v5`` ids, 0 for
            ``-v4``), ``full_action_space`` (False), ``clip_rewards`` (None: same as ``training``),
            ``max_episode_steps`` (None: the ALE's 108k-frame cap, i.e. 27k agent steps; counted in agent
            steps). For other ids they go to ``gymnasium.make`` (e.g. ``max_episode_steps``).

    Atari pipeline (Gymnasium wrappers, innermost first): ALE env with ``frameskip=1`` (the id's own frame skip,
    ``Pong-v4``'s random 2-4 included, is replaced by the fixed 4 below) ->
    :class:`~rlfleet.envs.wrappers.StickyActions` at every frame (the ALE's own are off: the action they repeat is
    not in its saved state; this wrapper's is) ->
    ``AtariPreprocessing`` (up to ``noop_max`` no-ops on reset, frame skip 4 with a max-pool over the last
    two frames, 84x84 grayscale, uint8) -> optional ``TimeLimit`` -> ``RecordEpisodeStatistics`` ->
    ``FrameStackObservation`` (observation ``(frame_stack, 84, 84)`` uint8) -> optional
    :class:`~rlfleet.envs.wrappers.TerminalOnLifeLoss` -> optional sign reward clipping.

    How a loop gets the real episode return: ``RecordEpisodeStatistics`` sits inside the reward clipping
    and the life-loss wrapper, so ``info["episode"]["r"]`` on the step that ends a game is the raw game
    score even though the rewards returned by ``step`` are clipped. In a vector env from
    :func:`make_vector_env` it is at ``info["episode"]`` (mask ``info["_episode"]``); see the module
    docstring, or use :func:`finished_episodes`.

    Tuple and nested Dict observations reach the agent as one flat Dict (:class:`~rlfleet.envs.wrappers.
    FlatDictObservation`: Blackjack-v1's Tuple becomes a Dict keyed "0", "1", "2"), and channels-last uint8 images
    (``(H, W, 3)``: CarRacing, pixel wrappers) as ``(C, H, W)``, the CNN encoders' layout (:class:`~rlfleet.envs.
    wrappers.ChannelsFirstImages`). ``Discrete`` and
    ``MultiDiscrete`` actions that start at a value other than 0 reach it 0-based (:class:`~rlfleet.envs.
    wrappers.ZeroBasedActions`: the env gets start + the agent's choice).

    Raises:
        UnknownEnvError: unknown id (the message suggests close matches).
        MissingExtraError: an ``ALE/...`` id without ale-py installed, a ``MinAtar/...`` one without minatar, a
            MuJoCo one without mujoco.
        ValueError: unknown or invalid options.
    """
    if isinstance(env, str):
        spec = resolve_env_spec(env)
        if _is_atari_spec(spec):
            built = _make_atari(spec, _atari_options(env, env_kwargs), training=training, render_mode=render_mode)
        else:
            atari_only = sorted(set(env_kwargs) & (set(ATARI_OPTIONS) - {"max_episode_steps"}))
            if atari_only:
                raise ValueError(f"option(s) {atari_only} only apply to Atari envs, not {env!r}")
            if _is_mujoco_spec(spec):
                route_mujoco_warnings()
            if is_minatar_spec(spec):
                built = RecordEpisodeStatistics(make_minatar(spec, render_mode, env_kwargs))
            else:
                rendering: dict[str, Any] = {} if render_mode is None else {"render_mode": render_mode}  # or none
                built = RecordEpisodeStatistics(gym.make(spec.id, **rendering, **env_kwargs))
    elif callable(env):
        if env_kwargs or render_mode is not None:
            given = sorted(env_kwargs) + (["render_mode"] if render_mode is not None else [])
            raise ValueError(f"options {given} cannot be applied to a callable env; configure it inside the callable")
        built = env()
        if not isinstance(built, gym.Env):
            raise TypeError(f"the env callable must return a gymnasium.Env, got {type(built).__name__}")
        if not _has_wrapper(built, RecordEpisodeStatistics):
            built = RecordEpisodeStatistics(built)
    else:
        raise TypeError(f"env must be a Gymnasium id or a zero-argument callable, got {type(env).__name__}")
    if needs_flat_dict(built.observation_space):  # Tuple and nested Dict observations: one flat Dict
        built = FlatDictObservation(built)
    if has_channels_last_image(built.observation_space):  # (H, W, C) frames: (C, H, W), as the CNNs take them
        built = ChannelsFirstImages(built)
    if has_action_start(built.action_space):  # Discrete(n, start) actions: the agent picks 0..n−1
        built = ZeroBasedActions(built)
    if seed is not None:
        built = SeedOnFirstReset(built, seed)
    return built


def resolve_vector_mode(env: EnvSource, n_envs: int, mode: str) -> str:
    """The mode `make_vector_env(env, n_envs, mode=mode)` builds: `mode`, or for auto the one it picks."""
    if mode != "auto":
        return mode
    if n_envs > 1 and isinstance(env, str):
        spec = resolve_env_spec(env)
        if _is_atari_spec(spec) or _is_mujoco_spec(spec):
            return "async"
    return "sync"


def make_vector_env(
    env: EnvSource,
    n_envs: int,
    *,
    seed: int | None = None,
    mode: str = "auto",
    training: bool = True,
    context: str | None = "spawn",
    timeout_s: float | None = ENV_TIMEOUT_S,
    **env_kwargs: Any,
) -> VectorEnv:
    """Build ``n_envs`` copies of an env as a SAME_STEP vector env (contract in the module docstring).

    Args:
        env: a Gymnasium id or a zero-argument callable (for ``"async"`` it must be picklable: a
            module-level function or a ``functools.partial`` of one).
        n_envs: number of sub-envs (>= 1).
        seed: sub-env ``i`` is seeded with ``seed + i``; the batched action space with ``seed``.
        mode: ``"sync"`` (one process), ``"async"`` (one subprocess per sub-env, shared memory),
            ``"envpool"`` (EnvPool's C++ pool, ids only) or ``"auto"``: async for Atari/MuJoCo ids with
            ``n_envs > 1``, otherwise sync (callables always sync).
        training: see :func:`make_env`.
        context: multiprocessing start method for ``"async"`` (default ``"spawn"``, safe with torch
            and threads in the parent).
        timeout_s: for ``"async"``, how long an env process may take to answer a reset, step or call (None: for
            ever); one that dies or does not answer in time is an ``EnvProcessError`` naming it
            (:mod:`rlfleet.envs.processes`).
        **env_kwargs: passed to :func:`make_env` (``render_mode`` and the Atari options included).

    Returns:
        A ``VectorEnv``; for sync/async a :class:`~rlfleet.envs.wrappers.LiftEpisodeStatistics` around
        Gymnasium's vector env (use ``.unwrapped`` for the raw one; ``envs``/``call``/``get_attr`` are
        forwarded), for envpool an :class:`~rlfleet.envs.wrappers.EnvPoolVectorEnv`.
    """
    if not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"n_envs must be an int >= 1, got {n_envs!r}")
    if mode not in VECTOR_MODES:
        raise ValueError(f"unknown vector env mode {mode!r}; valid modes: {VECTOR_MODES}")
    if seed is not None and not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    if isinstance(env, str):
        spec = resolve_env_spec(env)
        if _is_atari_spec(spec):
            _atari_options(env, {k: v for k, v in env_kwargs.items() if k != "render_mode"})
    resolved_mode = resolve_vector_mode(env, n_envs, mode)
    if resolved_mode == "envpool":
        return _make_envpool_vector_env(env, n_envs, seed=seed, training=training, env_kwargs=env_kwargs)

    env_fns = [
        functools.partial(make_env, env, seed=None if seed is None else int(seed) + i, training=training, **env_kwargs)
        for i in range(n_envs)
    ]
    vector_env: VectorEnv
    if resolved_mode == "sync":
        vector_env = SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
    else:
        if context is not None and context not in multiprocessing.get_all_start_methods():
            valid_contexts = multiprocessing.get_all_start_methods()
            raise ValueError(f"unknown multiprocessing context {context!r}; valid: {valid_contexts}")
        if not isinstance(env, str):
            try:
                pickle.dumps(env)
            except Exception as error:  # pickling failures raise several exception types
                raise ValueError(
                    'mode="async" needs a picklable env callable (a module-level function or a '
                    f"functools.partial of one), got {env!r}: {error}"
                ) from error
        vector_env = WatchedAsyncVectorEnv(
            env_fns,
            shared_memory=True,
            context=context,
            autoreset_mode=AutoresetMode.SAME_STEP,
            timeout_s=timeout_s,
            name="training env" if training else "evaluation env",
        )
    if seed is not None:
        vector_env.action_space.seed(int(seed))
    return LiftEpisodeStatistics(vector_env)


def _envpool_atari_task(env_id: str, available: set[str]) -> str:
    """Map ``ALE/Pong-v5`` / ``PongNoFrameskip-v4`` to EnvPool's ``Pong-v5``."""
    name = env_id.removeprefix("ALE/").split("-v")[0]
    name = re.sub(r"(NoFrameskip|Deterministic|-ram)$", "", name)
    task = f"{name}-v5"
    if task not in available:
        raise ValueError(f"EnvPool has no Atari task for {env_id!r} (looked for {task!r})")
    return task


def _build_envpool(task_id: str, num_envs: int, pool_kwargs: dict[str, Any], seeds: list[int] | None) -> Any:
    import warnings

    envpool = import_envpool()
    if seeds is None:
        first = int(np.random.default_rng().integers(0, 2**31 - 1 - num_envs))
        seeds = [first + i for i in range(num_envs)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # EnvPool's float64 -> float32 Box bounds notices
        pool = envpool.make_gymnasium(task_id, num_envs=num_envs, batch_size=num_envs, seed=seeds, **pool_kwargs)
        _ = pool.observation_space, pool.action_space  # built (and cached) lazily, with the warnings
    return pool


def import_envpool() -> Any:
    """The `envpool` module; a `MissingExtraError` naming the install line without it (a run checks this before it
    writes anything)."""
    try:
        import envpool
    except ImportError:
        raise MissingExtraError(
            f"the envpool vector mode needs EnvPool, which is not installed: {ENVPOOL_INSTALL_HINT} (or use the sync "
            "or async mode)"
        ) from None
    return envpool


def _make_envpool_vector_env(
    env: EnvSource, n_envs: int, *, seed: int | None, training: bool, env_kwargs: dict[str, Any]
) -> EnvPoolVectorEnv:
    envpool = import_envpool()
    if not isinstance(env, str):
        raise ValueError(f'mode="envpool" needs a Gymnasium id, not a callable ({env!r})')
    if env_kwargs.get("render_mode") is not None:
        raise ValueError('mode="envpool" does not support render_mode; use mode="sync"')
    env_kwargs = {k: v for k, v in env_kwargs.items() if k != "render_mode"}
    spec = resolve_env_spec(env)
    available = set(envpool.list_all_envs())
    clip_rewards = terminal_on_life_loss = False
    if _is_atari_spec(spec):
        options = _atari_options(env, env_kwargs)
        task_id = _envpool_atari_task(env, available)
        repeat_action_probability = sticky_probability(spec, options)
        max_frames = int(spec.kwargs.get("max_num_frames_per_episode", 108_000))
        pool_kwargs: dict[str, Any] = {
            "stack_num": options.frame_stack,
            "noop_max": options.noop_max,
            "frame_skip": ATARI_FRAME_SKIP,
            "img_height": ATARI_SCREEN_SIZE,
            "img_width": ATARI_SCREEN_SIZE,
            "gray_scale": True,
            "episodic_life": False,  # the adapter does life-loss terminals without restarting the game
            "reward_clip": False,  # the adapter clips, so episode statistics keep raw scores
            "use_fire_reset": False,  # match Gymnasium's AtariPreprocessing
            "repeat_action_probability": repeat_action_probability,
            "full_action_space": options.full_action_space,
            "max_episode_steps": options.max_episode_steps or max_frames // ATARI_FRAME_SKIP,
        }
        if training:
            clip_rewards = training if options.clip_rewards is None else options.clip_rewards
            terminal_on_life_loss = options.terminal_on_life_loss
    else:
        if spec.id not in available:
            matches = difflib.get_close_matches(spec.id, sorted(available), n=5, cutoff=0.6)
            raise ValueError(f"EnvPool has no task {spec.id!r}; close EnvPool tasks: {matches}")
        task_id, pool_kwargs = spec.id, dict(env_kwargs)
    return EnvPoolVectorEnv(
        functools.partial(_build_envpool, task_id, n_envs, pool_kwargs),
        n_envs,
        seed=None if seed is None else int(seed),
        clip_rewards=clip_rewards,
        terminal_on_life_loss=terminal_on_life_loss,
        env_id=spec.id,
    )


def _time_limit_steps(env: gym.Env) -> int | None:
    layer: gym.Env = env
    while isinstance(layer, gym.Wrapper):
        if isinstance(layer, TimeLimit):
            return int(layer._max_episode_steps)
        layer = layer.env
    return None


def _reward_threshold(spec: EnvSpec | None) -> float | None:
    """The spec's reward_threshold, else the one in `KNOWN_REWARD_THRESHOLDS`, else None."""
    if spec is None:
        return None
    if spec.reward_threshold is not None:
        return spec.reward_threshold
    return KNOWN_REWARD_THRESHOLDS.get(spec.id)


def _family(spec: EnvSpec | None, is_atari: bool, action_space: gym.Space) -> str | None:
    """Which preset an env picks when none is given: Atari, MinAtar, MuJoCo, other Box actions, or none (defaults)."""
    if is_atari:
        return "atari"
    if spec is not None and is_minatar_spec(spec):
        return "minatar"
    if spec is not None and _is_mujoco_spec(spec):
        return "mujoco"
    return "continuous" if isinstance(action_space, gym.spaces.Box) else None


def env_spec_info(env: EnvSource, **env_kwargs: Any) -> dict[str, Any]:
    """Describe an env cheaply (builds one with :func:`make_env`, reads it, closes it).

    Returns:
        ``{"id", "reward_threshold" (None if unknown), "max_episode_steps" (agent steps, None if
        unbounded), "is_atari", "family" ("atari", "minatar", "mujoco", "continuous" for any other env with Box actions,
        or None: picks an algorithm's preset of that name),
        "observation_space", "action_space"}``; spaces are those seen by an agent (for Atari: the
        preprocessed, frame-stacked ones).
    """
    built = make_env(env, **env_kwargs)
    try:
        spec = resolve_env_spec(env) if isinstance(env, str) else built.unwrapped.spec
        is_atari = hasattr(built.unwrapped, "ale")
        max_episode_steps = _time_limit_steps(built)
        if max_episode_steps is None and spec is not None:
            max_episode_steps = spec.max_episode_steps
            if max_episode_steps is None and is_atari and "max_num_frames_per_episode" in spec.kwargs:
                max_episode_steps = int(spec.kwargs["max_num_frames_per_episode"]) // ATARI_FRAME_SKIP
        return {
            "id": spec.id if spec is not None else None,
            "reward_threshold": _reward_threshold(spec),
            "max_episode_steps": max_episode_steps,
            "is_atari": is_atari,
            "family": _family(spec, is_atari, built.action_space),
            "observation_space": built.observation_space,
            "action_space": built.action_space,
        }
    finally:
        built.close()


def finished_episodes(info: dict[str, Any]) -> list[tuple[int, float, int]]:
    """Return ``[(env_index, raw_return, length), ...]`` for the episodes that ended in a vector step.

    Reads ``info["episode"]``/``info["_episode"]``, or Gymnasium's SAME_STEP layout
    ``info["final_info"]["episode"]`` when the former is absent; ``[]`` when no episode ended.
    """
    source = info
    if "episode" not in source:
        source = info.get("final_info") or {}
    if "episode" not in source:
        return []
    episode, mask = source["episode"], np.asarray(source["_episode"], dtype=np.bool_)
    return [(int(i), float(episode["r"][i]), int(episode["l"][i])) for i in np.flatnonzero(mask)]

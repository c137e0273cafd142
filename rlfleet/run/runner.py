"""What every architecture's run shares (`RunBase`): the resolved configs, the algorithm, the run folder, greedy
evaluation, logging, best/latest checkpoints, stop conditions (steps, solved, time limit, Ctrl-C through
`StopRequest`), `result.json` and `curves.png`. The architectures in `rlfleet.arch` build on it; nothing here
imports them."""

from __future__ import annotations

import abc
import contextlib
import copy
import dataclasses
import functools
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rlfleet.algos import DEFAULT_ARCH, resolve
from rlfleet.algos.spaces import UnsupportedSpaceError
from rlfleet.backends.base import RunFailure, ServiceError, ServiceUnavailable
from rlfleet.data.buffer import PrioritizedReplayBuffer, ReplayBuffer
from rlfleet.device import placement_note, resolve_device
from rlfleet.envs import ENV_TIMEOUT_S, EnvProcessError, import_envpool, make_vector_env, resolve_vector_mode
from rlfleet.envs.kwargs import env_info
from rlfleet.envs.normalize import (
    ObsStats,
    RewardNormalizer,
    make_obs_stats,
    normalize_observations,
)
from rlfleet.fields import idle_setting
from rlfleet.nets.encoders import UnsupportedObservationError, has_image
from rlfleet.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rlfleet.run.config import (
    ConfigError,
    NoOptions,
    RunConfig,
    build_algo_config,
    build_options,
    check_observation_space,
    check_run_config,
    check_upfront_memory,
    drop_preset_normalisation,
    fit_preset_replay,
    resolve_stop_return,
    resolve_torch_threads,
    torch_threads_note,
)
from rlfleet.run.config import log as notes
from rlfleet.run.evaluate import cut_note, episode_bound, evaluate
from rlfleet.run.hints import exploration_hint
from rlfleet.run.logger import RunLogger, json_text
from rlfleet.run.paths import check_output_folder, name_part
from rlfleet.run.plot import plot_runs

LOG_EVERY = 1_000  # env steps between training-metric log lines


@dataclass
class RunResult(Mapping[str, Any]):
    """What `train` returns; the same fields are in `<run_dir>/result.json` (where a value that is not finite is the
    text "inf", "-inf" or "nan": strict JSON), and it reads as that dict does
    (`result["solved"]`, `"solved" in result`, `dict(result)`). `updates` counts the learner's updates: one per
    rollout of an on-policy algorithm, one per gradient step of a replay algorithm (`gradient_steps` per pass), on
    every architecture."""

    run_dir: Path
    result: dict[str, Any]
    algo: Any = field(repr=False, default=None)

    def __getitem__(self, key: str) -> Any:
        return self.result[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.result)

    def __len__(self) -> int:
        return len(self.result)


class EvaluationAbandoned(Exception):
    """A stop request during a run's final evaluation (`RunBase.finish`)."""


class StopRequest:
    """Turns the first Ctrl-C (SIGINT), or SIGTERM (what `kill`, `timeout`, a batch scheduler's preemption or a
    container's stop sends), into a polite stop (checkpoint, clean exit); a second one interrupts. `on_request`, if
    given, is called at the first (from the signal handler: it must not take a lock)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_request: Callable[[], None] | None = None) -> None:
        self.requested = False
        self.on_request = on_request
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.on_request is not None:
            self.on_request()

    def __exit__(self, *exc: object) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)


@contextlib.contextmanager
def workers_ignore_sigint() -> Iterator[None]:
    """Start env worker processes with Ctrl-C ignored (a terminal sends SIGINT to the whole process group):
    only the trainer reacts to it, stops politely and then closes its workers itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the processes started here
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_name(cfg: RunConfig) -> str:
    env = name_part(cfg.env)
    return f"{cfg.algo}-{env}-s{cfg.seed}-{datetime.now():%Y%m%d-%H%M%S}"


def _default_run_dir(cfg: RunConfig) -> Path:
    """`<logdir>/<algo>-<env>-s<seed>-<timestamp>`, with `-2`, `-3`, ... when runs started in the same second
    took it already (a name given with --name is never changed: an existing one is an error)."""
    name = _run_name(cfg)
    path, k = Path(cfg.logdir) / name, 2
    while path.exists() and any(path.iterdir()):
        path, k = Path(cfg.logdir) / f"{name}-{k}", k + 1
    return path


log = logging.getLogger(__name__)
WORKERS = logging.getLogger("rlfleet.workers")
"""Worker trouble (deaths, restarts, stalls, gossip and group news): INFO goes to the run's `workers.log` only,
WARNING to the terminal too (`run_log`)."""
WORKERS.setLevel(logging.INFO)


@contextlib.contextmanager
def run_log(run_dir: Path) -> Iterator[None]:
    """While a run runs, rlfleet's one logging channel has the run's handlers: what `WORKERS` says goes to
    `<run>/workers.log` as "[step N] text" (`extra={"step": N}`), and what any rlfleet logger says at WARNING or
    above goes to stderr, unless the application has set up logging of its own (a root handler)."""
    to_file = logging.FileHandler(run_dir / "workers.log", delay=True)  # no file until something is said
    to_file.setFormatter(logging.Formatter("[step %(step)s] %(message)s"))
    handlers: list[tuple[logging.Logger, logging.Handler]] = [(WORKERS, to_file)]
    if not logging.getLogger().handlers:
        shown = logging.StreamHandler()  # the stderr of now (a test's capture, say)
        shown.setLevel(logging.WARNING)
        shown.setFormatter(logging.Formatter("%(message)s"))
        handlers.append((logging.getLogger("rlfleet"), shown))
    for logger, handler in handlers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger, handler in handlers:
            logger.removeHandler(handler)
            handler.close()


def build_algorithm(cfg: RunConfig, algo_cfg: Any, info: dict[str, Any], seed: int, device: Any) -> Any:
    """Algorithm `cfg.algo` built with `algo_cfg` for the env's spaces (`info`: `env_info`); a space it does not
    take is one `UnsupportedSpaceError`, a config value it rejects one `ConfigError`."""
    algo_cls = resolve(cfg.algo)[0]
    try:
        return algo_cls(algo_cfg, info["observation_space"], info["action_space"], seed=seed, device=device)
    except UnsupportedSpaceError:
        raise
    except UnsupportedObservationError as exc:  # one the encoders cannot take: a space error, not the config's
        raise UnsupportedSpaceError(f"{cfg.env}: {exc}") from None
    except ValueError as exc:  # a config value the algorithm rejects (unknown encoder, activation, ...)
        raise ConfigError(f"bad {cfg.algo} config: {exc}") from None


FAILURES = (RunFailure, EnvProcessError, ServiceError, ServiceUnavailable)
"""What a run cannot go on past: its loop stops as cleanly as on Ctrl-C (a checkpoint, `result.json` with `stopped_by`
"failure"), then `RunBase.conclude` raises it as a `RunFailure` (`as_failure`). Besides `RunFailure`s (workers or
services that keep crashing, roles that cannot be placed): an env process that died or hung, a service method that
raised where the coordinator called it (its error in the failure's first line, its traceback after) and a service
that stayed unreachable."""


def as_failure(exc: Exception) -> RunFailure:
    """One of `FAILURES` as the `RunFailure` a run raises."""
    return exc if isinstance(exc, RunFailure) else RunFailure(str(exc))


GAUSSIAN_ONLY = ("log_std", "init_std")
"""The fields of a Gaussian policy's σ (pg, a2c, a3c, ppo), which only Box actions have."""


def gaussian_setting(given: dict[str, Any], action_space: Any, preset: str | None = None) -> None:
    """`--set log_std=...` or `init_std=...` (`given`) where the actions are not Box ones: one `ConfigError`, since the
    policy has no σ for them to set. With `preset`: the settings of that preset, which the user named (`--preset
    continuous` on a Discrete env)."""
    idle = [key for key in GAUSSIAN_ONLY if key in given]
    if idle and isinstance(action_space, gym.spaces.Space) and not isinstance(action_space, gym.spaces.Box):
        setting = f"{idle[0]}={given[idle[0]]}"
        if preset is not None:
            raise ConfigError(
                f"--preset {preset} sets {setting}, which has no effect on {action_space} actions: it is a preset for "
                "Box actions; leave --preset out, or name another"
            )
        raise ConfigError(
            f"--set {setting} has no effect on {action_space} actions: it sets a Gaussian policy's σ, "
            "which only Box actions have; leave it out"
        )


@dataclass
class ResolvedConfig:
    """A run's configuration as `RunBase.resolve_config` resolved it."""

    opts: Any  # the architecture's `Options`
    env_info: dict[str, Any]
    algo_cfg: Any
    preset: str | None
    total_steps: int
    eval_every: int


class RunBase(abc.ABC):
    """What every architecture's run shares: the resolved configs, the algorithm, the run folder, greedy
    evaluation on separate envs, the bookkeeping after each update (logging, evaluation, best/latest
    checkpoints, stop checks), `result.json` and `curves.png`.

    A subclass provides the training itself: `env_steps` (steps taken so far, over all actors),
    `episodes`, `_payload_extra(with_data)`/`_restore_extra(payload)` and `run()`, and declares its own
    options as a dataclass (`Options`), which it reads as `self.opts` (from `cfg.options`).
    """

    Options: type = NoOptions
    """The architecture's own options: a dataclass whose fields declare their defaults and ranges."""

    log_every = LOG_EVERY
    """Steps between training-metric log lines."""
    min_eval_every = 2_000
    """The default evaluation interval is max(min_eval_every, total steps / 50)."""
    single_process = False
    """True where the learner has its process to itself (no learner or sampler processes beside it): `torch_threads`
    "auto" then gives a CNN learner every usable core (`resolve_torch_threads`)."""
    presets: dict[str, str] = {}
    """The architecture's own presets by env family (e.g. apex's paper settings for Atari envs: {"atari": "apex"}):
    picked, when the algorithm has a preset of that name, where no --preset is given, before the family's own."""
    switched_on: tuple[str, ...] = ()
    """Algorithm switches the architecture turns on whatever the config says (apex: `prioritized`): the settings
    that need them are not idle (`idle_setting`)."""
    runs_normalisation = True
    """False where workers step their own envs: `obs_norm` and `reward_norm`, whose running statistics live beside
    the training envs, then run only if the user set them (and the architecture refuses them in `check_config`); a
    preset's are switched off (`drop_preset_normalisation`)."""

    takes_vector_mode = False
    """True where the training envs are the run's own vector env, which `--vector-mode` builds (`single`)."""

    buffer: ReplayBuffer | None
    """A replay architecture's buffer, which `replay_updates` samples (set by the architecture)."""
    eval_envs: VectorEnv
    """The evaluation envs (`make_eval_envs`, set by the architecture)."""
    _last_log: tuple[float, int]  # (time, env steps) of the last log row, from `start_logging` on
    evals_at_start: int
    """Evaluations the run had made when this invocation started (a resumed run's: its checkpoint's)."""
    _invocation_start: float
    resolved: ResolvedConfig
    """The run's configuration as `resolve_config` resolved it."""
    resuming: bool
    """The run goes on from a checkpoint: it keeps the settings it started with, even one that a new run would refuse
    for doing nothing (from a version that accepted it)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Each architecture's `__init__` starts processes (env processes, a backend's workers or private Ray
        instance) and goes on (a restore, the eval envs, the config): whatever ends it after that, an error or a
        Ctrl-C, gives back what it started (`abandon`) before it propagates, as `run()` does at its end."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        @functools.wraps(init)
        def init_or_abandon(self: RunBase, *args: Any, **kw: Any) -> None:
            try:
                init(self, *args, **kw)
            except BaseException:
                self.abandon()
                raise

        cls.__init__ = init_or_abandon  # type: ignore[method-assign]

    def abandon(self) -> None:
        """Give back what a runner whose `__init__` failed has started: its training and eval envs, if built, and its
        backend, if started (its private Ray instance, with its folder, token and log; a connection it made).
        Idempotent (an architecture's `__init__` and its base's both call it)."""
        for name in ("envs", "eval_envs"):
            envs = self.__dict__.get(name)
            if envs is not None:
                with contextlib.suppress(Exception):
                    envs.close()
        backend = self.__dict__.get("backend")
        if backend is not None:
            backend.close()

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        self._prepare(cfg, resuming=resume_from is not None)
        if run_dir is None:
            check_output_folder(cfg.logdir, "--logdir")
        self.run_dir = run_dir or (Path(cfg.logdir) / cfg.name if cfg.name else _default_run_dir(cfg))
        check_output_folder(self.run_dir, "run folder")
        if resume_from is None and self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise ConfigError(
                f"run folder {self.run_dir} already exists; use --resume {self.run_dir} or another --name"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.callbacks = callbacks or []
        self.state: dict[str, Any] = {  # checkpointed; architectures add counters of their own
            "updates": 0,
            "next_eval": self.eval_every,
            "next_checkpoint": self.checkpoint_every,
            "next_log": self.log_every,
            "evals": 0,
            "best_eval": -float("inf"),
            "solved_at_step": None,
            "solved_at_s": None,
            "elapsed": 0.0,
            "last_eval": None,
        }
        self.stopped_by = "steps"
        self._cut_noted = False  # `_note_cut` has said so in this invocation

    @classmethod
    def checked(cls, cfg: RunConfig) -> RunBase:
        """A run of `cfg` made as far as its checks and no further: its configuration resolved (`resolved`), its
        algorithm built and the architecture's own `check_config` passed, with nothing written and nothing started
        (what `rlfleet.check_run` makes); a problem is the one line `train` would give."""
        run = cls.__new__(cls)
        run._prepare(cfg, resuming=False)
        return run

    def _prepare(self, cfg: RunConfig, resuming: bool) -> None:
        """What a run does before it touches the disk: resolve `cfg` (`resolve_config`), pick the threads and the
        device, build the algorithm and its normalisation state, and refuse what the architecture cannot run
        (`check_config`). `resuming`: the run goes on from a checkpoint (`self.resuming`)."""
        self.resuming = resuming
        self.resolved = resolved = self.resolve_config(cfg, resuming=resuming)
        self.opts, self.env_info, self.algo_cfg, self.preset = (
            resolved.opts, resolved.env_info, resolved.algo_cfg, resolved.preset
        )  # fmt: skip
        info = self.env_info
        self.cfg = cfg
        self.total_steps, self.eval_every = resolved.total_steps, resolved.eval_every
        self.eval_max_steps = episode_bound(info["max_episode_steps"], cfg.eval_max_steps)
        self.checkpoint_every = cfg.checkpoint_every or 10 * self.eval_every
        # a CNN learner: images, and an algorithm whose `encoder` makes CNNs of them (ddpg, td3, sac have none)
        convolutional = has_image(info["observation_space"]) and getattr(self.algo_cfg, "encoder", "mlp") != "mlp"
        self.torch_threads = resolve_torch_threads(
            cfg.torch_threads, single_process=self.single_process, convolutional=convolutional
        )
        torch.set_num_threads(self.torch_threads)
        arch = cfg.arch or DEFAULT_ARCH.get(cfg.algo, "single")
        self.device = resolve_device(cfg.device, convolutional, arch)
        torch.manual_seed(cfg.seed)
        # build the algorithm before touching the disk: a wrong action space fails here, cleanly
        self.algo = self.build_algo(cfg.seed)
        self.obs_stats = self.make_obs_stats()
        self.reward_norm = self.make_reward_norm()
        self.check_config()
        self.stop_return = resolve_stop_return(cfg.stop_return, info["reward_threshold"], cfg.env, cfg.env_kwargs)
        placement = placement_note(self.device, self.algo, workers_act=not self.single_process, arch=arch,
                                   workers_learn=self.workers_learn_on_device())  # fmt: skip
        for note in (torch_threads_note(cfg.torch_threads, self.torch_threads), placement):  # once all checks passed
            if note is not None:
                notes.info(note)
        threads = self.threads_not_learning()
        if threads is not None:
            notes.warning(threads)

    def threads_not_learning(self) -> str | None:
        """Where `--torch-threads` given as a count does not reach the learning (its learners are processes of their
        own), the line that says so."""
        return None

    @classmethod
    def resolve_config(cls, cfg: RunConfig, resuming: bool = False) -> ResolvedConfig:
        """The run's configuration resolved on this architecture, before anything is built or written: every run
        option checked, the architecture's `Options`, the env's spaces and family (a keyword it refuses: one line),
        the algorithm's config (preset, `--set`, `--n-envs`; a preset's normalisation off where workers step their
        own envs; a preset's replay fitted to the machine's memory), the steps and the evaluation interval.
        Settings that would do nothing are refused in a new run only: a `resuming` one keeps what it started with."""
        check_run_config(cfg)  # every option's type and range, as RunConfig declares them
        opts = build_options(cls.Options, cfg.options, cfg.arch)
        info = env_info(cfg.env, cfg.env_kwargs)
        algo_cfg, preset = build_algo_config(
            cfg.algo, cfg.preset, cfg.overrides, info["family"], cfg.env, cfg.arch, cls.presets
        )
        if cfg.n_envs is not None and "n_envs" in cfg.overrides and cfg.n_envs != algo_cfg.n_envs and not resuming:
            raise ConfigError(f"--n-envs {cfg.n_envs} and --set n_envs={cfg.overrides['n_envs']} disagree: give one")
        steps_twice = cfg.steps is not None and "total_steps" in cfg.overrides and cfg.steps != algo_cfg.total_steps
        if steps_twice and not resuming:
            raise ConfigError(
                f"--steps {cfg.steps} and --set total_steps={cfg.overrides['total_steps']} disagree: give one"
            )
        if cfg.n_envs is not None:
            algo_cfg.n_envs = cfg.n_envs
        if not resuming:
            idle_setting(algo_cfg, cfg.overrides, "--set", on=cls.switched_on)
            gaussian_setting(cfg.overrides, info.get("action_space"))
            named = resolve(cfg.algo)[2].get(preset) if cfg.preset is not None and preset else None  # one given
            if named is not None:
                gaussian_setting(named, info.get("action_space"), preset=preset)
            cls.check_env_options(cfg, info, algo_cfg)
        else:  # a resume may give --env-timeout-s anew
            cls.check_env_timeout(cfg, info, algo_cfg)
        if not cls.runs_normalisation:
            drop_preset_normalisation(algo_cfg, cfg.overrides, cfg.arch, preset)
        check_observation_space(info["observation_space"])
        fit_preset_replay(algo_cfg, cfg.overrides, info["observation_space"], preset)
        check_upfront_memory(algo_cfg, info["observation_space"])
        total_steps = cfg.steps if cfg.steps is not None else algo_cfg.total_steps
        eval_every = cfg.eval_every or max(cls.min_eval_every, total_steps // 50)
        return ResolvedConfig(opts, info, algo_cfg, preset, total_steps, eval_every)

    @classmethod
    def check_env_options(cls, cfg: RunConfig, info: dict[str, Any], algo_cfg: Any) -> None:
        """`--vector-mode` and `--env-timeout-s` where they act: the first on an architecture that steps its training
        envs as the run's own vector env (`takes_vector_mode`) or on Atari (whose evaluation envs follow it on every
        architecture), the second where the run has env processes (its training envs, or on Atari its evaluation
        envs, in async mode). Given elsewhere: one `ConfigError`."""
        if cfg.vector_mode != "auto" and not cls.takes_vector_mode and not info["is_atari"]:
            arch = cfg.arch or DEFAULT_ARCH.get(cfg.algo, "single")
            where = "a PettingZoo env" if info["family"] == "multi_agent" else f"--arch {arch}"
            raise ConfigError(
                f"--vector-mode {cfg.vector_mode} has no effect on {where}: only --arch single steps training envs "
                "of its own as a vector env (and on Atari the evaluation envs of every architecture follow it)"
            )
        if cfg.vector_mode == "envpool":  # an env, or a keyword, EnvPool lacks: one line now, not an empty run folder
            import_envpool()
            try:
                make_vector_env(cfg.env, 1, seed=0, mode="envpool", training=True, **cfg.env_kwargs).close()
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"--vector-mode envpool cannot run {cfg.env}: {str(exc).splitlines()[0]}") from None
        cls.check_env_timeout(cfg, info, algo_cfg)

    @classmethod
    def check_env_timeout(cls, cfg: RunConfig, info: dict[str, Any], algo_cfg: Any) -> None:
        """`--env-timeout-s` where the run has env processes (`check_env_options`); elsewhere one `ConfigError`."""
        if cfg.env_timeout_s != ENV_TIMEOUT_S:
            mode = cfg.vector_mode
            training = cls.takes_vector_mode and resolve_vector_mode(cfg.env, algo_cfg.n_envs, mode) == "async"
            evaluation = info["is_atari"] and resolve_vector_mode(cfg.env, cfg.eval_episodes, mode) == "async"
            if not (training or evaluation):
                raise ConfigError(
                    f"--env-timeout-s {cfg.env_timeout_s:g} has no effect: this run has no env processes (the timeout "
                    "is theirs: --vector-mode async)"
                )

    def replay_updates(
        self,
        around: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        algo: Any = None,
        buffer: ReplayBuffer | None = None,
    ) -> dict[str, Any]:
        """`gradient_steps` updates of a replay algorithm (`self.algo`, or a multi-agent run's policy `algo`) on
        batches sampled from its buffer (`self.buffer`, or `buffer`), each inside `around()` (a parallel learner
        publishes each one), each writing its new priorities back where the buffer keeps them (prioritized replay);
        the last update's metrics."""
        cfg = self.algo_cfg
        algo = self.algo if algo is None else algo
        buffer = self.buffer if buffer is None else buffer
        assert buffer is not None  # replay architectures set it before they update
        metrics: dict[str, Any] = {}
        for _ in range(cfg.gradient_steps):
            batch = buffer.sample(cfg.batch_size)
            with around():
                metrics = algo.update(batch)
            priorities = metrics.pop("priorities", None)
            if priorities is not None and isinstance(buffer, PrioritizedReplayBuffer):
                buffer.update_priorities(batch.index, priorities)
        return metrics

    def build_algo(self, seed: int) -> Any:
        """A fresh algorithm object with this run's config (architectures build one per worker)."""
        return build_algorithm(self.cfg, self.algo_cfg, self.env_info, seed, self.device)

    def make_obs_stats(self) -> ObsStats | None:
        """The running observation statistics of a run with `obs_norm` (None without): training envs update
        them, evaluation envs read them (`make_eval_envs`), checkpoints keep them."""
        if not getattr(self.algo_cfg, "obs_norm", False):
            return None
        try:
            return make_obs_stats(self.env_info["observation_space"], self.algo_cfg.obs_clip)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def make_reward_norm(self) -> RewardNormalizer | None:
        """The reward normalisation state of a run with `reward_norm` (None without): the training envs'
        wrapper updates it, checkpoints keep it."""
        if not getattr(self.algo_cfg, "reward_norm", False):
            return None
        try:
            return RewardNormalizer(self.algo_cfg.n_envs, self.algo_cfg.gamma, self.algo_cfg.reward_clip)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def workers_learn_on_device(self) -> bool:
        """Whether worker processes compute gradients on GPUs of their own (a `ParallelRunner`'s gradient workers on
        Ray roles that reserved one), for the run's first line."""
        return False

    def check_config(self) -> None:  # noqa: B027 (a hook: the single architecture accepts every option)
        """Reject options this architecture cannot run with (before anything is written to disk)."""

    def make_eval_envs(self) -> VectorEnv:
        info = self.env_info
        envs = make_vector_env(
            self.cfg.env,
            self.cfg.eval_episodes,
            seed=self.cfg.seed + 10_000,
            mode="sync" if not info["is_atari"] else self.cfg.vector_mode,
            training=False,
            timeout_s=self.cfg.env_timeout_s,
            **self.cfg.env_kwargs,
        )
        return normalize_observations(envs, self.obs_stats, update_stats=False)

    # ----------------------------------------------------------------------------------------- state
    @property
    @abc.abstractmethod
    def env_steps(self) -> int:
        """Env steps taken so far, over all actors."""

    @property
    @abc.abstractmethod
    def episodes(self) -> int:
        """Episodes finished so far, over all actors."""

    @abc.abstractmethod
    def run(self) -> RunResult:
        """Train until a stop condition; write the final checkpoint, `result.json` and `curves.png`."""

    def _write_config(self, extra: dict[str, Any] | None = None) -> None:
        config = {
            "run": {**dataclasses.asdict(self.cfg), "options": dataclasses.asdict(self.opts)},
            "algo": dataclasses.asdict(self.algo_cfg),
            "preset": self.preset,
            "total_steps": self.total_steps,
            "eval_every": self.eval_every,
            "stop_return": self.stop_return,
            "torch_threads": self.torch_threads,
            "device": str(self.device),
            **(extra or {}),
        }
        (self.run_dir / "config.json").write_text(json_text(config, indent=2, default=str))

    def _payload(self, with_data: bool) -> dict[str, Any]:
        return {
            "run_config": {**dataclasses.asdict(self.cfg), "options": dataclasses.asdict(self.opts)},
            "algo_config": dataclasses.asdict(self.algo_cfg),
            "algo": self.algo.state_dict(),
            "env_steps": self.env_steps,
            "state": dict(self.state),
            **({"obs_norm": self.obs_stats.state_dict()} if self.obs_stats is not None else {}),
            **({"reward_norm": self.reward_norm.state_dict()} if self.reward_norm is not None else {}),
        }

    def save(self, name: str = "latest") -> Path:
        return self.save_to(self.run_dir / "checkpoints" / f"{name}.pt", with_data=name == "latest")

    def save_logged(self, logger: RunLogger, name: str = "latest") -> Path:
        """`save`, the rows logged so far put on disk first: a run killed after the checkpoint would otherwise lose
        the rows still buffered, which its resume (going on from the checkpoint's step) never logs again."""
        logger.flush()
        return self.save(name)

    def save_to(self, path: Path, with_data: bool) -> Path:
        """A checkpoint of the run at `path`: with its data (envs, collector, replay: what an exact resume needs), or
        the learner and the counters alone (what `best.pt` holds, and what a sweep's PBT hands another trial)."""
        return save_checkpoint(path, self._payload(with_data))

    # ----------------------------------------------------------------------------------------- services
    def eval_seed(self, step: int) -> int:
        """The seed of the evaluation at `step` (its episode i: the seed + i): a function of the step, not of
        how many evaluations came before, so an evaluation that the same run made in one go does not make (the
        one at a time-limit stop) leaves the episodes of every later evaluation as they were. Below 2**31 at any
        step: envs that seed a legacy `np.random.RandomState` take no larger seeds."""
        return (self.cfg.seed + 10_000 * (1 + step)) % 2**31

    def run_evaluation(self, step: int) -> tuple[np.ndarray, int, dict[str, float]]:
        """The greedy evaluation at `step`: each episode's return, how many were cut at the step bound, and what else
        to log with it (a multi-agent run: each agent's and each policy's return)."""
        result = evaluate(
            self.algo, self.eval_envs, self.cfg.eval_episodes, self.eval_seed(step), max_steps=self.eval_max_steps
        )
        return result.returns, result.cut, {}

    def _evaluate(self, logger: RunLogger, start: float) -> float:
        """The greedy evaluation at this step, logged (and noted as the solving one, and saved as `best.pt`, where it
        is) at the run's time once it is over: a time to solve includes the evaluation that showed it, as the
        peers' do."""
        self.state["evals"] += 1
        step = self.env_steps
        returns, cut, more = self.run_evaluation(step)
        elapsed = time.perf_counter() - start
        mean, std = float(returns.mean()), float(returns.std())
        self.state["last_eval"] = {"step": step, "mean": mean, "std": std, "cut": cut}
        logger.log(step, {"eval/return_mean": mean, "eval/return_std": std, "eval/episodes_cut": cut, **more}, elapsed)
        self._note_cut(logger, cut)
        if self.stop_return is not None and mean >= self.stop_return and self.state["solved_at_step"] is None:
            self.state["solved_at_step"] = step  # before `best.pt` is saved: a run resumed from it knows it solved
            self.state["solved_at_s"] = elapsed
        if mean > self.state["best_eval"]:
            self.state["best_eval"] = mean
            self.save_logged(logger, "best")
        return mean

    def _note_cut(self, logger: RunLogger, cut: int) -> None:
        """Say once per invocation, on the terminal, that evaluation episodes were cut at the bound."""
        note = cut_note(cut, self.cfg.eval_episodes, self.eval_max_steps, "--eval-max-steps")  # None when none was
        if note is not None and not self._cut_noted:
            self._cut_noted = True
            logger.note(note)

    def log_row(self) -> dict[str, float]:
        """What a runner logs besides SPS and the losses with every log row (`after_update` calls it once a row):
        an architecture's rates, shares of time and lags since the last row."""
        return {}

    def after_update(
        self,
        logger: RunLogger,
        start: float,
        new_returns: list[float],
        recent_returns: Sequence[float],
        metrics: dict[str, float],
        stop_requested: bool,
        updates: int = 1,
    ) -> str | None:
        """The bookkeeping after learning steps: log, evaluate, checkpoint when due; why to stop, or None."""
        self.state["updates"] += updates
        steps = self.env_steps
        now = time.perf_counter()
        elapsed = now - start
        self.state["elapsed"] = elapsed
        if new_returns:
            logger.log(steps, {"charts/episodic_return": float(np.mean(new_returns))}, elapsed)
        if steps >= self.state["next_log"]:
            every = self.log_every
            self.state["next_log"] += every * max(1, (steps - self.state["next_log"]) // every + 1)
            last_time, last_steps = self._last_log
            sps = (steps - last_steps) / max(now - last_time, 1e-9)
            self._last_log = (now, steps)
            losses = {f"losses/{k}": v for k, v in metrics.items()}
            logger.log(steps, {"charts/SPS": sps, **losses, **self.log_row()}, elapsed)
        solved = False
        if steps >= self.state["next_eval"]:
            while self.state["next_eval"] <= steps:
                self.state["next_eval"] += self.eval_every
            mean = self._evaluate(logger, start)
            solved = self.stop_return is not None and mean >= self.stop_return
        recent = float(np.mean(recent_returns)) if len(recent_returns) else float("nan")
        last_eval = self.state["last_eval"]["mean"] if self.state["last_eval"] else float("nan")
        logger.progress(steps, ret=recent, eval=last_eval)
        if steps >= self.state["next_checkpoint"]:
            self.state["next_checkpoint"] += self.checkpoint_every
            self.state["elapsed"] = time.perf_counter() - start
            self.save_logged(logger)
        if solved:
            return "solved"
        if stop_requested or any(cb({"env_steps": steps, "trainer": self}) for cb in self.callbacks):
            return "interrupted"
        if self.cfg.time_limit is not None and time.perf_counter() - self._invocation_start >= self.cfg.time_limit:
            return "time_limit"
        return None

    def start_logging(self) -> tuple[RunLogger, float]:
        """The run's logger and its start time (earlier by the time already spent when resuming: elapsed times
        are the run's totals). The time limit counts from now: it is a budget for this invocation."""
        logger = RunLogger(self.run_dir, self.total_steps, self.env_steps, self.cfg.progress)
        if self.resuming:
            self._keep_a_later_best()
        self.evals_at_start = self.state["evals"]
        now = time.perf_counter()
        self._last_log = (now, self.env_steps)
        self._invocation_start = now
        logger.start = now - self.state["elapsed"]  # rows logged without their elapsed time: the run's totals too
        return logger, logger.start

    def _keep_a_later_best(self) -> None:
        """A resumed run whose `best.pt` is better than the checkpoint it goes on from knows (a run killed without
        its last `latest.pt`, which is saved every `--checkpoint-every` steps, `best.pt` at every new best): it
        keeps that best, so that only an evaluation beating it replaces `best.pt`, which one beating the
        checkpoint's older best did, losing the better network."""
        path = self.run_dir / "checkpoints" / "best.pt"
        try:
            saved = load_checkpoint(path, mmap=True) if path.is_file() else {}
        except CheckpointError:  # a cut-short file: the run's first new best replaces it
            return
        best, step = (saved.get("state") or {}).get("best_eval"), saved.get("env_steps")
        if isinstance(best, float | int) and best > self.state["best_eval"]:
            notes.info(f"{path} (return {best:g} at step {step}) stays the run's best network unless an evaluation "
                       f"beats it: the checkpoint resumed from, at step {self.env_steps}, knew only "
                       f"{self.state['best_eval']:g}")  # fmt: skip
            self.state["best_eval"] = float(best)

    def finish(self, logger: RunLogger, start: float, stopped_by: str) -> str:
        """A final evaluation if the last one is not at this step (none when interrupted, and none once solved:
        the solving evaluation is the result, even if parallel workers stepped on), then the final checkpoint,
        which holds that evaluation (a resumed run neither repeats nor forgets it). A run stopped by a failure
        (`RunFailure`) is not evaluated again: its checkpoint is what `--resume` goes on from.

        A first Ctrl-C or SIGTERM meanwhile stops the run as politely as during training: it abandons the final
        evaluation (which a long episode bound can make long, and which a `--time-limit` stop starts just as a
        scheduler's SIGTERM comes), and the checkpoint is saved all the same; during the save it is held until the
        save is done (a second one interrupts, as always). Returns how the run stopped ("interrupted" then)."""
        last = self.state["last_eval"]
        abandoning = True

        def abandon() -> None:
            if abandoning:
                raise EvaluationAbandoned

        with StopRequest(on_request=abandon):
            if stopped_by not in ("interrupted", "solved", "failure") and (
                last is None or last["step"] != self.env_steps
            ):
                before = copy.deepcopy(self.state)  # small: counters and the last evaluation's figures
                try:
                    self._evaluate(logger, start)
                except EvaluationAbandoned:  # the counters as they were: the checkpoint holds no half evaluation
                    self.state.clear()
                    self.state.update(before)
                    stopped_by = "interrupted"
                    logger.note("a stop was requested: the final evaluation is abandoned, the checkpoint saved")
            abandoning = False
            self.state["elapsed"] = time.perf_counter() - start
            self.save_logged(logger)
        return stopped_by

    def write_result(self, stopped_by: str, wall: float, failure: Exception | None = None) -> RunResult:
        """`result.json` (with `failure`: why a run stopped by one did, else None) and `curves.png`."""
        result = self._result(stopped_by, wall)
        result["failure"] = None if failure is None else str(failure)
        result["exploration_hint"] = self._exploration_hint(result)
        (self.run_dir / "result.json").write_text(json_text(result, indent=2))
        try:
            plot_runs([self.run_dir], self.run_dir / "curves.png", title=f"{self.cfg.algo} on {self.cfg.env}")
        except Exception as exc:  # a plot must never lose a finished run
            log.warning(f"warning: could not draw curves.png: {exc}")
        return RunResult(self.run_dir, result, self.algo)

    def conclude(self, stopped_by: str, start: float, failure: RunFailure | None = None) -> RunResult:
        """The end of `run()`, after the final checkpoint: `result.json` and `curves.png` (`write_result`); then a run
        stopped by a `failure` raises it, with `run_dir` set to the run folder (the CLI names it in one line)."""
        result = self.write_result(stopped_by, time.perf_counter() - start, failure)
        if failure is not None:
            failure.run_dir = self.run_dir
            raise failure
        return result

    def _exploration_hint(self, result: dict[str, Any]) -> str | None:
        """`exploration_hint` for an unsolved run with evaluations (the do-nothing policy on fresh eval envs); for a
        run that made no update, what kept it from learning instead (exploration is not the problem there)."""
        if result["solved"] or result["best_eval_return"] is None:
            return None
        if not result["updates"]:
            starts = getattr(self.algo_cfg, "learning_starts", None)
            return "hint: the run made no update" + (
                f": its replay learns after learning_starts={starts} env steps; give it more --steps or a smaller "
                "--set learning_starts"
                if starts
                else ""
            )
        best, space = result["best_eval_return"], self.env_info["action_space"]
        seed = self.cfg.seed + 10_000
        n = self.cfg.eval_episodes
        try:
            return exploration_hint(
                self.cfg.algo, best, space, self.make_eval_envs, n, seed, self.algo_cfg, max_steps=self.eval_max_steps
            )
        except Exception as exc:  # a hint must never lose a finished run's result.json
            log.warning(f"warning: could not weigh the run against doing nothing: {exc}")
            return None

    def _result(self, stopped_by: str, wall: float) -> dict[str, Any]:
        last = self.state["last_eval"] or {"mean": None, "std": None, "cut": None}
        return {
            "algo": self.cfg.algo,
            "env": self.cfg.env,
            "env_kwargs": self.cfg.env_kwargs,
            "arch": self.cfg.arch,
            "seed": self.cfg.seed,
            "solved": self.state["solved_at_step"] is not None,
            "solved_at_step": self.state["solved_at_step"],
            "solved_at_s": self.state["solved_at_s"],
            "stop_return": self.stop_return,
            "eval_return_mean": last["mean"],
            "eval_return_std": last["std"],
            "eval_episodes_cut": last.get("cut"),
            "eval_at_step": last.get("step"),
            "eval_max_steps": self.eval_max_steps,
            "best_eval_return": self.state["best_eval"] if self.state["evals"] else None,
            "env_steps": self.env_steps,
            "wall_time_s": wall,
            "stopped_by": stopped_by,
            "episodes": self.episodes,
            "updates": self.state["updates"],
            "torch_threads": self.torch_threads,
            "device": str(self.device),
            "checkpoint": str(self.run_dir / "checkpoints" / "latest.pt"),
        }

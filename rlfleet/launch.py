"""`rlfleet.train()`: launch one run — resolve the algorithm and its architecture, build the runner, run it (or
resume a run folder). The one module above the architectures: the CLI and the Python API start runs here."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlfleet.algos import config_fields, resolve
from rlfleet.arch import architecture_names, default_arch, runner_class
from rlfleet.arch.offline import PATH_OPTIONS, check_data_source, same_path
from rlfleet.arch.parallel import PROCESS_OPTIONS, RAY_OPTIONS, RoleOptions
from rlfleet.backends import BACKENDS
from rlfleet.envs.kwargs import parse_env_value
from rlfleet.envs.pettingzoo import is_pettingzoo_id
from rlfleet.nets.user import NetError, net_path
from rlfleet.run.checkpoint import CheckpointError, load_checkpoint, run_folder_of
from rlfleet.run.config import (
    RUN_FIELDS,
    ConfigError,
    RunConfig,
    check_known_options,
    notes_held,
    parse_field,
    saved_run_config,
)
from rlfleet.run.config import log as notes
from rlfleet.run.runner import ResolvedConfig, RunBase, RunResult


def train(
    algo: str | None = None,
    env: str | None = None,
    *,
    resume: str | Path | None = None,
    callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    **options: Any,
) -> RunResult:
    """Train `algo` on `env` (or resume a run folder). Options are `RunConfig` fields (`steps`, `seed`, ...) and
    the fields of the architecture's `Options` (`workers`, `grad_sets`, ...), given side by side.

    >>> result = rlfleet.train("ppo", "CartPole-v1", seed=1)
    >>> result = rlfleet.train("a2c", "CartPole-v1", arch="grad_parallel", workers=2, grad_sets=1)
    >>> result["solved"], result.run_dir
    >>> result = rlfleet.train("ppo", "CartPole-v1", net=my_package.nets.Encoder, net_kwargs={"width": 128})

    `net` (a network of your own: a factory, or its import path "package.module:factory") and `net_kwargs` are
    the algorithm's config fields of those names (`rlfleet.nets.user`), taken here by name as `--net` is; so are
    `actor_net`, `critic_net` and their `_kwargs` (ddpg, td3, sac: whole modules of your own).
    """
    check_train_arguments(resume, callbacks)
    options = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in options.items()}  # saved as text
    options = user_net_as_overrides(options)
    if resume is not None:
        payload = load_checkpoint(resume)
        run_dir = run_folder_of(resume)
        check_resumable(payload, resume)
        with notes_held():  # said once every check has passed
            cfg = resumed_config(saved_run_config(payload, resume), payload["algo_config"], algo, env, options)
            check_resumed_steps(options.get("steps"), payload["env_steps"])
            check_unfinished(cfg, payload)
            note_replaced_progress(resume, run_dir, payload["env_steps"])
            runner = _runner(cfg)(cfg, resume_from=payload, run_dir=run_dir, callbacks=callbacks)
        del payload  # restored: the replay a checkpoint holds would otherwise stay in memory twice for the whole run
        return runner.run()
    if algo is None or env is None:
        raise ConfigError("train needs an algorithm and an env (or resume=RUN_DIR)")
    cfg = _run_config(algo, env, options)
    return _runner(cfg)(cfg, callbacks=callbacks).run()


def check_resumable(payload: dict[str, Any], checkpoint: str | os.PathLike[str]) -> None:
    """A checkpoint that `--resume` can go on from: one with the run's counters (`env_steps`, a count, and `state`),
    which every run's checkpoints hold; a file without them (made by hand, or edited) is one `CheckpointError`."""
    steps, state = payload.get("env_steps"), payload.get("state")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0 or not isinstance(state, dict):
        raise CheckpointError(
            f"checkpoint {os.fspath(checkpoint)} cannot be resumed: it lacks the counters of a run (env_steps "
            f"{steps!r}, {'a' if isinstance(state, dict) else 'no'} state); the checkpoints a run writes have them"
        )


def check_train_arguments(resume: Any, callbacks: Any) -> None:
    """`train`'s own arguments checked before anything is read or written: `resume` a path, `callbacks` a list of
    callables (each called with the run's progress after every update)."""
    if resume is not None and not isinstance(resume, str | os.PathLike):
        raise ConfigError(f"resume={resume!r} is not a path: give a run folder or a checkpoint in its checkpoints/")
    if callbacks is None:
        return
    if not isinstance(callbacks, list | tuple) or not all(callable(cb) for cb in callbacks):
        raise ConfigError(
            f"callbacks={callbacks!r} is not a list of callables (each called with {{'env_steps', 'trainer'}} after "
            "every update; one that returns True stops the run)"
        )


def train_from(
    payload: dict[str, Any],
    run_dir: str | Path,
    algo: str,
    env: str,
    *,
    callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    **options: Any,
) -> RunResult:
    """Train `algo` on `env` with `options` (as `train` takes them) in `run_dir`, going on from another run's
    checkpoint `payload`: its networks, optimizer moments and counters (env steps, evaluations), with this run's
    hyperparameters (`load_algo_state`). The envs start new episodes and a replay starts empty: what is taken is
    the donor's learner, not its data. Population-based training's exploit (`rlfleet tune --scheduler pbt`)."""
    cfg = _run_config(algo, env, options)
    learner = {k: v for k, v in payload.items() if k in LEARNER_STATE}
    return _runner(cfg)(cfg, resume_from=learner, run_dir=Path(run_dir), callbacks=callbacks).run()


LEARNER_STATE = ("format", "run_config", "algo_config", "algo", "env_steps", "state", "obs_norm", "reward_norm")
"""What of a checkpoint `train_from` takes: the learner and the counters, not the envs, the collector or the replay."""


def check_run(algo: str, env: str, **options: Any) -> tuple[ResolvedConfig, Any]:
    """What `train(algo, env, **options)` checks before it writes anything, without running it: the algorithm, the
    architecture and its options, every run option, the env and its keyword arguments, the algorithm's config
    (`RunBase.resolve_config`), the algorithm built for the env's spaces on the run's device, and what the
    architecture itself refuses (`RunBase.checked`). Returns the resolved configuration and the algorithm; a problem
    is the one line `train` would give."""
    cfg = _run_config(algo, env, options)
    run = _runner(cfg).checked(cfg)
    return run.resolved, run.algo


def _run_config(algo: str, env: str, options: dict[str, Any]) -> RunConfig:
    """The `RunConfig` of `train(algo, env, **options)`: run options as its fields, the rest as the architecture's."""
    options = user_net_as_overrides(options)
    run = {k: v for k, v in options.items() if k in RUN_FIELDS}
    arch_options = {k: v for k, v in options.items() if k not in RUN_FIELDS}
    check_idle_user_net(algo, run.get("overrides"))
    return RunConfig(algo=algo, env=env, options=arch_options, **run)


def check_idle_user_net(algo: str, overrides: Any) -> None:
    """`net` given with both `actor_net` and `critic_net` (ddpg, td3, sac) is one `ConfigError`: the whole actor and
    the whole critics of the user's own replace every module the encoder would sit in, so it would do nothing. A new
    run's check only: a resumed run keeps what it started with."""
    if not isinstance(overrides, dict) or not all(overrides.get(key) for key in USER_NETS):
        return
    if "actor_net" not in config_fields(resolve(algo)[1]):
        return  # an algorithm without them: its config refuses them by name
    raise ConfigError(
        f"--net {overrides['net']} has no effect with both --actor-net and --critic-net: they replace the whole "
        "actor and critics that the encoder would sit in; leave --net out, or one of the others"
    )


def check_resumed_steps(steps: Any, done: int) -> None:
    """`--steps` of a resume must lie beyond the steps the checkpoint has taken (`done`): a run cannot train back to
    fewer, and a budget it has reached would record a total it never trained to. A value that is no count is
    left for the run's own check of `--steps`."""
    if isinstance(steps, int) and not isinstance(steps, bool) and steps <= done:
        raise ConfigError(f"--steps {steps}: the run is at {done} steps already; --steps must exceed it")


def check_unfinished(cfg: RunConfig, payload: dict[str, Any]) -> None:
    """A resume of a run that has nothing left to do is one `ConfigError` (`finished`)."""
    problem = finished(payload, cfg.steps)
    if problem is not None:
        raise ConfigError(problem)


def finished(payload: dict[str, Any], steps: int | None) -> str | None:
    """Why the run of a checkpoint has nothing left to do with a budget of `steps` (None: the run's own), or None: it
    took its whole budget, or it solved (a resume would stop again at its next evaluation, rewriting its
    result.json)."""
    done = payload["env_steps"]
    budget = steps if steps is not None else payload["algo_config"].get("total_steps")
    if isinstance(budget, int) and done >= budget:
        return f"the run has taken its {budget} steps ({done}): give --steps above {done} to train on"
    solved = (payload.get("state") or {}).get("solved_at_step")
    if solved is not None:
        return (
            f"the run solved at step {solved} (an evaluation reached its --stop-return) and stopped there; a resume "
            "would stop again at its next evaluation: start a new run to train on past it"
        )
    return None


def note_replaced_progress(resume: str | Path, run_dir: Path, step: int) -> None:
    """Say in one line what a resume from another checkpoint than the run's latest (`checkpoints/best.pt`) replaces:
    the run goes on from `step`, so its `latest.pt` from later on and what it logged after `step` are overwritten."""
    latest = run_dir / "checkpoints" / "latest.pt"
    if Path(resume).is_dir() or not latest.is_file() or latest.resolve() == Path(resume).resolve():
        return
    later = saved_steps(latest)
    if later is not None and later <= step:
        return
    at = f" at step {later}" if later is not None else " (unreadable)"
    notes.warning(
        f"resuming from {resume} at step {step}: it replaces {latest}{at}, and what the run logged after step {step} "
        "(metrics.csv, tb/)"
    )


def saved_steps(checkpoint: Path) -> int | None:
    """The env steps a checkpoint was saved at (its tensors mapped, not read); None for a file that cannot be read."""
    try:
        steps = load_checkpoint(checkpoint, mmap=True).get("env_steps")
    except CheckpointError:  # a foreign, cut-short or corrupt file: the resume replaces it all the same
        return None
    return steps if isinstance(steps, int) else None


RESUME_MAY_CHANGE = frozenset({"steps", "time_limit", "torch_threads", "device", "progress"}) | {
    "env_timeout_s",
    "group_timeout_s",
    "gossip_timeout_s",
    *(f.name for f in dataclasses.fields(RoleOptions)),
}
"""What a resumed run may change: how long it trains (`--steps`, `--time-limit`), and how and where it runs, which
the checkpoint does not depend on (`--torch-threads`, the backend and its options: `--backend`, `--address`,
`--placement`, `--cpus-per-role`, `--gpus-per-role`, `--heartbeat-s`, `--max-restarts`; each backend restarts
its roles from the learner's saved state; how long a process waits for another: `--env-timeout-s`,
`--group-timeout-s`, `--gossip-timeout-s`). Anything else given with a resume must equal the saved value."""


ZERO_IS_DEFAULT = frozenset({"eval_every", "checkpoint_every"})
"""Options whose 0 means their default, as not giving them does."""

SAVED_RESOLVED = frozenset({"gossip_order"})
"""Options whose `auto` a run saves as what it stood for when the run started (gossip's order, which depends on the
backend, which a resume may change): `auto` given with a resume is the run's own value."""


def resumed_config(
    run: dict[str, Any], algo_config: dict[str, Any], algo: str | None, env: str | None, given: dict[str, Any]
) -> RunConfig:
    """The `RunConfig` a resumed run goes on with: the checkpoint's (`run`, its algorithm's config `algo_config`),
    with what `given` may change (`RESUME_MAY_CHANGE`) applied. `algo`, `env` and every other option given must
    equal the saved value; those that differ are one `ConfigError` naming each, never dropped in silence."""
    cfg = RunConfig(**{**run, "options": dict(run["options"])})
    differ = []
    for option, value, saved in (("ALGO", algo, cfg.algo), ("--env", env, cfg.env)):
        if value is not None and value != saved:
            differ.append(f"{option} {value} (the run's: {saved})")
    for key, value in given.items():
        if key == "overrides":
            differ += _overrides_that_differ(cfg.algo, value, algo_config)
        elif key in RESUME_MAY_CHANGE:
            budget = cfg.steps if isinstance(cfg.steps, int) else algo_config.get("total_steps")  # --set total_steps
            if key == "steps" and isinstance(value, int) and isinstance(budget, int) and value != budget:
                notes.warning(
                    f"--steps {value} (the run's: {budget}): what the run schedules over its budget (a learning "
                    "rate annealed to 0, ε, prioritized replay's β, DAgger's rounds) and its default evaluation and "
                    "checkpoint intervals follow the new one"
                )
            if key in RUN_FIELDS:
                setattr(cfg, key, value)
            else:
                cfg.options[key] = value
        elif key in PATH_OPTIONS and isinstance(value, str) and isinstance(cfg.options.get(key), str):
            if not same_path(value, cfg.options[key]):
                differ.append(f"--{key} {value} (the run's: {cfg.options[key]})")
        else:
            saved = getattr(cfg, key) if key in RUN_FIELDS else cfg.options.get(key, _default_option(cfg.arch, key))
            if saved is None and key in algo_config:  # not given: the algorithm's, as the run resolved it (n_envs)
                saved = algo_config[key]
            if key in ZERO_IS_DEFAULT and not value and not saved:  # 0 and not given: the default alike
                continue
            if value != saved and not (key in SAVED_RESOLVED and value == "auto"):
                shown = "not given: its default" if saved is None else saved
                differ.append(f"--{key.replace('_', '-')} {value} (the run's: {shown})")
    backend = cfg.options.get("backend")
    idle = [key for key in PROCESS_OPTIONS if key in given]
    if isinstance(backend, str) and backend in BACKENDS and BACKENDS[backend].in_process and idle:
        raise ConfigError(  # what a new run refuses too (`ParallelRunner.check_parallel`)
            f"--{idle[0].replace('_', '-')} is for roles that run as processes (--backend local or ray); --backend "
            f"{backend} runs them in this process, one after another"
        )
    if given.get("backend", "ray") != "ray":  # off Ray, the saved run's Ray options no longer apply
        for key in set(RAY_OPTIONS) - set(given):
            cfg.options.pop(key, None)
    if differ:
        may = ", ".join(sorted("--" + k.replace("_", "-") for k in RESUME_MAY_CHANGE - {"progress"}))
        raise ConfigError(
            f"a resumed run keeps its configuration, and these differ from it: {', '.join(differ)}; a resume may "
            f"change only {may} (start a new run for the rest)"
        )
    return cfg


def _overrides_that_differ(algo: str, overrides: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    """`--set` items of a resume whose value differs from the checkpoint's algorithm config."""
    differ = []
    for key, value in overrides.items():
        parsed = parse_field(algo, key, value) if isinstance(value, str) else value
        if _plain(parsed) != _plain(saved.get(key)):
            differ.append(f"--set {key}={value} (the run's: {saved.get(key)})")
    return differ


def _plain(value: Any) -> Any:
    """A config value as compared across a checkpoint (tuples and lists alike)."""
    return list(value) if isinstance(value, tuple | list) else value


def _default_option(arch: str | None, key: str) -> Any:
    """The default of architecture option `key` (an option the architecture lacks: reported when the run starts)."""
    fields = {f.name: f for f in dataclasses.fields(runner_class(arch or "single").Options)}
    f = fields.get(key)
    return None if f is None or f.default is dataclasses.MISSING else f.default


USER_NETS = ("net", "actor_net", "critic_net")
"""The algorithms' config fields that name a network of the user's own, which `train` also takes by name."""


def user_net_as_overrides(options: dict[str, Any]) -> dict[str, Any]:
    """`net`, `actor_net`, `critic_net` and their `_kwargs` given by name moved into `overrides`, the algorithm's
    config fields they are; a network as its import path, which is what the run keeps and other processes import."""
    given = [key for key in options if key.removesuffix("_kwargs") in USER_NETS]
    if not given:
        return options
    options = dict(options)
    overrides = dict(options.get("overrides") or {})
    for key in given:
        value = options.pop(key)
        try:
            value = value if key.endswith("_kwargs") else net_path(value, key)
        except NetError as exc:
            raise ConfigError(str(exc)) from None
        if key in overrides and not _same_setting(value, overrides[key]):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} {value} and --set {key}={overrides[key]} disagree: give one")
        overrides[key] = value
    options["overrides"] = overrides
    return options


def _same_setting(value: Any, setting: Any) -> bool:
    """Whether a network option (`--net`, `--net-kwargs`, ...) and the `--set` of the same field say the same, the
    text of `--set` read as the field reads it (keyword arguments typed as `--env-kwargs` types them)."""
    if isinstance(value, dict) and isinstance(setting, str):
        setting = parse_env_value(setting)
    return bool(value == setting)


def _runner(cfg: RunConfig) -> type[RunBase]:
    """The runner class of the run's architecture (resolving the algorithm's default into `cfg.arch`)."""
    algo_cls = resolve(cfg.algo)[0]  # an unknown algorithm is reported as such, before the architecture
    if cfg.arch is None:
        cfg.arch = default_arch(cfg.algo)
    runner = runner_class(cfg.arch, multi_agent=is_pettingzoo_id(cfg.env))
    check_data_source(cfg, algo_cls)  # --dataset/--expert and imitation algorithms go together
    others = {a: runner_class(a).Options for a in architecture_names()}  # to say where an unknown one belongs
    check_known_options(runner.Options, cfg.options, cfg.arch, others)
    return runner

"""`rlfleet tune`: a hyperparameter sweep on Ray Tune, every trial an ordinary rlfleet run.

A sweep folder holds:

    sweep.json        what the sweep is (algorithm, env, search space, scheduler, the trials' fixed options)
    trials/<id>/      one run folder per trial (config.json, metrics.csv, checkpoints/, result.json, curves.png):
                      `rlfleet plot`, `eval` and `train --resume` take any of them
    tune/             Ray Tune's own record of the experiment, which `rlfleet tune --resume SWEEP` restores
    trials.csv        one row per trial: its searched values, final and best evaluation, steps, how it ended
    summary.md        the same table, and the best trial as a ready `rlfleet train` command
    scatter.png       the final score against each searched value, one point per trial (the A3C paper's Figure 2)
    curves.png        every trial's evaluation return against env steps
    ray.log           what Ray printed

Trials report after every evaluation (`Reporter`): the evaluation's mean, standard deviation and the best so far,
the env steps and the evaluation count, which is the time unit of the schedulers (ASHA and HyperBand stop weak
trials at evaluation milestones; PBT perturbs every `perturbation_interval` evaluations). A trial saves its run's
checkpoint at every report, so a trial stopped by the scheduler, paused by HyperBand or ended by Ctrl-C keeps its
checkpoint and goes on from it when it runs again. With PBT a trial also hands Tune its learner (weights, optimizer
moments, counters); an exploited trial goes on from the donor's learner with its own perturbed config
(`rlfleet.launch.train_from`) and records the exploit in `trials/<id>/exploits.jsonl`.

Trials run on the sweep's Ray: a private instance on 127.0.0.1 (as `--backend ray` starts one), or a cluster
joined with `--address` (whose nodes must all see the sweep folder, as Ray Tune's storage requires). A trial is
one Ray Tune actor reserving `--cpus-per-trial` CPUs; a parallel architecture's roles run as local processes of
that trial on its node (default reservation: one CPU per role).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import itertools
import json
import logging
import math
import os
import signal
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rlfleet.arch.parallel import RAY_OPTIONS
from rlfleet.fields import ConfigError, check_fields, searched_fields, single_folder_name, unmet_need
from rlfleet.run.config import RunConfig, notes_at
from rlfleet.run.paths import check_output_folder, name_part
from rlfleet.run.runner import ResolvedConfig
from rlfleet.tuning.space import ENV_KWARGS, KeptInRange, Param, apply, parse_space
from rlfleet.tuning.spec import (
    EXPLOITS,
    NODES_FILE,
    SPEC_FILE,
    TIME_ATTR,
    TUNE_FOLDER,
    Sweep,
    SweepResult,
    TuneOptions,
    options_cls,
)

# ---------------------------------------------------------------------------------------------- checks
TUNE_NEEDS = ("ray", "fsspec", "pandas", "pyarrow", "requests")
"""What `import ray.tune` needs (Ray's `tune` extra), found without importing Ray: a private instance binds its
listeners to 127.0.0.1 only if Ray is first imported after that is set (`rlfleet.backends.ray_instance`)."""


def _check_installed() -> None:
    missing = [name for name in TUNE_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"rlfleet tune needs Ray Tune, an extra ({', '.join(missing)} missing): "
                          "pip install -e '.[tune]'")  # fmt: skip


def _check_trial_options(options: dict[str, Any], params: Sequence[Param] = ()) -> None:
    """Refuse the run options that a sweep owns or a trial cannot take, one line each: the fixed `options`, then each
    value a searched name draws (a searched --backend may draw ray as surely as a fixed one says it)."""
    _check_trial_run(options)
    for p in params:
        for value in p.values():
            try:
                _check_trial_run(apply([p], {p.name: value}, {}))
            except ConfigError as exc:
                raise ConfigError(f"--search {p.text}: {exc}") from None


def _check_trial_run(options: dict[str, Any]) -> None:
    if options.get("resume"):
        raise ConfigError("--resume of rlfleet tune takes a sweep folder (its trials resume with it)")
    backend = options.get("backend", "local")
    if backend == "ray" or any(k in options for k in RAY_OPTIONS):  # a sweep's own --address is a TuneOptions field
        raise ConfigError(
            "a trial's roles run as local processes of its Ray Tune actor: drop --backend ray and its options "
            "(--address places the whole sweep on a cluster; --cpus-per-trial sets what a trial reserves)"
        )
    if backend not in ("local", "serial"):
        raise ConfigError(f"--backend {backend}: a trial's roles run with the local or serial backend")


SEARCHED_AND_GIVEN = frozenset({"seed"})
"""The run options that may be given beside their searched name: the sweep's `--seed` also seeds Ray Tune's draws."""


def _check_given_or_searched(params: Sequence[Param], options: dict[str, Any]) -> None:
    """Refuse a searched name that a fixed option sets too (`--set lr=...` beside `--search lr=...`; `--n-envs`,
    `--net` and their config fields; `--steps`; `--env-kwargs KEY=...`): every trial takes the searched value, and a
    fixed one dropped in silence is a sweep that runs otherwise than its command says. `options` are the trials'
    options as given, named as the user gave them."""
    from rlfleet.launch import USER_NETS

    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    overrides = options.get("overrides") or {}
    env_kwargs = options.get("env_kwargs") or {}
    for p in params:
        # a config field is also set by the run option of its name (--n-envs, --net), not by an architecture's
        # (hogwild's --optimizer picks its shared optimizer; the config's optimizer is the algorithm's own)
        same = p.kind != "algo" or p.name in run_fields or p.name.removesuffix("_kwargs") in USER_NETS
        given: str | None = None
        if p.kind == "env":
            key = p.name[len(ENV_KWARGS) :]
            given = f"--env-kwargs {key}={_text(env_kwargs[key])}" if key in env_kwargs else None
        elif p.kind == "algo" and p.name in overrides:
            given = f"--set {p.name}={_text(overrides[p.name])}"
        elif p.name in options and same:
            given = f"--{p.name.replace('_', '-')} {_text(options[p.name])}"
        if given is not None and p.name not in SEARCHED_AND_GIVEN:
            raise ConfigError(
                f"{given} and --search {p.text} both set {p.name}: give one (each trial takes the searched value)"
            )


def _text(value: Any) -> str:
    """A fixed option's value as the command line writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return " ".join(f"{k}={_text(v)}" for k, v in value.items())
    return str(value)


SCHEDULER_OPTIONS = {
    "grace_period": ("asha", "evaluations before ASHA may stop a trial"),
    "perturbation_interval": ("pbt", "evaluations between PBT's exploit-and-explore steps"),
}
"""The sweep options only one scheduler reads, and what they set there."""


def _check_scheduler_options(opts: TuneOptions) -> None:
    """Refuse a scheduler's setting given with another scheduler, which would ignore it: a sweep that runs otherwise
    than its command says is worse than one line asking to drop the setting."""
    for name, (scheduler, what) in SCHEDULER_OPTIONS.items():
        value = getattr(opts, name)
        if value is not None and opts.scheduler != scheduler:
            raise ConfigError(f"--{name.replace('_', '-')} {value} has no effect with --scheduler {opts.scheduler}: "
                              f"it sets the {what} (--scheduler {scheduler})")  # fmt: skip


FULL_PRODUCT = 64
"""Up to this many configurations (every combination of each searched name's checked values) are all checked before
a sweep runs; beyond, each name's every value is checked with the other names at their first."""


LONGEST = {"steps": max, "eval_every": min}
"""How the names that set a trial's evaluations (its length on the schedulers' clock) pick their values in the
longest trial, which is checked too: the sweep's horizon is the most evaluations a checked configuration makes."""


def _configurations(params: list[Param]) -> list[dict[str, Any]]:
    """The searched values of the configurations checked before a sweep runs: every name at its first value, then
    each name's other values with the rest at their first (a problem one name's value makes is found there, and named
    after it), then, where there are few, every other combination (what two names' values make together), and in any
    case the longest trial (`LONGEST`)."""
    values = [p.values() for p in params]
    first = {p.name: v[0] for p, v in zip(params, values, strict=True)}
    configs = [first] + [{**first, p.name: x} for p, v in zip(params, values, strict=True) for x in v[1:]]
    combos = itertools.product(*values) if math.prod(len(v) for v in values) <= FULL_PRODUCT else iter(())
    longest = {p.name: LONGEST[p.name](v) if p.name in LONGEST else v[0] for p, v in zip(params, values, strict=True)}
    seen = {tuple(map(repr, c.values())) for c in configs}
    for combo in itertools.chain(combos, [tuple(longest.values())]):
        if tuple(map(repr, combo)) not in seen:
            seen.add(tuple(map(repr, combo)))
            configs.append(dict(zip(first, combo, strict=True)))
    return configs


def _check_space(algo: str, env: str, params: list[Param], options: dict[str, Any], pbt: bool) -> list[ResolvedConfig]:
    """Every value a trial may get, checked as `rlfleet train` checks it before anything is written: the sweep's
    options with the searched names set as `_configurations` lists (their notes, such as the preset picked, said
    once). With PBT, a trial's learner must load into a network built with any other trial's values. Returns each
    configuration, resolved (the sweep's horizon and CPUs are its longest and largest trial's)."""
    first, *others = _configurations(params)
    with searched_fields(p.name for p in params if p.kind == "algo"):
        return _check_configurations(algo, env, params, options, pbt, first, others)


def _check_configurations(
    algo: str,
    env: str,
    params: list[Param],
    options: dict[str, Any],
    pbt: bool,
    first: dict[str, Any],
    others: list[dict[str, Any]],
) -> list[ResolvedConfig]:
    """`_check_space`'s checks of the configurations `first` and `others`."""
    from rlfleet.launch import check_run
    from rlfleet.run.checkpoint import CheckpointError, load_algo_state

    resolved, base = check_run(algo, env, **apply(params, first, options))
    checked = [resolved]
    with notes_at(logging.WARNING):
        for config in others:
            resolved, other = check_run(algo, env, **apply(params, config, options))
            checked.append(resolved)
            if not pbt:
                continue
            try:
                load_algo_state(other, {"algo": base.state_dict()}, "a trial's learner", algo)
            except CheckpointError as exc:
                detail = str(exc).split("(", 1)[-1].rstrip(")")
                names = " and ".join(p.name for p in params if repr(config[p.name]) != repr(first[p.name]))
                raise ConfigError(
                    f"--scheduler pbt cannot search {names}: a trial's learner would not load into the network of a "
                    f"trial with another {names} ({detail}); search it with fifo, asha or hyperband"
                ) from None
    for p in params:  # a setting whose switch is off in every trial: searched, it would change nothing
        if p.kind != "algo":
            continue
        unmet = [unmet_need(type(r.algo_cfg), p.name, functools.partial(getattr, r.algo_cfg)) for r in checked]
        if all(unmet):
            raise ConfigError(
                f"--search {p.name} has no effect in any trial: it needs {unmet[0]}, which no trial's values give "
                "(search that too, with a value that gives it, or set it)"
            )
    return checked


def _sweep_folder(logdir: str, name: str | None, algo: str, env: str) -> Path:
    problem = single_folder_name(name)
    if problem is not None:
        raise ConfigError(f"--name {name!r} {problem}")
    check_output_folder(logdir, "--logdir")
    if name is None:
        name = f"tune-{algo}-{name_part(env)}-{datetime.now():%Y%m%d-%H%M%S}"
    folder = Path(logdir) / name
    check_output_folder(folder, "sweep folder")
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"sweep folder {folder} already exists; rlfleet tune --resume {folder} goes on with it")
    return folder.resolve()


def read_sweep(folder: str | Path) -> Sweep:
    """The sweep of a sweep folder (`sweep.json`); a folder that holds none is one `ConfigError`."""
    path = Path(folder) / SPEC_FILE
    if not path.is_file():
        raise ConfigError(
            f"{folder} is not a sweep folder (no {SPEC_FILE}): --resume takes the folder rlfleet tune made"
        )
    try:
        return Sweep.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


# ---------------------------------------------------------------------------------------------- the trial
class Reporter:
    """A run callback that reports to Ray Tune after every evaluation (and saves the run's checkpoint first). A
    report that Tune answers by stopping the trial (the scheduler's decision, the sweep's end, Ctrl-C) stops the run
    politely: its final checkpoint and result.json are written."""

    def __init__(self, trial_id: str, with_learner: bool):
        self.trial_id = trial_id
        self.with_learner = with_learner  # PBT: hand Tune the learner at every report
        self.reported: int | None = None  # the evaluation count last reported
        self.trainer: Any = None
        self.stopped = False

    def __call__(self, info: dict[str, Any]) -> bool:
        trainer = self.trainer = info["trainer"]
        if self.reported is None:  # this invocation's first update; a resumed run reported its checkpoint's before
            self.reported = trainer.evals_at_start
            _note_node(trainer.run_dir)
        if trainer.state["evals"] == self.reported:
            return False
        trainer.save()
        return self.report(trainer)

    def report(self, trainer: Any) -> bool:
        """Report the latest evaluation; True when Tune ends the trial."""
        from ray import tune

        self.reported = trainer.state["evals"]
        last = trainer.state["last_eval"]
        metrics = {
            "eval/return_mean": last["mean"],
            "eval/return_std": last["std"],
            "eval/return_best": trainer.state["best_eval"],
            "env_steps": trainer.env_steps,
            TIME_ATTR: trainer.state["evals"],
            "solved": trainer.state["solved_at_step"] is not None,
        }
        try:
            if not self.with_learner:
                tune.report(metrics)
                return False
            with tempfile.TemporaryDirectory(prefix="rlfleet-learner-") as folder:
                trainer.save_to(Path(folder) / "learner.pt", with_data=False)
                (Path(folder) / "trial.json").write_text(
                    json.dumps({"trial": self.trial_id, "env_steps": trainer.env_steps})
                )
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))  # copied to the sweep's storage
            return False
        except SystemExit:  # how Ray Tune ends a trial blocked in its report
            self.stopped = True
            return True

    def final(self) -> None:
        """Report the run's last evaluation if the run made one after the last report (the one that solved it, or
        the final one at its last step)."""
        trainer = self.trainer
        if trainer is not None and not self.stopped and trainer.state["evals"] > (self.reported or 0):
            self.report(trainer)


def run_trial(config: dict[str, Any], sweep: dict[str, Any]) -> None:
    """One trial (Ray Tune's function trainable): the run of the sweep's options with the trial's `config`, in
    `trials/<trial id>`; a trial that runs again (the sweep resumed, HyperBand's pause) resumes its run, and a PBT
    trial given another trial's learner goes on from it."""
    from ray import tune

    from rlfleet.launch import finished, train, train_from
    from rlfleet.run.checkpoint import load_checkpoint

    spec = Sweep.from_json(sweep)
    os.chdir(spec.cwd)  # not the trial's folder in Tune's record, where Ray Tune starts it
    trial_id = tune.get_context().get_trial_id()
    options = {**spec.trial_options(config, trial_id), "progress": False}
    run_dir = spec.trials_dir / trial_id
    reporter = Reporter(trial_id, with_learner=spec.tune.scheduler == "pbt")
    given = tune.get_checkpoint()
    donor: tuple[dict[str, Any], dict[str, Any]] | None = None
    if given is not None:
        with given.as_directory() as folder:
            meta = json.loads((Path(folder) / "trial.json").read_text())
            if meta["trial"] != trial_id:
                donor = (meta, load_checkpoint(Path(folder) / "learner.pt"))
    with searched_fields(p.name for p in spec.params if p.kind == "algo"):
        if donor is not None:
            meta, payload = donor
            run_dir.mkdir(parents=True, exist_ok=True)
            record = {"trial": meta["trial"], "env_steps": meta["env_steps"], "config": config}
            with open(run_dir / EXPLOITS, "a") as f:
                f.write(json.dumps(record, default=str) + "\n")
            train_from(payload, run_dir, spec.algo, spec.env, callbacks=[reporter], **options)
        elif (run_dir / "checkpoints" / "latest.pt").is_file():
            saved = load_checkpoint(run_dir, mmap=True)  # mapped: its replay is never read here
            if finished(saved, saved["run_config"].get("steps")) is None:  # else it ended before Tune heard: done
                train(resume=run_dir, callbacks=[reporter], progress=False)
        else:
            train(spec.algo, spec.env, logdir=str(spec.trials_dir), name=trial_id, callbacks=[reporter], **options)
    reporter.final()


def _note_node(run_dir: Path) -> None:
    """Add the Ray node this trial runs on now to `trials/<id>/nodes.json` (a trial that runs again may run on
    another: HyperBand's pause, a resumed sweep, PBT's exploit)."""
    import ray

    path = run_dir / NODES_FILE
    nodes = json.loads(path.read_text()) if path.is_file() else []
    nodes.append({"node": ray.get_runtime_context().get_node_id()})
    path.write_text(json.dumps(nodes, indent=2))


# ---------------------------------------------------------------------------------------------- the sweep
def tune(
    algo: str | None = None,
    env: str | None = None,
    *,
    search: list[str] | tuple[str, ...] = (),
    resume: str | Path | None = None,
    logdir: str | None = None,
    name: str | None = None,
    **options: Any,
) -> SweepResult:
    """Sweep `algo`'s hyperparameters on `env` with Ray Tune; each trial an rlfleet run.

    >>> rlfleet.tune("ppo", "CartPole-v1", search=["lr=loguniform(1e-4,1e-2)"], trials=8, scheduler="asha")
    >>> rlfleet.tune("a3c", "CartPole-v1", search=["lr=loguniform(1e-4,1e-2)"], trials=20, workers=2)
    >>> rlfleet.tune(resume="runs/tune-ppo-CartPole-v1-20261127-101500")

    `search` items are `NAME=DIST(ARGS)` (`rlfleet.tuning.space`). `options` are `TuneOptions` fields (`trials`,
    `scheduler`, `metric`, `mode`, `max_concurrent`, `cpus_per_trial`, `grace_period`, `perturbation_interval`,
    `address`, `progress`) and, beside them, the `rlfleet.train` options every trial shares (`steps`, `arch`,
    `workers`, `overrides`, `env_kwargs`, ...); `logdir` (default runs) and `name` place a new sweep's folder.
    Everything is checked before anything is written. `resume` goes on with the sweep of that folder, which keeps its
    configuration: only `address` and `progress` may be given with it."""
    _check_installed()
    tune_fields = {f.name for f in dataclasses.fields(TuneOptions)}
    given_tune = {k: v for k, v in options.items() if k in tune_fields}
    train_options = {k: v for k, v in options.items() if k not in tune_fields}
    if resume is not None:
        new_folder = {k: v for k, v in (("logdir", logdir), ("name", name)) if v is not None}
        return _resume(resume, algo, env, search, {**new_folder, **train_options}, given_tune)
    if algo is None or env is None:
        raise ConfigError("tune needs an algorithm and an env (or resume=SWEEP_DIR)")
    if not search:
        raise ConfigError("tune needs something to search: --search NAME=DIST(ARGS), e.g. lr=loguniform(1e-4,1e-2)")
    opts = TuneOptions(**given_tune)
    check_fields(opts, lambda f: "--" + f.name.replace("_", "-"))
    _check_scheduler_options(opts)
    from rlfleet.launch import user_net_as_overrides

    given = train_options
    train_options = user_net_as_overrides(train_options)  # a network as its import path, which sweep.json keeps
    params = parse_space(list(search), algo, options_cls(algo, train_options))
    _check_given_or_searched(params, given)
    _check_trial_options(train_options, params)
    checked = _check_space(algo, env, params, train_options, pbt=opts.scheduler == "pbt")
    if opts.cpus_per_trial is None:  # every trial reserves what the largest needs
        opts.cpus_per_trial = max(float(getattr(r.opts, "workers", 1)) for r in checked)
    if opts.address:
        from rlfleet.backends.ray_backend import RayBackend

        RayBackend.check_options(_ray_options(opts))  # something answers there, it is Ray, it takes our token
    folder = _sweep_folder("runs" if logdir is None else logdir, name, algo, env)
    horizon = max(math.ceil(r.total_steps / r.eval_every) for r in checked)  # the longest trial's evaluations
    spec = Sweep(algo, env, [p.text for p in params], train_options, opts, str(folder), horizon)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SPEC_FILE).write_text(json.dumps(spec.to_json(), indent=2, default=str))
    return _run(spec, restore=False)


def _resume(
    folder: str | Path,
    algo: str | None,
    env: str | None,
    search: list[str] | tuple[str, ...],
    train_options: dict[str, Any],
    given_tune: dict[str, Any],
) -> SweepResult:
    """Go on with the sweep in `folder` (Ray Tune's restore: unfinished and failed trials run again, each resuming
    its run from its checkpoint). Only where it runs may change (`address`, `progress`). The sweep is the folder
    given, wherever it was made: a sweep folder copied or moved resumes where it is now (Ray Tune's record follows
    it). A sweep stopped before Ray Tune saved its experiment (Ctrl-C while Ray starts) has only its `sweep.json`,
    and no trial ran: it starts afresh from it, as the command that made it would have."""
    spec = read_sweep(folder)
    spec.folder = str(Path(folder).resolve())  # sweep.json's is where it was made
    fixed = {k: v for k, v in given_tune.items() if k not in ("address", "progress")}
    if algo or env or search or train_options or fixed:
        named = [*(["ALGO"] if algo else []), *(["--env"] if env else []), *(["--search"] if search else []),
                 *("--" + k.replace("_", "-") for k in [*train_options, *fixed])]  # fmt: skip
        raise ConfigError(
            f"a resumed sweep keeps its configuration ({SPEC_FILE}); give only --address or --no-progress with "
            f"--resume, not {', '.join(named)}"
        )
    spec.tune.address = given_tune.get("address", "")
    spec.tune.progress = given_tune.get("progress", True)
    if spec.tune.address:
        from rlfleet.backends.ray_backend import RayBackend

        RayBackend.check_options(_ray_options(spec.tune))
    restore = (Path(spec.folder) / TUNE_FOLDER / "tuner.pkl").is_file()  # what `Tuner.can_restore` looks for
    if not restore:  # Ray Tune writes it before any trial starts
        print(f"{folder} holds no Ray Tune experiment yet (the sweep stopped before it began): it starts afresh")
    return _run(spec, restore=restore)


def _ray_options(opts: TuneOptions) -> Any:
    """The options the `ray` backend connects with: the sweep's address, and CPUs for one trial at least."""
    return SimpleNamespace(address=opts.address, workers=1, cpus_per_role=opts.cpus_per_trial or 1.0,
                           gpus_per_role=0.0, placement="")  # fmt: skip


TUNE_ENV = {
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",  # each trial's run folder has its metrics and TensorBoard events
    "RAY_AIR_NEW_OUTPUT": "0",  # Ray Tune's classic reporter, which verbose=0 silences
}
"""Ray Tune's settings for a sweep, read by its driver."""


def _run(spec: Sweep, restore: bool) -> SweepResult:
    """Connect to Ray, run (or restore) the Ray Tune experiment, write the summary; Ray is left as it was found."""
    from rlfleet.backends.ray_backend import RayBackend

    os.environ.update(TUNE_ENV)
    folder = Path(spec.folder)
    backend = RayBackend(_ray_options(spec.tune), run_dir=folder)
    try:
        from ray import tune

        from rlfleet.tuning.report import ProgressCallback, summarize

        trainable = tune.with_resources(
            tune.with_parameters(run_trial, sweep=spec.to_json()), {"cpu": spec.tune.cpus_per_trial or 1.0}
        )
        progress = ProgressCallback(spec)
        with (
            _tune_log(folder / "ray.log"),
            warnings.catch_warnings(),
            _signal_handlers_kept() as ctrl_c,
            contextlib.closing(progress),  # on an error too: a later sweep of this folder makes its own
        ):
            warnings.filterwarnings("ignore", message="Consider boosting PBT performance")  # by reusing actors
            grid = _tuner(spec, trainable, progress, restore).fit()
            progress.close()
            return summarize(spec, grid, any(event.is_set() for event in ctrl_c))
    finally:
        backend.close()


def _tuner(spec: Sweep, trainable: Any, progress: Any, restore: bool) -> Any:
    """Ray Tune's `Tuner` of the sweep: a new experiment in the sweep's `tune/`, or the one there restored."""
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    folder = Path(spec.folder)
    if restore:
        return tune.Tuner.restore(str(folder / TUNE_FOLDER), trainable, resume_unfinished=True, resume_errored=True)
    return tune.Tuner(
        trainable,
        param_space={p.name: p.domain() for p in spec.params},
        tune_config=tune.TuneConfig(
            num_samples=spec.tune.trials,
            search_alg=BasicVariantGenerator(  # Tune ignores max_concurrent_trials beside a generator of one's own
                max_concurrent=spec.tune.max_concurrent or 0, random_state=int(spec.options.get("seed", 0))
            ),
            scheduler=_scheduler(spec),
            reuse_actors=False,  # a new process per trial (Tune's HyperBand stalls with reused function actors)
        ),
        run_config=tune.RunConfig(
            name=TUNE_FOLDER,
            storage_path=str(folder),
            verbose=0,
            callbacks=[progress],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=_learners_kept(spec)),
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )


def _learners_kept(spec: Sweep) -> int | None:
    """How many of its learners (PBT's checkpoints) each trial's Tune record keeps: a donor's learner is the one it
    reported at its last perturbation, up to `perturbation_interval` reports before a weaker trial takes it."""
    if spec.tune.scheduler != "pbt":
        return None  # nothing is reported with a checkpoint
    return 2 * _perturbation_interval(spec) + 2


def _perturbation_interval(spec: Sweep) -> int:
    return spec.tune.perturbation_interval or max(1, spec.max_evaluations // 10)


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[list[threading.Event]]:
    """Yields a list that receives the event Ray Tune's handler of Ctrl-C sets (its first Ctrl-C ends the sweep with
    every trial's state saved), and puts back the handlers of SIGINT and SIGUSR1 as they were before Ray Tune set its
    own, which it leaves in place unless one came. Tune keeps the event to itself (`tune.run` returns as it does at a
    sweep's end), so its maker is wrapped while the sweep runs."""
    import ray.tune.tune as tune_run

    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGUSR1)}
    made = getattr(tune_run, "_setup_signal_catching", None)
    events: list[threading.Event] = []  # stays empty where this Ray Tune makes its event otherwise

    def catching() -> threading.Event:
        assert made is not None  # wrapped only where there is one
        events.append(made())
        return events[-1]

    if made is not None:
        tune_run._setup_signal_catching = catching  # noqa: SLF001
    try:
        yield events
    finally:
        if made is not None:
            tune_run._setup_signal_catching = made  # noqa: SLF001
        if threading.current_thread() is threading.main_thread():
            for sig, handler in kept.items():
                if handler is not None:  # None: a handler not set from Python, which cannot be put back
                    signal.signal(sig, handler)


@contextlib.contextmanager
def _tune_log(path: Path) -> Iterator[None]:
    """Ray Tune's own lines (warnings, hints, a failed trial's traceback) go to the sweep's ray.log; the terminal
    shows rlfleet's line per trial and the summary."""
    loggers = [logging.getLogger(n) for n in ("ray.tune", "ray.train", "ray.air")]
    saved = [(lg.propagate, lg.level) for lg in loggers]
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for lg in loggers:
        lg.propagate = False
        lg.setLevel(logging.INFO)
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg, (propagate, level) in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.propagate, lg.level = propagate, level
        handler.close()


def _scheduler(spec: Sweep) -> Any:
    """Ray Tune's scheduler for the sweep, on the evaluation clock (`TIME_ATTR`)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler, PopulationBasedTraining

    opts, horizon = spec.tune, max(1, spec.max_evaluations)
    common: dict[str, Any] = {"time_attr": TIME_ATTR, "metric": opts.metric, "mode": opts.better}
    if opts.scheduler == "asha":
        grace = min(opts.grace_period or max(1, horizon // 8), horizon)
        return ASHAScheduler(max_t=horizon, grace_period=grace, reduction_factor=4, **common)
    if opts.scheduler == "hyperband":
        return HyperBandScheduler(max_t=horizon, reduction_factor=3, **common)
    if opts.scheduler == "pbt":
        return PopulationBasedTraining(
            perturbation_interval=_perturbation_interval(spec),
            hyperparam_mutations={p.name: p.mutation() for p in spec.params},
            custom_explore_fn=KeptInRange(tuple(p for p in spec.params if p.dist != "choice")),
            quantile_fraction=0.25,
            resample_probability=0.25,
            **common,
        )
    return FIFOScheduler()  # type: ignore[no-untyped-call]  # Ray Tune leaves its __init__ unannotated

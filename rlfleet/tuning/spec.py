"""What a sweep is: its options (`TuneOptions`), its record in the sweep folder (`Sweep`, `sweep.json`), what it
returns (`SweepResult`), and the names of the sweep folder's parts (see `rlfleet.tuning.sweep`)."""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rlfleet.arch import default_arch, runner_class
from rlfleet.fields import MAX_ROLES, bounded, checked, one_of
from rlfleet.tuning.space import Param, apply, parse_space

SCHEDULERS = ("fifo", "asha", "hyperband", "pbt")
METRICS = {"eval/return_mean": "max", "eval/return_best": "max", "eval/return_std": "min"}
"""What a trial reports after every evaluation, which a sweep may rank by, and the direction that is better."""
TIME_ATTR = "evaluations"
"""The schedulers' clock: evaluations a trial has made (its run's count, which goes on when a trial resumes)."""
MAX_TRIALS = 100_000
SPEC_FILE = "sweep.json"
TUNE_FOLDER = "tune"
TRIALS_FOLDER = "trials"
EXPLOITS = "exploits.jsonl"
NODES_FILE = "nodes.json"  # in a trial's run folder: the Ray nodes it ran on
NODES_FILE = "nodes.json"  # in a trial's run folder: the Ray nodes it ran on


@dataclass
class TuneOptions:
    """How a sweep runs; each option declares its range (`rlfleet.fields`)."""

    trials: int = bounded(10, ge=1, le=MAX_TRIALS)
    """Trials (configurations drawn from the search space)."""
    scheduler: str = checked("fifo", one_of(SCHEDULERS))
    """fifo (every trial runs to its end: the A3C paper's sweeps), asha (stops the weak trials at evaluation
    milestones), hyperband (Ray Tune's synchronous HyperBand: pauses and resumes trials), pbt (population-based
    training: weak trials take a strong trial's learner and perturb its config)."""
    metric: str = checked("eval/return_mean", one_of(tuple(METRICS)))
    """What trials are ranked by: eval/return_mean (the last evaluation's), eval/return_best (the best one so
    far) or eval/return_std."""
    mode: str | None = checked(None, lambda v: None if v is None else one_of(("max", "min"))(v))
    """max or min; default: the metric's own (max for returns, min for eval/return_std)."""
    max_concurrent: int | None = bounded(None, ge=1, le=MAX_ROLES)
    """Trials at a time; default: as many as the CPUs allow (--cpus-per-trial each)."""
    cpus_per_trial: float | None = bounded(None, gt=0, le=MAX_ROLES)
    """CPUs each trial reserves; default: 1, or one per role of a parallel architecture (--workers: the most any
    trial gets, where it is searched)."""
    grace_period: int | None = bounded(None, ge=1)
    """asha (only): evaluations every trial makes before it may be stopped; default: an eighth of a run's."""
    perturbation_interval: int | None = bounded(None, ge=1)
    """pbt (only): evaluations between a trial's exploit-and-explore steps; default: a tenth of a run's."""
    address: str = ""
    """The Ray cluster to run the trials on (HOST:PORT or auto); empty: a private Ray instance on 127.0.0.1."""
    progress: bool = True
    """Show a progress bar over the trials."""

    @property
    def better(self) -> str:
        return self.mode or METRICS[self.metric]


@dataclass
class Sweep:
    """What a sweep is, as `sweep.json` keeps it (`rlfleet tune --resume` reads it back)."""

    algo: str
    env: str
    search: list[str]
    options: dict[str, Any]
    """The `rlfleet.train` options every trial shares (its searched ones set on top, `rlfleet.tuning.space.apply`)."""
    tune: TuneOptions
    folder: str  # absolute: where it was made (a resumed sweep's is the folder --resume was given)
    max_evaluations: int
    """Evaluations of a whole run (the schedulers' horizon): the longest trial's, where `steps` or `eval_every` is
    searched."""
    cwd: str = field(default_factory=os.getcwd)
    """Where the sweep started: each trial runs there, so that relative paths (`--dataset`) mean what they meant."""
    created: str = field(default_factory=lambda: f"{datetime.now():%Y-%m-%d %H:%M:%S}")

    @functools.cached_property
    def params(self) -> list[Param]:
        return parse_space(self.search, self.algo, options_cls(self.algo, self.options))

    @property
    def trials_dir(self) -> Path:
        return Path(self.folder) / TRIALS_FOLDER

    def trial_options(self, config: dict[str, Any], trial_id: str) -> dict[str, Any]:
        """The `rlfleet.train` options of trial `trial_id` with its `config`: the sweep's with the searched ones
        set, and the trial's own seed (the sweep's + the trial's index) unless the seed is searched."""
        options = apply(self.params, config, self.options)
        if "seed" not in config:
            options["seed"] = int(self.options.get("seed", 0)) + int(trial_id.rsplit("_", 1)[-1])
        return options

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "tune": dataclasses.asdict(self.tune)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sweep:
        return cls(**{**data, "tune": TuneOptions(**data["tune"])})


@dataclass
class SweepResult:
    """What `rlfleet.tune` returns: the sweep folder, one row per trial (as in `trials.csv`), the best trial's row
    and its `rlfleet train` command, and whether the sweep was interrupted before every trial ended."""

    sweep_dir: Path
    trials: list[dict[str, Any]]
    best: dict[str, Any] | None
    command: str | None
    interrupted: bool


def options_cls(algo: str, options: dict[str, Any]) -> type:
    """The `Options` of the architecture the trials run on (`options["arch"]`, else the algorithm's default)."""
    return runner_class(options.get("arch") or default_arch(algo)).Options

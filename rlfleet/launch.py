"""`rlfleet.train()`: launch one run — resolve the algorithm and its architecture, build the runner, run it (or
resume a run folder). The one module above the architectures: the CLI and the Python API start runs here."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlfleet.algos import resolve
from rlfleet.arch import default_arch, runner_class
from rlfleet.arch.offline import check_data_source
from rlfleet.run.checkpoint import load_checkpoint, run_folder_of
from rlfleet.run.config import ConfigError, RunConfig
from rlfleet.run.runner import RunBase, RunResult


def train(
    algo: str | None = None,
    env: str | None = None,
    *,
    resume: str | Path | None = None,
    callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    **options: Any,
) -> RunResult:
    """Train `algo` on `env` (or resume a run folder); options are `RunConfig` fields.

    >>> result = rlfleet.train("ppo", "CartPole-v1", seed=1)
    >>> result["solved"], result.run_dir
    """
    if resume is not None:
        payload = load_checkpoint(resume)
        run_dir = run_folder_of(resume)
        resumable = {"steps", "time_limit", "progress"}
        if set(options) - resumable:
            raise ConfigError(
                f"a resumed run keeps its configuration; only {sorted(resumable)} can be changed, "
                f"got {sorted(set(options) - resumable)}"
            )
        saved = payload["run_config"]
        saved.update(options)
        cfg = RunConfig(**saved)
        return _runner(cfg)(cfg, resume_from=payload, run_dir=run_dir, callbacks=callbacks).run()
    if algo is None or env is None:
        raise ConfigError("train needs an algorithm and an env (or resume=RUN_DIR)")
    known = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = set(options) - known
    if unknown:
        raise ConfigError(f"unknown run option(s) {sorted(unknown)}; valid: {sorted(known - {'algo', 'env'})}")
    paths = {k: os.fspath(v) for k, v in options.items() if isinstance(v, os.PathLike)}  # saved as plain text
    cfg = RunConfig(algo=algo, env=env, **{**options, **paths})
    return _runner(cfg)(cfg, callbacks=callbacks).run()


def _runner(cfg: RunConfig) -> type[RunBase]:
    """The runner class of the run's architecture (resolving the algorithm's default into `cfg.arch`)."""
    algo_cls = resolve(cfg.algo)[0]  # an unknown algorithm is reported as such, before the architecture
    if cfg.arch is None:
        cfg.arch = default_arch(cfg.algo)
    runner = runner_class(cfg.arch)
    check_data_source(cfg, algo_cls)  # --dataset/--expert and imitation algorithms go together
    return runner

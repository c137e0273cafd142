"""Time-to-solve CartPole-v1, Pendulum-v1 or MountainCarContinuous-v0, or final return after a fixed budget, for
one rlfleet run, through rlfleet's CLI.

Time-to-solve: runs ``rlfleet train ALGO --env CartPole-v1 --seed S --eval-every 2000 --eval-episodes 10
--stop-return 475 --time-limit T --logdir DIR --name NAME`` (``--env Pendulum-v1 --stop-return -250`` on
Pendulum-v1: the default env of ddpg, td3 and sac, and ppo, a2c or a3c's with ``--env Pendulum-v1``) with
``OMP_NUM_THREADS=1`` and no ``--preset`` or ``--set`` override: rlfleet's defaults are what is measured (on a
Box-action classic-control env such as Pendulum-v1 the CLI itself picks the algorithm's ``continuous`` preset,
where it has one; on an env with a per-env preset, such as MountainCarContinuous-v0 for td3 and sac, that
preset, ``--stop-return 90``). It reads the ``DIR/NAME/result.json`` the CLI writes (keys ``solved``,
``solved_at_step``, ``solved_at_s``, ``eval_return_mean``, ``env_steps``, ``wall_time_s``) and prints the same
JSON line as the peer runners, with ``evals`` from the run's ``metrics.csv`` (its ``eval/return_mean`` rows). The
timings are rlfleet's own: the CLI measures from the start of training, after imports and env/model construction,
with the evaluations' time counting. A run that solves only past the time limit counts as not solved.

Fixed budget (``--steps N``, e.g. ``--env Hopper-v5 --steps 100000``): runs ``rlfleet train ALGO --env ENV
--seed S --steps N --eval-every N --eval-episodes 10 --stop-return 1e9 --logdir DIR --name NAME``, again with
no ``--preset`` or ``--set``: on a MuJoCo env the CLI picks the algorithm's ``mujoco`` preset, or the env's
per-env preset where it has one (ppo on Hopper-v5 and HalfCheetah-v5). ``--steps N`` sets the run's
``total_steps`` to N, which is also what the preset's schedules run over: with the ``mujoco`` preset PPO's
learning rate anneals linearly from 3e-4 to 0 over the N steps (not over the preset's 1M); SAC has no schedule. The only
evaluation is the one at the first iteration at or past N (PPO collects 2,048-step segments: 100,352 steps for
N = 100,000); ``--stop-return 1e9`` keeps the env's reward threshold from stopping the run early. Reports that
evaluation's ``eval_return_mean`` and ``eval_return_std`` from ``result.json``, and its ``wall_time_s``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from peers.common import (
    ALGOS_BY_ENV,
    EVAL_EPISODES,
    EVAL_EVERY_STEPS,
    SOLVED_RETURNS,
    FinalReturnResult,
    RunResult,
    arg_parser,
    emit,
    library_versions,
    parse_run_args,
)

# a3c: hogwild with the CLI's default 2 worker processes; apex-X: X on the apex architecture with 3 actors
APEX_ACTORS = 3
SUPPORTED = {(algo, env) for env, algos in ALGOS_BY_ENV.items() for algo in algos}
ALGOS = sorted({algo for algo, _ in SUPPORTED})


def rlfleet_executable() -> str:
    """The ``rlfleet`` console script next to this interpreter, else the one on PATH."""
    beside = Path(sys.executable).with_name("rlfleet")
    found = str(beside) if beside.exists() else shutil.which("rlfleet")
    if found is None:
        raise SystemExit("rlfleet CLI not found: install rlfleet (pip install -e .) in this interpreter's env")
    return found


def train(
    algo: str, env_id: str, seed: int, time_limit: float, steps: int | None, logdir: Path
) -> tuple[dict, list[tuple[int, float, float]]]:
    """Run one ``rlfleet train``; return its ``result.json`` and its evaluations (:func:`evaluations`). Its own
    output goes to stderr.

    ``steps`` None: time-to-solve (evaluations every 2,000 steps, stop when solved or at ``time_limit``);
    else a fixed budget of ``steps`` env steps with one evaluation at the end."""
    name = f"{algo}-{env_id}-seed{seed}"
    if steps is None:
        protocol = ["--eval-every", str(EVAL_EVERY_STEPS), "--stop-return", f"{SOLVED_RETURNS[env_id]:g}",
                    "--time-limit", f"{time_limit:g}"]  # fmt: skip
    else:
        protocol = ["--steps", str(steps), "--eval-every", str(steps), "--stop-return", "1e9"]
    arch = []
    if algo.startswith("apex-"):
        algo, arch = algo.removeprefix("apex-"), ["--arch", "apex", "--actors", str(APEX_ACTORS)]
    command = [
        rlfleet_executable(), "train", algo, *arch,
        "--env", env_id,
        "--seed", str(seed),
        *protocol,
        "--eval-episodes", str(EVAL_EPISODES),
        "--logdir", str(logdir),
        "--name", name,
        "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    completed = subprocess.run(command, env=env, stdout=sys.stderr, stderr=sys.stderr, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"rlfleet train exited with status {completed.returncode}: {' '.join(command)}")
    return json.loads((logdir / name / "result.json").read_text()), evaluations(logdir / name / "metrics.csv")


def evaluations(metrics_csv: Path) -> list[tuple[int, float, float]]:
    """Every evaluation of a run as ``(env_steps, seconds since the start of training, mean return)``: the
    ``eval/return_mean`` rows of its ``metrics.csv`` (columns step, wall_time, key, value), logged with the time
    at which the evaluation ended (that of ``solved_at_s`` for the solving one), to the CSV's precision (ms, 6
    significant digits)."""
    with metrics_csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [(int(r["step"]), float(r["wall_time"]), float(r["value"])) for r in rows if r["key"] == "eval/return_mean"]


def record_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The fields that every record of this run shares: who ran what, and with which libraries."""
    return {
        "framework": "rlfleet",
        "version": library_versions("rlfleet")["rlfleet"],
        "algo": args.algo,
        "env": args.env,
        "seed": args.seed,
        "libraries": library_versions("torch", "gymnasium", "numpy", "mujoco"),
    }


def to_run_result(
    fields: dict[str, Any], time_limit: float, result: dict, evals: list[tuple[int, float, float]]
) -> RunResult:
    # an evaluation that ends past the time limit does not solve (as for the peers: ``Tracker.record``)
    solved = bool(result["solved"]) and result["solved_at_s"] <= time_limit
    if solved:
        stop_reason = "solved"
    elif result["wall_time_s"] >= time_limit:
        stop_reason = "time_limit"
    else:
        stop_reason = "step_limit"
    return RunResult(
        **fields,
        solved=solved,
        solved_at_s=result["solved_at_s"] if solved else None,
        solved_at_step=result["solved_at_step"] if solved else None,
        env_steps=int(result["env_steps"]),
        wall_time_s=float(result["wall_time_s"]),
        cpu_time_s=None,
        eval_return_mean=result["eval_return_mean"],
        stop_reason=stop_reason,
        time_limit_s=time_limit,
        step_limit=None,
        evals=evals,
    )


def to_final_return_result(fields: dict[str, Any], steps: int, result: dict) -> FinalReturnResult:
    return FinalReturnResult(
        **fields,
        steps=steps,
        env_steps=int(result["env_steps"]),
        eval_return_mean=float(result["eval_return_mean"]),
        eval_return_std=float(result["eval_return_std"]),
        wall_time_s=float(result["wall_time_s"]),
        cpu_time_s=None,
    )


def main() -> None:
    parser = arg_parser("rlfleet", ALGOS)
    parser.add_argument("--logdir", type=Path, help="keep rlfleet's run folder here (default: a temp dir)")
    args = parse_run_args(parser, SUPPORTED)
    if args.logdir is not None:
        result, evals = train(args.algo, args.env, args.seed, args.time_limit, args.steps, args.logdir)
    else:
        with tempfile.TemporaryDirectory(prefix="rlfleet-run-") as tmp:
            result, evals = train(args.algo, args.env, args.seed, args.time_limit, args.steps, Path(tmp))
    if args.steps is None:
        emit(to_run_result(record_fields(args), args.time_limit, result, evals))
    else:
        emit(to_final_return_result(record_fields(args), args.steps, result))


if __name__ == "__main__":
    main()

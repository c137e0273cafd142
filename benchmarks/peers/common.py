"""The protocols shared by all runners: constants, CLI, evaluation bookkeeping, JSON result lines.

Two kinds of run, one per driver: **time-to-solve** (``time_to_solve.py``: greedy evaluation every 2,000 env
steps, stop when solved or out of time; :class:`RunResult`) and **final return after a fixed budget**
(``mujoco_return.py``, the runners' ``--steps N``: train for N env steps, then one greedy evaluation;
:class:`FinalReturnResult`).

Standard library only: it is imported by the peer runners (inside the peers' venv), by
``benchmarks/rlfleet_runner.py`` and by the drivers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

ENV_ID = "CartPole-v1"
EVAL_EVERY_STEPS = 2_000
EVAL_EPISODES = 10
"""Evaluation episodes, run side by side: one episode in each env of a vector env of ``EVAL_EPISODES``
separate envs (as rlfleet's evaluator does), batching the policy's forward passes."""
SOLVED_RETURN = 475.0
CONTINUOUS_ENV_ID = "Pendulum-v1"
"""Where the algorithms for Box actions only (ddpg, td3, sac) are timed: CartPole's actions are discrete."""
CONTINUOUS_ALGOS = ("ddpg", "td3", "sac", "apex-td3")
SPARSE_ENV_ID = "MountainCarContinuous-v0"
"""Where exploration is timed: +100 at a flag behind a run-up, −0.1 a² per step (rlfleet's per-env presets,
rl-zoo3's entries for the same env)."""
ENV_IDS = (ENV_ID, CONTINUOUS_ENV_ID, SPARSE_ENV_ID)
SOLVED_RETURNS = {ENV_ID: SOLVED_RETURN, CONTINUOUS_ENV_ID: -250.0, SPARSE_ENV_ID: 90.0}
"""The solved mean return of each env (Pendulum-v1: the Tianshou paper's −250; MountainCarContinuous-v0: its
registered reward_threshold)."""
MUJOCO_ENV_IDS = ("Hopper-v5", "HalfCheetah-v5")
"""Where the fixed-budget benchmark measures the final return (they have no solved return here: ``--steps``)."""
MUJOCO_ALGOS = ("sac", "ppo")
RUNNER_ENV_IDS = (*ENV_IDS, *MUJOCO_ENV_IDS)
ALGOS_BY_ENV = {
    ENV_ID: ("ppo", "a2c", "dqn", "pg", "a3c", "apex-dqn"),
    CONTINUOUS_ENV_ID: ("sac", "td3", "ddpg", "ppo", "a2c", "a3c", "apex-td3"),
    SPARSE_ENV_ID: ("td3", "sac", "ppo"),
    **{env: MUJOCO_ALGOS for env in MUJOCO_ENV_IDS},
}
"""The algorithms that can be run on each env (by rlfleet; the peers' runners cover subsets). ``apex-X``: algorithm X
on rlfleet's Ape-X architecture with 3 actor processes (``--arch apex --actors 3``)."""
DEFAULT_BUDGET_STEPS = 100_000
"""The fixed budget of the final-return benchmark, in env steps (counted over all parallel training envs)."""


def env_for(algo: str) -> str:
    """The env an algorithm is timed on by default: Pendulum-v1 for the Box-only algorithms, else CartPole-v1."""
    return CONTINUOUS_ENV_ID if algo in CONTINUOUS_ALGOS else ENV_ID


DEFAULT_TIME_LIMIT_S = 300.0
EVAL_SEED_OFFSET = 10_000
"""The peer runners seed the evaluation vector env of run ``seed`` with ``seed + EVAL_SEED_OFFSET``."""


@dataclass
class RunResult:
    """One (framework, algo, env, seed) run, printed by a runner as a single JSON line on stdout."""

    framework: str
    version: str
    algo: str
    env: str
    seed: int
    solved: bool
    solved_at_s: float | None
    solved_at_step: int | None
    env_steps: int
    wall_time_s: float
    cpu_time_s: float | None
    """Process CPU seconds over the same span as ``wall_time_s``: far below it means the CPU was contended."""
    eval_return_mean: float | None
    stop_reason: str
    """``solved``, ``time_limit`` or ``step_limit``."""
    time_limit_s: float
    step_limit: int | None
    evals: list[tuple[int, float, float]] = field(default_factory=list)
    """Every evaluation as ``(env_steps, seconds since the start of training, mean return)``."""
    libraries: dict[str, str] = field(default_factory=dict)


def arg_parser(framework: str, algos: list[str]) -> argparse.ArgumentParser:
    """The CLI every runner shares: ``--algo``, ``--env``, ``--seed``, ``--time-limit``, ``--steps``.

    Without ``--steps``, a time-to-solve run; with it, a fixed-budget run (``--time-limit`` unused). Parse
    with :func:`parse_run_args`, which fills in ``--env``'s default, the algorithm's own env.
    """
    parser = argparse.ArgumentParser(
        description=f"Time-to-solve, or final return after --steps, of one {framework} run."
    )
    parser.add_argument("--algo", required=True, choices=algos)
    parser.add_argument("--env", choices=RUNNER_ENV_IDS, help="default: the algorithm's own env (see env_for)")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S, help="wall-clock seconds")
    parser.add_argument(
        "--steps",
        type=int,
        help="fixed budget: train for this many env steps, then one greedy evaluation (needed on MuJoCo envs)",
    )
    return parser


def parse_run_args(parser: argparse.ArgumentParser, supported: Collection[tuple[str, str]]) -> argparse.Namespace:
    """Parse a runner's CLI; ``--env`` defaults to ``env_for(algo)``; ``(algo, env)`` must be in ``supported``."""
    args = parser.parse_args()
    args.env = args.env or env_for(args.algo)
    if (args.algo, args.env) not in supported:
        parser.error(f"this runner does not run {args.algo} on {args.env}")
    if args.steps is None and args.env not in SOLVED_RETURNS:
        parser.error(f"{args.env} has no solved return to time: give a fixed budget with --steps")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions of the given distributions (those not installed are left out)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def emit(result: RunResult | FinalReturnResult) -> None:
    """Print the result as one JSON line on the process' real stdout (libraries' chatter goes to stderr)."""
    sys.__stdout__.write(json.dumps(asdict(result)) + "\n")
    sys.__stdout__.flush()


class Clock:
    """Wall-clock and process CPU time from :meth:`start`."""

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()

    def wall(self) -> float:
        return round(time.perf_counter() - self._t0, 4)

    def cpu(self) -> float:
        return round(time.process_time() - self._cpu0, 4)


class Tracker(Clock):
    """Evaluation schedule and stop rule of the protocol, for runners that drive a peer's training loop.

    Call :meth:`start` right before training starts; at each training-loop boundary ask :meth:`eval_due`,
    and if it is, evaluate (the evaluation's time counts) and pass the mean return to :meth:`record`,
    which says whether training must stop: solved (mean return >= ``SOLVED_RETURNS[env]`` by the end of the
    wall-clock limit: an evaluation that ends past it does not solve), wall-clock limit or step limit reached.
    """

    def __init__(self, env: str, time_limit_s: float, step_limit: int) -> None:
        self.env = env
        self.solved_return = SOLVED_RETURNS[env]
        self.time_limit_s = time_limit_s
        self.step_limit = step_limit
        self.next_eval_step = EVAL_EVERY_STEPS
        self.evals: list[tuple[int, float, float]] = []
        self.stop_reason: str | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def eval_due(self, env_steps: int) -> bool:
        return env_steps >= self.next_eval_step

    def record(self, env_steps: int, mean_return: float) -> bool:
        """Record an evaluation just finished at ``env_steps``; return True when training must stop."""
        elapsed = self.elapsed()
        self.evals.append((env_steps, round(elapsed, 4), float(mean_return)))
        while self.next_eval_step <= env_steps:
            self.next_eval_step += EVAL_EVERY_STEPS
        if mean_return >= self.solved_return and elapsed <= self.time_limit_s:  # a solve past the limit is none
            self.stop_reason = "solved"
        elif elapsed >= self.time_limit_s:
            self.stop_reason = "time_limit"
        elif env_steps >= self.step_limit:
            self.stop_reason = "step_limit"
        return self.stop_reason is not None

    def result(
        self, *, framework: str, version: str, algo: str, seed: int, env_steps: int, libraries: dict[str, Any]
    ) -> RunResult:
        """The run's record, once training has stopped."""
        solved = self.stop_reason == "solved"
        last = self.evals[-1] if self.evals else None
        return RunResult(
            framework=framework,
            version=version,
            algo=algo,
            env=self.env,
            seed=seed,
            solved=solved,
            solved_at_s=last[1] if solved and last else None,
            solved_at_step=last[0] if solved and last else None,
            env_steps=env_steps,
            wall_time_s=self.wall(),
            cpu_time_s=self.cpu(),
            eval_return_mean=last[2] if last else None,
            stop_reason=self.stop_reason or "step_limit",
            time_limit_s=self.time_limit_s,
            step_limit=self.step_limit,
            evals=self.evals,
            libraries=libraries,
        )


@dataclass
class FinalReturnResult:
    """One fixed-budget run (``--steps``), printed by a runner as a single JSON line on stdout."""

    framework: str
    version: str
    algo: str
    env: str
    seed: int
    steps: int
    """The budget: training stops at the first point of the framework's loop at or past it."""
    env_steps: int
    """Env steps actually taken (a collection of fixed size can take the run past the budget)."""
    eval_return_mean: float
    """Mean undiscounted return of the greedy evaluation after training: ``EVAL_EPISODES`` episodes."""
    eval_return_std: float
    """Their population standard deviation (NumPy's default ``std``)."""
    wall_time_s: float
    """From the start of training (after imports and construction) to the end of the final evaluation."""
    cpu_time_s: float | None
    """Process CPU seconds over the same span (None where the runner cannot see it)."""
    libraries: dict[str, str] = field(default_factory=dict)


def final_return_result(clock: Clock, returns: Sequence[float], *, env_steps: int, **run: Any) -> FinalReturnResult:
    """The record of a fixed-budget run whose final evaluation just returned ``returns`` (one per episode).

    ``run``: the other fields of :class:`FinalReturnResult` that the runner knows (framework, version, algo,
    env, seed, steps, libraries)."""
    returns = [float(r) for r in returns]
    mean, std = statistics.fmean(returns), statistics.pstdev(returns)
    return FinalReturnResult(
        **run,
        env_steps=int(env_steps),
        eval_return_mean=mean,
        eval_return_std=std,
        wall_time_s=clock.wall(),
        cpu_time_s=clock.cpu(),
    )

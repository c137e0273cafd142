"""`hogwild`: the A3C paper's asynchronous actor-learners (Mnih et al. 2016, Algorithms 1, S2, S3).

N worker processes (`spawn`, one torch thread each), each with its own env(s), seed and exploration.
The algorithm's networks live in shared memory. A worker, per segment:

1. copies the shared parameters into its own algorithm object (θ' ← θ);
2. runs the algorithm's `schedule` at the global step T (ε annealing to its own final ε, learning-rate
   annealing, target-network sync every `target_update_every` global steps into the one shared target);
3. collects up to t_max = `rollout_len` steps per env with its local copy (`Collector.collect_rollout`:
   bootstrap 0 on termination, from the network on truncation and at the segment end);
4. computes the algorithm's own loss on the segment (`algo.process`, `algo.loss`: forward-view n-step
   returns for A2C/n-step Q, one-step targets for one-step Q/Sarsa), back-propagates locally, clips the
   gradient norm, and applies the gradient lock-free to the shared parameters with the run's optimizer
   (`SharedRMSprop` by default, the paper's: statistics shared by all workers; `--optimizer algo` gives each
   worker a copy of the algorithm's own optimizer over the shared parameters, its statistics its own; see
   `rlfleet.optim.shared`);
5. adds its steps to the global counter T.

The main process is the monitor: it never pauses the workers; it logs their episode returns and
losses, evaluates the shared parameters greedily, writes checkpoints and `result.json`, restarts a
crashed worker from the shared parameters (its traceback is printed and kept in `workers.log`), and on
Ctrl-C or a stop condition tells the workers to leave, saves and exits with no process left behind.

The workers run on the run's backend (`--backend`: `local` processes, or `serial`, round-robin in the main
process for tests and debugging); the loop is the same: `ParallelRunner.run`, whose pass over the workers'
reports this runner's `coordinate` is (up to one report of every worker within `REPORT_EVERY_S`); after the
loop it counts the episodes the workers reported on their way out (`wind_down`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlfleet.arch.parallel import ParallelRunner, SharedOptimizerOptions, Taken, WorkerActor, WorkerSpec
from rlfleet.arch.shared import LocalCopy, trainable_params
from rlfleet.backends import BACKENDS, RoleGroup
from rlfleet.backends.shared_memory import StepCounter, StopFlag
from rlfleet.optim.shared import build_optimizer, is_shared
from rlfleet.optim.step import set_lr
from rlfleet.run.config import ConfigError, RunConfig
from rlfleet.run.logger import RunLogger

REPORT_EVERY_S = 0.2  # how often a worker process sends its episode returns and losses to the monitor
PHASES = ("pull", "act", "loss", "backward", "apply")
"""Where a worker's segment goes, timed: copy the shared parameters (pull), collect the segment (act: forward
passes and env steps), the loss's forward pass (loss), back-propagation and the norm clip (backward), and the
optimizer's step on the shared parameters (apply: the shared-parameter write and, with shared_rmsprop or
shared_adam, the shared statistics)."""


@dataclass
class HogwildSpec(WorkerSpec):
    """What a hogwild worker needs besides the algorithm and envs: its optimizer (picklable)."""

    optimizer: str
    lr: float
    max_grad_norm: float
    report_every_s: float = REPORT_EVERY_S
    """How long a worker steps before it reports home (0: after each segment, as the serial backend needs)."""


class HogwildWorker(WorkerActor):
    """One actor-learner: its own envs and local copy of the model; gradients go to the shared parameters."""

    spec: HogwildSpec
    copy: LocalCopy  # of the shared networks, which it is always given

    def __init__(
        self,
        spec: HogwildSpec,
        shared: dict[str, nn.Module],
        optimizer: torch.optim.Optimizer | None,
        worker_id: int,
        incarnation: int = 0,
        counter: StepCounter | None = None,
    ):
        super().__init__(spec, shared, worker_id, incarnation)
        self.counter = counter  # the global step count T; this worker adds to its own slot
        self.timing = dict.fromkeys(PHASES, 0.0)  # seconds in each phase since the last report
        self.segments = 0
        # shared kinds come built by the coordinator; per-worker ones keep their statistics here
        self.optimizer = optimizer or build_optimizer(
            spec.optimizer, self.copy.shared_params, spec.lr, algo_optimizer=self.algo.optimizer
        )

    def step(self, global_steps: int) -> tuple[int, dict[str, float]]:
        """One segment and one lock-free update of the shared parameters; (env steps taken, loss metrics). A
        segment with nothing to learn from (REINFORCE without a finished episode) makes no update: no metrics."""
        algo, timing, clock = self.algo, self.timing, time.perf_counter
        t0 = clock()
        self.copy.pull()
        t1 = clock()
        algo.schedule(global_steps, self.spec.total_steps)
        set_lr(self.optimizer, algo.lr_at(global_steps, self.spec.total_steps))  # the algorithm's own schedule
        before = self.collector.env_steps
        assert self.storage is not None  # hogwild runs rollout algorithms only (`check_parallel`)
        segment = self.collector.collect_rollout(self.storage)
        steps = self.collector.env_steps - before
        t2 = clock()
        timing["pull"] += t1 - t0
        timing["act"] += t2 - t1
        self.segments += 1
        batch = algo.process(segment)
        if len(batch) == 0:
            return steps, {}
        loss, metrics = algo.loss(batch)
        for p in self.copy.local_params:
            p.grad = None
        t3 = clock()
        loss.backward()
        limit = self.spec.max_grad_norm if self.spec.max_grad_norm > 0 else float("inf")
        metrics["grad_norm"] = float(nn.utils.clip_grad_norm_(self.copy.local_params, limit))
        self.copy.push_grads()
        t4 = clock()
        self.optimizer.step()
        t5 = clock()
        timing["loss"] += t3 - t2
        timing["backward"] += t4 - t3
        timing["apply"] += t5 - t4
        return steps, metrics

    def produce(self, global_steps: int, stop: StopFlag) -> tuple[int, list[float], dict[str, float], dict[str, float]]:
        """Segments for `report_every_s` (at least one), each added to the worker's slot of T; then the report
        home: (updates made, returns of the episodes finished, the last loss metrics, the seconds spent in each of
        `PHASES` and the segments since the last report, under "segments")."""
        assert self.counter is not None  # a backend's role is always given the global count
        updates, metrics, started = 0, {}, time.monotonic()
        t = global_steps
        while True:
            n, step_metrics = self.step(t)
            self.counter.add(n, slot=self.worker_id + 1)
            if step_metrics:
                updates, metrics = updates + 1, step_metrics
            t = self.counter.value
            if stop.is_set() or t >= self.spec.total_steps or time.monotonic() - started >= self.spec.report_every_s:
                timing = {**self.timing, "segments": float(self.segments)}
                self.timing, self.segments = dict.fromkeys(PHASES, 0.0), 0
                return updates, self.collector.pop_new_returns(), metrics, timing


class HogwildRunner(ParallelRunner):
    """The monitor of a `hogwild` run (see the module docstring)."""

    arch = "hogwild"
    learns_running_stats = False  # the workers' forward passes move their own copies' statistics
    Options = SharedOptimizerOptions
    spec: HogwildSpec

    def check_config(self) -> None:
        if not BACKENDS[self.opts.backend].shares_memory:  # first: the backend's own options are beside the point
            raise ConfigError(
                f"hogwild updates parameters in shared memory, one machine by nature; the {self.opts.backend} backend "
                "shares none: use --arch async_grad (asynchronous gradients, A3C's update through one learner)"
            )
        self.check_parallel(on_policy_only=True, uses_optimizer=True)

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        self.spec = self.worker_spec(
            HogwildSpec,
            optimizer=self.opts.optimizer,
            lr=self.algo_cfg.lr,
            max_grad_norm=self.algo.max_grad_norm,
        )
        self.start_backend(worker_slots=True)  # the shared networks first: a shared optimizer is built over them
        if self.backend.in_process:
            self.spec.report_every_s = 0.0  # one segment per report: a serial run stays deterministic
        self.optimizer = None
        if is_shared(self.opts.optimizer):
            self.optimizer = build_optimizer(self.opts.optimizer, trainable_params(self.shared), self.algo_cfg.lr)
        if resume_from is not None:
            self._restore(resume_from)
        self.eval_envs = self.make_eval_envs()
        self.timing = dict.fromkeys((*PHASES, "segments"), 0.0)  # summed over the workers' reports since the last row
        self._write_config({"optimizer": self.opts.optimizer, "workers": self.opts.workers})

    def _extra_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict() if self.optimizer is not None else None}

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        if self.optimizer is not None and saved.get("optimizer") is not None:
            self.optimizer.load_state_dict(saved["optimizer"])

    # ----------------------------------------------------------------------------------------- loop
    waiting_for = None  # reports come on a clock, not per item; a hung worker is the heartbeat's
    restart_how = "from the shared parameters"

    def start_workers(self, stop_flag: StopFlag, logger: RunLogger) -> RoleGroup:
        make_worker = partial(HogwildWorker, self.spec, self.shared, self.optimizer, counter=self.counter)
        return self.start_roles(make_worker, stop_flag)

    def coordinate(self, pool: RoleGroup) -> Taken | None:
        """Up to one report of every worker within `REPORT_EVERY_S`: their updates, episode returns and the
        latest loss metrics (the workers step the shared parameters themselves; T is theirs to count)."""
        new_returns: list[float] = []
        metrics: dict[str, float] = {}
        updates = reports = 0
        deadline = time.monotonic() + REPORT_EVERY_S
        for _ in range(self.opts.workers):  # up to one report of every worker
            report = pool.get_any(max(0.0, deadline - time.monotonic()))
            if report is None:
                break
            n_updates, returns, worker_metrics, timing = report
            for key, seconds in timing.items():
                self.timing[key] += seconds
            new_returns += returns
            updates += n_updates
            metrics = worker_metrics or metrics
            reports += 1
        self.count_returns(new_returns)
        return Taken(new_returns, metrics, updates) if reports else None

    def log_row(self) -> dict[str, float]:
        """Where the workers' time went since the last row: `hogwild/<phase>_ms`, the mean milliseconds of a segment
        in each of `PHASES` over the workers' segments, and `hogwild/<phase>_share`, its share of their time."""
        segments = self.timing["segments"]
        if segments == 0:
            return super().log_row()
        total = sum(self.timing[phase] for phase in PHASES) or 1e-12
        row = {f"hogwild/{phase}_ms": 1e3 * self.timing[phase] / segments for phase in PHASES}
        row |= {f"hogwild/{phase}_share": self.timing[phase] / total for phase in PHASES}
        self.timing = dict.fromkeys(self.timing, 0.0)
        return super().log_row() | row

    def wind_down(self, stop_flag: StopFlag, pool: RoleGroup) -> None:
        """Stop the workers, then count the updates, episodes and time they reported on their way out."""
        self.stop_roles(stop_flag, pool)
        while (report := pool.get_any(0.0)) is not None:
            self.state["updates"] += report[0]
            self.count_returns(report[1])
            for key, seconds in report[3].items():
                self.timing[key] += seconds

    def finish(self, logger: RunLogger, start: float, stopped_by: str) -> str:
        """The timing of the segments since the last log row, then the usual final evaluation and checkpoint (so a
        run shorter than a log row says where its time went too)."""
        if self.timing["segments"] > 0:
            logger.log(self.env_steps, self.log_row(), time.perf_counter() - start)
        return super().finish(logger, start, stopped_by)

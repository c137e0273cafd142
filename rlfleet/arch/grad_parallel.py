"""`grad_parallel`: workers compute gradients on their own data; the centre sums them and steps the shared model.

Gradient parallelism as in Lapan's "Deep RL Hands-On", ch. 11, and RLlib's AsyncGradients optimizer.
Who sends what to whom::

    worker 0 ──┐   Gradient: one flat float32 array (∇ of the algorithm's loss on its own   ┌────────────────────┐
    worker 1 ──┼── segment), its env steps, episode returns, loss metrics and the weight   ─▶│ centre (main proc.) │
      ...      │   version it was computed at (one pipe per worker)                          │ Σ k sets, clip,     │
    worker N ──┘                                                                             │ optimizer.step      │
        ▲                                                                                    └─────────┬──────────┘
        └──────────── shared parameters (+ version counter), pulled before each segment ◀──────────────┘

A worker (`spawn`ed, one torch thread) has its own vector env of the algorithm's `n_envs` and a local
algorithm object. Per segment it runs the algorithm's `schedule` at the global step count, copies the
current shared weights in (target networks included; `WeightVersion` makes the copy one exact version),
collects a segment (`Collector.collect_rollout`), computes `loss, metrics = algo.loss(algo.process(segment))`,
back-propagates locally and sends the gradient flattened in the order of the shared parameters.

The centre (main process) waits for k gradient sets from any workers (`RunConfig.grad_sets`, 0 = one per
worker), SUMS them (as Lapan does; k = 1 is RLlib's AsyncGradients), clips the global norm to the
algorithm's `max_grad_norm`, and steps ONE optimizer (`--optimizer`, built with `rlfleet.optim.shared.build_optimizer`
over the shared parameters, learning rate from the centre's own algorithm object's `schedule`, which also
syncs target networks). Its default, `algo`, is the algorithm's own optimizer built afresh over the shared
parameters (the class and hyperparameters of its single-process update: A2C's RMSprop, PPO's and PG's Adam,
n-step Q's Adam or RMSprop): Lapan's centre steps the agent's own Adam, and RLlib's AsyncGradientsOptimizer
applies each gradient with the policy's own optimizer, so with one worker a centre step is the algorithm's
own update on that worker's segment. The A3C paper's `shared_rmsprop` (hogwild's default) and the other
`rlfleet.optim.shared` kinds can be chosen instead.

Each step bumps the weight version; `charts/policy_lag` is the centre's version at
the step minus the version each gradient was computed at, `charts/policy_lag_max` its maximum since the
last log line. A worker computes its next gradient only once the centre has applied its last one
(`AHEAD` credits per worker, more if k needs them): with k = workers (the default) every step sums
gradients taken at the newest weights (lag 0, a synchronous sum); with k = 1 each worker goes on from
the weights its own gradient produced while the others' may be older (RLlib's AsyncGradients): a worker's
intervals from its read of the weights to its step do not overlap and each step inside one is another
worker's, so the lags of a run sum to at most (workers − 1) × steps (a mean ≤ workers − 1), while one
gradient's lag is unbounded (a fast worker steps several times during a slow one's segment: 10 with 2
workers). Letting workers run ahead instead (no credits) gave A2C on
CartPole-v1 a lag of 1–2 and up to 140k steps to solve instead of 55k: ~35% more env steps/s on 2 cores,
but about twice the time to solve. `env_steps` counts the steps behind the gradients the centre has
applied (and segments with nothing to learn from); a gradient still waiting for the rest of its set is
not counted, and a stop or checkpoint drops it, so the count is exact and resumable. Checkpoints hold the
centre's algorithm state, its optimizer and the counters.

Only on-policy algorithms whose own update is one gradient of their loss per segment (`one_gradient`:
a2c, onestep_q, sarsa, nstep_q; pg and ppo with one epoch of one minibatch) run here; PPO's epochs and
minibatches are refused with a pointer to data_parallel, whose learner runs PPO's own update. A segment
that gives the loss nothing to learn from (REINFORCE without a complete episode) sends no gradient, only
its steps.

A crashed worker is reported (traceback in `workers.log`) and restarted with a fresh pipe; Ctrl-C stops
the workers and saves a checkpoint. The workers run on the run's backend (`--backend`: `local`
processes, or `serial`, one after another in the main process for tests and debugging); the loop is the same:
`ParallelRunner.run`, whose pass over the workers' gradients this runner's `coordinate` is (the next gradient of
any worker, a centre step once k are gathered, the credits of those taken in given back). No gradient for 60 s
(`STALL_S`) is reported in `workers.log`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfleet.arch.parallel import WAIT_S, AlgoOptimizerOptions, ParallelRunner, Producer, Taken
from rlfleet.arch.shared import algo_modules, trainable_params
from rlfleet.backends import RoleGroup
from rlfleet.backends.shared_memory import StopFlag
from rlfleet.data.rollout import Segment
from rlfleet.device import host, read_metrics
from rlfleet.fields import MAX_ROLES, bounded
from rlfleet.optim.shared import ALGO, build_optimizer
from rlfleet.optim.step import set_lr
from rlfleet.run.config import ConfigError, RunConfig
from rlfleet.run.logger import RunLogger

AHEAD = 1  # gradients a worker may have computed beyond those the centre has applied


@dataclass
class Gradient:
    """One worker's contribution: the flat gradient of its loss on one segment, and its bookkeeping."""

    worker: int
    incarnation: int
    """How many times the worker had been restarted (its credits are given back only to that incarnation)."""
    version: int
    """Weight version the segment was collected and the gradient computed with."""
    steps: int
    returns: list[float]
    metrics: dict[str, float]
    grad: np.ndarray | None
    """float32, the shared parameters' gradients concatenated in order; None: nothing to learn from."""


class GradientWorker(Producer):
    """One worker: its own envs and a local algorithm object; gradients of the algorithm's loss go out flat."""

    def collect(self, global_steps: int, stop: StopFlag | None = None) -> tuple[int, Segment] | None:
        """(weight version, segment) collected with the current shared weights; None if `stop` was set."""
        self.algo.schedule(global_steps, self.spec.total_steps)  # ε and the like follow the whole run
        version = self.weights.read(self.copy.pull, stop)  # after schedule: the centre's target networks win
        if version is None:
            return None
        assert self.storage is not None  # grad_parallel runs rollout algorithms only (`check_parallel`)
        return version, self.collector.collect_rollout(self.storage)

    def gradient(self, segment: Segment) -> tuple[np.ndarray | None, dict[str, float]]:
        """The flat gradient of the algorithm's loss on `segment` at the local weights, and the loss metrics."""
        algo = self.algo
        batch = algo.process(segment)
        if len(batch) == 0:
            return None, {}
        loss, metrics = algo.loss(batch)
        params = self.copy.local_params
        for p in params:
            p.grad = None
        loss.backward()
        grads = [p.grad.flatten() if p.grad is not None else p.new_zeros(p.numel()) for p in params]
        return host(torch.cat(grads)), read_metrics(metrics)

    def produce(self, global_steps: int, stop: StopFlag | None = None) -> Gradient | None:
        before = self.collector.env_steps
        collected = self.collect(global_steps, stop)
        if collected is None:
            return None
        version, segment = collected
        grad, metrics = self.gradient(segment)
        steps = self.collector.env_steps - before
        returns = self.collector.pop_new_returns()
        return Gradient(self.worker_id, self.incarnation, version, steps, returns, metrics, grad)


class GradientCentre:
    """Sums gradient sets into the shared parameters' `.grad`, clips the global norm, steps the optimizer."""

    def __init__(self, params: list[nn.Parameter], optimizer: torch.optim.Optimizer, max_grad_norm: float):
        self.params = params
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.size = sum(p.numel() for p in params)

    def apply(self, grads: list[np.ndarray]) -> float:
        """One optimizer step on Σ grads; returns the global norm of the sum before clipping."""
        for g in grads:
            if g.shape != (self.size,):
                raise ValueError(f"a gradient of {g.shape} values for {self.size} parameters: another model?")
        total = torch.from_numpy(np.sum(grads, axis=0, dtype=np.float32)).to(self.params[0].device)
        offset = 0
        for p in self.params:
            p.grad = total[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        limit = self.max_grad_norm if self.max_grad_norm > 0 else float("inf")
        norm = float(nn.utils.clip_grad_norm_(self.params, limit))
        self.optimizer.step()
        for p in self.params:
            p.grad = None
        return norm


@dataclass
class GradParallelOptions(AlgoOptimizerOptions):
    """grad_parallel's options (`--optimizer` defaults to the algorithm's own, as Lapan's centre steps it)."""

    grad_sets: int = bounded(0, ge=0, le=MAX_ROLES)
    """Gradient sets the centre sums per optimizer step (0: one per worker, a synchronous sum; 1: each as it
    comes, RLlib's AsyncGradients)."""


class GradParallelRunner(ParallelRunner):
    """The centre of a `grad_parallel` run (see the module docstring)."""

    arch = "grad_parallel"
    learns_running_stats = False  # the workers' forward passes move their own copies' statistics
    Options: type = GradParallelOptions  # async_grad's have no --grad-sets
    role_learning = "reserved"

    def check_config(self) -> None:
        self.check_parallel(on_policy_only=True, uses_optimizer=True)
        segment = self.algo_cfg.rollout_len * self.algo_cfg.n_envs  # a rollout algorithm's (check_parallel)
        k = getattr(self.opts, "grad_sets", 0)  # given: one set of k is more than the run's budget
        if k and k * segment > self.total_steps:
            raise ConfigError(
                f"--grad-sets {k}: one optimizer step sums {k} gradients of {segment} steps each, "
                f"{k * segment} steps, more than the run's {self.total_steps}: fewer --grad-sets or more --steps"
            )

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        self.spec = self.worker_spec(device=self.role_device())
        self.grad_sets = self.gradients_per_step()
        self.credits = max(AHEAD, -(-self.grad_sets // self.opts.workers))  # enough for k gradients in flight
        self.start_backend()  # the counter: env steps behind the gradients applied
        params = trainable_params(algo_modules(self.algo))  # the learner's own (a device's; shared: CPU copies)
        recipe = self.algo_optimizer() if self.opts.optimizer == ALGO else None  # as param_server's servers get it
        self.optimizer = build_optimizer(self.opts.optimizer, params, self.algo_cfg.lr, algo_optimizer=recipe)
        self.centre = GradientCentre(params, self.optimizer, self.algo.max_grad_norm)
        self.gathered: list[Gradient] = []  # gradients waiting for the next centre step: not counted yet
        if resume_from is not None:
            self._restore(resume_from)
        self.eval_envs = self.make_eval_envs()
        self._write_config(
            {
                "optimizer": self.opts.optimizer,
                "workers": self.opts.workers,
                "grad_sets": self.grad_sets,
                "ahead": self.credits,
            }
        )

    def gradients_per_step(self) -> int:
        """k, the gradient sets the centre sums per optimizer step (`--grad-sets`, 0: one per worker)."""
        k: int = self.opts.grad_sets or self.opts.workers
        return k

    def _extra_state(self) -> dict[str, Any]:
        return {"version": self.weights.version, "optimizer": self.optimizer.state_dict()}

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        self.weights.set(int(saved.get("version", 0)))
        if saved.get("optimizer") is not None:
            self.optimizer.load_state_dict(saved["optimizer"])

    # ----------------------------------------------------------------------------------------- learning
    def take(self, items: list[Gradient]) -> None:
        """Count what the centre has taken in (applied, or nothing to learn from): env steps and finished
        episodes. A gradient still waiting for its set is not counted: a stop or a checkpoint drops it."""
        for item in items:
            self.counter.add(item.steps)
            self.count_returns(item.returns)

    def step(self, items: list[Gradient]) -> dict[str, float]:
        """One centre step on the summed gradients of `items` (schedule, clip, optimizer step, new version)."""
        version = self.weights.version
        self.lags += [version - item.version for item in items]
        with self.publishing():
            self.algo.schedule(self.env_steps, self.total_steps)  # lr annealing, target-network syncs
            set_lr(self.optimizer, self.algo.lr_at(self.env_steps, self.total_steps))
            norm = self.centre.apply([item.grad for item in items if item.grad is not None])
        keys = {k for item in items for k in item.metrics}
        metrics = {k: float(np.mean([it.metrics[k] for it in items if k in it.metrics])) for k in keys}
        metrics["grad_norm"] = norm
        return metrics

    # ----------------------------------------------------------------------------------------- loop
    waiting_for = "gradient from the workers"
    restart_how = "with the current shared weights"

    def start_workers(self, stop_flag: StopFlag, logger: RunLogger) -> RoleGroup:
        make_worker = partial(GradientWorker, self.spec, self.shared, self.weights)
        return self.start_roles(make_worker, stop_flag, self.credits)

    def coordinate(self, pool: RoleGroup) -> Taken | None:
        """The next gradient of any worker, gathered until there are k (`grad_sets`) for a centre step; what is
        taken in (applied, or nothing to learn from) is counted, and its workers may compute the next one."""
        item = pool.get_any(WAIT_S)
        if item is None:
            return None
        used: list[Gradient] = []  # taken in: counted, and their workers may compute the next one
        (self.gathered if item.grad is not None else used).append(item)
        metrics: dict[str, float] = {}
        updates = 0
        if len(self.gathered) >= self.grad_sets:
            metrics, updates = self.step(self.gathered), 1
            used += self.gathered
            self.gathered = []
        self.take(used)
        for done in used:
            pool.release(done.worker, done.incarnation)
        return Taken([r for done in used for r in done.returns], metrics, updates)

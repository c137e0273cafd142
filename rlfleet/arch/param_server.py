"""`param_server`: a sharded parameter server — the parameters split over S server roles; the coordinator pushes
the workers' gradient shards, workers pull parameter shards (the RLlib paper's appendix; with S = 1 it is
asynchronous gradients).

Who sends what to whom::

                    pull: (version, shard i, target networks from server 0)    ┌──────────────┐
    worker 0 ──┐  ◀──────────────────────────────────────────────────────────  │ server 0     │  shard 0 of θ,
    worker 1 ──┤                                                                │ ...          │  its optimizer
      ...      │                                                                │ server S−1   │  state, version
    worker N ──┘                                                                └──────────────┘
        │  clipped gradient, learning rate, [targets],       push: shard i to server i ▲ state: evaluation,
        │  version pulled, steps, returns, loss metrics      (all answered, then next) │ checkpoints, roll-backs
        └─────────────────────────────▶ coordinator (main process) ──────────────────┘

The flat vector of the algorithm's trainable parameters (in the order of `trainable_params`) is split into S
contiguous shards, as evenly as possible. Server i (a backend service) holds shard i as one flat tensor, an
optimizer over it (`--optimizer`, built with `rlfleet.optim.shared.build_optimizer`) and a version, bumped at every
push it applies. Server 0 also keeps the state of the networks without trainable parameters (target networks
and their sync clocks). A worker (a role) has its own envs and algorithm object; per segment it runs the
algorithm's `schedule` at the global step, pulls every shard (sent to all servers, then waited for; made again
until every shard answers at one version) into its local networks, collects a segment, computes the gradient
of the algorithm's loss, clips its global norm to `max_grad_norm` (it has the whole gradient) and sends it to
the coordinator with the learning rate of the step. Before that it runs `schedule` again on the pulled
networks: a target-network copy that falls due copies the weights just pulled, and goes to server 0 with the
push. The coordinator, as RLlib's driver does, pushes shard i of each gradient to server i and waits for every
server before it takes the next item: every server applies the same gradients in the same order and, between
two pushes, all are at one version, so a worker's pull (and the coordinator's snapshot) is one version of θ.

The servers' optimizer is by default `algo`, the algorithm's own (the class and hyperparameters of its
single-process update, built afresh over each shard: A2C's RMSprop, PPO's Adam, ...), as for `async_grad`,
which one server is. A server steps its shard on its own, so the optimizer must be elementwise, which Adam,
RMSprop and SGD are: their state is per element, and the step count, the same on every server, is all they
keep besides, so it splits per shard (and merges back for checkpoints). An algorithm whose optimizer is not
known to be elementwise (`rlfleet.optim.shared.ELEMENTWISE`) is refused with `--optimizer algo` before anything
starts; every other `--optimizer` kind is elementwise.

What equals what: with one worker, or on the serial backend with any number, the servers apply the gradients
in the order `async_grad`'s centre would, with the same `schedule` before each step, so any S ends with
`async_grad`'s weights bit for bit (elementwise optimizers, all that `--optimizer` takes, step a shard as they
step the whole vector), but with Adam (PPO's, PG's, n-step Q's own) to float rounding only: torch's fused CPU
kernel rounds a tensor's last elements that do not fill a vector differently, and a shard ends where a
parameter does not. With several workers on local or ray the order is the one the coordinator takes
the items in, which timing decides: the run is then `async_grad` with that order of gradients (each computed
at one version of θ, applied to every shard in that order), not one fixed trajectory.

`charts/policy_lag` is, per push, the pushes applied between the version the worker pulled and its own (0 for
a gradient from before a roll-back). The coordinator keeps the books (steps, episodes, metrics, lag) and pulls
the servers' state (shards, optimizer states, version, target networks) when it evaluates or saves a
checkpoint: its algorithm object then holds the current weights, and that state is its snapshot. A worker
computes its next gradient only once the coordinator has pushed its last one (one credit, as in `async_grad`),
so the step budget is kept.

A crashed worker is restarted like any role (its next segment pulls the current weights). A crashed server is
reported in `workers.log` and restarted from the coordinator's snapshot (shard, optimizer state and version as
of the last evaluation or checkpoint: up to `eval_every` steps old), and once no push is in flight the
coordinator rolls every other server back to that snapshot too, so all shards are again of one version (the
pushes since the snapshot are lost, on every shard alike). A push cut short by the death is sent again to the
restarted server, which, at another version than the coordinator's, applies nothing. A hung server (no answer
to the coordinator's pings for `--heartbeat-s`) is killed and then restarted the same way; the workers blocked
on it are not killed as hung (their heartbeat is held while a server does not answer). A Ctrl-C while the
coordinator waits on a hung server stops the run within seconds, its checkpoint holding the last snapshot.
The servers' pids are in `<run>/servers.json`, the workers' in `<run>/workers.json`. Only on-policy algorithms
whose update is one gradient of their loss per segment run here (see `grad_parallel`). The loop is the same on
every backend: `ParallelRunner.run`, with the servers started before the workers (`start_workers`), one worker's
item a pass (`coordinate`: the push, the books), the servers checked after the workers (`restart_crashed`), and at
the end the workers stopped before the final evaluation and checkpoint, which pull the servers, and the servers
after (`wind_down`, `shut_down`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfleet.arch.parallel import (
    WAIT_S,
    AlgoOptimizerOptions,
    ParallelRunner,
    ServiceWaitStopped,
    Taken,
    WorkerActor,
    WorkerSpec,
)
from rlfleet.arch.shared import algo_modules, frozen_state, trainable_params
from rlfleet.backends import BACKENDS, Pending, RoleGroup, ServiceGroup, ServiceHandle
from rlfleet.backends.shared_memory import StopFlag
from rlfleet.device import worker_device
from rlfleet.fields import MAX_ROLES, bounded
from rlfleet.optim.shared import ALGO, OptimizerRecipe, build_optimizer
from rlfleet.optim.step import set_lr
from rlfleet.run.config import ConfigError, RunConfig
from rlfleet.run.logger import RunLogger
from rlfleet.run.runner import FAILURES, build_algorithm

AHEAD = 1  # items a worker may have made beyond those the coordinator has taken in
PULL_RETRY_S = 0.001  # a worker's pause before it pulls again, its shards having come at two versions

OptimizerState = dict[str, Any]
"""An optimizer's `state_dict()`."""


def shard_bounds(size: int, shards: int) -> list[tuple[int, int]]:
    """[start, end) of each of `shards` contiguous shards of `size` values, as even as possible (the first ones
    one larger)."""
    base, extra = divmod(size, shards)
    bounds, start = [], 0
    for i in range(shards):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def merge_optimizer_states(states: list[OptimizerState | None]) -> OptimizerState | None:
    """The state of an elementwise optimizer over the whole flat vector from those over its shards (each one
    parameter, the flat shard): per-element tensors are concatenated, the rest (step counts) taken from shard 0."""
    present = [s for s in states if s is not None]
    if not states or len(present) < len(states):
        return None
    first = present[0]
    if 0 not in first["state"]:
        return copy.deepcopy(first)
    merged = {}
    for key, value in first["state"][0].items():
        if torch.is_tensor(value) and value.dim() == 1:
            merged[key] = torch.cat([s["state"][0][key] for s in present])
        else:
            merged[key] = copy.deepcopy(value)
    return {"state": {0: merged}, "param_groups": copy.deepcopy(first["param_groups"])}


def split_optimizer_state(state: OptimizerState | None, bounds: list[tuple[int, int]]) -> list[OptimizerState | None]:
    """The inverse of `merge_optimizer_states`: one state per shard."""
    if state is None or 0 not in state["state"]:
        return [copy.deepcopy(state) for _ in bounds]
    size = bounds[-1][1]
    shards: list[OptimizerState | None] = []
    for start, end in bounds:
        part = {}
        for key, value in state["state"][0].items():
            if torch.is_tensor(value) and value.dim() == 1 and value.numel() == size:
                part[key] = value[start:end].clone()
            else:
                part[key] = copy.deepcopy(value)
        shards.append({"state": {0: part}, "param_groups": copy.deepcopy(state["param_groups"])})
    return shards


@dataclass
class ShardState:
    """What a server holds, as the coordinator pulls it (and a restarted server starts from)."""

    version: int
    params: torch.Tensor
    """float32, the shard of the flat parameter vector."""
    optimizer: OptimizerState | None
    """The state_dict of the shard's optimizer (None: a fresh one)."""
    frozen: list[torch.Tensor] | None
    """Server 0: the target networks and their clocks (`frozen_state`); None on the others."""


def on_cpu(value: Any) -> Any:
    """`value` (an optimizer's state_dict: dicts and lists of tensors and numbers) with every tensor on the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(on_cpu(v) for v in value)
    return value


class ParamShard:
    """A server: one shard of the flat parameters, an optimizer over it, its version (a backend service).
    `algo_optimizer`: the recipe `--optimizer algo` builds (None for the other kinds). On `device` (`--device`) the
    shard and its optimizer state live there; what crosses processes (pulls, states) is on the CPU."""

    def __init__(
        self,
        state: ShardState,
        optimizer: str,
        lr: float,
        algo_optimizer: OptimizerRecipe | None = None,
        device: str = "cpu",
    ):
        self.optimizer_name, self.lr, self.algo_optimizer, self.device = optimizer, lr, algo_optimizer, device
        self.param = nn.Parameter(state.params.detach().to(worker_device(device), copy=True))
        self.optimizer = build_optimizer(optimizer, [self.param], lr, algo_optimizer=algo_optimizer)
        if state.optimizer is not None:
            self.optimizer.load_state_dict(state.optimizer)
        self.version = state.version
        self.frozen = copy.deepcopy(state.frozen)

    def pull(self) -> tuple[int, torch.Tensor, list[torch.Tensor] | None]:
        """(version, the shard, the target networks on server 0)."""
        return self.version, self.param.detach().to("cpu", copy=True), self.frozen

    def push(
        self, grad: torch.Tensor, lr: float, frozen: list[torch.Tensor] | None = None, expected: int | None = None
    ) -> int | None:
        """One optimizer step with a gradient shard at `lr` (and the target networks the worker synced, if it did);
        returns the version the step was applied to. With `expected` (the coordinator's version, which every
        server should be at) a server at another version (restarted from an older snapshot) applies nothing and
        returns None: the coordinator then rolls every server back to one snapshot."""
        if grad.shape != self.param.shape:
            raise ValueError(f"a gradient shard of {tuple(grad.shape)} values for {self.param.numel()}: another model?")
        if expected is not None and expected != self.version:
            return None
        version = self.version
        set_lr(self.optimizer, lr)
        self.param.grad = grad.to(self.param.device)
        self.optimizer.step()
        self.param.grad = None
        self.version += 1
        if frozen is not None:
            self.frozen = frozen
        return version

    def load(self, state: ShardState) -> int:
        """Everything from `state` (the coordinator's last snapshot: a roll-back), as a server started from it;
        returns the version loaded."""
        ParamShard.__init__(self, state, self.optimizer_name, self.lr, self.algo_optimizer, self.device)
        return self.version

    def state(self) -> ShardState:
        """Everything the server holds (a copy), for the coordinator's evaluations, checkpoints and restarts."""
        optimizer = copy.deepcopy(on_cpu(self.optimizer.state_dict()))
        params = self.param.detach().to("cpu", copy=True)
        return ShardState(self.version, params, optimizer, copy.deepcopy(self.frozen))


class ShardServers:
    """`make_service` of the servers: server i from `states[i]`, the state the coordinator last pulled (updated in
    place by the coordinator, so a restarted server starts from the latest pull). Picklable."""

    def __init__(
        self,
        states: list[ShardState],
        optimizer: str,
        lr: float,
        algo_optimizer: OptimizerRecipe | None = None,
        device: str = "cpu",
    ):
        self.states = states
        self.optimizer = optimizer
        self.lr = lr
        self.algo_optimizer = algo_optimizer
        self.device = device

    def __call__(self, index: int, incarnation: int) -> ParamShard:
        return ParamShard(self.states[index], self.optimizer, self.lr, self.algo_optimizer, self.device)


@dataclass
class Progress:
    """What a worker sends the coordinator about a segment: its books and the gradient the coordinator pushes."""

    worker: int
    incarnation: int
    steps: int
    returns: list[float]
    metrics: dict[str, float]
    version: int
    """The servers' version the worker pulled (every shard at it) and computed the gradient at."""
    grad: np.ndarray | None
    """float32, the clipped flat gradient; None: nothing to learn from (only steps)."""
    lr: float
    """The learning rate of the step (the worker's `schedule` at the global step)."""
    frozen: list[torch.Tensor] | None
    """The target networks, if the worker's `schedule` copied them (they go to server 0 with the push)."""


def wait_all(pendings: list[Pending]) -> list[Any]:
    """The results of calls sent to several servers at once."""
    return [p.result() for p in pendings]


class ShardWorker(WorkerActor):
    """One worker: its own envs and algorithm object; pulls the shards, pushes clipped gradient shards."""

    def __init__(
        self,
        spec: WorkerSpec,
        servers: list[ServiceHandle],
        bounds: list[tuple[int, int]],
        worker_id: int,
        incarnation: int = 0,
    ):
        super().__init__(spec, None, worker_id, incarnation)
        self.servers = servers
        self.bounds = bounds
        modules = algo_modules(self.algo)
        self.params = trainable_params(modules)
        self.frozen = frozen_state(modules)

    @torch.no_grad()
    def pull(self, stop: StopFlag | None = None) -> int | None:
        """Every shard into the local networks (and server 0's target networks), all at one version: the
        coordinator pushes to every server before the next push, so a pull that straddles a push (or a
        roll-back) sees two versions and is made again. The version pulled; None if `stop` was set meanwhile."""
        while True:
            replies = wait_all([server.submit("pull") for server in self.servers])
            versions: set[int] = {version for version, _, _ in replies}
            if len(versions) == 1:
                break
            if stop is not None and stop.is_set():
                return None
            time.sleep(PULL_RETRY_S)
        flat = torch.cat([shard for _, shard, _ in replies])
        offset = 0
        for p in self.params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        for local, pulled in zip(self.frozen, replies[0][2], strict=True):
            local.copy_(pulled)
        return versions.pop()

    def clipped_gradient(self, loss: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The flat gradient of `loss` with its global norm clipped to `max_grad_norm`, and the norm before."""
        for p in self.params:
            p.grad = None
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        limit = self.algo.max_grad_norm if self.algo.max_grad_norm > 0 else float("inf")
        norm = float(nn.utils.clip_grad_norm_(self.params, limit))
        return torch.cat([p.grad.flatten() for p in self.params if p.grad is not None]), norm  # each has one by now

    def produce(self, global_steps: int, stop: StopFlag | None = None) -> Progress | None:
        total = self.spec.total_steps
        before = self.collector.env_steps
        self.algo.schedule(global_steps, total)  # ε and the like follow the whole run
        version = self.pull(stop)  # after schedule: the servers' target networks win
        if version is None:
            return None
        assert self.storage is not None  # param_server runs on-policy algorithms, which collect rollouts
        segment = self.collector.collect_rollout(self.storage)
        batch = self.algo.process(segment)
        metrics: dict[str, float] = {}
        grad, frozen = None, None
        if len(batch) > 0:
            loss, metrics = self.algo.loss(batch)
            flat, norm = self.clipped_gradient(loss)
            grad = flat.numpy()
            targets = [t.clone() for t in self.frozen]
            self.algo.schedule(global_steps, total)  # a target copy due now copies the weights just pulled
            changed = any(not torch.equal(a, b) for a, b in zip(targets, self.frozen, strict=True))
            frozen = [t.clone() for t in self.frozen] if changed else None
            metrics = {**metrics, "grad_norm": norm}
        steps = self.collector.env_steps - before
        returns = self.collector.pop_new_returns()
        lr = self.algo.lr_at(global_steps, total)
        return Progress(self.worker_id, self.incarnation, steps, returns, metrics, version, grad, lr, frozen)


@dataclass
class ParamServerOptions(AlgoOptimizerOptions):
    """param_server's options (`--optimizer` defaults to the algorithm's own, as for `async_grad`)."""

    shards: int = bounded(2, ge=1, le=MAX_ROLES)
    """Server roles the parameters are split over (contiguous shards of the flat parameter vector, as even as
    possible; at most the number of trainable parameters). 1: one server, asynchronous gradients."""


class ParamServerRunner(ParallelRunner):
    """The coordinator of a `param_server` run (see the module docstring)."""

    arch = "param_server"
    learns_running_stats = False  # the workers' forward passes move their own copies' statistics
    Options = ParamServerOptions

    def shares_frozen(self) -> bool:
        return False  # each worker builds its network from its own seed; the servers hold the trainable parameters

    def build_algo(self, seed: int) -> Any:
        """The coordinator's algorithm object, on the CPU whatever `--device` says: it learns nothing (its networks
        are the servers' last snapshot, shared with the CPU workers); the device is the servers'."""
        return build_algorithm(self.cfg, self.algo_cfg, self.env_info, seed, "cpu")

    def check_config(self) -> None:
        self.check_parallel(on_policy_only=True, uses_optimizer=True)
        if not BACKENDS[self.opts.backend].has_services:
            with_services = ", ".join(name for name, cls in BACKENDS.items() if cls.has_services)
            raise ConfigError(
                f"param_server's servers are backend services, which the {self.opts.backend} backend does not "
                f"start; use --backend {with_services}"
            )
        if self.opts.optimizer == ALGO and not (recipe := self.algo_optimizer()).elementwise:
            raise ConfigError(
                f"param_server's servers step each shard on its own, which takes an elementwise optimizer; "
                f"{self.cfg.algo}'s {recipe.name} is not known to be one: choose another --optimizer "
                "(shared_rmsprop, rmsprop, momentum_sgd, shared_adam)"
            )
        if self.device.type == "cuda" and self.opts.backend == "ray":
            raise ConfigError(
                f"--device {self.cfg.device} with --backend ray: the parameter servers are Ray actors that reserve no "
                "GPU; put them on a GPU with --backend local, or leave --device out"
            )
        size = sum(p.numel() for p in trainable_params(algo_modules(self.algo)))
        if self.opts.shards > size:
            raise ConfigError(
                f"--shards {self.opts.shards} is more than the {size} trainable parameters of {self.cfg.algo}'s "
                f"networks; use 1 to {size}"
            )

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        self.spec = self.worker_spec()
        self.start_backend()  # the counter: env steps of the items taken in
        self.params = trainable_params(self.shared)
        self.frozen = frozen_state(self.shared)
        self.bounds = shard_bounds(sum(p.numel() for p in self.params), self.opts.shards)
        self.version = 0
        self.saved_optimizer: OptimizerState | None = None
        if resume_from is not None:
            self._restore(resume_from)
        flat = torch.cat([p.detach().flatten() for p in self.params])
        optimizers = split_optimizer_state(self.saved_optimizer, self.bounds)
        states = [
            ShardState(
                self.version, flat[a:b].clone(), optimizers[i], [t.clone() for t in self.frozen] if i == 0 else None
            )
            for i, (a, b) in enumerate(self.bounds)
        ]
        recipe = self.algo_optimizer() if self.opts.optimizer == ALGO else None
        self.servers = ShardServers(states, self.opts.optimizer, self.algo_cfg.lr, recipe, str(self.device))
        self.services: ServiceGroup | None = None
        self.pulled_at = self.env_steps  # the step of the state a restarted server starts from
        self.pushing = False  # a push (or roll-back) is in flight: a crash's roll-back waits for its answers
        self.rollback_due = False
        self.evaluating = False
        self.unanswered = False  # a server did not answer after a stop request: the snapshot is not pulled again
        self.logger: RunLogger | None = None
        self.eval_envs = self.make_eval_envs()
        self._write_config(
            {"optimizer": self.opts.optimizer, "workers": self.opts.workers, "shards": self.bounds, "ahead": AHEAD}
        )

    def _extra_state(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "optimizer": merge_optimizer_states([s.optimizer for s in self.servers.states]),
        }

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        self.version = int(saved.get("version", 0))
        self.saved_optimizer = saved.get("optimizer")

    # ----------------------------------------------------------------------------------------- servers
    def wait(self, pending: Pending) -> Any:
        """A server's answer; servers that die meanwhile are reported (the backend restarts them, and re-sends
        the call cut short) and, once no push is in flight, every server is rolled back. Hung servers (no answer
        for --heartbeat-s) are killed and restarted the same way; a stop request ends the wait (`wait_service`)."""
        return self.wait_service(pending, self.restart_crashed_servers)

    @torch.no_grad()
    def pull_servers(self) -> None:
        """The servers' state into the coordinator's networks (for evaluation and checkpoints), and kept as the
        snapshot a restarted server starts from and every server is rolled back to. Only the coordinator
        pushes, and not meanwhile: every shard is at the same version, so the snapshot is one version."""
        if self.services is None or self.unanswered:
            return
        try:
            states = [self.wait(p) for p in [h.submit("state") for h in self.services.handles]]
        except ServiceWaitStopped:  # Ctrl-C while a server does not answer: the run ends with the last snapshot
            self.unanswered = True
            self.back_to(self.servers.states[0].version)  # the snapshot's, which the checkpoint holds
            self._report(f"a server did not answer after the stop request: the run ends with the snapshot of step "
                         f"{self.pulled_at} (version {self.version})")  # fmt: skip
            return
        except FAILURES:  # a failure of the run: its checkpoint holds the last snapshot
            self.unanswered = True
            self.back_to(self.servers.states[0].version)
            raise
        if len({s.version for s in states}) != 1:  # a server restarted meanwhile, not rolled back yet
            self.roll_back()
            return
        flat = torch.cat([s.params for s in states])
        offset = 0
        for p in self.params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        for local, pulled in zip(self.frozen, states[0].frozen, strict=True):
            local.copy_(pulled)
        self.servers.states[:] = states
        self.version = states[0].version
        self.pulled_at = self.env_steps

    def push(self, item: Progress) -> int:
        """Push `item`'s gradient, shard i to server i, and wait for every server (so that every server applies
        the pushes in the same order, the coordinator's, and is at the same version between them); the policy
        lag of the gradient (pushes applied since the version it was computed at)."""
        assert item.grad is not None  # `coordinate` pushes only items with a gradient
        assert self.services is not None  # started with the workers
        grad = torch.from_numpy(item.grad)
        expected = self.version
        self.pushing = True
        try:
            applied = [
                self.wait(p)
                for p in [
                    server.submit("push", grad[a:b].clone(), item.lr, item.frozen if i == 0 else None, expected)
                    for i, (server, (a, b)) in enumerate(zip(self.services.handles, self.bounds, strict=True))
                ]
            ]
        finally:
            self.pushing = False
        if any(version is None for version in applied):  # a restarted server, at its snapshot's version: rolled
            self.rollback_due = True  # back by the loop's next `restart_crashed`
        else:
            self.version += 1
        return max(0, expected - item.version)  # a gradient from before a roll-back: 0

    def roll_back(self) -> None:
        """Every server to the coordinator's last snapshot (where a restarted server starts from): all shards of
        one version again, at the price of the pushes since the snapshot."""
        assert self.services is not None  # started with the workers
        while True:
            self.rollback_due = False
            self.pushing = True  # crashes meanwhile: rolled back again below, not from within `wait`
            try:
                loaded = [self.wait(p) for p in [h.submit("load", s) for h, s in zip(
                    self.services.handles, self.servers.states, strict=True)]]  # fmt: skip
            finally:
                self.pushing = False
            if not self.rollback_due:
                break
        lost = self.back_to(loaded[0])
        self._report(f"every server rolled back to the snapshot of step {self.pulled_at} (version {self.version}): "
                     f"its {lost} updates since are undone")  # fmt: skip

    def back_to(self, version: int) -> int:
        """The servers' weights are the snapshot's, of `version`: the updates pushed since are undone, and no longer
        counted (`updates` in result.json is the optimizer steps the weights carry). How many they were."""
        lost = max(0, self.version - version)
        self.version = version
        self.state["updates"] -= lost
        return lost

    def restart_crashed_servers(self) -> None:
        """Report the servers that crashed since the last check (the backend has restarted them from the last
        snapshot), and roll the others back to it too (once no push is in flight)."""
        assert self.services is not None  # started with the workers
        for crash in self.services.check():
            state = self.servers.states[crash.worker]
            self._report(
                f"{crash.describe()}\nrestarting it from the snapshot of step {self.pulled_at} "
                f"(version {state.version}), and the other servers with it"
            )
            self.rollback_due = True
            if self.logger is not None:
                self.logger.log(self.env_steps, {"charts/server_restarts": self.services.restarts})
        if self.rollback_due and not self.pushing:
            self.roll_back()

    def _evaluate(self, logger: RunLogger, start: float) -> float:
        self.pull_servers()
        self.evaluating = True  # the "best" checkpoint holds the weights just evaluated
        try:
            return super()._evaluate(logger, start)
        finally:
            self.evaluating = False

    def save(self, name: str = "latest") -> Path:
        if not self.evaluating:
            self.pull_servers()
        return super().save(name)

    # ----------------------------------------------------------------------------------------- loop
    restart_how = "with the servers' current weights"

    def start_workers(self, stop_flag: StopFlag, logger: RunLogger) -> RoleGroup:
        """The servers first (their restarts are logged to `logger`), then the workers, which call them."""
        self.logger = logger
        self.services = self.start_services(self.servers, self.opts.shards, self.run_dir / "servers.json", "server")
        make_worker = partial(ShardWorker, self.spec, self.services.handles, self.bounds)
        return self.start_roles(make_worker, stop_flag, AHEAD, services=self.services)

    def coordinate(self, pool: RoleGroup) -> Taken | None:
        """The next item of any worker: its gradient pushed to the servers, its books kept; then it may make the
        next."""
        item = pool.get_any(WAIT_S)
        if item is None:
            return None
        metrics: dict[str, float] = {}
        updates = 0
        if item.grad is not None:
            before = self.version
            self.lags.append(self.push(item))
            metrics, updates = item.metrics, self.version - before  # 0 where a restarted server took none
        self.counter.add(item.steps)
        self.count_returns(item.returns)
        pool.release(item.worker, item.incarnation)
        return Taken(item.returns, metrics, updates)

    def restart_crashed(self, pool: RoleGroup, logger: RunLogger, how: str) -> None:
        """The crashed workers, then the crashed servers."""
        super().restart_crashed(pool, logger, how)
        self.restart_crashed_servers()

    def wind_down(self, stop_flag: StopFlag, pool: RoleGroup) -> None:
        """The workers only: the final evaluation and checkpoint pull the servers."""
        stop_flag.set()
        pool.stop()

    def shut_down(self, stop_flag: StopFlag, pool: RoleGroup | None) -> None:
        self.stop_roles(stop_flag, pool, self.services)

"""What every multi-process runner shares: the `WorkerSpec` its workers are built from, the `WorkerActor`
each worker builds from it (a `Producer` where workers feed the coordinator's queues), the global step and
episode counters and their checkpointing, the option checks, how worker trouble is reported, and the
coordinator loop itself (`ParallelRunner.run`), which each architecture fills in with what it starts
(`start_workers`) and what one pass takes in (`coordinate`).

The loop, the same for every architecture and backend: start the roles; then, until a stop condition or the
step budget, take in what the workers sent (`coordinate`: learn, count, give back credits), report a stall
after `STALL_S` seconds without anything, restart crashed workers (`restart_crashed`), and log, evaluate and
checkpoint (`monitor_step`); then stop the workers (`wind_down`), evaluate and save a last time (`finish`),
and whatever happens, stop everything the run started (`shut_down`) and write `result.json`.

A runner keeps its counters in the coordinator process (`counter` is a shared, lock-free `StepCounter` so
that workers can read the global step count for their schedules and stop at the budget). Its checkpoint adds one
entry under the architecture's name with the episode count, the recent returns and whatever
`_extra_state()` returns; `_restore_extra(saved)` reads that back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar, overload

import gymnasium as gym
import numpy as np
import torch

from rlfleet.algos import resolve
from rlfleet.arch.shared import LocalCopy, algo_modules, untracked_state
from rlfleet.backends import BACKENDS, Pending, RoleGroup, RunFailure, ServiceGroup, StoppedWhileStarting, make_backend
from rlfleet.backends.shared_memory import StopFlag, WeightVersion
from rlfleet.data.rollout import RolloutStorage
from rlfleet.device import host_modules, sync_host, worker_device
from rlfleet.envs import make_vector_env
from rlfleet.fields import MAX_ROLES, bounded, checked, one_of
from rlfleet.nets.user import untravelled
from rlfleet.optim.shared import ALGO, OptimizerRecipe, is_shared
from rlfleet.run.checkpoint import load_algo_state
from rlfleet.run.collector import Collector
from rlfleet.run.config import ConfigError, usable_cores
from rlfleet.run.logger import RunLogger
from rlfleet.run.runner import FAILURES, WORKERS, RunBase, RunResult, StopRequest, as_failure, run_log

WAIT_S = 0.2  # the coordinator's longest wait for an item before it checks workers, Ctrl-C and the clock
STALL_S = 60.0  # no item for this long is reported in workers.log (a heartbeat of the workers)
STOP_WAIT_S = 5.0  # once a stop is requested, the coordinator's longest further wait on a service that does not answer


class ServiceWaitStopped(Exception):
    """A stop was requested (Ctrl-C) while the coordinator waited on a service that did not answer: the run stops as
    on any stop request (`stopped_by` "interrupted"), without that answer."""


@dataclass
class WorkerSpec:
    """What a worker process needs to build its own algorithm and envs (picklable)."""

    algo: str
    algo_cfg: Any
    env: str
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    seed: int
    total_steps: int
    resumes: int = field(default=0, kw_only=True)
    """How many times the run was resumed: a resumed run's workers draw new seeds, not the first run's again."""
    env_kwargs: dict[str, Any] = field(default_factory=dict, kw_only=True)
    """The env's keyword arguments (the run's `env_kwargs`): every worker builds the same env variant."""
    device: str = field(default="cpu", kw_only=True)
    """Where a worker's own algorithm object lives (`ParallelRunner.role_device`): the CPU for workers that act and
    send (samplers, actors); the run's device for workers that learn (allreduce's and gossip's learners), and for
    gradient workers whose Ray role reserved a GPU."""

    def worker_seed(self, worker_id: int, incarnation: int) -> int:
        return self.seed + 1_000 * (worker_id + 1) + 100_003 * incarnation + 10_000_019 * self.resumes


Spec = TypeVar("Spec", bound=WorkerSpec)


@dataclass
class WorkerCount:
    """How many roles an architecture starts, as most architectures name it (`gossip` calls its roles learners)."""

    workers: int = bounded(2, ge=1, le=MAX_ROLES)
    """Worker processes."""


@dataclass
class RoleOptions:
    """The options of the backend that runs an architecture's roles (every multi-process architecture has them)."""

    max_restarts: int = bounded(10, ge=0)
    """Restarts the run allows in all, of its workers and its services (replay shards, parameter servers, gossip
    mailboxes) together: a worker or service that keeps crashing ends the run after that."""
    heartbeat_s: float = bounded(120.0, gt=0)
    """Seconds a worker may go without a sign of life (it beats between items and while it waits for the
    coordinator), or a service (replay shard, parameter server) without answering a ping (queued behind its calls),
    before it is taken for hung, killed and restarted. A worker's clock is held while a service does not answer."""
    backend: str = checked("local", one_of(tuple(BACKENDS)))
    """Where the workers run: local (one process each, on this machine), ray (one Ray actor each, on this machine
    or a Ray cluster) or serial (one after another in this process, deterministic: tests, debugging)."""
    address: str = ""
    """ray: the Ray cluster to join (HOST:PORT, or auto); empty: a private Ray instance on 127.0.0.1, started and
    stopped with the run."""
    cpus_per_role: float = bounded(1.0, ge=1e-4, le=MAX_ROLES)
    """ray: CPUs each worker's actor reserves (and its torch threads); services (parameter servers) reserve none."""
    gpus_per_role: float = bounded(0.0, ge=0, le=MAX_ROLES)
    """ray: GPUs each worker's actor reserves (fractions share one GPU), for roles that learn there with --device
    cuda: allreduce's and gossip's learners, grad_parallel's and async_grad's gradient workers."""
    placement: str = ""
    """ray: custom resources that place the workers (and services), comma-separated: worker i goes to a node
    offering names[i mod n] (nodes started with --resources '{"name": 8}')."""
    oversubscribe: bool = False
    """Start the roles even where they ask for more than 8 times the CPUs this machine has (`OVERSUBSCRIBE_LIMIT`; each
    role is a process of its own; refused without this flag, since a machine that far oversubscribed thrashes or
    runs out of memory). Not checked on a Ray cluster (--address, or a connection the process made with ray.init
    before the run), whose own scheduler places the roles."""


RAY_OPTIONS = ("address", "cpus_per_role", "gpus_per_role", "placement")
"""The `RoleOptions` only the ray backend takes."""
PROCESS_OPTIONS = ("max_restarts", "heartbeat_s", "oversubscribe")
"""The `RoleOptions` that only roles in processes of their own have use for (not the serial backend's)."""
OVERSUBSCRIBE_LIMIT = 8
"""Roles may ask for up to this many times the machine's cores (`usable_cores`) before `--oversubscribe` is needed."""


@dataclass
class ParallelOptions(RoleOptions, WorkerCount):
    """The options every multi-process architecture has: its worker count first, then the backend's options."""


@dataclass
class SharedOptimizerOptions(ParallelOptions):
    """The options of an architecture that steps the shared parameters with an optimizer of the run's choosing
    (`--optimizer`); this class's default is hogwild's, the A3C paper's Shared RMSProp."""

    optimizer: str = "shared_rmsprop"
    """Optimizer of the shared parameters: algo (the algorithm's own, the class and hyperparameters its
    single-process update steps with, e.g. A2C's RMSprop, PPO's Adam: RLlib's and Lapan's choice, the default of
    grad_parallel, async_grad and param_server), shared_rmsprop (statistics shared by all workers: the A3C
    paper's choice, hogwild's default), rmsprop (the paper's RMSProp, ε inside the root, per-worker statistics),
    momentum_sgd (the paper's momentum SGD, m ← αm + (1−α)Δθ, per-worker m), shared_adam. Where one centre
    or server steps (grad_parallel, async_grad, param_server) there is one set of statistics whatever the kind;
    in hogwild, algo and rmsprop keep theirs per worker."""


@dataclass
class AlgoOptimizerOptions(SharedOptimizerOptions):
    """`SharedOptimizerOptions` whose default is the algorithm's own optimizer (`--optimizer algo`): the
    architectures whose one centre (or server) applies the workers' gradients, as RLlib's AsyncGradientsOptimizer
    (the policy's own optimizer) and Lapan's gradient-parallel centre (the agent's Adam) do."""

    optimizer: str = ALGO  # its docstring is SharedOptimizerOptions' (the CLI reads one, and both defaults)


class WorkerActor:
    """What every worker builds from its `WorkerSpec`: its own algorithm object (seeded per worker and
    incarnation) tied to the shared networks by a `LocalCopy`, its own synchronous vector envs, a `Collector`
    over them and, for rollout algorithms, the `RolloutStorage` its segments are collected into.

    `share_frozen` is `LocalCopy`'s: True where workers update the shared networks themselves (hogwild),
    False where only the learner or centre does (data_parallel, grad_parallel). With `shared=None` (the
    param_server, whose workers pull the weights from its servers) there is no `LocalCopy` (`copy` is None).
    """

    def __init__(
        self,
        spec: WorkerSpec,
        shared: dict[str, torch.nn.Module] | None,
        worker_id: int,
        incarnation: int = 0,
        share_frozen: bool = True,
    ):
        seed = spec.worker_seed(worker_id, incarnation)
        torch.manual_seed(seed)  # what the worker samples with torch (a new seed for a restarted worker)
        algo_cls, _, _, _ = resolve(spec.algo)
        cfg = spec.algo_cfg
        self.spec = spec
        self.worker_id = worker_id
        self.incarnation = incarnation
        self.algo = algo_cls(
            cfg, spec.observation_space, spec.action_space, seed=seed, device=worker_device(spec.device)
        )
        self.copy = LocalCopy(self.algo, shared, share_frozen=share_frozen) if shared is not None else None
        self.envs = make_vector_env(spec.env, cfg.n_envs, seed=seed, mode="sync", training=True, **spec.env_kwargs)
        self.collector = Collector(self.envs, self.algo, seed=seed)
        self.storage = RolloutStorage(cfg.rollout_len, cfg.n_envs) if self.algo.data == "rollout" else None

    def close(self) -> None:
        self.envs.close()


class Producer(WorkerActor, ABC):
    """A worker that acts with the weights the coordinator publishes (`weights`, read into its local copy)
    and makes items for the coordinator (`produce`, run by the backend): data_parallel's samplers and
    grad_parallel's gradient workers. Only the coordinator changes the shared networks."""

    copy: LocalCopy  # workers that read the coordinator's weights always have one

    def __init__(
        self,
        spec: WorkerSpec,
        shared: dict[str, torch.nn.Module],
        weights: WeightVersion,
        worker_id: int,
        incarnation: int = 0,
    ):
        super().__init__(spec, shared, worker_id, incarnation, share_frozen=False)
        self.weights = weights

    @abstractmethod
    def produce(self, global_steps: int, stop: StopFlag | None = None) -> Any | None:
        """The next item made with the current weights, the schedules at `global_steps`; None if `stop` was
        set meanwhile."""


class Taken(NamedTuple):
    """What one pass of the coordinator loop took in (`ParallelRunner.coordinate`)."""

    returns: list[float]
    """Returns of the episodes that finished in it."""
    metrics: dict[str, float]
    """The learning metrics to log (empty: nothing learned)."""
    updates: int
    """Updates made."""


class ParallelRunner(RunBase):
    """Base of the `hogwild`, `data_parallel`, `grad_parallel`, `async_grad`, `param_server`, `allreduce` and
    `apex` runners (not used on its own): their coordinator loop, `run`, which each fills in with `start_workers` and
    `coordinate` (and `wind_down`, `shut_down` where it starts more than its workers)."""

    arch = "parallel"
    """Name of the architecture; also the checkpoint entry of its counters."""
    runs_normalisation = False
    waiting_for: str | None = "item from the workers"
    """What the coordinator waits for, as its stall report names it ("no ... for 60 s"); None: no stall report."""
    restart_how: str = ""
    """How a restarted worker begins, as its crash report says it ("restarting it ...")."""
    spec: WorkerSpec
    """What the workers are built from (`worker_spec`, made by each architecture)."""
    role_learning: Literal["none", "reserved", "always"] = "none"
    """Where the roles compute when the learner is on a GPU (`role_device`): `none`, on the CPU (samplers and actors
    act there; hogwild's workers learn in CPU shared memory); `reserved`, on the GPU a Ray role reserved with
    `--gpus-per-role` and on the CPU otherwise (gradient workers); `always`, on the run's device (allreduce's and
    gossip's learners: on Ray, each on the GPU it reserved)."""
    learns_running_stats = True
    """The network the run evaluates and checkpoints runs forward in training mode, which moves its running statistics
    (BatchNorm's); False where the workers learn on copies of it and send back only gradients or parameters."""

    def shares_frozen(self) -> bool:
        """Whether every role acts and learns with the coordinator's frozen parameters (`LocalCopy.pull` copies them;
        roles that build their own network from their own seed have their own)."""
        return True

    def role_device(self) -> str:
        """The device each role builds its own algorithm object on (`WorkerSpec.device`)."""
        reserved = self.opts.backend == "ray" and self.opts.gpus_per_role > 0
        if self.role_learning == "always" or (self.role_learning == "reserved" and reserved):
            return str(self.device)
        return "cpu"

    def workers_learn_on_device(self) -> bool:
        return self.role_learning == "reserved" and self.role_device() != "cpu"

    def check_role_gpus(self) -> None:
        """On Ray: GPUs reserved for roles that would not use them, more GPUs than a private instance has, and
        learners on CUDA whose roles reserved none to see are each one line, before Ray starts. A resumed run may keep
        GPUs its roles leave idle only where they never used them (samplers, actors: runs from before this check)."""
        opts, arch = self.opts, self.arch
        if opts.backend != "ray":
            return  # --gpus-per-role elsewhere: refused as a ray option
        gpus = f"--gpus-per-role {opts.gpus_per_role:g}"
        if opts.gpus_per_role > 0 and self.role_device() == "cpu":
            if self.role_learning == "none":
                if self.resuming:
                    return
                raise ConfigError(
                    f"{gpus} has no effect on --arch {arch}: its roles work on the CPU; the architectures whose roles "
                    "learn on the GPU they reserve are allreduce, gossip, grad_parallel and async_grad"
                )
            drop = "add --gpus-per-role 0 to the resume" if self.resuming else "leave --gpus-per-role out"
            raise ConfigError(
                f"{gpus} has no effect with the learner on the CPU (--device {self.cfg.device}): the roles would "
                f"compute there too; add --device cuda, or {drop}"
            )
        wanted = opts.workers * opts.gpus_per_role
        if not BACKENDS[opts.backend].on_cluster(opts) and wanted > (have := torch.cuda.device_count()):
            raise ConfigError(
                f"{gpus} asks for {wanted:g} GPUs for {opts.workers} roles, and this machine has {have}: give each "
                f"role a share (--gpus-per-role {have / opts.workers:.4g} spreads them over {have}), or use fewer roles"
                if have
                else f"{gpus}: this machine has no GPU for the roles to reserve"
            )
        if self.role_learning == "always" and self.device.type == "cuda" and opts.gpus_per_role == 0:
            raise ConfigError(
                f"--device {self.cfg.device} with --backend ray: each {arch} learner is a Ray actor that sees only the "
                "GPUs it reserves; reserve one with --gpus-per-role 1 (or a share of one, such as 0.5), or learn on "
                "the CPU with --device cpu"
            )

    def check_untracked_state(self) -> None:
        """Refuse a network of the user's that cannot be sent to the roles' processes, or (the built-in ones have
        neither) whose running statistics the architecture would never learn, or whose frozen parameters its roles
        would not share: the run would act, evaluate and checkpoint with a network other than the one its workers
        learn."""
        if not BACKENDS[self.opts.backend].in_process:  # the roles get the networks pickled, as processes
            problem = next(filter(None, map(untravelled, algo_modules(self.algo).values())), None)
            if problem is not None:
                raise ConfigError(f"{problem}: --arch {self.arch} runs its roles as processes")
        running, frozen = untracked_state(algo_modules(self.algo))
        keeping = "single, data_parallel, apex or allreduce"  # the architectures that run the learner's network
        if running and not self.learns_running_stats:
            raise ConfigError(
                f"--arch {self.arch} would never learn the network's running statistics ({running[0]}): its workers "
                f"run forward on copies of it and send back only gradients or parameters; use --arch {keeping}, or "
                "track_running_stats=False"
            )
        if frozen and not self.shares_frozen():
            raise ConfigError(
                f"--arch {self.arch} builds a network in each role from its own seed, so the network's frozen "
                f"parameters ({frozen[0]}) would differ between them; use another architecture"
            )

    def check_parallel(self, on_policy_only: bool, uses_optimizer: bool) -> None:
        """Refuse what the architecture cannot run. `on_policy_only`: it applies one gradient of the algorithm's
        loss per segment (hogwild, grad_parallel), which only on-policy algorithms whose own update is that one
        step (`one_gradient`) can learn from as designed."""
        cfg = self.cfg
        if on_policy_only and self.algo.data != "rollout":
            raise ConfigError(
                f"{cfg.algo} learns from replay; the {self.arch} architecture runs on-policy algorithms "
                "(a2c/a3c, pg, onestep_q, sarsa, nstep_q): use --arch data_parallel or single for it"
            )
        if on_policy_only and not self.algo.one_gradient:
            raise ConfigError(
                f"{cfg.algo}'s update takes {self.algo_cfg.epochs} epoch(s) of minibatch steps per segment, but the "
                f"{self.arch} architecture applies one gradient per segment: use --arch data_parallel (its learner "
                f"runs {cfg.algo}'s own update), or --set epochs=1 --set minibatch_size="
                f"{self.algo_cfg.rollout_len * self.algo_cfg.n_envs} (one minibatch: the whole segment)"
            )
        opts = self.opts
        BACKENDS[opts.backend].check_options(opts)
        if opts.backend != "ray" and (given := self.given_option(RAY_OPTIONS)):
            raise ConfigError(f"{given} is an option of the ray backend; add --backend ray (not {opts.backend})")
        if BACKENDS[opts.backend].in_process and not self.resuming and (given := self.given_option(PROCESS_OPTIONS)):
            raise ConfigError(
                f"{given} is for roles that run as processes (--backend local or ray); --backend {opts.backend} runs "
                "them in this process, one after another"
            )
        self.check_machine_fits()
        self.check_role_gpus()
        self.check_untracked_state()
        for option, state in (("obs_norm", self.obs_stats), ("reward_norm", self.reward_norm)):
            if state is not None:
                raise ConfigError(
                    f"{option} runs on the single architecture only (each {self.arch} worker steps its own "
                    f"envs); use --arch single or --set {option}=false"
                )
        if uses_optimizer:
            try:
                is_shared(self.opts.optimizer)  # a known name (the renamed 'sgd' gets its own pointer)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if self.opts.optimizer == ALGO:
                self.algo_optimizer()
            elif "optimizer" in cfg.overrides and not self.resuming:
                raise ConfigError(
                    f"--set optimizer={cfg.overrides['optimizer']} has no effect on --arch {self.arch}: its "
                    f"--optimizer ({self.opts.optimizer}) steps the shared parameters; add --optimizer algo to step "
                    "them with the algorithm's own"
                )

    def algo_optimizer(self) -> OptimizerRecipe:
        """What `--optimizer algo` builds: the recipe of the algorithm's own optimizer (its class and the
        hyperparameters of its one parameter group); a one-line `ConfigError` where there is none to copy."""
        own = self.algo.optimizer
        if not isinstance(own, torch.optim.Optimizer):
            raise ConfigError(f"{self.cfg.algo} has no optimizer of its own to copy; choose another --optimizer")
        try:
            return OptimizerRecipe.of(own)
        except ValueError as exc:
            raise ConfigError(f"{self.cfg.algo}: {exc}") from None

    def given_option(self, names: Iterable[str]) -> str | None:
        """The flag of the first of the architecture's options `names` that this run gives a value other than its
        default (`--heartbeat-s`), None where none is given: for options that would do nothing in this run."""
        defaults = type(self.opts)()
        given = next((name for name in names if getattr(self.opts, name) != getattr(defaults, name)), None)
        return None if given is None else "--" + given.replace("_", "-")

    def check_machine_fits(self) -> None:
        """Refuse role counts far beyond this machine (`OVERSUBSCRIBE_LIMIT` times its cores) before any process
        starts, unless `--oversubscribe`; roles that run in this process (serial) or on a cluster (`Backend.on_cluster`:
        a joined one, or the one this process is connected to) pass."""
        opts = self.opts
        if opts.backend == "serial" or opts.oversubscribe or BACKENDS[opts.backend].on_cluster(opts):
            return
        cores = usable_cores()
        cpus = opts.workers * (opts.cpus_per_role if opts.backend == "ray" else 1.0)
        if cpus > OVERSUBSCRIBE_LIMIT * cores:
            count = next(f.name for f in dataclasses.fields(opts) if f.name in ("workers", "learners", "actors"))
            raise ConfigError(
                f"--{count} {opts.workers} asks for {cpus:g} CPUs, more than {OVERSUBSCRIBE_LIMIT} times the {cores} "
                f"core(s) of this machine (each role is a process of its own, some 300 MB or more): use fewer, or "
                "--oversubscribe to start them anyway"
            )

    @overload
    def worker_spec(self, **extra: Any) -> WorkerSpec: ...
    @overload
    def worker_spec(self, spec_cls: type[Spec], **extra: Any) -> Spec: ...
    def worker_spec(self, spec_cls: type[WorkerSpec] = WorkerSpec, **extra: Any) -> WorkerSpec:
        """The run's `WorkerSpec` (or a subclass of it, whose extra fields come as keywords)."""
        return spec_cls(
            algo=self.cfg.algo,
            algo_cfg=self.algo_cfg,
            env=self.cfg.env,
            env_kwargs=self.cfg.env_kwargs,
            observation_space=self.env_info["observation_space"],
            action_space=self.env_info["action_space"],
            seed=self.cfg.seed,
            total_steps=self.total_steps,
            **extra,
        )

    def start_backend(self, worker_slots: bool = False) -> None:
        """The run's backend and what the coordinator shares with the workers through it: the networks
        (`shared`), the published weights' version, the global step counter (with `worker_slots` every worker
        adds to its own slot, `worker_id + 1`); and the coordinator's own counts: episodes, recent returns,
        the policy lags (weight version learned from minus version acted with) not logged yet."""
        self.backend = make_backend(self.opts.backend, self.opts, self.run_dir)
        self.shared = self.backend.share(host_modules(algo_modules(self.algo)))  # CPU copies of a learner on a device
        self.weights = self.backend.weight_version()
        self.counter = self.backend.step_counter(1 + (self.opts.workers if worker_slots else 0))
        self._episodes = 0
        self.returns: deque[float] = deque(maxlen=100)
        self.lags: list[int] = []

    @contextlib.contextmanager
    def publishing(self) -> Iterator[None]:
        """One new weight version: what the body changes in the learner is published to the workers (a learner on
        a device refreshes the CPU copies they read, `host_modules`, before the version is out)."""
        with self.weights.writing():
            yield
            sync_host(algo_modules(self.algo).values())

    @property
    def env_steps(self) -> int:
        return int(self.counter.value)

    @property
    def episodes(self) -> int:
        return self._episodes

    def count_returns(self, returns: list[float]) -> None:
        self._episodes += len(returns)
        self.returns.extend(returns)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        """Read back what `_extra_state` saved (nothing by default)."""

    def _payload(self, with_data: bool) -> dict[str, Any]:
        payload = super()._payload(with_data)
        payload[self.arch] = {
            "episodes": self._episodes,
            "returns": list(self.returns),
            "resumes": self.spec.resumes,
            **self._extra_state(),
        }
        return payload

    def _restore(self, payload: dict[str, Any]) -> None:
        load_algo_state(self.algo, payload, self.run_dir, self.cfg.algo)  # into the shared tensors, sharing kept
        sync_host(algo_modules(self.algo).values())  # a learner on a device: the workers' CPU copies too
        self.state.update(payload["state"])
        self.counter.set(int(payload["env_steps"]))
        saved = payload.get(self.arch) or {}
        self.spec.resumes = int(saved.get("resumes", 0)) + 1  # the workers are not started yet
        self._episodes = int(saved.get("episodes", 0))
        self.returns.extend(saved.get("returns", []))
        self._restore_extra(saved)

    def start_roles(
        self,
        make_role: Callable[[int, int], Any],
        stop: StopFlag,
        credits: int | None = None,
        services: ServiceGroup | None = None,
    ) -> RoleGroup:
        """Start `--workers` roles made by `make_role(worker_id, incarnation)` on the run's backend; each sends
        items (`credits` ahead at most) until the budget is spent or `stop` is set. Their pids (processes)
        are listed in `<run>/workers.json` while they run. `services`: those the roles call (their heartbeat is
        held while one of them does not answer, so that the hung service, not its callers, is killed)."""
        group = self.backend.start(
            make_role,
            self.opts.workers,
            self.counter,
            stop,
            self.total_steps,
            credits=credits,
            max_restarts=self.opts.max_restarts,
            pids_file=self.run_dir / "workers.json",
            heartbeat_s=self.opts.heartbeat_s,
        )
        if services is not None:
            group.waits_on = [services]
        return group

    def start_services(
        self, make_service: Callable[[int, int], Any], n: int, pids_file: Path | None, name: str
    ) -> ServiceGroup:
        """Start `n` services on the run's backend, restarted when they die or stop answering for `--heartbeat-s`
        (hung), within the run's `--max-restarts`."""
        return self.backend.start_services(
            make_service, n, max_restarts=self.opts.max_restarts, pids_file=pids_file, name=name,
            heartbeat_s=self.opts.heartbeat_s,
        )  # fmt: skip

    def wait_service(self, pending: Pending, check: Callable[[], object]) -> Any:
        """A service's answer, waited for in slices of `WAIT_S` with `check()` (the services' health: dead and hung
        ones restarted, a `WorkerFailure` past the restart limit) in between; once a stop is requested (Ctrl-C), at
        most `STOP_WAIT_S` more, then `ServiceWaitStopped`. A method that raised (`ServiceError`) or a service gone
        for good (`ServiceUnavailable`) goes on up: the loop stops the run on it as on any failure (`FAILURES`)."""
        stop_seen = None
        while True:
            try:
                return pending.result(timeout=WAIT_S)
            except TimeoutError:
                check()
            request = getattr(self, "stop_request", None)
            if request is not None and request.requested:
                stop_seen = time.monotonic() if stop_seen is None else stop_seen
                if time.monotonic() - stop_seen > STOP_WAIT_S:
                    raise ServiceWaitStopped(
                        f"a stop was requested while a service did not answer for {STOP_WAIT_S:.0f} s"
                    )

    def stop_roles(self, stop_flag: StopFlag, pool: RoleGroup | None, services: ServiceGroup | None = None) -> None:
        """Stop the roles (`stop_flag` first: they leave by themselves, what is left is stopped), then the
        services, and give back what the backend started. Idempotent: the end of a run and its `finally` both
        call it."""
        stop_flag.set()
        if pool is not None:
            pool.stop()
        if services is not None:
            services.stop()
        self.backend.close()

    def restart_crashed(self, pool: RoleGroup, logger: RunLogger, how: str) -> None:
        """Report the workers that crashed since the last check; `pool` has restarted them (`how` says from what)."""
        for crash in pool.check():
            self._report(f"{crash.describe()}\nrestarting it {how}")
            logger.log(self.env_steps, {"charts/worker_restarts": pool.restarts})

    def monitor_step(
        self,
        logger: RunLogger,
        start: float,
        new_returns: list[float],
        metrics: dict[str, float],
        stop_requested: bool,
        updates: int,
    ) -> str | None:
        """`after_update` (logging, evaluation, checkpoints, stop conditions); returns the reason to stop, if any."""
        return self.after_update(logger, start, new_returns, self.returns, metrics, stop_requested, updates=updates)

    def log_row(self) -> dict[str, float]:
        """The policy lag since the last log row (mean and max), where the architecture measures one."""
        if not self.lags:
            return {}
        lag = {"charts/policy_lag": float(np.mean(self.lags)), "charts/policy_lag_max": max(self.lags)}
        self.lags.clear()
        return lag

    def _report(self, text: str, show: bool = True) -> None:
        """Worker trouble, said to `WORKERS`: in `<run>/workers.log`, and on the terminal too where `show`."""
        WORKERS.log(logging.WARNING if show else logging.INFO, text, extra={"step": self.env_steps})

    # ----------------------------------------------------------------------------------------- loop
    @abstractmethod
    def start_workers(self, stop_flag: StopFlag, logger: RunLogger) -> RoleGroup:
        """Start the run's roles (`start_roles`, and anything they need first) that leave once `stop_flag` is set;
        `logger` is the run's, for what logs outside the loop's passes (param_server's server restarts)."""

    @abstractmethod
    def coordinate(self, pool: RoleGroup) -> Taken | None:
        """One pass of the loop: wait (`WAIT_S` at most) for what the workers send, learn from it, count its steps
        and episodes, give the credits back; what it took in, None if nothing came."""

    def threads_not_learning(self) -> str | None:
        threads = self.cfg.torch_threads
        if self.role_learning != "always" or not isinstance(threads, int) or threads <= 1:
            return None
        each = "as many as --cpus-per-role" if self.opts.backend == "ray" else "one"
        return (f"--torch-threads {threads} is the coordinator's, which evaluates; the learners of {self.arch} are "
                f"processes of their own, with {each} torch thread each")  # fmt: skip

    def budget_spent(self) -> bool:
        """Whether the loop has taken the run's budget of env steps (and what comes with it, where more does)."""
        return self.env_steps >= self.total_steps

    def wind_down(self, stop_flag: StopFlag, pool: RoleGroup) -> None:
        """After the loop, before the final evaluation and checkpoint (`finish`): stop the workers."""
        self.stop_roles(stop_flag, pool)

    def shut_down(self, stop_flag: StopFlag, pool: RoleGroup | None) -> None:
        """Stop everything the run started, at its end or on an error (`pool` is None if it did not start)."""
        self.stop_roles(stop_flag, pool)

    def run(self) -> RunResult:
        """The coordinator loop (see the module docstring), its worker trouble in `<run>/workers.log` (`run_log`)."""
        with run_log(self.run_dir):
            return self._run()

    def _run(self) -> RunResult:
        logger, start = self.start_logging()
        stopped_by = "steps"
        stop_flag = self.backend.stop_flag()
        pool = None
        failure: RunFailure | None = None
        last_item = time.monotonic()
        try:
            with StopRequest(on_request=stop_flag.set) as stop:  # the roles stop at once, as do their starts
                self.stop_request = stop  # the coordinator's waits on services honour it (`wait_service`)
                try:
                    pool = self.start_workers(stop_flag, logger)
                    while True:
                        taken = self.coordinate(pool)
                        if taken is not None:
                            last_item = time.monotonic()
                        elif self.waiting_for is not None and time.monotonic() - last_item > STALL_S:
                            self._report(f"no {self.waiting_for} for {STALL_S:.0f} s ({pool.alive()} alive)")
                            last_item = time.monotonic()
                        self.restart_crashed(pool, logger, self.restart_how)
                        new_returns, metrics, updates = taken if taken is not None else ([], {}, 0)
                        reason = self.monitor_step(logger, start, new_returns, metrics, stop.requested, updates)
                        if reason is not None:
                            stopped_by = reason
                            break
                        if self.budget_spent():
                            break
                except FAILURES as exc:  # the run cannot go on: it stops as cleanly as on Ctrl-C, then says why
                    failure, stopped_by = as_failure(exc), "failure"
                    self._report(f"the run stops: {exc}", show=False)  # the caller says it (the CLI: one line)
                except ServiceWaitStopped as exc:  # Ctrl-C while a service did not answer: a stop as any other
                    stopped_by = "interrupted"
                    self._report(f"{exc}: the run stops without its answer")
                except StoppedWhileStarting as exc:  # Ctrl-C while the roles started (Ray actors waiting for CPUs)
                    stopped_by = "interrupted"
                    self._report(f"a stop was requested while the roles started ({exc})")
            if pool is not None:
                self.wind_down(stop_flag, pool)
            try:
                stopped_by = self.finish(logger, start, stopped_by)
            except FAILURES as exc:  # a service call of the final evaluation or checkpoint (param_server's pull)
                if failure is not exc:  # not the failure that ended the loop, met again (a spent restart budget)
                    self._report(f"the run stops: {exc}", show=False)
                failure, stopped_by = as_failure(exc), "failure"
                self.finish(logger, start, stopped_by)  # no evaluation; the checkpoint of what the coordinator holds
        finally:
            self.shut_down(stop_flag, pool)
            logger.close()
            self.eval_envs.close()
        return self.conclude(stopped_by, start, failure)

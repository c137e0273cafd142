"""`allreduce`: synchronous all-reduce learners, DD-PPO's decentralised form — K learners, no central learner.

Each of K learners collects its own segment, runs the algorithm's own `update` on it, and in every optimizer
step of that update (every minibatch of every PPO epoch) averages its gradients with the others' by
`torch.distributed`'s all-reduce (gloo) between the backward pass and the global-norm clip, so the K identical
optimizers take identical steps and the learners stay identical. Who sends what to whom::

    learner 0 ◀──┐ all-reduce of the gradients (gloo), in every optimizer step ┌──▶ learner K-1
        │        └─────────────────────────┬──────────────────────────────────┘        │
        │ steps, returns, metrics          │ learner 1 ...                            │ steps, returns,
        │ + its weights and optimizer      │                                          │ metrics
        ▼   state every `state_every`      ▼                                          ▼
    ┌──────────────────────────────────────────────────────────────────────────────────────────┐
    │ coordinator (main process): counts steps, logs, evaluates and checkpoints learner 0's     │
    │ state, publishes it (a restarted learner starts from it), opens the group's TCPStore      │
    └──────────────────────────────────────────────────────────────────────────────────────────┘

The algorithm knows nothing of it: `optimize` (`rlfleet.optim.step`), the one place the on-policy
algorithms step, calls the gradient hook the learner set on the algorithm's optimizer (`set_gradient_hook`).
The coordinator opens a `TCPStore` at the backend's host and hands its address to the learners; learner `i`
joins the gloo group as rank `i` of K under the store prefix of the current generation. Once the group has
formed, the learners agree on one state: that of the learner that has done the most updates (the lowest rank
among equals; at the start, learner 0 with the coordinator's), broadcast with its env-step count, so all
start identical in weights and optimizer state. The schedules (learning-rate annealing, target syncs) run at
that shared count, advanced by K segments per update, so they too are the same in every learner.

A learner that dies breaks the group: the others' next collective fails (gloo reports the closed peer at
once; a hung peer after `group_timeout_s`, or once the heartbeat has it killed). The group's generation is
a counter in the store: a learner whose group broke moves everyone to the next one (one bump per generation),
and so does the coordinator as soon as it sees a learner die. A learner joining a generation says it is
ready under it and waits, watching the store, until all K are ready before it forms the gloo group; a
generation abandoned meanwhile is left for the newer one at once, so no learner waits in gloo's own
rendezvous for a dead peer. The backend restarts the dead learner, it joins the newest generation, and the
state is broadcast again from a survivor. A learner waits for its group in produce calls of at most
`JOIN_WAIT_S` (an empty item after each, so it beats and sees the stop flag, and a backend that queues a
role's calls is not held up); after `group_timeout_s` under one generation it moves everyone on.

Every update takes the same number of optimizer steps in every learner, so only algorithms whose batch
size does not depend on their data run here: rollout algorithms (a2c, ppo, pg with a baseline, nstep_q,
onestep_q, sarsa). Learner 0 sends its state (`pack_state`) every `state_every` updates and after
the budget's last one; the coordinator evaluates, checkpoints and publishes the latest it got. Its loop is
`ParallelRunner.run`: it opens the store before it starts the learners (`start_workers`), takes one learner's
item a pass (`coordinate`), and lets the store go when the run ends (`shut_down`).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from rlfleet.arch.parallel import WAIT_S, ParallelOptions, ParallelRunner, Producer, Taken, WorkerSpec
from rlfleet.arch.shared import load_state, pack_state
from rlfleet.backends import BACKENDS, RoleGroup
from rlfleet.backends.shared_memory import StopFlag, WeightVersion
from rlfleet.device import read_metrics
from rlfleet.fields import bounded
from rlfleet.optim.step import set_gradient_hook
from rlfleet.run.config import ConfigError, RunConfig
from rlfleet.run.logger import RunLogger

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore  # where torch declares it (torch.distributed does not)

AHEAD = 2  # items a learner may have sent beyond those the coordinator has counted
GENERATION = "generation"  # the store key of the group's generation
POLL_S = 0.005  # a learner's poll of the store while it waits for the others to be ready
JOIN_WAIT_S = 1.0  # the longest a learner's produce call waits for its group (then an empty item, and it waits on)


class GroupBroken(RuntimeError):
    """A collective of the learners' group failed, or the group did not form: a peer died or hung."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the learners' group meets (the coordinator's TCPStore) and its size (picklable to the learners)."""

    host: str
    port: int
    world_size: int
    timeout_s: float


def keep_on_loopback(host: str) -> None:
    """A group that meets at a loopback address (one machine) talks over the loopback interface: gloo would
    otherwise pick the interface the machine's hostname resolves to (`GLOO_SOCKET_IFNAME`, set for this learner's
    process unless the user set it)."""
    if ipaddress.ip_address(host).is_loopback:
        names = [name for _, name in socket.if_nameindex()]
        loopback = next((n for n in names if Path(f"/sys/class/net/{n}/flags").exists()
                         and int(Path(f"/sys/class/net/{n}/flags").read_text(), 16) & 0x8), "lo")  # fmt: skip
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)


class LearnerGroup:
    """One learner's place in the gloo group: `join` the current generation, `average` gradients, `agree` on one
    state, `leave`. A failed collective or rendezvous raises `GroupBroken`."""

    def __init__(self, rendezvous: Rendezvous, rank: int):
        self.rank = rank
        self.world = rendezvous.world_size
        self.timeout = timedelta(seconds=rendezvous.timeout_s)
        self.store = dist.TCPStore(  # type: ignore[attr-defined]  # torch re-exports TCPStore without declaring it
            rendezvous.host, rendezvous.port, is_master=False, timeout=self.timeout
        )
        keep_on_loopback(rendezvous.host)
        self.generation: int | None = None
        """The generation of this learner's group (None: it has been in none yet)."""
        self.formed = False
        self.waiting: tuple[int, float] | None = None
        """(generation, deadline) while this learner is ready under a generation whose group has not formed."""

    def current(self) -> int:
        return int(self.store.get(GENERATION))

    def _ready(self, generation: int) -> tuple[int, float]:
        """Say this learner is ready under `generation`; (generation, the time to give up on it)."""
        self.store.add(f"{generation}/ready", 1)
        return generation, time.monotonic() + self.timeout.total_seconds()

    def abandon(self, generation: int) -> None:
        """Move everyone on from `generation` (broken, or it did not form): the next one, unless someone already
        moved on (one bump per generation)."""
        self.store.compare_set(GENERATION, str(generation), str(generation + 1))

    def join(self, stop: StopFlag | None = None, wait_s: float | None = None) -> int | None:
        """Join the group of the current generation; its number. A learner says it is ready under the generation
        and waits (watching the store) until all are ready, then forms the gloo group: a generation abandoned
        meanwhile (a learner died: the coordinator moves everyone on) is left for the newer one at once, so the
        learners never wait in gloo's own rendezvous for a dead peer. Returns None if `stop` got set, or after
        `wait_s` seconds (None: no limit) without a group: the learner stays ready, and the next call goes on
        waiting. Raises `GroupBroken` once it has waited `timeout_s` under one generation (after abandoning it,
        so that the others move on too)."""
        if self.waiting is None:
            self.leave()
            self.waiting = self._ready(self.current())
        generation, deadline = self.waiting
        until = time.monotonic() + wait_s if wait_s is not None else float("inf")
        while (ready := int(self.store.add(f"{generation}/ready", 0))) < self.world:
            if (current := self.current()) != generation:
                generation, deadline = self.waiting = self._ready(current)
                continue
            if stop is not None and stop.is_set():
                return None
            now = time.monotonic()
            if now > deadline:
                self.waiting = None
                self.abandon(generation)
                raise GroupBroken(f"generation {generation} did not form: {ready} of {self.world} learners ready")
            if now > until:
                return None
            time.sleep(POLL_S)
        self.waiting = None
        self.generation = generation
        # torch names a process's default group by the count of groups it made, and only a destroy resets that: a
        # failed init_process_group counted one, so this learner would meet its peers under another name, every
        # generation after, for ever (a private attribute, as torch's own elastic agents restart whole processes)
        dist.distributed_c10d._world.group_count = 0
        try:
            dist.init_process_group(
                "gloo",
                store=dist.PrefixStore(f"{generation}/", self.store),  # type: ignore[attr-defined]  # as TCPStore
                rank=self.rank,
                world_size=self.world,
                timeout=self.timeout,
            )
        except RuntimeError as exc:
            self.leave()
            self.abandon(generation)
            raise GroupBroken(f"generation {generation} did not form: {_first_line(exc)}") from None
        self.formed = True
        return generation

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self.formed = False

    def _collective(self, collective: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        try:
            collective(*args, **kwargs)
        except RuntimeError as exc:  # gloo: a closed peer, or the timeout
            assert self.generation is not None  # a collective runs in a group that formed
            self.leave()
            self.abandon(self.generation)
            raise GroupBroken(f"the group of generation {self.generation} broke: {_first_line(exc)}") from None

    def average(self, params: Sequence[nn.Parameter]) -> None:
        """Replace every gradient by its mean over the learners (one all-reduce of them all, flattened). Parameters
        without a gradient have none in every learner (the same loss, the same graph) and are left out."""
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        staged = flat.cpu()  # gloo reduces in host memory: a learner on a GPU's gradients pass through it
        self._collective(dist.all_reduce, staged)
        staged.div_(self.world)
        if staged is not flat:
            flat.copy_(staged)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def agree(self, updates: int, steps: int, state: Callable[[], bytes]) -> tuple[int, int, int, bytes | None]:
        """Make one learner's state everyone's: the one with the most `updates` (the lowest rank among equals).
        Returns that learner's rank, (updates, steps) and its `state()` bytes, None where it is this learner's."""
        key = torch.tensor([updates * self.world + (self.world - 1 - self.rank)], dtype=torch.int64)
        self._collective(dist.all_reduce, key, op=dist.ReduceOp.MAX)
        best, source = int(key) // self.world, self.world - 1 - int(key) % self.world
        data = state() if self.rank == source else b""
        header = torch.tensor([steps, len(data)], dtype=torch.int64)
        self._collective(dist.broadcast, header, src=source)
        if self.rank == source:
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            payload = torch.empty(int(header[1]), dtype=torch.uint8)
        self._collective(dist.broadcast, payload, src=source)
        return source, best, int(header[0]), None if self.rank == source else payload.numpy().tobytes()


def _first_line(exc: BaseException) -> str:
    """The first line of an error's message, without gloo's source location ("[.../pair.cc:553] ")."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip())
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass
class LearnerSpec(WorkerSpec):
    """A learner's `WorkerSpec`, and where its group meets."""

    rendezvous: Rendezvous | None = field(default=None, kw_only=True)
    """None with one learner: nothing to average."""
    initial_state: bytes = field(default=b"", kw_only=True)
    """The coordinator's `pack_state` when the run (or resume) started: its optimizer state for the first group."""
    start_steps: int = field(default=0, kw_only=True)
    """The run's env steps when the learners started (a resumed run's schedules go on from there)."""
    state_every: int = field(default=1, kw_only=True)
    """Updates between the states learner 0 sends (`AllReduceOptions.state_every`)."""


@dataclass
class LearnerReport:
    """One learner's item: what it collected and, after an update, its metrics (learner 0: its state too)."""

    worker: int
    incarnation: int
    steps: int
    returns: list[float]
    metrics: dict[str, float]
    updated: bool
    """The group completed an update on this learner's segment."""
    generation: int | None
    """The group's generation (None: in no group; with one learner, always)."""
    state: bytes | None = None
    """`pack_state` of learner 0 every `state_every` updates, and after the last update of the budget."""
    trouble: str | None = None
    """Why the group broke or did not form, if it did."""
    note: str | None = None
    """Whose state a restarted learner took on when its group formed."""
    last: bool = False
    """The item of the budget's last update (learner 0's holds the coordinator's final state)."""


class AllReduceLearner(Producer):
    """One learner: its own envs and algorithm object; the algorithm's own update, gradients averaged by the group."""

    spec: LearnerSpec

    def __init__(
        self,
        spec: LearnerSpec,
        shared: dict[str, nn.Module],
        weights: WeightVersion,
        worker_id: int,
        incarnation: int = 0,
    ):
        super().__init__(spec, shared, weights, worker_id, incarnation)
        load_state(self.algo, spec.initial_state)
        self.weights.read(self.copy.pull)  # the latest weights learner 0 sent (a restarted learner's best guess)
        self.steps = spec.start_steps  # the group's env steps, the same in every learner: the schedules' clock
        self.updates = 0 if incarnation == 0 else -1  # -1: a restarted learner knows nothing yet
        self.note: str | None = None  # sent with the next item
        self.segment_steps = spec.algo_cfg.n_envs * spec.algo_cfg.rollout_len
        self.group = LearnerGroup(spec.rendezvous, worker_id) if spec.rendezvous is not None else None
        self.world = 1 if spec.rendezvous is None else spec.rendezvous.world_size
        if self.group is not None:
            set_gradient_hook(self.algo.optimizer, self.group.average)

    def form(self, stop: StopFlag | None = None) -> bool:
        """Join the next generation's group and take on the state the learners agree on; False if it has not
        formed within `JOIN_WAIT_S` (or `stop` got set)."""
        assert self.group is not None  # only learners in a group form one
        if self.group.join(stop, JOIN_WAIT_S) is None:
            return False
        source, updates, steps, state = self.group.agree(self.updates, self.steps, partial(pack_state, self.algo))
        if state is not None:
            load_state(self.algo, state)
            if self.updates < 0:
                self.note = f"took on the state of learner {source} ({updates} updates)"
        self.updates, self.steps = updates, steps
        return True

    def produce(self, global_steps: int, stop: StopFlag | None = None) -> LearnerReport | None:
        report = partial(LearnerReport, self.worker_id, self.incarnation)
        if self.group is not None and not self.group.formed:
            try:  # an empty item while the group forms: the worker beats, sees `stop`, and calls again
                if not self.form(stop):
                    return None if stop is not None and stop.is_set() else report(0, [], {}, False, None)
            except GroupBroken as exc:
                return report(0, [], {}, False, None, trouble=str(exc))
        generation = None if self.group is None else self.group.generation
        self.algo.schedule(self.steps, self.spec.total_steps)
        before = self.collector.env_steps
        assert self.storage is not None  # allreduce runs on-policy algorithms, which collect rollouts (check_config)
        segment = self.collector.collect_rollout(self.storage)
        steps, returns = self.collector.env_steps - before, self.collector.pop_new_returns()
        try:
            metrics = read_metrics(self.algo.update(segment))  # floats: they cross to the coordinator
        except GroupBroken as exc:  # its segment's steps were taken all the same
            return report(steps, returns, {}, False, generation, trouble=str(exc))
        self.updates += 1
        self.steps += self.world * self.segment_steps
        # the budget's last update (by the group's count or the coordinator's): the coordinator's final state
        last = max(self.steps, global_steps + self.world * self.segment_steps) >= self.spec.total_steps
        state = None
        if self.worker_id == 0 and (self.updates % self.spec.state_every == 0 or last):
            state = pack_state(self.algo)
        note, self.note = self.note, None
        return report(steps, returns, metrics, True, generation, state, note=note, last=last)

    def close(self) -> None:
        if self.group is not None:
            self.group.leave()
            set_gradient_hook(self.algo.optimizer, None)
        super().close()


@dataclass
class AllReduceOptions(ParallelOptions):
    """allreduce's options."""

    group_timeout_s: float = bounded(60.0, gt=0)
    """Seconds a learner waits in a collective, or for its group to form, before it takes a peer for dead or
    hung and moves to the next generation of the group (less than --heartbeat-s)."""
    state_every: int = bounded(1, ge=1)
    """Updates between the copies of learner 0's weights and optimizer state sent to the coordinator (and one
    after the budget's last update), which evaluates, checkpoints and publishes the latest it got: an evaluation
    or a Ctrl-C checkpoint may be up to state_every - 1 updates behind the learners."""


class AllReduceRunner(ParallelRunner):
    """The coordinator of an `allreduce` run (see the module docstring): no learning of its own."""

    arch = "allreduce"
    Options = AllReduceOptions
    role_learning = "always"
    spec: LearnerSpec

    def check_config(self) -> None:
        self.check_parallel(on_policy_only=False, uses_optimizer=False)
        algo, opts = self.cfg.algo, self.opts
        if self.algo.data != "rollout":
            instead = "offline" if self.algo.data == "dataset" else "data_parallel or single"
            raise ConfigError(
                f"{algo} learns from {self.algo.data} data; the allreduce architecture runs on-policy algorithms "
                f"whose update steps one optimizer (a2c, ppo, pg, nstep_q, onestep_q, sarsa): use --arch {instead}"
            )
        uneven = self.algo.uneven_updates()
        if uneven is not None:
            raise ConfigError(f"all-reduce learners take their optimizer steps together, and {algo} may take a "
                              f"different number of them in each learner: {uneven}")  # fmt: skip
        if BACKENDS[opts.backend].in_process and opts.workers > 1:
            raise ConfigError(
                f"--backend {opts.backend} runs the learners one after another in one process, so {opts.workers} "
                "of them cannot all-reduce: use --backend local, or --workers 1 (one learner)"
            )
        if opts.workers == 1 and not self.resuming and (given := self.given_option(("group_timeout_s",))):
            raise ConfigError(f"{given} has no effect with --workers 1: one learner forms no group to wait for")
        if opts.workers > 1 and opts.group_timeout_s >= opts.heartbeat_s:
            raise ConfigError(
                f"--group-timeout-s {opts.group_timeout_s:g} must be less than --heartbeat-s {opts.heartbeat_s:g}: "
                "a learner waiting that long for a hung peer would be taken for hung itself"
            )

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        self.spec = self.worker_spec(LearnerSpec, state_every=self.opts.state_every, device=self.role_device())
        self.start_backend()  # the counter: env steps of every learner's items
        self.store: TCPStore | None = None
        self.generation: int | None = None
        self.final_taken = False  # learner 0's state after the budget's last update
        self.budget_taken_at: float | None = None
        self.heard_from_0 = 0.0  # when learner 0's latest item came (time.monotonic)
        if resume_from is not None:
            self._restore(resume_from)
        self.eval_envs = self.make_eval_envs()
        self._write_config({"workers": self.opts.workers, "ahead": AHEAD})

    def _extra_state(self) -> dict[str, Any]:
        return {"version": self.weights.version}

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        self.weights.set(int(saved.get("version", 0)))

    def open_rendezvous(self) -> None:
        """The learners' meeting point: a TCPStore at the backend's host on a free port, generation 0."""
        self.spec.initial_state = pack_state(self.algo)
        self.spec.start_steps = self.env_steps
        if self.opts.workers == 1:
            return
        timeout = timedelta(seconds=self.opts.group_timeout_s)
        self.store = dist.TCPStore(  # type: ignore[attr-defined]  # torch re-exports TCPStore without declaring it
            self.backend.host, 0, is_master=True, wait_for_workers=False, timeout=timeout
        )
        self.store.set(GENERATION, "0")
        opts = self.opts
        self.spec.rendezvous = Rendezvous(self.backend.host, self.store.port, opts.workers, opts.group_timeout_s)

    def restart_crashed(self, pool: RoleGroup, logger: RunLogger, how: str) -> None:
        """Report and restart the learners that died, and move the others on to the next generation at once: the
        group with the dead learner is abandoned even by learners still waiting for it to form."""
        restarts = pool.restarts
        super().restart_crashed(pool, logger, how)
        if pool.restarts != restarts and self.store is not None:
            self.store.add(GENERATION, 1)

    # ----------------------------------------------------------------------------------------- learning
    def take(self, item: LearnerReport) -> tuple[dict[str, float], int]:
        """Count a learner's item; learner 0's state becomes the coordinator's (and the published weights)."""
        self.counter.add(item.steps)
        self.count_returns(item.returns)
        if item.worker == 0:
            self.heard_from_0 = time.monotonic()
        for news in (item.trouble, item.note):
            if news is not None:
                self._report(f"learner {item.worker}: {news}")
        if item.generation is not None and item.updated and item.generation != self.generation:
            if self.generation is not None:
                self._report(f"the learners' group re-formed (generation {item.generation})")
            self.generation = item.generation
        if item.state is not None:
            with self.publishing():  # a learner on a device: the CPU copies a restarted learner pulls too
                load_state(self.algo, item.state)
            self.final_taken |= item.last
        if not item.updated:
            return {}, 0
        return item.metrics, int(item.worker == 0)  # one update of the group per update of learner 0

    # ----------------------------------------------------------------------------------------- loop
    waiting_for = "item from the learners"
    restart_how = "(it joins the learners' next group)"

    def start_workers(self, stop_flag: StopFlag, logger: RunLogger) -> RoleGroup:
        """The rendezvous first, then the learners, which meet there."""
        self.open_rendezvous()
        learner = partial(AllReduceLearner, self.spec, self.shared, self.weights)
        return self.start_roles(learner, stop_flag, AHEAD)

    def budget_spent(self) -> bool:
        """The budget's env steps are taken, and so is learner 0's state after the budget's last update: another
        learner's item of that update may take the count past the budget first. Where it does not come (a group
        that broke near the end counts steps no update took, and learner 0 then stops without knowing its update
        was the last), the wait ends once learner 0 has sent nothing for --group-timeout-s, which bounds any
        update's collectives, and the run ends with the latest state it sent."""
        if not super().budget_spent():
            return False
        now = time.monotonic()
        self.budget_taken_at = self.budget_taken_at or now
        quiet = now - max(self.budget_taken_at, self.heard_from_0)
        return self.final_taken or quiet > self.opts.group_timeout_s

    def coordinate(self, pool: RoleGroup) -> Taken | None:
        """The next item of any learner, taken in (`take`); then the learner may send the next. Past the budget,
        only learner 0's (`budget_spent`): the others' are of updates after the budget's last."""
        item = pool.get(0, WAIT_S) if super().budget_spent() else pool.get_any(WAIT_S)
        if item is None:
            return None
        metrics, updates = self.take(item)
        pool.release(item.worker, item.incarnation)
        return Taken(item.returns, metrics, updates)

    def shut_down(self, stop_flag: StopFlag, pool: RoleGroup | None) -> None:
        super().shut_down(stop_flag, pool)
        self.store = None  # the store's server goes with it

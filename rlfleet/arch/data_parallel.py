"""`data_parallel`: sampler processes step envs with the current weights and feed experience to one learner.

Data parallelism as in Lapan's "Deep RL Hands-On", ch. 11, with the measured policy lag of Sample
Factory. Who sends what to whom::

    sampler 0 ──┐   Experience: a rollout segment, or a block of transitions,     ┌──────────────────────┐
    sampler 1 ──┼── with its env steps, finished-episode returns and the weight ─▶│ learner (main process)│
       ...      │   version it acted with (one pipe per sampler)                  │ algo.update, eval,    │
    sampler N ──┘                                                                  │ logs, checkpoints     │
        ▲                                                                          └──────────┬───────────┘
        └───────── the learner's networks in shared memory (+ version counter) ◀──────────────┘

A sampler (`spawn`ed, one torch thread) owns a vector env of the algorithm's `n_envs` and a local
algorithm object. Before each segment it runs the algorithm's `schedule` at the global step count
(ε follows the whole run's progress) and copies the learner's current weights in (`LocalCopy.pull`,
target networks included, through `WeightVersion`: the copy is of exactly one version, whose number it
keeps). Then it collects:

- on-policy algorithms (`data == "rollout"`: a2c, pg, ppo, onestep_q, sarsa, nstep_q): one segment,
  `Collector.collect_rollout`, so the bootstrap values come from the weights it acted with;
- replay algorithms (`data == "replay"`: dqn): `train_freq` vector steps of transitions
  (obs, act, rew, next_obs, terminated, truncated).

The learner is the main process. It updates exactly as the single-process `SingleRunner` does: a segment
goes to `algo.update(segment)`; transition blocks go into the learner's replay buffer, whose env columns
are the samplers' envs side by side (`workers × n_envs` columns, so n-step sums stay inside one env's
stream), one block from every sampler per round, followed by `gradient_steps` updates with priorities
written back. A `data_parallel` DQN therefore learns as a `single` DQN with `workers × n_envs` envs.
Every update bumps the weight version; `charts/policy_lag` is the learner's version when it learns from
an item minus the version the item was collected with (0: perfectly on-policy), `charts/policy_lag_max`
its maximum since the last log line.

Samplers may run only `AHEAD` items ahead of the learner (credits given back once the learner has learned
from an item). For on-policy data that is one: a
sampler's next segment starts once the learner has learned from its last one, with the weights that
learned from it, so the lag is about `workers − 1` updates on average (more at times with samplers of uneven
speed; A2C with a lag of 5 collapsed on
CartPole-v1 in our runs); for replay it is two, so that samplers collect the next round while the
learner trains. `env_steps` counts what the learner has consumed, so it is exact and
resumable. Checkpoints hold the learner's algorithm state and the counters; the replay buffer is NOT
saved (a resumed DQN refills it before learning again). A crashed sampler is reported (traceback in
`workers.log`) and restarted with a fresh pipe; what it sent before it died and the learner has not
taken is dropped (also half a message: a sampler killed in the middle of sending one cannot stall the
learner, see `rlfleet.backends.local`). Ctrl-C stops the samplers and saves a checkpoint.

The samplers run on the run's backend (`--backend`): `local` processes, or `serial`, one after another in the
main process (tests, debugging); the loop is the same: `ParallelRunner.run`, whose pass over the samplers'
items this runner's `coordinate` is (the next segment of any sampler, or a block of every sampler, learned
from, then the credits given back). No experience for 60 s (`STALL_S`) is reported in `workers.log`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlfleet.algos import resolve
from rlfleet.arch.parallel import WAIT_S, ParallelOptions, ParallelRunner, Producer, Taken, WorkerSpec
from rlfleet.arch.shared import LocalCopy
from rlfleet.backends import RoleGroup
from rlfleet.backends.shared_memory import StopFlag, WeightVersion
from rlfleet.data.batch import map_obs
from rlfleet.data.buffer import Obs
from rlfleet.data.rollout import Segment
from rlfleet.envs.pettingzoo import make_agent_env
from rlfleet.run.config import ConfigError, RunConfig, check_sequence_replay
from rlfleet.run.logger import RunLogger
from rlfleet.run.multi_agent import MultiAgentCollector, Policies, TransitionLog
from rlfleet.run.multi_agent_runner import AgentEnvs, MultiAgentRunBase

AHEAD = {"rollout": 1, "replay": 2}  # items a sampler may have collected beyond what the learner learned from


@dataclass
class Experience:
    """One item from a sampler: a segment (rollout) or a transition block (replay), and its bookkeeping."""

    worker: int
    incarnation: int
    """How many times the sampler had been restarted (its credits are given back only to that incarnation)."""
    version: int
    """Weight version the sampler acted with."""
    steps: int
    """Env steps in `data`."""
    returns: list[float]
    """Returns of the episodes that finished while collecting it."""
    data: Any
    """A `Segment` with NumPy leaves, or a dict of `[train_freq, n_envs, ...]` transition arrays."""


def _state_to_numpy(state: Any) -> Any:
    """A recurrent state as NumPy arrays for the pipe (torch tensors would need the sender alive)."""
    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return state.detach().numpy().copy()
    return tuple(_state_to_numpy(s) for s in state)


def _state_to_torch(state: Any) -> Any:
    if state is None:
        return None
    if isinstance(state, np.ndarray):
        return torch.from_numpy(state)
    return tuple(_state_to_torch(s) for s in state)


class TransitionBlock:
    """`length` vector-env steps of transitions, with the `add` of a replay buffer (fed by `Collector.collect`).

    A recurrent policy's state (what it acted on each `obs` from) is kept as `h` and `c`, zeros where the
    collector gave None (a run's first step), so a sequence buffer gets the states acting had.
    """

    FIELDS = ("obs", "act", "rew", "next_obs", "terminated", "truncated")
    STATE = ("h", "c")

    def __init__(self, length: int):
        self.length = length
        self.t = 0
        self.data: dict[str, Any] = {}

    def add(
        self,
        obs: Obs,
        act: np.ndarray,
        rew: np.ndarray,
        next_obs: Obs,
        terminated: np.ndarray,
        truncated: np.ndarray,
        state: Any = None,
    ) -> None:
        if state is not None:
            for key, value in zip(self.STATE, _state_to_numpy(state), strict=True):
                if key not in self.data:
                    self.data[key] = np.zeros((self.length, *value.shape), value.dtype)
                self.data[key][self.t] = value
        for key, value in zip(self.FIELDS, (obs, act, rew, next_obs, terminated, truncated), strict=True):
            if key not in self.data:
                self.data[key] = map_obs(lambda v: np.empty((self.length, *np.shape(v)), np.asarray(v).dtype), value)
            if isinstance(value, dict):
                for k, v in value.items():
                    self.data[key][k][self.t] = v
            else:
                self.data[key][self.t] = value
        self.t += 1


def concat_blocks(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """Blocks of the samplers side by side: `[T, n_envs, ...]` each → `[T, workers × n_envs, ...]`.

    A block acted on from no recurrent state at all (a sampler's first step, the whole first block of a
    restarted sampler with `train_freq=1`) has no `h`/`c` while the others do: its columns get zeros, the
    state a None stands for.
    """
    out: dict[str, Any] = {}
    for key in TransitionBlock.FIELDS:
        first = blocks[0][key]
        if isinstance(first, dict):
            out[key] = {k: np.concatenate([b[key][k] for b in blocks], axis=1) for k in first}
        else:
            out[key] = np.concatenate([b[key] for b in blocks], axis=1)
    with_state = [b for b in blocks if TransitionBlock.STATE[0] in b]
    if with_state:
        for key in TransitionBlock.STATE:
            like = with_state[0][key]  # [T, n_envs, state_size]
            parts = [b[key] if key in b else np.zeros((len(like), b["rew"].shape[1], *like.shape[2:]), like.dtype)
                     for b in blocks]  # fmt: skip
            out[key] = np.concatenate(parts, axis=1)
    return out


class Sampler(Producer):
    """One sampler: its own envs and a local algorithm object that acts with the learner's latest weights."""

    def produce(self, global_steps: int, stop: StopFlag | None = None) -> Experience | None:
        """One segment or transition block with the current weights (None if `stop` was set meanwhile)."""
        algo, c = self.algo, self.collector
        algo.schedule(global_steps, self.spec.total_steps)  # ε and the like follow the whole run
        version = self.weights.read(self.copy.pull, stop)  # after schedule: the learner's target networks win
        if version is None:
            return None
        before = c.env_steps
        if self.storage is not None:
            segment = c.collect_rollout(self.storage)
            data: Any = Segment(  # copies: the storage is refilled next time
                segment.data.apply(np.array),
                map_obs(np.array, segment.last_obs),
                np.array(segment.last_value),
                _state_to_numpy(segment.initial_state),
            )
        else:
            block = TransitionBlock(algo.cfg.train_freq)
            c.collect(block, n_step=algo.cfg.train_freq * c.n_envs)
            data = block.data
        returns = c.pop_new_returns()
        return Experience(self.worker_id, self.incarnation, version, c.env_steps - before, returns, data)


class DataParallelRunner(ParallelRunner):
    """The learner of a `data_parallel` run (see the module docstring)."""

    arch = "data_parallel"
    Options = ParallelOptions

    def check_config(self) -> None:
        self.check_parallel(on_policy_only=False, uses_optimizer=False)
        if self.algo.data not in ("rollout", "replay"):
            raise ConfigError(f"{self.cfg.algo} wants {self.algo.data!r} data; data_parallel feeds rollout or replay")
        check_sequence_replay(self.algo_cfg, sources=self.opts.workers)  # the learner's buffer: every sampler's envs

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        self.spec = self.worker_spec()
        self.start_backend()  # the counter: env steps consumed by the learner
        self.buffer = None
        self.incarnations: dict[int, int] = {}  # replay: each sampler's incarnation whose data its columns hold
        self.pending: list[Experience | None] = [None] * self.opts.workers  # replay: this round's block of each
        if self.algo.data == "replay":
            self.buffer = self.algo.make_buffer(
                self.opts.workers * self.algo_cfg.n_envs, self.total_steps, seed=cfg.seed
            )
        if resume_from is not None:
            self._restore(resume_from)
        self.eval_envs = self.make_eval_envs()
        self._write_config({"workers": self.opts.workers, "ahead": AHEAD[self.algo.data]})

    def _extra_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"version": self.weights.version}
        if self.buffer is not None:  # the data is not saved, but the sampling schedule (β) goes on
            state["buffer_schedule"] = self.buffer.schedule_state()
        return state

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        self.weights.set(int(saved.get("version", 0)))
        if self.buffer is not None and "buffer_schedule" in saved:
            self.buffer.load_schedule_state(saved["buffer_schedule"])

    # ----------------------------------------------------------------------------------------- learning
    def _consume(self, items: list[Experience]) -> None:
        """Count what the learner takes in: steps, episodes, and how stale each item's weights are."""
        version = self.weights.version
        for item in items:
            self.lags.append(version - item.version)
            self.counter.add(item.steps)
            self.count_returns(item.returns)

    def learn_segment(self, item: Experience) -> tuple[dict[str, float], int]:
        """The `SingleRunner`'s on-policy step on a sampler's segment: schedule, `algo.update(segment)`."""
        segment = item.data
        segment = Segment(segment.data, segment.last_obs, segment.last_value, _state_to_torch(segment.initial_state))
        with self.publishing():  # the schedule may sync target networks: part of the new version
            self.algo.schedule(self.env_steps, self.total_steps)
            self._consume([item])
            metrics = self.algo.update(segment)
        return metrics, 1

    def learn_blocks(self, items: list[Experience]) -> tuple[dict[str, float], int]:
        """The `SingleRunner`'s replay step on one block of every sampler (in sampler order, side by side).

        Sampler `w` fills columns `[w × n_envs, (w + 1) × n_envs)`. A restarted sampler's envs begin new
        episodes, so before its first block the stream stored in its columns ends (`mark_boundary`).
        """
        cfg, buffer = self.algo_cfg, self.buffer
        assert buffer is not None  # a replay algorithm's learner has its buffer
        self.algo.schedule(self.env_steps, self.total_steps)  # ε only: DQN copies its target inside `update`
        self._consume(items)
        for item in items:
            if self.incarnations.setdefault(item.worker, item.incarnation) != item.incarnation:
                buffer.mark_boundary(np.arange(item.worker * cfg.n_envs, (item.worker + 1) * cfg.n_envs))
                self.incarnations[item.worker] = item.incarnation
        block = concat_blocks([item.data for item in items])
        for t in range(len(block["rew"])):
            step = [map_obs(itemgetter(t), block[key]) for key in TransitionBlock.FIELDS]
            if "h" in block:  # a recurrent policy's states: a sequence buffer's `state`, after the fields
                step.append((block["h"][t], block["c"][t]))
            buffer.add(*step)
        if not buffer.ready(cfg.batch_size, cfg.learning_starts):
            return {}, 0
        return self.replay_updates(self.publishing), cfg.gradient_steps

    # ----------------------------------------------------------------------------------------- loop
    waiting_for = "experience from the samplers"
    restart_how = "with the learner's current weights"

    def start_workers(self, stop_flag: StopFlag, logger: RunLogger) -> RoleGroup:
        make_sampler = partial(Sampler, self.spec, self.shared, self.weights)
        return self.start_roles(make_sampler, stop_flag, AHEAD[self.algo.data])

    def coordinate(self, pool: RoleGroup) -> Taken | None:
        """The next segment of any sampler (rollout), or a block of every sampler (replay: those that came
        wait in `pending` for the others); learned from, then the samplers may collect the next ones."""
        if self.algo.data == "replay":  # a block of every sampler
            deadline = time.monotonic() + WAIT_S
            for w, block in enumerate(self.pending):
                if block is None:
                    self.pending[w] = pool.get(w, max(0.0, deadline - time.monotonic()))
            items = [p for p in self.pending if p is not None]
            if len(items) < len(self.pending):
                return None
            self.pending = [None] * self.opts.workers
            metrics, updates = self.learn_blocks(items)
        else:  # the next segment of any sampler
            item = pool.get_any(WAIT_S)
            if item is None:
                return None
            items = [item]
            metrics, updates = self.learn_segment(item)
        for item in items:  # learned from: its sampler may collect the next one
            pool.release(item.worker, item.incarnation)
        return Taken([r for item in items for r in item.returns], metrics, updates)


# ------------------------------------------------------------------------------------------------- multi-agent
@dataclass
class MultiAgentWorkerSpec(WorkerSpec):
    """A sampler's spec on a PettingZoo env: the agents' spaces and the run's policy mapping besides."""

    agents: Any = field(default=None, kw_only=True)
    mapping: Any = field(default=None, kw_only=True)


class MultiAgentSampler:
    """A sampler on a PettingZoo env (a role as `Sampler` is one, without its vector env and algorithm): `n_envs`
    copies of the env, the run's policies tied to the learner's networks, and a `MultiAgentCollector` whose trained
    policies' transitions are sent as they came (each with its stream)."""

    def __init__(
        self,
        spec: MultiAgentWorkerSpec,
        shared: dict[str, torch.nn.Module],
        weights: WeightVersion,
        worker_id: int,
        incarnation: int = 0,
    ):
        seed = spec.worker_seed(worker_id, incarnation)
        torch.manual_seed(seed)
        algo_cls = resolve(spec.algo)[0]
        self.spec, self.worker_id, self.incarnation, self.weights = spec, worker_id, incarnation, weights
        self.algo = Policies(
            spec.agents,
            spec.mapping,
            lambda _, obs, act, s, lanes: algo_cls(dataclasses.replace(spec.algo_cfg, n_envs=lanes), obs, act, seed=s),
            seed,
            copies=spec.algo_cfg.n_envs,
        )
        self.copy = LocalCopy(self.algo, shared, share_frozen=False)  # type: ignore[arg-type]  # networks by name
        self.envs = AgentEnvs(make_agent_env(spec.env, **spec.env_kwargs) for _ in range(spec.algo_cfg.n_envs))
        self.logs = {name: TransitionLog() for name in self.algo.trained}
        self.collector = MultiAgentCollector(self.envs, self.algo, self.logs, seed)

    def produce(self, global_steps: int, stop: StopFlag | None = None) -> Experience | None:
        """`rollout_len` (rollout) or `train_freq` (replay) steps of every env copy with the current weights."""
        cfg, c = self.spec.algo_cfg, self.collector
        self.algo.schedule(global_steps, self.spec.total_steps)
        version = self.weights.read(self.copy.pull, stop)
        if version is None:
            return None
        before = c.env_steps
        for _ in range(cfg.rollout_len if self.algo.data == "rollout" else cfg.train_freq):
            c.step()
        data = {"transitions": {n: log.take() for n, log in self.logs.items()}, "agents": c.pop_agent_returns()}
        return Experience(self.worker_id, self.incarnation, version, c.env_steps - before, c.pop_new_returns(), data)

    def close(self) -> None:
        self.envs.close()


class MultiAgentDataParallelRunner(MultiAgentRunBase, ParallelRunner):
    """The learner of a `data_parallel` run on a PettingZoo env. Each sampler steps `n_envs` copies of the env with
    the run's policies and sends its trained policies' transitions, each with its stream (copy, agent); the
    learner's data of a policy has a column for each (sampler, copy, agent), so a segment (rollout) holds every
    sampler's agents, and a replay buffer's columns are theirs, as a `single` run with `workers × n_envs` env copies
    has them. The learner learns from whatever its data holds (`learn`): after each item on-policy (a segment is
    learned from once every lane has its steps), and after every `workers` items with replay, so that, as on `single`,
    one pass of `gradient_steps` updates follows every `train_freq` steps of all `workers × n_envs` copies. A sampler
    may collect its next item as soon as its last one is taken in."""

    arch = "data_parallel"
    Options = ParallelOptions
    waiting_for = "experience from the samplers"
    restart_how = "with the learner's current weights"

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        self.agent_spec = self.worker_spec(
            MultiAgentWorkerSpec, agents=self.env_info["agents"], mapping=self.algo.mapping
        )
        self.spec = self.agent_spec
        self.start_backend()
        self.data = self.policy_data(self.opts.workers * self.algo_cfg.n_envs)
        self.items_taken = 0  # replay learns after every `workers` of them
        self.incarnations: dict[int, int] = {}
        self.new_agent_returns: dict[str, list[float]] = {}
        if resume_from is not None:
            self._restore(resume_from)
        self.eval_envs = self.make_eval_envs()
        self._write_config({"workers": self.opts.workers})

    def check_config(self) -> None:
        super().check_config()
        self.check_parallel(on_policy_only=False, uses_optimizer=False)

    def start_workers(self, stop_flag: StopFlag, logger: RunLogger) -> RoleGroup:
        make_sampler = partial(MultiAgentSampler, self.agent_spec, self.shared, self.weights)
        return self.start_roles(make_sampler, stop_flag, AHEAD["rollout"])

    def coordinate(self, pool: RoleGroup) -> Taken | None:
        """The next item of any sampler: its transitions put into the learner's data, its sampler free to collect
        the next one, then whatever the data holds learned from."""
        item = pool.get_any(WAIT_S)
        if item is None:
            return None
        version = self.weights.version
        self.lags.append(version - item.version)
        self.counter.add(item.steps)
        self.count_returns(item.returns)
        for agent, returns in item.data["agents"].items():
            self.new_agent_returns.setdefault(agent, []).extend(returns)
        restarted = self.incarnations.setdefault(item.worker, item.incarnation) != item.incarnation
        self.incarnations[item.worker] = item.incarnation
        for name, transitions in item.data["transitions"].items():
            data = self.data[name]
            if restarted:  # the sampler's envs began new episodes: the streams it had under way end
                data.cut(lambda stream: isinstance(stream, tuple) and stream[0] == item.worker)
            for stream, transition in transitions:
                data.put((item.worker, stream), transition)
        pool.release(item.worker, item.incarnation)
        self.items_taken += 1
        if self.algo.data == "replay" and self.items_taken % self.opts.workers:
            return Taken(item.returns, {}, 0)  # a replay pass follows a block's worth from every sampler
        with self.publishing():
            self.algo.schedule(self.env_steps, self.total_steps)
            metrics, updates = self.learn(self.data)
        return Taken(item.returns, metrics, updates)

    def agent_returns(self) -> dict[str, list[float]]:
        out, self.new_agent_returns = self.new_agent_returns, {}
        return out

    def log_row(self) -> dict[str, float]:
        return {**ParallelRunner.log_row(self), **MultiAgentRunBase.log_row(self)}

    def _extra_state(self) -> dict[str, Any]:  # the replay is not saved, its sampling schedule (β) goes on
        schedules = {n: d.buffer.schedule_state() for n, d in self.data.items() if d.buffer is not None}
        return {"version": self.weights.version, "buffer_schedules": schedules}

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        self.weights.set(int(saved.get("version", 0)))
        for name, schedule in saved.get("buffer_schedules", {}).items():
            buffer = self.data[name].buffer if name in self.data else None
            if buffer is not None:
                buffer.load_schedule_state(schedule)

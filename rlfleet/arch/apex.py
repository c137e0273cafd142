"""`apex`: Ape-X (Horgan et al. 2018, "Distributed Prioritized Experience Replay") for dqn, ddpg and td3: many
actors with a ladder of exploration rates feed a sharded prioritized replay, one learner samples it.

Who sends what to whom::

    actor 0 (ε_0) ──┐  blocks of B n-step transitions,     ┌──────────────────┐  sample (prefetched)  ┌─────────┐
    actor 1 (ε_1) ──┼─ their initial priorities, the  ───▶│ replay shard 0   │ ◀───────────────────▶ │ learner │
      ...           │  weight version that acted          │ ...  shard S−1   │  new priorities       │ (coord- │
    actor N−1 ──────┘  (round-robin over the shards)      └──────────────────┘                       │ inator) │
        ▲  ▲ steps, returns, ε (one report per block)                                               └────┬────┘
        │  └────────────────────────────────────────────────────────────────────────────────────────────┤
        └─────────────── published weights (+ version), read every K env steps ◀─────────────────────────┘

- **Actors** (roles, `--actors N`): actor i has its own envs (the algorithm's `n_envs`) and algorithm object
  and a fixed rung of the ladder ε_i = ε^(1 + α·i/(N−1)) (`epsilon_ladder`; ε = 0.4, α = 7 as in the paper; one
  actor: ε), set by the algorithm's `fix_exploration`: dqn acts ε-greedily with ε_i; ddpg and td3 add their
  exploration noise (gaussian or ou) with σ_i = `exploration_noise` · ε_i / ε, so actor 0 explores as a
  single-process run and the others ever less (the warm-up of uniform random actions, `random_steps`, counts
  the run's env steps). It builds n-step transitions itself (`NStepBuilder`: the algorithm's `n_step` and
  `gamma`, cut at episode ends as the replay buffer cuts them), computes their initial priorities with its
  current weights by the algorithm's own TD computation (`priorities(batch)`: the |TD error| its `update`
  writes back), and sends blocks of `--block` (B) transitions with their priorities and the weight version
  that acted to the replay shards in turn. Every `--sync-every` (K) of its env steps it reads the newest
  published weights (target networks included). After each block it reports its steps and finished episodes
  to the learner.
- **Replay shards** (backend services, `--replay-shards S`): each a ring of `buffer_size / S` transitions
  (`ReplayShard`) whose priorities live in a `PriorityIndex` (rlfleet.data: the sum and min trees over
  priority^α that `PrioritizedReplayBuffer` uses): `add` (a block; past capacity the oldest rows are
  overwritten, so the newest data stays), `sample` (proportional, stratified, with the rows' p^α),
  `update_priorities`. Every `add` and `sample` answer carries the shard's state (`ShardState`: its size, its
  priority mass Σ p^α and its smallest p^α), so the learner holds a recent view of all shards without asking.
  Each stored row carries an id unique over the shard's incarnations; a priority update for a row that was
  overwritten (or lost with a dead shard) since it was sampled is dropped.
- **Learner** (the coordinator): samples each batch from a shard drawn in proportion to its priority mass (among
  those that hold a batch; its own seeded generator, so serial runs repeat), so that P(i) = p_i^α / Σ over all
  shards of p^α, as one replay would sample, and a restarted shard is sampled as little as it holds; weights
  w_i = (N·P(i))^−β / max_j w_j over the whole replay (N: all shards' transitions, the max from the smallest
  p^α of any shard). The next batch is asked for before the current one is learned from, so the learner does
  not wait on a round trip. It runs the algorithm's unchanged
  `update` (dqn: double, dueling, n-step, the target copy inside it; ddpg/td3: the critic loss weighted by the
  importance weights, the actor step, the Polyak targets), writes the new priorities back to the shard
  the batch came from, and publishes the weights with a version (one per update). β stays the algorithm's
  `beta` when its `beta_anneal` is off (the paper; the `apex` presets), else anneals to 1 over the run's steps.

Presets: on Atari envs (dqn) and MuJoCo envs (ddpg, td3) a run with no --preset picks the algorithm's `apex`
preset, the paper's settings (docs/architectures/apex.md lists them and what differs); elsewhere (CartPole,
Pendulum) the usual defaults or family preset.

Pacing (the default): the learner keeps the algorithm's replay ratio, `gradient_steps` updates
per `train_freq × n_envs` env steps taken in once `learning_starts` transitions are stored (the sample efficiency
of the single-process algorithm, whatever the number of actors and cores); an actor may run `AHEAD` blocks ahead
of what the learner has caught up with, and then waits. `--unpaced` is the paper's learner: it updates as
fast as it can (`gradient_steps` updates between looks at the actors' blocks) once the replay holds
`learning_starts` transitions, and every block's credit goes back at once, so actors never wait for it; how
often a transition is replayed then depends on the speeds of actors and learner (`charts/replay_add_rate`
against `charts/replay_sample_rate`).

Logged besides the usual: `charts/actor_sps` (env steps taken in per second), `charts/learner_ups` (updates
per second), `charts/replay_size` (over all shards), `charts/replay_add_rate` and `charts/replay_sample_rate`
(transitions per second sent to the shards and sampled by the learner), `charts/sample_staleness` (mean, and
`_max`: learner version minus the version that acted, over the transitions sampled since the last log line),
`charts/exploration_<i>` (ε or σ) and `charts/episodic_return_<i>` (mean since the last log line) per actor.

Checkpoints hold the learner (networks, optimizer, update count), the weight version and the counters; the
replay is NOT saved: a resumed run starts with empty shards, its actors (new seeds) refill them, and learning
resumes once `learning_starts` transitions are stored again. A dead actor is restarted like any role (its
next block acts with the newest weights). A dead replay shard, or a hung one (no answer to the learner's pings for
`--heartbeat-s`: killed), is reported in `workers.log` and restarted
empty: its data is gone, the run goes on with what the other shards hold (and what the actors send it next:
while no shard holds a batch, the actors send on whatever the learner owes);
calls cut short by its death are sent again to the new one. Actors blocked in a call to a hung shard are not
killed as hung themselves (their heartbeat is held while a shard does not answer); a Ctrl-C while the learner
waits on a hung shard stops the run as any Ctrl-C does. The shards' pids are in `<run>/shards.json`, the
actors' in `<run>/workers.json`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfleet.algos.contract import ApexActor
from rlfleet.arch.parallel import WAIT_S, ParallelRunner, Producer, RoleOptions, Taken, WorkerSpec
from rlfleet.backends import BACKENDS, Pending, RoleGroup, ServiceGroup, ServiceHandle
from rlfleet.backends.shared_memory import StopFlag, WeightVersion
from rlfleet.data.batch import Batch, map_obs, map_obs_pair
from rlfleet.data.priority import PriorityIndex, importance_weights
from rlfleet.data.returns import NStepBuilder
from rlfleet.device import host
from rlfleet.fields import MAX_ROLES, bounded
from rlfleet.run.config import ConfigError, RunConfig
from rlfleet.run.logger import RunLogger

AHEAD = 2  # blocks an actor may have sent beyond what the learner has caught up with
FIELDS = NStepBuilder.FIELDS
ID_SPAN = 1 << 40  # row ids of incarnation k of a shard are k · ID_SPAN + 0, 1, 2, ...


def epsilon_ladder(n: int, epsilon: float = 0.4, alpha: float = 7.0) -> list[float]:
    """ε_i = ε^(1 + α·i/(n−1)) for actors i = 0 .. n−1 (one actor: ε)."""
    if n < 1:
        raise ValueError(f"an epsilon ladder needs at least one actor, got {n}")
    if n == 1:
        return [float(epsilon)]
    return [float(epsilon ** (1 + alpha * i / (n - 1))) for i in range(n)]


@dataclass
class ShardState:
    """What a shard reports with every block added and batch sampled, so that the learner holds a recent view of
    all shards without asking for it: how many transitions it holds, their priority mass Σ p^α and their
    smallest p^α."""

    size: int
    mass: float
    min_mass: float
    """+inf while the shard is empty."""


EMPTY = ShardState(0, 0.0, float("inf"))


@dataclass
class SampledBatch:
    """What a shard sends the learner for one update."""

    shard: int
    data: dict[str, np.ndarray]
    """FIELDS (the learner adds `weight`, the importance weights over all shards)."""
    ids: np.ndarray
    """The rows' ids, for `update_priorities`."""
    versions: np.ndarray
    """The weight version that acted, per transition."""
    mass: np.ndarray
    """p^α of each sampled row."""
    state: ShardState
    """The shard when it was sampled."""


class ReplayShard:
    """One replay shard (a backend service): a ring of `capacity` n-step transitions whose proportional priorities
    live in a `PriorityIndex` (the sum and min trees `PrioritizedReplayBuffer` uses)."""

    def __init__(self, index: int, incarnation: int, capacity: int, alpha: float, eps: float = 1e-6, seed: int = 0):
        self.index, self.capacity = index, int(capacity)
        self.priority = PriorityIndex(self.capacity, alpha, eps)
        self.alpha, self.eps = self.priority.alpha, self.priority.eps
        self.rng = np.random.default_rng([seed, index, incarnation])
        self.storage: dict[str, np.ndarray] | None = None
        self.ids = np.full(self.capacity, -1, dtype=np.int64)
        self.versions = np.zeros(self.capacity, dtype=np.int64)
        self.next_id = incarnation * ID_SPAN
        self.ptr = 0
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def state(self) -> ShardState:
        """Its size, priority mass and smallest p^α."""
        return ShardState(self.size, self.priority.total(), self.priority.min())

    def add(self, block: dict[str, np.ndarray], priorities: np.ndarray, version: int) -> ShardState:
        """Store a block (FIELDS, equally long) with its initial priorities; past capacity the oldest rows go.
        Returns the shard's state after it."""
        n = len(block["rew"])
        keep = min(n, self.capacity)  # a block larger than the ring keeps its newest rows
        block = {key: map_obs(lambda v: np.asarray(v)[n - keep :], block[key]) for key in FIELDS}
        priorities = np.asarray(priorities).reshape(-1)
        if priorities.size != n:
            raise ValueError(f"{priorities.size} priorities for a block of {n} transitions")
        if self.storage is None:
            self.storage = {
                key: map_obs(lambda v: np.zeros((self.capacity, *v.shape[1:]), v.dtype), value)
                for key, value in block.items()
            }
        rows = (self.ptr + np.arange(n - keep, n)) % self.capacity  # id base + k sits in row k mod capacity

        def put(stored: np.ndarray, new: np.ndarray) -> None:
            stored[rows] = new

        for key in FIELDS:
            map_obs_pair(put, self.storage[key], block[key])  # Dict observations: entry by entry
        self.ids[rows] = self.next_id + np.arange(n - keep, n)
        self.next_id += n
        self.versions[rows] = version
        self.priority.set(rows, priorities[n - keep :])
        self.ptr = (self.ptr + n) % self.capacity
        self.size = min(self.size + keep, self.capacity)
        return self.state()

    def sample(self, batch_size: int) -> SampledBatch | None:
        """`batch_size` transitions drawn in proportion to priority^α (one per equal slice of the mass), with their
        p^α (the learner weighs them against the smallest p^α of all shards); None while the shard holds fewer
        than `batch_size`."""
        if self.size < max(batch_size, 1):
            return None
        rows = self.priority.draw(batch_size, self.rng)
        storage = self.storage
        assert storage is not None  # made by the first `add`: the shard holds transitions
        data = {key: map_obs(lambda v: v[rows], storage[key]) for key in FIELDS}
        return SampledBatch(
            self.index, data, self.ids[rows].copy(), self.versions[rows].copy(), self.priority[rows], self.state()
        )

    def update_priorities(self, ids: np.ndarray, priorities: np.ndarray) -> int:
        """New priorities of the rows sampled as `ids`; those overwritten since (or never here) are skipped.
        Returns how many were set."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        priorities = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if ids.size != priorities.size:
            raise ValueError(f"{priorities.size} priorities for {ids.size} ids")
        rows = ids - self.incarnation_base()
        live = (rows >= 0) & (ids < self.next_id)
        rows = np.where(live, rows % self.capacity, 0)
        live &= self.ids[rows] == ids
        if live.any():
            self.priority.set(rows[live], priorities[live])
        return int(live.sum())

    def incarnation_base(self) -> int:
        return (self.next_id // ID_SPAN) * ID_SPAN

    def priorities(self) -> np.ndarray:
        """priority^α of every row (0 where empty): for tests and diagnostics."""
        return self.priority[np.arange(self.capacity)]


class ShardMaker:
    """`make_service` of the replay shards (picklable)."""

    def __init__(self, capacity: int, alpha: float, seed: int):
        self.capacity, self.alpha, self.seed = capacity, alpha, seed

    def __call__(self, index: int, incarnation: int) -> ReplayShard:
        return ReplayShard(index, incarnation, self.capacity, self.alpha, seed=self.seed)


@dataclass
class ActorReport:
    """What an actor tells the learner after sending a block to a shard."""

    worker: int
    incarnation: int
    steps: int
    returns: list[float]
    exploration: float
    """The actor's fixed ε (dqn) or noise σ (ddpg, td3)."""
    shard: int
    state: ShardState
    """That shard after the block."""


class Actor(Producer):
    """One Ape-X actor: its own envs and algorithm object with a fixed exploration (its rung of the ladder); sends
    prioritized n-step blocks to the shards."""

    def __init__(
        self,
        spec: WorkerSpec,
        shared: dict[str, nn.Module],
        weights: WeightVersion,
        shards: list[ServiceHandle],
        epsilons: list[float],
        block: int,
        sync_every: int,
        worker_id: int,
        incarnation: int = 0,
    ):
        super().__init__(spec, shared, weights, worker_id, incarnation)
        self.shards = shards
        self.block = block
        self.sync_every = sync_every
        # fixed: ε for dqn (its schedule no longer moves it), noise σ = exploration_noise · ε_i / ε for ddpg, td3
        level, top = epsilons[worker_id], epsilons[0]
        self.exploration = self.algo.fix_exploration(level, level / top if top > 0 else 0.0)
        cfg = spec.algo_cfg
        self.builder = NStepBuilder(cfg.n_envs, cfg.n_step, cfg.gamma)
        self.version: int | None = None
        self.since_sync = 0
        self.next_shard = worker_id % len(shards)  # actors start on different shards

    def initial_priorities(self, block: dict[str, np.ndarray]) -> np.ndarray:
        """|n-step TD error| of each transition under the actor's current weights (the algorithm's own TD), computed
        as acting is: under inference mode, so a network of the user's own is in eval mode (Dropout off, BatchNorm
        with its running statistics, which it does not move) and no autograd graph is built."""
        batch = Batch({**block, "weight": np.ones(len(block["rew"]), np.float32)})
        with torch.inference_mode():
            priorities: np.ndarray = self.algo.priorities(batch)
        return priorities

    def produce(self, global_steps: int, stop: StopFlag | None = None) -> ActorReport | None:
        c = self.collector
        before = c.env_steps
        self.algo.schedule(global_steps, self.spec.total_steps)  # the run's warm-up of random actions (ddpg, td3)
        while len(self.builder) < self.block:
            if self.version is None or self.since_sync >= self.sync_every:
                version = self.weights.read(self.copy.pull, stop)
                if version is None:
                    return None
                self.version, self.since_sync = version, 0
            self.since_sync += c.collect(self.builder, n_step=c.n_envs)
        block = self.builder.take(self.block)
        priorities = self.initial_priorities(block)
        shard = self.next_shard
        self.next_shard = (shard + 1) % len(self.shards)
        state = self.shards[shard].call("add", block, priorities, self.version)
        return ActorReport(
            self.worker_id, self.incarnation, c.env_steps - before, c.pop_new_returns(), self.exploration, shard, state
        )


@dataclass
class ApexOptions(RoleOptions):
    """apex's options: the actors, each a role with its own envs (the algorithm's `n_envs`) and its own rung of
    the exploration ladder, the replay shards, and the backend's options."""

    actors: int = bounded(3, ge=1, le=MAX_ROLES)
    """N: actors, each a role with its own envs and its own rung of the exploration ladder. 3 by default: the
    smallest ladder with a middle rung (ε 0.4, 0.016, 0.00066); with 2 it is ε 0.4 and 0.00066, half the data
    near-greedy. Each actor is a process that steps its envs and computes priorities, so more actors than cores
    only share them: 3 keeps a 2-core machine busy without crowding the learner."""
    replay_shards: int = bounded(1, ge=1, le=MAX_ROLES)
    """Replay shards (services), each holding buffer_size / replay_shards transitions; actors send them blocks
    in turn, the learner samples each batch from one of them chosen in proportion to its priority mass."""
    block: int = bounded(50, ge=1)
    """B: n-step transitions an actor sends a shard at a time, with their initial priorities."""
    sync_every: int = bounded(400, ge=1)
    """K: env steps of an actor (over its envs) between reads of the newest published weights."""
    epsilon: float = bounded(0.4, ge=0, le=1)
    """ε of the exploration ladder ε_i = ε^(1 + α·i/(N−1)) (dqn's ε_i; ddpg and td3 scale their noise by ε_i / ε)."""
    epsilon_alpha: float = bounded(7.0, ge=0)
    """α of the exploration ladder (0: every actor explores with ε)."""
    unpaced: bool = False
    """The paper's learner: it updates as fast as it can once the replay holds learning_starts transitions, and
    actors never wait for it. Without it the learner keeps the algorithm's replay ratio (gradient_steps updates per
    train_freq × n_envs env steps) and an actor waits when it runs 2 blocks (`AHEAD`) ahead of it."""

    @property
    def workers(self) -> int:
        """The backend's name for the roles it starts: the actors."""
        return self.actors


class ApexRunner(ParallelRunner):
    """The learner of an `apex` run (see the module docstring)."""

    arch = "apex"
    Options = ApexOptions
    presets = {"atari": "apex", "mujoco": "apex"}  # the paper's settings where it ran: dqn on Atari, dpg on MuJoCo
    waiting_for = "block from the actors"
    restart_how = "with the learner's newest weights"

    switched_on = ("prioritized",)
    IDLE_SETTINGS = {
        "prioritized": "its replay is always prioritized, as in the paper (alpha and beta set it)",
        **dict.fromkeys(
            ("eps_start", "eps_final", "eps_anneal_steps"),
            "each actor keeps its own fixed epsilon (--epsilon, --epsilon-alpha)",
        ),
        "train_freq": "train_freq paces the learner, and --unpaced updates as fast as it can",
    }
    """Algorithm settings apex does not read (`train_freq` only with --unpaced): given, each is one `ConfigError`."""

    def check_config(self) -> None:
        self.check_parallel(on_policy_only=False, uses_optimizer=False)
        if not isinstance(self.algo, ApexActor):
            raise ConfigError(
                f"the apex architecture runs the replay algorithms that compute priorities (dqn, ddpg, td3); "
                f"{self.cfg.algo} is not one of them"
            )
        if self.algo.replays_sequences:
            raise ConfigError("apex replays single transitions: recurrent dqn (lstm > 0) is not supported; "
                              "use --arch single or data_parallel for it")  # fmt: skip
        if not BACKENDS[self.opts.backend].has_services:
            with_services = ", ".join(name for name, cls in BACKENDS.items() if cls.has_services)
            raise ConfigError(
                f"apex's replay shards are backend services, which the {self.opts.backend} backend does not "
                f"start; use --backend {with_services}"
            )
        if self.opts.actors == 1 and not self.resuming and (given := self.given_option(("epsilon_alpha",))):
            raise ConfigError(f"{given} has no effect with --actors 1: its ladder has one rung, --epsilon")
        for key, why in self.IDLE_SETTINGS.items():
            if key in self.cfg.overrides and (key != "train_freq" or self.opts.unpaced) and not self.resuming:
                raise ConfigError(f"--set {key}={self.cfg.overrides[key]} has no effect on --arch apex: {why}")
        size, batch = self.algo_cfg.buffer_size, self.algo_cfg.batch_size
        if size < batch:
            raise ConfigError(f"{self.cfg.algo} config buffer_size={size} holds fewer transitions than a batch "
                              f"(batch_size={batch}): set buffer_size >= {batch}")  # fmt: skip
        if size // self.opts.replay_shards < batch:
            raise ConfigError(
                f"--replay-shards {self.opts.replay_shards} leaves {size // self.opts.replay_shards} transitions per "
                f"shard, fewer than a batch ({batch}); use 1 to {size // batch}"
            )
        held, starts = size // self.opts.replay_shards * self.opts.replay_shards, self.algo_cfg.learning_starts
        if starts > held:  # the shards' rings round buffer_size down to a multiple of the shard count
            raise ConfigError(
                f"--replay-shards {self.opts.replay_shards} hold {held} transitions in all (buffer_size={size} split "
                f"evenly), fewer than learning_starts={starts}, so the run would never update: set learning_starts "
                f"<= {held} or buffer_size >= {-(-starts // self.opts.replay_shards) * self.opts.replay_shards}"
            )
        if self.opts.block > self.total_steps:  # the step count grows a block at a time: one block would overshoot
            raise ConfigError(
                f"--block {self.opts.block} is more than the run's {self.total_steps} steps (the run counts steps as "
                f"blocks arrive, so it would run at least {self.opts.block}); use --block 1 to {self.total_steps}"
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
        self.start_backend()  # the counter: env steps of the blocks taken in
        acfg = self.algo_cfg
        self.epsilons = epsilon_ladder(self.opts.actors, self.opts.epsilon, self.opts.epsilon_alpha)
        self.ratio = acfg.gradient_steps / (acfg.train_freq * acfg.n_envs)  # updates per env step
        self.shard_maker = ShardMaker(acfg.buffer_size // self.opts.replay_shards, acfg.alpha, cfg.seed)
        self.services: ServiceGroup | None = None
        self.logger: RunLogger | None = None
        self.shard_states = [EMPTY] * self.opts.replay_shards  # the learner's view, from the shards' reports
        self.choice_rng = np.random.default_rng([cfg.seed, 0xA9E])  # the shard of each batch
        self.ready_at: int | None = None  # env steps when the replay first held learning_starts transitions
        self.learned = 0  # updates since then
        self.starved = False  # the last pass owed updates but no shard held a batch (one restarted empty)
        self.held: list[ActorReport] = []  # blocks taken in whose credit waits for the learner to catch up
        self.prefetch: Pending | None = None
        self.writes: list[list[Pending]] = [[] for _ in range(self.opts.replay_shards)]
        self.staleness: list[float] = []
        self.actor_returns: list[list[float]] = [[] for _ in range(self.opts.actors)]  # since the last log line
        self.exploration: dict[int, float] = {}  # each actor's ε or σ, as it reported it
        self.added = 0  # transitions sent to the shards
        self.sampled = 0  # transitions the learner sampled
        self.last_rates = (time.perf_counter(), 0, 0, 0, 0)
        if resume_from is not None:
            self._restore(resume_from)
        self.eval_envs = self.make_eval_envs()
        self._write_config(
            {
                "actors": self.opts.actors,
                "replay_shards": self.opts.replay_shards,
                "epsilons": self.epsilons,
                "ahead": AHEAD,
                "unpaced": self.opts.unpaced,
            }
        )

    def _extra_state(self) -> dict[str, Any]:
        return {"version": self.weights.version}

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        self.weights.set(int(saved.get("version", 0)))

    # ----------------------------------------------------------------------------------------- shards
    def wait(self, pending: Pending) -> Any:
        """A shard's answer; shards that die (or hang: no answer for --heartbeat-s) meanwhile are restarted (the
        learner is who restarts them); a stop request ends the wait (`wait_service`)."""
        return self.wait_service(pending, self.restart_crashed_shards)

    def restart_crashed_shards(self) -> None:
        assert self.services is not None  # started with the actors
        for crash in self.services.check():
            lost = self.shard_states[crash.worker].size
            self.shard_states[crash.worker] = EMPTY
            self._report(f"{crash.describe()}\nrestarting it empty: its {lost} transitions are lost, the run goes on")
            if self.logger is not None:
                self.logger.log(self.env_steps, {"charts/replay_shard_restarts": self.services.restarts})

    @property
    def sizes(self) -> list[int]:
        """Transitions each shard holds (as last reported)."""
        return [state.size for state in self.shard_states]

    def beta(self) -> float:
        """Importance-sampling exponent: the algorithm's `beta`, fixed if its `beta_anneal` is off (the paper's, and
        the `apex` preset's), else annealed to 1 at the end of the budget."""
        start: float = self.algo_cfg.beta
        if not self.algo_cfg.beta_anneal:
            return start
        return start + (1.0 - start) * min(1.0, self.env_steps / max(1, self.total_steps))

    def choose_shard(self) -> int | None:
        """The shard of the next batch, drawn in proportion to the priority masses Σ p^α the shards last reported
        (among those that hold a batch), so that a transition is sampled in proportion to its priority over the
        whole replay; None while none holds a batch."""
        batch = self.algo_cfg.batch_size
        mass = np.array([s.mass if s.size >= batch else 0.0 for s in self.shard_states])
        if not (mass > 0).any():
            return None
        return int(self.choice_rng.choice(len(mass), p=mass / mass.sum()))

    def _ask(self) -> Pending | None:
        """Ask a shard chosen in proportion to its priority mass for a batch."""
        shard = self.choose_shard()
        if shard is None:
            return None
        assert self.services is not None  # started with the actors
        return self.services.handles[shard].submit("sample", self.algo_cfg.batch_size)

    def weigh(self, sampled: SampledBatch) -> None:
        """The batch's importance weights over the whole replay: w_i = (N·P(i))^−β / max_j (N·P(j))^−β with N the
        transitions of all shards, P(i) = p_i^α / Σ over all shards of p^α and max_j over all of them (the smallest
        p^α of any shard, as last reported; its own shard's is fresh, so no weight exceeds 1)."""
        min_mass = min(state.min_mass for state in self.shard_states)
        sampled.data["weight"] = importance_weights(sampled.mass, min_mass, self.beta())

    def next_batch(self) -> SampledBatch | None:
        """The batch asked for last time (or now), once the next one has been asked for."""
        for _ in range(len(self.shard_states)):
            pending = self.prefetch if self.prefetch is not None else self._ask()
            self.prefetch = None
            if pending is None:
                return None
            sampled: SampledBatch | None = self.wait(pending)
            if sampled is None:  # the shard had too little (restarted empty meanwhile): try the next
                continue
            self.shard_states[sampled.shard] = sampled.state
            self.weigh(sampled)
            for write in self.writes[sampled.shard]:  # their answers (the prefetched batch was drawn without them)
                self.wait(write)
            self.writes[sampled.shard] = []
            self.prefetch = self._ask()
            return sampled
        return None

    # ----------------------------------------------------------------------------------------- learning
    def take_in(self, report: ActorReport) -> None:
        self.counter.add(report.steps)
        self.count_returns(report.returns)
        self.shard_states[report.shard] = report.state
        self.actor_returns[report.worker] += report.returns
        self.exploration[report.worker] = report.exploration
        self.added += self.opts.block

    def ready(self) -> bool:
        """Whether the replay has held `learning_starts` transitions (and a batch), from which point on it learns."""
        if self.ready_at is None and sum(self.sizes) >= max(self.algo_cfg.learning_starts, self.algo_cfg.batch_size):
            self.ready_at = self.env_steps
        return self.ready_at is not None

    def due(self) -> int:
        """Updates the learner owes for the steps taken in (0 before the replay holds `learning_starts`)."""
        if not self.ready():
            return 0
        assert self.ready_at is not None  # `ready` said so
        return int((self.env_steps - self.ready_at) * self.ratio) - self.learned

    def learn(self, n: int) -> tuple[dict[str, float], int]:
        """Up to `n` updates, each on a batch of the next shard; `starved` if the shards had too little."""
        metrics: dict[str, float] = {}
        done = 0
        self.starved = False
        for _ in range(n):
            sampled = self.next_batch()
            if sampled is None:  # no shard holds a batch: the actors must refill them
                self.starved = True
                break
            with self.publishing():
                out = self.algo.update(Batch(sampled.data))
            priorities = host(out.pop("priorities"))  # read once the step is queued: they cross to the shard
            out.pop("epsilon", None)  # the learner does not act: the actors' exploration is logged apart
            assert self.services is not None  # it sampled them
            handle = self.services.handles[sampled.shard]
            self.writes[sampled.shard].append(handle.submit("update_priorities", sampled.ids, priorities))
            self.staleness.extend((self.weights.version - 1 - sampled.versions).tolist())
            metrics = out
            done += 1
            self.sampled += len(sampled.ids)
        self.learned += done
        return metrics, done

    # ----------------------------------------------------------------------------------------- loop
    def start_workers(self, stop_flag: StopFlag, logger: RunLogger) -> RoleGroup:
        """The replay shards first (their restarts are logged to `logger`), then the actors, which call them."""
        self.logger = logger
        self.services = self.start_services(
            self.shard_maker, self.opts.replay_shards, pids_file=self.run_dir / "shards.json", name="replay shard"
        )
        make_actor = partial(
            Actor,
            self.spec,
            self.shared,
            self.weights,
            self.services.handles,
            self.epsilons,
            self.opts.block,
            self.opts.sync_every,
        )
        return self.start_roles(make_actor, stop_flag, AHEAD, services=self.services)

    def coordinate(self, pool: RoleGroup) -> Taken | None:
        """Take in the actors' reports that came (up to `AHEAD` per actor) if the learner has caught up, learn what
        is due (at most `gradient_steps` updates a pass), and give the actors their credits back once the learner has
        caught up with the steps taken in (or cannot: no shard holds a batch, after a shard lost its data).
        Unpaced (the paper's learner): take in every report that came, waiting for one only while the replay cannot
        be learned from, give each credit back at once, then make `gradient_steps` updates once the replay is ready."""
        unpaced, steps = self.opts.unpaced, self.algo_cfg.gradient_steps
        learning = unpaced and self.ready() and not self.starved  # unpaced and learning: never wait for blocks
        caught_up = unpaced or self.due() <= 0 or self.starved
        limit = self.opts.actors * AHEAD if caught_up else 0  # paced and behind: learn first (the blocks wait)
        returns: list[float] = []
        taken = 0
        while taken < limit:
            report = pool.get_any(0.0 if learning else WAIT_S if taken == 0 else 0.001)
            if report is None:
                break
            self.take_in(report)
            if unpaced:
                pool.release(report.worker, report.incarnation)
            else:
                self.held.append(report)
            returns += report.returns
            taken += 1
        due = (steps if self.ready() else 0) if unpaced else min(max(self.due(), 0), steps)
        metrics, updates = self.learn(due)
        if self.due() <= 0 or self.starved:  # (unpaced: nothing is held)
            for report in self.held:
                pool.release(report.worker, report.incarnation)
            self.held = []
        if taken == 0 and updates == 0:
            return None
        return Taken(returns, metrics, updates)

    def budget_spent(self) -> bool:
        """The budget of env steps is taken in and, paced, the learner has made the updates it owes for them (the
        last pass took in up to `actors × AHEAD` blocks but made at most `gradient_steps` updates), so the final
        evaluation and checkpoint are of a learner at the replay ratio; or it cannot (no shard holds a batch)."""
        return super().budget_spent() and (self.opts.unpaced or self.due() <= 0 or self.starved)

    def log_row(self) -> dict[str, float]:
        """The rates, replay size, exploration, returns and staleness since the last row."""
        now = time.perf_counter()
        last_time, last_steps, last_updates, last_added, last_sampled = self.last_rates
        elapsed = max(now - last_time, 1e-9)
        row = {
            "charts/actor_sps": (self.env_steps - last_steps) / elapsed,
            "charts/learner_ups": (self.state["updates"] - last_updates) / elapsed,
            "charts/replay_add_rate": (self.added - last_added) / elapsed,
            "charts/replay_sample_rate": (self.sampled - last_sampled) / elapsed,
            "charts/replay_size": float(sum(self.sizes)),
            **{f"charts/exploration_{i}": x for i, x in sorted(self.exploration.items())},
        }
        for i, returns in enumerate(self.actor_returns):
            if returns:
                row[f"charts/episodic_return_{i}"] = float(np.mean(returns))
                returns.clear()
        if self.staleness:
            row["charts/sample_staleness"] = float(np.mean(self.staleness))
            row["charts/sample_staleness_max"] = float(max(self.staleness))
            self.staleness = []
        self.last_rates = (now, self.env_steps, self.state["updates"], self.added, self.sampled)
        return super().log_row() | row

    def restart_crashed(self, pool: RoleGroup, logger: RunLogger, how: str) -> None:
        """The crashed actors, then the crashed shards."""
        super().restart_crashed(pool, logger, how)
        self.restart_crashed_shards()

    def wind_down(self, stop_flag: StopFlag, pool: RoleGroup) -> None:
        self.stop_roles(stop_flag, pool, self.services)

    def shut_down(self, stop_flag: StopFlag, pool: RoleGroup | None) -> None:
        self.stop_roles(stop_flag, pool, self.services)

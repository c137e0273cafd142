"""`gossip`: K learners that average their parameters with their neighbours' (GALA on one machine, PALA across
machines; Assran et al. 2019, Sun et al. 2023).

Every learner is a complete on-policy agent: its own vector env, its own algorithm object and the algorithm's
own optimizer (RMSProp for A2C, as in the papers), its own update. After every update, learner i posts its
parameters x_i to its out-neighbours and averages with what its in-neighbours posted (that round's messages, or
in GALA's order the newest that have arrived):
x_i ← P_ii x_i + Σ_j P_ij m_j, which for the graphs here is x_i ← (x_i + Σ_j m_j) / (1 + |in_i|). Who sends
what to whom (the directed ring, `--peers 1`)::

       ┌──────────────┐  x_0   ┌──────────────┐  x_1   ┌──────────────┐  x_2   ┌──────────────┐
    ┌─▶│  learner 0   │───────▶│  learner 1   │───────▶│  learner 2   │───────▶│  learner 3   │──┐
    │  │ envs, A2C,   │        │ envs, A2C,   │        │ envs, A2C,   │        │ envs, A2C,   │  │
    │  │ RMSProp      │        │ RMSProp      │        │ RMSProp      │        │ RMSProp      │  │
    │  └──────┬───────┘        └──────┬───────┘        └──────┬───────┘        └──────┬───────┘  │
    │         └───── steps, returns, metrics, timings; every `state_every` rounds ────┘          │
    │                 its parameters and optimizer state ▼                                       │
    │  ┌───────────────────────────────────────────────────────────────────────────────────────┐ │
    │  │ coordinator: counts steps, logs per learner, consensus distance of each complete round,│ │
    │  │ evaluates the averaged model x̄, checkpoints every learner; restarts a dead one         │ │
    │  └───────────────────────────────────────────────────────────────────────────────────────┘ │
    └────────────────────────────────────────────── x_3 ─────────────────────────────────────────┘

The graph comes from a mixing matrix P (doubly stochastic, its graph strongly connected, each learner keeping a
share of its own parameters; `check_mixing`): the directed ring (learner i sends to i+1, ..., i+peers),
GALA's time-varying exponential graph (in round t learner i sends to i + 2^e for `peers` exponents e taken in
turn from 0, ..., ⌈log2 K⌉ − 1: with K a power of two, log2 K rounds of it average exactly), or a K×K matrix
from a file (a [T, K, K] `.npy` array: T matrices used in turn).

Two orders of posts and reads (`--gossip-order`; `auto`: GALA's on the `local` and `serial` backends, one
machine as in GALA's code, PALA's on `ray`, a cluster as in PALA):

- **GALA's** (Assran et al. 2019, Algorithm 1 and its released code): nobody waits for a slow neighbour. A
  learner posts every round without waiting for its readers (a slot holds the sender's newest message), and
  mixes its in-neighbours' newest messages when each of them has posted one it has not read yet, whatever its
  round; when one has not, it mixes nothing that round (rather than a message twice). It waits only for an
  in-neighbour more than `--max-staleness` R rounds behind its own (GALA's `--sync-freq`, the bounded delay of
  its convergence conditions): a mixed message is at most R rounds old. No cycle of waits can form: a learner
  waits only for one strictly behind it.
- **PALA's** (Sun et al. 2023): every round's own messages. A learner averages round t only once every
  in-neighbour has posted round t, and posts round t only once its out-neighbours of round t−1 have read round
  t−1 (so a slot holds one round's message until all its readers have it): exactly x ← P x, round by round.

The mailboxes (`Mailboxes`, from the backend: shared memory for the `local` and `serial` backends; a mailbox
actor and the object store for `ray`, PALA's data proxy) hold one slot per learner and the rounds read; a
learner that has to wait sleeps on its doorbell (a semaphore, or an asyncio event, its peers ring), never in a
busy spin. A learner that waits `--gossip-timeout-s` for one round reports the peers it waits for, by number,
and the run ends with that error (`GossipTimeout`) instead of hanging.

A learner's `produce` is a small state machine (learn, post, gather) that returns after a completed round, or
after waiting one slice (`WAIT_SLICE_S`; none where roles run in the coordinator's process, the `serial`
backend, where learners take turns), so it beats and sees the stop flag.

A learner that dies is reported and restarted (the backend's restart). In GALA's order nobody waits for its
reads: its next incarnation takes the average of what its in-neighbours' slots hold (`Mailboxes.peek`, with a
fresh optimizer) and rejoins past the newest round anyone posted, so nobody waits for it either. In PALA's order
its next incarnation finds in the mailboxes the last round it posted (w): it reads what is left of round w (its
in-neighbours wait for that), takes as its parameters the average of what its in-neighbours' slots hold now
(`Mailboxes.peek`, with a fresh optimizer), and goes on as any learner from round w+1: posts them, gathers,
learns. It never waits for a message its neighbours could not send, so neighbours restarted together cannot wait
for each other, and its neighbours never wait for a round that will not come.

Learners send their flat parameters and their state (networks and optimizer) every `state_every` rounds. The
coordinator averages each round that all K learners sent (the averaged model x̄, which it evaluates and
publishes), logs its consensus distance (1/K) Σ_i ‖x_i − x̄‖, and keeps every learner's latest state for the
checkpoint, from which `--resume` restarts every learner as it was.
"""

from __future__ import annotations

import io
import math
import os
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from rlfleet.arch.parallel import WAIT_S, ParallelRunner, RoleOptions, Taken, WorkerActor, WorkerSpec
from rlfleet.arch.shared import algo_modules, from_bytes, load_state, pack_state, to_bytes, trainable_params
from rlfleet.backends import BACKENDS, RoleGroup, RunFailure
from rlfleet.backends.mailboxes import Mailboxes, MailboxesReset
from rlfleet.backends.shared_memory import StopFlag
from rlfleet.device import read_metrics
from rlfleet.fields import MAX_ROLES, bounded, checked, one_of
from rlfleet.run.config import ConfigError, RunConfig
from rlfleet.run.logger import RunLogger

AHEAD = 2  # items a learner may have sent beyond those the coordinator has taken in
WAIT_SLICE_S = 1.0  # the longest a learner waits for its peers in one produce call (then an empty item)
TOPOLOGIES = ("ring", "exp")
ORDERS = ("auto", "gala", "pala")


class GossipTimeout(RunFailure):
    """A learner waited longer than --gossip-timeout-s for a peer: the peer is missing."""


# --------------------------------------------------------------------------------------------------- topology
def ring_matrix(n: int, peers: int = 1) -> np.ndarray:
    """The directed k-peer ring: learner i sends to i+1, ..., i+peers (mod n) and averages itself with what
    i-1, ..., i-peers sent, all with the weight 1/(1 + peers)."""
    p = np.eye(n)
    for i in range(n):
        for d in range(1, peers + 1):
            p[i, (i - d) % n] = 1.0
    mixing: np.ndarray = p / p.sum(axis=1, keepdims=True)
    return mixing


def exponential_matrices(n: int, peers: int = 1) -> list[np.ndarray]:
    """GALA's time-varying directed exponential graph: hops 1, 2, 4, ... below n; in round t learner i sends to
    i + hop for `peers` hops taken in turn (t·peers, ..., t·peers + peers − 1, mod the number of hops). One matrix
    per round of the period."""
    hops = [2**e for e in range(math.ceil(math.log2(n)))] if n > 1 else []
    if not hops:
        return [np.eye(n)]
    period = len(hops) // math.gcd(len(hops), peers)
    matrices = []
    for t in range(period):
        p = np.eye(n)
        for j in range(peers):
            hop = hops[(t * peers + j) % len(hops)]
            for i in range(n):
                p[i, (i - hop) % n] = 1.0
        matrices.append(p / p.sum(axis=1, keepdims=True))
    return matrices


def check_mixing(matrices: list[np.ndarray], n: int, where: str = "the mixing matrix") -> None:
    """A one-line `ConfigError` unless every matrix is n×n, finite, non-negative and doubly stochastic (each row
    and each column sums to 1) with a positive diagonal (each learner keeps a share of its own parameters), and the
    graph of the period (j → i where some P_ij > 0) is strongly connected (every learner's parameters reach every
    other).

    Why columns too: with rows summing to 1 only, gossip still reaches consensus, but on a weighted average of the
    learners' parameters whose weights are the left Perron vector of P (measured: 0.2/0.4/0.4 for one 3×3
    matrix), so some learners' data count less than others'. Doubly stochastic matrices keep the plain average,
    as the papers' analyses assume; the ring, k-peer ring and exponential graph are."""
    if not matrices:
        raise ConfigError(f"{where} holds no rounds; it needs at least one {n}×{n} matrix")
    for t, p in enumerate(matrices):
        label = where if len(matrices) == 1 else f"{where} (round {t} of {len(matrices)})"
        if p.shape != (n, n):
            raise ConfigError(f"{label} is {'×'.join(map(str, p.shape))}; it must be {n}×{n} (one row per learner)")
        if not np.all(np.isfinite(p)) or (p < 0).any():
            raise ConfigError(f"{label} has a negative or non-finite entry; mixing weights must be >= 0")
        sums = p.sum(axis=1)
        bad = np.flatnonzero(np.abs(sums - 1.0) > 1e-6)
        if bad.size:
            i = int(bad[0])
            raise ConfigError(f"{label}: row {i} sums to {sums[i]:g}; every row must sum to 1 (row-stochastic)")
        columns = p.sum(axis=0)
        bad = np.flatnonzero(np.abs(columns - 1.0) > 1e-6)
        if bad.size:
            j = int(bad[0])
            raise ConfigError(
                f"{label}: column {j} sums to {columns[j]:g}; every column must sum to 1 too (doubly stochastic), or "
                f"consensus is a weighted average in which learner {j}'s parameters count "
                f"{'more' if columns[j] > 1 else 'less'} than the others'"
            )
        zero = np.flatnonzero(np.diag(p) <= 0)
        if zero.size:
            i = int(zero[0])
            raise ConfigError(f"{label}: entry [{i}, {i}] is 0; every learner must keep a share of its own parameters")
    # Strongly connected: learner 0's parameters reach every learner (edges[i, j] > 0: i hears from j). For doubly
    # stochastic matrices that is enough: one that is reducible splits into blocks that never talk either way.
    edges = np.sum([p > 0 for p in matrices], axis=0)
    seen, todo = {0}, [0]
    while todo:
        j = todo.pop()
        for i in map(int, np.flatnonzero(edges[:, j] > 0)):
            if i not in seen:
                seen.add(i)
                todo.append(i)
    if len(seen) < n:
        other = min(set(range(n)) - seen)
        raise ConfigError(
            f"{where}: the graph is not strongly connected (learner 0's parameters never reach learner {other}, "
            "not even through others)"
        )


def load_matrices(path: str) -> list[np.ndarray]:
    """Mixing matrices from a file: `.npy` ([K, K] or [T, K, K]) or text (one row per line, spaces or commas); a
    file that cannot be read, holds anything but real numbers or holds no matrix is a one-line `ConfigError`."""
    if not os.path.isfile(path):
        raise ConfigError(f"--topology {path!r} is neither {' nor '.join(TOPOLOGIES)} nor a mixing-matrix file")
    try:
        data = np.load(path) if path.endswith(".npy") else _read_text_matrix(path)
    except (ValueError, OSError, EOFError) as exc:
        detail = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        raise ConfigError(f"cannot read the mixing matrix in {path}: {detail}") from None
    if not isinstance(data, np.ndarray):  # np.load opens an .npz archive, whatever the file's name
        data.close()
        raise ConfigError(f"the mixing matrix in {path} is an .npz archive; it must be one array saved with np.save")
    if data.dtype.kind not in "biuf":  # text, complex numbers
        raise ConfigError(f"the mixing matrix in {path} holds {data.dtype} entries; mixing weights are real numbers")
    data = data.astype(np.float64)
    if data.ndim not in (2, 3):
        raise ConfigError(f"the mixing matrix in {path} has {data.ndim} dimensions; it must be [K, K] or [T, K, K]")
    if data.size == 0:
        shape = "×".join(map(str, data.shape))
        raise ConfigError(f"the mixing matrix in {path} is empty ({shape}); it needs at least one round of K×K weights")
    return [data] if data.ndim == 2 else list(data)


def _read_text_matrix(path: str) -> np.ndarray:
    """The rows of a text matrix (spaces or commas between entries); [0, 0] for a file without any, which
    `load_matrices` refuses in its own words (numpy would warn about the empty input on the terminal)."""
    with open(path) as f:
        text = f.read()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "loadtxt: input contained no data" (comments only)
        data = np.loadtxt(io.StringIO(text), delimiter="," if "," in text else None, ndmin=2)
    return data if data.size else np.zeros((0, 0))


@dataclass(frozen=True)
class Topology:
    """The mixing matrices of a run, used in turn (round t uses matrices[t mod period])."""

    matrices: tuple[np.ndarray, ...]

    @classmethod
    def make(cls, name: str, n: int, peers: int = 1) -> Topology:
        """`ring` or `exp` with `peers` peers per round, or the matrices in the file `name`; checked."""
        if name == "ring":
            if peers > max(n - 1, 1):  # one learner has no peer; its default --peers 1 is let pass
                raise ConfigError(f"--peers {peers} needs at least {peers + 1} learners in a ring; got --learners {n}")
            matrices = [ring_matrix(n, min(peers, n - 1))]
            where = f"the {peers}-peer ring's mixing matrix"
        elif name == "exp":
            hops = math.ceil(math.log2(n)) if n > 1 else 0
            if peers > max(hops, 1):
                if n == 1:
                    raise ConfigError(f"--peers {peers}: one learner has no peers; use --learners {peers + 1} or more")
                steps = ", ".join(str(2**e) for e in range(hops))
                use = "--peers 1" if hops == 1 else f"--peers 1 to {hops}"
                raise ConfigError(f"--peers {peers} is more than the exponential graph of {n} learners has ({hops} "
                                  f"hop{'s' * (hops > 1)}: {steps}); use {use}")  # fmt: skip
            matrices = exponential_matrices(n, peers)
            where = "the exponential graph's mixing matrix"
        else:
            if peers != 1:
                raise ConfigError(f"--peers is an option of --topology {' and '.join(TOPOLOGIES)}, not of a file")
            matrices = load_matrices(name)
            where = f"the mixing matrix in {name}"
        check_mixing(matrices, n, where)
        return cls(tuple(matrices))

    @property
    def n(self) -> int:
        return len(self.matrices[0])

    def matrix(self, round_: int) -> np.ndarray:
        return self.matrices[round_ % len(self.matrices)]

    def in_peers(self, i: int, round_: int) -> list[int]:
        """The learners whose round-`round_` messages learner i averages with."""
        row = self.matrix(round_)[i]
        return [j for j in range(self.n) if j != i and row[j] > 0]

    def out_peers(self, i: int, round_: int) -> list[int]:
        """The learners that read learner i's round-`round_` message."""
        col = self.matrix(round_)[:, i]
        return [j for j in range(self.n) if j != i and col[j] > 0]

    def any_round_readers(self, i: int) -> list[int]:
        """The learners that read learner i's messages in some round of the period: in GALA's order, a learner may
        wait at round t for i's message of an earlier round, which i posted to that round's out-peers alone."""
        return sorted({j for t in range(len(self.matrices)) for j in self.out_peers(i, t)})

    def rate(self) -> float:
        """The rate per round at which gossip alone (no learning) shrinks the distance to consensus: the
        second-largest eigenvalue modulus of one period's product, to the power 1/period."""
        if self.n == 1:
            return 0.0
        product = np.eye(self.n)
        for p in self.matrices:
            product = p @ product
        moduli = np.sort(np.abs(np.linalg.eigvals(product)))[::-1]
        return math.pow(float(moduli[1]), 1.0 / len(self.matrices))


def consensus_distance(params: np.ndarray) -> float:
    """(1/K) Σ_i ‖x_i − x̄‖ of K flat parameter vectors [K, n]."""
    return float(np.linalg.norm(params - params.mean(axis=0), axis=1).mean())


# --------------------------------------------------------------------------------------------------- learners
@dataclass
class GossipSpec(WorkerSpec):
    """A learner's `WorkerSpec`, and what it gossips with."""

    topology: Topology = field(kw_only=True)
    initial_states: list[bytes] = field(default_factory=list, kw_only=True)
    """Each learner's `pack_state` (networks and optimizer) to start from."""
    start_round: int = field(default=0, kw_only=True)
    """The first round (a resumed run goes on from where it stopped)."""
    gossip_timeout_s: float = field(default=300.0, kw_only=True)
    state_every: int = field(default=10, kw_only=True)
    order: str = field(default="pala", kw_only=True)
    """"gala" (senders never wait, readers mix what has arrived, waiting only for a peer more than
    `max_staleness` rounds behind) or "pala" (every round's own messages; see the module docstring)."""
    max_staleness: int = field(default=0, kw_only=True)
    wait_slice_s: float = field(default=WAIT_SLICE_S, kw_only=True)
    """The longest one produce call waits for peers (0 where roles run in the coordinator's process)."""


@dataclass
class GossipReport:
    """A learner's item: the steps and episodes since its last item and, after a completed round, its metrics."""

    worker: int
    incarnation: int
    steps: int
    returns: list[float]
    compute_s: float
    """Seconds spent collecting and updating since the last item."""
    wait_s: float
    """Seconds spent waiting for peers."""
    average_s: float
    """Seconds spent posting, taking and averaging parameters."""
    skipped: int = 0
    """Rounds since the last item that mixed nothing (GALA's order: an in-neighbour had no new message)."""
    staleness: int = 0
    """Σ over the messages mixed since the last item of how many rounds each was behind the reader's round."""
    mixed: int = 0
    """Messages mixed since the last item."""
    stalest: int = 0
    """The most rounds one of those messages was behind the reader's round."""
    round: int | None = None
    """The round completed with this item (None: still waiting for peers)."""
    metrics: dict[str, float] = field(default_factory=dict)
    params: np.ndarray | None = None
    """The flat parameters after the round's averaging (every `state_every` rounds)."""
    state: bytes | None = None
    """`pack_state` of the learner after the round (with `params`)."""
    note: str | None = None
    trouble: str | None = None
    """Why the learner gave up waiting (`GossipTimeout`)."""
    generation: int = 0
    """The mailboxes' generation its round belongs to (`Mailboxes.generation`: a round of an earlier one is not
    averaged with those of the mailboxes restarted since)."""


class Timings(TypedDict):
    """A learner's seconds since its last item, as `GossipReport` sends them."""

    compute_s: float
    wait_s: float
    average_s: float


class Counts(TypedDict):
    """A learner's counts of messages since its last item, as `GossipReport` sends them."""

    skipped: int
    staleness: int
    mixed: int
    stalest: int


def flat_params(params: list[nn.Parameter]) -> torch.Tensor:
    """The parameters as one flat CPU tensor (what gossips: messages cross processes and machines in host memory,
    wherever the learner learns)."""
    return parameters_to_vector(params).detach().cpu()


@torch.no_grad()
def load_flat(params: list[nn.Parameter], flat: torch.Tensor) -> None:
    """Copy a flat vector into the parameters, in order (moved to their device first, in one copy)."""
    flat = flat.to(params[0].device) if params else flat
    offset = 0
    for p in params:
        p.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


class GossipLearner(WorkerActor):
    """One learner: its own envs, algorithm and optimizer; after every update a round of gossip (see the module
    docstring). `produce` runs its phases (learn, post, gather; after a restart: drain, post, gather) until a
    round completes or it has waited one slice."""

    spec: GossipSpec

    def __init__(self, spec: GossipSpec, mailboxes: Mailboxes, worker_id: int, incarnation: int = 0):
        super().__init__(spec, None, worker_id, incarnation)
        load_state(self.algo, spec.initial_states[worker_id])
        self.mailboxes = mailboxes
        self.topology = spec.topology
        self.params = trainable_params(algo_modules(self.algo))
        self.flat = self.flatten()
        self.since: float | None = None  # when the current wait began
        self.timings = Timings(compute_s=0.0, wait_s=0.0, average_s=0.0)
        self.counts = Counts(skipped=0, staleness=0, mixed=0, stalest=0)
        self.gala = spec.order == "gala"
        self.steps = 0
        self.returns: list[float] = []
        self.metrics: dict[str, float] = {}
        self.adopted = False  # this incarnation's first round: taken from the in-neighbours, not learned
        self.note: str | None = None  # sent with the next completed round
        self.round, self.phase = spec.start_round, "learn"
        if incarnation > 0:
            try:
                self.rejoin()
            except MailboxesReset:  # restarted since this learner's spec was made: rejoin its new counters
                self.rejoin()

    def rejoin(self) -> None:
        """A restarted learner's place in the rounds, from the mailboxes' counters."""
        mb = self.mailboxes
        if self.gala:  # nobody waits for its reads: rejoin past every round posted, so nobody waits for it
            self.round = max(mb.written(j) for j in range(mb.n)) + 1
            self.adopt(self.round)
            self.phase = "post"
        else:  # the last round the dead incarnation posted: read what is left of it, then rejoin at the next
            self.round, self.phase = mb.written(self.worker_id), "drain"

    def flatten(self) -> torch.Tensor:
        """The learner's parameters as one flat CPU tensor (`flat_params`)."""
        return flat_params(self.params)

    @torch.no_grad()
    def load_flat(self, flat: torch.Tensor) -> None:
        """Take a flat CPU vector of parameters as the learner's own (moved to its device in one copy)."""
        load_flat(self.params, flat)
        self.flat = flat

    # ----------------------------------------------------------------------------------------- phases
    def missing(self) -> list[tuple[int, str]]:
        """The peers the current phase waits for, with what it waits for."""
        me, t, mb, topo = self.worker_id, self.round, self.mailboxes, self.topology
        if self.gala:  # a post never waits; a gather only for an in-neighbour more than R rounds behind
            if self.phase == "post":
                return []
            oldest = t - self.spec.max_staleness
            return [(j, f"to post round {oldest}") for j in topo.in_peers(me, t) if mb.written(j) < oldest]
        if self.phase == "post":
            return [(o, f"to read round {t - 1}") for o in topo.out_peers(me, t - 1) if mb.read(o, me) < t - 1]
        if self.phase == "drain":
            return [(j, f"to post round {t}") for j in topo.in_peers(me, t) if mb.read(me, j) < t and mb.written(j) < t]
        return [(j, f"to post round {t}") for j in topo.in_peers(me, t) if mb.written(j) < t]  # gather

    def learn(self, global_steps: int) -> None:
        start = time.perf_counter()
        self.algo.schedule(global_steps, self.spec.total_steps)
        before = self.collector.env_steps
        assert self.storage is not None  # gossip runs on-policy algorithms, which collect rollouts (check_config)
        segment = self.collector.collect_rollout(self.storage)
        self.steps += self.collector.env_steps - before
        self.returns += self.collector.pop_new_returns()
        self.metrics = read_metrics(self.algo.update(segment))  # floats: they cross to the coordinator
        self.flat = self.flatten()
        self.timings["compute_s"] += time.perf_counter() - start

    def advance(self) -> bool:
        """The current phase's action, its peers being ready; True when it completed a round."""
        start = time.perf_counter()
        me, t, mb, topo = self.worker_id, self.round, self.mailboxes, self.topology
        done = False
        if self.phase == "post":  # GALA's waits are on a round's in-peers' older posts: every reader is woken
            mb.post(me, t, self.flat, topo.any_round_readers(me) if self.gala else topo.out_peers(me, t))
            self.phase = "gather"
        elif self.phase == "gather":
            if self.gala:
                self.mix_arrived(t)
            else:
                self.mix(t)
            self.phase, done = "learn", True
        elif self.phase == "drain":
            for j in topo.in_peers(me, t):
                if mb.read(me, j) < t:
                    mb.take(me, j, t)  # its round-t message: the dead incarnation's parameters are gone anyway
            self.adopt(t + 1)
            self.round, self.phase = t + 1, "post"
        self.timings["average_s"] += time.perf_counter() - start
        return done

    def mix(self, t: int) -> None:
        """x_i ← P_ii x_i + Σ_j P_ij m_j with the in-neighbours' messages of round t (PALA's order: all posted)."""
        me, mb, topo = self.worker_id, self.mailboxes, self.topology
        row = torch.as_tensor(topo.matrix(t)[me], dtype=torch.float32)
        mixed = row[me] * self.flat
        for j in topo.in_peers(me, t):
            mixed += row[j] * mb.take(me, j, t)
        self.counts["mixed"] += len(topo.in_peers(me, t))
        self.load_flat(mixed)

    def mix_arrived(self, t: int) -> None:
        """GALA's order: mix the in-neighbours' latest messages if every one of them posted a message this learner
        has not read yet (whatever its round, none more than `max_staleness` behind: `missing` waited for that);
        else mix nothing this round, as GALA's released code does, rather than mix a message twice."""
        me, mb, topo = self.worker_id, self.mailboxes, self.topology
        peers = topo.in_peers(me, t)
        if any(mb.written(j) <= mb.read(me, j) for j in peers):
            self.counts["skipped"] += 1
            return
        messages = [mb.latest(me, j) for j in peers]
        whole = [m for m in messages if m is not None]
        if len(whole) < len(messages):  # a slot torn by a sender killed while it posted: not this round
            self.counts["skipped"] += 1
            return
        row = torch.as_tensor(topo.matrix(t)[me], dtype=torch.float32)
        mixed = row[me] * self.flat
        for j, (round_, message) in zip(peers, whole, strict=True):
            mixed += row[j] * message
            self.counts["staleness"] += max(0, t - round_)
            self.counts["stalest"] = max(self.counts["stalest"], t - round_)
        self.counts["mixed"] += len(peers)
        self.load_flat(mixed)

    def adopt(self, round_: int) -> None:
        """A restarted learner's parameters: the average (by its row of the mixing matrix) of what its in-neighbours
        of `round_` hold now (`peek`: read as they are, not taken), then posted as its own round `round_`, which it
        gathers like any other. It never waits for a peer's future message, so two restarted neighbours cannot wait
        for each other. With no in-neighbour posted yet, it keeps the state the run started it with."""
        row = self.topology.matrix(round_)[self.worker_id]
        held = {j: self.mailboxes.peek(j) for j in self.topology.in_peers(self.worker_id, round_)}
        held = {j: m for j, m in held.items() if m is not None}
        if held:
            weights = torch.as_tensor(row[list(held)] / row[list(held)].sum(), dtype=torch.float32)
            self.load_flat(sum(w * m for w, m in zip(weights, held.values(), strict=True)))
            self.note = f"restarted from the average of learners {', '.join(map(str, held))} (round {round_})"
        else:
            self.note = f"restarted from the run's initial state (round {round_}: no in-neighbour has posted)"
        self.adopted = True

    def produce(self, global_steps: int, stop: StopFlag | None = None) -> GossipReport | None:
        try:
            return self.play(global_steps, stop)
        except MailboxesReset as reset:  # every learner meets it: they all go on from the same round
            self.round, self.since = reset.round, None
            if self.phase != "learn":  # what it holds now (learned, not yet mixed) is its message of that round
                self.phase = "post"
            self.note = f"the mailboxes were restarted: rejoined at round {reset.round} with its own parameters"
            return self.report()

    def play(self, global_steps: int, stop: StopFlag | None = None) -> GossipReport | None:
        """The phases until a round completes, the wait slice ends or `stop` is set."""
        slice_end = time.monotonic() + self.spec.wait_slice_s
        while True:
            if self.phase == "learn":
                self.learn(global_steps)
                self.phase = "post"
            missing = self.missing()
            if not missing:
                self.since = None
                if self.advance():
                    return self.report(completed=True)
                continue
            now = time.monotonic()
            self.since = self.since if self.since is not None else now
            if now - self.since >= self.spec.gossip_timeout_s:
                waited, self.since = now - self.since, None
                peers = "; ".join(f"learner {j} {what}" for j, what in missing)
                return self.report(trouble=f"learner {self.worker_id} waited {waited:.1f} s in round {self.round} "
                                           f"for {peers}")  # fmt: skip
            if stop is not None and stop.is_set():
                return None
            if now >= slice_end:
                return self.report()
            start = time.perf_counter()
            self.mailboxes.wait(self.worker_id, min(slice_end, self.since + self.spec.gossip_timeout_s) - now)
            self.timings["wait_s"] += time.perf_counter() - start

    def report(self, completed: bool = False, trouble: str | None = None) -> GossipReport:
        """What happened since the last item; after a completed round its metrics (and every `state_every` rounds,
        or after this incarnation's first, its parameters and state), and the round moves on."""
        item = GossipReport(self.worker_id, self.incarnation, self.steps, self.returns, trouble=trouble,
                            generation=self.mailboxes.generation, **self.timings, **self.counts)  # fmt: skip
        self.steps, self.returns = 0, []
        self.timings = Timings(compute_s=0.0, wait_s=0.0, average_s=0.0)
        self.counts = Counts(skipped=0, staleness=0, mixed=0, stalest=0)
        if completed:
            item.round = self.round
            item.metrics, self.metrics = ({} if self.adopted else self.metrics), {}
            if self.round % self.spec.state_every == 0 or self.adopted:
                item.params = self.flat.numpy().copy()
                item.state = pack_state(self.algo)
            item.note, self.note = self.note, None
            self.adopted = False
            self.round += 1
        return item


# --------------------------------------------------------------------------------------------------- runner
@dataclass
class GossipOptions(RoleOptions):
    """gossip's options."""

    learners: int = bounded(4, ge=1, le=MAX_ROLES)
    """Learners (K), each a complete agent with its own envs (the algorithm's n_envs) and optimizer."""
    topology: str = "ring"
    """Who averages with whom: ring (learner i sends to i+1, ..., i+peers), exp (GALA's time-varying
    exponential graph: in round t to i + 2^e, `peers` exponents e taken in turn), or a file with a K×K
    doubly stochastic mixing matrix (text, or .npy of [K, K] or [T, K, K] used in turn)."""
    peers: int = bounded(1, ge=1)
    """Out-neighbours of each learner per round (ring, exp)."""
    gossip_timeout_s: float = bounded(300.0, gt=0)
    """Seconds a learner waits for a peer in one round before the run ends with an error naming that peer. A
    learner that waits beats, so a hung peer is killed and restarted after --heartbeat-s (120) and rejoins:
    keep this above --heartbeat-s plus a restart to ride that out, or below it to end the run at once."""
    state_every: int = bounded(10, ge=1)
    """Rounds between the parameters and states the learners send the coordinator: the rounds whose averaged
    model is evaluated and consensus distance logged, and the states a checkpoint holds."""
    distinct_init: bool = False
    """Each learner starts from its own random initialisation (seeded per learner) instead of one shared."""
    gossip_order: str = checked("auto", one_of(ORDERS))
    """gala: a learner posts without waiting for its readers and mixes the messages that have arrived (GALA's
    Algorithm 1 and released code); pala: it posts round t once its readers took round t−1 and mixes round t's
    own messages (PALA's order); auto: gala on the local and serial backends (one machine, as GALA's code),
    pala on ray (a cluster, as PALA)."""
    max_staleness: int = bounded(1, ge=0, le=1000)
    """gala order: the most rounds an in-neighbour may be behind before a learner waits for it (GALA's
    --sync-freq); 0: wait for each in-neighbour's message of the learner's own round."""

    @property
    def workers(self) -> int:
        """The backend's name for the roles it starts: the learners."""
        return self.learners


class GossipRunner(ParallelRunner):
    """The coordinator of a `gossip` run (see the module docstring): no learning of its own."""

    arch = "gossip"
    learns_running_stats = False  # the workers' forward passes move their own copies' statistics
    Options = GossipOptions
    role_learning = "always"
    waiting_for = "completed round from the learners"
    restart_how = "(from the average of its in-neighbours' parameters)"
    spec: GossipSpec
    ALONE_IDLE = ("topology", "peers", "gossip_order", "max_staleness", "gossip_timeout_s", "distinct_init")
    """The options of the gossip between learners, which one learner alone has no use for."""

    def shares_frozen(self) -> bool:
        return not self.opts.distinct_init  # else each learner starts from a network of its own seed

    def check_config(self) -> None:
        self.check_parallel(on_policy_only=False, uses_optimizer=False)
        algo, opts = self.cfg.algo, self.opts
        if self.algo.data != "rollout":
            instead = "offline" if self.algo.data == "dataset" else "data_parallel or single"
            raise ConfigError(
                f"{algo} learns from {self.algo.data} data; the gossip architecture runs on-policy algorithms "
                f"(a2c, ppo, pg, nstep_q, onestep_q, sarsa): use --arch {instead}"
            )
        self.topology  # noqa: B018 (made now: a bad --topology file is an error before the run folder is written)
        if opts.learners == 1 and not self.resuming and (given := self.given_option(self.ALONE_IDLE)):
            raise ConfigError(f"{given} has no effect with --learners 1: one learner has no peers to gossip with")
        if self.order == "pala" and opts.max_staleness != GossipOptions.max_staleness:
            raise ConfigError(
                f"--max-staleness bounds the gala order, and this run's order is pala (each round mixes that round's "
                f"own messages{', the default on the ray backend' if opts.gossip_order == 'auto' else ''}): "
                "add --gossip-order gala, or leave --max-staleness out"
            )
        if opts.gossip_order == "auto" and not self.resuming:  # saved resolved: a resume on another backend keeps it
            opts.gossip_order = self.order

    @cached_property
    def topology(self) -> Topology:
        """The mixing matrices of `--topology` (a file's, checked) for `--learners` and `--peers`."""
        return Topology.make(self.opts.topology, self.opts.learners, self.opts.peers)

    @property
    def order(self) -> str:
        """The order of posts and reads: `--gossip-order`, where `auto` is gala on one machine, pala on ray."""
        return self.resolve_order(self.opts)

    @staticmethod
    def resolve_order(opts: GossipOptions) -> str:
        """The order `auto` stands for on the run's backend: gala on one machine, pala on ray."""
        if opts.gossip_order != "auto":
            return opts.gossip_order
        return "pala" if opts.backend == "ray" else "gala"

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        opts = self.opts
        in_process = BACKENDS[opts.backend].in_process
        self.spec = self.worker_spec(
            GossipSpec,
            device=self.role_device(),
            topology=self.topology,
            gossip_timeout_s=opts.gossip_timeout_s,
            state_every=opts.state_every,
            order=self.order,
            max_staleness=opts.max_staleness,
            wait_slice_s=0.0 if in_process else WAIT_SLICE_S,
        )
        self.start_backend()
        self.params = trainable_params(algo_modules(self.algo))
        self.size = sum(p.numel() for p in self.params)
        self.states: list[bytes | None] = [None] * opts.learners  # each learner's latest state
        self.state_rounds = [-1] * opts.learners
        self.pending: dict[int, dict[int, np.ndarray]] = {}  # round -> {learner: flat parameters}
        self.round = -1  # the latest round all learners sent
        self.highest_round = -1  # the latest round any learner completed (restarted mailboxes start past it)
        self.mailboxes: Mailboxes  # made with the learners (`start_workers`)
        self.consensus: deque[tuple[int, float]] = deque(maxlen=10_000)  # (round, consensus distance)
        self.stats = [self._fresh_stats() for _ in range(opts.learners)]
        if resume_from is not None:
            self._restore(resume_from)
        else:
            self.spec.initial_states = self.initial_states()
        self.eval_envs = self.make_eval_envs()
        self._write_config({"learners": opts.learners, "ahead": AHEAD, "rate": self.topology.rate(),
                            "order": self.order, "max_staleness": opts.max_staleness if self.order == "gala" else None,
                            "mixing": [p.tolist() for p in self.topology.matrices]})  # fmt: skip

    @staticmethod
    def _fresh_stats() -> dict[str, Any]:
        return {"steps": 0, "returns": [], "compute_s": 0.0, "wait_s": 0.0, "average_s": 0.0, "rounds": 0,
                "skipped": 0, "staleness": 0, "mixed": 0, "stalest": 0}  # fmt: skip

    def initial_states(self) -> list[bytes]:
        """The coordinator's networks and optimizer for every learner, or (`distinct_init`) each learner's own."""
        if not self.opts.distinct_init:
            return [pack_state(self.algo)] * self.opts.learners
        return [pack_state(self.build_algo(self.spec.worker_seed(i, 0))) for i in range(self.opts.learners)]

    # ----------------------------------------------------------------------------------------- state
    def _extra_state(self) -> dict[str, Any]:
        states = [from_bytes(s) if s is not None else None for s in self.states]
        return {"learners": states, "learner_rounds": list(self.state_rounds), "round": self.round}

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        learners = saved.get("learners") or []
        own = pack_state(self.algo)  # the averaged model, for a learner whose state never reached a checkpoint
        initial = [to_bytes(s) if s is not None else own for s in learners]
        self.spec.initial_states = initial or [own] * self.opts.learners
        self.states = [to_bytes(s) if s is not None else None for s in learners] or self.states
        self.state_rounds = list(saved.get("learner_rounds", self.state_rounds))
        self.round = int(saved.get("round", -1))
        self.spec.start_round = max([self.round, *self.state_rounds]) + 1
        self.highest_round = self.spec.start_round - 1  # restarted mailboxes have the learners rejoin past it

    # ----------------------------------------------------------------------------------------- learning
    @torch.no_grad()
    def average_round(self, round_: int, params: np.ndarray) -> None:
        """A round that every learner sent: its consensus distance, and its average is the coordinator's model."""
        self.round = round_
        self.consensus.append((round_, consensus_distance(params)))
        with self.publishing():  # a coordinator on a device: the CPU copies the evaluation and restarts read too
            load_flat(self.params, torch.as_tensor(params.mean(axis=0)))

    def take(self, item: GossipReport) -> tuple[dict[str, float], int]:
        """Count a learner's item; keep its state, and average the rounds every learner has sent."""
        self.counter.add(item.steps)
        self.count_returns(item.returns)
        stats = self.stats[item.worker]
        stats["steps"] += item.steps
        stats["returns"] += item.returns
        for key in ("compute_s", "wait_s", "average_s", "skipped", "staleness", "mixed"):
            stats[key] += getattr(item, key)
        stats["stalest"] = max(stats["stalest"], item.stalest)
        stats["rounds"] += item.round is not None
        if item.note is not None:
            self._report(f"learner {item.worker}: {item.note}")
        if item.trouble is not None:
            raise GossipTimeout(item.trouble)
        if item.round is not None:  # a completed round (only those send a state and parameters)
            if item.state is not None:
                self.states[item.worker], self.state_rounds[item.worker] = item.state, item.round
            self.highest_round = max(self.highest_round, item.round)
            current = item.generation == self.mailboxes.generation  # not a round begun before the mailboxes restarted
            if item.params is not None and current and item.round > self.round:
                sent = self.pending.setdefault(item.round, {})
                sent[item.worker] = item.params
                if len(sent) == self.opts.learners:
                    self.average_round(item.round, np.stack([sent[i] for i in range(self.opts.learners)]))
                    self.pending = {r: s for r, s in self.pending.items() if r > item.round}
        if item.round is None or not item.metrics:
            return {}, 0
        return item.metrics, 1

    def log_row(self) -> dict[str, float]:
        """The policy lag, and each learner's returns, steps per second and shares of time since the last row, the
        totals, and the latest consensus distance."""
        now = time.perf_counter()
        wall = max(now - getattr(self, "_last_gossip_log", self._invocation_start), 1e-9)
        self._last_gossip_log = now
        row: dict[str, float] = {}
        total = self._fresh_stats()
        for i, stats in enumerate(self.stats):
            busy = stats["compute_s"] + stats["wait_s"] + stats["average_s"]
            row[f"learner{i}/SPS"] = stats["steps"] / wall
            if stats["returns"]:
                row[f"learner{i}/episodic_return"] = float(np.mean(stats["returns"]))
            if busy > 0:
                row[f"learner{i}/wait_share"] = stats["wait_s"] / busy
                row[f"learner{i}/average_share"] = stats["average_s"] / busy
            for key in ("compute_s", "wait_s", "average_s", "rounds", "skipped", "staleness", "mixed"):
                total[key] += stats[key]
            total["stalest"] = max(total["stalest"], stats["stalest"])
        busy = total["compute_s"] + total["wait_s"] + total["average_s"]
        if busy > 0:
            for key in ("compute", "wait", "average"):
                row[f"gossip/{key}_share"] = total[f"{key}_s"] / busy
        if total["rounds"]:
            row["gossip/skip_share"] = total["skipped"] / total["rounds"]
        if total["mixed"]:
            row["gossip/staleness"] = total["staleness"] / total["mixed"]
            row["gossip/staleness_max"] = total["stalest"]
        if self.consensus:
            row["gossip/round"], row["gossip/consensus_distance"] = self.consensus[-1]
        self.stats = [self._fresh_stats() for _ in self.stats]
        return super().log_row() | row

    # ----------------------------------------------------------------------------------------- loop
    def start_workers(self, stop_flag: StopFlag, logger: RunLogger) -> RoleGroup:
        """The mailboxes first (every learner having posted and read the round before the first), then the
        learners."""
        opts = self.opts
        self.mailboxes = self.backend.mailboxes(
            opts.learners, self.size, self.spec.start_round, rejoin_round=lambda: self.highest_round + 1,
            max_restarts=opts.max_restarts, pids_file=self.run_dir / "mailboxes.json", heartbeat_s=opts.heartbeat_s,
        )  # fmt: skip
        learner = partial(GossipLearner, self.spec, self.mailboxes)
        return self.start_roles(learner, stop_flag, AHEAD, services=self.mailboxes.keeper)

    def restart_crashed(self, pool: RoleGroup, logger: RunLogger, how: str) -> None:
        """The crashed learners, then the mailboxes' process, where they have one (restarted empty by its keeper:
        every learner rejoins past every round seen, with its own parameters; rounds begun before are not
        averaged). The backend stops the keeper with everything else it started (`close`)."""
        super().restart_crashed(pool, logger, how)
        keeper = self.mailboxes.keeper
        if keeper is None:
            return
        for crash in keeper.check():
            self.pending = {}
            self._report(f"{crash.describe()}\nrestarting them empty: every learner rejoins at round "
                         f"{self.highest_round + 1} with its own parameters")  # fmt: skip
            logger.log(self.env_steps, {"charts/mailbox_restarts": keeper.restarts})

    def coordinate(self, pool: RoleGroup) -> Taken | None:
        """The next item of any learner, taken in (`take`); None unless it completed a round."""
        item = pool.get_any(WAIT_S)
        if item is None:
            return None
        metrics, updates = self.take(item)
        pool.release(item.worker, item.incarnation)
        if item.round is None and not item.returns:
            return None
        return Taken(item.returns, metrics, updates)

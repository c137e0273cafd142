"""Targets for processes the tests spawn. A spawned child imports its target by module name, and test modules
(imported by path) have no name a child could import; helpers in tests/ (on pytest's pythonpath) do."""

import torch

WORKER_TIMEOUT_S = 60


def step_with_constant_grad(optimizer, grad_value, wait_for, done):
    """Worker: after `wait_for` (if any), set every parameter's gradient to `grad_value`, step once, set `done`."""
    torch.set_num_threads(1)
    if wait_for is not None and not wait_for.wait(WORKER_TIMEOUT_S):
        raise TimeoutError("the first worker never finished its step")
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = torch.full_like(param, grad_value)
    optimizer.step()
    done.set()


def send_items(worker_id, incarnation, outbox, items, crash_after):
    """`WorkerPool` target: take a credit and send `(worker_id, incarnation, item)` for each item, then raise if
    this incarnation is below `crash_after` (a crash the pool restarts), else wait to be stopped."""
    import time

    for item in items:
        outbox.take_credit(_NEVER)
        outbox.put((worker_id, incarnation, item))
    if incarnation < crash_after:
        raise RuntimeError(f"worker {worker_id} crashes on purpose")
    time.sleep(WORKER_TIMEOUT_S)


def send_forever(worker_id, incarnation, outbox, size):
    """`WorkerPool` target: send items of `size` bytes as fast as the pipe takes them (to be killed mid-message)."""
    payload = b"x" * size
    while True:
        outbox.put(payload)


class _Never:
    def is_set(self) -> bool:
        return False


_NEVER = _Never()


def send_then_hang(worker_id, incarnation, outbox):
    """`WorkerPool` target: say it is alive, send `(worker_id, incarnation)`, then hang without a sign of life
    (a worker stuck in an env step)."""
    import time

    outbox.beat()
    outbox.put((worker_id, incarnation))
    time.sleep(WORKER_TIMEOUT_S)


SLOW_ITEM_S = 0.7  # an item of ScriptedRole(fail="slow"): longer than half of its test's 1 s heartbeat
SLOW_START_S = 10.0  # the build of a restarted ScriptedRole(fail="slow_restart"): imports and envs, long


class ScriptedRole:
    """A role for backend tests (built by `make_role(worker_id, incarnation)` in a worker): each item is
    `(worker_id, incarnation, n, version, weight)` — the how-manieth item, the published weight version it saw and
    the first weight of the published network `net`. `fail` says what incarnation 0 does at its second item:
    "raise", "hang" (no sign of life) or nothing; "slow": every item takes SLOW_ITEM_S; "slow_restart": every
    incarnation after the first takes SLOW_START_S to build."""

    def __init__(self, worker_id, incarnation, shared, weights, fail=None):
        import time

        self.worker_id, self.incarnation = worker_id, incarnation
        self.shared, self.weights, self.fail = shared, weights, fail
        self.n = 0
        if fail == "slow_restart" and incarnation > 0:
            time.sleep(SLOW_START_S)

    def produce(self, global_steps, stop):
        import time

        self.n += 1
        if self.fail == "slow":
            time.sleep(SLOW_ITEM_S)
        if self.incarnation == 0 and self.n == 2:
            if self.fail == "raise":
                raise RuntimeError(f"role {self.worker_id} fails on purpose")
            if self.fail == "hang":
                time.sleep(WORKER_TIMEOUT_S)
        seen = {}
        version = self.weights.read(lambda: seen.update(w=float(self.shared["net"].weight.detach().flatten()[0])), stop)
        return (self.worker_id, self.incarnation, self.n, version, seen["w"], global_steps)

    def close(self):
        pass


class Tally:
    """Service: a running total, and calls that say who answers, echo, hold the service or raise."""

    def __init__(self, index, incarnation):
        self.index, self.incarnation, self.total = index, incarnation, 0

    def add(self, n):
        self.total += n
        return self.total

    def whoami(self):
        import os

        return self.index, self.incarnation, os.getpid()

    def echo(self, payload):
        return len(payload)

    def hold(self, seconds):
        import time

        time.sleep(seconds)
        return seconds

    def fail(self):
        raise ValueError("fails on purpose")

    def stall_first(self):
        """Stuck for an hour in the first incarnation (the process alive, the service not answering); at once in
        the others (where the call is sent again)."""
        import time

        if self.incarnation == 0:
            time.sleep(3600)
        return self.incarnation


def make_tally(index, incarnation):
    return Tally(index, incarnation)


def make_tally_failing_first(index, incarnation):
    if incarnation == 0:
        raise RuntimeError(f"service {index} fails to start on purpose")
    return Tally(index, incarnation)


def make_tally_never_starting(index, incarnation):
    raise RuntimeError(f"service {index} cannot start (incarnation {incarnation})")


def crash_both_past_one_budget(services, group, timeout: float = 120) -> None:
    """Check `services` (a server that fails to start once) and `group` (a role that raises at its second item), both
    started with `max_restarts=1` by one backend, until their two restarts spend the one budget they share: the
    second is the `WorkerFailure` that says so (each group alone restarted once)."""
    import time

    import pytest

    from rlfleet.backends.base import WorkerFailure

    crashes: list = []
    deadline = time.monotonic() + timeout
    with pytest.raises(WorkerFailure, match=r"crashed once, 2 restarts in all with the run's other roles and "
                                             r"services \(limit 1\); last: (server|worker) 0 died"):  # fmt: skip
        while len(crashes) < 2:  # both restarted, and no failure: each group counted its own
            assert time.monotonic() < deadline, f"not both crashed: {crashes}"
            crashes += services.check()
            crashes += group.check()
            if (item := group.get(0, 0.2)) is not None:
                group.release(0, item[1])
    assert len(crashes) == 1 and group.restarts + services.restarts == 2


def call_service(handle, method, args, times, conn):
    """Client process: call `handle.method(*args)` `times` times and send each result home."""
    for _ in range(times):
        conn.send(handle.call(method, *args))


def flood_service(handle, size):
    """Client process: echo payloads of `size` bytes as fast as the service answers (to be killed mid-message)."""
    payload = b"x" * size
    while True:
        handle.call("echo", payload)


def hold_service(handle, seconds, started):
    """Client process: hold the service for `seconds` in one call (to be killed while the service runs it)."""
    started.set()
    handle.call("hold", seconds)


def learner_after_a_failed_start(rank, rendezvous, fail_first, out):
    """Worker: a learner of a 2-learner group, which (`fail_first`) first fails to form a group, its peer counted
    ready but absent, or else waits, started and ready, until that group has failed (the generation moved on);
    then it joins the next generation, sums its rank + 1 over the group and sends home `(rank, sum)`, or
    `(rank, why)` if the group does not form."""
    import contextlib
    import time

    import torch.distributed as dist

    from rlfleet.arch.allreduce import GENERATION, GroupBroken, LearnerGroup

    group = LearnerGroup(rendezvous, rank)
    try:
        if fail_first:
            with contextlib.suppress(GroupBroken):
                group.join()
        else:  # already up (a fresh process takes seconds to import torch on a busy machine): joins at once
            store = dist.TCPStore(rendezvous.host, rendezvous.port, is_master=False, wait_for_workers=False)
            while store.get(GENERATION) == b"0":
                time.sleep(0.02)
        group.join()
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total)
        out.put((rank, float(total)))
    except GroupBroken as exc:
        out.put((rank, str(exc)))
    finally:
        group.leave()


def allreduce_learner(rank, rendezvous, cases, out):
    """Worker: one all-reduce learner, on a fixed processed batch per case `(algo, overrides, batches, epochs,
    minibatch_size)`. Per case: a fresh algorithm object (torch seed and `algo.rng` seed `rank + 1`, so each
    learner draws weights of its own), the state the group agrees on (learner 0's), gradients averaged in every
    optimizer step of one `optimize` of the loss (`epochs` 0, A2C's update) or of `minibatch_epochs` (PPO's).
    Sends home `(rank, [the model's final state as NumPy arrays, per case])`."""
    from functools import partial

    from rlfleet.algos.updates import minibatch_epochs
    from rlfleet.arch.allreduce import LearnerGroup
    from rlfleet.arch.shared import load_state, pack_state
    from rlfleet.optim.step import optimize, set_gradient_hook

    torch.set_num_threads(1)
    group = LearnerGroup(rendezvous, rank)
    group.join()
    states = []
    for algo_name, overrides, batches, epochs, minibatch_size in cases:
        algo = make_cartpole_algo(algo_name, overrides, seed=rank + 1)
        _, _, _, state = group.agree(0, 0, partial(pack_state, algo))
        if state is not None:
            load_state(algo, state)
        set_gradient_hook(algo.optimizer, group.average)
        batch = batches[rank]
        if epochs == 0:
            loss, _ = algo.loss(batch)
            optimize(algo.optimizer, loss, algo.params, algo.cfg.max_grad_norm)
        else:
            minibatch_epochs(algo, batch, epochs, minibatch_size, algo.rng)
        states.append({k: v.detach().numpy().copy() for k, v in algo.model.state_dict().items()})
    group.leave()
    out.put((rank, states))


def make_cartpole_algo(algo_name, overrides, seed):
    """An algorithm object for CartPole's spaces, its networks drawn with torch seed `seed`."""
    import gymnasium as gym
    import numpy as np

    from rlfleet.algos import resolve

    algo_cls, config_cls, _, _ = resolve(algo_name)
    torch.manual_seed(seed)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    return algo_cls(config_cls(**overrides), obs_space, gym.spaces.Discrete(2), seed=seed)

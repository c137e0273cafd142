"""allreduce: K learners in real processes (gloo over 127.0.0.1) end exactly where one learner on their
concatenated batch does; the gradient hook of `optimize`; the options and algorithms it refuses."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from spawned import WORKER_TIMEOUT_S, allreduce_learner, learner_after_a_failed_start, make_cartpole_algo

from rlfleet.arch.allreduce import GENERATION, AllReduceRunner, LearnerGroup, Rendezvous
from rlfleet.backends.shared_memory import StopFlag
from rlfleet.data.batch import Batch
from rlfleet.launch import check_run, resumed_config, train
from rlfleet.optim.step import optimize, set_gradient_hook
from rlfleet.run.config import ConfigError, RunConfig

LEARNERS = 2
PER_LEARNER = 64  # samples in each learner's batch


def fixed_batch(seed: int) -> Batch:
    """A processed CartPole batch (what `process` makes of a segment) of `PER_LEARNER` samples."""
    rng = np.random.default_rng(seed)
    n = PER_LEARNER
    return Batch(
        obs=rng.normal(size=(n, 4)).astype(np.float32),
        act=rng.integers(2, size=n),
        logp=np.log(rng.uniform(0.3, 0.7, size=n)).astype(np.float32),
        value=rng.normal(size=n).astype(np.float32),
        adv=rng.normal(size=n).astype(np.float32),
        ret=rng.normal(size=n).astype(np.float32),
    )


CASES = [  # (algo, overrides, epochs, minibatch size)
    ("a2c", {}, 0, 0),  # one A2C step (RMSprop, clip 0.5)
    ("ppo", {}, 3, PER_LEARNER),  # PPO epochs over one minibatch per learner (Adam, clip 0.5)
    ("ppo", {"value_clip": 0.2}, 2, PER_LEARNER // 4),  # PPO epochs of 4 minibatches
]


def case_batches(index: int) -> list[Batch]:
    return [fixed_batch(100 * index + r) for r in range(LEARNERS)]


def case_overrides(index: int) -> dict:
    return {"normalize_advantage": False, **CASES[index][1]}


@pytest.fixture(scope="module")
def learners() -> list[list[dict]]:
    """Every case run by `LEARNERS` learner processes in one group; their final model states, [case][rank]."""
    ctx = multiprocessing.get_context("spawn")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set(GENERATION, "0")
    rendezvous = Rendezvous("127.0.0.1", store.port, LEARNERS, timeout_s=WORKER_TIMEOUT_S)
    cases = [(a, case_overrides(i), case_batches(i), e, m) for i, (a, _, e, m) in enumerate(CASES)]
    out = ctx.Queue()
    procs = [ctx.Process(target=allreduce_learner, args=(r, rendezvous, cases, out)) for r in range(LEARNERS)]
    for p in procs:
        p.start()
    try:
        states = dict(out.get(timeout=2 * WORKER_TIMEOUT_S) for _ in procs)
    except queue.Empty:
        pytest.fail(f"a learner sent nothing; exit codes {[p.exitcode for p in procs]}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [[states[r][i] for r in range(LEARNERS)] for i in range(len(CASES))]


def one_learner_on_the_concatenation(algo_name, overrides, batches, epochs, minibatch_size) -> dict:
    """Learner 0's starting state, stepped by one learner on minibatches that concatenate the K learners'
    minibatches of each step (drawn with their own `rng`s, as `minibatch_epochs` draws them)."""
    algo = make_cartpole_algo(algo_name, overrides, seed=1)
    if epochs == 0:
        loss, _ = algo.loss(Batch.cat(batches))
        optimize(algo.optimizer, loss, algo.params, algo.cfg.max_grad_norm)
    else:
        rngs = [np.random.default_rng(r + 1) for r in range(LEARNERS)]
        for _ in range(epochs):
            splits = [list(b.split(minibatch_size, shuffle=True, rng=g)) for b, g in zip(batches, rngs, strict=True)]
            for parts in zip(*splits, strict=True):
                loss, _ = algo.loss(Batch.cat(list(parts)))
                optimize(algo.optimizer, loss, algo.params, algo.cfg.max_grad_norm)
    return {k: v.detach().numpy() for k, v in algo.model.state_dict().items()}


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{a}-epochs{e}-minibatch{m}" for a, _, e, m in CASES])
def test_allreduce_learners_end_where_one_learner_on_the_concatenated_batch_does(learners, case):
    """Why it holds: the learners start from learner 0's state (each draws weights of its own; the group's
    broadcast replaces them). Every loss here is a mean over its minibatch with no per-minibatch statistics
    (advantage normalisation off), so with equal minibatch sizes the mean of the K learners' gradients is the
    gradient of the loss on their concatenated minibatches; the all-reduce averages before the global-norm
    clip, so the clip and the optimizer step see exactly that gradient in every learner and in the reference."""
    algo, _, epochs, minibatch_size = CASES[case]
    overrides = case_overrides(case)
    expected = one_learner_on_the_concatenation(algo, overrides, case_batches(case), epochs, minibatch_size)
    start = make_cartpole_algo(algo, overrides, seed=1).model.state_dict()
    ends = learners[case]
    for key, value in expected.items():
        assert not np.allclose(value, start[key].numpy()), f"{key} did not move"
        for rank, state in enumerate(ends):
            np.testing.assert_allclose(state[key], value, rtol=1e-4, atol=1e-6, err_msg=f"learner {rank}, {key}")
        np.testing.assert_array_equal(ends[0][key], ends[1][key])  # the same averaged gradient in both


def test_optimize_calls_the_gradient_hook_between_backward_and_the_clip():
    weight = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    seen = []

    def hook(params):
        seen.append(params[0].grad.clone())
        params[0].grad.mul_(10)  # what the clip and the step must see

    set_gradient_hook(optimizer, hook)
    norm = optimize(optimizer, (weight * torch.tensor([3.0, 4.0])).sum(), [weight], max_grad_norm=1.0)
    assert torch.equal(seen[0], torch.tensor([3.0, 4.0]))  # after backward
    assert norm == pytest.approx(50.0)  # the norm of the hooked gradient, measured by the clip
    assert torch.allclose(weight.detach(), torch.tensor([1 - 0.6, 1 - 0.8]))  # a step of the clipped one
    set_gradient_hook(optimizer, None)
    optimize(optimizer, weight.sum(), [weight], max_grad_norm=0.0)
    assert len(seen) == 1


@pytest.mark.parametrize(
    "algo, options, message",
    [
        ("ppo", {"backend": "serial", "workers": 2},
         r"^--backend serial runs the learners one after another in one process, so 2 of them cannot all-reduce: "
         r"use --backend local, or --workers 1 \(one learner\)$"),
        ("dqn", {}, r"^dqn learns from replay data; the allreduce .*: use --arch data_parallel or single$"),
        ("pg", {}, r"^all-reduce learners .*, and pg may take .*: without a baseline .*: use --set baseline=true$"),
        ("ppo", {"overrides": {"target_kl": 0.01}},
         r"^all-reduce .*, and ppo may take .*: target_kl=0.01 stops each learner's epochs .*: use --set target_kl=0$"),
        ("ppo", {"group_timeout_s": 120.0}, r"^--group-timeout-s 120 must be less than --heartbeat-s 120"),
        ("ppo", {"workers": 0}, "--workers"),
        ("ppo", {"state_every": 0}, "--state-every"),
    ],
)  # fmt: skip
def test_bad_allreduce_input_is_one_clear_line(tmp_path, algo, options, message):
    with pytest.raises(ConfigError, match=message) as caught:
        train(algo, "CartPole-v1", arch="allreduce", logdir=str(tmp_path), progress=False, **options)
    assert "\n" not in str(caught.value)
    assert not any(tmp_path.iterdir())  # nothing written


def test_one_learner_takes_any_heartbeat(caplog):
    """--group-timeout-s is refused with one learner, so its default must not bound --heartbeat-s there."""
    resolved, _ = check_run("ppo", "CartPole-v1", arch="allreduce", workers=1, backend="local", heartbeat_s=30.0)
    assert resolved.opts.heartbeat_s == 30.0


def test_a_resume_may_shorten_the_heartbeat_with_the_group_timeout():
    """Both are how long a process waits for another, which the checkpoint does not depend on."""
    saved = dataclasses.asdict(RunConfig("ppo", "CartPole-v1", arch="allreduce", options={"workers": 2}))
    given = {"backend": "local", "heartbeat_s": 30.0, "group_timeout_s": 20.0}
    run = AllReduceRunner.__new__(AllReduceRunner)
    run._prepare(resumed_config(saved, {}, None, None, given), resuming=True)
    assert (run.opts.heartbeat_s, run.opts.group_timeout_s) == (30.0, 20.0)


def test_torch_threads_say_they_are_the_coordinators(caplog):
    """The learners are processes of one torch thread each: a count given for the run says it does not reach them."""
    check_run("ppo", "CartPole-v1", arch="allreduce", workers=2, backend="local", torch_threads=2)
    said = [r.getMessage() for r in caplog.records if "--torch-threads" in r.getMessage()]
    assert said == ["--torch-threads 2 is the coordinator's, which evaluates; the learners of allreduce are processes "
                    "of their own, with one torch thread each"]  # fmt: skip


def test_one_learner_runs_serially_and_checkpoints_its_state(run_opts):
    """`--workers 1 --backend serial`: the single-learner reference, no group (nothing to average)."""
    r = train("ppo", "CartPole-v1", arch="allreduce", workers=1, backend="serial", steps=1_024, eval_every=1_024,
              eval_episodes=2, stop_return=1e9, **run_opts)  # fmt: skip
    assert r["env_steps"] >= 1_024 and r["updates"] == 4 and r["eval_return_mean"] is not None
    saved = torch.load(r.run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert saved["allreduce"]["version"] == 4  # one published state per update (state_every 1)
    assert saved["algo"]["optimizer"]["state"]  # the learner's Adam moments, not a fresh optimizer's


def test_learner_zero_sends_its_state_after_the_last_update_of_the_budget(run_opts):
    """With `state_every` beyond the run's updates, the only state the coordinator gets is the final one: the
    final evaluation and checkpoint are of what the learners learned, not of the starting weights."""
    r = train("ppo", "CartPole-v1", arch="allreduce", workers=1, backend="serial", state_every=100, steps=1_024,
              eval_every=10_000, eval_episodes=2, stop_return=1e9, **run_opts)  # fmt: skip
    saved = torch.load(r.run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert r["updates"] == 4 and saved["allreduce"]["version"] == 1
    assert saved["algo"]["optimizer"]["state"]


def test_the_final_state_is_learner_zeros_after_the_last_update_when_another_learner_ends_the_budget(run_opts):
    """Two learner processes: the item of learner 1 for the budget's last update may take the count past the
    budget before learner 0's item of that update (its state) comes. The coordinator waits for it, so the final
    evaluation and checkpoint are of every update the group made, not of the weights it started with."""
    r = train("a2c", "CartPole-v1", arch="allreduce", workers=2, backend="local", state_every=1_000, steps=6_000,
              eval_every=10**9, eval_episodes=2, stop_return=1e9, **run_opts)  # fmt: skip
    segment = 2 * 8 * 16  # two learners' rollouts of 8 envs × 16 steps (a2c's)
    assert r["updates"] == -(-6_000 // segment) and r["env_steps"] >= 6_000  # learner 1's last segment may come later
    saved = torch.load(r.run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert {int(s["step"]) for s in saved["algo"]["optimizer"]["state"].values()} == {r["updates"]}


def test_a_resumed_run_goes_on_from_the_learners_optimizer_state(run_opts, tmp_path):
    """The checkpoint holds learner 0's Adam state (not the coordinator's unused optimizer's), and a resumed
    learner starts from it: 4 updates of 10 epochs of 4 minibatches each way make 320 Adam steps, not 160."""
    train("ppo", "CartPole-v1", arch="allreduce", workers=1, backend="serial", steps=1_024, stop_return=1e9,
          eval_every=1_024, eval_episodes=1, name="r", **run_opts)  # fmt: skip
    resumed = train(resume=tmp_path / "r", steps=2_048, progress=False).result
    assert resumed["env_steps"] == 2_048 and resumed["updates"] == 8
    saved = torch.load(tmp_path / "r" / "checkpoints" / "latest.pt", weights_only=True)
    assert {int(s["step"]) for s in saved["algo"]["optimizer"]["state"].values()} == {320}


@pytest.mark.parametrize("algo", ["a2c", "a3c", "ppo", "pg", "nstep_q", "onestep_q", "sarsa"])
def test_every_on_policy_algorithm_runs_on_one_serial_learner(algo, run_opts):
    overrides = {"baseline": True} if algo == "pg" else {}
    r = train(algo, "CartPole-v1", arch="allreduce", workers=1, backend="serial", steps=600, eval_every=600,
              eval_episodes=2, stop_return=1e9, overrides=overrides, **run_opts).result  # fmt: skip
    assert r["env_steps"] >= 600 and r["updates"] > 0 and r["eval_return_mean"] is not None


def test_a_learner_waiting_for_its_group_leaves_when_the_run_stops():
    """A learner whose peers never come (the run is ending) sees the stop flag while it waits for them, instead
    of waiting out --group-timeout-s before the backend can stop it."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set(GENERATION, "0")
    group = LearnerGroup(Rendezvous("127.0.0.1", store.port, LEARNERS, timeout_s=30.0), rank=0)
    stop = StopFlag(multiprocessing.get_context("spawn"))
    threading.Timer(0.3, stop.set).start()
    start = time.monotonic()
    assert group.join(stop) is None
    assert time.monotonic() - start < 20 and not group.formed  # the rendezvous' timeout is 30 s


def test_a_learner_waits_for_its_group_in_short_calls_and_stays_ready_between_them():
    """`join(wait_s=...)` gives up the call after `wait_s` (so a produce call stays short: the worker beats, and a
    backend that queues calls to a role is not held up) but not the generation: the next call goes on waiting
    in it, counted ready once."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set(GENERATION, "0")
    group = LearnerGroup(Rendezvous("127.0.0.1", store.port, LEARNERS, timeout_s=30.0), rank=0)
    for _ in range(3):
        start = time.monotonic()
        assert group.join(wait_s=0.2) is None
        assert 0.2 <= time.monotonic() - start < 20 and not group.formed  # the rendezvous' timeout is 30 s
    assert store.add("0/ready", 0) == 1 and store.get(GENERATION) == b"0"


def test_a_learner_whose_group_failed_to_form_meets_a_fresh_peer_in_the_next_generation():
    """Learner 0 starts a group whose peer is counted ready but never comes: gloo's rendezvous times out and the
    generation moves on. A fresh learner 1 then joins: the group forms and sums over both. (torch counted the
    failed group, and learner 0 waited under another name than its peer's in every generation after.)"""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set(GENERATION, "0")
    store.add("0/ready", 1)  # learner 1, as if ready: learner 0 goes on to gloo's rendezvous without it
    rendezvous = Rendezvous("127.0.0.1", store.port, LEARNERS, timeout_s=3.0)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    first = ctx.Process(target=learner_after_a_failed_start, args=(0, rendezvous, True, out))
    fresh = ctx.Process(target=learner_after_a_failed_start, args=(1, rendezvous, False, out))  # waits for it
    procs = [first, fresh]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        while store.get(GENERATION) == b"0":  # learner 0's first group did not form
            assert time.monotonic() < deadline and first.is_alive(), "learner 0 never gave up its first group"
            time.sleep(0.05)
        results = dict(out.get(timeout=WORKER_TIMEOUT_S) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    assert results == {0: 3.0, 1: 3.0}, results


def test_a_group_that_meets_on_loopback_talks_over_the_loopback_interface(monkeypatch):
    from rlfleet.arch.allreduce import keep_on_loopback

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    keep_on_loopback("10.1.2.3")  # a cluster's address: gloo's own choice stands
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    keep_on_loopback("127.0.0.1")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's choice is kept
    keep_on_loopback("127.0.0.1")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"

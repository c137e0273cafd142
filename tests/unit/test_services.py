"""Backend services (what a parameter server's shards run on): calls from other processes, clients killed mid-call,
services killed and restarted behind handles that keep working, one restart budget for a backend's roles and services.
Real processes, really killed. A service that raises, or stays unreachable, where the learner calls it stops the run
as a failure, with its checkpoint and `result.json`."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from spawned import (
    ScriptedRole,
    call_service,
    crash_both_past_one_budget,
    flood_service,
    hold_service,
    make_tally,
    make_tally_failing_first,
)

from rlfleet.backends import Pending, RunFailure, ServiceError, ServiceUnavailable, make_backend
from rlfleet.backends.services import ProcessServices
from rlfleet.launch import train
from rlfleet.run.checkpoint import load_checkpoint

SPAWN = torch.multiprocessing.get_context("spawn")


def wait_for(pending, services, timeout: float = 60.0):
    """A pending call's result, restarting dead services meanwhile (as a coordinator does); and the crashes."""
    deadline = time.monotonic() + timeout
    crashes = []
    while True:
        try:
            return pending.result(timeout=0.2), crashes
        except TimeoutError:
            crashes += services.check()
            assert time.monotonic() < deadline, "no answer"


@pytest.fixture
def services():
    group = ProcessServices(make_tally, 2, max_restarts=5)
    group.start()
    yield group
    group.stop()
    assert group.alive() == 0 and not os.path.exists(group.folder)


def test_serial_services_are_called_directly_and_raise_where_the_result_is_read():
    group = make_backend("serial").start_services(make_tally, 2)
    pendings = [h.submit("add", 5) for h in group.handles]
    assert [p.result() for p in pendings] == [5, 5]
    assert group.handles[1].call("whoami")[:2] == (1, 0)
    failed = group.handles[0].submit("fail")
    with pytest.raises(ValueError, match="fails on purpose"):
        failed.result()
    assert group.check() == [] and group.alive() == 2
    group.stop()


def test_calls_work_from_a_spawned_client_and_a_raising_method_leaves_the_service_serving(services):
    reader, writer = SPAWN.Pipe(duplex=False)
    client = SPAWN.Process(target=call_service, args=(services.handles[1], "add", (2,), 3, writer), daemon=True)
    client.start()
    writer.close()
    assert [reader.recv() for _ in range(3)] == [2, 4, 6]
    client.join(timeout=30)
    assert client.exitcode == 0
    pendings = [h.submit("add", 10) for h in services.handles]  # to both services at once, then wait
    assert [p.result(timeout=60) for p in pendings] == [10, 16]  # service 1 kept the client's total
    with pytest.raises(ServiceError, match="(?s)service 0's fail raised.*ValueError: fails on purpose"):
        services.handles[0].call("fail")
    assert services.handles[0].call("add", 1) == 11
    assert services.check() == []


def test_a_client_killed_mid_call_leaves_the_service_serving_the_others(services):
    """8 MB calls take many socket writes each: a SIGKILL lands inside one (or while the service answers it).
    Then a client killed while the service runs its call: the call finishes and the next one is answered."""
    rng = random.Random(2)
    handle = services.handles[0]
    for kill in range(3):
        client = SPAWN.Process(target=flood_service, args=(handle, 8 << 20), daemon=True)
        client.start()
        time.sleep(3.0 if kill == 0 else rng.uniform(0.3, 0.6))  # the first one starts python and torch
        os.kill(client.pid, signal.SIGKILL)
        client.join(timeout=10)
        assert handle.submit("add", 1).result(timeout=10) == kill + 1, f"no answer after kill {kill}"
    started = SPAWN.Event()
    client = SPAWN.Process(target=hold_service, args=(handle, 2.0, started), daemon=True)
    client.start()
    assert started.wait(60)
    time.sleep(0.5)  # the call has reached the service, which is holding
    os.kill(client.pid, signal.SIGKILL)
    client.join(timeout=10)
    assert handle.submit("add", 1).result(timeout=10) == 4
    assert services.check() == [] and services.alive() == 2


def test_a_killed_service_is_reported_and_restarted_and_the_handles_work_again(services):
    handle = services.handles[1]
    index, incarnation, pid = handle.call("whoami")
    assert (index, incarnation) == (1, 0)
    held = handle.submit("hold", 1.0)  # a call the service dies in: sent again to its next incarnation
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    after = handle.submit("whoami")
    with pytest.raises(TimeoutError):
        after.result(timeout=0.3)  # nobody has restarted it yet
    (_, _, new_pid), crashes = wait_for(after, services)
    assert [(c.worker, c.exitcode, c.role) for c in crashes] == [(1, -signal.SIGKILL, "service")]
    assert "service 1 died (killed by SIGKILL)" in crashes[0].describe()
    assert new_pid != pid and services.incarnations == [0, 1] and services.restarts == 1
    assert held.result(timeout=60) == 1.0  # answered by incarnation 1, after the call sent before it
    assert handle.call("whoami")[1] == 1 and services.handles[0].call("whoami")[1] == 0
    reader, writer = SPAWN.Pipe(duplex=False)  # a handle pickled after the restart reaches the new incarnation
    client = SPAWN.Process(target=call_service, args=(handle, "whoami", (), 1, writer), daemon=True)
    client.start()
    writer.close()
    assert reader.recv()[1:] == (1, new_pid)
    client.join(timeout=30)


def test_a_service_that_raises_while_it_starts_is_reported_with_its_traceback():
    group = ProcessServices(make_tally_failing_first, 1, max_restarts=1, name="server")
    group.start()
    try:
        answer, crashes = wait_for(group.handles[0].submit("whoami"), group)
        assert answer[:2] == (0, 1)
        assert len(crashes) == 1 and crashes[0].exitcode == 1
        first, *rest = crashes[0].describe().splitlines()  # the first line names what it raised: a run's one line
        assert first.startswith("server 0 died (exit code 1): ") and "service 0 fails to start on purpose" in first
        assert "Traceback" in rest[0]
        assert "service 0 fails to start on purpose" in crashes[0].traceback
    finally:
        group.stop()


@pytest.mark.parametrize("how", ["stopped", "stuck_in_a_call"])
def test_a_hung_service_is_killed_for_want_of_an_answer_reported_and_restarted(how):
    """A service that stops answering (SIGSTOPped, or stuck inside a call: the ping waits behind it, so a live
    process is not taken for a live service) is killed after `heartbeat_s` without an answer to its ping, reported
    as hung, and restarted; the call it held is sent again to its next incarnation. The other service, answering,
    is left alone, and while the hung one is silent `unwell_at` moves (what holds the callers' heartbeat)."""
    group = ProcessServices(make_tally, 2, max_restarts=2, name="replay shard", heartbeat_s=1.5)
    group.start()
    try:
        handle = group.handles[1]
        pid = handle.call("whoami")[2]
        deadline = time.monotonic() + 30
        while group.answered[1] is None:  # its first ping answered: no start-up grace from now on
            assert group.check() == [] and time.monotonic() < deadline
            time.sleep(0.05)
        if how == "stopped":
            os.kill(pid, signal.SIGSTOP)
            while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
                time.sleep(0.01)
            held = handle.submit("whoami")
        else:
            held = handle.submit("stall_first")  # sent again to the next incarnation, which answers at once
        stuck_at = time.monotonic()
        (answer, crashes) = wait_for(held, group, timeout=30) if how == "stopped" else (None, [])
        if how == "stuck_in_a_call":
            while not crashes:
                assert time.monotonic() - stuck_at < 30, "the stuck service was not killed"
                crashes += group.check()
                time.sleep(0.05)
        assert [(c.worker, c.exitcode) for c in crashes] == [(1, -signal.SIGKILL)]
        text = crashes[0].describe()
        assert text.startswith("replay shard 1 died (killed by SIGKILL): no answer for ") and "(hung)" in text
        assert time.monotonic() - stuck_at >= 1.5 and group.unwell_at > stuck_at
        assert group.incarnations == [0, 1] and group.restarts == 1
        if how == "stopped":
            assert answer[:2] == (1, 1) and answer[2] != pid
        else:
            assert wait_for(held, group)[0] == 1
        index, incarnation, new_pid = wait_for(handle.submit("whoami"), group)[0]
        assert (index, incarnation) == (1, 1) and new_pid != pid
        assert group.handles[0].call("whoami")[1] == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        group.stop()


def test_the_roles_and_services_of_a_backend_spend_one_restart_budget():
    """`--max-restarts` counts the run's restarts in all: a service that fails to start once and a role that raises
    once are two restarts, one too many for a limit of 1, though each group restarted only once."""
    backend = make_backend("local")
    shared = backend.share({"net": torch.nn.Linear(2, 1)})
    weights, counter, stop = backend.weight_version(), backend.step_counter(1), backend.stop_flag()
    services = backend.start_services(make_tally_failing_first, 1, max_restarts=1, name="server")
    make_role = partial(ScriptedRole, shared=shared, weights=weights, fail="raise")  # raises at its second item
    pool = backend.start(make_role, 1, counter, stop, total_steps=10**6, credits=1, max_restarts=1)
    try:
        crash_both_past_one_budget(services, pool)
    finally:
        stop.set()
        pool.stop()
        services.stop()


class Unreachable(Pending):
    """What a handle's call gives once its service stayed unreachable for its `reconnect_s`."""

    def result(self, timeout=None):
        raise ServiceUnavailable("service 0 unreachable for 60 s")


TROUBLE = {  # what the learner's request for a batch gets: (the Pending it waits on, the failure's first line)
    "raises": (
        lambda run, shard: run.services.handles[shard].submit("update_priorities", np.arange(2), np.ones(3)),
        "service 0's update_priorities raised ValueError: 3 priorities for 2 ids",
    ),
    "unreachable": (lambda run, shard: Unreachable(), "service 0 unreachable for 60 s"),
}


def apex_run_in_trouble(monkeypatch, tmp_path, backend: str, trouble: str) -> None:
    """An Ape-X run whose learner, once its replay is ready, gets `TROUBLE[trouble]` from its first request for a batch:
    the run must stop as a failure (`RunFailure`, its run folder named) with its checkpoint and `result.json`, the
    service's error in its first line."""
    from rlfleet.arch import apex

    make_pending, says = TROUBLE[trouble]

    def ask(self):
        shard = self.choose_shard()
        return None if shard is None else make_pending(self, shard)

    monkeypatch.setattr(apex.ApexRunner, "_ask", ask)
    with pytest.raises(RunFailure) as caught:
        train("dqn", "CartPole-v1", arch="apex", actors=1, replay_shards=1, backend=backend, steps=5_000,
              eval_every=10**6, eval_episodes=1, stop_return=1e9, overrides={"learning_starts": 300, "batch_size": 32},
              logdir=str(tmp_path), name="r", progress=False)  # fmt: skip
    run = tmp_path / "r"
    assert caught.value.run_dir == run and str(caught.value).splitlines()[0] == says, caught.value
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "failure" and result["failure"].splitlines()[0] == says, result
    assert load_checkpoint(run)["env_steps"] == result["env_steps"] >= 300
    assert f"the run stops: {says}" in (run / "workers.log").read_text()


@pytest.mark.parametrize("backend, trouble", [("local", "raises"), ("serial", "unreachable")])
def test_a_service_that_raises_or_stays_unreachable_where_the_learner_calls_it_stops_the_run_cleanly(
    monkeypatch, tmp_path, backend, trouble
):
    """A bug in a service (a method that raises) or a service gone for good (unreachable past its handle's wait) is
    nothing the run can go on past: it stops as on any failure (checkpoint, `result.json`), then says why. (The serial
    backend's services raise their own exceptions where they happen: it is the unreachable case's quick run.)"""
    apex_run_in_trouble(monkeypatch, tmp_path, backend, trouble)


@pytest.mark.parametrize("answered, eval_every", [(1, 1000), (0, 10**6)], ids=["in-the-loop", "final-evaluation"])
def test_a_parameter_server_that_raises_when_pulled_stops_the_run_with_the_last_snapshot(
    monkeypatch, tmp_path, answered, eval_every
):
    """param_server's coordinator pulls its servers for every evaluation and checkpoint, the final ones too. A server
    whose `state` raises, at an evaluation in the loop or at the final one after it, stops the run as a failure, with
    a checkpoint of the last snapshot pulled (version 0 where none was), `result.json`, and the error's first line."""
    from failing_servers import ServersFailingState

    from rlfleet.arch import param_server

    monkeypatch.setattr(ServersFailingState, "FAIL_AFTER", answered)
    monkeypatch.setattr(param_server, "ShardServers", ServersFailingState)
    says = "service 0's state raised ValueError: state fails on purpose"
    with pytest.raises(RunFailure) as caught:
        train("a2c", "CartPole-v1", arch="param_server", backend="local", workers=1, steps=3000, eval_every=eval_every,
              eval_episodes=1, logdir=str(tmp_path), name="r", progress=False)  # fmt: skip
    run = tmp_path / "r"
    assert caught.value.run_dir == run and str(caught.value).splitlines()[0] == says, caught.value
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "failure" and result["failure"].splitlines()[0] == says, result
    saved = load_checkpoint(run)
    assert saved["env_steps"] == result["env_steps"]
    assert (saved["param_server"]["version"] > 0) == (answered > 0), saved["param_server"]["version"]
    assert f"the run stops: {says}" in (run / "workers.log").read_text()


def test_a_parameter_server_past_the_restart_limit_stops_the_run_with_its_checkpoint(monkeypatch, tmp_path):
    """A server that dies whenever it is pulled, with --max-restarts 1: restarted once, then dead past the limit. The
    run stops as on any failure (checkpoint, `result.json`); the final pull meets the same dead server, which is
    that failure again, not another crash."""
    from failing_servers import ServersExitingAtState

    from rlfleet.arch import param_server

    monkeypatch.setattr(param_server, "ShardServers", ServersExitingAtState)
    with pytest.raises(RunFailure) as caught:
        train("a2c", "CartPole-v1", arch="param_server", backend="local", workers=1, steps=3000, eval_every=1000,
              eval_episodes=1, max_restarts=1, logdir=str(tmp_path), name="r", progress=False)  # fmt: skip
    run = tmp_path / "r"
    says = str(caught.value).splitlines()[0]  # every shard's server dies when pulled: the second to die is named
    assert re.fullmatch(r"servers crashed 2 times \(limit 1\); last: server \d died \(exit code 3\)", says), says
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "failure" and result["failure"].splitlines()[0] == says, result
    assert load_checkpoint(run)["env_steps"] == result["env_steps"]
    assert (run / "workers.log").read_text().count("the run stops") == 1

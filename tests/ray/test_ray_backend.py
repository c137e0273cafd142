"""The `ray` backend: roles as Ray actors on a private loopback instance (one per module). Credits and published
weights, crashes with their traceback, killed and hung actors restarted, one restart budget for roles and services,
services that raise or keep dying ending a run cleanly, the same weights as the serial backend, the connection this
process has used as a cluster (another --address refused), and A2C solving CartPole-v1 with two actors on
data_parallel, grad_parallel and async_grad (one killed mid-run)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from procs import stop_process
from seeds import first_solving
from spawned import (
    ScriptedRole,
    crash_both_past_one_budget,
    make_tally,
    make_tally_failing_first,
    make_tally_never_starting,
)

from rlfleet.arch import parallel
from rlfleet.arch.parallel import OVERSUBSCRIBE_LIMIT, ParallelOptions
from rlfleet.backends import RunFailure, ServiceError, WorkerFailure
from rlfleet.backends.ray_backend import RayBackend
from rlfleet.launch import check_run, train
from rlfleet.run.checkpoint import load_checkpoint
from rlfleet.run.config import ConfigError
from rlfleet.run.evaluate import evaluate_checkpoint

pytestmark = pytest.mark.usefixtures("ray_instance")


def start_group(tmp_path: Path, n: int = 2, credits: int | None = 1, fail=None, **kwargs):
    backend = RayBackend(ParallelOptions(backend="ray", workers=n))
    shared = backend.share({"net": torch.nn.Linear(2, 1)})
    with torch.no_grad():
        shared["net"].weight.fill_(1.0)
    weights, counter, stop = backend.weight_version(), backend.step_counter(1), backend.stop_flag()
    make_role = partial(ScriptedRole, shared=shared, weights=weights, fail=fail)
    group = backend.start(make_role, n, counter, stop, total_steps=1_000, credits=credits,
                          pids_file=tmp_path / "workers.json", **kwargs)  # fmt: skip
    return backend, group, shared, weights, counter


def test_roles_run_at_most_their_credits_ahead_and_act_with_the_newest_published_weights(tmp_path):
    backend, group, shared, weights, counter = start_group(tmp_path)
    try:
        first = [group.get(w, 60) for w in range(2)]
        assert [item[:5] for item in first] == [(0, 0, 1, 0, 1.0), (1, 0, 1, 0, 1.0)]
        assert group.get(0, 0.5) is None  # one credit: nothing more until the coordinator has used that item
        with weights.writing(), torch.no_grad():
            shared["net"].weight.fill_(5.0)
        counter.add(123)
        group.release(0, 0)
        assert group.get(0, 30) == (0, 0, 2, 1, 5.0, 123)  # version 1, its weights, the step count of the call
        assert group.get_any(0.5) is None  # worker 1 has not been given its credit back
        places = json.loads((tmp_path / "actors.json").read_text())
        assert set(places) == {"0", "1"} and all(p["ip"] == "127.0.0.1" for p in places.values())
        assert json.loads((tmp_path / "workers.json").read_text()) == {w: p["pid"] for w, p in places.items()}
    finally:
        group.stop()
        backend.close()
    assert not (tmp_path / "workers.json").exists() and (tmp_path / "actors.json").exists()


def test_without_credits_a_role_keeps_producing_without_releases(tmp_path):
    backend, group, *_ = start_group(tmp_path, n=1, credits=None)
    try:
        assert [group.get(0, 60)[2] for _ in range(5)] == [1, 2, 3, 4, 5]  # no release in between
    finally:
        group.stop()


def test_weights_are_put_in_the_object_store_once_per_version(tmp_path):
    backend = RayBackend(ParallelOptions(backend="ray"))
    backend.share({"net": torch.nn.Linear(2, 1)})
    weights = backend.weight_version()
    version, first = backend.publish(has=-1)
    assert version == 0 and first is not None
    assert backend.publish(has=-1)[1] is first  # the same object for every actor that lacks it
    assert backend.publish(has=0) == (0, None)  # an actor that has it gets nothing
    with weights.writing():
        pass
    version, second = backend.publish(has=0)
    assert version == 1 and second is not None and second is not first


def test_a_role_that_raises_is_reported_with_its_traceback_and_restarted(tmp_path):
    backend, group, *_ = start_group(tmp_path, n=1, fail="raise")
    try:
        assert group.get(0, 60)[:3] == (0, 0, 1)
        group.release(0, 0)
        deadline = time.monotonic() + 30
        while not (crashes := group.check()):
            assert group.get(0, 0.2) is None and time.monotonic() < deadline
        assert len(crashes) == 1 and "role 0 fails on purpose" in crashes[0].describe()
        assert "Traceback" in crashes[0].describe()
        assert group.incarnations == [1] and group.restarts == 1
        assert group.get(0, 60)[:3] == (0, 1, 1)  # the next incarnation, from its first item
    finally:
        group.stop()


def test_a_killed_actor_is_reported_and_restarted_and_the_restart_limit_holds(tmp_path):
    backend, group, *_ = start_group(tmp_path, n=1, credits=2, max_restarts=1)
    try:
        assert group.get(0, 60) is not None
        for kill in range(2):
            pid = json.loads((tmp_path / "workers.json").read_text())["0"]
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            crashes = []
            while not crashes:
                if (item := group.get(0, 0.2)) is not None:  # made before the kill: keep calls in flight
                    group.release(0, item[1])
                assert time.monotonic() < deadline, "the killed actor was not noticed"
                try:
                    crashes = group.check()
                except WorkerFailure as exc:
                    assert kill == 1 and "limit 1" in str(exc), exc  # the second restart is one too many
                    return
            assert kill == 0 and "died" in crashes[0].describe()
            assert group.get(0, 60)[1] == 1  # the restarted incarnation produces
        raise AssertionError("the restart limit did not hold")
    finally:
        group.stop()


def test_a_restart_holds_up_neither_the_coordinator_nor_the_other_roles(tmp_path):
    """Worker 0's next incarnation takes SLOW_START_S to build: `check()` restarts it and returns without waiting
    for it (where it runs is recorded when it answers), and worker 1's items keep coming meanwhile (a restart used
    to hold the whole run while every actor was asked where it runs)."""
    backend, group, *_ = start_group(tmp_path, n=2, fail="slow_restart")
    try:
        for worker in (0, 1):
            group.release(worker, group.get(worker, 60)[1])
        os.kill(json.loads((tmp_path / "workers.json").read_text())["0"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not (crashes := group.check()):
            if (item := group.get_any(0.2)) is not None:
                group.release(item[0], item[1])
            assert time.monotonic() < deadline, "the killed actor was not noticed"
        assert [c.worker for c in crashes] == [0] and 0 in group.places.pending  # asked, not waited for
        served = 0
        while served < 5:
            item = group.get(1, 5)
            assert item is not None, "worker 1 stopped while worker 0 restarted"
            group.release(1, item[1])
            assert not group.check()
            served += 1
        assert 0 in group.places.pending  # all that while, worker 0's next incarnation was still building
        assert group.get(0, 60)[:2] == (0, 1)
        group.check()
        assert "0" in json.loads((tmp_path / "workers.json").read_text())
    finally:
        group.stop()


def test_a_hung_role_is_killed_for_want_of_a_heartbeat_and_restarted(tmp_path):
    backend, group, *_ = start_group(tmp_path, n=1, fail="hang", heartbeat_s=1.0)
    try:
        assert group.get(0, 60)[:3] == (0, 0, 1)
        group.release(0, 0)
        deadline = time.monotonic() + 30
        while not (crashes := group.check()):
            assert group.get(0, 0.2) is None and time.monotonic() < deadline
        assert "no heartbeat" in crashes[0].describe()
        assert group.get(0, 60)[:2] == (0, 1)
    finally:
        group.stop()


def test_the_heartbeat_counts_from_when_the_actor_starts_a_call_not_from_when_it_was_issued(tmp_path):
    """Two calls in flight (credits 2), each item 0.7 s against a 1 s heartbeat: the second call waits for the first
    in the actor, and counted from its issue it looked hung after every item (killed and restarted each time)."""
    backend, group, *_ = start_group(tmp_path, n=1, credits=2, fail="slow", heartbeat_s=1.0)
    try:
        items = []
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            assert group.check() == []
            if (item := group.get(0, 0.1)) is not None:
                items.append(item)
                group.release(0, item[1])
        assert len(items) >= 4 and {item[1] for item in items} == {0} and group.restarts == 0
    finally:
        group.stop()


def test_services_are_named_actors_that_keep_their_handles_across_a_restart(tmp_path):
    backend = RayBackend(ParallelOptions(backend="ray"))
    services = backend.start_services(make_tally, 2, max_restarts=3, pids_file=tmp_path / "servers.json",
                                      name="server")  # fmt: skip
    try:
        assert [p.result(timeout=60) for p in [h.submit("add", 5) for h in services.handles]] == [5, 5]
        with pytest.raises(ServiceError, match="(?s)service 0's fail raised.*ValueError: fails on purpose"):
            services.handles[0].call("fail")
        assert services.handles[0].call("add", 1) == 6  # still serving, its total kept
        handle = services.handles[1]
        pid = handle.call("whoami")[2]
        assert json.loads((tmp_path / "servers.json").read_text())["1"] == pid
        held = handle.submit("hold", 1.0)  # the service dies while it runs this call: sent again
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        deadline, crashes = time.monotonic() + 60, []
        while not crashes:
            assert time.monotonic() < deadline, "the killed service was not noticed"
            crashes = services.check()
            time.sleep(0.1)
        assert "server 1 died" in crashes[0].describe() and services.incarnations == [0, 1]
        assert held.result(timeout=60) == 1.0
        index, incarnation, new_pid = handle.call("whoami")
        assert (index, incarnation) == (1, 1) and new_pid != pid
        assert services.handles[0].call("add", 1) == 7  # the other one was left alone
    finally:
        services.stop()


def test_a_service_that_never_starts_is_restarted_until_the_restart_limit_ends_it_with_its_cause(tmp_path):
    """The coordinator restarts the service each time its actor dies (its constructor raises: as an actor that cannot
    get a thread would); the call it waits on is sent again to each new incarnation, and the restart limit, not the
    call, ends it: a `WorkerFailure` with Ray's reason (a run then stops cleanly), as on `local`."""
    backend = RayBackend(ParallelOptions(backend="ray"))
    services = backend.start_services(make_tally_never_starting, 1, max_restarts=4, name="server")
    try:
        pending = services.handles[0].submit("add", 1)
        deadline = time.monotonic() + 300
        with pytest.raises(WorkerFailure, match=r"^servers crashed 5 times \(limit 4\); last: server 0 died:(?s:.*)"
                                                 r"service 0 cannot start"):  # fmt: skip
            while True:  # what the coordinator's waits on a service do (`ParallelRunner.wait_service`)
                assert time.monotonic() < deadline, f"{services.restarts} restarts, no failure"
                try:
                    pending.result(timeout=0.2)
                except TimeoutError:
                    services.check()
        assert services.restarts == 5
    finally:
        services.stop()


def test_the_roles_and_services_of_a_backend_spend_one_restart_budget(tmp_path):
    """`--max-restarts` counts the run's restarts in all: a service that fails to start once and a role that raises
    once are two restarts, one too many for a limit of 1, though each group restarted only once."""
    backend, group, *_ = start_group(tmp_path, n=1, credits=1, fail="raise", max_restarts=1)
    services = backend.start_services(make_tally_failing_first, 1, max_restarts=1, name="server")
    try:
        crash_both_past_one_budget(services, group)
    finally:
        group.stop()
        services.stop()


def apex_run(run_opts, **options):
    """A short Ape-X run on ray, one actor and one replay shard, learning from its 300th step, named "r"."""
    return train("dqn", "CartPole-v1", arch="apex", actors=1, replay_shards=1, backend="ray", eval_every=10**9,
                 eval_episodes=1, stop_return=1e9, overrides={"learning_starts": 300, "batch_size": 32}, name="r",
                 **options, **run_opts)  # fmt: skip


def assert_stopped_as_failure(run: Path, failure: RunFailure, says: str) -> None:
    """The run stopped as a failure whose first line matches `says`: its checkpoint, `result.json`, the reason."""
    assert failure.run_dir == run and re.search(says, str(failure).splitlines()[0]), failure
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "failure" and re.search(says, result["failure"].splitlines()[0]), result
    assert load_checkpoint(run)["env_steps"] == result["env_steps"] >= 300


def test_a_service_method_that_raises_where_the_learner_calls_it_stops_the_run_cleanly(monkeypatch, run_opts, tmp_path):
    """The learner's first request for a batch is a call the replay shard raises on (a bug in a service): the run
    stops as a failure, with its checkpoint and `result.json`, and the service's error in the failure's first line."""
    from rlfleet.arch import apex

    def ask(self):
        shard = self.choose_shard()
        return None if shard is None else self.services.handles[shard].submit("update_priorities", [0, 1], [1.0])

    monkeypatch.setattr(apex.ApexRunner, "_ask", ask)
    with pytest.raises(RunFailure) as caught:
        apex_run(run_opts, steps=5_000)
    says = "^service 0's update_priorities raised ValueError: 1 priorities for 2 ids$"
    assert_stopped_as_failure(tmp_path / "r", caught.value, says)


@pytest.mark.timeout(600)
def test_a_replay_shard_whose_restarts_keep_dying_ends_the_run_at_the_restart_limit(monkeypatch, run_opts, tmp_path):
    """The shard is killed once the learner samples it, and none of its restarts can start (as a shard that runs out
    of memory when rebuilt): the learner's sample, waiting on it, goes to each new incarnation until the run's restart
    limit ends the run as a failure, with its checkpoint and `result.json`, as on `local`."""
    from rlfleet.arch import apex

    start_workers = apex.ApexRunner.start_workers

    def start_then_break_the_shards(self, stop_flag, logger):
        pool = start_workers(self, stop_flag, logger)
        self.services.make_service = make_tally_never_starting  # what each restart builds
        return pool

    monkeypatch.setattr(apex.ApexRunner, "start_workers", start_then_break_the_shards)
    run = tmp_path / "r"
    killed: list[int] = []

    def kill_the_shard_once_sampled() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if "losses/" in (run / "metrics.csv").read_text():
                    pid = json.loads((run / "shards.json").read_text())["0"]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_shard_once_sampled, daemon=True)
    killer.start()
    try:
        with pytest.raises(RunFailure) as caught:
            apex_run(run_opts, steps=50_000, max_restarts=4)
    finally:
        killer.join(timeout=1)
    assert killed, "the shard was not killed"
    assert_stopped_as_failure(run, caught.value, r"^replay shards crashed .*\(limit 4\); last: replay shard 0 died")
    assert "service 0 cannot start" in json.loads((run / "result.json").read_text())["failure"]


def gcs_rss_mib() -> float:
    """Resident memory of this module's Ray instance's GCS server (its session is named after this process)."""
    from procs import ray_processes

    (pid,) = [pid for pid, cmd in ray_processes().items()
              if "gcs_server" in cmd and "--session-name=session_" in cmd and f"_{os.getpid()} " in cmd]  # fmt: skip
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


def test_calls_leave_no_task_events_in_the_gcs(tmp_path):
    """Every item, block, sample and gossip round is a call to an actor: Ray must not keep an event for each in
    the GCS (about 3.4 KB per call with Ray 2.60's default, 20k calls: +70 MB), or a long run's GCS grows."""
    backend = RayBackend(ParallelOptions(backend="ray"))
    services = backend.start_services(make_tally, 1, name="server")
    try:
        handle = services.handles[0]
        assert handle.call("add", 1) == 1
        time.sleep(2.0)  # the events of the start are reported (every second)
        before = gcs_rss_mib()
        for _ in range(20):
            [p.result(timeout=60) for p in [handle.submit("add", 1) for _ in range(1_000)]]
        time.sleep(3.0)
        grown = gcs_rss_mib() - before
    finally:
        services.stop()
    assert grown < 20, f"the GCS grew by {grown:.0f} MiB over 20k calls"


@pytest.mark.parametrize("arch", ["data_parallel", "grad_parallel"])
def test_ray_and_serial_backends_end_with_the_same_weights(arch, run_opts):
    runs = {backend: train("a2c", "CartPole-v1", arch=arch, workers=1, backend=backend, steps=1_200, seed=3,
                           eval_every=1_200, eval_episodes=1, stop_return=1e9, name=backend, **run_opts)
            for backend in ("serial", "ray")}  # fmt: skip
    a, b = (load_checkpoint(runs[k]["checkpoint"])["algo"]["model"] for k in ("serial", "ray"))
    assert runs["ray"]["updates"] == runs["serial"]["updates"] > 0
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_hogwild_and_ray_only_options_are_refused_clearly(run_opts):
    with pytest.raises(ConfigError, match="hogwild updates parameters in shared memory.*--arch async_grad"):
        train("a3c", "CartPole-v1", arch="hogwild", backend="ray", **run_opts)
    with pytest.raises(ConfigError, match="--address is an option of the ray backend; add --backend ray"):
        train("a2c", "CartPole-v1", arch="data_parallel", address="auto", **run_opts)
    with pytest.raises(ConfigError, match="^--address 'nowhere' is not HOST:PORT"):
        train("a2c", "CartPole-v1", arch="data_parallel", backend="ray", address="nowhere", **run_opts)
    with pytest.raises(ConfigError, match="^--address 127.0.0.1:1: nothing answers: "):
        train("a2c", "CartPole-v1", arch="data_parallel", backend="ray", address="127.0.0.1:1", **run_opts)
    with pytest.raises(ConfigError, match="^--placement: no node of the connected Ray cluster offers node9$"):
        train("a2c", "CartPole-v1", arch="data_parallel", backend="ray", placement="node9", **run_opts)
    assert not any(Path(run_opts["logdir"]).iterdir())  # refused before anything was written


def test_an_address_where_something_else_listens_is_refused_at_once_and_ray_itself_passes(ray_instance, run_opts):
    """Ray retries its connection for ever where something that is not Ray listens (a web server here); the check
    asks for an HTTP/2 answer, which Ray's GCS gives and the web server does not."""
    import http.server
    import threading

    from rlfleet.backends.ray_instance import grpc_problem

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        with pytest.raises(ConfigError, match=f"^--address {address}: something listens there, but not a Ray"):
            train("a2c", "CartPole-v1", arch="data_parallel", backend="ray", address=address, **run_opts)
    finally:
        server.shutdown()
        server.server_close()
    assert not any(Path(run_opts["logdir"]).iterdir())
    host, _, port = ray_instance.get_runtime_context().gcs_address.rpartition(":")
    assert grpc_problem(host, int(port)) is None


def test_an_address_other_than_the_connected_cluster_s_is_refused_and_its_own_passes(ray_instance, run_opts):
    """This process is connected to Ray already (the module's instance, as a user's `ray.init`), and a run uses that
    connection: an --address naming another cluster (here a gRPC server, which passes the checks of a Ray GCS) is
    refused in one line instead of being ignored; the connected cluster's own address passes."""
    from concurrent import futures

    import grpc

    gcs = ray_instance.get_runtime_context().gcs_address
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    other = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        says = f"^--address {other}: this process is connected to the Ray cluster at {re.escape(gcs)} already"
        with pytest.raises(ConfigError, match=says):
            train("a2c", "CartPole-v1", arch="data_parallel", backend="ray", address=other, steps=1_000, **run_opts)
    finally:
        server.stop(None)
    assert not any(Path(run_opts["logdir"]).iterdir())
    port = gcs.rpartition(":")[2]
    for same in (gcs, f"localhost:{port}"):
        check_run("a2c", "CartPole-v1", arch="data_parallel", backend="ray", address=same)


def test_on_the_connected_cluster_the_role_count_is_not_held_to_this_machine_s_cores(monkeypatch):
    """A process connected to Ray before the run runs its roles there, as with --address: the cluster's resources, not
    this machine's cores, decide how many fit (Ray starts what its free CPUs hold, the others wait)."""
    monkeypatch.setattr(parallel, "usable_cores", lambda: 1)
    many = OVERSUBSCRIBE_LIMIT + 1
    check_run("a2c", "CartPole-v1", arch="data_parallel", backend="ray", workers=many)
    says = f"--workers {many} asks for {many} CPUs, more than {OVERSUBSCRIBE_LIMIT} times the 1 core"
    with pytest.raises(ConfigError, match=says):
        check_run("a2c", "CartPole-v1", arch="data_parallel", backend="local", workers=many)


def test_without_ray_installed_the_ray_backend_says_how_to_get_it(run_opts, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^--backend ray needs Ray, an extra: pip install -e '\.\[ray\]'$"):
        train("a2c", "CartPole-v1", arch="async_grad", backend="ray", **run_opts)


def test_the_private_instance_listens_on_loopback_only(ray_instance):
    from procs import ray_processes

    inodes = set()
    for pid in ray_processes():
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN, owned by a Ray process
                listening.append(fields[1])
    assert len(listening) >= 3  # GCS, raylet, object manager at least
    # 127.0.0.1, ::1 and ::ffff:127.0.0.1, as /proc writes them
    loopback = ("0100007F:", "00000000000000000000000001000000:", "0000000000000000FFFF00000100007F:")
    assert all(address.startswith(loopback) for address in listening), listening


def test_a_group_that_cannot_start_gives_back_the_cpus_of_the_roles_it_placed(tmp_path, monkeypatch):
    """Five roles of one CPU each on the module's 4-CPU instance: four are placed, one never is. The start fails,
    and the four placed actors are killed then, not when the last reference to the group (the failure's traceback)
    goes: the next run finds every CPU free."""
    import ray

    from rlfleet.backends import ray_roles

    monkeypatch.setattr(ray_roles, "STARTUP_GRACE_S", 10.0)
    total = ray.cluster_resources()["CPU"]
    with pytest.raises(WorkerFailure, match=r"1 of 5 roles did not start within 10 s") as failure:
        start_group(tmp_path, n=5)
    deadline = time.monotonic() + 120  # the kills are asynchronous: a bound with room on a busy machine
    while ray.available_resources().get("CPU", 0.0) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) == total, (failure.value, ray.available_resources())


def test_the_private_instance_runs_its_actors_at_the_niceness_of_the_run(tmp_path):
    """Ray starts its workers at niceness 15 unless told otherwise: beside a learner, or anything else busy, an actor
    got a small share of a core and took a minute to import torch. The private instance's actors run as the run
    does."""
    _, group, *_ = start_group(tmp_path, n=1)
    try:
        pid = json.loads((tmp_path / "workers.json").read_text())["0"]
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        group.stop()


# ------------------------------------------------------------------------------------------------------ learning
BUDGETS = {"data_parallel": 100_000, "grad_parallel": 150_000, "async_grad": 150_000, "param_server": 150_000}


@pytest.mark.learning
@pytest.mark.parametrize("arch", list(BUDGETS))
def test_a2c_solves_cartpole_with_two_ray_actors(arch, run_opts):
    extra = {"shards": 2} if arch == "param_server" else {}  # as on the local backend
    # up to three seeds: the actors' interleaving varies with the machine's load (one data_parallel run of seed 0 in
    # a loaded full test run peaked at 355.8 of 475)
    a2c = partial(train, "a2c", "CartPole-v1", arch=arch, workers=2, backend="ray", steps=BUDGETS[arch],
                  eval_every=5_000, **extra, **run_opts)  # fmt: skip
    result, tried = first_solving(a2c)
    assert result["solved"], f"a2c on {arch} with ray: {tried}"
    assert result["eval_return_mean"] >= 475


def test_two_ray_samplers_feed_every_policy_of_a_multi_agent_env(run_opts):
    """A PettingZoo env on data_parallel with Ray actors as samplers: both players' policies learn from them."""
    result = train("dqn", "pettingzoo:pettingzoo.classic.tictactoe_v3", arch="data_parallel", workers=2, n_envs=2,
                   backend="ray", policies="separate", steps=1_500, overrides={"learning_starts": 200},
                   eval_episodes=2, **run_opts)  # fmt: skip
    assert result["trained_policies"] == ["player_1", "player_2"] and result["updates"] > 0
    assert result["env_steps"] >= 1_500 and set(result["eval_agents"]) == {"player_1", "player_2"}


@pytest.mark.learning
@pytest.mark.slow  # -m slow: CI has the run above, and the same learning run on the local backend
def test_dqn_on_tictactoe_with_two_ray_samplers_beats_a_random_player(run_opts):
    """A multi-agent env on data_parallel with ray actors as samplers (tests/learning/test_multi_agent.py: the same
    run on the local backend)."""
    result = train("dqn", "pettingzoo:pettingzoo.classic.tictactoe_v3", arch="data_parallel", workers=2, n_envs=2,
                   backend="ray", policy_map="player_1=learner,player_2=random", steps=20_000, seed=0,
                   eval_every=20_000, **run_opts)  # fmt: skip
    games = evaluate_checkpoint(result.run_dir, episodes=200, seed=123)["agent_returns"]["player_1"]
    assert sum(g == 1.0 for g in games) >= 0.8 * len(games), result.result  # as on the local backend


@pytest.mark.learning
def test_ppo_solves_cartpole_on_two_allreduce_learners_as_ray_actors(run_opts):
    result = train("ppo", "CartPole-v1", arch="allreduce", workers=2, backend="ray", steps=100_000, seed=0,
                   eval_every=5_000, **run_opts)  # fmt: skip
    assert result["solved"], f"ppo on allreduce with ray: {result.result}"
    assert result["eval_return_mean"] >= 475


@pytest.mark.learning
@pytest.mark.slow  # -m slow: test_ray_cluster.py has Ape-X solving on ray, actors and shards on two nodes
def test_apex_dqn_with_three_ray_actors_solves_cartpole(run_opts):
    """Ape-X: actors and replay shards as Ray actors (the shards are named services), the learner in the driver."""
    result = train("dqn", "CartPole-v1", arch="apex", actors=3, backend="ray", steps=100_000, seed=0,
                   eval_every=5_000, **run_opts)  # fmt: skip
    assert result["solved"], f"apex dqn with ray: {result.result}"
    assert result["eval_return_mean"] >= 475


@pytest.mark.learning
def test_an_actor_killed_mid_run_is_restarted_and_the_run_still_solves(run_opts, tmp_path):
    run = tmp_path / "killed"
    killed: list[int] = []

    def kill_one_actor() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            try:
                pid = json.loads((run / "workers.json").read_text())["0"]  # worker 1 may be listed first
            except (FileNotFoundError, json.JSONDecodeError, KeyError):
                time.sleep(0.1)
                continue
            time.sleep(0.3)  # the actors are producing
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_one_actor, daemon=True)
    killer.start()
    result = train(
        "a2c",
        "CartPole-v1",
        arch="async_grad",
        workers=2,
        backend="ray",
        steps=150_000,
        seed=0,
        eval_every=10_000,
        name="killed",
        **run_opts,
    )  # fmt: skip (the first evaluation after the kill)
    killer.join(timeout=1)
    assert killed, "no actor was killed"
    log = (run / "workers.log").read_text()
    assert "worker 0 died" in log and "restarting it" in log, log
    assert result["solved"], result.result


def test_a_hung_service_actor_is_killed_for_want_of_an_answer_and_restarted(tmp_path):
    """A SIGSTOPped service actor answers no ping: after `heartbeat_s` it is reported as hung, killed and restarted
    under its name; the call it held goes to the next incarnation, the other service is left alone."""
    backend = RayBackend(ParallelOptions(backend="ray"))
    services = backend.start_services(make_tally, 2, max_restarts=3, pids_file=tmp_path / "shards.json",
                                      name="replay shard", heartbeat_s=2.0)  # fmt: skip
    pid = None
    try:
        handle = services.handles[1]
        pid = handle.call("whoami")[2]
        assert json.loads((tmp_path / "shards.json").read_text())["1"] == pid
        deadline = time.monotonic() + 30
        while not services.answered[1]:  # its first ping answered: no start-up grace from now on
            assert services.check() == [] and time.monotonic() < deadline
            time.sleep(0.05)
        stop_process(pid)
        stopped_at = time.monotonic()
        held = handle.submit("whoami")
        crashes = []
        while not crashes:
            assert time.monotonic() - stopped_at < 30, "the stopped service was not killed"
            crashes = services.check()
            time.sleep(0.05)
        assert time.monotonic() - stopped_at >= 2.0 and services.unwell_at > stopped_at
        text = crashes[0].describe()
        assert text.startswith("replay shard 1 died: no answer for ") and "(hung), so it was killed" in text
        assert services.incarnations == [0, 1] and services.restarts == 1
        index, incarnation, new_pid = held.result(timeout=60)
        assert (index, incarnation) == (1, 1) and new_pid != pid
        assert services.handles[0].call("whoami")[1] == 0
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
            assert time.monotonic() < deadline, "the hung actor's process is still there"
            time.sleep(0.1)
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        services.stop()


@pytest.mark.timeout(300)  # without service liveness the run never ends
@pytest.mark.parametrize(
    "arch, algo, pids_file, name, options",
    [
        pytest.param(
            "apex",
            "dqn",
            "shards.json",
            "replay shard",
            {"actors": 2, "replay_shards": 2, "steps": 20_000},
            marks=pytest.mark.slow,
        ),  # CI time: the local backend drills a hung replay shard
        ("param_server", "a2c", "servers.json", "server", {"workers": 2, "shards": 2, "steps": 60_000}),
    ],
)
def test_a_sigstopped_service_actor_is_killed_as_hung_and_its_callers_survive(
    run_opts, tmp_path, arch, algo, pids_file, name, options
):
    """Service 1's actor process is SIGSTOPped once the run learns: the roles blocked in calls to it are not killed
    as hung (their heartbeat is held while it does not answer); after --heartbeat-s the service is named, killed
    (`ray.kill`) and restarted, and the run spends its whole budget."""
    run = tmp_path / "hung"
    stopped: list[int] = []

    def stop_service_1() -> None:
        deadline = time.monotonic() + 180
        marker = "losses/loss" if arch == "apex" else "charts/policy_lag"
        while time.monotonic() < deadline:
            metrics = run / "metrics.csv"
            if (run / pids_file).exists() and metrics.exists() and marker in metrics.read_text():
                pid = json.loads((run / pids_file).read_text())["1"]
                stop_process(pid)
                stopped.append(pid)
                return
            time.sleep(0.1)

    stopper = threading.Thread(target=stop_service_1, daemon=True)
    stopper.start()
    try:
        result = train(algo, "CartPole-v1", arch=arch, backend="ray", heartbeat_s=8.0, seed=0, eval_every=10**9,
                       stop_return=float("inf"), name="hung", **options, **run_opts)  # fmt: skip
    finally:
        stopper.join(timeout=1)
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert stopped, "the service was not stopped before the run ended"
    log = (run / "workers.log").read_text()
    assert re.search(rf"{name} 1 died: no answer for \d+ s \(hung\), so it was killed\nrestarting it", log), log
    assert "worker" not in log, log  # no role was killed as hung (nor died)
    assert result["stopped_by"] == "steps" and result["env_steps"] >= options["steps"], result.result


def test_a_user_network_is_built_by_the_ray_actors_from_its_import_path(run_opts, tmp_path, monkeypatch):
    """The actors import the network by its path (the tests folder is on their PYTHONPATH) and the run goes on with
    it; a path that imports in the driver only (its folder on the driver's sys.path alone) ends the run with the
    actors' import error, once the restarts are spent."""
    result = train("a2c", "CartPole-v1", arch="data_parallel", workers=2, backend="ray", net="user_nets:Scaled",
                   steps=2_000, eval_every=2_000, eval_episodes=1, **run_opts)  # fmt: skip
    assert result["env_steps"] >= 2_000
    (tmp_path / "driver_only_nets.py").write_text("from user_nets import mlp\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(WorkerFailure, match=r"driver_only_nets"):
        train("a2c", "CartPole-v1", arch="data_parallel", workers=2, backend="ray", net="driver_only_nets:mlp",
              max_restarts=1, steps=2_000, eval_every=2_000, eval_episodes=1, name="d", **run_opts)  # fmt: skip

"""data_parallel, grad_parallel, param_server, allreduce, gossip and apex with real worker processes: a SIGKILLed
worker (or parameter server, or replay shard) is restarted and the run finishes; Ctrl-C leaves a checkpoint and no
process behind; a hung gossip learner is named in the error that ends the run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import RLFLEET, kill_session, session_processes, stop_process, wait_until_gone

from rlfleet.arch.gossip import GossipTimeout
from rlfleet.launch import train
from rlfleet.run.checkpoint import load_checkpoint


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*RLFLEET, "train", *args, "--logdir", str(tmp_path), "--name", "r", "--no-progress"],
        cwd=tmp_path,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_workers(proc: subprocess.Popen, run: Path, n: int, timeout: float = 120) -> dict[str, int]:
    """The workers' pids, once all of them run and the learner has logged what it took in from them."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"training ended early ({proc.returncode}):\n{proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no {n} workers after {timeout} s"
        if (run / "workers.json").exists() and (run / "metrics.csv").exists():
            pids = json.loads((run / "workers.json").read_text())
            if len(pids) == n and "charts/policy_lag" in (run / "metrics.csv").read_text():
                return pids
        time.sleep(0.2)


@pytest.mark.parametrize(
    "algo, arch, steps",
    [
        pytest.param("a2c", "data_parallel", 200_000, marks=pytest.mark.slow),  # -m slow: tests/drills.py kills these
        pytest.param("dqn", "data_parallel", 20_000, marks=pytest.mark.slow),
        pytest.param("a2c", "grad_parallel", 200_000, marks=pytest.mark.slow),
    ],
)
def test_sigkilled_worker_is_restarted_and_the_run_finishes(tmp_path, algo, arch, steps):
    """The worker is killed as soon as the learner has logged data from both workers. metrics.csv is first
    written up to 2 s after the runner starts, and a2c can take 40k CartPole steps a second: its budget
    keeps the run going for seconds after the kill, which the learner notices within 0.2 s."""
    proc = start(tmp_path, algo, "--env", "CartPole-v1", "--arch", arch, "--workers", "2", "--steps", str(steps),
                 "--stop-return", "1e9", "--eval-every", "50000")  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        pids = wait_for_workers(proc, run, 2)
        os.kill(pids["0"], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert not wait_until_gone(sid, timeout=10), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    assert (run / "workers.log").exists(), f"the run ended before the learner noticed the kill:\n{err}"
    log = (run / "workers.log").read_text()
    assert "worker 0 died (killed by SIGKILL)" in log and "restarting it" in log
    assert "worker 0 died (killed by SIGKILL)" in err
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "steps" and result["env_steps"] >= steps
    assert not (run / "workers.json").exists()  # every worker gone


def test_the_restart_limit_ends_the_run_cleanly_with_a_checkpoint_and_one_line(tmp_path):
    """A worker crashes once (CrashingCartPole) and --max-restarts 0 allows no restart: the run stops as cleanly as
    on Ctrl-C (checkpoint, result.json saying how it stopped, no process left) and the command says why in one
    line, exit 1. The run cannot solve (--stop-return 1e9): a lucky seed once solved 1 s after the crash, before a
    loaded machine had reaped the crashed process."""
    tests = str(Path(__file__).resolve().parents[1])  # where crashing_env is, for the rlfleet process to import
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "RLFLEET_TEST_CRASH_MARKER": str(tmp_path / "crashed"), "PYTHONPATH": path}
    proc = subprocess.run(
        [*RLFLEET, "train", "a2c", "--env", "crashing_env:CrashingCartPole-v0", "--arch", "data_parallel",
         "--max-restarts", "0", "--steps", "1e6", "--stop-return", "1e9", "--logdir", str(tmp_path), "--name", "r",
         "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    run = tmp_path / "r"
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rlfleet: error: the run stopped: workers crashed once (limit 0)"), proc.stderr
    assert f"rlfleet train --resume {run} goes on" in last and "Traceback" not in proc.stderr
    assert re.search(r"worker \d died \(exit code 1\): RuntimeError: deliberate crash in CrashingCartPole", last)
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "failure" and "deliberate crash" in result["failure"], result
    assert load_checkpoint(run)["env_steps"] == result["env_steps"] > 0
    assert not (run / "workers.json").exists()


def wait_for_log(proc: subprocess.Popen, run: Path, text: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"training ended early ({proc.returncode}):\n{proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no {text!r} in workers.log after {timeout} s"
        if (run / "workers.log").exists() and text in (log := (run / "workers.log").read_text()):
            return log
        time.sleep(0.1)


def test_param_server_sigkilled_server_and_worker_are_restarted_and_the_run_finishes(tmp_path):
    """Server 1 is killed once the coordinator has logged items from both workers, worker 0 once the server's
    death is reported: each is reported and restarted, and the run spends its whole budget."""
    steps = 150_000
    proc = start(tmp_path, "a2c", "--env", "CartPole-v1", "--arch", "param_server", "--shards", "2", "--workers",
                 "2", "--steps", str(steps), "--stop-return", "1e9", "--eval-every", "50000")  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        workers = wait_for_workers(proc, run, 2)
        servers = json.loads((run / "servers.json").read_text())
        assert sorted(servers) == ["0", "1"]
        os.kill(servers["1"], signal.SIGKILL)
        wait_for_log(proc, run, "server 1 died (killed by SIGKILL)")
        os.kill(workers["0"], signal.SIGKILL)
        wait_for_log(proc, run, "worker 0 died (killed by SIGKILL)")
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert not wait_until_gone(sid, timeout=10), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    log = (run / "workers.log").read_text()
    assert "server 1 died (killed by SIGKILL)\nrestarting it from the snapshot of step" in log
    assert "every server rolled back to the snapshot of step" in log  # all shards of one version again
    assert "worker 0 died (killed by SIGKILL)\nrestarting it" in log
    assert "server 1 died (killed by SIGKILL)" in err and "worker 0 died (killed by SIGKILL)" in err
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "steps" and result["env_steps"] >= steps
    assert not (run / "workers.json").exists() and not (run / "servers.json").exists()  # every process gone
    assert load_checkpoint(run)["param_server"]["version"] > 0
    # the pushes the roll-back undid are not counted: updates are the optimizer steps the weights carry
    assert result["updates"] == load_checkpoint(run)["param_server"]["version"]


@pytest.mark.parametrize("arch", ["data_parallel", "grad_parallel", "param_server"])
def test_ctrl_c_stops_every_process_and_saves_a_checkpoint(tmp_path, arch):
    proc = start(tmp_path, "a2c", "--env", "CartPole-v1", "--arch", arch, "--workers", "2", "--steps", "10000000",
                 "--stop-return", "1e9")  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        wait_for_workers(proc, run, 2)
        time.sleep(1)
        assert len(session_processes(sid)) >= 3  # the learner and both workers (and param_server's servers)
        os.killpg(sid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert "stopped by interrupted" in out
        assert not wait_until_gone(sid, timeout=10), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    saved = load_checkpoint(run)
    assert saved["env_steps"] > 0 and saved["run_config"]["arch"] == arch
    assert saved[arch]["version"] > 0


@pytest.mark.parametrize("arch", ["grad_parallel", "param_server"])
def test_workers_leave_when_the_learner_is_killed(tmp_path, arch):
    """SIGKILL gives the learner no chance to stop its workers (and param_server's servers): they notice and exit
    by themselves."""
    proc = start(tmp_path, "a2c", "--env", "CartPole-v1", "--arch", arch, "--workers", "2",
                 "--steps", "10000000", "--stop-return", "1e9")  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        pids = list(wait_for_workers(proc, run, 2).values())
        if arch == "param_server":
            pids += json.loads((run / "servers.json").read_text()).values()
            assert len(pids) == 4
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        left = wait_until_gone(sid, timeout=15)
        assert not any(pid in left for pid in pids), left
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)


@pytest.mark.slow  # -m slow: the fault drill (tests/drills.py) kills and stops allreduce learners on both backends
def test_sigkilled_allreduce_learner_is_restarted_and_the_group_re_forms(tmp_path):
    """Learner 0 (the one whose state the coordinator keeps) is SIGKILLed once the learners have updated
    together. Two learners update only together, so the budget is reached only if the group re-formed with
    the restarted learner; the state comes back from the survivor (it has done the most updates)."""
    steps = 150_000
    proc = start(tmp_path, "a2c", "--env", "CartPole-v1", "--arch", "allreduce", "--workers", "2", "--steps",
                 str(steps), "--stop-return", "1e9", "--eval-every", "50000")  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        deadline = time.monotonic() + 120
        while not ((run / "metrics.csv").exists() and "losses/" in (run / "metrics.csv").read_text()):
            assert proc.poll() is None, f"training ended early ({proc.returncode}):\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "the learners never updated together"
            time.sleep(0.2)
        pids = json.loads((run / "workers.json").read_text())
        os.kill(pids["0"], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert not wait_until_gone(sid, timeout=10), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    log = (run / "workers.log").read_text()
    assert "worker 0 died (killed by SIGKILL)" in log and "restarting it" in log, log
    assert re.search(r"learner 1: the group of generation 0 broke: .*(closed|reset) by peer", log), log
    assert re.search(r"the learners' group re-formed \(generation [1-9]\d*\)", log), log
    assert "worker 0 died (killed by SIGKILL)" in err
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "steps" and result["env_steps"] >= steps
    # the state learner 0 had is not lost: the restarted learner 0 took on the survivor's, which went on updating
    taken = re.search(r"learner 0: took on the state of learner 1 \((\d+) updates\)", log)
    assert taken and int(taken[1]) >= 1, log
    assert not (run / "workers.json").exists()  # every worker gone


def wait_for_apex_learning(proc: subprocess.Popen, run: Path, timeout: float = 120) -> None:
    """Until an apex learner has logged a loss (it learns from the shards the actors filled)."""
    deadline = time.monotonic() + timeout
    while not ((run / "metrics.csv").exists() and "losses/loss" in (run / "metrics.csv").read_text()):
        assert proc.poll() is None, f"training ended early ({proc.returncode}):\n{proc.stderr.read()}"
        assert time.monotonic() < deadline, f"the learner logged no loss after {timeout} s"
        time.sleep(0.2)


def test_apex_sigkilled_replay_shard_and_actor_are_restarted_and_the_run_solves(tmp_path):
    """Replay shard 1 is killed once the learner has learned from the shards, actor 0 once the shard's death is
    reported: each is reported and restarted (the shard empty, its data lost), and the run goes on to solve
    CartPole-v1 (475 over 10 greedy episodes; 6 undisturbed runs with these 2 actors and 2 shards solved at 20k-35k
    env steps)."""
    steps = 150_000
    proc = start(tmp_path, "dqn", "--env", "CartPole-v1", "--arch", "apex", "--actors", "2", "--replay-shards", "2",
                 "--steps", str(steps), "--eval-every", "5000")  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        wait_for_apex_learning(proc, run)
        shards = json.loads((run / "shards.json").read_text())
        assert sorted(shards) == ["0", "1"]
        os.kill(shards["1"], signal.SIGKILL)
        wait_for_log(proc, run, "replay shard 1 died (killed by SIGKILL)")
        os.kill(json.loads((run / "workers.json").read_text())["0"], signal.SIGKILL)
        wait_for_log(proc, run, "worker 0 died (killed by SIGKILL)")
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert not wait_until_gone(sid, timeout=10), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    log = (run / "workers.log").read_text()
    assert re.search(
        r"replay shard 1 died \(killed by SIGKILL\)\nrestarting it empty: its \d+ transitions are lost", log
    )
    assert "worker 0 died (killed by SIGKILL)\nrestarting it with the learner's newest weights" in log
    result = json.loads((run / "result.json").read_text())
    assert result["solved"] and result["eval_return_mean"] >= 475, result
    assert not (run / "workers.json").exists() and not (run / "shards.json").exists()  # every process gone


@pytest.mark.parametrize("how", ["ctrl_c", "sigkill"])
def test_apex_actors_and_shards_leave_with_the_learner(tmp_path, how):
    """Ctrl-C: the learner stops the actors and shards and saves a checkpoint; SIGKILL of the learner: they notice
    and exit by themselves."""
    proc = start(tmp_path, "dqn", "--env", "CartPole-v1", "--arch", "apex", "--actors", "2", "--replay-shards", "2",
                 "--steps", "10000000", "--stop-return", "1e9")  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        wait_for_apex_learning(proc, run)
        pids = [*json.loads((run / "workers.json").read_text()).values()]
        pids += json.loads((run / "shards.json").read_text()).values()
        assert len(pids) == 4
        if how == "ctrl_c":
            os.killpg(sid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
            assert "stopped by interrupted" in out
        else:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
        left = wait_until_gone(sid, timeout=15)
        assert not any(pid in left for pid in pids), left
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    if how == "ctrl_c":
        saved = load_checkpoint(run)
        assert saved["run_config"]["arch"] == "apex" and saved["apex"]["version"] == saved["algo"]["updates"] > 0


@pytest.mark.slow  # -m slow: the hung learner's test has it rejoin, the fault drill kills gossip learners
def test_sigkilled_gossip_learner_rejoins_from_its_in_neighbours_and_rounds_go_on(tmp_path):
    """Learner 1 of four on the ring is SIGKILLed once rounds complete. Learner 2 waits for its messages once it is
    more than --max-staleness rounds behind, so rounds go on only if the restarted learner rejoins the ring: it
    takes the average of its in-neighbour (learner 0) and rounds of all four go on to the step budget. (No stop at
    the solved return: in GALA's order the others keep learning meanwhile, and could solve before the death is
    noticed.)"""
    proc = start(tmp_path, "a2c", "--env", "CartPole-v1", "--arch", "gossip", "--learners", "4", "--steps", "100000",
                 "--eval-every", "20000", "--state-every", "1", "--stop-return", "inf")  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        deadline = time.monotonic() + 120
        while not ((run / "metrics.csv").exists() and "gossip/consensus_distance" in (run / "metrics.csv").read_text()):
            assert proc.poll() is None, f"training ended early ({proc.returncode}):\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "no round completed"
            time.sleep(0.2)
        pids = json.loads((run / "workers.json").read_text())
        os.kill(pids["1"], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert not wait_until_gone(sid, timeout=10), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    log = (run / "workers.log").read_text()
    assert "worker 1 died (killed by SIGKILL)" in log and "from the average of its in-neighbours" in log, log
    rejoined = re.search(r"learner 1: restarted from the average of learners 0 \(round (\d+)\)", log)
    assert rejoined, log
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "steps" and result["env_steps"] >= 100_000, result
    rows = [line.split(",") for line in (run / "metrics.csv").read_text().splitlines()[1:]]
    last_round = max(float(v) for _, _, key, v in rows if key == "gossip/round")
    assert last_round > int(rejoined[1])  # rounds that all four learners completed after the restart
    saved = load_checkpoint(run / "checkpoints" / "latest.pt")["gossip"]
    assert len(saved["learners"]) == 4 and all(s is not None for s in saved["learners"])


def test_a_hung_gossip_learner_is_killed_for_want_of_a_heartbeat_restarted_and_the_run_solves(run_opts, tmp_path):
    """A learner hangs in an env step (alive, silent). Its neighbours wait for it, beating (so they are not taken
    for hung themselves), until after --heartbeat-s its process is killed and restarted; it rejoins from its
    in-neighbours and the run solves. A gossip timeout below the heartbeat would have ended the run instead. The hang
    comes at an env's 20th step, long before a lucky run could solve (one solved at 5,120 steps, before the default
    200th step of each env came)."""
    flag = tmp_path / "hung"
    hanging = {"flag": str(flag), "driver_pid": os.getpid(), "at": 20}
    result = train("a2c", "delay_env:HangingOnceCartPole-v0", env_kwargs=hanging,
                   arch="gossip", learners=4, heartbeat_s=10.0, state_every=1, steps=400_000, eval_every=5_000,
                   stop_return=475.0, **run_opts)  # fmt: skip
    assert flag.exists()  # a learner did hang
    assert (result.run_dir / "workers.log").exists(), f"no worker trouble reported: {result.result}"
    log = (result.run_dir / "workers.log").read_text()
    hung = re.search(r"worker (\d) died \(killed by SIGKILL\):\s*no heartbeat for \d+ s \(hung\)", log)
    assert hung, log
    assert f"learner {hung[1]}: restarted from the average of learners" in log, log
    assert result["solved"] and result["stopped_by"] == "solved", result.result
    assert log.count("(hung)") == 1  # only the hung learner: its waiting neighbours kept beating


def test_a_hung_gossip_learner_ends_the_run_with_an_error_naming_it(run_opts):
    """Learner 2 hangs in an env step (alive, so not restarted before the heartbeat): a neighbour gives up after
    --gossip-timeout-s and the run ends with an error naming learner 2, and no worker is left behind. Which
    neighbour gives up first is a race: learner 3 waiting for learner 2 to post its round, or learner 1 waiting
    for learner 2 to read learner 1's."""
    start_time = time.monotonic()
    waited = r"learner [13] waited \d+\.\d s in round \d+ for learner 2 to (post|read) round"
    with pytest.raises(GossipTimeout, match=waited):
        train("a2c", "delay_env:HangingCartPole-v0", arch="gossip", learners=4, gossip_timeout_s=3.0,
              steps=10**6, **run_opts)  # fmt: skip
    assert time.monotonic() - start_time < 90
    assert not list(Path(run_opts["logdir"]).glob("*/workers.json"))  # every learner stopped
    (run,) = Path(run_opts["logdir"]).iterdir()  # stopped cleanly: a checkpoint to resume from, and result.json
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "failure" and re.search(waited, result["failure"]), result
    assert load_checkpoint(run)["env_steps"] == result["env_steps"]
    assert "the run stops: learner" in (run / "workers.log").read_text()


HUNG_SERVICES = {
    "apex": (("dqn", "--arch", "apex", "--actors", "2", "--replay-shards", "2", "--steps", "20000"), "shards.json",
             "replay shard", r"restarting it empty: its \d+ transitions are lost"),
    "param_server": (("a2c", "--arch", "param_server", "--shards", "2", "--workers", "2", "--steps", "150000"),
                     "servers.json", "server", "restarting it from the snapshot of step"),
}  # fmt: skip


def start_and_wait_for_services(tmp_path: Path, arch: str, *extra: str) -> tuple[subprocess.Popen, Path, dict]:
    """An apex or param_server run once it learns, and its services' pids."""
    args, pids_file, _, _ = HUNG_SERVICES[arch]
    proc = start(tmp_path, *args, "--env", "CartPole-v1", "--stop-return", "1e9", "--eval-every", "1000000", *extra)
    run = tmp_path / "r"
    if arch == "apex":
        wait_for_apex_learning(proc, run)
    else:
        wait_for_workers(proc, run, 2)
    return proc, run, json.loads((run / pids_file).read_text())


# param_server's case is slow (CI time): tests/ray/test_ray_backend.py drills a hung parameter server on Ray
@pytest.mark.parametrize("arch", ["apex", pytest.param("param_server", marks=pytest.mark.slow)])
def test_a_sigstopped_service_is_killed_as_hung_and_restarted_and_its_callers_survive(tmp_path, arch):
    """Service 1 (a replay shard, a parameter server) is SIGSTOPped: alive, answering nothing. The roles blocked
    in calls to it are not killed as hung (their heartbeat is held while it does not answer); after --heartbeat-s
    without an answer to its ping the service itself is named, SIGKILLed and restarted as after a crash, and the
    run spends its whole budget."""
    _, _, name, restart = HUNG_SERVICES[arch]
    proc, run, services = start_and_wait_for_services(tmp_path, arch, "--heartbeat-s", "8")
    sid = proc.pid
    try:
        stop_process(services["1"])
        wait_for_log(proc, run, f"{name} 1 died (killed by SIGKILL): no answer for ", timeout=60)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert not wait_until_gone(sid, timeout=10), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    log = (run / "workers.log").read_text()
    assert re.search(rf"{name} 1 died \(killed by SIGKILL\): no answer for \d+ s \(hung\), so it was killed\n"
                     rf"{restart}", log), log  # fmt: skip
    assert "worker" not in log, log  # no role was killed as hung (nor died)
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "steps" and result["env_steps"] >= int(HUNG_SERVICES[arch][0][-1]), result


# the same wait (`wait_service`) for both: one in CI
@pytest.mark.parametrize("arch", ["apex", pytest.param("param_server", marks=pytest.mark.slow)])
def test_ctrl_c_while_the_coordinator_waits_on_a_hung_service_stops_the_run_at_once(tmp_path, arch):
    """Service 1 is SIGSTOPped (the heartbeat, 120 s, far off) and the coordinator soon waits on it: the first Ctrl-C
    still stops the run within seconds, with a checkpoint, result.json and no process left."""
    proc, run, services = start_and_wait_for_services(tmp_path, arch)
    sid = proc.pid
    try:
        stop_process(services["1"])
        time.sleep(3)  # the coordinator is blocked on the stopped service by now
        os.killpg(sid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group (not the stopped service)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert "stopped by interrupted" in out
        assert not wait_until_gone(sid, timeout=15), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "interrupted"
    assert load_checkpoint(run)["env_steps"] == result["env_steps"] > 0

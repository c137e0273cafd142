"""The fault drill of a real `rlfleet train` process: its workers SIGKILLed at random moments, again and again, then
one SIGSTOPped; the coordinator must notice every death, kill the stopped worker for want of a heartbeat, restart
each one and go on, and still stop cleanly on Ctrl-C at the end. A watchdog fails the drill when a restart does not
come (a coordinator blocked on something a dead or stopped worker held)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

from procs import RLFLEET, kill_session, session_processes, stop_process, wait_until_gone

from rlfleet.backends import local, ray_roles
from rlfleet.run.checkpoint import load_checkpoint

RUNS = {  # architecture: algorithm
    "hogwild": "a3c",
    "data_parallel": "a2c",
    "grad_parallel": "a2c",
    "async_grad": "a2c",
    "param_server": "a2c",
    "allreduce": "a2c",
    "gossip": "a2c",
    "apex": "dqn",
}
COUNT_OPTION = {"gossip": "--learners", "apex": "--actors"}  # how an architecture names its worker count
OPTIONS = {"allreduce": ["--group-timeout-s", "3"]}  # a learner waits less for a hung peer than the heartbeat
RESTART_WATCHDOG_S = 60.0  # a restart slower than this (beyond the heartbeat, for a stopped worker): stuck
HEARTBEAT_S = 6.0  # the drilled run's --heartbeat-s: a stopped worker is killed this long after its last sign
SETTLED_S = 6.0  # a worker this long past its (re)start has usually begun to beat: imports and envs take seconds
# ... but not always on a loaded machine: one stopped before its first beat is killed only when its start-up grace
# (a minute, beyond the heartbeat) runs out, and the next progress waits for its successor to start
STARTUP_GRACE_S = max(local.STARTUP_GRACE_S, ray_roles.STARTUP_GRACE_S)


def live_workers(run: Path) -> dict[str, int]:
    try:
        return json.loads((run / "workers.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def last_logged_step(run: Path) -> int:
    """The step of the last complete row of metrics.csv (0 before any)."""
    lines = (run / "metrics.csv").read_text().splitlines() if (run / "metrics.csv").exists() else []
    steps = [int(line.split(",")[0]) for line in lines[1:] if line.count(",") == 3 and line.split(",")[0].isdigit()]
    return max(steps, default=0)


def wait_for(condition, what: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended while waiting for {what} (exit code {proc.returncode})"
        assert time.monotonic() < deadline, f"watchdog: no {what} within {timeout:.0f} s — is the coordinator stuck?"
        time.sleep(0.05)


def drill_workers(tmp_path: Path, arch: str, kills: int, seed: int, backend: str = "local", stops: int = 1) -> None:
    """`kills` SIGKILLs of a random worker at random moments, then `stops` SIGSTOPs, each waited for its restart."""
    rng = random.Random(seed)
    out, err = open(tmp_path / "out.txt", "w"), open(tmp_path / "err.txt", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [*RLFLEET, "train", RUNS[arch], "--env", "CartPole-v1", "--arch", arch, "--backend", backend,
         COUNT_OPTION.get(arch, "--workers"), "2", "--steps", "100000000", "--stop-return", "1e9",
         "--eval-every", "100000000", "--max-restarts", str(kills + stops), "--heartbeat-s", str(HEARTBEAT_S),
         *OPTIONS.get(arch, []), "--logdir", str(tmp_path), "--name", "r", "--no-progress"],
        cwd=tmp_path, start_new_session=True, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
    )  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        wait_for(lambda: len(live_workers(run)) == 2, "2 workers", proc, 120)
        started = dict.fromkeys(live_workers(run), time.monotonic())  # worker: when its incarnation was seen
        for signum in [signal.SIGKILL] * kills + [signal.SIGSTOP] * stops:
            time.sleep(rng.uniform(0.2, 2.5))  # a random moment: starting up, acting, learning, sending
            pids = live_workers(run)
            if signum == signal.SIGKILL:
                victim = rng.choice(sorted(pids))
                os.kill(pids[victim], signum)
            else:  # a worker past its start (one stopped while it starts has the start-up grace, a minute, more)
                victim = min(started, key=started.get)
                time.sleep(max(0.0, started[victim] + SETTLED_S - time.monotonic()))
                stop_process(pids[victim])

            def restarted(victim=victim, gone=pids[victim]) -> bool:
                pids = live_workers(run)
                return len(pids) == 2 and pids[victim] != gone

            patience = RESTART_WATCHDOG_S + (HEARTBEAT_S + STARTUP_GRACE_S if signum == signal.SIGSTOP else 0.0)
            wait_for(restarted, f"restart of worker {victim} ({signum.name})", proc, patience)
            started[victim] = time.monotonic()
        logged = last_logged_step(run)
        wait_for(
            lambda: last_logged_step(run) > logged,
            "progress after the last restart",
            proc,
            RESTART_WATCHDOG_S + STARTUP_GRACE_S,
        )
        os.killpg(sid, signal.SIGINT)  # Ctrl-C: a checkpoint, every process gone
        proc.wait(timeout=60)
        assert proc.returncode == 0, (tmp_path / "err.txt").read_text()[-3000:]
        if backend == "local":  # (Ray's per-node agents leave a while later: tests/ray/test_ray_interrupt.py)
            assert not wait_until_gone(sid, timeout=15), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.wait()
        kill_session(sid)
        out.close()
        err.close()
    log = (run / "workers.log").read_text()
    assert len(re.findall(r"^\[step \d+\] worker \d+ died", log, re.M)) == kills + stops, log
    assert len(re.findall(r"no heartbeat for \d+ s \(hung\)", log)) == stops, log
    if backend == "local":
        assert log.count("died (killed by SIGKILL)") == kills + stops, log  # the stopped ones killed so too
    assert load_checkpoint(run)["env_steps"] >= logged  # the checkpoint has what was learned after the drill
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "interrupted"

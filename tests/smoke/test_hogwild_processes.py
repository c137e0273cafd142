"""hogwild with real worker processes: a crash is reported and restarted, SIGKILL too, Ctrl-C leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import RLFLEET, kill_session, session_processes, wait_until_gone

from rlfleet.launch import train
from rlfleet.run.checkpoint import load_checkpoint

TESTS_DIR = str(Path(__file__).resolve().parents[1])  # where `crashing_env` lives


def start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TESTS_DIR, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [*RLFLEET, "train", *args, "--logdir", str(tmp_path), "--name", "r", "--no-progress"],
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_workers(proc: subprocess.Popen, run: Path, n: int, timeout: float = 120) -> dict[str, int]:
    """The workers' pids once all `n` are up and metrics.csv has a row (they have reported)."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"training ended early ({proc.returncode}):\n{proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no {n} workers after {timeout} s"
        if (run / "workers.json").exists():
            pids = json.loads((run / "workers.json").read_text())
            metrics = run / "metrics.csv"
            if len(pids) == n and metrics.exists() and len(metrics.read_text().splitlines()) > 1:
                return pids
        time.sleep(0.05)


def test_a_crashing_worker_is_reported_and_restarted(tmp_path, monkeypatch):
    marker = tmp_path / "crashed"
    monkeypatch.setenv("RLFLEET_TEST_CRASH_MARKER", str(marker))
    result = train("a3c", "crashing_env:CrashingCartPole-v0", workers=2, steps=6_000, eval_every=3_000,
                   stop_return=1e9, logdir=str(tmp_path), name="r", progress=False)  # fmt: skip
    assert marker.exists()  # the crash happened
    log = (tmp_path / "r" / "workers.log").read_text()
    assert "died (exit code 1)" in log and "RuntimeError: deliberate crash in CrashingCartPole" in log
    assert "Traceback" in log and "restarting it from the shared parameters" in log
    assert result["stopped_by"] == "steps" and result["env_steps"] >= 6_000  # training went on
    assert not (tmp_path / "r" / "workers.json").exists()  # every worker gone


@pytest.mark.learning
@pytest.mark.slow  # -m slow: the fault drill (tests/drills.py) kills and stops hogwild workers; this adds the solve
def test_sigkilled_worker_is_restarted_and_the_run_still_solves(tmp_path):
    # the first evaluation, and so the earliest stop, is at 10k env steps: the kill lands mid-run, once the
    # workers have reported their first segments (metrics.csv has its first row on disk as soon as it is
    # logged, about 1k steps in). Evaluations 10k apart catch the policy at its best: A3C's greedy return on
    # CartPole swings, and evaluations 50k apart missed every peak of one run in 400k steps.
    proc = start(
        tmp_path, "a3c", "--env", "CartPole-v1", "--workers", "2", "--steps", "400000", "--eval-every", "10000"
    )
    sid, run = proc.pid, tmp_path / "r"
    try:
        pids = wait_for_workers(proc, run, 2)
        os.kill(pids["0"], signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        assert not wait_until_gone(sid, timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    log = (run / "workers.log").read_text()
    assert "worker 0 died (killed by SIGKILL)" in log and "restarting it from the shared parameters" in log
    assert "worker 0 died (killed by SIGKILL)" in err
    result = json.loads((run / "result.json").read_text())
    assert result["solved"], result


def test_ctrl_c_stops_every_worker_and_the_run_resumes(tmp_path):
    proc = start(
        tmp_path, "a3c", "--env", "CartPole-v1", "--workers", "2", "--steps", "10000000", "--stop-return", "1e9"
    )
    sid, run = proc.pid, tmp_path / "r"
    try:
        wait_for_workers(proc, run, 2)
        time.sleep(2)
        assert len(session_processes(sid)) >= 3  # the monitor and both workers
        os.killpg(sid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        out, err = proc.communicate(timeout=30)
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
    steps = saved["env_steps"]
    assert steps > 0 and saved["run_config"]["arch"] == "hogwild"

    target = steps + 3_000
    resumed = subprocess.run(
        [*RLFLEET, "train", "--resume", str(run), "--steps", str(target), "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "steps" and result["env_steps"] >= target
    assert load_checkpoint(run)["state"]["updates"] > saved["state"]["updates"]

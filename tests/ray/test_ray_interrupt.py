"""Ctrl-C on an `rlfleet train --backend ray` process (its own private Ray instance): a checkpoint, exit 0, and no
Ray process left behind (counted before and after); the run then resumes. A driver that is SIGKILLed leaves its
last checkpoint to resume from, and its Ray instance goes with it: the actors, the raylet and the GCS at once
(Ray's two per-node agents notice the raylet is gone about a minute later and leave too)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from procs import RLFLEET, assert_nothing_left, kill_session, ray_processes

from rlfleet.backends.ray_instance import system_temp_dir
from rlfleet.run.checkpoint import load_checkpoint


def test_ctrl_c_on_a_ray_run_saves_a_checkpoint_and_leaves_no_ray_process(tmp_path: Path):
    before = set(ray_processes())
    run = tmp_path / "r"
    cmd = ["train", "a2c", "--env", "CartPole-v1", "--arch", "async_grad", "--workers", "2", "--backend", "ray",
           "--steps", "10000000", "--stop-return", "1e9", "--logdir", tmp_path, "--name", "r",
           "--no-progress"]  # fmt: skip
    proc = subprocess.Popen([*RLFLEET, *map(str, cmd)], cwd=tmp_path, start_new_session=True, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    sid = proc.pid
    try:
        deadline = time.monotonic() + 120
        while not (run / "workers.json").exists():
            assert proc.poll() is None, f"the run ended early ({proc.returncode}):\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "no actors after 120 s"
            time.sleep(0.2)
        time.sleep(2)
        started = set(ray_processes()) - before
        actors = set(json.loads((run / "workers.json").read_text()).values())
        assert actors <= started and len(started) >= 4, started  # GCS, raylet, the actors, ...
        os.killpg(sid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group, Ray's processes too
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"exit {proc.returncode} after SIGINT:\n{err[-3000:]}"
        assert "stopped by interrupted" in out, out
        assert "Traceback" not in err, err[-3000:]
        assert_nothing_left(sid, started)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    saved = load_checkpoint(run / "checkpoints" / "latest.pt")
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "interrupted" and saved["env_steps"] == result["env_steps"] > 0
    assert saved["run_config"]["options"]["backend"] == "ray"
    resume(run, saved["env_steps"] + 1_000)


def resume(run: Path, steps: int) -> None:
    proc = subprocess.run([*RLFLEET, "train", "--resume", str(run), "--steps", str(steps), "--no-progress"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run / "result.json").read_text())["env_steps"] >= steps


def test_a_killed_driver_leaves_a_checkpoint_to_resume_from_and_no_ray_process(tmp_path: Path):
    before = set(ray_processes())
    run = tmp_path / "r"
    cmd = ["train", "a2c", "--env", "CartPole-v1", "--arch", "data_parallel", "--workers", "2", "--backend", "ray",
           "--steps", "10000000", "--stop-return", "1e9", "--checkpoint-every", "2000", "--logdir", tmp_path,
           "--name", "r", "--no-progress"]  # fmt: skip
    proc = subprocess.Popen([*RLFLEET, *map(str, cmd)], cwd=tmp_path, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (run / "checkpoints" / "latest.pt").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.2)
        agents = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")  # they poll for the raylet: a minute
        started = {pid for pid, cmd in ray_processes().items() if pid not in before and not cmd.startswith(agents)}
        assert set(json.loads((run / "workers.json").read_text()).values()) <= started
        proc.kill()  # the driver alone, SIGKILL: nothing of its own runs after this
        proc.wait(timeout=10)
        deadline = time.monotonic() + 60  # at once when the machine is idle; a busy one may take longer to notice
        while (still := set(ray_processes()) & started) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = {pid: cmd[:120] for pid, cmd in ray_processes().items() if pid in still}
        assert not still, f"Ray processes outlived the driver by a minute: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_session(proc.pid)
        for session in Path(system_temp_dir()).glob(f"rlfleet-ray-*/ray/session_*_{proc.pid}"):
            shutil.rmtree(session.parent.parent)  # the instance's folder (token, session): a killed driver leaves it
    saved = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert saved["env_steps"] > 0
    resume(run, saved["env_steps"] + 1_000)


def test_ctrl_c_while_the_learner_waits_on_a_stopped_replay_shard_actor_stops_the_run_at_once(tmp_path: Path):
    """Ape-X on ray: replay shard 1's actor process is SIGSTOPped (the heartbeat, 120 s, far off) and the learner
    soon waits on it; the first Ctrl-C still stops the run within seconds: exit 0, a checkpoint, result.json."""
    run = tmp_path / "r"
    cmd = ["train", "dqn", "--env", "CartPole-v1", "--arch", "apex", "--actors", "2", "--replay-shards", "2",
           "--backend", "ray", "--steps", "10000000", "--stop-return", "1e9", "--logdir", tmp_path, "--name", "r",
           "--no-progress"]  # fmt: skip
    proc = subprocess.Popen([*RLFLEET, *map(str, cmd)], cwd=tmp_path, start_new_session=True, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    sid, shard = proc.pid, None
    try:
        deadline = time.monotonic() + 180
        while not ((run / "metrics.csv").exists() and "losses/loss" in (run / "metrics.csv").read_text()):
            assert proc.poll() is None, f"the run ended early ({proc.returncode}):\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "the learner logged no loss after 180 s"
            time.sleep(0.2)
        shard = json.loads((run / "shards.json").read_text())["1"]
        os.kill(shard, signal.SIGSTOP)
        time.sleep(3)  # the learner and the actors are blocked on the stopped shard by now
        os.killpg(sid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"exit {proc.returncode} after SIGINT:\n{err[-3000:]}"
        assert "stopped by interrupted" in out, out
        assert "Traceback" not in err, err[-3000:]
    finally:
        if shard is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(shard, signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "interrupted"
    assert load_checkpoint(run / "checkpoints" / "latest.pt")["env_steps"] == result["env_steps"] > 0

"""An env process of `single`'s async vector env that dies or hangs, in a real `rlfleet train`: the run stops cleanly
(checkpoint, result.json with the failure, exit 1, one line that names the env process), leaves no process behind,
and resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import RLFLEET, rlfleet_session, session_processes, wait_until_gone

TIMEOUT_S = 4  # the run's --env-timeout-s
# how each env process is ended, and what the run's last line says of it
CASES = {
    "killed": (signal.SIGKILL, "died (killed by SIGKILL)"),
    "stopped": (signal.SIGSTOP, f"gave no answer to step for {TIMEOUT_S} s (hung), so it was killed"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_env_process_that_dies_or_hangs_stops_the_run_cleanly(tmp_path: Path, case: str):
    how, said = CASES[case]
    run = tmp_path / "r"
    args = ["train", "a2c", "--env", "CartPole-v1", "--vector-mode", "async", "--n-envs", "2", "--steps", "1e7",
            "--env-timeout-s", TIMEOUT_S, "--logdir", tmp_path, "--name", "r", "--no-progress"]  # fmt: skip
    with rlfleet_session(args, tmp_path) as proc:
        deadline = time.monotonic() + 90
        while not (run / "metrics.csv").exists():
            assert proc.poll() is None, f"training ended early ({proc.returncode}):\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "no metrics.csv after 90 s"
            time.sleep(0.2)
        envs = sorted(pid for pid, (_, cmdline) in session_processes(proc.pid).items() if "spawn_main" in cmdline)
        assert len(envs) == 2, session_processes(proc.pid)  # CartPole's evaluation envs are in the run's process
        victim = envs[1]
        os.kill(victim, how)
        out, err = proc.communicate(timeout=60 + TIMEOUT_S)
        lines = err.strip().splitlines()
        assert proc.returncode == 1, err
        assert "Traceback" not in err, err
        assert lines[-1].startswith("rlfleet: error: the run stopped: training env ") and said in lines[-1], err
        assert f"(pid {victim})" in lines[-1] and f"rlfleet train --resume {run} goes on" in lines[-1], err
        left = wait_until_gone(proc.pid, timeout=10)
        assert not left, f"processes left in the run's session: {left}"  # the stopped one too
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "failure" and said in result["failure"] and result["env_steps"] > 0
    assert (run / "checkpoints" / "latest.pt").exists()

    # the checkpoint goes on, with new env processes
    target = result["env_steps"] + 500
    resume = [*RLFLEET, "train", "--resume", str(run), "--steps", str(target), "--no-progress"]
    resumed = subprocess.run(resume, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "steps" and result["failure"] is None and result["env_steps"] >= target


def test_a_run_whose_set_up_fails_after_its_env_processes_started_ends_them(tmp_path: Path, monkeypatch):
    """A runner's `__init__` starts env processes (`--vector-mode async`), then goes on (the collector's first reset,
    a restore, the eval envs, the config): an error there ends what it started before it propagates, as the end of
    a run does, so a notebook that catches it holds no processes (`RunBase.abandon`; a private Ray instance:
    tests/ray/test_ray_instance.py)."""
    import multiprocessing

    import rlfleet
    from rlfleet.run.runner import RunBase

    def failing(self, *args, **kwargs):
        raise RuntimeError("the config could not be written")

    monkeypatch.setattr(RunBase, "_write_config", failing)
    before = {p.pid for p in multiprocessing.active_children()}
    with pytest.raises(RuntimeError, match="could not be written"):
        rlfleet.train("ppo", "CartPole-v1", vector_mode="async", n_envs=2, logdir=str(tmp_path), progress=False)
    deadline = time.monotonic() + 60
    while (left := {p.pid for p in multiprocessing.active_children()} - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left

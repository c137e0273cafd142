"""Ctrl-C on a real `rlfleet train` process: a polite stop (checkpoint, result, exit 0, nothing left), then resume."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import RLFLEET, kill_session, session_processes, wait_until_gone

from rlfleet.run.checkpoint import load_checkpoint


def metric_steps(run_dir: Path) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f)]


def wait_for_metrics(proc: subprocess.Popen, run: Path, timeout: float = 90) -> None:
    """Until the run has started logging (its metrics.csv exists)."""
    deadline = time.monotonic() + timeout
    while not (run / "metrics.csv").exists():
        assert proc.poll() is None, f"training ended early ({proc.returncode}):\n{proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no metrics.csv after {timeout:.0f} s"
        time.sleep(0.2)


# sync: SIGINT to the trainer alone (`kill -INT`); async: to its whole process group, env workers included,
# as a terminal's Ctrl-C does: the workers must not die of it, the trainer stops them; sigterm: SIGTERM to the
# trainer alone, as `kill`, `timeout` or a scheduler's preemption sends it
CASES = {
    "sync": ([], False, signal.SIGINT),
    "async": (["--vector-mode", "async", "--n-envs", "2"], True, signal.SIGINT),
    "sigterm": ([], False, signal.SIGTERM),
}


@pytest.mark.parametrize("mode", list(CASES))
def test_ctrl_c_stops_politely_and_resumes(tmp_path: Path, mode: str):
    extra, to_group, sent = CASES[mode]
    run = tmp_path / "r"
    cmd = ["train", "a2c", "--env", "CartPole-v1", "--steps", "10000000", "--logdir", tmp_path, "--name", "r"]
    proc = subprocess.Popen(
        [*RLFLEET, *map(str, cmd), "--no-progress", *extra],
        cwd=tmp_path,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sid = proc.pid  # start_new_session: the child leads its own session and process group
    try:
        wait_for_metrics(proc, run)
        time.sleep(3)
        running = session_processes(sid)
        assert proc.pid in running
        if mode == "async":  # the env workers exist, so their shutdown is really tested
            assert sum("multiprocessing" in cmdline for _, cmdline in running.values()) >= 2, running

        started = time.monotonic()
        if to_group:
            os.killpg(sid, sent)
        else:
            os.kill(proc.pid, sent)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, f"exit {proc.returncode} after {signal.Signals(sent).name}:\n{err}"
        assert time.monotonic() - started < 20
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert "stopped by interrupted" in out
        left = wait_until_gone(sid, timeout=10)
        assert not left, f"processes left in the run's session: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)

    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "interrupted"
    saved = load_checkpoint(run / "checkpoints" / "latest.pt")
    steps = saved["env_steps"]
    assert steps == result["env_steps"] > 0
    assert saved["run_config"]["vector_mode"] == ("async" if mode == "async" else "auto")
    per_iteration = saved["algo_config"]["n_envs"] * saved["algo_config"]["rollout_len"]
    logged = metric_steps(run)
    assert logged and max(logged) <= steps

    # resume for a little more: it must continue from the saved step count, not start over
    target = steps + 1_000
    proc = subprocess.run(
        [*RLFLEET, "train", "--resume", str(run), "--steps", str(target), "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "steps"
    assert target <= result["env_steps"] < target + per_iteration
    iterations = -(-(target - steps) // per_iteration)
    assert result["updates"] == saved["state"]["updates"] + iterations
    assert result["episodes"] >= saved["collector"]["episodes"]
    after = metric_steps(run)
    assert after[: len(logged)] == logged  # the first part's log is kept, the rest appended
    assert len(after) > len(logged) and min(after[len(logged) :]) > steps
    assert load_checkpoint(run)["env_steps"] == result["env_steps"]


def test_a_stop_during_the_final_evaluation_abandons_it_and_saves_the_checkpoint(tmp_path: Path):
    """The time limit ends training after 1 s and starts the final evaluation, long here (a greedy policy that walks
    in circles, up to 200,000 steps an episode): a SIGTERM then, as a scheduler sends it at a time limit, killed the
    run with exit 130 and left neither a checkpoint nor result.json (the stop handler had ended with the loop)."""
    run = tmp_path / "r"
    cmd = ["train", "ppo", "--env", "CliffWalking-v1", "--steps", "1e6", "--time-limit", "1", "--eval-every", "1e9",
           "--checkpoint-every", "1e9", "--eval-max-steps", "200000", "--set", "lr=0", "--torch-threads", "1",
           "--logdir", tmp_path, "--name", "r", "--no-progress"]  # fmt: skip
    proc = subprocess.Popen([*RLFLEET, *map(str, cmd)], cwd=tmp_path, start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    sid = proc.pid
    try:
        wait_for_metrics(proc, run)
        time.sleep(4)  # 1 s of training, then the final evaluation
        assert proc.poll() is None and not (run / "result.json").exists(), "the final evaluation ended early"
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{err}"
    assert "the final evaluation is abandoned, the checkpoint saved" in out + err
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "interrupted" and result["env_steps"] > 0
    assert load_checkpoint(run)["env_steps"] == result["env_steps"]

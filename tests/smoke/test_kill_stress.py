"""Workers SIGKILLed at random moments, again and again, on every multi-process architecture: the coordinator
must notice every kill, restart the worker and go on, and still stop cleanly at the end. A watchdog fails the
test when a restart does not come (a coordinator blocked on something a dead worker held).

The default run kills 4 workers per architecture; `pytest -m slow` runs the long version (20 per architecture,
60 kills in all)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import RLFLEET, kill_session, session_processes, wait_until_gone

from rlfleet.run.checkpoint import load_checkpoint

RUNS = {  # architecture: algorithm
    "hogwild": "a3c",
    "data_parallel": "a2c",
    "grad_parallel": "a2c",
    "param_server": "a2c",
    "allreduce": "a2c",
    "gossip": "a2c",
}
COUNT_OPTION = {"gossip": "--learners"}  # how an architecture names its worker count (default --workers)
RESTART_WATCHDOG_S = 60.0  # a restart slower than this means the coordinator is stuck


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


def kill_workers_repeatedly(tmp_path: Path, arch: str, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    out, err = open(tmp_path / "out.txt", "w"), open(tmp_path / "err.txt", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [*RLFLEET, "train", RUNS[arch], "--env", "CartPole-v1", "--arch", arch,
         COUNT_OPTION.get(arch, "--workers"), "2", "--steps", "100000000", "--stop-return", "1e9",
         "--eval-every", "100000000", "--max-restarts", str(kills),
         "--logdir", str(tmp_path), "--name", "r", "--no-progress"],
        cwd=tmp_path, start_new_session=True, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
    )  # fmt: skip
    sid, run = proc.pid, tmp_path / "r"
    try:
        wait_for(lambda: len(live_workers(run)) == 2, "2 workers", proc, 120)
        for _ in range(kills):
            time.sleep(rng.uniform(0.2, 2.5))  # a random moment: starting up, acting, learning, sending
            pids = live_workers(run)
            victim = rng.choice(sorted(pids))
            os.kill(pids[victim], signal.SIGKILL)

            def restarted(victim=victim, dead=pids[victim]) -> bool:
                pids = live_workers(run)
                return len(pids) == 2 and pids[victim] != dead

            wait_for(restarted, f"restart of worker {victim}", proc, RESTART_WATCHDOG_S)
        logged = last_logged_step(run)
        wait_for(lambda: last_logged_step(run) > logged, "progress after the last restart", proc, RESTART_WATCHDOG_S)
        os.killpg(sid, signal.SIGINT)  # Ctrl-C: a checkpoint, every process gone
        proc.wait(timeout=60)
        assert proc.returncode == 0, (tmp_path / "err.txt").read_text()[-3000:]
        assert not wait_until_gone(sid, timeout=15), session_processes(sid)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.wait()
        kill_session(sid)
        out.close()
        err.close()
    log = (run / "workers.log").read_text()
    assert log.count("died (killed by SIGKILL)") == kills, log
    assert load_checkpoint(run)["env_steps"] >= logged  # the checkpoint has what was learned after the kills
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "interrupted"


@pytest.mark.parametrize("arch", RUNS)
def test_workers_killed_at_random_moments_are_always_restarted(tmp_path, arch):
    kill_workers_repeatedly(tmp_path, arch, kills=4, seed=list(RUNS).index(arch))


@pytest.mark.slow
@pytest.mark.parametrize("arch", RUNS)
def test_sixty_kills_across_the_architectures(tmp_path, arch):
    kill_workers_repeatedly(tmp_path, arch, kills=20, seed=100 + list(RUNS).index(arch))

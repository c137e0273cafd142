"""The private Ray instance of a `--backend ray` run without `--address`, as real processes see it: a Ctrl-C while it
starts stops the run (nothing of Ray left)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import RLFLEET, kill_session, ray_processes, session_processes, wait_until_gone

LONG_RUN = ["train", "a2c", "--env", "CartPole-v1", "--arch", "async_grad", "--workers", "2", "--backend", "ray",
            "--steps", "10000000", "--stop-return", "1e9", "--no-progress"]  # fmt: skip


def start_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`rlfleet ARGS` in a session of its own (its pid is the session's id), output captured."""
    return subprocess.Popen([*RLFLEET, *map(str, args)], cwd=cwd, start_new_session=True, text=True, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def wait_for_process(proc: subprocess.Popen, name: str, timeout: float = 120) -> None:
    """Until a process whose command line has `name` runs in `proc`'s session."""
    deadline = time.monotonic() + timeout
    while not any(name in cmd for _, cmd in session_processes(proc.pid).values()):
        assert proc.poll() is None, f"the run ended early ({proc.returncode}):\n{proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no {name} after {timeout:.0f} s"
        time.sleep(0.02)


def assert_nothing_left(sid: int, started: set[int]) -> None:
    """No process left in the run's session, and none of the Ray processes `started` (should one have left it)."""
    left = wait_until_gone(sid, timeout=15)
    assert not left, f"processes left in the run's session: {left}"
    deadline = time.monotonic() + 15
    while (still := set(ray_processes()) & started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not still, f"Ray processes the run started are still there: {still}"


def test_ctrl_c_while_the_private_instance_starts_stops_the_run(tmp_path: Path):
    """SIGINT to the whole process group (a terminal's Ctrl-C) as soon as the instance's GCS server runs, while
    `ray.init` still starts the raylet and the rest: it used to be ignored there (the run went on training); now it
    is deferred until the instance is up, then interrupts: the instance is shut down, one line, exit 130."""
    proc = start_cli([*LONG_RUN, "--logdir", tmp_path, "--name", "r"], tmp_path)
    sid = proc.pid
    try:
        wait_for_process(proc, "gcs_server")
        started = set(ray_processes()) & set(session_processes(sid))
        os.killpg(sid, signal.SIGINT)
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 130, f"exit {proc.returncode} after SIGINT:\n{err[-3000:]}"
        assert err.strip().splitlines()[-1] == "rlfleet: interrupted", err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert not (tmp_path / "r" / "workers.json").exists()  # no role started
        assert_nothing_left(sid, started)
    finally:
        if proc.poll() is None:
            os.killpg(sid, signal.SIGKILL)
            proc.communicate()
        kill_session(sid)


def test_a_ctrl_c_during_the_start_is_deferred_to_its_end_and_kept_from_the_processes_started():
    """`_sigint_deferred`: a SIGINT inside the block interrupts at its end, not before, and a process started inside
    has SIGINT blocked (a terminal's Ctrl-C to the process group never reaches it)."""
    from rlfleet.backends.ray_backend import _sigint_deferred

    reached_end = False
    with pytest.raises(KeyboardInterrupt), _sigint_deferred():
        child = subprocess.Popen(["sleep", "30"])
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # a handler would have run by now
        reached_end = True
    try:
        assert reached_end
        status = Path(f"/proc/{child.pid}/status").read_text()
        blocked = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
        assert blocked & (1 << (signal.SIGINT - 1)), status
    finally:
        child.kill()
        child.wait()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())

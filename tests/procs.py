"""Helpers for tests that run `rlfleet` as real processes: the CLI command, the processes of a session, and a
simulated Ray cluster's own authentication token."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

_SCRIPT = Path(sys.executable).with_name("rlfleet")
RLFLEET = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "rlfleet"]


def session_processes(sid: int) -> dict[int, tuple[str, str]]:
    """{pid: (state, command line)} of the live processes in session `sid` (zombies, already dead, left out)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    found = {}
    if psutil is not None:
        for p in psutil.process_iter(["pid", "status", "cmdline"]):
            try:
                if os.getsid(p.info["pid"]) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    found[p.info["pid"]] = (p.info["status"], " ".join(p.info["cmdline"] or []))
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        return found
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] != "Z":
            found[int(entry.name)] = (fields[0], cmdline)
    return found


def wait_until_gone(sid: int, timeout: float) -> dict[int, tuple[str, str]]:
    deadline = time.monotonic() + timeout
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_session(sid: int) -> None:
    for pid in session_processes(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def session_of(proc: subprocess.Popen) -> Iterator[int]:
    """The session of `proc` (started with `start_new_session`: its pid is the session's id), ended however the
    block ends: `proc` killed with its process group if it still runs, then whatever is left in its session."""
    try:
        yield proc.pid
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        kill_session(proc.pid)


def ray_processes() -> dict[int, str]:
    """{pid: command line} of this machine's Ray processes (servers, raylets, workers and actors)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (cmd.startswith("ray::") or "/site-packages/ray/" in cmd):
            found[int(entry.name)] = cmd
    return found


def assert_nothing_left(sid: int, started: set[int]) -> None:
    """No process left in the run's session, and none of the Ray processes `started` (should one have left it)."""
    left = wait_until_gone(sid, timeout=15)
    assert not left, f"processes left in the run's session: {left}"
    deadline = time.monotonic() + 15
    while (still := set(ray_processes()) & started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not still, f"Ray processes the run started are still there: {still}"


def stop_process(pid: int) -> None:
    """SIGSTOP `pid` and wait until it is stopped: alive, its sockets open, answering nothing."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, f"{pid} did not stop"
        time.sleep(0.01)


@contextlib.contextmanager
def rlfleet_session(args: list, cwd: Path) -> Iterator[subprocess.Popen]:
    """`rlfleet ARGS` started in a session of its own, as from a terminal (a Ctrl-C to its process group reaches all of
    it), its output captured; whatever of the session is alive at the end is killed."""
    proc = subprocess.Popen([*RLFLEET, *map(str, args)], cwd=cwd, start_new_session=True, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        kill_session(proc.pid)


def write_token(folder: Path) -> Path:
    """A fresh Ray authentication token in `folder` (mode 0600)."""
    path = folder / "auth_token"
    path.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
    path.chmod(0o600)
    return path


def use_token(path: Path | None, token: str | None = None) -> None:
    """Point Ray at the token file `path` (None: unset), `RAY_AUTH_TOKEN` to `token`, and make this process's Ray read
    them again (as `rlfleet.backends.ray_instance` does for its instances)."""
    for name, value in (("RAY_AUTH_TOKEN_PATH", None if path is None else str(path)), ("RAY_AUTH_TOKEN", token)):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def own_cluster_token(folder: Path) -> Iterator[Path]:
    """A simulated cluster's own token while it runs: a `ray.cluster_utils.Cluster` makes none, and Ray's default one
    (~/.ray/auth_token) exists only where a plain `ray.init()` once ran on the machine."""
    saved = (os.environ.get("RAY_AUTH_TOKEN_PATH"), os.environ.get("RAY_AUTH_TOKEN"))
    path = write_token(folder)
    use_token(path)
    try:
        yield path
    finally:
        use_token(Path(saved[0]) if saved[0] else None, saved[1])

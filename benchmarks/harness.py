"""What the benchmark drivers share: the peers' venv, the machine's description, running one runner process,
the results file.

Used by ``time_to_solve.py`` and ``mujoco_return.py``, which run one process per (framework, algo, env, seed):
``rlfleet_runner.py`` with the driver's own interpreter (rlfleet's venv), the peer runners with the peers' venv
(``benchmarks/.venv-peers``, created here from ``peers/requirements.txt``). Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
RESULTS = BENCHMARKS / "results"
PEERS_VENV = BENCHMARKS / ".venv-peers"
PEER_REQUIREMENTS = BENCHMARKS / "peers" / "requirements.txt"
TORCH_PIN = "torch==2.13.0"
"""Installed first in the peers' venv: the CPU build from the local wheel, not a CUDA build from PyPI."""

FRAMEWORKS = ("rlfleet", "sb3", "tianshou")
RUNNERS = {
    "rlfleet": BENCHMARKS / "rlfleet_runner.py",
    "sb3": BENCHMARKS / "peers" / "sb3_runner.py",
    "tianshou": BENCHMARKS / "peers" / "tianshou_runner.py",
    "sb3-atari": BENCHMARKS / "peers" / "sb3_atari_runner.py",
}
RUNNER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
"""Set for every runner process: one thread for the math libraries, CPU only."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def split_choices(parser: argparse.ArgumentParser, flag: str, value: str, choices: tuple[str, ...]) -> list[str]:
    items = [item.strip() for item in value.split(",") if item.strip()]
    unknown = [item for item in items if item not in choices]
    if unknown or not items:
        parser.error(f"{flag}: expected a comma-separated subset of {','.join(choices)}, got {value!r}")
    return items


def counts(parser: argparse.ArgumentParser, flag: str, text: str, least: int = 1) -> list[int]:
    """`--flag 1,2,4` as its counts, each at least `least`; else the parser's one error line."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        parser.error(f"{flag} takes comma-separated counts, got {text!r}")
    if not values or min(values) < least:
        parser.error(f"{flag} takes counts >= {least}, got {text!r}")
    return values


def add_peer_options(parser: argparse.ArgumentParser) -> None:
    """``--peers-venv`` and ``--setup-only``, the same in every driver."""
    parser.add_argument("--peers-venv", type=Path, default=PEERS_VENV)
    parser.add_argument("--setup-only", action="store_true", help="create/update the peers' venv and exit")


# --- the peers' venv ---------------------------------------------------------------------------------


def pinned_requirements() -> dict[str, str]:
    """``name -> version`` of the ``name==version`` lines of peers/requirements.txt (and torch)."""
    pins = dict([TORCH_PIN.split("==")])
    for line in PEER_REQUIREMENTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip()] = version.strip()
    return pins


def installed_versions(python: Path, names: list[str]) -> dict[str, str | None]:
    script = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n"
        "    try:\n"
        "        return m.version(n)\n"
        "    except m.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))\n"
    )
    out = subprocess.run([str(python), "-c", script, *names], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def matches_pin(installed: str | None, pinned: str) -> bool:
    """``2.13.0+cpu`` satisfies ``2.13.0``: a local version label does not change the release."""
    return installed is not None and installed.split("+")[0] == pinned


def ensure_peers_venv(venv: Path) -> Path:
    """Create or update the peers' venv so that it holds exactly the pinned versions; return its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating the peers' venv {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pins = pinned_requirements()
    installed = installed_versions(python, list(pins))
    if all(matches_pin(installed[name], version) for name, version in pins.items()):
        return python
    log(f"installing {TORCH_PIN} then {PEER_REQUIREMENTS.name} into {venv} (a few minutes)")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    subprocess.run([*pip, TORCH_PIN], check=True)
    subprocess.run([*pip, "-r", str(PEER_REQUIREMENTS)], check=True)
    installed = installed_versions(python, list(pins))
    wrong = {name: installed[name] for name, version in pins.items() if not matches_pin(installed[name], version)}
    if wrong:
        raise SystemExit(f"the peers' venv does not hold the pinned versions {pins}: {wrong}")
    return python


def start(args: argparse.Namespace) -> tuple[Path | None, Path]:
    """A driver's start: the peers' python (None when no peer is asked for) and the runs' log folder.

    Creates or checks the peers' venv when a peer is asked for or with ``--setup-only``, which exits there."""
    peers_python = None
    if args.setup_only or any(fw != "rlfleet" for fw in args.frameworks):
        peers_python = ensure_peers_venv(args.peers_venv)
    if args.setup_only:
        log(f"peers' venv ready: {peers_python}")
        raise SystemExit(0)
    return peers_python, log_dir_for(args.out)


def runner_python(framework: str, peers_python: Path | None) -> Path:
    """The interpreter of a framework's runner: this one for rlfleet, the peers' venv's for the peers."""
    python = Path(sys.executable) if framework == "rlfleet" else peers_python
    assert python is not None, "the peers' venv is needed"
    return python


# --- machine and runs --------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str | None:
    """The checked-out commit of the rlfleet repo (read-only ``git rev-parse``)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def machine_info(peers_python: Path | None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": list(os.getloadavg()),
        "rlfleet_commit": git_commit(),
    }
    if peers_python is not None:
        out = subprocess.run(
            [str(peers_python), "-c", "import platform; print(platform.python_version())"],
            capture_output=True,
            text=True,
            check=True,
        )
        info["peers_python"] = out.stdout.strip()
    return info


def machine_line(machine: dict[str, Any], started: str) -> str:
    """One markdown line describing the machine a results file was measured on."""
    return (
        f"Machine: {machine['cpu_model']}, {machine['cpu_cores']} cores; Python {machine['python']}"
        + (f" (peers: {machine['peers_python']})" if "peers_python" in machine else "")
        + f"; load average at start {' / '.join(f'{x:.2f}' for x in machine['load_average_at_start'])}; "
        f"rlfleet commit {(machine.get('rlfleet_commit') or 'unknown')[:12]}; started {started}."
    )


_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()
_stopping = threading.Event()


def kill_running() -> None:
    """Kill every runner process (group) still running, e.g. on Ctrl-C while runs go on in worker threads; a
    runner that a worker thread starts after this is killed as soon as it has started."""
    with _running_lock:
        _stopping.set()
        procs = list(_running)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def exit_on_signals() -> None:
    """Make SIGTERM (``kill``, ``timeout``, a scheduler's preemption), and SIGHUP where it is not ignored (``nohup``),
    end the driver as Ctrl-C does: by an exception in the main thread, so that its cleanup kills the runners'
    process groups (each runner has a session of its own, so nothing else would reach them). Call first in a
    driver's ``main``."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, stop)


def run_runner(
    python: Path, framework: str, runner_args: list[str], timeout_s: float, log_path: Path, identity: dict[str, Any]
) -> dict[str, Any]:
    """Run one runner process to completion; return its JSON record, or an error record if it failed.

    The runner's stderr goes to ``log_path``; its last stdout line is the record. A failed run's record is
    ``identity`` with ``log`` and ``error``. Safe to call from several threads at once (``--jobs``).
    """
    command = [str(python), str(RUNNERS[framework]), *runner_args]
    env = {**os.environ, **RUNNER_ENV}
    failure = {**identity, "log": str(log_path)}
    started = time.perf_counter()
    with log_path.open("w") as stderr:
        # own session: on timeout the whole process group goes (rlfleet_runner starts the rlfleet CLI)
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, env=env, text=True, cwd=REPO, start_new_session=True
        )
        with _running_lock:
            _running.add(proc)
            if _stopping.is_set():  # the driver is stopping (kill_running): this run must not go on
                os.killpg(proc.pid, signal.SIGKILL)
        try:
            stdout, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {**failure, "error": f"killed after {time.perf_counter() - started:.0f} s"}
        except BaseException:  # e.g. Ctrl-C: the run must not go on, unseen, under the next ones
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            with _running_lock:
                _running.discard(proc)
    lines = [line for line in stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        return {**failure, "error": f"exit status {proc.returncode}" + ("" if lines else ", no result line")}
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return {**failure, "error": f"unparsable result line: {lines[-1][:200]}"}


def open_results(
    out: Path,
    resume: bool,
    config: dict[str, Any],
    header: dict[str, Any],
    peers_python: Path | None,
    same: tuple[str, str],
) -> dict[str, Any]:
    """The results document: the one in ``out`` with ``resume``, else a new one (``header``, then ``config``,
    the machine, the start time and no runs).

    ``same`` is ``(config key, option)``: a resumed document must have been run with the same value of it. A
    resumed document takes the new ``config`` and records when it was resumed."""
    now = datetime.now(UTC).isoformat(timespec="seconds")
    if not (resume and out.exists()):
        return {**header, "config": config, "machine": machine_info(peers_python), "started": now, "runs": []}
    document: dict[str, Any] = json.loads(out.read_text())
    key, option = same
    if document["config"][key] != config[key]:
        raise SystemExit(f"--resume: {out} was run with another {option}")
    document["config"] = config
    document.setdefault("resumed", []).append(now)
    if peers_python is not None and "peers_python" not in document["machine"]:
        document["machine"]["peers_python"] = machine_info(peers_python)["peers_python"]
    return document


def save(document: dict[str, Any], out: Path) -> None:
    """Write atomically, so that a crash mid-write keeps the previous file."""
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n")
    tmp.replace(out)


def log_dir_for(out: Path) -> Path:
    """Create the results folder of ``out`` and its ``logs/`` (git-ignored); return the latter."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = out.parent / "logs"
    log_dir.mkdir(exist_ok=True)
    return log_dir


def finish(document: dict[str, Any], out: Path, table: str) -> None:
    """Record the load average at the end, save, write the markdown table next to ``out`` and print it."""
    document["machine"]["load_average_at_end"] = list(os.getloadavg())
    save(document, out)
    out.with_suffix(".md").write_text(table)
    print(table)

"""Where the `ray` backend's Ray runs (see `ray_backend`): a private instance of the run's own, on 127.0.0.1 only,
with token authentication forced on and a token of its own, its session folder removed at its end; or a cluster
joined with `--address`, resolved (`auto`) and probed (something answers, it is Ray, it will take this
environment's token, it is no other run's private instance) before Ray is asked to join it. Ray's own lines go to
the run's log (`RayLog`), and a Ctrl-C while Ray starts is deferred to its end (`sigint_deferred`)."""

from __future__ import annotations

import atexit
import contextlib
import io
import ipaddress
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

from rlfleet.fields import ConfigError

ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of Ray's error texts
ADDRESS_TIMEOUT_S = 5.0  # to reach --address before Ray is asked to join it
CLUSTER_ID_RPC = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # a Ray client's first call to a cluster's GCS
RAY_MISSING = "--backend ray needs Ray, an extra: pip install -e '.[ray]'"
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": every Ray listener of this machine on 127.0.0.1
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # where Ray reads its authentication settings
PRIVATE_PREFIX = "rlfleet-ray-"  # of a private instance's folder, in the system's temp folder
PRIVATE_RESOURCE = "rlfleet_private_instance"
"""A resource that every private instance (and only one) offers: it marks it as a run's own, which no other run
may join. It is on its raylet's command line (seen before joining) and among its resources (seen after)."""
SYSTEM_CONFIG: Mapping[str, Any] = MappingProxyType({"worker_niceness": 0})
"""Ray starts its workers at niceness 15 by default: beside a busy learner, or anything else busy at 0, an actor gets
a sliver of a core (on a 2-core machine with three busy processes, four actors took 70-80 s instead of 4 s to import
torch). The private instance, and the tests' and benchmarks' simulated clusters, run their actors as the run runs.
Give Ray `system_config()`, a copy: it writes its session's settings into the dict it is given."""


def system_config() -> dict[str, Any]:
    """A new copy of `SYSTEM_CONFIG` for one Ray start. Ray adds its session's object spilling folder to the dict it
    is given: a second instance started with the same dict in one process (a second `train` or `tune` in a notebook)
    spilled into the first one's folder, removed when that instance stopped, and Ray warned of an unstable API."""
    return dict(SYSTEM_CONFIG)


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def grpc_problem(host: str, port: int) -> str | None:
    """Why HOST:PORT is no Ray cluster to join (None: a gRPC server answers there, as Ray's GCS does), found
    within `ADDRESS_TIMEOUT_S`: nothing listens, or what listens does not speak HTTP/2 (a web server, an SSH
    daemon), where `ray.init` would retry for ever."""
    try:
        with socket.create_connection((host, port), timeout=ADDRESS_TIMEOUT_S) as conn:
            conn.settimeout(ADDRESS_TIMEOUT_S)
            conn.sendall(HTTP2_PREFACE)
            reply = b""
            while len(reply) < 9:  # the server's first frame header: 3 bytes length, 1 byte type (4: SETTINGS)
                chunk = conn.recv(9 - len(reply))
                if not chunk:
                    break
                reply += chunk
    except TimeoutError:
        return f"something listens but did not answer as a Ray cluster within {ADDRESS_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"nothing answers: {exc.strerror or exc}"
    if len(reply) < 9 or reply[3] != 4:
        return "something listens there, but not a Ray cluster (no gRPC server answered)"
    return None


def _client_token() -> tuple[str, str] | None:
    """The token this process would offer a cluster, and where it comes from, as Ray looks for it: only with
    `RAY_AUTH_MODE=token`, from `RAY_AUTH_TOKEN`, the file `RAY_AUTH_TOKEN_PATH`, or `~/.ray/auth_token`."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    with contextlib.suppress(OSError):
        return path.read_text().strip(), str(path)
    return None


def auth_problem(host: str, port: int) -> str | None:
    """Why the Ray cluster at HOST:PORT will refuse this process, from one call (within `ADDRESS_TIMEOUT_S`) that
    every Ray client makes first: it requires a token and none is offered, or it refuses the one offered (`ray.init`
    would retry for half a minute, then say only that it failed to connect). None: no refusal seen."""
    import grpc

    token = _client_token()
    metadata = [("authorization", f"Bearer {token[0]}")] if token else []
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            channel.unary_unary(CLUSTER_ID_RPC)(b"", timeout=ADDRESS_TIMEOUT_S, metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                return None  # not this check's to judge: `ray.init` says what it finds
            if token is None:
                return ("the cluster requires token authentication and this environment offers no token: set "
                        "RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN_PATH to a file holding the cluster's token (or "
                        "RAY_AUTH_TOKEN to the token)")  # fmt: skip
            return f"the cluster refused the token this environment offers (from {token[1]}): use the cluster's token"
    return None


def on_loopback(address: str) -> bool:
    """A HOST:PORT of this machine's loopback: a cluster on 127.0.0.1 (Ray must then keep to loopback too)."""
    host = address.rpartition(":")[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass
class LocalInstance:
    """A Ray instance with a raylet on this machine, as its command line shows it (to anyone on the machine)."""

    pid: int  # the raylet's
    uid: int  # its user's
    gcs: str  # the address that joins it, HOST:PORT
    session_dir: str
    private: bool  # an rlfleet run's private instance (`PRIVATE_RESOURCE`)

    @property
    def driver_pid(self) -> int | None:
        """The process that started it (its session's name ends with that pid)."""
        tail = self.session_dir.rstrip("/").rpartition("_")[2]
        return int(tail) if tail.isdigit() else None


def local_instances() -> list[LocalInstance]:
    """Every Ray instance with a raylet on this machine, any user's (Linux: from /proc; elsewhere none are found),
    as Ray finds them for `auto`, with who runs each and whether it is a run's private instance."""
    found: list[LocalInstance] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            uid = entry.stat().st_uid
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if not args or os.path.basename(args[0]) != "raylet":
            continue
        flags: dict[str, str] = {}
        for arg in args[1:]:
            name, _, value = arg.partition("=")
            flags.setdefault(name, value)  # the raylet's own flags come before those of the commands it runs
        if not flags.get("--gcs-address"):
            continue
        resources = flags.get("--static_resource_list", "").split(",")[::2]
        found.append(LocalInstance(int(entry.name), uid, flags["--gcs-address"], flags.get("--session_dir", ""),
                                   PRIVATE_RESOURCE in resources))  # fmt: skip
    return found


def same_endpoint(a: str, b: str) -> bool:
    """HOST:PORT `a` and `b` are one address: the same port, and the same host (127.0.0.1 and localhost alike, or
    names that resolve to a shared address)."""
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    if port_a != port_b:
        return False
    if host_a == host_b or (on_loopback(a) and on_loopback(b)):
        return True
    with contextlib.suppress(OSError):
        return bool(_addresses_of(host_a) & _addresses_of(host_b))
    return False


def _addresses_of(host: str) -> set[str]:
    return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}


def ray_address_file() -> Path:
    """Where `ray start --head` (and `ray.cluster_utils.Cluster`) leave the address of the latest cluster started
    on this machine, which `auto` joins."""
    return Path(system_temp_dir()) / "ray" / "ray_current_cluster"


def resolve_address(address: str) -> tuple[str, str]:
    """(HOST:PORT to join, how it was found) for `--address`. `auto` is resolved here, before Ray is imported (so
    that one on 127.0.0.1 makes Ray keep to loopback: Ray would rewrite it to the machine's address and wait there
    for ever), as Ray 2.60 resolves it: `RAY_ADDRESS`, else the address file of the latest `ray start`, else the one
    Ray instance running on this machine, except that no other user's instance and no run's private instance
    counts (Ray would join any)."""
    if address != "auto":
        return address, ""
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env != "auto":
        return env, "RAY_ADDRESS"
    file = ray_address_file()
    with contextlib.suppress(OSError):
        found = file.read_text().strip()
        if found:
            return found, f"the address of the latest `ray start`, in {file}"
    mine = [i for i in local_instances() if i.uid == os.getuid() and not i.private]
    if len(mine) == 1:
        return mine[0].gcs, "the one Ray instance of yours running on this machine"
    if not mine:
        raise ConfigError(
            "--address auto: no Ray cluster to join (no RAY_ADDRESS, no address of a `ray start` in "
            f"{file}, and no Ray instance of yours running on this machine but rlfleet runs' private ones): start "
            "one with `ray start --head`, or give --address HOST:PORT"
        )
    raise ConfigError(
        f"--address auto: {len(mine)} Ray instances of yours run on this machine "
        f"({', '.join(sorted(i.gcs for i in mine))}): give --address HOST:PORT"
    )


def refuse_foreign(address: str, given: str, how: str) -> None:
    """Refuse the Ray instance at `address` (found as `how` says, for `--address given`) when this machine runs it
    as an rlfleet run's private instance (which goes with that run, and whose token is that run's alone), or, found
    by `auto`, as another user's (which `auto` should not join unasked)."""
    label = f"--address {given}" + (f" ({address}, {how})" if how else "")
    for instance in local_instances():
        if not same_endpoint(instance.gcs, address):
            continue
        if instance.private:
            owner = f" (process {instance.driver_pid})" if instance.driver_pid else ""
            raise ConfigError(
                f"{label} is the private Ray instance of another rlfleet run{owner}, which ends with that run and "
                "admits no one else: start a cluster to share with `ray start --head` and join that"
            )
        if how and instance.uid != os.getuid():
            raise ConfigError(
                f"{label} is a Ray instance of another user (uid {instance.uid}): give --address {address} to "
                "join it on purpose"
            )


def import_ray(private: bool) -> ModuleType:
    """Ray, imported so that a private instance (or one on 127.0.0.1) listens on loopback only; a clear error if it
    is missing."""
    imported = sys.modules.get("ray")
    if imported is not None and _real_ray(imported).is_initialized():
        return imported  # connected already: the run uses that connection
    if private:
        if imported is not None and os.environ.get(LOOPBACK_ENV) != "0":
            raise ConfigError(
                "ray was imported before rlfleet could bind its private Ray instance to 127.0.0.1: set "
                f"{LOOPBACK_ENV}=0 in the environment before importing ray, or start Ray yourself and pass --address"
            )
        os.environ[LOOPBACK_ENV] = "0"  # read when ray is imported
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return _real_ray(ray)


def _real_ray(module: ModuleType) -> ModuleType:
    """`module`, imported as `ray`, if it is Ray; without Ray installed, a folder named ray on the import path is
    imported instead (a namespace package): a `ConfigError` naming the extra and that folder."""
    if not hasattr(module, "init"):
        where = ", ".join(map(str, getattr(module, "__path__", []))) or getattr(module, "__file__", None) or "?"
        raise ConfigError(f"{RAY_MISSING} ('import ray' found {where}, which is not Ray)")
    return module


def system_temp_dir() -> str:
    """The folder Ray keeps its temp folder in (`ray/` there by default), found as Ray 2.60 finds it."""
    if "RAY_TMPDIR" in os.environ:
        return os.environ["RAY_TMPDIR"]
    if sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        return os.environ["TMPDIR"]
    return "/tmp" if sys.platform.startswith(("linux", "darwin")) else tempfile.gettempdir()


@dataclass
class PrivateInstance:
    """This process's private Ray instance: its folder (the user's alone, mode 0700, in the system's temp folder),
    which holds its token (`auth_token`, mode 0600) and Ray's temp folder for it (`ray/`, with its session folder:
    logs, sockets, spilled objects; Ray opens that one to everyone, mode 0777, and the folder around it keeps the
    others out), removed when it stops; and the authentication settings of the environment before it started, put
    back then."""

    folder: Path
    saved_env: dict[str, str | None]

    @property
    def token_path(self) -> Path:
        return self.folder / "auth_token"

    @property
    def temp_dir(self) -> Path:
        return self.folder / "ray"


_private: PrivateInstance | None = None


def _refresh_auth_settings() -> None:
    """Make Ray read the authentication settings of the environment again (mode and token), as Ray itself does
    when it turns token authentication on for a new local instance."""
    if "ray._raylet" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # not in _raylet.pyi

        Config.initialize("")  # the mode first: a token loaded while the mode is stale fails a check in Ray
        AuthenticationTokenLoader.instance().reset_cache()


def _new_private_folder() -> PrivateInstance:
    """The private instance's folder with a token of its own, and the environment set for it: token authentication
    forced on (whatever `RAY_AUTH_MODE` says: a client without the token must not run code in it), and that token
    alone (not `RAY_AUTH_TOKEN` or `~/.ray/auth_token`, which every instance of the user may share). Ray's processes
    inherit the environment."""
    folder = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=system_temp_dir()))  # mode 0700
    instance = PrivateInstance(folder, {name: os.environ.get(name) for name in AUTH_ENV})
    fd = os.open(instance.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))  # as Ray's own tokens: 256 random bits
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(instance.token_path)
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would come first
    return instance


def start_private_instance(min_cpus: int = 1) -> ModuleType:
    """Start a Ray instance of this machine for this process alone: every listener on 127.0.0.1, token
    authentication on with a token of its own (`PrivateInstance`), Ctrl-C kept from its processes, at least
    `min_cpus` CPUs (more than the machine has oversubscribes it, as local processes would). Returns `ray`;
    `stop_private_instance()` stops it (at exit at the latest). A Ctrl-C while it starts is raised once it has
    started (`sigint_deferred`), after the instance is stopped again: nothing of it is left."""
    global _private
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        raise RuntimeError("this process is connected to Ray already: no private instance started")
    stop_private_instance()  # one stopped with `ray.shutdown()` alone: its folder and settings
    _private = _new_private_folder()
    try:
        ray = import_ray(private=True)
        _refresh_auth_settings()
        with sigint_deferred():
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, min_cpus), include_dashboard=False,
                     logging_level="WARNING", _temp_dir=str(_private.temp_dir),
                     resources={PRIVATE_RESOURCE: 1}, _system_config=system_config())  # fmt: skip
    except BaseException:
        stop_private_instance()
        raise
    return ray


def stop_private_instance() -> None:
    """Stop this process's private instance, if it has one (idempotent): shut Ray down, put the environment's
    authentication settings back and remove its folder."""
    global _private
    if _private is None:
        return
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    instance, _private = _private, None
    for name, value in instance.saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _refresh_auth_settings()
    _remove_folder(instance.folder)


def _remove_folder(folder: Path, patience_s: float = 5.0) -> None:
    """Remove `folder` and what is in it, again while a process of the instance that is still leaving (Ray's
    agents) writes a file there."""
    deadline = time.monotonic() + patience_s
    while True:
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.2)


atexit.register(stop_private_instance)  # what `ray.shutdown()` alone leaves (Ray shuts itself down at exit before)


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Ctrl-C while Ray starts processes (or actors) is deferred to the end of the block, neither lost nor seen by
    them. A terminal sends it to the whole process group: SIGINT is blocked in this thread, so the processes
    started here inherit it blocked and never see one (Ray blocks it in the processes it starts too, and none of
    them unblocks it), and a SIGINT that reaches another thread of this process meanwhile is only recorded. At the
    end the handler in place before the block gets the one that came (KeyboardInterrupt by default, the run's
    polite stop during a run), as if it had come then. The SIGTERM handler in place before the block is put back
    too: `ray.init` installs one that exits (`sys.exit(15)`), which would outlive the run in the user's process; a
    SIGTERM that reached that one meanwhile is a KeyboardInterrupt, as a Ctrl-C is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    previous_term = signal.getsignal(signal.SIGTERM)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    except SystemExit as exc:  # Ray's SIGTERM handler, while `ray.init` ran
        if exc.code != signal.SIGTERM or signal.getsignal(signal.SIGTERM) is previous_term:
            raise
        raise KeyboardInterrupt from None
    finally:
        if previous_term is not None:  # None: a handler installed from C, which Python cannot put back
            signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one pending in this thread reaches `previous` here
        if came and signal.SIGINT not in mask:
            signal.raise_signal(signal.SIGINT)


class RayLog:
    """Where the lines go that Ray forwards to the driver to print: its autoscaler's ("(autoscaler +8s) Error: No
    available node types can fulfill ..."), its raylets' ("(raylet) A worker died ...") and what the actors write.
    Ray prints them in the driver's terminal, coloured, between rlfleet's own lines; with a run folder they go to
    `<run>/ray.log` instead, without colours. Ray 2.60 has no setting for this (`log_to_driver=False` drops the
    actors' output and the autoscaler's alone; a raylet's message is printed in any case), so the one function
    through which Ray prints them all, `ray._private.worker.print_to_stdstream`, is replaced while this run's
    connection lasts (`attach` before `ray.init`, `detach` after `ray.shutdown`)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._replaced: Any = None

    def attach(self) -> None:
        import ray._private.worker as ray_worker

        if self._replaced is None:
            self._replaced = ray_worker.print_to_stdstream
            ray_worker.print_to_stdstream = self.print_to_stdstream

    def detach(self) -> None:
        import ray._private.worker as ray_worker

        if self._replaced is not None:
            ray_worker.print_to_stdstream = self._replaced
            self._replaced = None

    def print_to_stdstream(self, data: dict[str, Any], ignore_prefix: bool = False) -> None:
        """Ray's `print_to_stdstream(data, ignore_prefix)`: a batch of lines of one process, written as Ray writes
        them (its prefix, the autoscaler's events picked out of its output) but to the run's log."""
        from ray._private.worker import print_worker_logs

        text = io.StringIO()
        print_worker_logs(data, text, ignore_prefix)
        self.write(ANSI.sub("", text.getvalue()))

    def write(self, text: str) -> None:
        if text:
            with self._lock, open(self.path, "a") as f:
                f.write(text if text.endswith("\n") else text + "\n")

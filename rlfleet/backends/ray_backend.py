"""The `ray` backend: roles as Ray actors, on this machine or across a Ray cluster.

Each role runs in an actor of its own (`RoleActor`, `--cpus-per-role` / `--gpus-per-role` Ray resources, one
torch thread per CPU). The coordinator drives it: every item is one call, `produce(global_steps, version,
weights)`, and a worker has as many calls in flight as it has credits (a call is issued when a credit is
given back with `release`), so a role is never more than `credits` items ahead, as on the local backend.
The global step count, the stop flag and the weights' version live in the coordinator only; the step
count travels with each call.

Weights travel through the object store as a version-tagged state dict. The coordinator's networks (from
`share`) are published once per version, when a call first needs them (`ray.put` of every tensor, target
networks included); a call carries the newest version's object only to an actor that does not have it yet,
and the actor loads it into its replica of the networks before its role produces (the role's
`weights.read(copy.pull)` then sees exactly that version). Items come back pickled, as through the local
backend's pipes, so the coordinator gets its own writable arrays.

Reliability: a call that fails (the role raised: its traceback; the actor died: Ray's reason) is reported
by `check()`, which starts the next incarnation of that worker in a new actor, up to `max_restarts` in all.
A call that has not returned after `heartbeat_s` (plus a grace for starting the actor) is taken for a hung
role: its actor is killed and restarted like a dead one; the clock is held while a service the roles call
does not answer (`RoleGroup.waits_on`), so that a role blocked on a hung service is not killed before it.
Services (`start_services`, named actors) are pinged by `check()` behind their calls (one ping in flight
each); one that has not answered for `heartbeat_s` is killed (`ray.kill`) and restarted like a dead one.
`stop()` kills every actor; `close()` shuts down the
Ray instance the run started.

Where Ray runs (`--address`):

- empty (the default): a private Ray instance for this run, bound to 127.0.0.1 (no listener on any other
  interface: `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` is set before Ray is imported), with Ray's token
  authentication forced on (`RAY_AUTH_MODE=disabled` does not turn it off) and a token of its own (a file only the
  user reads, not `~/.ray/auth_token`), started in a few seconds and shut down at the end of the run; its session
  folder (Ray's logs, sockets and spilled objects) lives in a folder of its own, removed then;
- `HOST:PORT` or `auto`: join an existing cluster (`ray start --head` on one machine, `ray start --address`
  on the others); it is left running. A token-protected cluster needs `RAY_AUTH_MODE=token` and its token
  (`RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH`) in the driver's environment. `auto` is resolved before Ray is
  imported, as Ray resolves it (`RAY_ADDRESS`, the latest `ray start`'s address file, the one instance running
  here), so that a cluster on 127.0.0.1 keeps Ray on loopback; it never picks another user's instance or a run's
  private one, and no address joins a run's private instance (`PRIVATE_RESOURCE` marks them);
- a Ray connection this process already has (`ray.init` called before the run) is used as it is.

What Ray prints in the driver's terminal (its raylets' and autoscaler's messages, the actors' output, coloured) goes
to `<run>/ray.log` without colours while the run's own connection lasts (`RayLog`).

`--placement a,b` places worker i on a node that offers the custom resource `names[i mod n]` (nodes started
with `--resources '{"a": 8}'`), for runs that spread roles over given machines.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import io
import ipaddress
import json
import os
import pickle
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfleet.backends.base import (
    PING_EVERY_S,
    Backend,
    Crash,
    Pending,
    RoleGroup,
    ServiceError,
    ServiceGroup,
    ServiceHandle,
    ServiceUnavailable,
    WorkerFailure,
    slow_after,
)
from rlfleet.backends.mailboxes import Mailboxes, MailboxesReset
from rlfleet.backends.shared_memory import IN_PROCESS, StepCounter, StopFlag, WeightVersion
from rlfleet.fields import ConfigError

STARTUP_GRACE_S = 60.0  # time a new actor has, beyond the heartbeat interval, to start and answer its first call
TASK_EVENTS = False
"""Whether Ray records an event for each call to rlfleet's actors (its dashboard's task timeline). Off: every item,
block, sample and gossip round is a call, and the GCS keeps each call's events (about 3.4 KB each, measured with
Ray 2.60: 60k calls grew the GCS from 43 to 250 MB, and to 45 MB with them off), so a long run's GCS grows to
Ray's cap of events instead of staying flat; calls are also about 10% faster without them."""
PLACEMENT_SHARE = 1e-3  # of a `--placement` resource each role asks for: many roles fit on one node
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of Ray's error texts
ADDRESS_TIMEOUT_S = 5.0  # to reach --address before Ray is asked to join it
CLUSTER_ID_RPC = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # a Ray client's first call to a cluster's GCS
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": every Ray listener of this machine on 127.0.0.1
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")  # where Ray reads its authentication settings
PRIVATE_PREFIX = "rlfleet-ray-"  # of a private instance's folder, in the system's temp folder
PRIVATE_RESOURCE = "rlfleet_private_instance"
"""A resource that every private instance (and only one) offers: it marks it as a run's own, which no other run
may join. It is on its raylet's command line (seen before joining) and among its resources (seen after)."""


RESOURCE_UNIT = 1e-4  # Ray reserves resources in multiples of this


def _check_placement(placement: str, address: str) -> None:
    """`--placement a,b`: names, none empty; and a cluster to find them on: the private instance (no `--address`,
    no connection made before the run) has no custom resources, so no role could ever be placed."""
    if not placement:
        return
    names = placement.split(",")
    if not all(name.strip() for name in names):
        raise ConfigError(f"--placement {placement!r} has an empty name: give resource names, comma-separated (a,b)")
    ray = sys.modules.get("ray")
    connected = ray is not None and ray.is_initialized()
    if not address and not connected:
        raise ConfigError(
            f"--placement {placement} names custom resources of a Ray cluster's nodes, but without --address the run "
            "starts a private Ray instance, which has none: join the cluster with --address HOST:PORT"
        )
    if connected:
        missing = sorted({n for n in names} - set(ray.cluster_resources()))
        if missing:
            raise ConfigError(f"--placement: no node of the connected Ray cluster offers {', '.join(missing)}")


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame


def _grpc_problem(host: str, port: int) -> str | None:
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


def _auth_problem(host: str, port: int) -> str | None:
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
    found = []
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


def _same_endpoint(a: str, b: str) -> bool:
    """HOST:PORT `a` and `b` are one address (127.0.0.1 and localhost alike)."""
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    return port_a == port_b and (host_a == host_b or (on_loopback(a) and on_loopback(b)))


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


def _refuse_foreign(address: str, given: str, how: str) -> None:
    """Refuse the Ray instance at `address` (found as `how` says, for `--address given`) when this machine runs it
    as an rlfleet run's private instance (which goes with that run, and whose token is that run's alone), or, found
    by `auto`, as another user's (which `auto` should not join unasked)."""
    label = f"--address {given}" + (f" ({address}, {how})" if how else "")
    for instance in local_instances():
        if not _same_endpoint(instance.gcs, address):
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


def import_ray(private: bool):
    """Ray, imported so that a private instance (or one on 127.0.0.1) listens on loopback only; a clear error if it
    is missing."""
    imported = sys.modules.get("ray")
    if imported is not None and imported.is_initialized():
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
        raise ConfigError("--backend ray needs Ray, an extra: pip install -e '.[ray]'") from None
    return ray


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
        from ray._raylet import AuthenticationTokenLoader, Config

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


def start_private_instance(min_cpus: int = 1):
    """Start a Ray instance of this machine for this process alone: every listener on 127.0.0.1, token
    authentication on with a token of its own (`PrivateInstance`), Ctrl-C kept from its processes, at least
    `min_cpus` CPUs (more than the machine has oversubscribes it, as local processes would). Returns `ray`;
    `stop_private_instance()` stops it (at exit at the latest). A Ctrl-C while it starts is raised once it has
    started (`_sigint_deferred`), after the instance is stopped again: nothing of it is left."""
    global _private
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        raise RuntimeError("this process is connected to Ray already: no private instance started")
    stop_private_instance()  # one stopped with `ray.shutdown()` alone: its folder and settings
    _private = _new_private_folder()
    try:
        ray = import_ray(private=True)
        _refresh_auth_settings()
        with _sigint_deferred():
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, min_cpus), include_dashboard=False,
                     logging_level="WARNING", _temp_dir=str(_private.temp_dir),
                     resources={PRIVATE_RESOURCE: 1})  # fmt: skip
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
def _sigint_deferred():
    """Ctrl-C while Ray starts processes (or actors) is deferred to the end of the block, neither lost nor seen by
    them. A terminal sends it to the whole process group: SIGINT is blocked in this thread, so the processes
    started here inherit it blocked and never see one (Ray blocks it in the processes it starts too, and none of
    them unblocks it), and a SIGINT that reaches another thread of this process meanwhile is only recorded. At the
    end the handler in place before the block gets the one that came (KeyboardInterrupt by default, the run's
    polite stop during a run), as if it had come then."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
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


def module_state(modules: dict[str, nn.Module]) -> dict[str, dict[str, np.ndarray]]:
    """Every network's state dict as NumPy arrays (what is published)."""
    return {name: {k: v.detach().cpu().numpy() for k, v in m.state_dict().items()} for name, m in modules.items()}


@torch.no_grad()
def load_module_state(modules: dict[str, nn.Module], state: dict[str, dict[str, np.ndarray]]) -> None:
    """Copy a published state into the networks in place (the role's local copy keeps pointing at them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the object store's arrays are read-only: only read here
        for name, module in modules.items():
            for key, tensor in module.state_dict().items():
                tensor.copy_(torch.as_tensor(state[name][key]))


def where() -> dict[str, Any]:
    """The process and node of the actor it runs in."""
    import ray  # in an actor, where Ray is imported already

    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}


@dataclass
class RoleError:
    """What a call returns when its role raised: the traceback, as the role's process wrote it."""

    traceback: str


class RoleActor:
    """One role in a Ray actor: its replica of the coordinator's networks and weight version, and the role."""

    def __init__(self, payload: bytes, worker_id: int, incarnation: int, threads: int):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(threads)
        make_role, self.modules, self.weights = pickle.loads(payload)  # one pickle: the role sees these objects
        self.version = -1
        self.role = make_role(worker_id, incarnation)
        self.stop = StopFlag(IN_PROCESS)  # never set: each call makes one item

    def where(self) -> dict[str, Any]:
        return where()

    def produce(self, global_steps: int, version: int, state: Any) -> bytes:
        if state is not None:
            with self.weights.writing():
                load_module_state(self.modules, state)
            self.weights.set(version)
            self.version = version
        try:
            item = self.role.produce(global_steps, self.stop)
        except Exception:
            item = RoleError(traceback.format_exc())  # sent home like an item; the coordinator restarts the actor
        return pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)


class Places:
    """Where a group's actors run: `{index: pid}` in `pids_file` (tests kill them through it) and `{index: {pid,
    node, ip}}` in `places_file`, from each actor's `where()`. After a restart the new actor's answer is recorded
    when it comes (`poll`), so that neither the learner nor the healthy roles wait on a restart."""

    def __init__(self, ray, pids_file, places_file):
        self.ray, self.pids_file, self.places_file = ray, pids_file, places_file
        self.places: dict[str, dict[str, Any]] = {}
        self.pending: dict[int, Any] = {}  # index -> the where() call of its newest actor
        self.asked: dict[int, float] = {}  # index -> when (time.monotonic) it was asked

    def ask(self, index: int, actor) -> None:
        self.places.pop(str(index), None)
        self.pending[index] = actor.where.remote()
        self.asked[index] = time.monotonic()

    def unplaced(self, grace: float) -> list[int]:
        """The actors asked longer than `grace` ago that have not answered: not started (no node has what they
        need, as when the only node with their `--placement` resource is gone) or stuck in their constructor."""
        now = time.monotonic()
        return [index for index in self.pending if now - self.asked[index] > grace]

    def wait_all(self, timeout: float) -> int:
        """Wait up to `timeout` for every answer outstanding, record them; returns how many did not come."""
        refs = list(self.pending.values())
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=timeout) if refs else ([], [])
        missing = len(refs) - len(ready)
        self.poll()
        return missing

    def poll(self) -> None:
        """Record the answers that have come (a dead actor's is dropped: the group reports it)."""
        if not self.pending:
            return
        ready, _ = self.ray.wait(list(self.pending.values()), num_returns=len(self.pending), timeout=0)
        if not ready:
            return
        for index, ref in list(self.pending.items()):
            if ref in ready:
                del self.pending[index]
                with contextlib.suppress(Exception):
                    self.places[str(index)] = self.ray.get(ref)
        self._write()

    def _write(self) -> None:
        if self.pids_file is None:
            return
        pids = {index: place["pid"] for index, place in self.places.items()}
        for path, data in ((self.pids_file, pids), (self.places_file, self.places)):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)


def unplaceable(backend: RayBackend, service: bool = False) -> str:
    """Why an actor may not start: what it asks of the cluster (a service asks for no CPU), and what is free."""
    opts = backend.opts
    asks = [] if service else [f"{getattr(opts, 'cpus_per_role', 1.0)} CPU(s)",
                               f"{getattr(opts, 'gpus_per_role', 0.0)} GPU(s)"]  # fmt: skip
    if getattr(opts, "placement", ""):
        asks.append(f"a share of one of the resources {opts.placement} (--placement)")
    return (f"the Ray cluster may not have {' and '.join(asks)} free per {'service' if service else 'role'} (it "
            f"has {backend.ray.available_resources()}), or its constructor hangs")  # fmt: skip


class Worker:
    """The coordinator's record of one worker: its actor, its calls in flight (oldest first) and its state."""

    def __init__(self, actor, incarnation: int, started: float):
        self.actor = actor
        self.incarnation = incarnation
        self.calls: deque = deque()  # (object ref, when the actor could start it: issued, or the call before ended)
        self.ready: deque = deque()  # items received and not yet handed out
        self.credits = 0  # calls it may still be given
        self.version = -1  # the weight version its actor has
        self.started = started
        self.answered = False  # has it finished a call yet (the grace for starting is over)
        self.finished = False  # its role said it has nothing more to give (None)
        self.failure: str | None = None


class RayGroup(RoleGroup):
    """N roles as Ray actors, driven by calls (see the module docstring)."""

    def __init__(self, backend: RayBackend, make_role, n_workers, counter, stop, total_steps, credits, max_restarts,
                 pids_file, heartbeat_s):  # fmt: skip
        self.ray = backend.ray
        self.backend = backend
        self.make_role = make_role
        self.n_workers = n_workers
        self.counter, self.stop_flag, self.total_steps = counter, stop, total_steps
        self.n_credits = credits or 2  # without credits a worker keeps two calls in flight (pipelined)
        self.free_running = credits is None  # ... and gets a new call for each answer, not for each release
        self.max_restarts = max_restarts
        self.pids_file = pids_file
        self.heartbeat_s = heartbeat_s
        self.incarnations = [0] * n_workers
        self.restarts = 0
        self.workers: list[Worker] = []
        self.crashes: list[Crash] = []
        self.stopping = False
        self._next = 0
        self.workers = [self._start(w) for w in range(n_workers)]
        self.places = Places(self.ray, pids_file, None if pids_file is None else pids_file.with_name("actors.json"))
        for wid, worker in enumerate(self.workers):
            self.places.ask(wid, worker.actor)
        missing = self.places.wait_all(STARTUP_GRACE_S)
        if missing:
            raise WorkerFailure(f"{missing} of {n_workers} roles did not start within {STARTUP_GRACE_S:.0f} s: "
                                + unplaceable(backend))  # fmt: skip
        for w in range(n_workers):
            self._issue(w)

    # ----------------------------------------------------------------------------------------- actors
    def _start(self, wid: int) -> Worker:
        payload = self.ray.cloudpickle.dumps((self.make_role, self.backend.modules, self.backend.weights))
        cls = self.ray.remote(RoleActor).options(**self.backend.actor_options(wid))
        incarnation = self.incarnations[wid]
        with _sigint_deferred():
            actor = cls.remote(payload, wid, incarnation, self.backend.threads())
        worker = Worker(actor, incarnation, time.monotonic())
        worker.credits = self.n_credits
        return worker

    def _issue(self, wid: int) -> None:
        """Give a worker calls up to its credits, while the run wants more items."""
        worker = self.workers[wid]
        while worker.credits > 0 and not worker.finished and worker.failure is None and self._wanted():
            version, state = self.backend.publish(worker.version)
            ref = worker.actor.produce.remote(int(self.counter.value), version, state)
            worker.version = version
            worker.calls.append((ref, time.monotonic()))
            worker.credits -= 1

    def _wanted(self) -> bool:
        return not self.stopping and not self.stop_flag.is_set() and self.counter.value < self.total_steps

    def _collect(self, wid: int, ref) -> None:
        """The result of a worker's oldest call, which has finished: an item, the end of the role, or a failure."""
        worker = self.workers[wid]
        worker.calls.popleft()
        worker.answered = True
        self.places.poll()  # a restarted actor answered its where() before this call
        if worker.calls:  # the actor runs one call at a time: the next one starts now, not when it was issued
            following, issued = worker.calls[0]
            worker.calls[0] = (following, max(issued, time.monotonic()))
        try:
            item = pickle.loads(self.ray.get(ref))
        except Exception as exc:  # the actor died (killed, out of memory, its node gone): Ray's reason
            self._fail(wid, ANSI.sub("", str(exc)))
            return
        if isinstance(item, RoleError):
            self._fail(wid, item.traceback)
        elif item is None:
            worker.finished = True
        else:
            worker.ready.append(item)
            if self.free_running:
                worker.credits += 1
                self._issue(wid)

    def _fail(self, wid: int, text: str) -> None:
        worker = self.workers[wid]
        if worker.failure is None:
            worker.failure = text
            worker.calls.clear()

    # ----------------------------------------------------------------------------------------- items
    def _pending(self) -> dict[Any, int]:
        return {w.calls[0][0]: wid for wid, w in enumerate(self.workers) if w.calls and w.failure is None}

    def get(self, worker_id: int, timeout: float) -> Any | None:
        worker = self.workers[worker_id]
        deadline = time.monotonic() + timeout
        while not worker.ready:
            if not worker.calls or worker.failure is not None:
                return None
            ref = worker.calls[0][0]
            ready, _ = self.ray.wait([ref], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            self._collect(worker_id, ref)
        return worker.ready.popleft()

    def get_any(self, timeout: float) -> Any | None:
        deadline = time.monotonic() + timeout
        while True:
            for i in range(self.n_workers):
                wid = (self._next + i) % self.n_workers
                if self.workers[wid].ready:
                    self._next = (wid + 1) % self.n_workers
                    return self.workers[wid].ready.popleft()
            pending = self._pending()
            remaining = deadline - time.monotonic()
            if not pending or remaining <= 0:
                return None
            ready, _ = self.ray.wait(list(pending), num_returns=1, timeout=remaining)
            for ref in ready:
                self._collect(pending[ref], ref)

    def release(self, worker_id: int, incarnation: int) -> None:
        worker = self.workers[worker_id]
        if incarnation == worker.incarnation and not self.free_running:
            worker.credits += 1
            self._issue(worker_id)

    # ----------------------------------------------------------------------------------------- health
    def check(self) -> list[Crash]:
        if self.stopping:
            return []
        self._find_hung()
        crashes = []
        for wid, worker in enumerate(self.workers):
            if worker.failure is None:
                continue
            crashes.append(Crash(wid, None, worker.failure))
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise WorkerFailure(
                    f"workers crashed {self.restarts} times (limit {self.max_restarts}); last: {crashes[-1].describe()}"
                )
            with contextlib.suppress(Exception):
                self.ray.kill(worker.actor, no_restart=True)
            self.incarnations[wid] += 1
            self.workers[wid] = self._start(wid)
            self.places.ask(wid, self.workers[wid].actor)  # recorded when it answers: nobody waits on a restart
        for crash in crashes:
            self._issue(crash.worker)
        self.places.poll()
        late = self.places.unplaced(STARTUP_GRACE_S)
        if late:
            raise WorkerFailure(f"worker {late[0]}'s restart did not start within {STARTUP_GRACE_S:.0f} s: "
                                + unplaceable(self.backend))  # fmt: skip
        return crashes

    def _find_hung(self) -> None:
        """A call the actor has been on for longer than the heartbeat (the first one: plus the start-up grace) is
        a hung role: its actor is killed, and `check` restarts it. A call is timed from when the actor could start it
        (`_collect` moves the next call's clock to the end of the one before), since with several calls in flight
        each waits for the earlier ones."""
        if self.heartbeat_s is None:
            return
        now = time.monotonic()
        for wid, worker in enumerate(self.workers):
            if not worker.calls or worker.failure is not None:
                continue
            waited = now - max(worker.calls[0][1], self.excused_at())
            limit = self.heartbeat_s + (0.0 if worker.answered else STARTUP_GRACE_S)
            if waited > limit and not self.ray.wait([worker.calls[0][0]], timeout=0)[0]:
                self._fail(wid, f"no heartbeat for {waited:.0f} s (hung), so it was killed")

    def alive(self) -> int:
        return sum(w.failure is None and not w.finished for w in self.workers) if not self.stopping else 0

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.places.pending.clear()  # nothing more is recorded: the pids file goes
        for worker in self.workers:
            with contextlib.suppress(Exception):
                self.ray.kill(worker.actor, no_restart=True)
        if self.pids_file is not None:  # actors.json stays: where the workers ran
            with contextlib.suppress(FileNotFoundError):
                self.pids_file.unlink()


# --------------------------------------------------------------------------------------------------- services
RECONNECT_S = 60.0  # how long a handle waits for a dead service's next incarnation before it gives up
RESENDS = 3  # how many times a call goes to a service's next incarnation after its actor died under it


class ServiceActor:
    """One service in a Ray actor (one call at a time, in the order they arrive)."""

    def __init__(self, payload: bytes, index: int, incarnation: int, threads: int):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(threads)
        self.service = pickle.loads(payload)(index, incarnation)

    def where(self) -> dict[str, Any]:
        return where()

    def ping(self) -> bool:
        return True

    def call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.service, method)(*args)
        except Exception:
            return RoleError(traceback.format_exc())  # raised as ServiceError where the result is read


class RayPending(Pending):
    """A call sent to a service actor; sent again to the service's next incarnation (a new actor under its name) if
    the actor dies first, up to `RESENDS` times: an actor that dies under every incarnation (one that cannot start:
    out of threads or memory, a constructor that raises) is a `ServiceUnavailable` with Ray's reason, not a retry
    loop. While the next incarnation is not there yet (the dead actor may keep its name a while, as when its node
    went), a wait with a timeout ends with `TimeoutError` like any other, so that a coordinator that restarts the
    services itself (`ServiceGroup.check`) does so between its waits; any wait ends after `RECONNECT_S`."""

    def __init__(self, handle: RayServiceHandle, method: str, args: tuple):
        self.handle, self.method, self.args = handle, method, args
        self.deaths = 0  # actors that died under this call
        self.sent_to: Any = None  # the id of the actor the call is with
        self.dead: Any = None  # the id of the last one that died under it
        self.lost_at: float | None = None  # when it died (None: the call is with a live actor)
        self.ref: Any = None
        self._send(None)

    def _send(self, deadline: float | None) -> bool:
        """Send the call to the actor under the name, unless it is the one that died under it; False if no other
        answered to the name by `deadline`."""
        while True:
            actor = self.handle.actor(deadline)
            if actor is None:
                return False
            if actor._actor_id != self.dead:
                self.ref, self.lost_at = actor.call.remote(self.method, *self.args), None
                self.sent_to = actor._actor_id
                return True
            if self.lost_at is not None and time.monotonic() - self.lost_at > RECONNECT_S:
                raise ServiceUnavailable(f"service {self.handle.index} was not restarted within {RECONNECT_S:.0f} s")
            self.handle.lost()  # the dead actor still holds the name: look again, for its next incarnation
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def result(self, timeout: float | None = None) -> Any:
        import ray

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.lost_at is not None and not self._send(deadline):
                raise TimeoutError(f"service {self.handle.index}: not restarted within {timeout} s (yet)")
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                value = ray.get(self.ref, timeout=left)
                break
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(f"service {self.handle.index}: no answer within {timeout} s") from None
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
                self.deaths += 1
                if self.deaths > RESENDS:
                    reason = (ANSI.sub("", str(exc)).strip().splitlines() or [type(exc).__name__])[0]
                    raise ServiceUnavailable(
                        f"service {self.handle.index}'s actor died under its {self.method} call {self.deaths} times; "
                        f"last: {reason}"
                    ) from None
                self.dead, self.lost_at = self.sent_to, time.monotonic()
                self.handle.lost()  # its death is the coordinator's to report and restart: wait for that
        if isinstance(value, RoleError):
            raise ServiceError(f"service {self.handle.index}'s {self.method} raised:\n{value.traceback}")
        return value


class RayServiceHandle(ServiceHandle):
    """A service by its actor's name: whichever incarnation holds the name now answers. Picklable."""

    def __init__(self, index: int, name: str, namespace: str):
        self.index, self.name, self.namespace = index, name, namespace
        self._actor = None

    def __getstate__(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "namespace": self.namespace}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _actor=None)

    def actor(self, deadline: float | None = None):
        """The actor under the name, waiting for one to hold it (a restarted one) up to `RECONNECT_S`, or until
        `deadline` (`time.monotonic`), then None."""
        import ray

        waited_since = time.monotonic()
        while self._actor is None:
            try:
                self._actor = ray.get_actor(self.name, namespace=self.namespace)
            except ValueError:  # not (yet) there: the coordinator restarts it
                if time.monotonic() - waited_since > RECONNECT_S:
                    raise ServiceUnavailable(f"service {self.index} unreachable for {RECONNECT_S:.0f} s") from None
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                time.sleep(0.1)
        return self._actor

    def lost(self) -> None:
        """The actor died: look the name up again (after a moment, for the restart)."""
        self._actor = None
        time.sleep(0.1)

    def submit(self, method: str, *args: Any) -> Pending:
        return RayPending(self, method, args)


class RayServices(ServiceGroup):
    """N services as named Ray actors, restarted (a new actor under the same name) when they die."""

    def __init__(self, backend: RayBackend, make_service, n: int, max_restarts: int, pids_file, name: str,
                 heartbeat_s: float | None = None):  # fmt: skip
        self.ray, self.backend = backend.ray, backend
        self.heartbeat_s = heartbeat_s
        self.unwell_at = float("-inf")
        self.answered: list[bool] = [False] * n  # has this incarnation answered a ping yet (its start-up grace)
        self.make_service, self.n, self.max_restarts = make_service, n, max_restarts
        self.pids_file, self.name = pids_file, name
        # where each service runs, `{index: {pid, node, ip}}` (as `actors.json` for the workers): `shards.json`'s
        # is `shards_actors.json`
        self.places = Places(
            self.ray, pids_file, None if pids_file is None else pids_file.with_name(f"{pids_file.stem}_actors.json")
        )
        self.namespace = self.ray.get_runtime_context().namespace
        self.prefix = f"rlfleet-{uuid.uuid4().hex[:12]}-{name}"
        self.incarnations = [0] * n
        self.restarts = 0
        self.stopping = False
        self.actors = [self._start(i) for i in range(n)]
        self.handles = [RayServiceHandle(i, f"{self.prefix}-{i}", self.namespace) for i in range(n)]
        now = time.monotonic()
        self.pings = [(actor.ping.remote(), now) for actor in self.actors]  # (ping or None, sent / answered at)
        for index, actor in enumerate(self.actors):
            self.places.ask(index, actor)
        self.places.wait_all(STARTUP_GRACE_S)

    def _start(self, index: int):
        """The next incarnation of service `index`: `make_service` pickled now, with what it holds now."""
        options = self.backend.actor_options(index)  # services reserve no CPU: light, and next to the workers
        options.update(name=f"{self.prefix}-{index}", namespace=self.namespace, num_cpus=0, num_gpus=0)
        payload = self.ray.cloudpickle.dumps(self.make_service)
        with _sigint_deferred():
            return (
                self.ray.remote(ServiceActor)
                .options(**options)
                .remote(payload, index, self.incarnations[index], self.backend.threads())
            )

    def check(self) -> list[Crash]:
        """Each service answers a ping in turn (queued behind its calls, one in flight, the next `PING_EVERY_S`
        after an answer); one whose actor died, or that has not answered for `heartbeat_s` (hung: killed), is
        restarted."""
        if self.stopping:
            return []
        now = time.monotonic()
        in_flight = [ping for ping, _ in self.pings if ping is not None]
        ready, _ = self.ray.wait(in_flight, num_returns=len(in_flight), timeout=0) if in_flight else ([], [])
        crashes = []
        for index, (ping, since) in enumerate(self.pings):
            if ping is None:
                if now - since >= PING_EVERY_S:
                    self.pings[index] = (self.actors[index].ping.remote(), now)
                continue
            if ping in ready:
                try:
                    self.ray.get(ping)
                    self.pings[index] = (None, now)
                    self.answered[index] = True
                    continue
                except Exception as exc:
                    crashes.append(Crash(index, None, ANSI.sub("", str(exc)), role=self.name))
            else:
                silent = now - since
                if silent >= slow_after(self.heartbeat_s):
                    self.unwell_at = now
                limit = None if self.heartbeat_s is None else self.heartbeat_s + (
                    0.0 if self.answered[index] else STARTUP_GRACE_S)  # fmt: skip
                if limit is None or silent <= limit:
                    continue
                crashes.append(Crash(index, None, f"no answer for {silent:.0f} s (hung), so it was killed",
                                     role=self.name))  # fmt: skip
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise WorkerFailure(
                    f"{self.name}s crashed {self.restarts} times (limit {self.max_restarts}); "
                    f"last: {crashes[-1].describe()}"
                )
            with contextlib.suppress(Exception):
                self.ray.kill(self.actors[index], no_restart=True)
            self.incarnations[index] += 1
            self.actors[index] = self._start(index)
            self.pings[index] = (self.actors[index].ping.remote(), time.monotonic())
            self.answered[index] = False
            self.places.ask(index, self.actors[index])
        self.places.poll()
        late = self.places.unplaced(STARTUP_GRACE_S)
        if late:
            raise WorkerFailure(f"{self.name} {late[0]}'s restart did not start within {STARTUP_GRACE_S:.0f} s: "
                                + unplaceable(self.backend, service=True))  # fmt: skip
        return crashes

    def alive(self) -> int:
        return 0 if self.stopping else self.n

    def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.places.pending.clear()
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)
        if self.pids_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.pids_file.unlink()


# --------------------------------------------------------------------------------------------------- mailboxes
class MailboxActor:
    """Gossip mailboxes in one asyncio actor (PALA's data proxy): the slots hold the learners' parameter
    messages (NumPy arrays, which reach and leave it through the object store), the counters the rounds posted
    and read; each learner's doorbell is an `asyncio.Event` that `wait` awaits. `generation`: how many times the
    mailboxes were restarted before this actor (each restart starts empty at a later round)."""

    def __init__(self, n: int, start_round: int, generation: int):
        self.start, self.generation = start_round, generation
        self.slots: list[Any] = [None] * n
        self.written_rounds = [start_round - 1] * n
        self.read_rounds = [[start_round - 1] * n for _ in range(n)]
        self.bells = [asyncio.Event() for _ in range(n)]

    async def where(self) -> dict[str, Any]:
        return where()

    async def ping(self) -> bool:
        return True

    async def hello(self) -> tuple[int, int]:
        return self.generation, self.start

    async def counters(self) -> tuple[list[int], list[list[int]]]:
        return self.written_rounds, self.read_rounds

    async def post(self, sender: int, round_: int, params: np.ndarray, readers: list[int]) -> None:
        self.slots[sender] = params
        self.written_rounds[sender] = round_
        for reader in readers:
            self.bells[reader].set()

    async def take(self, reader: int, sender: int, round_: int) -> np.ndarray:
        self.read_rounds[reader][sender] = round_
        self.bells[sender].set()
        return self.slots[sender]

    async def latest(self, reader: int, sender: int) -> tuple[int, np.ndarray]:
        self.read_rounds[reader][sender] = self.written_rounds[sender]
        return self.written_rounds[sender], self.slots[sender]

    async def peek(self, sender: int) -> np.ndarray | None:
        return self.slots[sender] if self.written_rounds[sender] >= self.start else None

    async def wait(self, me: int, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.bells[me].wait(), timeout=max(0.0, timeout))
        self.bells[me].clear()  # no await since the wake: a ring after this is seen by the caller's next look


class RayMailboxes(Mailboxes):
    """`Mailboxes` behind a `MailboxActor`, reached by its name: each call one actor call; the counters are
    fetched once per look and kept until the next `post`, `take` or `wait` (a look at several peers is one call).
    A call whose actor died waits (up to `RECONNECT_S`) for the next actor under the name; one of a later
    generation than this copy knew raises `MailboxesReset`. Picklable to the roles (without the `keeper`)."""

    def __init__(self, name: str, namespace: str, n: int, size: int):
        self.name, self.namespace, self.n, self.size = name, namespace, n, size
        self._actor = None
        self._counters: tuple[list[int], list[list[int]]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "n": self.n, "size": self.size,
                "generation": self.generation, "_actor": None, "_counters": None}  # fmt: skip

    def _connect(self):
        """The live actor under the name (the first one answering `hello`); `MailboxesReset` if it is of a later
        generation than the last one this copy reached."""
        import ray

        waited_since = time.monotonic()
        while self._actor is None:
            try:
                actor = ray.get_actor(self.name, namespace=self.namespace)
                generation, start = ray.get(actor.hello.remote(), timeout=PING_EVERY_S)
            except (ValueError, ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                    ray.exceptions.GetTimeoutError):  # fmt: skip  # not there yet, or the dead (or hung) one
                if time.monotonic() - waited_since > RECONNECT_S:
                    raise ServiceUnavailable(f"the gossip mailboxes were unreachable for {RECONNECT_S:.0f} s") from None
                time.sleep(0.1)
                continue
            self._actor = actor
            if generation > self.generation:
                self.generation = generation
                raise MailboxesReset(start)
        return self._actor

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        while True:
            actor = self._connect()
            try:
                return ray.get(getattr(actor, method).remote(*args))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self._actor = self._counters = None  # its keeper restarts it: the next `_connect` waits for that

    def _look(self) -> tuple[list[int], list[list[int]]]:
        if self._counters is None:
            self._counters = self._call("counters")
        return self._counters

    def written(self, sender: int) -> int:
        return self._look()[0][sender]

    def read(self, reader: int, sender: int) -> int:
        return self._look()[1][reader][sender]

    def post(self, sender: int, round_: int, params: torch.Tensor, readers: list[int]) -> None:
        self._counters = None
        self._call("post", sender, round_, params.numpy(), readers)

    def take(self, reader: int, sender: int, round_: int) -> torch.Tensor:
        self._counters = None
        return torch.tensor(self._call("take", reader, sender, round_))  # a copy: the store's is read-only

    def latest(self, reader: int, sender: int) -> tuple[int, torch.Tensor]:
        self._counters = None
        round_, message = self._call("latest", reader, sender)
        return round_, torch.tensor(message)  # a copy: the store's is read-only

    def peek(self, sender: int) -> torch.Tensor | None:
        message = self._call("peek", sender)
        return None if message is None else torch.tensor(message)

    def wait(self, me: int, timeout: float) -> None:
        self._counters = None
        self._call("wait", me, timeout)


class MailboxKeeper(RayServices):
    """The mailbox actor watched as a service (reported as "mailbox actor 0"): pinged behind its calls, and when
    it dies or does not answer for the heartbeat (killed), restarted empty next to the driver as the next
    generation, at the round `rejoin_round()` names (past every round the coordinator has seen). The
    coordinator's `mailboxes` carry that generation into the learners restarted later."""

    def __init__(self, backend: RayBackend, mailboxes: RayMailboxes, start_round: int, rejoin_round, max_restarts: int,
                 pids_file, heartbeat_s: float | None):  # fmt: skip
        self.mailboxes, self.start_round, self.rejoin_round = mailboxes, start_round, rejoin_round
        super().__init__(backend, None, 1, max_restarts, pids_file, "mailbox actor", heartbeat_s)
        mailboxes.name, mailboxes.namespace = self.handles[0].name, self.namespace

    def _start(self, index: int):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        generation = self.incarnations[index]
        start = self.start_round if generation == 0 else self.rejoin_round()
        self.mailboxes.generation = generation
        here = NodeAffinitySchedulingStrategy(self.ray.get_runtime_context().get_node_id(), soft=True)
        options = dict(name=f"{self.prefix}-{index}", namespace=self.namespace, num_cpus=0, scheduling_strategy=here,
                       enable_task_events=TASK_EVENTS)  # fmt: skip
        with _sigint_deferred():
            return self.ray.remote(MailboxActor).options(**options).remote(self.mailboxes.n, start, generation)


class RayBackend(Backend):
    """Roles as Ray actors; weights through the object store, tagged with their version."""

    name = "ray"
    in_process = False
    shares_memory = False  # every actor has its own replica of the networks
    has_services = True  # named actors

    @classmethod
    def check_options(cls, opts: Any) -> None:
        """What can be checked before Ray starts or a run folder is written: Ray is installed; the resources asked
        for are ones Ray can reserve; `--placement` names resources that the cluster can have; and a Ray server
        answers at `--address` HOST:PORT (Ray itself retries its connection for minutes, or for ever where
        something else listens)."""
        if importlib.util.find_spec("ray") is None:
            raise ConfigError("--backend ray needs Ray, an extra: pip install -e '.[ray]'")
        gpus = getattr(opts, "gpus_per_role", 0.0)
        if 0 < gpus < RESOURCE_UNIT:
            raise ConfigError(f"--gpus-per-role={gpus:g} is below Ray's smallest share of a resource, {RESOURCE_UNIT}")
        given = getattr(opts, "address", "") or ""
        _check_placement(getattr(opts, "placement", "") or "", given)
        ray = sys.modules.get("ray")
        if not given or (given == "auto" and ray is not None and ray.is_initialized()):
            return  # the private instance, or the connection this process has
        address, how = resolve_address(given)
        label = f"--address {given}" + (f" ({address}, {how})" if how else "")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"{label}: {address!r} is not HOST:PORT" if how else f"--address {given!r} is not "
                              "HOST:PORT (or auto)")  # fmt: skip
        problem = _grpc_problem(host, int(port)) or _auth_problem(host, int(port))
        if problem is not None:
            raise ConfigError(f"{label}: {problem}")
        _refuse_foreign(address, given, how)

    def __init__(self, opts: Any = None, run_dir: Path | None = None):
        super().__init__(opts, run_dir)
        self.given = getattr(opts, "address", "") or ""
        self.check_options(opts)
        ray = sys.modules.get("ray")
        connected = ray is not None and ray.is_initialized()
        address, self.how = resolve_address(self.given) if self.given and not connected else (self.given, "")
        self.ray = import_ray(private=not address or on_loopback(address))  # `auto` on 127.0.0.1 keeps to it too
        self.started = False  # this run connected to Ray (and shuts the connection down at the end)
        self.private = False  # this run started its private instance (and stops it at the end)
        self.log: RayLog | None = None  # where Ray's own lines go while this run's connection lasts
        if not self.ray.is_initialized():
            if run_dir is not None:
                self.log = RayLog(Path(run_dir) / "ray.log")
                self.log.attach()
            try:
                self._connect(address)
            except BaseException:
                self._detach_log()
                raise
            self.started, self.private = True, not address
            if self.log is not None:
                whose = "the run's private instance, removed at its end" if self.private else f"at {address}"
                session = self.ray._private.worker._global_node.get_session_dir_path()
                self.log.write(f"Ray session folder: {session} ({whose}; Ray's own logs are in its logs/)")
        self.host = self.ray.util.get_node_ip_address()
        self.modules: dict[str, nn.Module] = {}
        self.weights: Any = None
        self._published: tuple[int, Any] | None = None
        self._keepers: list[MailboxKeeper] = []

    def _connect(self, address: str) -> None:
        if address:
            label = f"--address {self.given}" + (f" ({address}, {self.how})" if self.how else "")
            try:
                with _sigint_deferred():
                    self.ray.init(address=address, include_dashboard=False, logging_level="WARNING")
            except (ConnectionError, RuntimeError, ValueError) as exc:  # nothing there, a refused token, ...
                if self.ray.is_initialized():
                    self.ray.shutdown()
                reason = ANSI.sub("", str(exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ConfigError(f"cannot join the Ray cluster at {label}: {reason}") from None
            except BaseException:  # Ctrl-C
                if self.ray.is_initialized():
                    self.ray.shutdown()
                raise
            if PRIVATE_RESOURCE in self.ray.cluster_resources():  # one this machine does not run (or did not show)
                self.ray.shutdown()
                raise ConfigError(f"{label} is the private Ray instance of another rlfleet run, which ends with that "
                                  "run: start a cluster to share with `ray start --head` and join that")  # fmt: skip
        else:
            workers = getattr(self.opts, "workers", 1)
            start_private_instance(int(np.ceil(workers * getattr(self.opts, "cpus_per_role", 1.0))))

    def actor_options(self, index: int) -> dict[str, Any]:
        """Ray options of the actor of worker or service `index`: its CPUs and GPUs, and its node (`--placement`)."""
        opts = self.opts
        options: dict[str, Any] = {"num_cpus": getattr(opts, "cpus_per_role", 1.0), "max_restarts": 0,
                                   "num_gpus": getattr(opts, "gpus_per_role", 0.0), "max_concurrency": 1,
                                   "enable_task_events": TASK_EVENTS}  # fmt: skip
        names = [n for n in getattr(opts, "placement", "").split(",") if n]
        if names:
            options["resources"] = {names[index % len(names)]: PLACEMENT_SHARE}
        return options

    def threads(self) -> int:
        """Torch threads of an actor: one per CPU it reserves."""
        return max(1, int(getattr(self.opts, "cpus_per_role", 1.0)))

    def start_services(self, make_service, n, max_restarts=10, pids_file=None, name="service", heartbeat_s=None):
        return RayServices(self, make_service, n, max_restarts, pids_file, name, heartbeat_s)

    def share(self, modules: dict[str, nn.Module]) -> dict[str, nn.Module]:
        self.modules = modules  # what `publish` sends; each actor gets its own replica
        return modules

    def step_counter(self, slots: int) -> StepCounter:
        return StepCounter(IN_PROCESS, slots)  # the coordinator's alone: each call carries the count

    def stop_flag(self) -> StopFlag:
        return StopFlag(IN_PROCESS)  # the coordinator's alone: it stops issuing calls

    def weight_version(self) -> WeightVersion:
        self.weights = WeightVersion(IN_PROCESS)  # `publish` reads it; each actor has a replica
        return self.weights

    def publish(self, has: int) -> tuple[int, Any]:
        """(newest version, its object in the store, or None for an actor that `has` it already)."""
        version = self.weights.version if self.weights is not None else 0
        if version == has:
            return version, None
        if self._published is None or self._published[0] != version:
            self._published = (version, self.ray.put(module_state(self.modules)))
        return version, self._published[1]

    def mailboxes(self, n, size, start_round=0, rejoin_round=None, max_restarts=10, pids_file=None, heartbeat_s=None):
        """Gossip mailboxes in one asyncio actor next to the driver (no CPU reserved), watched by their `keeper`
        (restarted empty when it dies or hangs), gone with `close()`."""
        mailboxes = RayMailboxes("", "", n, size)
        mailboxes.keeper = MailboxKeeper(self, mailboxes, start_round, rejoin_round or (lambda: start_round),
                                         max_restarts, pids_file, heartbeat_s)  # fmt: skip
        self._keepers.append(mailboxes.keeper)
        return mailboxes

    def start(self, make_role, n_workers, counter, stop, total_steps, credits=None, max_restarts=10, pids_file=None,
              heartbeat_s=None):  # fmt: skip
        return RayGroup(self, make_role, n_workers, counter, stop, total_steps, credits, max_restarts, pids_file,
                        heartbeat_s)  # fmt: skip

    def close(self) -> None:
        self._published = None
        for keeper in self._keepers:
            keeper.stop()
        self._keepers = []
        if self.private:
            stop_private_instance()
        elif self.started and self.ray.is_initialized():
            self.ray.shutdown()
        self.started = self.private = False
        self._detach_log()

    def _detach_log(self) -> None:
        if self.log is not None:
            self.log.detach()
            self.log = None

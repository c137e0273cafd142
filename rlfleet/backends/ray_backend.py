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
by `check()`, which starts the next incarnation of that worker in a new actor, up to `max_restarts` in all (with
the services' and the gossip mailboxes' restarts: `Backend.restart_budget`).
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
- a Ray connection this process already has (`ray.init` called before the run) is used as it is, as a joined
  cluster is (its resources, not this machine's cores, decide what fits: `on_cluster`); an `--address` other than
  the one it is connected to is refused (Ray would ignore it).

What Ray prints in the driver's terminal (its raylets' and autoscaler's messages, the actors' output, coloured) goes
to `<run>/ray.log` without colours while the run's own connection lasts (`RayLog`).

`--placement a,b` places worker i on a node that offers the custom resource `names[i mod n]` (nodes started
with `--resources '{"a": 8}'`), for runs that spread roles over given machines.

Its parts: `ray_instance` (where Ray runs), `ray_roles` (roles as actors), `ray_services` (services as named
actors), `ray_mailboxes` (gossip mailboxes); this module, the backend that puts them together.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from rlfleet.backends.base import Backend
from rlfleet.backends.ray_instance import (
    ANSI,
    PRIVATE_RESOURCE,
    RAY_MISSING,
    RayLog,
    auth_problem,
    grpc_problem,
    import_ray,
    on_loopback,
    refuse_foreign,
    resolve_address,
    same_endpoint,
    sigint_deferred,
    start_private_instance,
    stop_private_instance,
)
from rlfleet.backends.ray_mailboxes import MailboxKeeper, RayMailboxes
from rlfleet.backends.ray_roles import PLACEMENT_SHARE, TASK_EVENTS, RayGroup, module_state
from rlfleet.backends.ray_services import RayServices
from rlfleet.backends.shared_memory import IN_PROCESS, StepCounter, StopFlag, WeightVersion
from rlfleet.fields import ConfigError

RESOURCE_UNIT = 1e-4  # Ray reserves resources in multiples of this


def _connected() -> Any:
    """`ray`, where this process is connected to Ray already (a `ray.init` before the run, or this run's own); else
    None. Ray is not imported for this."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and hasattr(ray, "is_initialized") and ray.is_initialized() else None


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
    if ray is not None and connected:
        missing = sorted({n for n in names} - set(ray.cluster_resources()))
        if missing:
            raise ConfigError(f"--placement: no node of the connected Ray cluster offers {', '.join(missing)}")


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
            raise ConfigError(RAY_MISSING)
        gpus = getattr(opts, "gpus_per_role", 0.0)
        if 0 < gpus < RESOURCE_UNIT:
            raise ConfigError(f"--gpus-per-role={gpus:g} is below Ray's smallest share of a resource, {RESOURCE_UNIT}")
        given = getattr(opts, "address", "") or ""
        _check_placement(getattr(opts, "placement", "") or "", given)
        connected = _connected()
        if not given or (given == "auto" and connected is not None):
            return  # the private instance, or the connection this process has
        address, how = resolve_address(given)
        label = f"--address {given}" + (f" ({address}, {how})" if how else "")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"{label}: {address!r} is not HOST:PORT" if how else f"--address {given!r} is not "
                              "HOST:PORT (or auto)")  # fmt: skip
        gcs = None if connected is None else connected.get_runtime_context().gcs_address
        if gcs is not None and same_endpoint(address, gcs):
            return  # the cluster this process is connected to: the run uses that connection
        problem = grpc_problem(host, int(port))
        if problem is not None:
            raise ConfigError(f"{label}: {problem}")
        refuse_foreign(address, given, how)  # another run's private instance, which would refuse our token too
        problem = auth_problem(host, int(port))
        if problem is not None:
            raise ConfigError(f"{label}: {problem}")
        if gcs is not None:  # Ray would run on the connection this process has, and ignore the address
            raise ConfigError(
                f"{label}: this process is connected to the Ray cluster at {gcs} already (ray.init before the run), "
                f"and a run uses that connection: leave --address out (or give {gcs}), or call ray.shutdown() "
                "before the run"
            )

    @classmethod
    def on_cluster(cls, opts: Any) -> bool:
        """A cluster's resources decide what fits where the run joins one (`--address`) and where it uses the
        connection this process made before it (`ray.init`, as the run does too); not the private instance, which
        is this machine."""
        return bool(getattr(opts, "address", "")) or _connected() is not None

    def __init__(self, opts: Any = None, run_dir: Path | None = None):
        super().__init__(opts, run_dir)
        self.given = getattr(opts, "address", "") or ""
        self.check_options(opts)
        connected = _connected() is not None
        address, self.how = resolve_address(self.given) if self.given and not connected else (self.given, "")
        self.ray = import_ray(private=not address or on_loopback(address))  # `auto` on 127.0.0.1 keeps to it too
        self.started = False  # this run connected to Ray (and shuts the connection down at the end)
        self.private = False  # this run started its private instance (and stops it at the end)
        self.log: RayLog | None = None  # where Ray's own lines go while this run's connection lasts
        self.modules: dict[str, nn.Module] = {}
        self.weights: WeightVersion | None = None
        self._published: tuple[int, Any] | None = None
        self._keepers: list[MailboxKeeper] = []
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
        try:
            if self.log is not None and self.started:
                whose = "the run's private instance, removed at its end" if self.private else f"at {address}"
                session = self.ray._private.worker._global_node.get_session_dir_path()
                self.log.write(f"Ray session folder: {session} ({whose}; Ray's own logs are in its logs/)")
            self.host = self.ray.util.get_node_ip_address()
        except BaseException:  # a Ctrl-C just after the start: what this run started goes again
            self.close()
            raise

    def _connect(self, address: str) -> None:
        if address:
            label = f"--address {self.given}" + (f" ({address}, {self.how})" if self.how else "")
            try:
                with sigint_deferred():
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

    def start_services(
        self,
        make_service: Callable[[int, int], Any],
        n: int,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        name: str = "service",
        heartbeat_s: float | None = None,
    ) -> RayServices:
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

    def mailboxes(
        self,
        n: int,
        size: int,
        start_round: int = 0,
        rejoin_round: Callable[[], int] | None = None,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        heartbeat_s: float | None = None,
    ) -> RayMailboxes:
        """Gossip mailboxes in one asyncio actor next to the driver (no CPU reserved), watched by their `keeper`
        (restarted empty when it dies or hangs), gone with `close()`."""
        mailboxes = RayMailboxes(n, size)
        mailboxes.keeper = MailboxKeeper(self, mailboxes, start_round, rejoin_round or (lambda: start_round),
                                         max_restarts, pids_file, heartbeat_s)  # fmt: skip
        self._keepers.append(mailboxes.keeper)
        return mailboxes

    def start(
        self,
        make_role: Callable[[int, int], Any],
        n_workers: int,
        counter: StepCounter,
        stop: StopFlag,
        total_steps: int,
        credits: int | None = None,
        max_restarts: int = 10,
        pids_file: Path | None = None,
        heartbeat_s: float | None = None,
    ) -> RayGroup:
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

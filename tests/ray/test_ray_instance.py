"""The private Ray instance of a `--backend ray` run without `--address`, as real processes see it: a Ctrl-C while it
starts stops the run (nothing of Ray left), and so does one while the run is set up after it started; it requires a
token of its own, whatever the environment says; its session folder goes with it. Ray's own lines go to the run's log.
`--address auto` resolves as Ray does, keeps a cluster on loopback there, and never joins another run's private
instance."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest
from drills import live_workers
from procs import (
    RLFLEET,
    assert_nothing_left,
    kill_session,
    own_cluster_token,
    ray_processes,
    session_of,
    session_processes,
)

from rlfleet.backends import ray_instance
from rlfleet.fields import ConfigError

LONG_RUN = ["train", "a2c", "--env", "CartPole-v1", "--arch", "async_grad", "--workers", "2", "--backend", "ray",
            "--steps", "10000000", "--stop-return", "1e9", "--no-progress"]  # fmt: skip


def start_cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, command: list[str] = RLFLEET
) -> subprocess.Popen:
    """`rlfleet ARGS` (or `command ARGS`) in a session of its own (its pid is the session's id), output captured."""
    return subprocess.Popen([*command, *map(str, args)], cwd=cwd, start_new_session=True, text=True, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def wait_for_process(proc: subprocess.Popen, name: str, timeout: float = 120) -> None:
    """Until a process whose command line has `name` runs in `proc`'s session."""
    deadline = time.monotonic() + timeout
    while not any(name in cmd for _, cmd in session_processes(proc.pid).values()):
        assert proc.poll() is None, f"the run ended early ({proc.returncode}):\n{proc.stderr.read()}"
        assert time.monotonic() < deadline, f"no {name} after {timeout:.0f} s"
        time.sleep(0.02)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_while_the_private_instance_starts_stops_the_run(tmp_path: Path, how: str):
    """SIGINT to the whole process group (a terminal's Ctrl-C) as soon as the instance's GCS server runs, while
    `ray.init` still starts the raylet and the rest: it used to be ignored there (the run went on training); now it
    is deferred until the instance is up, then interrupts: the instance is shut down, one line, exit 130. SIGTERM
    to the driver alone does the same (it reaches the handler `ray.init` installs, which used to exit 15 without a
    word)."""
    proc = start_cli([*LONG_RUN, "--logdir", tmp_path, "--name", "r"], tmp_path)
    with session_of(proc) as sid:
        wait_for_process(proc, "gcs_server")
        started = set(ray_processes()) & set(session_processes(sid))
        if how == "ctrl-c":
            os.killpg(sid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 130, f"exit {proc.returncode} after {how}:\n{err[-3000:]}"
        assert err.strip().splitlines()[-1] == "rlfleet: interrupted", err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert not (tmp_path / "r" / "workers.json").exists()  # no role started
        assert_nothing_left(sid, started)


def test_a_ctrl_c_during_the_start_is_deferred_to_its_end_and_kept_from_the_processes_started():
    """`sigint_deferred`: a SIGINT inside the block interrupts at its end, not before, and a process started inside
    has SIGINT blocked (a terminal's Ctrl-C to the process group never reaches it)."""
    from rlfleet.backends.ray_instance import sigint_deferred

    reached_end = False
    with pytest.raises(KeyboardInterrupt), sigint_deferred():
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


def test_the_sigterm_handler_of_the_process_is_its_own_after_ray_started():
    """`ray.init` installs a SIGTERM handler that exits; the process's own (here the default) is back afterwards, so
    a notebook or script that ran a Ray run is not left with it."""
    before = signal.getsignal(signal.SIGTERM)
    ray = ray_instance.start_private_instance()
    try:
        assert ray.is_initialized() and signal.getsignal(signal.SIGTERM) is before
    finally:
        ray_instance.stop_private_instance()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_run_interrupted_while_it_is_set_up_gives_back_its_private_instance(monkeypatch, tmp_path: Path):
    """A Ctrl-C (or an error) in a runner's `__init__` after its private instance started (here while it builds its
    evaluation envs, in this process: a notebook, a script that goes on) stops the instance again: Ray shut down,
    the environment's authentication settings put back, Ray's printing its own again, the instance's folder gone;
    so the next run starts (and stops) an instance of its own instead of taking that one for the user's."""
    import ray
    import ray._private.worker as ray_worker

    from rlfleet.launch import train
    from rlfleet.run.runner import RunBase

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(RunBase, "make_eval_envs", interrupted)
    settings = {name: os.environ.get(name) for name in ray_instance.AUTH_ENV}
    printer = ray_worker.print_to_stdstream

    def private_folders() -> set[Path]:
        """Private instances' folders that still hold their token (a stopped instance's agents may re-create an
        empty session folder in theirs a few seconds after it was removed: no instance, and no secret, is left)."""
        found = Path(ray_instance.system_temp_dir()).glob(ray_instance.PRIVATE_PREFIX + "*")
        return {folder for folder in found if (folder / "auth_token").exists()}

    folders = private_folders()
    try:
        with pytest.raises(KeyboardInterrupt):
            train("a2c", "CartPole-v1", arch="data_parallel", workers=1, backend="ray", steps=1_000,
                  logdir=str(tmp_path), progress=False)  # fmt: skip
        assert not ray.is_initialized() and ray_instance._private is None
        assert {name: os.environ.get(name) for name in ray_instance.AUTH_ENV} == settings
        assert ray_worker.print_to_stdstream is printer
        assert private_folders() <= folders
    finally:
        ray_instance.stop_private_instance()
        if ray.is_initialized():
            ray.shutdown()


HOLD_INSTANCE = """
import json, os, sys
from rlfleet.backends.ray_instance import start_private_instance, stop_private_instance
ray = start_private_instance(1)
node = ray._private.worker._global_node
print(json.dumps({"gcs": node.gcs_address, "session": node.get_session_dir_path(),
                  "token": os.environ["RAY_AUTH_TOKEN_PATH"]}), flush=True)
sys.stdin.readline()
stop_private_instance()
print(json.dumps({name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}))
"""


def hold_private_instance(env: dict[str, str]) -> tuple[subprocess.Popen, dict[str, str]]:
    """Another process with a private instance, held until its stdin gets a line: (it, where its instance is)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_INSTANCE], env=env, text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    line = proc.stdout.readline()
    assert line, f"no instance ({proc.wait()}):\n{proc.stderr.read()[-3000:]}"
    return proc, json.loads(line)


def gcs_answer(address: str, token: str | None) -> grpc.StatusCode:
    """How the GCS at `address` answers a call that carries `token` (None: none), as any gRPC client can make it."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetAllNodeInfo")
        try:
            call(b"", timeout=10, metadata=None if token is None else [("authorization", f"Bearer {token}")])
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_the_private_instance_requires_a_token_of_its_own_even_with_authentication_disabled(tmp_path: Path):
    """`RAY_AUTH_MODE=disabled` (and a token of the user's in `RAY_AUTH_TOKEN`) in the environment: the private
    instance still refuses a client without its token, or with the user's; its token is in a file only the user
    reads; stopping it puts the environment's settings back."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_AUTH_TOKEN="the-users-own-" + "0" * 50)
    proc, where = hold_private_instance(env)
    try:
        token_file = Path(where["token"])
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700  # its session folder is in it
        assert Path(where["session"]).parent.parent == token_file.parent
        token = token_file.read_text().strip()
        assert gcs_answer(where["gcs"], None) == grpc.StatusCode.UNAUTHENTICATED
        assert gcs_answer(where["gcs"], env["RAY_AUTH_TOKEN"]) == grpc.StatusCode.UNAUTHENTICATED
        default = Path.home() / ".ray" / "auth_token"  # Ray's default token, shared by the user's instances
        if default.exists() and default.read_text().strip() != token:
            assert gcs_answer(where["gcs"], default.read_text().strip()) == grpc.StatusCode.UNAUTHENTICATED
        assert gcs_answer(where["gcs"], token) == grpc.StatusCode.OK
        client = subprocess.run(  # a Ray driver of the same user, without the token: refused (after some 20 s)
            [sys.executable, "-c", f"import ray; ray.init(address={where['gcs']!r}); print('connected')"],
            env=dict(env, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"), capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert client.returncode != 0 and "connected" not in client.stdout, client.stdout
        assert "token" in client.stderr.lower(), client.stderr[-3000:]
        out, err = proc.communicate("\n", timeout=60)
        assert proc.returncode == 0, err[-3000:]
        assert json.loads(out) == {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": env["RAY_AUTH_TOKEN"],
                                   "RAY_AUTH_TOKEN_PATH": None}  # fmt: skip
        assert not token_file.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


SHORT_RUN = ["train", "a2c", "--env", "CartPole-v1", "--arch", "data_parallel", "--workers", "1", "--backend", "ray",
             "--steps", "2000", "--no-progress"]  # fmt: skip


@pytest.fixture
def ray_tmpdir():
    """A system temp folder for Ray of the test's own (`RAY_TMPDIR`), short: Ray's socket paths in it must stay
    within the 107 bytes a Unix socket's path may have. It already holds another Ray session and another run's
    private folder, which must outlive the test's runs."""
    base = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    others = [base / "ray" / "session_2026-01-01_00-00-00_000000_1", base / "rlfleet-ray-another" / "session_x"]
    for folder in others:
        folder.mkdir(parents=True)
        (folder / "kept").write_text("not this run's")
    try:
        yield base
        for folder in others:
            assert (folder / "kept").read_text() == "not this run's", f"{folder} was touched"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_private_instance_s_session_folder_goes_with_it(tmp_path: Path, ray_tmpdir: Path):
    """Ray kept a session folder per instance in its temp folder for ever; the private instance's lives in the
    run's private folder, removed when the run ends, and nothing else there is removed."""
    proc = start_cli([*SHORT_RUN, "--logdir", tmp_path, "--name", "r"], tmp_path,
                     env=dict(os.environ, RAY_TMPDIR=str(ray_tmpdir)))  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        # at its depth, not "**": a walk into a live session folder meets files that Ray removes as it walks
        while not (sessions := list(ray_tmpdir.glob(f"rlfleet-ray-*/ray/session_*_{proc.pid}"))):
            assert proc.poll() is None, f"the run ended early ({proc.returncode}):\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "no session folder after 120 s"
            time.sleep(0.05)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        (session,) = sessions
        assert not session.exists()
        folder = session.parent.parent  # <tmp>/rlfleet-ray-XXXXXXXX/ray/session_...: with its token
        assert folder.name.startswith("rlfleet-ray-") and not folder.exists()
        assert sorted(p.name for p in ray_tmpdir.iterdir()) == ["ray", "rlfleet-ray-another"]
        assert [p.name for p in (ray_tmpdir / "ray").iterdir()] == ["session_2026-01-01_00-00-00_000000_1"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_session(proc.pid)


RAY_LINE = re.compile(r"^\((raylet|autoscaler)\b", re.MULTILINE)  # how Ray prefixes its own lines


UNCHECKED_GPUS = (
    "import sys; from rlfleet.arch.parallel import ParallelRunner; from rlfleet.cli import main; "
    "ParallelRunner.check_role_gpus = lambda self: None; sys.exit(main(sys.argv[1:]))"
)
"""`rlfleet` whose runs reserve the GPUs they are given, used or not."""


@pytest.mark.parametrize("source", ["raylet", pytest.param("autoscaler", marks=pytest.mark.slow)])  # one in CI
def test_ray_s_own_lines_go_to_the_run_s_log_not_to_the_terminal(tmp_path: Path, source: str):
    """Ray printed its raylet's messages (an actor killed here) and its autoscaler's (roles asking for 1000 GPUs
    here: the run stops after 60 s) in the terminal, coloured, among rlfleet's lines: they go to `<run>/ray.log`."""
    run = tmp_path / "r"
    command = RLFLEET
    if source == "raylet":  # a run that lasts well past the kill (40,000 steps took under 4 s once)
        args = [*SHORT_RUN[:-3], "--workers", "2", "--steps", "150000", "--stop-return", "1e9", "--no-progress"]
    else:  # GPUs for roles that act on the CPU are refused before Ray starts: this run goes past that check
        args = [*SHORT_RUN, "--gpus-per-role", "1000"]
        command = [sys.executable, "-c", UNCHECKED_GPUS]
    proc = start_cli([*args, "--logdir", tmp_path, "--name", "r"], tmp_path, command=command)
    try:
        if source == "raylet":
            deadline = time.monotonic() + 120
            # the file is written as each actor answers where it runs: worker 1 may be listed before worker 0
            while "0" not in (pids := live_workers(run)):
                assert proc.poll() is None, f"the run ended early ({proc.returncode}):\n{proc.stderr.read()}"
                assert time.monotonic() < deadline, "no actors after 120 s"
                time.sleep(0.2)
            time.sleep(2)
            os.kill(pids["0"], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kill_session(proc.pid)
    assert proc.returncode == (0 if source == "raylet" else 1), err[-3000:]
    for stream in (out, err):
        assert "\x1b[" not in stream, stream[-3000:]
        assert not RAY_LINE.search(stream), stream[-3000:]
    log = (run / "ray.log").read_text()
    assert "\x1b[" not in log and log.startswith("Ray session folder: "), log[-3000:]
    if source == "raylet":
        assert "worker 0 died" in err  # rlfleet's own report stays where it was
        assert re.search(r"^\(raylet\) A worker died or was killed", log, re.MULTILINE), log[-3000:]
    else:
        assert "did not start within 60 s" in err
        assert re.search(r"^\(autoscaler \+\d+s\) Error: No available node types can fulfill", log, re.MULTILINE), log


def test_ctrl_c_while_the_roles_wait_to_start_stops_the_run(tmp_path: Path):
    """Roles that cannot be placed (1000 GPUs each) keep the group waiting for them to start: a Ctrl-C then used
    to wait out the 60 s of their start-up grace and end the run as a failure. It stops the run as any Ctrl-C
    does: checkpoint, `result.json` with "interrupted", exit 0, nothing of Ray left."""
    run = tmp_path / "r"
    args = [*SHORT_RUN, "--gpus-per-role", "1000", "--logdir", tmp_path, "--name", "r"]
    proc = start_cli(args, tmp_path, command=[sys.executable, "-c", UNCHECKED_GPUS])
    with session_of(proc) as sid:
        deadline = time.monotonic() + 120
        while not (run / "config.json").exists():  # written once the run is set up: the roles start next
            assert proc.poll() is None, f"the run ended early ({proc.returncode}):\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "no config.json after 120 s"
            time.sleep(0.1)
        time.sleep(3)
        started = set(ray_processes()) & set(session_processes(sid))
        os.killpg(sid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"exit {proc.returncode}:\n{err[-3000:]}"
        assert_nothing_left(sid, started)
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "interrupted" and result["env_steps"] == 0, result
    assert (
        "a stop was requested while the roles started (1 of 1 roles had not started)"
        in (run / "workers.log").read_text()
    )
    assert (run / "checkpoints" / "latest.pt").exists()


# ------------------------------------------------------------------------------------------------- --address auto
def instance(gcs: str, uid: int | None = None, private: bool = False) -> ray_instance.LocalInstance:
    return ray_instance.LocalInstance(1, os.getuid() if uid is None else uid, gcs, "/tmp/x/session_1_4242", private)


def test_auto_is_resolved_as_ray_resolves_it_but_never_to_a_private_or_another_user_s_instance(monkeypatch, tmp_path):
    """`RAY_ADDRESS`, else the latest `ray start`'s address file, else the one instance of the user's running here
    (Ray would take any: another user's, or a run's private instance)."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    running = [instance("127.0.0.1:7001", private=True), instance("127.0.0.1:7002", uid=os.getuid() + 1)]
    monkeypatch.setattr(ray_instance, "local_instances", lambda: running)
    with pytest.raises(ConfigError, match=r"^--address auto: no Ray cluster to join \(no RAY_ADDRESS, "):
        ray_instance.resolve_address("auto")
    running.append(instance("127.0.0.1:7003"))
    assert ray_instance.resolve_address("auto") == ("127.0.0.1:7003", "the one Ray instance of yours running on "
                                                   "this machine")  # fmt: skip
    running.append(instance("10.0.0.5:7004"))
    with pytest.raises(ConfigError, match=r"^--address auto: 2 Ray instances of yours run on this machine \(10\.0"):
        ray_instance.resolve_address("auto")
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:7005\n")
    assert ray_instance.resolve_address("auto")[0] == "127.0.0.1:7005"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.6:6379")
    assert ray_instance.resolve_address("auto") == ("10.0.0.6:6379", "RAY_ADDRESS")
    assert ray_instance.resolve_address("10.0.0.7:6379") == ("10.0.0.7:6379", "")
    with pytest.raises(ConfigError, match=r"^--address auto \(localhost:7001, RAY_ADDRESS\) is the private Ray "
                                          r"instance of another rlfleet run \(process 4242\)"):  # fmt: skip
        ray_instance.refuse_foreign("localhost:7001", "auto", "RAY_ADDRESS")
    other_user = r"^--address auto \(127\.0\.0\.1:7002, RAY_ADDRESS\) is a Ray instance of another user \(uid \d+\)"
    with pytest.raises(ConfigError, match=other_user + r": give --address 127\.0\.0\.1:7002 to join it on purpose$"):
        ray_instance.refuse_foreign("127.0.0.1:7002", "auto", "RAY_ADDRESS")
    ray_instance.refuse_foreign("127.0.0.1:7002", "127.0.0.1:7002", "")  # given on purpose
    ray_instance.refuse_foreign("127.0.0.1:7003", "auto", "RAY_ADDRESS")


def test_auto_joins_a_cluster_on_loopback(tmp_path: Path, ray_tmpdir: Path, monkeypatch):
    """A cluster on 127.0.0.1 (`ray.cluster_utils.Cluster`, which records its address as `ray start` does), found by
    `--address auto` in a process that did not set `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`: Ray rewrote 127.0.0.1 to
    the machine's address and waited there for ever; resolved first, it is joined on loopback."""
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmpdir))  # where the cluster records its address, and auto reads it
    with own_cluster_token(tmp_path):  # a Cluster makes no token of its own
        cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 2, "_system_config": ray_instance.system_config()}
        )
        try:
            assert (ray_tmpdir / "ray" / "ray_current_cluster").read_text().startswith("127.0.0.1:")
            env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
            proc = start_cli([*SHORT_RUN, "--address", "auto", "--logdir", tmp_path, "--name", "r"], tmp_path, env=env)
            try:
                out, err = proc.communicate(timeout=240)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
                kill_session(proc.pid)
            assert proc.returncode == 0, err[-3000:]
            places = json.loads((tmp_path / "r" / "actors.json").read_text()).values()
            assert {place["node"] for place in places} == {cluster.head_node.node_id}
            assert f"(at {cluster.address};" in (tmp_path / "r" / "ray.log").read_text()
            assert len(cluster.list_all_nodes()) == 1  # left running
        finally:
            cluster.shutdown()


def test_another_run_s_private_instance_is_refused_by_auto_and_by_its_address(tmp_path: Path, ray_tmpdir: Path):
    """Another process's private instance is seen as one on this machine, and neither `auto` (through RAY_ADDRESS
    here) nor its address joins it: one line at once, instead of a run that joins it (Ray's shared default token
    used to let it) or waits 20 s for Ray to refuse the token."""
    proc, where = hold_private_instance(dict(os.environ))
    try:
        (found,) = [i for i in ray_instance.local_instances() if i.gcs == where["gcs"]]
        assert found.private and found.uid == os.getuid() and found.driver_pid == proc.pid
        for address, label in (("auto", f"auto ({where['gcs']}, RAY_ADDRESS)"), (where["gcs"], where["gcs"])):
            env = dict(os.environ, RAY_ADDRESS=where["gcs"], RAY_TMPDIR=str(ray_tmpdir))
            started = time.monotonic()
            cli = subprocess.run([*RLFLEET, *SHORT_RUN, "--address", address, "--logdir", str(tmp_path)], env=env,
                                 capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
            assert cli.returncode == 2, cli.stderr[-3000:]
            assert cli.stderr.strip().splitlines()[-1] == (
                f"rlfleet: error: --address {label} is the private Ray instance of another rlfleet run (process "
                f"{proc.pid}), which ends with that run and admits no one else: start a cluster to share with `ray "
                "start --head` and join that"
            ), cli.stderr[-3000:]
            assert time.monotonic() - started < 60
            assert not list(tmp_path.iterdir())  # refused before a run folder was written
    finally:
        proc.communicate("\n", timeout=60)


def test_a_second_private_instance_in_one_process_spills_into_its_own_folder(caplog):
    """Ray writes its session's object spilling folder into the system config it is given: a second `train` or
    `tune` on Ray in one process (a notebook) gave the second instance the first one's folder, removed with it."""
    folders = []
    for _ in range(2):
        ray = ray_instance.start_private_instance()
        try:
            config = ray._private.worker._global_node._config
            spill = json.loads(config["object_spilling_config"])["params"]["directory_path"]
            folders.append((spill, str(ray_instance._private.temp_dir)))
        finally:
            ray_instance.stop_private_instance()
    assert all(spill.startswith(temp) for spill, temp in folders), folders
    assert dict(ray_instance.SYSTEM_CONFIG) == {"worker_niceness": 0}
    assert "unstable API" not in caplog.text

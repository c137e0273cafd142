"""A simulated 2-node Ray cluster (`ray.cluster_utils.Cluster`, both nodes on 127.0.0.1, token authentication
on): workers placed on both nodes by custom resources solve CartPole-v1, in this process and from a separate
`rlfleet train --address` that joins the cluster as a second driver; Ape-X DQN with its actors and replay shards
on both nodes solves it too. A node removed mid-run (`Cluster.remove_node`): its roles restart on the nodes left,
or, where none can take them, the run stops cleanly as a failure."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from functools import partial

import pytest
from procs import RLFLEET, own_cluster_token
from seeds import first_solving

from rlfleet.backends.ray_instance import system_config
from rlfleet.launch import train
from rlfleet.run.checkpoint import load_checkpoint

pytestmark = pytest.mark.learning
NODES = ({"node0": 4}, {"node1": 4})  # a custom resource per node: roles are placed by asking for one


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray
    from ray.cluster_utils import Cluster

    assert os.environ["RAY_AUTH_MODE"] == "token"  # set before ray's import (conftest): a Cluster checks tokens then
    with own_cluster_token(tmp_path_factory.mktemp("cluster")):
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 2, "resources": NODES[0], "_system_config": system_config()},
        )
        try:
            cluster.add_node(num_cpus=2, resources=NODES[1])
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, logging_level="WARNING")
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()


def nodes_used(run_dir) -> set[str]:
    return {place["node"] for place in json.loads((run_dir / "actors.json").read_text()).values()}


def test_workers_placed_on_both_nodes_solve_cartpole(cluster, run_opts):
    # up to three seeds: the actors' interleaving (not reproducible) varies with the machine's load, and one run in
    # a loaded full test run ended at 467.8 of 475 (a learning test asserts the algorithm, not one run's luck)
    a2c = partial(train, "a2c", "CartPole-v1", arch="data_parallel", workers=2, backend="ray",
                  placement="node0,node1", steps=100_000, eval_every=5_000, **run_opts)  # fmt: skip
    result, tried = first_solving(a2c)
    assert result["solved"], tried
    assert len(nodes_used(result.run_dir)) == 2


@pytest.mark.slow  # -m slow: CI has Ape-X's actors and shards restarted across nodes, and learners on both solving
def test_apex_with_actors_and_replay_shards_on_both_nodes_solves_cartpole(cluster, run_opts):
    result = train("dqn", "CartPole-v1", arch="apex", actors=3, replay_shards=2, backend="ray",
                   placement="node0,node1", steps=100_000, seed=0, eval_every=5_000, **run_opts)  # fmt: skip
    assert result["solved"], result.result
    assert len(nodes_used(result.run_dir)) == 2  # the actors
    shards = json.loads((result.run_dir / "shards_actors.json").read_text())
    assert len({place["node"] for place in shards.values()}) == 2


def test_a_cli_run_joins_the_cluster_through_address(cluster, tmp_path):
    """A run joined to a cluster by --address learns as on one machine: a2c solved CartPole at 50,048 steps here; the
    budget leaves room for a busy machine, where the workers' policy lag grows."""
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    proc = subprocess.run(
        [*RLFLEET, "train", "a2c", "--env", "CartPole-v1", "--arch", "data_parallel", "--workers", "2",
         "--backend", "ray", "--address", cluster.address, "--placement", "node0,node1", "--steps", "200000",
         "--eval-every", "5000", "--logdir", str(tmp_path), "--name", "joined", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "joined" / "result.json").read_text())
    assert result["solved"], result
    assert len(nodes_used(tmp_path / "joined")) == 2
    assert len(cluster.list_all_nodes()) == 2  # the cluster is left running for whoever started it


@pytest.mark.slow  # -m slow: CI has sweeps on a private instance (test_tune.py) and runs joining with --address
def test_a_sweep_joins_the_cluster_through_address_and_its_trials_run_on_both_nodes(cluster, tmp_path):
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    proc = subprocess.run(
        [*RLFLEET, "tune", "ppo", "--env", "CartPole-v1", "--search", "lr=loguniform(1e-4,1e-2)", "--trials", "4",
         "--steps", "20000", "--address", cluster.address, "--logdir", str(tmp_path), "--name", "sweep",
         "--no-progress"],
        env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = list((tmp_path / "sweep" / "trials").iterdir())
    assert len(trials) == 4 and all((t / "result.json").is_file() for t in trials)
    nodes = {n["node"] for t in trials for n in json.loads((t / "nodes.json").read_text())}
    assert len(nodes) == 2, "4 trials of 1 CPU on 2 nodes of 2 CPUs ran on one node"
    assert len(cluster.list_all_nodes()) == 2  # the cluster the sweep joined is still there


@pytest.mark.parametrize(
    "auth, says",
    [
        ({"RAY_AUTH_MODE": "disabled"}, "the cluster requires token authentication and this environment offers no "
                                        "token: set RAY_AUTH_MODE=token"),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}, "the cluster refused the token this environment "
                                                                 "offers (from RAY_AUTH_TOKEN)"),
    ],
    ids=["no-token", "wrong-token"],
)  # fmt: skip
def test_joining_without_the_cluster_s_token_is_one_line_that_says_so(cluster, tmp_path, auth, says):
    """Ray itself retries for half a minute and then says only that it failed to connect."""
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", **auth)
    proc = subprocess.run(
        [*RLFLEET, "train", "a2c", "--env", "CartPole-v1", "--arch", "data_parallel", "--backend", "ray",
         "--address", cluster.address, "--logdir", str(tmp_path), "--name", "r", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rlfleet: error: --address {cluster.address}: {says}"), lines
    assert not (tmp_path / "r").exists()


def test_pala_learners_on_both_nodes_solve_cartpole(cluster, run_opts):
    """PALA-A2C: 4 gossip learners, two on each node, exchanging parameters through the mailbox actor on the
    driver's node and the object store."""
    result = train("a2c", "CartPole-v1", arch="gossip", learners=4, backend="ray", placement="node0,node1",
                   steps=100_000, seed=0, eval_every=4_000, **run_opts)  # fmt: skip
    assert result["solved"], result.result
    assert len(nodes_used(result.run_dir)) == 2


def node_once_placed(nodes, run_dir, worker: str, timeout: float = 120.0):
    """The node of `nodes` that `actors.json` puts `worker` on, once it does (None after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, KeyError):
            node_id = json.loads((run_dir / "actors.json").read_text())[worker]["node"]
            node = next((n for n in nodes if n.node_id == node_id), None)
            if node is not None:
                return node
        time.sleep(0.1)
    return None


def remove_node_once_placed(cluster, nodes, run_dir, worker: str, removed: list) -> threading.Thread:
    """In the background: once `worker` runs on one of `nodes` (for a second), remove that node from the cluster (its
    raylet and every process on it end) and note it in `removed`."""

    def remove() -> None:
        node = node_once_placed(nodes, run_dir, worker)
        if node is not None:
            time.sleep(1.0)
            cluster.remove_node(node)
            removed.append(node)

    thread = threading.Thread(target=remove, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def extra_nodes(cluster):
    """Nodes a test adds to the module's cluster (`add(**node_args)`), removed again after it."""
    added = []

    def add(**node_args):
        added.append(cluster.add_node(num_cpus=2, object_store_memory=100 * 2**20, **node_args))
        cluster.wait_for_nodes()
        return added[-1]

    yield add
    for node in added:
        if node in cluster.list_all_nodes():
            cluster.remove_node(node)


def test_the_roles_and_services_of_a_removed_node_restart_on_the_nodes_left(cluster, extra_nodes, tmp_path):
    """An Ape-X run joins the cluster (`--address`); its actors and replay shards are placed by the `spare` resource,
    which one node offers. Once they run there, a second such node joins and the first is removed: every actor and
    shard dies with Ray's reason, is restarted on the second node (a shard empty), and the run reaches its budget."""
    first = extra_nodes(resources={"spare": 4})
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    run = tmp_path / "spare"
    proc = subprocess.Popen(
        [*RLFLEET, "train", "dqn", "--env", "CartPole-v1", "--arch", "apex", "--actors", "2", "--replay-shards", "2",
         "--backend", "ray", "--address", cluster.address, "--placement", "spare", "--steps", "12000",
         "--eval-every", "1000000000", "--stop-return", "inf", "--logdir", str(tmp_path), "--name", "spare",
         "--no-progress"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert node_once_placed([first], run, "0") is first
        second = extra_nodes(resources={"spare": 4})
        cluster.remove_node(first)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    log = (run / "workers.log").read_text()
    for died in ("worker 0 died", "worker 1 died", "replay shard 0 died", "replay shard 1 died"):
        assert died in log, log
    assert nodes_used(run) == {second.node_id}
    shards = json.loads((run / "shards_actors.json").read_text())
    assert {place["node"] for place in shards.values()} == {second.node_id}
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "steps" and result["env_steps"] >= 12_000, result


def test_a_removed_node_that_no_node_left_can_replace_ends_the_run_cleanly(cluster, extra_nodes, monkeypatch,
                                                                          run_opts, tmp_path):  # fmt: skip
    """Worker 1 is placed on the only node offering `lonely`; that node is removed. Its restart cannot start
    anywhere: after the start-up grace (shortened here) the run stops as a failure that says so, with its
    checkpoint and `result.json`, instead of waiting for ever."""
    from rlfleet.backends import ray_roles
    from rlfleet.backends.base import WorkerFailure

    monkeypatch.setattr(ray_roles, "STARTUP_GRACE_S", 10.0)
    lonely = extra_nodes(resources={"lonely": 4})
    removed: list = []
    remover = remove_node_once_placed(cluster, [lonely], tmp_path / "lonely", "1", removed)
    with pytest.raises(WorkerFailure, match=r"worker 1's restart did not start within 10 s: .*node0,lonely"):
        train("a2c", "CartPole-v1", arch="data_parallel", workers=2, backend="ray", placement="node0,lonely",
              steps=10**6, seed=0, eval_every=10**9, name="lonely", **run_opts)  # fmt: skip
    remover.join(timeout=1)
    assert removed == [lonely]
    run = tmp_path / "lonely"
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_by"] == "failure" and "did not start" in result["failure"], result
    assert load_checkpoint(run)["env_steps"] == result["env_steps"] > 0

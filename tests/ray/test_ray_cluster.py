"""A simulated 2-node Ray cluster (`ray.cluster_utils.Cluster`, both nodes on 127.0.0.1, token authentication
on): workers placed on both nodes by custom resources solve CartPole-v1, in this process and from a separate
`rlfleet train --address` that joins the cluster as a second driver; Ape-X DQN with its actors and replay shards
on both nodes solves it too."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from procs import RLFLEET

from rlfleet.launch import train

pytestmark = pytest.mark.learning
NODES = ({"node0": 4}, {"node1": 4})  # a custom resource per node: roles are placed by asking for one


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    assert os.environ["RAY_AUTH_MODE"] == "token"  # set before ray's import (conftest): a Cluster checks tokens then
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": NODES[0]})
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
    result = train("a2c", "CartPole-v1", arch="data_parallel", workers=2, backend="ray", placement="node0,node1",
                   steps=100_000, seed=0, eval_every=5_000, **run_opts)  # fmt: skip
    assert result["solved"], result.result
    assert len(nodes_used(result.run_dir)) == 2


def test_apex_with_actors_and_replay_shards_on_both_nodes_solves_cartpole(cluster, run_opts):
    result = train("dqn", "CartPole-v1", arch="apex", actors=3, replay_shards=2, backend="ray",
                   placement="node0,node1", steps=100_000, seed=0, eval_every=5_000, **run_opts)  # fmt: skip
    assert result["solved"], result.result
    assert len(nodes_used(result.run_dir)) == 2  # the actors
    shards = json.loads((result.run_dir / "shards_actors.json").read_text())
    assert len({place["node"] for place in shards.values()}) == 2


def test_a_cli_run_joins_the_cluster_through_address(cluster, tmp_path):
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    proc = subprocess.run(
        [*RLFLEET, "train", "a2c", "--env", "CartPole-v1", "--arch", "data_parallel", "--workers", "2",
         "--backend", "ray", "--address", cluster.address, "--placement", "node0,node1", "--steps", "100000",
         "--eval-every", "5000", "--logdir", str(tmp_path), "--name", "joined", "--no-progress"],
        env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "joined" / "result.json").read_text())
    assert result["solved"], result
    assert len(nodes_used(tmp_path / "joined")) == 2
    assert len(cluster.list_all_nodes()) == 2  # the cluster is left running for whoever started it


def test_pala_learners_on_both_nodes_solve_cartpole(cluster, run_opts):
    """PALA-A2C: 4 gossip learners, two on each node, exchanging parameters through the mailbox actor on the
    driver's node and the object store."""
    result = train("a2c", "CartPole-v1", arch="gossip", learners=4, backend="ray", placement="node0,node1",
                   steps=100_000, seed=0, eval_every=4_000, **run_opts)  # fmt: skip
    assert result["solved"], result.result
    assert len(nodes_used(result.run_dir)) == 2

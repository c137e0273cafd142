"""PALA: gossip learners as Ray actors, their parameters through a mailbox actor and the object store. With the
learning rate 0 every round is exactly X ← P X (the round order holds through the mailbox actor); PALA-A2C with 4
learners solves CartPole-v1, also with one learner's actor SIGKILLed mid-run, and its rounds go on after the
mailbox actor hangs or dies."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time

import numpy as np
import pytest

from rlfleet.arch.gossip import GossipRunner, Topology, consensus_distance
from rlfleet.launch import train

pytestmark = pytest.mark.usefixtures("ray_instance")


@pytest.fixture
def seen(monkeypatch) -> dict[int, np.ndarray]:
    """Every round the coordinator averages: {round: [K, n] parameters}."""
    rounds: dict[int, np.ndarray] = {}
    average_round = GossipRunner.average_round

    def record(self, round_, params):
        rounds[round_] = params.copy()
        average_round(self, round_, params)

    monkeypatch.setattr(GossipRunner, "average_round", record)
    return rounds


def test_rounds_through_the_mailbox_actor_are_exactly_x_from_p_x(seen, run_opts):
    learners, rounds = 4, 20
    train("a2c", "CartPole-v1", arch="gossip", learners=learners, backend="ray", distinct_init=True, state_every=1,
          steps=learners * 8 * rounds, overrides={"n_envs": 2, "rollout_len": 4, "lr": 0.0},
          stop_return=float("inf"), eval_every=10**9, **run_opts)  # fmt: skip
    done = sorted(seen)
    assert done == list(range(len(done))) and len(done) >= rounds - 2
    p = Topology.make("ring", learners).matrix(0)
    for t in done[1:]:
        np.testing.assert_allclose(seen[t], p @ seen[t - 1].astype(np.float64), atol=2e-6, err_msg=f"round {t}")
    assert consensus_distance(seen[done[-1]]) < 0.01 * consensus_distance(seen[0])


@pytest.mark.learning
def test_pala_a2c_with_four_ray_actor_learners_solves_cartpole(run_opts):
    result = train("a2c", "CartPole-v1", arch="gossip", learners=4, backend="ray", steps=100_000, seed=0,
                   eval_every=4_000, **run_opts)  # fmt: skip
    assert result["solved"], f"a2c on gossip with ray: {result.result}"
    assert result["eval_return_mean"] >= 475


@pytest.mark.slow  # -m slow: the hung learner's test has it killed (by ray.kill), restarted and rejoin
def test_a_sigkilled_pala_learner_is_restarted_and_rejoins_from_its_in_neighbours(monkeypatch, run_opts, tmp_path):
    """Learner 1 of four on the ring is SIGKILLed after five complete rounds. Its neighbours wait for it (learner 2
    for its messages, learner 0 for its reads), so rounds go on only if its actor is restarted and rejoins the ring:
    it takes the average of its in-neighbour (learner 0) from the mailbox actor, and rounds that all four learners
    sent follow; the run solves CartPole or reaches its budget."""
    rounds: list[int] = []
    five_rounds = threading.Event()
    average_round = GossipRunner.average_round

    def record(self, round_, params):
        rounds.append(round_)
        if len(rounds) >= 5:
            five_rounds.set()
        average_round(self, round_, params)

    monkeypatch.setattr(GossipRunner, "average_round", record)
    run, killed = tmp_path / "killed", []

    def kill_learner_1() -> None:
        if five_rounds.wait(timeout=60):
            pid = json.loads((run / "workers.json").read_text())["1"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_learner_1, daemon=True)
    killer.start()
    result = train("a2c", "CartPole-v1", arch="gossip", learners=4, backend="ray", steps=20_000, seed=0,
                   state_every=1, eval_every=20_000, gossip_timeout_s=20.0, name="killed", **run_opts)  # fmt: skip
    killer.join(timeout=1)
    assert killed, f"no learner was killed (rounds averaged: {len(rounds)})"
    log = (run / "workers.log").read_text()
    assert "worker 1 died" in log and "restarting it (from the average of its in-neighbours" in log, log
    rejoined = re.search(r"learner 1: restarted from the average of learners 0 \(round (\d+)\)", log)
    assert rejoined, log
    after = [r for r in rounds if r > int(rejoined[1])]
    assert len(after) >= 5, f"rounds all four learners sent after the rejoin: {after}"
    assert result["solved"] or result["stopped_by"] == "steps", result.result


def test_gala_order_through_the_mailbox_actor_reaches_consensus_with_bounded_staleness(seen, run_opts):
    """GALA's order on Ray (`--gossip-order gala`): learners post without waiting for reads and take the newest
    messages from the mailbox actor (`latest`); with nothing learned, gossip alone brings them together and no
    mixed message is more than --max-staleness rounds behind."""
    result = train("a2c", "CartPole-v1", arch="gossip", learners=4, backend="ray", gossip_order="gala",
                   max_staleness=2, distinct_init=True, state_every=1, steps=4 * 8 * 40,
                   overrides={"n_envs": 2, "rollout_len": 4, "lr": 0.0}, stop_return=float("inf"),
                   eval_every=10**9, **run_opts)  # fmt: skip
    config = json.loads((result.run_dir / "config.json").read_text())
    assert (config["order"], config["max_staleness"]) == ("gala", 2)
    rows = [line.split(",") for line in (result.run_dir / "metrics.csv").read_text().splitlines()[1:]]
    staleness = [float(v) for _, _, key, v in rows if key == "gossip/staleness"]
    assert staleness and max(staleness) <= 2.0
    done = sorted(seen)
    assert len(done) >= 30 and consensus_distance(seen[done[-1]]) < 0.01 * consensus_distance(seen[done[0]])


def test_a_hung_pala_learner_is_killed_for_want_of_a_heartbeat_and_rejoins(run_opts, tmp_path):
    """A learner's actor hangs in an env step: its neighbours wait, beating, until its heartbeat runs out and the
    actor is killed and restarted; it rejoins from its in-neighbours and rounds go on to the run's end."""
    flag = tmp_path / "hung"
    result = train("a2c", "delay_env:HangingOnceCartPole-v0", env_kwargs={"flag": str(flag), "driver_pid": os.getpid()},
                   arch="gossip", learners=4, backend="ray", heartbeat_s=10.0, state_every=1, steps=40_000,
                   eval_every=10**9, **run_opts)  # fmt: skip
    assert flag.exists()
    log = (result.run_dir / "workers.log").read_text()
    hung = re.search(r"worker (\d) died.*?\s*no heartbeat for \d+ s \(hung\)", log)
    assert hung, log
    assert f"learner {hung[1]}: restarted from the average of learners" in log, log
    assert result["stopped_by"] == "steps" and result["env_steps"] >= 40_000, result.result


def test_the_mailbox_actor_hung_and_then_killed_is_restarted_empty_and_the_learners_rejoin(monkeypatch, run_opts,
                                                                                          tmp_path):  # fmt: skip
    """The mailbox actor is watched as a service: SIGSTOPped after five rounds, it is killed for want of an answer
    (its callers, blocked on it, are not reported hung) and restarted empty; SIGKILLed five rounds later, it is
    restarted again. Each time every learner rejoins at the round past every one seen, with its own parameters,
    and rounds that all four learners sent go on to the run's end."""
    rounds: list[int] = []
    average_round = GossipRunner.average_round

    def record(self, round_, params):
        rounds.append(round_)
        average_round(self, round_, params)

    monkeypatch.setattr(GossipRunner, "average_round", record)
    run, done = tmp_path / "mailboxes", []

    def pid_after(count: int, other: int | None = None) -> int | None:
        """The mailbox actor's pid once `count` rounds were averaged (and it is not `other`), within a minute."""
        for _ in range(600):
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError, KeyError):
                pid = json.loads((run / "mailboxes.json").read_text())["0"]
                if len(rounds) >= count and pid != other:
                    return pid
            time.sleep(0.1)
        return None

    def drill() -> None:
        first = pid_after(5)
        if first is None:
            return
        os.kill(first, signal.SIGSTOP)
        done.append("stopped")
        second = pid_after(len(rounds) + 5, other=first)
        if second is not None:
            os.kill(second, signal.SIGKILL)
            done.append("killed")

    driller = threading.Thread(target=drill, daemon=True)
    driller.start()
    result = train("a2c", "CartPole-v1", arch="gossip", learners=4, backend="ray", steps=24_000, seed=0,
                   heartbeat_s=8.0, state_every=1, eval_every=10**9, stop_return=float("inf"), name="mailboxes",
                   **run_opts)  # fmt: skip
    driller.join(timeout=1)
    assert done == ["stopped", "killed"], f"drills done: {done} (rounds averaged: {len(rounds)})"
    log = (run / "workers.log").read_text()
    assert re.search(r"mailbox actor 0 died.*\s*no answer for \d+ s \(hung\), so it was killed", log), log
    assert not re.search(r"^\[step \d+\] worker \d died", log, re.M), log  # no learner was: they waited on it
    rejoined = [int(r) for r in re.findall(r"every learner rejoins at round (\d+)", log)]
    assert len(rejoined) == 2 and rejoined[0] < rejoined[1], log
    for r in rejoined:
        assert len(re.findall(rf"learner \d: the mailboxes were restarted: rejoined at round {r} ", log)) == 4, log
    after = [r for r in rounds if r >= rejoined[1]]
    assert len(after) >= 5, f"rounds all four learners sent after the second restart: {after}"
    assert result["stopped_by"] == "steps", result.result

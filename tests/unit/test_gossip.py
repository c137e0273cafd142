"""gossip: the mixing matrices and their checks; with the learning rate 0, gossip rounds are exactly X ← P X (the
serial backend, and learner processes with random delays), drive every learner to the average of their initial
parameters at the rate P's second-largest eigenvalue modulus predicts; a missing peer is named within the
timeout; a resumed run goes on from every learner's state."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos.a2c import A2C
from rlfleet.algos.a2c import Config as A2CConfig
from rlfleet.arch.gossip import (
    GossipLearner,
    GossipRunner,
    GossipSpec,
    GossipTimeout,
    Topology,
    check_mixing,
    consensus_distance,
    exponential_matrices,
    ring_matrix,
)
from rlfleet.arch.shared import algo_modules, load_state, pack_state, trainable_params
from rlfleet.backends.base import SPAWN
from rlfleet.backends.mailboxes import SharedMailboxes
from rlfleet.backends.shared_memory import StepCounter
from rlfleet.launch import resumed_config, train
from rlfleet.run.checkpoint import load_checkpoint
from rlfleet.run.config import ConfigError

TINY = {"n_envs": 2, "rollout_len": 4}  # 8 env steps per learner and round
STILL = {**TINY, "lr": 0.0}  # updates that leave the parameters as they are: gossip alone


# --------------------------------------------------------------------------------------------------- topology
def test_ring_matrix_is_the_directed_k_peer_ring():
    assert np.allclose(ring_matrix(4, 1), [[0.5, 0, 0, 0.5], [0.5, 0.5, 0, 0], [0, 0.5, 0.5, 0], [0, 0, 0.5, 0.5]])
    p = ring_matrix(5, 2)  # learner i averages itself with i-1 and i-2
    assert np.allclose(p[0], [1 / 3, 0, 0, 1 / 3, 1 / 3]) and np.allclose(p.sum(axis=0), 1)  # doubly stochastic
    topology = Topology.make("ring", 5, 2)
    assert topology.in_peers(0, 7) == [3, 4] and topology.out_peers(0, 7) == [1, 2]


def test_exponential_graph_cycles_through_the_hops_and_averages_exactly_with_a_power_of_two():
    matrices = exponential_matrices(8, 1)
    assert len(matrices) == 3
    topology = Topology(tuple(matrices))
    assert [topology.out_peers(0, t) for t in range(4)] == [[1], [2], [4], [1]]
    product = matrices[2] @ matrices[1] @ matrices[0]
    assert np.allclose(product, np.full((8, 8), 1 / 8))  # log2 K rounds: every learner holds the exact average
    assert topology.rate() == pytest.approx(0.0, abs=1e-4)  # a defective eigenvalue 0: numerically ~1e-6
    assert [Topology.make("exp", 8, 2).out_peers(3, t) for t in range(3)] == [[4, 5], [4, 7], [5, 7]]


def test_rate_is_the_second_largest_eigenvalue_modulus():
    assert Topology.make("ring", 4, 1).rate() == pytest.approx(math.cos(math.pi / 4))  # |(1 + e^{iπ/2}) / 2|
    assert Topology.make("ring", 8, 1).rate() == pytest.approx(math.cos(math.pi / 8))


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        (np.array([[0.5, 0.5], [0.2, 0.7]]), "row 1 sums to 0.9; every row must sum to 1 (row-stochastic)"),
        (np.array([[0.0, 1.0], [1.0, 0.0]]), "entry [0, 0] is 0; every learner must keep a share of its own"),
        (np.array([[1.5, -0.5], [0.5, 0.5]]), "has a negative or non-finite entry"),
        (np.eye(3), "is 3×3; it must be 2×2"),
        (np.eye(2), "not strongly connected (learner 0's parameters never reach learner 1"),
        (np.array([[1.0, 0.0], [0.5, 0.5]]), "column 0 sums to 1.5; every column must sum to 1 too (doubly"),
        (
            np.array([[0.6, 0.4], [0.6, 0.4]]),
            "column 0 sums to 1.2; every column must sum to 1 too (doubly stochastic), or consensus is a weighted "
            "average in which learner 0's parameters count more",
        ),
    ],
)
def test_check_mixing_names_what_is_wrong(matrix, message):
    with pytest.raises(ConfigError, match=re_escape(message)):
        check_mixing([matrix], 2)


def re_escape(text: str) -> str:
    return re.escape(text)


def test_two_separate_rings_are_refused_and_a_valid_file_is_read(tmp_path, run_opts):
    ring = ring_matrix(2, 1)
    two_rings = np.block([[ring, np.zeros((2, 2))], [np.zeros((2, 2)), ring]])
    np.savetxt(tmp_path / "split.txt", two_rings)
    with pytest.raises(ConfigError, match="is not strongly connected"):
        train("a2c", "CartPole-v1", arch="gossip", learners=4, topology=str(tmp_path / "split.txt"), **run_opts)
    np.savetxt(tmp_path / "ring.csv", ring_matrix(4, 1), delimiter=",")
    topology = Topology.make(str(tmp_path / "ring.csv"), 4)
    assert np.allclose(topology.matrix(0), ring_matrix(4, 1))
    with pytest.raises(ConfigError, match=r"must be 3×3 \(one row per learner\)"):
        Topology.make(str(tmp_path / "ring.csv"), 3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"learners": 3, "peers": 3}, "--peers 3 needs at least 4 learners in a ring; got --learners 3"),
        ({"learners": 4, "topology": "exp", "peers": 3}, "--peers 3 is more than the exponential graph of 4"),
        ({"topology": "star"}, "--topology 'star' is neither ring nor exp nor a mixing-matrix file"),
        ({"workers": 4}, "--workers is an option of"),
        ({"gossip_order": "fast"}, "--gossip-order='fast' must be one of: auto, gala, pala"),
        ({"max_staleness": -1}, "--max-staleness=-1 is negative: must be in [0, 1000]"),
        (
            {"gossip_order": "pala", "max_staleness": 3},
            "--max-staleness bounds the gala order, and this run's order is pala (each round mixes that round's own "
            "messages): add --gossip-order gala, or leave --max-staleness out",
        ),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message, run_opts):
    with pytest.raises(ConfigError, match=re_escape(message)):
        train("a2c", "CartPole-v1", arch="gossip", **options, **run_opts)


def save_archive(path) -> None:
    """An .npz archive under an .npy name (np.savez adds .npz to a name, not to an open file)."""
    with open(path, "wb") as f:
        np.savez(f, p=np.eye(2))


def write_text(text: str):
    return lambda path: path.write_text(text)


# a mixing-matrix file -> (how to write it, what the one error line says)
TOPOLOGY_FILES = {
    "zero-rounds.npy": (lambda path: np.save(path, np.zeros((0, 2, 2))), "is empty (0×2×2); it needs at least one"),
    "no-rows.npy": (lambda path: np.save(path, np.zeros((0, 0))), "is empty (0×0)"),
    "text.npy": (lambda path: np.save(path, np.array([["a", "b"], ["c", "d"]])), "holds <U1 entries; mixing weights"),
    "complex.npy": (lambda path: np.save(path, np.eye(2) * (1 + 1j)), "holds complex128 entries"),
    "objects.npy": (
        lambda path: np.save(path, np.array([[1, None], [None, 1]], dtype=object), allow_pickle=True),
        "cannot read the mixing matrix in objects.npy: Object arrays cannot be loaded",
    ),
    "archive.npy": (lambda path: save_archive(path), "is an .npz archive"),
    "scalar.npy": (lambda path: np.save(path, np.array(0.5)), "has 0 dimensions; it must be [K, K] or [T, K, K]"),
    "truncated.npy": (lambda path: path.write_bytes(b"\x93NUMPY\x01\x00"), "cannot read the mixing matrix in"),
    "empty.txt": (write_text(""), "the mixing matrix in empty.txt is empty"),
    "blank-lines.txt": (write_text("\n\n  \n"), "is empty"),
    "comments-only.txt": (write_text("# a ring, to be filled in\n"), "is empty"),
    "words.txt": (write_text("a b\nc d\n"), "cannot read the mixing matrix in words.txt: could not convert"),
    "ragged.txt": (write_text("0.5 0.5\n1\n"), "the number of columns changed from 2 to 1"),
}


@pytest.mark.parametrize("name", list(TOPOLOGY_FILES))
def test_a_bad_topology_file_is_one_line_without_warnings(name: str, tmp_path, monkeypatch, capsys):
    """Checked before anything is written, and nothing but the error line on the terminal (no numpy warning)."""
    import warnings

    from rlfleet.cli import main

    write, message = TOPOLOGY_FILES[name]
    write(tmp_path / name)
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    args = ["train", "a2c", "--env", "CartPole-v1", "--arch", "gossip", "--learners", "2", "--topology", name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main([*args, "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("rlfleet: error: ") and message in err, err
    assert not [w for w in caught if "numpy" in w.filename or "gossip" in w.filename], [str(w.message) for w in caught]
    assert sorted(tmp_path.rglob("*")) == before, "a failed command created files"


def test_a_replay_algorithm_is_refused(run_opts):
    with pytest.raises(ConfigError, match="dqn learns from replay data; the gossip architecture runs on-policy"):
        train("dqn", "CartPole-v1", arch="gossip", **run_opts)


# --------------------------------------------------------------------------------------------------- lr = 0
def flat_params(runner: GossipRunner, state: bytes) -> np.ndarray:
    algo = runner.build_algo(0)
    load_state(algo, state)
    return torch.cat([p.detach().reshape(-1) for p in trainable_params(algo_modules(algo))]).numpy()


@pytest.fixture
def rounds(monkeypatch):
    """Every round the coordinator averages, {round: [K, n] parameters}, and the learners' initial parameters
    under the key "initial"."""
    seen: dict = {}
    average_round, initial_states = GossipRunner.average_round, GossipRunner.initial_states

    def record_round(self, round_, params):
        seen[round_] = params.copy()
        average_round(self, round_, params)

    def record_initial(self):
        states = initial_states(self)
        seen["initial"] = np.stack([flat_params(self, s) for s in states])
        return states

    monkeypatch.setattr(GossipRunner, "average_round", record_round)
    monkeypatch.setattr(GossipRunner, "initial_states", record_initial)
    return seen


def expected_rounds(topology: Topology, initial: np.ndarray, n_rounds: int) -> list[np.ndarray]:
    """X after each round of gossip alone: X_{t+1} = P_t X_t, in float64."""
    x, out = initial.astype(np.float64), []
    for t in range(n_rounds):
        x = topology.matrix(t) @ x
        out.append(x)
    return out


def gossip_alone(algo: str, topology: str, learners: int, rounds_: int, run_opts, **options):
    options = {"gossip_order": "pala", **options}  # every round's own messages: exactly P_t X_t
    return train(algo, "CartPole-v1", arch="gossip", learners=learners, topology=topology, distinct_init=True,
                 state_every=1, steps=learners * 8 * rounds_, overrides=STILL, stop_return=float("inf"),
                 eval_every=10**9, **options, **run_opts)  # fmt: skip


@pytest.mark.parametrize(("algo", "topology", "learners"), [("a2c", "ring", 4), ("ppo", "ring", 5), ("a2c", "exp", 6)])
def test_with_lr_zero_rounds_are_exactly_x_from_p_x_and_reach_the_average(algo, topology, learners, rounds, run_opts):
    """Serial learners (taking turns) with updates that change nothing: every round the coordinator sees is the
    mixing matrix applied once more to the initial parameters, so the learners end at their initial average, and
    the consensus distance shrinks by the second-largest eigenvalue modulus of the matrix per round."""
    result = gossip_alone(algo, topology, learners, 40, run_opts, backend="serial")
    top = Topology.make(topology, learners)
    initial = rounds["initial"]
    assert consensus_distance(initial) > 0.1  # the learners start apart
    done = sorted(r for r in rounds if r != "initial")
    assert done == list(range(len(done))) and len(done) >= 39
    for t, expected in enumerate(expected_rounds(top, initial, len(done))):
        np.testing.assert_allclose(rounds[t], expected, atol=2e-6, err_msg=f"round {t}")
    distances = [consensus_distance(rounds[t]) for t in done]
    for t in done:  # these graphs' matrices are doubly stochastic: every round keeps the initial average ...
        np.testing.assert_allclose(rounds[t].mean(axis=0), initial.mean(axis=0), atol=1e-6, err_msg=f"round {t}")
    assert distances[-1] < 1e-3 * consensus_distance(initial)  # ... and the learners converge to it
    if top.rate() > 0.1:
        measured = (distances[30] / distances[10]) ** (1 / 20)
        assert measured == pytest.approx(top.rate(), rel=0.05), distances
    averaged = torch.cat([p.detach().reshape(-1) for p in trainable_params(algo_modules(result.algo))]).numpy()
    np.testing.assert_allclose(averaged, initial.mean(axis=0), atol=1e-5)  # the coordinator's model: the average


def test_ordering_holds_under_random_delays_in_learner_processes(rounds, run_opts):
    """Four learner processes whose env steps sleep at random (any of them may run ahead or fall behind) on a
    time-varying graph with two peers per round: still every round is exactly P_t X_t. A learner that averaged
    before an in-neighbour posted the round, or posted over a message not yet read, would mix two rounds."""
    learners, n_rounds = 4, 30
    train("a2c", "delay_env:DelayedCartPole-v0", arch="gossip", learners=learners, topology="ring", peers=2,
          gossip_order="pala", distinct_init=True, state_every=1, steps=learners * 8 * n_rounds, overrides=STILL,
          stop_return=float("inf"), eval_every=10**9, **run_opts)  # fmt: skip
    initial = rounds.pop("initial")
    done = sorted(rounds)
    assert done == list(range(len(done))) and len(done) >= n_rounds - 2
    for t, expected in enumerate(expected_rounds(Topology.make("ring", learners, 2), initial, len(done))):
        np.testing.assert_allclose(rounds[t], expected, atol=2e-6, err_msg=f"round {t}")


def make_spec(learners: int, **options) -> GossipSpec:
    env = gym.make("CartPole-v1")
    cfg = A2CConfig(**TINY)
    algo = A2C(cfg, env.observation_space, env.action_space)
    return GossipSpec("a2c", cfg, "CartPole-v1", env.observation_space, env.action_space, seed=0,
                      total_steps=10**6, topology=Topology.make("ring", learners),
                      initial_states=[pack_state(algo)] * learners, **options)  # fmt: skip


def test_a_gala_learner_waiting_on_an_older_post_is_woken_by_it_on_a_time_varying_graph():
    """GALA order on the exponential graph of 4: learner 1 at round 1 waits for its round-1 in-peer to post round 0,
    which that peer posted to its round-0 out-peers alone: learner 1 slept out its whole wait slice (here 30 s)."""
    topology = Topology.make("exp", 4)
    spec = dataclasses.replace(make_spec(4, order="gala", max_staleness=1, wait_slice_s=30.0, gossip_timeout_s=120),
                               topology=topology)  # fmt: skip
    size = sum(p.numel() for p in trainable_params(algo_modules(A2C(spec.algo_cfg, spec.observation_space,
                                                                         spec.action_space))))  # fmt: skip
    mailboxes = SharedMailboxes(SPAWN, 4, size, 0)
    learners = {i: GossipLearner(spec, mailboxes, worker_id=i) for i in range(4)}
    assert learners[1].produce(0).round == 0
    (peer,) = topology.in_peers(1, 1)
    assert 1 not in topology.out_peers(peer, 0)  # its post of round 0 is not for learner 1
    took: dict[str, float] = {}

    def second_round() -> None:
        start = time.monotonic()
        learners[1].produce(0)
        took["s"] = time.monotonic() - start

    waiting = threading.Thread(target=second_round)
    waiting.start()
    time.sleep(0.5)  # learner 1 waits
    assert learners[peer].produce(0).round == 0
    waiting.join(timeout=60)
    for learner in learners.values():
        learner.close()
    assert took["s"] < 15, took  # woken by the post (about 0.5 s here), not by the end of its 30-s slice


def test_a_missing_peer_is_named_within_the_timeout():
    """Learner 1 of a 2-learner ring waits for learner 0, which never posts: after the timeout it says which
    learner it waits for and for what (no hang), and the coordinator ends the run with that error."""
    spec = make_spec(2, gossip_timeout_s=0.5, wait_slice_s=0.2)
    size = sum(p.numel() for p in trainable_params(algo_modules(A2C(spec.algo_cfg, spec.observation_space,
                                                                         spec.action_space))))  # fmt: skip
    learner = GossipLearner(spec, SharedMailboxes(SPAWN, 2, size, 0), worker_id=1)
    start = time.monotonic()
    items = [learner.produce(0)]
    while items[-1].trouble is None:
        assert time.monotonic() - start < 60, "no timeout"  # the default timeout is 300 s
        items.append(learner.produce(0))
    took = time.monotonic() - start
    learner.close()
    said = re.fullmatch(r"learner 1 waited (\d+\.\d) s in round 0 for learner 0 to post round 0", items[-1].trouble)
    assert said and float(said[1]) >= 0.5 and took >= 0.5, items[-1].trouble
    assert len(items) >= 3  # it returned after each slice of waiting (so its process beats and sees the stop flag)
    assert sum(i.wait_s for i in items) > 0.4  # and it slept while it waited
    runner = GossipRunner.__new__(GossipRunner)  # its `take` only: counting, then the error
    runner.counter, runner._episodes, runner.returns = StepCounter(SPAWN), 0, []
    runner.stats = [GossipRunner._fresh_stats() for _ in range(2)]
    with pytest.raises(GossipTimeout, match="for learner 0 to post round 0"):
        runner.take(items[-1])


def test_resume_restarts_every_learner_from_its_checkpointed_state(rounds, run_opts, tmp_path, monkeypatch):
    """The checkpoint holds every learner's state; the resumed learners start from them (not from the averaged
    model, nor afresh) and the rounds go on: the first resumed round is P applied to the saved parameters. Mailboxes
    restarted before the resumed run completes a round would have every learner rejoin at that first round too."""
    first = gossip_alone("a2c", "ring", 4, 10, {**run_opts, "name": "r"}, backend="serial")
    saved = load_checkpoint(first.run_dir)["gossip"]
    assert len(saved["learners"]) == 4 and all(s is not None for s in saved["learners"])
    assert saved["round"] >= 8
    x_saved = np.stack([flat_of(first.algo, s) for s in saved["learners"]])
    rounds.clear()
    rejoin, start_workers = [], GossipRunner.start_workers

    def record_rejoin(self, *args):  # where restarted mailboxes would have the learners rejoin, before any round
        rejoin.append(self.highest_round + 1)
        return start_workers(self, *args)

    monkeypatch.setattr(GossipRunner, "start_workers", record_rejoin)
    train(resume=first.run_dir, steps=4 * 8 * 20)
    resumed = sorted(rounds)
    start = max([saved["round"], *saved["learner_rounds"]]) + 1
    assert resumed[0] == start and len(resumed) >= 8 and rejoin == [start]
    topology = Topology.make("ring", 4)
    for t, expected in zip(resumed, expected_rounds_from(topology, x_saved, start, len(resumed)), strict=True):
        np.testing.assert_allclose(rounds[t], expected, atol=2e-6, err_msg=f"round {t}")


def flat_of(algo, state: dict) -> np.ndarray:
    """The flat trainable parameters of a learner state (as the checkpoint holds it), loaded into `algo`."""
    for name, module in algo_modules(algo).items():
        module.load_state_dict(state["modules"][name])
    return torch.cat([p.detach().reshape(-1) for p in trainable_params(algo_modules(algo))]).numpy()


def expected_rounds_from(topology: Topology, x: np.ndarray, start: int, n_rounds: int) -> list[np.ndarray]:
    x, out = x.astype(np.float64), []
    for t in range(start, start + n_rounds):
        x = topology.matrix(t) @ x
        out.append(x)
    return out


def test_two_neighbours_restarted_together_rejoin_without_waiting_for_each_other():
    """Both learners of a 2-learner ring died after posting round 3, before reading it. Their next incarnations
    (taking turns in this process) read what is left of round 3, start from what their in-neighbour's slot holds,
    and complete round 4 together: neither waits for a message only the other's rejoining could send."""
    spec = make_spec(2, gossip_timeout_s=2.0, wait_slice_s=0.0)
    size = sum(p.numel() for p in trainable_params(algo_modules(A2C(spec.algo_cfg, spec.observation_space,
                                                                         spec.action_space))))  # fmt: skip
    mailboxes = SharedMailboxes(SPAWN, 2, size, 0)
    posted = {i: torch.randn(size) for i in range(2)}
    for r in range(4):
        for i in range(2):
            mailboxes.post(i, r, posted[i] + r, [1 - i])
        if r < 3:
            for i in range(2):
                mailboxes.take(i, 1 - i, r)
    learners = [GossipLearner(spec, mailboxes, worker_id=i, incarnation=1) for i in range(2)]
    done: dict[int, object] = {}
    start = time.monotonic()
    while len(done) < 2:
        for i, learner in enumerate(learners):
            if i not in done:
                item = learner.produce(0)
                assert item.trouble is None, item.trouble
                if item.round is not None:
                    done[i] = item
        assert time.monotonic() - start < 60, "the restarted learners wait for each other"
    for learner in learners:
        learner.close()
    both = ((posted[0] + 3 + posted[1] + 3) / 2).numpy()  # each took the other's round 3, then they averaged
    for i in range(2):
        assert done[i].round == 4 and done[i].note == f"restarted from the average of learners {1 - i} (round 4)"
        np.testing.assert_allclose(done[i].params, both, atol=1e-6)
        assert done[i].metrics == {}  # nothing learned in the round it rejoined
    assert mailboxes.read(0, 1) == mailboxes.read(1, 0) == 4


# --------------------------------------------------------------------------------------------------- GALA's order
def distinct_spec(learners: int, **options) -> tuple[GossipSpec, list[np.ndarray], int]:
    """A spec whose learners start from their own random parameters and learn nothing (lr 0), with those
    parameters (flat) and their size."""
    env = gym.make("CartPole-v1")
    cfg = A2CConfig(**STILL)
    algos = [A2C(cfg, env.observation_space, env.action_space) for _ in range(learners)]
    flats = [torch.cat([p.detach().reshape(-1) for p in trainable_params(algo_modules(a))]).numpy() for a in algos]
    spec = GossipSpec("a2c", cfg, "CartPole-v1", env.observation_space, env.action_space, seed=0,
                      total_steps=10**6, topology=Topology.make("ring", learners), state_every=1,
                      initial_states=[pack_state(a) for a in algos], **options)  # fmt: skip
    return spec, flats, flats[0].size


def rounds_of(learner: GossipLearner, n: int) -> list:
    """Produce until `n` rounds complete or the learner has to wait; the completed items."""
    done = []
    while len(done) < n:
        item = learner.produce(0)
        assert item.trouble is None, item.trouble
        if item.round is None:
            break
        done.append(item)
    return done


def test_gala_order_never_waits_to_post_mixes_what_arrived_and_waits_only_beyond_the_staleness_bound():
    """A 2-learner ring in GALA's order with --max-staleness 2, the learners taking turns in this process.
    Learner 0 alone completes rounds 0 and 1, posting each though nobody read the one before (PALA's order waits
    for that read) and mixing nothing (learner 1 posted nothing); it posts round 2 too, but to mix it learner 1
    would be more than 2 rounds behind, so it waits, naming it. Learner 1's round 0 mixes the latest message it
    finds (learner 0's round 2); then learner 0's round 2 mixes learner 1's round-0 message, 2 rounds stale."""
    spec, (x0, x1), size = distinct_spec(2, order="gala", max_staleness=2, wait_slice_s=0.0, gossip_timeout_s=30.0)
    mailboxes = SharedMailboxes(SPAWN, 2, size, 0)
    first, second = (GossipLearner(spec, mailboxes, worker_id=i) for i in range(2))
    alone = rounds_of(first, 5)
    assert [item.round for item in alone] == [0, 1]
    assert [(item.skipped, item.mixed) for item in alone] == [(1, 0), (1, 0)]
    assert mailboxes.written(0) == 2 and mailboxes.read(1, 0) == -1  # posted rounds 1 and 2 over unread ones
    assert first.missing() == [(1, "to post round 0")]
    np.testing.assert_allclose(alone[-1].params, x0, atol=1e-6)
    (joined,) = rounds_of(second, 1)
    assert (joined.round, joined.mixed, joined.staleness) == (0, 1, 0) and mailboxes.read(1, 0) == 2
    np.testing.assert_allclose(joined.params, (x0 + x1) / 2, atol=1e-6)
    (caught_up,) = rounds_of(first, 1)
    assert (caught_up.round, caught_up.mixed, caught_up.staleness) == (2, 1, 2)
    np.testing.assert_allclose(caught_up.params, (x0 + x1) / 2, atol=1e-6)  # learner 1's round-0 message was x1
    assert rounds_of(first, 1) == []  # round 3: learner 1 is 3 rounds behind now
    for learner in (first, second):
        learner.close()


def test_gala_order_with_staleness_zero_waits_for_the_round_but_never_for_a_read():
    """--max-staleness 0: a learner mixes only once each in-neighbour posted its own round (as in PALA's order),
    but it posts without waiting for its readers, so a reader that fell behind mixes the newest message."""
    spec, (x0, x1), size = distinct_spec(2, order="gala", max_staleness=0, wait_slice_s=0.0, gossip_timeout_s=30.0)
    mailboxes = SharedMailboxes(SPAWN, 2, size, 0)
    first, second = (GossipLearner(spec, mailboxes, worker_id=i) for i in range(2))
    assert rounds_of(first, 1) == [] and first.missing() == [(1, "to post round 0")]  # posted round 0, waits
    (second_0,) = rounds_of(second, 2)  # mixes learner 0's round 0; posts round 1 unread by learner 0; waits
    np.testing.assert_allclose(second_0.params, (x0 + x1) / 2, atol=1e-6)
    assert mailboxes.written(1) == 1 and mailboxes.read(0, 1) == -1
    (first_0,) = rounds_of(first, 1)  # round 0 with learner 1's newest message: its round 1, (x0 + x1) / 2
    np.testing.assert_allclose(first_0.params, (3 * x0 + x1) / 4, atol=1e-6)
    assert mailboxes.read(0, 1) == 1
    for learner in (first, second):
        learner.close()


def test_gala_is_the_default_on_one_machine_and_pala_on_ray():
    from rlfleet.arch.gossip import GossipOptions

    assert GossipRunner.resolve_order(GossipOptions(backend="local")) == "gala"
    assert GossipRunner.resolve_order(GossipOptions(backend="serial")) == "gala"
    assert GossipRunner.resolve_order(GossipOptions(backend="ray")) == "pala"
    assert GossipRunner.resolve_order(GossipOptions(backend="ray", gossip_order="gala")) == "gala"


def test_a_run_keeps_the_order_auto_gave_it_when_resumed_on_another_backend(run_opts):
    """auto is saved as the order it stood for: a GALA run resumed on ray goes on in GALA's order (its
    --max-staleness with it), not in PALA's."""
    first = train("a2c", "CartPole-v1", arch="gossip", learners=2, backend="serial", max_staleness=3, steps=2 * 8 * 16,
                  eval_every=10**9, eval_episodes=1, stop_return=1e9, **run_opts)  # fmt: skip
    saved = load_checkpoint(first.run_dir)["run_config"]
    assert saved["options"]["gossip_order"] == "gala"
    cfg = resumed_config(saved, {}, None, None, {"backend": "ray", "gossip_order": "auto"})  # the run's own command
    run = GossipRunner.__new__(GossipRunner)
    run._prepare(cfg, resuming=True)
    assert run.order == "gala" and run.opts.max_staleness == 3


def test_gala_learner_processes_reach_consensus_with_bounded_staleness(rounds, run_opts):
    """Four learner processes in GALA's order (the local backend's default) whose env steps sleep at random, with
    nothing learned: every round completes without a timeout, no mixed message is more than --max-staleness
    rounds behind, and gossip alone brings the learners together."""
    result = train("a2c", "delay_env:DelayedCartPole-v0", arch="gossip", learners=4, distinct_init=True,
                   state_every=1, steps=4 * 8 * 60, overrides=STILL, stop_return=float("inf"), eval_every=10**9,
                   **run_opts)  # fmt: skip
    config = json.loads((result.run_dir / "config.json").read_text())
    assert (config["order"], config["max_staleness"]) == ("gala", 1)
    rows = [line.split(",") for line in (result.run_dir / "metrics.csv").read_text().splitlines()[1:]]
    stalest = [float(v) for _, _, key, v in rows if key == "gossip/staleness_max"]
    assert stalest and max(stalest) <= 1  # no message mixed was more than the default bound, 1 round, behind
    initial = consensus_distance(rounds.pop("initial"))
    assert len(rounds) >= 30 and consensus_distance(rounds[max(rounds)]) < 1e-2 * initial

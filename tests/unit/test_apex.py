"""apex (Ape-X DQN): the exploration ladder, the actors' n-step transitions and initial priorities, the replay
shards (eviction, priority write-back on the right rows of the right shard), and serial determinism."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos import resolve
from rlfleet.arch.apex import EMPTY, ID_SPAN, Actor, ApexRunner, ReplayShard, ShardState, epsilon_ladder
from rlfleet.arch.parallel import WorkerSpec
from rlfleet.arch.shared import share_algo
from rlfleet.backends.serial import SerialHandle
from rlfleet.backends.shared_memory import WeightVersion
from rlfleet.data.batch import Batch
from rlfleet.data.priority import importance_weights
from rlfleet.data.returns import NStepBuilder
from rlfleet.launch import train
from rlfleet.run.checkpoint import load_checkpoint
from rlfleet.run.config import ConfigError, RunConfig, build_algo_config

SPACES = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
CTX = torch.multiprocessing.get_context("spawn")


def block_of(values, n_obs: int = 4) -> dict[str, np.ndarray]:
    """A block whose transition k has obs full of values[k] (to tell rows apart)."""
    v = np.asarray(values, np.float32)
    return {
        "obs": np.repeat(v[:, None], n_obs, axis=1),
        "act": np.zeros(len(v), np.int64),
        "rew": v.copy(),
        "next_obs": np.repeat(v[:, None], n_obs, axis=1),
        "terminated": np.zeros(len(v), np.float32),
        "discount": np.full(len(v), 0.99, np.float32),
    }


class Recorder:
    """A replay shard that keeps what it is sent."""

    def __init__(self):
        self.calls = []

    def add(self, block, priorities, version):
        self.calls.append((block, np.asarray(priorities), version))
        n = sum(len(b["rew"]) for b, _, _ in self.calls)
        return ShardState(n, float(n), 1.0)


# --------------------------------------------------------------------------------------------- exploration
def test_epsilon_ladder_follows_the_paper():
    assert epsilon_ladder(1) == [0.4]
    three = epsilon_ladder(3)
    np.testing.assert_allclose(three, [0.4, 0.4**4.5, 0.4**8])
    eight = epsilon_ladder(8, epsilon=0.5, alpha=3.0)
    np.testing.assert_allclose(eight, [0.5 ** (1 + 3.0 * i / 7) for i in range(8)])
    assert epsilon_ladder(4, alpha=0.0) == [0.4] * 4
    with pytest.raises(ValueError, match="at least one actor"):
        epsilon_ladder(0)


def test_actors_act_with_their_rung_of_the_ladder(tmp_path):
    learner, cfg = algo_and_cfg(n_envs=2)
    spec = WorkerSpec("dqn", cfg, "CartPole-v1", *SPACES, seed=0, total_steps=10_000)
    ladder = epsilon_ladder(3)
    actors = [
        Actor(spec, share_algo(learner), WeightVersion(CTX), [SerialHandle(0, Recorder())], ladder, 4, 400, i)
        for i in range(3)
    ]
    try:
        for i, actor in enumerate(actors):
            report = actor.produce(global_steps=9_000)  # late in the run: the ε schedule would say eps_final
            assert actor.algo.eps == pytest.approx(ladder[i]) and report.exploration == pytest.approx(ladder[i])
    finally:
        for actor in actors:
            actor.close()


# --------------------------------------------------------------------------------------------- n-step, priorities
def test_n_step_builder_sums_rewards_and_stops_at_episode_ends():
    b = NStepBuilder(n_envs=1, n_step=3, gamma=0.5)
    obs = [np.array([float(t)]) for t in range(6)]
    # env 0: rewards 1, 2, 4, 8, then terminates at step 4 (reward 16); step 5 starts a new episode
    for t, (r, term) in enumerate([(1, False), (2, False), (4, False), (8, False), (16, True)]):
        b.add([obs[t]], [t], [r], [obs[t + 1]], [term], [False])
    out = b.take(len(b))
    assert out["act"].tolist() == [0, 1, 2, 3, 4]  # every transition left, the last ones at the episode end
    np.testing.assert_allclose(out["rew"], [1 + 1 + 1, 2 + 2 + 2, 4 + 4 + 4, 8 + 8, 16])
    np.testing.assert_allclose(out["discount"], [0.125, 0.125, 0.125, 0.25, 0.5])
    np.testing.assert_allclose(out["next_obs"][:, 0], [3, 4, 5, 5, 5])
    assert out["terminated"].tolist() == [0, 0, 1, 1, 1]
    b.add([obs[0]], [7], [1.0], [obs[1]], [False], [True])  # truncated: bootstraps, not terminated
    out = b.take(1)
    assert out["terminated"].tolist() == [0] and out["discount"].tolist() == [0.5]
    reused = NStepBuilder(n_envs=1, n_step=2, gamma=1.0)
    frame = np.zeros((1, 1), np.float32)  # a vector env may write each step's observations into one array
    for t in range(3):
        frame[0, 0] = t
        reused.add(frame, [t], [0.0], frame + 1, [False], [False])
    assert reused.take(2)["obs"][:, 0].tolist() == [0, 1]


def algo_and_cfg(**overrides):
    cfg, _ = build_algo_config("dqn", None, overrides)
    return resolve("dqn")[0](cfg, *SPACES, seed=0), cfg


@pytest.mark.parametrize("net", ["", "user_nets:Dropped"])
def test_initial_priorities_are_the_absolute_n_step_td_errors_under_the_actors_weights(net):
    """...as the actor acts: a network of the user's own in eval mode (Dropout off, BatchNorm's running statistics),
    not in training mode, where Dropout made them random."""
    learner, cfg = algo_and_cfg(n_envs=2, n_step=3, gamma=0.9, net=net)
    with torch.no_grad():
        for p in learner.q_target.parameters():
            p.mul_(-1.5)  # the target differs from the online network: double Q is visible
    spec = WorkerSpec("dqn", cfg, "CartPole-v1", *SPACES, seed=0, total_steps=10_000)
    shard = Recorder()
    weights = WeightVersion(CTX)
    weights.set(7)
    actor = Actor(spec, share_algo(learner), weights, [SerialHandle(0, shard)], [0.4], 6, 400, 0)
    try:
        actor.produce(global_steps=0)
    finally:
        actor.close()
    (block, priorities, version), = shard.calls  # fmt: skip
    assert version == 7 and len(block["rew"]) == 6 and priorities.shape == (6,)
    with torch.inference_mode():  # by hand, with the learner's networks (the actor pulled exactly these), as acting
        obs, nxt = torch.as_tensor(block["obs"]), torch.as_tensor(block["next_obs"])
        q = learner.q(obs)[torch.arange(6), torch.as_tensor(block["act"])]
        best = learner.q(nxt).argmax(1)
        bootstrap = learner.q_target(nxt)[torch.arange(6), best]
        y = (
            torch.as_tensor(block["rew"])
            + torch.as_tensor(block["discount"]) * (1 - torch.as_tensor(block["terminated"])) * bootstrap
        )
    np.testing.assert_allclose(priorities, (y - q).abs().numpy(), rtol=1e-5, atol=1e-6)
    assert (priorities > 0).all()


def test_continuous_actors_scale_their_noise_by_their_rung_and_send_the_critics_td_errors():
    """td3 actors: σ_i = exploration_noise · ε_i / ε; uniform random actions during the run's warm-up, then
    μ(s) plus their own noise; initial priorities are the twin critics' mean |TD error| under their weights."""
    spaces = (gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
    cfg, _ = build_algo_config("td3", None, {"target_noise": 0.0, "random_steps": 1_000, "n_step": 2})
    learner = resolve("td3")[0](cfg, *spaces, seed=0)
    spec = WorkerSpec("td3", cfg, "Pendulum-v1", *spaces, seed=0, total_steps=10_000)
    ladder = epsilon_ladder(3)
    shards = [Recorder() for _ in range(3)]
    actors = [
        Actor(spec, share_algo(learner), WeightVersion(CTX), [SerialHandle(0, shards[i])], ladder, 40, 400, i)
        for i in range(3)
    ]
    try:
        for i, actor in enumerate(actors):
            report = actor.produce(global_steps=5_000 if i else 0)  # actor 0 in the warm-up, the others after it
            assert report.exploration == pytest.approx(cfg.exploration_noise * ladder[i] / ladder[0])
            assert actor.algo.noise.sigma == pytest.approx(report.exploration)
    finally:
        for actor in actors:
            actor.close()
    for i, shard in enumerate(shards):
        (block, priorities, _), = shard.calls  # fmt: skip
        greedy = learner.bounds(learner.actor.numpy_act(block["obs"]))
        off = np.abs(block["act"] - greedy).max()
        sigma = 2.0 * cfg.exploration_noise * ladder[i] / ladder[0]  # in env units: the half-range is 2
        assert off > 0.5 if i == 0 else 0 < off < 5 * sigma  # actor 0: uniform over [-2, 2] (the warm-up)
        batch = Batch({**block, "weight": np.ones(40, np.float32)})
        b = batch.to_torch()
        with torch.no_grad():
            act = torch.from_numpy(learner.bounds.normalize(block["act"]))
            nxt = learner.critic_target(b.next_obs, learner.actor_target(b.next_obs)).min(0).values
            y = b.rew + b.discount * (1 - b.terminated) * nxt
            want = (learner.critic(b.obs, act) - y).abs().mean(0).numpy()
        np.testing.assert_allclose(priorities, want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------- shards
def test_eviction_keeps_the_newest_transitions():
    shard = ReplayShard(0, 0, capacity=10, alpha=0.6)
    for start in range(0, 16, 4):
        shard.add(block_of(range(start, start + 4)), np.ones(4), version=start)
    assert len(shard) == 10
    assert sorted(shard.storage["rew"].tolist()) == list(range(6, 16))  # 0-5 evicted
    assert shard.sample(11) is None  # fewer than a batch
    sampled = [shard.sample(10) for _ in range(10)]
    drawn = np.concatenate([s.data["rew"] for s in sampled])
    assert set(drawn.tolist()) == set(range(6, 16))  # only the newest, each of them
    np.testing.assert_array_equal(np.concatenate([s.ids for s in sampled]), drawn.astype(int))  # id k: k-th added
    np.testing.assert_array_equal(np.concatenate([s.versions for s in sampled]), drawn.astype(int) // 4 * 4)
    big = ReplayShard(0, 0, capacity=5, alpha=0.6)
    big.add(block_of(range(12)), np.arange(12) + 1.0, version=0)  # a block larger than the ring
    assert sorted(big.storage["rew"].tolist()) == list(range(7, 12))


def test_sampling_follows_priority_and_importance_weights_are_max_normalised():
    shard = ReplayShard(0, 0, capacity=4, alpha=1.0, eps=1e-9)
    shard.add(block_of([0, 1, 2, 3]), np.array([1.0, 1.0, 1.0, 7.0]), version=0)
    draws = np.concatenate([shard.sample(4).data["rew"] for _ in range(500)])
    assert abs(np.mean(draws == 3) - 0.7) < 0.05
    s = shard.sample(4)
    assert s.state == ShardState(4, pytest.approx(10.0), pytest.approx(1.0))  # size, Σ p^α, min p^α
    np.testing.assert_allclose(s.mass, np.where(s.data["rew"] == 3, 7.0, 1.0), rtol=1e-6)
    expected = np.where(s.data["rew"] == 3, 7.0**-0.5, 1.0)  # one shard: the whole replay
    np.testing.assert_allclose(importance_weights(s.mass, s.state.min_mass, 0.5), expected, rtol=1e-6)


def test_priority_updates_skip_rows_overwritten_since_they_were_sampled():
    shard = ReplayShard(0, 2, capacity=4, alpha=1.0, eps=1e-9)
    shard.add(block_of([0, 1, 2, 3]), np.ones(4), version=0)
    assert shard.ids.min() == 2 * ID_SPAN  # ids are unique over incarnations
    sampled = shard.sample(4)
    shard.add(block_of([10, 11]), np.full(2, 5.0), version=1)  # overwrites the rows of ids base+0, base+1
    set_now = shard.update_priorities(sampled.ids, np.full(4, 3.0))
    assert set_now == len({i for i in sampled.ids.tolist() if i >= 2 * ID_SPAN + 2})
    p = shard.priorities()
    rows_new = np.isin(shard.storage["rew"], [10, 11])
    np.testing.assert_allclose(p[rows_new], 5.0)  # the new rows keep their own priorities
    old_sampled = np.isin(shard.storage["rew"], [v for v in sampled.data["rew"] if v >= 2])
    np.testing.assert_allclose(p[old_sampled], 3.0)
    assert ReplayShard(0, 3, 4, 1.0).update_priorities(sampled.ids, np.ones(4)) == 0  # a restarted shard


def test_learner_writes_priorities_back_to_the_rows_and_shard_the_batch_came_from(tmp_path, monkeypatch):
    cfg = RunConfig(algo="dqn", env="CartPole-v1", arch="apex", logdir=str(tmp_path), progress=False,
                    options={"backend": "serial", "replay_shards": 2, "actors": 1},
                    overrides={"batch_size": 8, "alpha": 1.0})  # fmt: skip
    runner = ApexRunner(cfg)
    try:
        runner.services = runner.backend.start_services(runner.shard_maker, 2)
        shards = [h.service for h in runner.services.handles]
        for i, shard in enumerate(shards):
            shard.add(block_of(np.arange(20) + 100 * i), np.ones(20), version=0)
        runner.shard_states = [shard.state() for shard in shards]
        order = iter([0, 1, 0])  # which shard is drawn is another test's: here each batch's priorities go back to it
        monkeypatch.setattr(runner, "choose_shard", lambda: next(order))
        sampled = []
        next_batch = runner.next_batch
        monkeypatch.setattr(runner, "next_batch", lambda: sampled.append(next_batch()) or sampled[-1])
        written = [np.arange(8) + 2.0, np.arange(8) + 20.0]  # each update's own priorities
        calls = iter(written)
        monkeypatch.setattr(runner.algo, "update", lambda batch: {"loss": 0.0, "priorities": next(calls).copy()})
        before = [s.priorities().copy() for s in shards]
        runner.learn(2)
        assert [s.shard for s in sampled] == [0, 1]
        for s, prios in zip(sampled, written, strict=True):
            assert (s.data["rew"] // 100 == s.shard).all()  # the batch holds that shard's rows
            p = shards[s.shard].priorities()
            rows = s.ids % shards[s.shard].capacity
            last = {row: w for row, w in zip(rows.tolist(), prios.tolist(), strict=True)}  # repeats: last wins
            np.testing.assert_allclose(p[list(last)], np.array(list(last.values())) + shards[s.shard].eps)
            untouched = np.setdiff1d(np.arange(20), rows)
            np.testing.assert_array_equal(p[untouched], before[s.shard][untouched])
    finally:
        runner.services.stop()
        runner.eval_envs.close()


# --------------------------------------------------------------------------------------------- runs
def final_weights(run_dir) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / "latest.pt")["algo"]["q"]


@pytest.mark.parametrize("seeds", [(3, 3, True), (3, 4, False)])
def test_serial_runs_with_the_same_seed_end_with_the_same_weights(seeds, tmp_path, monkeypatch):
    """...and the paced learner ends the run at its replay ratio: the last pass took in up to actors × AHEAD blocks
    and made at most gradient_steps updates, leaving 59 of 450 owed updates unmade at the final checkpoint."""
    a, b, same = seeds
    ends = []
    finish = ApexRunner.finish

    def recorded_finish(self, *args):
        ends.append((self.env_steps, self.ready_at, self.learned, self.ratio))
        return finish(self, *args)

    monkeypatch.setattr(ApexRunner, "finish", recorded_finish)
    runs = [
        train(
            "dqn",
            "CartPole-v1",
            arch="apex",
            actors=3,
            replay_shards=2,
            backend="serial",
            steps=2_500,
            seed=seed,
            eval_every=2_500,
            eval_episodes=1,
            stop_return=1e9,
            logdir=str(tmp_path),
            name=f"r{k}",
            progress=False,
            overrides={"learning_starts": 500},
        )  # fmt: skip
        for k, seed in enumerate((a, b))
    ]
    assert runs[0]["updates"] > 100
    for (env_steps, ready_at, learned, ratio), run in zip(ends, runs, strict=True):
        assert learned == run["updates"] == int((env_steps - ready_at) * ratio)
    w0, w1 = (final_weights(r.run_dir) for r in runs)
    equal = all(torch.equal(w0[k], w1[k]) for k in w0)
    assert equal == same


@pytest.mark.parametrize(
    "options, message",
    [
        ({"algo": "a2c"}, r"compute priorities \(dqn, ddpg, td3\); a2c is not"),
        ({"algo": "sac", "env": "Pendulum-v1"}, "sac is not one of them"),
        ({"replay_shards": 1_000, "overrides": {"buffer_size": 1_000}}, "--replay-shards 1000 leaves 1"),
        ({"overrides": {"lstm": 8}}, "recurrent dqn"),
        (  # three shards of 333 hold 999 transitions: learning would never start
            {"replay_shards": 3, "overrides": {"buffer_size": 1_000, "learning_starts": 1_000, "batch_size": 32}},
            r"hold 999 transitions in all .* learning_starts <= 999 or buffer_size >= 1002",
        ),
    ],
)
def test_bad_apex_options_are_clear_errors(options, message, tmp_path):
    options = {"algo": "dqn", "env": "CartPole-v1", **options}
    with pytest.raises(ConfigError, match=message):
        train(options.pop("algo"), options.pop("env"), arch="apex", backend="serial", logdir=str(tmp_path),
              progress=False, **options)  # fmt: skip


def test_a_resumed_run_keeps_the_learner_and_refills_the_replay_before_learning_again(tmp_path):
    """The replay is not saved: a resumed run learns again only once its actors have stored learning_starts
    transitions anew, from the saved learner (networks, optimizer, update count) and weight version."""
    first = train("dqn", "CartPole-v1", arch="apex", actors=2, backend="serial", steps=2_000, stop_return=1e9,
                  eval_every=2_000, eval_episodes=1, name="r", logdir=str(tmp_path), progress=False)  # fmt: skip
    saved = load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt")
    assert saved["apex"]["version"] == saved["algo"]["updates"] == first["updates"] > 0
    resumed = train(resume=tmp_path / "r", steps=4_000, progress=False)
    more = resumed["updates"] - first["updates"]
    # 1,000 of the 2,000 new steps refill the replay (learning_starts), then 16 updates per 64 steps: about 250
    # (about 500 if learning went on at once)
    assert 200 <= more <= 300
    final = load_checkpoint(tmp_path / "r" / "checkpoints" / "latest.pt")
    assert final["apex"]["version"] == final["algo"]["updates"] == resumed["updates"]


def test_the_learner_lets_actors_refill_a_replay_shard_that_lost_its_data(tmp_path):
    """With one shard restarted empty the learner owes updates it cannot make: the actors must still be let to
    send blocks (here: serial, so the learner must ask for them), else the run stalls for good."""
    cfg = RunConfig(algo="dqn", env="CartPole-v1", arch="apex", logdir=str(tmp_path), progress=False,
                    options={"backend": "serial", "actors": 2}, overrides={"learning_starts": 300})  # fmt: skip
    runner = ApexRunner(cfg)
    stop = runner.backend.stop_flag()
    pool = runner.start_workers(stop, None)
    try:
        while runner.state["updates"] < 20:
            taken = runner.coordinate(pool)
            runner.state["updates"] += taken.updates if taken is not None else 0
        shard = runner.services.handles[0]
        shard.service = ReplayShard(0, 1, shard.service.capacity, shard.service.alpha)  # as a restart leaves it
        runner.shard_states[0] = EMPTY
        steps, updates = runner.env_steps, runner.state["updates"]
        for _ in range(200):
            taken = runner.coordinate(pool)
            runner.state["updates"] += taken.updates if taken is not None else 0
        assert runner.env_steps > steps + 300 and runner.state["updates"] > updates
    finally:
        runner.stop_roles(stop, pool, runner.services)
        runner.eval_envs.close()


def test_actors_act_with_ever_newer_weights_and_their_returns_exploration_and_rates_are_logged(tmp_path, monkeypatch):
    cfg = RunConfig(algo="dqn", env="CartPole-v1", arch="apex", logdir=str(tmp_path), progress=False,
                    options={"backend": "serial", "actors": 3, "sync_every": 100},
                    overrides={"learning_starts": 300})  # fmt: skip
    runner = ApexRunner(cfg)
    stop = runner.backend.stop_flag()
    pool = runner.start_workers(stop, None)
    try:
        seen: list[list[int]] = [[] for _ in range(3)]
        for _ in range(300):
            runner.coordinate(pool)
            for i, actor in enumerate(pool.roles):
                if actor.version is not None:
                    seen[i].append(actor.version)
        for versions in seen:
            assert versions == sorted(versions) and versions[-1] > versions[0] > -1
        assert runner.weights.version == runner.algo.updates > 0
    finally:
        runner.stop_roles(stop, pool, runner.services)
        runner.eval_envs.close()
    monkeypatch.setattr(ApexRunner, "log_every", 300)  # log lines after learning starts (at 1,000 steps)
    result = train("dqn", "CartPole-v1", arch="apex", actors=3, backend="serial", steps=1_500, stop_return=1e9,
                   eval_every=1_500, eval_episodes=1, name="r", logdir=str(tmp_path), progress=False)  # fmt: skip
    with open(result.run_dir / "metrics.csv") as f:
        rows = [line.split(",") for line in f.read().splitlines()[1:]]
    for i in range(3):
        returns = [float(r[-1]) for r in rows if r[2] == f"charts/episodic_return_{i}"]
        assert returns and min(returns) >= 8  # CartPole's shortest episodes last 8 steps
    ladder = epsilon_ladder(3)
    for i in range(3):
        logged = [float(r[-1]) for r in rows if r[2] == f"charts/exploration_{i}"]
        assert logged and all(x == pytest.approx(ladder[i], rel=1e-4) for x in logged)
    for rate in ("charts/replay_add_rate", "charts/replay_sample_rate", "charts/actor_sps", "charts/learner_ups"):
        values = [float(r[-1]) for r in rows if r[2] == rate]
        assert values and max(values) > 0, rate


# --------------------------------------------------------------------------------------------- the paper's sampling
def two_shard_learner(tmp_path, rows, priorities, beta_anneal=True):
    """A serial apex learner with two shards holding `rows[k]` transitions of priority `priorities[k]` (α = 1)."""
    cfg = RunConfig(algo="dqn", env="CartPole-v1", arch="apex", logdir=str(tmp_path), progress=False, seed=5,
                    options={"backend": "serial", "replay_shards": 2, "actors": 1},
                    overrides={"batch_size": 8, "alpha": 1.0, "beta_anneal": beta_anneal})  # fmt: skip
    runner = ApexRunner(cfg)
    runner.services = runner.backend.start_services(runner.shard_maker, 2)
    shards = [h.service for h in runner.services.handles]
    if rows[1] < rows[0]:  # the small one restarted empty and refilled since
        shards[1] = runner.services.handles[1].service = ReplayShard(1, 1, shards[1].capacity, 1.0, seed=5)
    for i, shard in enumerate(shards):
        runner.shard_states[i] = shard.add(block_of(np.arange(rows[i]) + 1000 * i), np.full(rows[i], priorities[i]), 0)
    return runner, shards


def test_the_learner_draws_shards_in_proportion_to_their_priority_mass_and_weighs_over_the_whole_replay(tmp_path):
    runner, shards = two_shard_learner(tmp_path, rows=(100, 100), priorities=(1.0, 9.0))
    try:
        batches = [runner.next_batch() for _ in range(1_000)]
        share = np.mean([b.shard == 1 for b in batches])
        assert abs(share - 0.9) < 0.04, share  # mass 900 of 1000 (in turn: 0.5)
        mass = np.concatenate([s.priorities()[: len(s)] for s in shards])  # p^α of every stored transition
        n, total, beta = mass.size, mass.sum(), runner.beta()
        for b in (next(b for b in batches if b.shard == 0), next(b for b in batches if b.shard == 1)):
            p = b.mass / total  # P(i) over the whole replay
            w = (n * p) ** -beta / ((n * mass / total) ** -beta).max()
            np.testing.assert_allclose(b.data["weight"], w, rtol=1e-5)
        heavy = next(b for b in batches if b.shard == 1)  # weighed against shard 0's p = 1, not its own 9
        np.testing.assert_allclose(heavy.data["weight"], (9.0 / 1.0) ** -beta, rtol=1e-5)
    finally:
        runner.services.stop()
        runner.eval_envs.close()


def test_a_restarted_small_shard_is_not_over_sampled(tmp_path):
    """A shard restarted empty that holds one batch again is drawn for its share of the mass, not every other time."""
    runner, shards = two_shard_learner(tmp_path, rows=(1_000, 8), priorities=(1.0, 1.0))
    try:
        share = np.mean([runner.next_batch().shard == 1 for _ in range(1_000)])
        assert share < 0.03, share  # 8 of 1008 transitions: 0.8% (in turn: 50%)
    finally:
        runner.services.stop()
        runner.eval_envs.close()


def test_apex_picks_the_papers_preset_on_atari_and_keeps_beta_fixed(tmp_path, caplog):
    with caplog.at_level("INFO", logger="rlfleet.run.config"):
        cfg, preset = build_algo_config("dqn", None, {}, "atari", "ALE/Pong-v5", "apex", ApexRunner.presets)
    assert preset == "apex" and "preset apex for --arch apex on atari envs" in caplog.text
    assert (cfg.batch_size, cfg.buffer_size, cfg.n_step, cfg.target_update_every) == (512, 2_000_000, 3, 2_500)
    assert (cfg.max_grad_norm, cfg.lr, cfg.alpha, cfg.beta, cfg.beta_anneal) == (40.0, 0.00025 / 4, 0.6, 0.4, False)
    for algo in ("ddpg", "td3"):  # Ape-X DPG
        cfg, preset = build_algo_config(algo, None, {}, "mujoco", "HalfCheetah-v5", "apex", ApexRunner.presets)
        assert preset == "apex" and (cfg.batch_size, cfg.n_step, cfg.beta_anneal) == (512, 5, False)
    # the user's preset or --set wins; other architectures and other families keep theirs
    assert build_algo_config("dqn", "default", {}, "atari", "ALE/Pong-v5", "apex", ApexRunner.presets)[1] is None
    cfg, _ = build_algo_config("dqn", None, {"batch_size": "32"}, "atari", "ALE/Pong-v5", "apex", ApexRunner.presets)
    assert cfg.batch_size == 32 and cfg.buffer_size == 2_000_000
    assert build_algo_config("dqn", None, {}, "atari", "ALE/Pong-v5")[1] == "atari"
    assert build_algo_config("dqn", None, {}, None, "CartPole-v1", "apex", ApexRunner.presets)[1] is None
    # a run: the preset is picked, and β stays 0.4 to the end of the budget
    pytest.importorskip("ale_py")
    run = RunConfig(algo="dqn", env="ALE/Pong-v5", arch="apex", logdir=str(tmp_path), progress=False,
                    options={"backend": "serial", "actors": 1})  # fmt: skip
    runner = ApexRunner(run)
    try:
        assert runner.preset == "apex" and runner.beta() == 0.4
        runner.counter.add(runner.total_steps)
        assert runner.beta() == 0.4
    finally:
        runner.eval_envs.close()
    runner, _ = two_shard_learner(tmp_path / "cartpole", rows=(8, 8), priorities=(1.0, 1.0))  # defaults: annealed
    try:
        runner.counter.add(runner.total_steps)
        assert runner.beta() == 1.0
    finally:
        runner.services.stop()
        runner.eval_envs.close()


def test_the_unpaced_learner_updates_as_fast_as_it_can_and_the_paced_one_keeps_the_replay_ratio(tmp_path):
    """Paced, the learner makes gradient_steps updates per train_freq × n_envs env steps once learning starts (here 1
    per 1,024: about 4 in 4,000 steps); unpaced (the paper's), it updates while the actor steps, far more often (about
    100 here: a CartPole actor steps 4,000 times in a second)."""
    common = dict(arch="apex", actors=1, steps=4_500, stop_return=1e9, eval_every=4_500, eval_episodes=1,
                  logdir=str(tmp_path), progress=False)  # fmt: skip
    start = {"learning_starts": 500, "gradient_steps": 1}
    paced = train("dqn", "CartPole-v1", name="paced", overrides={**start, "train_freq": 256}, **common)
    unpaced = train("dqn", "CartPole-v1", name="unpaced", unpaced=True, overrides=start, **common)
    steps_learning = paced["env_steps"] - 500
    assert steps_learning // 1024 - 1 <= paced["updates"] <= steps_learning // 1024 + 1
    assert unpaced["updates"] >= 20
    assert json.loads((unpaced.run_dir / "config.json").read_text())["unpaced"] is True

"""The hogwild architecture's pieces: per-worker ε, the lock-free update, the shared target, a serial run."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos import nstep_q, resolve
from rlfleet.algos.acting import sample_final_epsilons
from rlfleet.arch.hogwild import HogwildSpec, HogwildWorker
from rlfleet.arch.shared import algo_modules, share_algo, trainable_params
from rlfleet.launch import train
from rlfleet.optim.shared import build_optimizer
from rlfleet.run.config import build_algo_config

SPACES = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))


def spec(algo: str, optimizer: str = "momentum_sgd", preset: str | None = None, **overrides) -> HogwildSpec:
    cfg, _ = build_algo_config(algo, preset, overrides)
    return HogwildSpec(algo, cfg, "CartPole-v1", *SPACES, seed=0, total_steps=100_000, optimizer=optimizer,
                      lr=cfg.lr, max_grad_norm=cfg.max_grad_norm)  # fmt: skip


def shared_algo(s: HogwildSpec):
    algo_cls, _, _, _ = resolve(s.algo)
    return algo_cls(s.algo_cfg, *SPACES, seed=0)


def test_final_epsilons_follow_the_paper_distribution():
    rng = np.random.default_rng(0)
    draws = sample_final_epsilons(60_000, (0.1, 0.01, 0.5), (0.4, 0.3, 0.3), rng)
    freq = [np.mean(draws == e) for e in (0.1, 0.01, 0.5)]
    assert np.allclose(freq, [0.4, 0.3, 0.3], atol=0.01), freq  # 4+ standard errors
    with pytest.raises(ValueError, match="sum to 1"):
        sample_final_epsilons(3, (0.1, 0.5), (0.5, 0.6), rng)


def test_each_worker_draws_its_own_final_epsilon():
    """One env per worker: across workers (their own seeds) the final ε follow {0.4, 0.3, 0.3}."""
    s = spec("onestep_q", n_envs=1)
    algo_cls, _, _, _ = resolve("onestep_q")
    choices, probs = s.algo_cfg.eps_final_choices, s.algo_cfg.eps_final_probs

    def drawn(seed: int) -> float:  # what a worker's algorithm draws first from its own seeded generator
        return sample_final_epsilons(1, choices, probs, np.random.default_rng(seed))[0]

    for w in range(5):  # the real worker-side objects draw exactly that
        assert algo_cls(s.algo_cfg, *SPACES, seed=s.worker_seed(w, 0)).eps_final[0] == drawn(s.worker_seed(w, 0))
    finals = np.array([drawn(s.worker_seed(w, 0)) for w in range(20_000)])
    freq = [np.mean(finals == e) for e in choices]
    assert np.allclose(freq, [0.4, 0.3, 0.3], atol=0.015), freq


def test_nstep_q_atari_preset_counts_the_papers_frames_in_env_steps():
    """Paper: target network every 40,000 frames, ε annealed over 4M frames; an Atari env step is 4 frames."""
    from rlfleet.envs.make import ATARI_FRAME_SKIP

    cfg, _ = build_algo_config("nstep_q", "atari", {})
    algo_cls, _, _, _ = resolve("nstep_q")
    spaces = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6)
    algo = algo_cls(cfg, *spaces, seed=0)
    with torch.no_grad():
        for p in algo.q.parameters():
            p.add_(1.0)  # the online net moves away from the target

    def synced() -> bool:
        return all(torch.equal(a, b) for a, b in zip(algo.q_target.parameters(), algo.q.parameters(), strict=True))

    algo.schedule((40_000 - ATARI_FRAME_SKIP) // ATARI_FRAME_SKIP, cfg.total_steps)
    assert not synced()
    algo.schedule(40_000 // ATARI_FRAME_SKIP, cfg.total_steps)  # 40,000 frames
    assert synced()
    algo.schedule(2_000_000 // ATARI_FRAME_SKIP, cfg.total_steps)  # half of 4M frames: ε half way from 1
    np.testing.assert_allclose(algo.eps, 1.0 + (algo.eps_final - 1.0) / 2)
    algo.schedule(4_000_000 // ATARI_FRAME_SKIP, cfg.total_steps)  # 4M frames: every env at its final ε
    np.testing.assert_allclose(algo.eps, algo.eps_final)


def test_worker_applies_its_local_gradient_to_the_shared_parameters():
    """θ ← θ − η·clip(∇θ' L) with plain SGD: the shared parameters move by exactly the worker's gradient."""
    s = spec("a2c", optimizer="momentum_sgd", lr=0.1, max_grad_norm=0.0)  # the worker steps with the algorithm's lr
    algo = shared_algo(s)
    shared = share_algo(algo)
    before = [p.detach().clone() for p in trainable_params(shared)]
    worker = HogwildWorker(s, shared, build_optimizer("momentum_sgd", trainable_params(shared), 0.1, momentum=0.0), 0)
    try:
        with torch.no_grad():  # the local copy diverges before the step: the step must pull the shared weights
            for p in worker.copy.local_params:
                p.add_(1.0)
        steps, metrics = worker.step(global_steps=0)
        assert steps == s.algo_cfg.n_envs * s.algo_cfg.rollout_len and np.isfinite(metrics["grad_norm"])
        for p0, p, lp in zip(before, trainable_params(shared), worker.copy.local_params, strict=True):
            assert torch.allclose(lp.detach(), p0)  # pulled: the local copy started from the shared weights
            assert torch.allclose(p.detach(), p0 - 0.1 * lp.grad, atol=1e-6)
        assert any(not torch.equal(p0, p) for p0, p in zip(before, trainable_params(shared), strict=True))
    finally:
        worker.close()


def test_value_workers_share_one_target_network():
    s = spec("nstep_q", optimizer="shared_rmsprop", target_update_every=40)
    algo = shared_algo(s)
    shared = share_algo(algo)
    workers = [HogwildWorker(s, shared, build_optimizer("shared_rmsprop", trainable_params(shared), 1e-3), w)
               for w in range(2)]  # fmt: skip
    try:
        assert all(w.algo.q_target is algo.q_target for w in workers)  # the same module, not a copy
        assert all(w.algo.q is not algo.q for w in workers)  # the trained network is a local copy
        workers[0].step(global_steps=0)
        workers[1].step(global_steps=80)  # past the target period: the shared target takes the shared weights
        for pt, p in zip(algo.q_target.parameters(), workers[1].algo.q.parameters(), strict=True):
            assert torch.equal(pt, p.detach())
        assert not all(
            torch.equal(a, b) for a, b in zip(algo.q_target.parameters(), algo.q.parameters(), strict=True)
        )  # the worker's own update came after the sync
    finally:
        for w in workers:
            w.close()


@pytest.mark.parametrize("n_workers", [1, 4, 16])
def test_the_shared_target_is_copied_once_every_target_period_of_global_steps(n_workers, monkeypatch):
    """The paper copies the target every I_target GLOBAL steps, however many workers there are and whether one
    of them was restarted (round-robin workers, as the serial mode runs them; worker 0 restarts half-way)."""
    period, total = 200, 4_000
    s = spec("onestep_q", optimizer="shared_rmsprop", target_update_every=period, n_envs=1, rollout_len=5)
    shared = share_algo(shared_algo(s))
    optimizer = build_optimizer("shared_rmsprop", trainable_params(shared), 1e-3)
    copies = []
    monkeypatch.setattr(nstep_q, "hard_update", lambda target, source: copies.append(t))
    workers = [HogwildWorker(s, shared, optimizer, w) for w in range(n_workers)]
    t = turn = 0
    try:
        while t < total:
            if t >= total // 2 and workers[0].incarnation == 0:
                workers[0].close()
                workers[0] = HogwildWorker(s, shared, optimizer, 0, incarnation=1)
            n, _ = workers[turn % n_workers].step(global_steps=t)
            turn += 1
            t_seen, t = t, t + n
    finally:
        for w in workers:
            w.close()
    assert len(copies) == t_seen // period == 19  # the last segment started at 3,995
    assert np.all(np.diff(copies) >= period - 5)  # never two copies within one period (5: a segment)


def test_a_segment_with_nothing_to_learn_from_moves_no_parameter():
    """REINFORCE without a baseline learns only from finished episodes: a 5-step segment from a reset has none, so
    the worker makes no update (momentum would still move the parameters, an empty loss would make them NaN)."""
    s = spec("pg", optimizer="momentum_sgd", baseline=False, epochs=1, minibatch_size=0, n_envs=1, rollout_len=5)
    shared = share_algo(shared_algo(s))
    params = trainable_params(shared)
    optimizer = build_optimizer("momentum_sgd", params, 0.1)
    for p in params:  # the optimizer has moved before: its momentum is not zero
        p.grad = torch.ones_like(p)
    optimizer.step()
    before = [p.detach().clone() for p in params]
    worker = HogwildWorker(s, shared, optimizer, 0)
    try:
        steps, metrics = worker.step(global_steps=0)
    finally:
        worker.close()
    assert steps == 5 and metrics == {}
    assert all(torch.equal(b, p) for b, p in zip(before, params, strict=True))


def test_serial_hogwild_run_writes_its_run_folder(tmp_path):
    result = train("a3c", "CartPole-v1", workers=2, backend="serial", steps=3_000, eval_every=1_000,
                   logdir=str(tmp_path), name="r", progress=False)  # fmt: skip
    r = result.result
    assert r["arch"] == "hogwild" and r["env_steps"] >= 3_000 and r["updates"] == r["env_steps"] // 5
    run = tmp_path / "r"
    for name in ("config.json", "metrics.csv", "curves.png", "result.json", "checkpoints/latest.pt"):
        assert (run / name).exists(), name
    assert json.loads((run / "config.json").read_text())["workers"] == 2


def test_a_run_stopped_early_counts_the_updates_its_workers_made_on_their_way_out(tmp_path):
    """Workers report on a clock; those stopped early (Ctrl-C, SIGTERM, a callback, a time limit) send their last
    report on their way out, and its updates count as its episodes do: every 5-step segment is one update, short
    of at most the segment each worker had begun."""
    result = train("a3c", "CartPole-v1", workers=2, backend="local", steps=10**6, eval_every=10**6,
                   callbacks=[lambda info: info["env_steps"] >= 20_000], logdir=str(tmp_path), name="r",
                   progress=False)  # fmt: skip
    r = result.result
    assert r["stopped_by"] == "interrupted"
    assert r["env_steps"] // 5 - 2 <= r["updates"] <= r["env_steps"] // 5, (r["updates"], r["env_steps"])


def test_lstm_worker_carries_its_own_state_across_segments():
    """The recurrent agent: a worker's hidden state survives the pull of new shared weights between its
    segments (the next segment starts from it), and the LSTM's weights are among the shared parameters."""
    s = spec("a3c", optimizer="shared_rmsprop", preset="lstm")
    algo = shared_algo(s)
    shared = share_algo(algo)
    lstm_params = {id(p) for name, p in algo.model.named_parameters() if name.startswith("core.")}
    assert lstm_params and lstm_params <= {id(p) for p in trainable_params(shared)}
    before = {name: p.detach().clone() for name, p in algo.model.named_parameters() if name.startswith("core.")}
    worker = HogwildWorker(s, shared, build_optimizer("shared_rmsprop", trainable_params(shared), 1e-3), 0)
    try:
        worker.step(global_steps=0)
        carried = worker.collector.state
        assert carried is not None
        first = [t.clone() for t in carried]
        segments = []
        original = worker.collector.collect_rollout
        worker.collector.collect_rollout = lambda storage: segments.append(original(storage)) or segments[-1]
        worker.step(global_steps=s.algo_cfg.n_envs * s.algo_cfg.rollout_len)
        assert all(torch.equal(a, b) for a, b in zip(segments[0].initial_state, first, strict=True))
        assert any(not torch.equal(before[n], p) for n, p in algo.model.named_parameters() if n.startswith("core."))
    finally:
        worker.close()


def test_continuous_worker_acts_within_the_bounds():
    """The paper's continuous agent on hogwild: Gaussian actions rescaled into Pendulum's [-2, 2]."""
    spaces = (gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
    cfg, _ = build_algo_config("a3c", "continuous", {})
    s = HogwildSpec("a3c", cfg, "Pendulum-v1", *spaces, seed=0, total_steps=100_000, optimizer="shared_rmsprop",
                   lr=cfg.lr, max_grad_norm=cfg.max_grad_norm)  # fmt: skip
    algo = resolve("a3c")[0](cfg, *spaces, seed=0)
    shared = share_algo(algo)
    worker = HogwildWorker(s, shared, build_optimizer("shared_rmsprop", trainable_params(shared), 1e-3), 0)
    try:
        segments = []
        original = worker.collector.collect_rollout
        worker.collector.collect_rollout = lambda storage: segments.append(original(storage)) or segments[-1]
        steps, metrics = worker.step(global_steps=0)
        data = segments[0].data
        assert steps == cfg.n_envs * cfg.rollout_len and np.isfinite(metrics["grad_norm"])
        assert np.all(np.abs(data.act) <= 2.0) and "raw_act" in data
        assert np.allclose(data.act, np.clip(2.0 * data.raw_act, -2.0, 2.0))
    finally:
        worker.close()


def test_with_the_algorithms_own_optimizer_each_worker_steps_a_copy_of_it_over_the_shared_parameters():
    """`--optimizer algo` on hogwild: a per-worker kind, like rmsprop: each worker builds a fresh optimizer of the
    algorithm's class and hyperparameters (A2C's RMSprop, ε 1e-5 outside the root) over the shared parameters."""
    s = spec("a2c", optimizer="algo")
    shared = share_algo(shared_algo(s))
    workers = [HogwildWorker(s, shared, None, w) for w in range(2)]
    try:
        for worker in workers:
            opt, own = worker.optimizer, worker.algo.optimizer
            assert type(opt) is torch.optim.RMSprop and opt is not own
            assert {k: opt.defaults[k] for k in ("alpha", "eps", "lr")} == {"alpha": 0.99, "eps": 1e-5, "lr": s.lr}
            assert all(a is b for a, b in zip(opt.param_groups[0]["params"], trainable_params(shared), strict=True))
        assert workers[0].optimizer is not workers[1].optimizer
        before = [p.detach().clone() for p in trainable_params(shared)]
        workers[0].step(global_steps=0)
        assert any(not torch.equal(a, p) for a, p in zip(before, trainable_params(shared), strict=True))
        assert workers[0].optimizer.state and not workers[1].optimizer.state  # statistics of its own
    finally:
        for worker in workers:
            worker.close()


def test_algo_modules_are_the_networks():
    s = spec("nstep_q")
    assert set(algo_modules(shared_algo(s))) == {"q", "q_target", "target_clock"}


@pytest.mark.parametrize(
    "options, message",
    [
        ({"algo": "dqn", "arch": "hogwild"}, "replay"),
        ({"algo": "a3c", "workers": 0}, "--workers"),
        ({"algo": "a3c", "optimizer": "adagrad"}, "unknown optimizer"),
        ({"algo": "a3c", "optimizer": "sgd"}, "'sgd' is now 'momentum_sgd'.*10x the learning rate"),  # renamed
        ({"algo": "a3c", "arch": "impala"}, "unknown architecture .impala.; choose one of.*gossip"),
        ({"algo": "ppo", "arch": "hogwild"}, "ppo's update takes 10 epoch.*one gradient per segment.*data_parallel"),
    ],
)
def test_bad_hogwild_options_are_clear_errors(tmp_path, options, message):
    from rlfleet.run.config import ConfigError

    algo = options.pop("algo")
    with pytest.raises(ConfigError, match=message):
        train(algo, "CartPole-v1", logdir=str(tmp_path), progress=False, **options)
    assert not any(tmp_path.iterdir())  # nothing written

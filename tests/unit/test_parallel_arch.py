"""data_parallel and grad_parallel: serial runs, the centre's summed step, per-sampler replay columns, weight
versions, sampler schedules, and clear errors for combinations that cannot run."""

from __future__ import annotations

import csv
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos import resolve
from rlfleet.algos.updates import linear
from rlfleet.arch import parallel, runner_class
from rlfleet.arch.allreduce import AllReduceLearner
from rlfleet.arch.data_parallel import Sampler, TransitionBlock, concat_blocks
from rlfleet.arch.grad_parallel import GradientCentre, GradientWorker
from rlfleet.arch.parallel import WorkerSpec
from rlfleet.arch.param_server import ShardWorker
from rlfleet.arch.shared import share_algo, trainable_params
from rlfleet.backends.serial import SerialBackend
from rlfleet.backends.shared_memory import StopFlag, WeightVersion
from rlfleet.data.buffer import ReplayBuffer
from rlfleet.launch import train
from rlfleet.run.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.run.config import ConfigError, RunConfig, build_algo_config

SPACES = (gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2))
CTX = torch.multiprocessing.get_context("spawn")


def algo_and_cfg(name: str, **overrides):
    cfg, _ = build_algo_config(name, None, overrides)
    return resolve(name)[0](cfg, *SPACES, seed=0), cfg


def metric_rows(run_dir, key: str) -> list[float]:
    with open(run_dir / "metrics.csv") as f:
        return [float(row["value"]) for row in csv.DictReader(f) if row["key"] == key]


@pytest.mark.parametrize("arch", ["data_parallel", "grad_parallel"])
def test_serial_run_writes_its_run_folder_and_logs_policy_lag(arch, run_opts, tmp_path):
    result = train("a2c", "CartPole-v1", arch=arch, workers=2, backend="serial", steps=3_000, eval_every=1_000,
                   stop_return=1e9, name="r", **run_opts)  # fmt: skip
    r = result.result
    assert r["arch"] == arch and r["stopped_by"] == "steps" and r["env_steps"] >= 3_000
    run = tmp_path / "r"
    for name in ("config.json", "metrics.csv", "curves.png", "result.json", "checkpoints/latest.pt"):
        assert (run / name).exists(), name
    assert json.loads((run / "config.json").read_text())["workers"] == 2
    lags = metric_rows(run, "charts/policy_lag")
    assert lags and min(lags) >= 0
    assert metric_rows(run, "losses/grad_norm") and metric_rows(run, "charts/episodic_return")
    segment = 8 * 16  # a2c's n_envs × rollout_len per sampler or worker
    per_update = segment if arch == "data_parallel" else 2 * segment  # the centre sums one gradient per worker
    assert r["updates"] == r["env_steps"] // per_update


def test_serial_data_parallel_dqn_learns_from_every_sampler(run_opts):
    result = train("dqn", "CartPole-v1", arch="data_parallel", workers=2, backend="serial", steps=3_000,
                   eval_every=1_500, stop_return=1e9, **run_opts)  # fmt: skip
    r = result.result
    rounds = r["env_steps"] // (2 * 4 * 16)  # a round: one block of train_freq steps of 4 envs from each sampler
    assert r["env_steps"] >= 3_000 and r["env_steps"] % (2 * 4 * 16) == 0
    assert 0 < r["updates"] <= rounds * 16 and r["updates"] % 16 == 0  # gradient_steps per round once learning
    assert r["episodes"] > 0 and r["eval_return_mean"] is not None


def test_data_parallel_resumes_its_counters(run_opts, tmp_path):
    train("a2c", "CartPole-v1", arch="data_parallel", workers=2, backend="serial", steps=1_024, stop_return=1e9,
          name="r", **run_opts)  # fmt: skip
    first = json.loads((tmp_path / "r" / "result.json").read_text())
    resumed = train(resume=tmp_path / "r", steps=2_048, progress=False).result
    assert resumed["env_steps"] == 2_048 and resumed["updates"] == first["updates"] + 8
    assert resumed["episodes"] >= first["episodes"]


def test_grad_parallel_centre_step_is_the_sum_of_the_worker_gradients():
    """θ ← θ − η Σ_w ∇L_w(θ) with plain SGD, the gradients computed by hand from the workers' own segments."""
    algo, cfg = algo_and_cfg("a2c", n_envs=2, rollout_len=8)
    spec = WorkerSpec("a2c", cfg, "CartPole-v1", *SPACES, seed=0, total_steps=10_000)
    shared = share_algo(algo)
    params = trainable_params(shared)
    weights = WeightVersion(CTX)
    workers = [GradientWorker(spec, shared, weights, w) for w in range(2)]
    try:
        with torch.no_grad():  # local copies that diverged must be refreshed by the pull
            for w in workers:
                for p in w.copy.local_params:
                    p.add_(1.0)
        flat, by_hand = [], []
        for w in workers:
            version, segment = w.collect(global_steps=0)
            assert version == 0
            grad, metrics = w.gradient(segment)
            assert grad.dtype == np.float32 and "policy_loss" in metrics
            ref, _ = algo_and_cfg("a2c", n_envs=2, rollout_len=8)
            ref.model.load_state_dict(algo.model.state_dict())
            loss, _ = ref.loss(ref.process(segment))
            loss.backward()
            hand = [p.grad.clone() for p in ref.model.parameters()]
            np.testing.assert_allclose(grad, torch.cat([g.flatten() for g in hand]).numpy(), rtol=1e-5, atol=1e-7)
            flat.append(grad)
            by_hand.append(hand)
        before = [p.detach().clone() for p in params]
        centre = GradientCentre(params, torch.optim.SGD(params, lr=0.1), max_grad_norm=0.0)
        with weights.writing():
            norm = centre.apply(flat)
        assert weights.version == 1
        total = [a + b for a, b in zip(*by_hand, strict=True)]
        assert norm == pytest.approx(float(torch.cat([g.flatten() for g in total]).norm()), rel=1e-5)
        for p0, p, g in zip(before, params, total, strict=True):
            torch.testing.assert_close(p.detach(), p0 - 0.1 * g, rtol=1e-5, atol=1e-6)
        assert all(p.grad is None for p in params)
        with pytest.raises(ValueError, match="another model"):
            centre.apply([flat[0][:-1]])
    finally:
        for w in workers:
            w.close()


def test_grad_parallel_centre_clips_the_summed_gradient():
    p = torch.nn.Parameter(torch.zeros(4))
    centre = GradientCentre([p], torch.optim.SGD([p], lr=1.0), max_grad_norm=1.0)
    norm = centre.apply([np.full(4, 1.0, np.float32), np.full(4, 2.0, np.float32)])  # sum 3s, norm 6
    assert norm == pytest.approx(6.0)
    torch.testing.assert_close(p.detach(), torch.full((4,), -0.5))  # clipped to norm 1


def test_weight_version_counts_updates_and_reads_whole_versions():
    weights = WeightVersion(CTX)
    stop = StopFlag(CTX)
    copies = []
    assert weights.read(lambda: copies.append(1)) == 0 and copies == [1]
    with weights.writing():
        stop.set()  # a reader never returns a copy taken while the weights change
        assert weights.read(lambda: copies.append(2), stop) is None and copies == [1]
    assert weights.version == 1 and weights.read(lambda: None) == 1
    weights.set(7)
    assert weights.version == 7


def test_sampler_follows_the_global_schedule_and_the_learner_target():
    learner, cfg = algo_and_cfg("nstep_q", n_envs=2, rollout_len=4, eps_anneal_steps=1_000)
    spec = WorkerSpec("nstep_q", cfg, "CartPole-v1", *SPACES, seed=0, total_steps=10_000)
    weights = WeightVersion(CTX)
    with torch.no_grad():
        for p in learner.q_target.parameters():
            p.add_(0.5)  # the learner's target differs from its online network
    sampler = Sampler(spec, share_algo(learner), weights, worker_id=0)
    try:
        item = sampler.produce(global_steps=500)
        assert item.version == 0 and item.steps == 2 * 4
        local = sampler.algo
        expected = cfg.eps_start + (local.eps_final - cfg.eps_start) * 0.5  # half-way through the annealing
        np.testing.assert_allclose(local.eps, expected)
        assert local.q_target is not learner.q_target  # a copy: only the learner changes its target
        for a, b in zip(local.q_target.parameters(), learner.q_target.parameters(), strict=True):
            assert torch.equal(a, b)
        assert set(item.data.data.keys()) >= {"obs", "act", "rew", "terminated", "truncated"}
    finally:
        sampler.close()


def test_dqn_sampler_sends_blocks_of_train_freq_steps_with_scheduled_epsilon():
    learner, cfg = algo_and_cfg("dqn", n_envs=3, train_freq=5)
    spec = WorkerSpec("dqn", cfg, "CartPole-v1", *SPACES, seed=0, total_steps=100_000)
    sampler = Sampler(spec, share_algo(learner), WeightVersion(CTX), worker_id=1)
    try:
        item = sampler.produce(global_steps=4_000)
        assert sampler.algo.eps == pytest.approx(linear(cfg.eps_start, cfg.eps_final, cfg.eps_anneal_steps, 4_000))
        assert item.worker == 1 and item.steps == 15
        assert item.data["obs"].shape == (5, 3, 4) and item.data["rew"].shape == (5, 3)
        assert item.data["terminated"].dtype == bool
    finally:
        sampler.close()


def test_transition_blocks_keep_each_sampler_in_its_own_env_columns():
    """Blocks side by side: n-step sums never mix two samplers' streams."""
    blocks = []
    for reward in (1.0, 10.0):  # sampler 0 always earns 1, sampler 1 always 10; two envs each
        block = TransitionBlock(6)
        for t in range(6):
            obs = np.full((2, 1), t, np.float32)
            block.add(obs, np.zeros(2, np.int64), np.full(2, reward, np.float32), obs + 1,
                      np.zeros(2, bool), np.zeros(2, bool))  # fmt: skip
        blocks.append(block.data)
    rows = concat_blocks(blocks)
    assert rows["rew"].shape == (6, 4)
    buffer = ReplayBuffer(100, n_envs=4, n_step=3, gamma=1.0)
    for t in range(6):
        buffer.add(*(rows[key][t] for key in TransitionBlock.FIELDS))
    batch = buffer.sample(0)
    column = batch.index % 4
    full = batch.rew[(batch.index // 4) < 4]  # rows with 3 steps ahead of them
    assert set(np.unique(full)) == {3.0, 30.0}
    assert np.all(np.where(column < 2, batch.rew <= 3.0, batch.rew >= 10.0))


UNKNOWN_ADAM = (
    r"^unknown optimizer 'adam'; choose one of algo, shared_rmsprop, rmsprop, momentum_sgd, shared_adam "
    r"\(algo: the algorithm's own\)$"
)


@pytest.mark.parametrize(
    "algo, options, message",
    [
        ("dqn", {"arch": "grad_parallel"}, "replay.*data_parallel"),
        ("a2c", {"arch": "grad_parallel", "workers": 0}, "--workers"),
        ("a2c", {"arch": "grad_parallel", "grad_sets": -1}, "--grad-sets"),
        # a set of k gradients past the budget: a run of 1000 steps took 131,200 for one optimizer step
        ("a2c", {"arch": "grad_parallel", "grad_sets": 1025}, "--grad-sets=1025 is out of range"),
        (
            "a2c",
            {"arch": "grad_parallel", "grad_sets": 10, "steps": 1000},
            r"--grad-sets 10: one optimizer step sums 10 gradients of 128 steps each, 1280 steps, more than the run's",
        ),
        ("a2c", {"arch": "grad_parallel", "optimizer": "adagrad"}, "unknown optimizer"),
        # the algorithm's own is `algo`, not its name: the line lists every choice
        *[("a2c", {"arch": arch, "optimizer": "adam"}, UNKNOWN_ADAM) for arch in ("async_grad", "param_server")],
        ("a2c", {"arch": "data_parallel", "workers": 0}, "--workers"),
        ("dqn", {"arch": "data_parallel", "workers": -1}, "--workers"),
        ("a2c", {"arch": "data_parallel", "max_restarts": -1}, "--max-restarts"),
        # one gradient per segment: PPO's epochs and minibatches (and PG's) cannot run as designed there
        ("ppo", {"arch": "grad_parallel"}, r"ppo's update takes 10 epoch.*one gradient per segment.*data_parallel"),
        ("pg", {"arch": "grad_parallel"}, r"pg's update takes 2 epoch.*--set epochs=1 --set minibatch_size=\d+"),
    ],
)
def test_bad_parallel_options_are_clear_errors(tmp_path, algo, options, message):
    with pytest.raises(ConfigError, match=message):
        train(algo, "CartPole-v1", logdir=str(tmp_path), progress=False, **options)
    assert not any(tmp_path.iterdir())  # nothing written


ON_POLICY = ["a2c", "a3c", "pg", "ppo", "onestep_q", "sarsa", "nstep_q"]
ONE_GRADIENT = {"pg": {"epochs": 1, "minibatch_size": 0}, "ppo": {"epochs": 1, "minibatch_size": 1024}}


@pytest.mark.parametrize(
    "algo, arch", [(a, "data_parallel") for a in [*ON_POLICY, "dqn"]] + [(a, "grad_parallel") for a in ON_POLICY]
)
def test_every_algorithm_runs_serially_on_both_architectures(algo, arch, run_opts):
    overrides = {"learning_starts": 100} if algo == "dqn" else {}
    if arch == "grad_parallel":
        overrides = ONE_GRADIENT.get(algo, {})
    r = train(algo, "CartPole-v1", arch=arch, workers=2, backend="serial", steps=600, eval_every=600, eval_episodes=2,
              stop_return=1e9, overrides=overrides, **run_opts).result  # fmt: skip
    assert r["env_steps"] >= 600 and r["updates"] > 0 and r["eval_return_mean"] is not None


def test_transition_blocks_carry_recurrent_states_for_sequence_replay(run_opts):
    block = TransitionBlock(3)
    zeros = np.zeros(2)
    for t in range(3):
        state = None if t == 0 else (torch.full((2, 4), float(t)), torch.full((2, 4), -float(t)))
        block.add(np.zeros((2, 1)), zeros, zeros, np.zeros((2, 1)), zeros > 0, zeros > 0, state=state)
    np.testing.assert_array_equal(block.data["h"][:, 0, 0], [0.0, 1.0, 2.0])  # None (a run's first step): zeros
    np.testing.assert_array_equal(block.data["c"][:, 1, 3], [0.0, -1.0, -2.0])
    r = train("dqn", "rlfleet/CartPoleNoVel-v1", arch="data_parallel", workers=2, backend="serial", steps=600,
              eval_every=600, eval_episodes=2, stop_return=1e9, **run_opts,
              overrides={"lstm": 8, "learning_starts": 100, "batch_size": 4, "gradient_steps": 2}).result  # fmt: skip
    assert r["env_steps"] >= 600 and r["updates"] > 0


def test_grad_parallel_counts_only_the_steps_behind_applied_gradients(run_opts):
    """With k = 2 gradient sets, a stop after the first gradient drops it: the run has taken no step that it
    learned from, and its checkpoint says so (a resume repeats those steps, so counts and resume agree)."""
    stop_after_first = [lambda info: True]
    r = train("a2c", "CartPole-v1", arch="grad_parallel", workers=2, grad_sets=2, backend="serial", steps=10_000,
              callbacks=stop_after_first, name="first", **run_opts).result  # fmt: skip
    assert r["updates"] == 0 and r["env_steps"] == 0 and r["stopped_by"] == "interrupted"
    assert load_checkpoint(r["checkpoint"])["env_steps"] == 0
    three_updates = [lambda info: info["trainer"].state["updates"] >= 3]
    r = train("a2c", "CartPole-v1", arch="grad_parallel", workers=2, grad_sets=2, backend="serial", steps=10_000,
              callbacks=three_updates, name="second", **run_opts).result  # fmt: skip
    a2c = build_algo_config("a2c", None, {})[0]
    assert r["updates"] == 3 and r["env_steps"] == 3 * 2 * a2c.rollout_len * a2c.n_envs


@pytest.mark.parametrize("arch", ["hogwild", "data_parallel", "grad_parallel"])
def test_a_resumed_run_seeds_its_workers_anew(arch, run_opts, tmp_path):
    """Workers of a resumed run are incarnation 0 again: with the first run's seeds they would replay its first
    episodes and exploration. Each resume draws new ones."""
    train("a2c", "CartPole-v1", arch=arch, workers=2, backend="serial", steps=1_000, name="r", **run_opts)
    payload = load_checkpoint(tmp_path / "r")
    cfg = RunConfig(**payload["run_config"])
    fresh = runner_class(arch)(cfg, run_dir=tmp_path / "fresh")
    resumed = runner_class(arch)(cfg, resume_from=payload, run_dir=tmp_path / "r")
    seeds = {fresh.spec.worker_seed(w, 0) for w in range(2)}
    assert seeds.isdisjoint(resumed.spec.worker_seed(w, 0) for w in range(2))
    assert resumed.spec.resumes == 1 and resumed._payload(with_data=False)[arch]["resumes"] == 1
    for runner in (fresh, resumed):
        runner.eval_envs.close()


def test_a_checkpoint_of_another_version_s_run_config_is_one_line_on_resume_and_eval(run_opts, tmp_path):
    """A checkpoint whose run config has fields this version does not know (the architectures' options among the
    run's fields, as an early layout had them) or lacks one it has is one CheckpointError naming them, on
    `--resume` as on `eval`, and the run folder is left as it was."""
    from rlfleet.run.checkpoint import CheckpointError
    from rlfleet.run.evaluate import evaluate_checkpoint

    train("a2c", "CartPole-v1", arch="grad_parallel", workers=2, grad_sets=1, backend="serial", steps=600,
          eval_every=600, eval_episodes=1, name="r", **run_opts)  # fmt: skip
    path = tmp_path / "r" / "checkpoints" / "latest.pt"
    payload = load_checkpoint(path)
    old = {k: v for k, v in payload["run_config"].items() if k not in ("options", "eval_max_steps")}
    save_checkpoint(path, {**payload, "run_config": {**old, "workers": 2, "serial": True}})
    before = {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file()}
    line = (
        r"^checkpoint .*r(/checkpoints/latest.pt)? was written by another version of rlfleet: its run config "
        r"lacks eval_max_steps, options and has serial, workers, unknown to this version$"
    )
    with pytest.raises(CheckpointError, match=line):
        train(resume=tmp_path / "r", steps=1_200, progress=False)
    with pytest.raises(CheckpointError, match=line):
        evaluate_checkpoint(path, episodes=1)
    assert {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file()} == before


def test_async_gradients_are_grad_parallel_with_one_gradient_per_step(run_opts):
    """`async_grad` applies each gradient as it arrives: on the serial backend, with one seed, it ends exactly where
    `grad_parallel --grad-sets 1` does (the same gradients, the same steps, the same weights)."""
    common = dict(workers=2, backend="serial", steps=2_000, eval_every=2_000, eval_episodes=1, stop_return=1e9)
    runs = {arch: train("a2c", "CartPole-v1", arch=arch, name=arch, **common, **run_opts)
            for arch in ("async_grad", "grad_parallel")}  # fmt: skip
    # grad_parallel's default sums one gradient of each worker per step: half the steps of async_grad
    assert runs["grad_parallel"]["updates"] * 2 == runs["async_grad"]["updates"]
    runs["grad_parallel"] = train("a2c", "CartPole-v1", arch="grad_parallel", grad_sets=1, name="k1", **common,
                                  **run_opts)  # fmt: skip
    a, b = (load_checkpoint(runs[k]["checkpoint"]) for k in ("async_grad", "grad_parallel"))
    assert runs["async_grad"]["updates"] == runs["grad_parallel"]["updates"] > 0
    for key, value in a["algo"]["model"].items():
        assert torch.equal(value, b["algo"]["model"][key]), key
    with pytest.raises(ConfigError, match="--grad-sets is an option of grad_parallel, not of async_grad"):
        train("a2c", "CartPole-v1", arch="async_grad", grad_sets=2, **run_opts)


# the algorithm's own optimizer as its single-process update builds it (`make_optimizer`): class and hyperparameters
OWN_OPTIMIZERS = {
    "a2c": (torch.optim.RMSprop, {"alpha": 0.99, "eps": 1e-5, "momentum": 0, "centered": False}),
    "ppo": (torch.optim.Adam, {"eps": 1e-5, "betas": (0.9, 0.999), "amsgrad": False}),
    "nstep_q": (torch.optim.Adam, {"eps": 1e-5, "betas": (0.9, 0.999)}),
}


def centre_runner(algo: str, arch: str, tmp_path, **options):
    """A centre (not started) of a serial run of `algo` on `arch`: its optimizer and shared networks."""
    cfg = RunConfig(algo, "CartPole-v1", arch=arch, options={"workers": 1, "backend": "serial", **options},
                    overrides=ONE_GRADIENT.get(algo, {}), steps=10_000, stop_return=1e9, logdir=str(tmp_path),
                    progress=False)  # fmt: skip
    return runner_class(arch)(cfg, run_dir=tmp_path / f"{algo}-{arch}")


@pytest.mark.parametrize("arch", ["async_grad", "grad_parallel"])
@pytest.mark.parametrize("algo", list(OWN_OPTIMIZERS))
def test_the_centre_steps_with_the_algorithms_own_optimizer_by_default(algo, arch, tmp_path):
    """RLlib's AsyncGradientsOptimizer applies each gradient with the policy's own optimizer, and Lapan's centre steps
    the agent's own Adam: by default the centre's optimizer is a fresh one of the algorithm's class with the
    algorithm's hyperparameters (PPO: Adam with ε 1e-5; A2C: RMSprop with α 0.99, ε 1e-5 outside the root, not the
    A3C paper's Shared RMSProp), over the shared parameters."""
    runner = centre_runner(algo, arch, tmp_path)
    try:
        cls, hyper = OWN_OPTIMIZERS[algo]
        own, centre = runner.algo.optimizer, runner.optimizer
        assert runner.opts.optimizer == "algo"
        assert type(centre) is type(own) and isinstance(centre, cls) and centre is not own
        group, own_group = centre.param_groups[0], own.param_groups[0]
        assert {k: group[k] for k in hyper} == hyper and group["lr"] == runner.algo_cfg.lr
        assert {k: group[k] for k in own.defaults} == {k: own_group[k] for k in own.defaults}
        shared = trainable_params(runner.shared)
        assert len(centre.param_groups) == 1 and len(group["params"]) == len(shared)
        assert all(a is b for a, b in zip(group["params"], shared, strict=True))
    finally:
        runner.eval_envs.close()


def test_which_architectures_step_with_the_algorithms_own_optimizer_by_default():
    """async_grad, grad_parallel, param_server: the algorithm's own (RLlib's, Lapan's); hogwild: the A3C paper's
    Shared RMSProp, as before."""
    defaults = {arch: runner_class(arch).Options().optimizer for arch in
                ("async_grad", "grad_parallel", "param_server", "hogwild")}  # fmt: skip
    assert defaults == {"async_grad": "algo", "grad_parallel": "algo", "param_server": "algo",
                        "hogwild": "shared_rmsprop"}  # fmt: skip


@pytest.mark.parametrize("algo", list(OWN_OPTIMIZERS))
def test_one_async_grad_step_with_one_worker_is_the_algorithms_own_update(algo, run_opts, tmp_path):
    """A serial async_grad run with one worker, stopped after its first step, ends with the weights and optimizer
    state of the algorithm's own single-process `update` on that worker's segment (from the same start): bit for
    bit for A2C and n-step Q (one loss on the segment in the same order), to float tolerance for PPO (one
    minibatch of the whole segment, shuffled)."""
    one_step = [lambda info: info["trainer"].state["updates"] >= 1]
    result = train(algo, "CartPole-v1", arch="async_grad", workers=1, backend="serial", steps=10_000,
                   overrides=ONE_GRADIENT.get(algo, {}), callbacks=one_step, name="run", **run_opts).result  # fmt: skip
    assert result["updates"] == 1
    saved = load_checkpoint(result["checkpoint"])
    # the same start (the run's seed) and the same segment (worker 0's seed), then the algorithm's own update
    fresh = centre_runner(algo, "async_grad", tmp_path)
    worker = GradientWorker(fresh.spec, fresh.shared, fresh.weights, 0)
    try:
        _, segment = worker.collect(global_steps=0)
        reference = fresh.build_algo(fresh.cfg.seed)
        reference.load_state_dict(fresh.algo.state_dict())
        reference.schedule(0, fresh.total_steps)
        reference.update(segment)
    finally:
        worker.close()
        fresh.eval_envs.close()
    exact = {"rtol": 1e-5, "atol": 1e-7} if algo == "ppo" else {"rtol": 0, "atol": 0}  # ppo: 1 in 256 off by 1 ulp
    network = "q" if algo == "nstep_q" else "model"
    start, weights = fresh.algo.state_dict()[network], reference.state_dict()[network]
    assert any(not torch.equal(start[key], value) for key, value in weights.items())  # the update moved them
    for key, value in weights.items():
        torch.testing.assert_close(saved["algo"][network][key], value, **exact)
    ours, theirs = saved["async_grad"]["optimizer"]["state"], reference.optimizer.state_dict()["state"]
    assert sorted(ours) == sorted(theirs) and ours
    for index, state in theirs.items():
        assert sorted(ours[index]) == sorted(state)
        for key, value in state.items():
            torch.testing.assert_close(ours[index][key], value, **exact)


def test_async_gradients_policy_lag_is_at_most_workers_minus_one_on_average_over_the_run(run_opts, monkeypatch):
    """With one credit a worker's intervals from its read of the weights to its step do not overlap, and each step
    in one is another worker's: the lags of a run sum to at most (workers - 1) x steps, whatever the timing (worker
    processes here). One gradient's lag is not bounded: a fast worker may step several times during a slow one's
    segment (a 2-worker run logged policy_lag_max 10)."""
    from rlfleet.arch.grad_parallel import GradParallelRunner

    lags = []
    step = GradParallelRunner.step

    def step_and_record(self, items):
        lags.extend(self.weights.version - item.version for item in items)
        return step(self, items)

    monkeypatch.setattr(GradParallelRunner, "step", step_and_record)
    workers = 3
    result = train("a2c", "CartPole-v1", arch="async_grad", workers=workers, backend="local", steps=6_000,
                   eval_every=6_000, eval_episodes=1, stop_return=1e9, **run_opts)  # fmt: skip
    assert len(lags) == result["updates"] > 0
    assert sum(lags) <= (workers - 1) * len(lags), (np.mean(lags), max(lags))
    assert min(lags) >= 0


def test_param_server_with_one_shard_is_async_gradients_and_sharding_changes_nothing(run_opts):
    """A worker pulls the shards, clips its whole gradient and pushes shard i to server i: on the serial backend
    with one seed, one server ends exactly where `async_grad` does, and 2 or 3 servers exactly where one does
    (every --optimizer is elementwise; the default here is a2c's own RMSprop, whose square averages are compared)."""
    common = dict(workers=2, backend="serial", steps=2_000, eval_every=1_000, eval_episodes=1, stop_return=1e9)
    runs = {"async_grad": train("a2c", "CartPole-v1", arch="async_grad", name="async", **common, **run_opts)}
    for shards in (1, 2, 3):
        runs[shards] = train("a2c", "CartPole-v1", arch="param_server", shards=shards, name=f"ps{shards}", **common,
                             **run_opts)  # fmt: skip
    saved = {k: load_checkpoint(r["checkpoint"]) for k, r in runs.items()}
    assert runs[1]["updates"] == runs["async_grad"]["updates"] > 0
    for other in ("async_grad", 2, 3):
        assert runs[other]["updates"] == runs[1]["updates"] and runs[other]["env_steps"] == runs[1]["env_steps"]
        for key, value in saved[1]["algo"]["model"].items():
            assert torch.equal(value, saved[other]["algo"]["model"][key]), (other, key)
    optimizer = saved["async_grad"]["async_grad"]["optimizer"]["state"]  # a2c's RMSprop: its square averages
    square_avg = torch.cat([optimizer[i]["square_avg"].flatten() for i in sorted(optimizer)])
    for shards in (1, 2, 3):
        assert torch.equal(saved[shards]["param_server"]["optimizer"]["state"][0]["square_avg"], square_avg)
    assert saved[3]["param_server"]["version"] == runs[3]["updates"]


@pytest.mark.parametrize("optimizer", ["shared_rmsprop", "algo"])
def test_param_server_with_a_target_network_is_async_gradients(optimizer, run_opts):
    """nstep_q's target network is copied every `target_update_every` global steps: by async_grad's centre at its
    step, by a param_server worker before its push (to server 0). Both end with the same networks: bit for bit with
    the Shared RMSProp; with nstep_q's own Adam (`algo`, the default) to float rounding, since torch's fused Adam
    kernel rounds a tensor's last elements that do not fill a vector (its scalar tail) differently, and a shard
    ends where a parameter does not. The servers' Adam state, merged, is the centre's."""
    common = dict(workers=2, backend="serial", steps=3_000, eval_every=3_000, eval_episodes=1, stop_return=1e9,
                  overrides={"target_update_every": 500}, optimizer=optimizer)  # fmt: skip
    a = train("nstep_q", "CartPole-v1", arch="async_grad", name="async", **common, **run_opts)
    b = train("nstep_q", "CartPole-v1", arch="param_server", shards=2, name="ps", **common, **run_opts)
    saved_a, saved_b = load_checkpoint(a["checkpoint"]), load_checkpoint(b["checkpoint"])
    sa, sb = saved_a["algo"], saved_b["algo"]
    assert int(sa["target_clock"]["synced_at"]) >= 2_500  # copied several times
    exact = {"rtol": 0, "atol": 0} if optimizer == "shared_rmsprop" else {"rtol": 1e-4, "atol": 1e-6}
    assert a["updates"] == b["updates"] > 0
    for part in ("q", "q_target", "target_clock"):
        for key, value in sa[part].items():
            torch.testing.assert_close(value, sb[part][key], **exact, msg=lambda m, k=(part, key): f"{k}: {m}")
    assert not torch.equal(sa["q"][next(iter(sa["q"]))], sa["q_target"][next(iter(sa["q_target"]))])
    if optimizer == "algo":
        centre = saved_a["async_grad"]["optimizer"]["state"]
        servers = saved_b["param_server"]["optimizer"]["state"][0]
        assert int(servers["step"]) == int(centre[0]["step"]) == b["updates"]
        for key in ("exp_avg", "exp_avg_sq"):
            whole = torch.cat([centre[i][key].flatten() for i in sorted(centre)])
            torch.testing.assert_close(servers[key], whole, rtol=1e-4, atol=1e-7)


def test_param_server_resumes_its_servers_from_the_checkpoint(run_opts, tmp_path):
    """The checkpoint holds the servers' optimizer states as one (split again over the shards on resume) and their
    version; the resumed servers go on from there."""
    common = dict(workers=2, backend="serial", stop_return=1e9, eval_every=1_024, **run_opts)
    first = train("a2c", "CartPole-v1", arch="param_server", shards=3, steps=1_024, name="r", **common).result
    saved = load_checkpoint(tmp_path / "r")["param_server"]
    assert saved["version"] == first["updates"] == 8 and int(saved["optimizer"]["state"][0]["step"]) == 8
    assert saved["optimizer"]["state"][0]["square_avg"].abs().min() > 0  # every shard's part is there
    resumed = train(resume=tmp_path / "r", steps=2_048, progress=False).result
    again = load_checkpoint(tmp_path / "r")["param_server"]
    assert resumed["updates"] == 16 and again["version"] == 16
    assert int(again["optimizer"]["state"][0]["step"]) == 16  # the servers' optimizers went on from the checkpoint


def test_a_restarted_param_server_and_the_others_go_on_from_one_snapshot(run_opts, monkeypatch):
    """Server 1 dies (on the serial backend: replaced by a new one, as the local backend's restart does) four pushes
    after the coordinator's last snapshot: it restarts from the snapshot and every other server is rolled back to
    it, so all shards are of one version, the snapshot's, and the run goes on from there."""
    from rlfleet.arch.param_server import ParamServerRunner
    from rlfleet.backends import serial
    from rlfleet.backends.base import Crash

    crash_at = 12  # the coordinator's pass (one item each): 8 pushes at the snapshot of step 1,024, then 4 more
    services_init = serial.SerialServices.__init__

    def init(self, make_service, n):
        services_init(self, make_service, n)
        self.make_service, self.checks = make_service, 0

    def check(self):
        self.checks += 1
        if self.checks != crash_at:
            return []
        self.handles[1].service = self.make_service(1, 1)
        self.restarts += 1
        return [Crash(1, -9, None, "server")]

    seen = {}
    restart = ParamServerRunner.restart_crashed_servers

    def restart_and_look(self):
        before = [h.submit("state").result().version for h in self.services.handles]
        restart(self)
        if self.services.checks == crash_at:
            states = [h.submit("state").result() for h in self.services.handles]
            snapshot = torch.cat([s.params for s in self.servers.states])
            seen.update(before=before, versions=[s.version for s in states], snapshot=self.servers.states[0].version,
                        same=torch.equal(torch.cat([s.params for s in states]), snapshot))  # fmt: skip

    monkeypatch.setattr(serial.SerialServices, "__init__", init)
    monkeypatch.setattr(serial.SerialServices, "check", check)
    monkeypatch.setattr(ParamServerRunner, "restart_crashed_servers", restart_and_look)
    result = train("a2c", "CartPole-v1", arch="param_server", shards=3, workers=2, backend="serial", steps=2_048,
                   eval_every=1_024, eval_episodes=1, stop_return=1e9, **run_opts)  # fmt: skip
    assert seen["before"] == [12, 12, 12] and seen["snapshot"] == 8  # the crash came 4 pushes after the snapshot
    assert seen["versions"] == [8, 8, 8] and seen["same"]  # every shard back at the snapshot
    assert result["env_steps"] >= 2_048
    # the 4 pushes undone are not counted: updates are the optimizer steps the weights carry (they were 4 more)
    assert load_checkpoint(result["checkpoint"])["param_server"]["version"] == result["updates"]


@pytest.mark.parametrize(
    "shards, problem",
    [
        (0, r"^--shards=0 is out of range: must be in \[1, 1024\]$"),
        (10**9, r"^--shards=1000000000 is out of range: must be in \[1, 1024\]$"),
        (1000, "^--shards 1000 is more than the [0-9]+ trainable parameters of a2c.s networks; use 1 to [0-9]+$"),
    ],
)
def test_param_server_refuses_a_shard_count_it_cannot_split(shards, problem, run_opts):
    """(a2c with 2 hidden units has fewer parameters than 1,000.)"""
    with pytest.raises(ConfigError, match=problem):
        train("a2c", "CartPole-v1", arch="param_server", shards=shards, backend="serial", overrides={"hidden": "2"},
              **run_opts)  # fmt: skip


def test_param_server_refuses_an_own_optimizer_that_is_not_elementwise(monkeypatch, run_opts, tmp_path):
    """A server steps its shard on its own: the algorithm's own optimizer must be elementwise (Adam, RMSprop, SGD
    are); one that is not (L-BFGS here) is refused before anything starts, and another --optimizer runs (the
    algorithm's own optimizer is then not used: setting it is refused, see tests/smoke/test_cli.py)."""
    from rlfleet.optim import make

    monkeypatch.setitem(make.OPTIMIZERS, "sgd", torch.optim.LBFGS)
    with pytest.raises(ConfigError, match="^param_server's servers step each shard on its own, which takes an "
                                          "elementwise optimizer; a2c's LBFGS is not known to be one: choose "
                                          r"another --optimizer \(shared_rmsprop, "):  # fmt: skip
        train("a2c", "CartPole-v1", arch="param_server", backend="serial", overrides={"optimizer": "sgd"}, **run_opts)
    assert not any(tmp_path.iterdir())  # nothing written
    r = train("a2c", "CartPole-v1", arch="param_server", backend="serial", optimizer="shared_rmsprop", steps=600,
              eval_every=600, eval_episodes=1, stop_return=1e9, **run_opts).result  # fmt: skip
    assert r["updates"] > 0


def test_param_server_refuses_a_backend_without_services(monkeypatch, run_opts):
    monkeypatch.setattr(SerialBackend, "has_services", False)
    with pytest.raises(ConfigError, match="^param_server's servers are backend services, which the serial backend "
                                          "does not start; use --backend local, ray$"):  # fmt: skip
        train("a2c", "CartPole-v1", arch="param_server", backend="serial", **run_opts)


STALLS = {  # architecture: (the role that sends its items, workers, the stall report)
    "data_parallel": (Sampler, 2, "no experience from the samplers for 0 s (2 alive)"),
    "grad_parallel": (GradientWorker, 2, "no gradient from the workers for 0 s (2 alive)"),
    "async_grad": (GradientWorker, 2, "no gradient from the workers for 0 s (2 alive)"),
    "param_server": (ShardWorker, 2, "no item from the workers for 0 s (2 alive)"),
    "allreduce": (AllReduceLearner, 1, "no item from the learners for 0 s (1 alive)"),
}


@pytest.mark.parametrize("arch", list(STALLS))
def test_a_coordinator_reports_a_stall_naming_what_it_waits_for_and_runs_on(arch, monkeypatch, run_opts, tmp_path):
    """Roles whose first two calls bring nothing (with no stall allowed): two reports in workers.log, then the
    items come and the run ends at its budget."""
    role, workers, message = STALLS[arch]
    monkeypatch.setattr(parallel, "STALL_S", 0.0)
    produce, calls = role.produce, []

    def late(self, global_steps, stop=None):
        calls.append(global_steps)
        return None if len(calls) <= 2 else produce(self, global_steps, stop)

    monkeypatch.setattr(role, "produce", late)
    r = train("a2c", "CartPole-v1", arch=arch, workers=workers, backend="serial", steps=600, eval_every=600,
              eval_episodes=1, stop_return=1e9, name="r", **run_opts).result  # fmt: skip
    assert r["stopped_by"] == "steps" and r["env_steps"] >= 600
    assert (tmp_path / "r" / "workers.log").read_text().splitlines() == [f"[step 0] {message}"] * 2

"""Learners on a GPU (skipped on a machine without CUDA): every algorithm on every architecture that takes a device
updates there; an update on the GPU equals the CPU's to float tolerance; updates replayed as CUDA graphs equal eager
ones; PPO and DQN solve CartPole-v1 and SAC and TD3 Pendulum-v1 with the learner on the GPU; a run trained there
evaluates, and resumes, on the CPU.

    pytest tests/gpu -m "gpu" -p no:cacheprovider
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from device_cases import CASES, PROCESSES, case_id, run_case

from rlfleet import train
from rlfleet.algos import resolve
from rlfleet.cuda_graph import StepGraph
from rlfleet.data.batch import Batch
from rlfleet.device import acting, read_metrics
from rlfleet.optim.make import make_optimizer
from rlfleet.optim.step import optimize, set_gradient_hook
from rlfleet.run.evaluate import evaluate_checkpoint

GPU = "cuda"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("case", CASES + PROCESSES, ids=case_id)
def test_every_algorithm_updates_on_the_gpu(case, run_opts):
    result = run_case(train, case, "cuda", run_opts)  # every tensor of the learner's networks on the GPU
    assert result["device"].startswith("cuda")


def test_parameter_servers_step_their_shards_on_the_gpu(run_opts):
    """param_server's servers (processes of their own) hold their shards and optimizer state on the GPU; the CPU
    workers' pulls and pushes cross in host memory, and the coordinator's snapshot is on the CPU."""
    result = train("a2c", "CartPole-v1", arch="param_server", workers=2, shards=2, steps=800, device="cuda",
                   eval_episodes=2, eval_max_steps=50, **run_opts)  # fmt: skip
    assert result["device"].startswith("cuda") and result["updates"] > 0
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in result.algo.params)


@pytest.mark.atari
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_cnn_learner_acts_and_learns_on_the_gpu(algo, run_opts):
    pytest.importorskip("ale_py")
    small = {"ppo": {"rollout_len": 32, "minibatch_size": 32}, "dqn": {"learning_starts": 100, "buffer_size": 500}}
    result = train(
        algo, "ALE/Pong-v5", steps=600, n_envs=2, device="auto", eval_episodes=2, eval_max_steps=100,
        overrides=small[algo], **run_opts,
    )  # fmt: skip
    assert result["device"].startswith("cuda")  # auto: a CNN learner takes the GPU


def _params(result) -> list[torch.Tensor]:
    algo = result.algo
    return [t.detach().cpu() for m in vars(algo).values() if isinstance(m, torch.nn.Module) for t in m.parameters()]


def _batch(algo: str, rng: np.random.Generator) -> tuple[str, gym.Space, gym.Space, Batch]:
    """A batch of the kind each algorithm's update takes, on CartPole's (ppo, dqn) or Pendulum's (sac) sizes."""
    if algo == "sac":
        obs_space, act_space, n = gym.spaces.Box(-8, 8, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32), 256
        act = rng.uniform(-2, 2, (n, 1)).astype(np.float32)
    else:
        obs_space, act_space, n = gym.spaces.Box(-4, 4, (4,), np.float32), gym.spaces.Discrete(2), 64
        act = rng.integers(2, size=n)
    obs = rng.standard_normal((n, *obs_space.shape)).astype(np.float32)
    if algo == "ppo":
        fields = dict(
            logp=np.full(n, -0.69, np.float32),
            value=rng.standard_normal(n).astype(np.float32),
            adv=rng.standard_normal(n).astype(np.float32),
            ret=rng.standard_normal(n).astype(np.float32),
        )
    else:
        fields = dict(
            rew=rng.standard_normal(n).astype(np.float32),
            next_obs=obs[::-1].copy(),
            terminated=np.zeros(n, np.float32),
            discount=np.full(n, 0.99, np.float32),
            weight=np.ones(n, np.float32),
        )
    return obs_space, act_space, Batch(obs=obs, act=act, **fields)  # fmt: skip


@pytest.mark.parametrize("algo", ["ppo", "dqn", "sac"])
def test_a_gpu_update_equals_the_cpu_update(algo, monkeypatch):
    """The same networks and batch on each device: every optimizer step of one update sees the same gradients,
    and the update reports the same losses, to float tolerance (a GPU sums in another order). The weights after
    it are compared loosely: Adam's first step moves a weight by about lr·g/|g|, which a rounding difference in a
    gradient near 0 can flip."""
    cpu_draws = torch.Generator()

    def randn_like(x, **kwargs):  # the same normal draws on both devices (SAC samples its actions in the update)
        return torch.randn(x.shape, generator=cpu_draws, dtype=x.dtype).to(x.device)

    monkeypatch.setattr(torch, "randn_like", randn_like)
    obs_space, act_space, batch = _batch(algo, np.random.default_rng(0))
    algo_cls, config_cls, _, _ = resolve(algo)
    grads, metrics = {}, {}
    for device in ("cpu", GPU):
        torch.manual_seed(0)
        cpu_draws.manual_seed(0)
        learner = algo_cls(config_cls(), obs_space, act_space, seed=0, device=device)
        seen = grads[device] = []
        set_gradient_hook(
            learner.optimizer,
            lambda params, seen=seen: seen.append([p.grad.to("cpu", copy=True) for p in params if p.grad is not None]),
        )
        if algo == "ppo":  # one minibatch step, as `minibatch_epochs` takes it
            loss, out = learner.loss(batch)
            optimize(learner.optimizer, loss, learner.params, learner.cfg.max_grad_norm)
        else:
            out = learner.update(batch)
        # the losses: floats on the CPU, 0-dim tensors on the GPU until read (`device.metric`); not DQN's priorities
        metrics[device] = read_metrics({k: v for k, v in out.items() if not np.shape(v)})
    assert len(grads["cpu"]) == len(grads[GPU]) > 0
    for cpu_step, gpu_step in zip(grads["cpu"], grads[GPU], strict=True):
        for a, b in zip(cpu_step, gpu_step, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert metrics["cpu"].keys() == metrics[GPU].keys() and any("loss" in k for k in metrics["cpu"])
    for key, value in metrics["cpu"].items():
        assert metrics[GPU][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_updates_replayed_as_a_cuda_graph_equal_eager_ones(algo):
    """Ten updates of a learner whose updates are captured as CUDA graphs (three eager ones of each kind, then a
    capture, then replays; TD3 has two kinds: with and without its delayed policy step) and of one whose updates
    all run eagerly, from the same networks, batches and CUDA seed: the same losses and the same networks after
    each (the replays draw the random numbers the eager updates do), and the CPU copy that acts has the
    learner's policy after every update."""
    algo_cls, config_cls, _, _ = resolve(algo)
    obs_space, act_space, _ = _batch("sac", np.random.default_rng(0))
    batches = [_batch("sac", np.random.default_rng(i))[2] for i in range(10)]
    losses, nets = {}, {}
    for graphed in (True, False):
        torch.manual_seed(0)
        learner = algo_cls(config_cls(), obs_space, act_space, seed=0, device=GPU)
        learner.graph.on = graphed  # the optimizer is made for the capture either way: the same kernels
        torch.cuda.manual_seed(1)
        losses[graphed] = []
        for b in batches:
            losses[graphed].append(float(learner.update(b)["critic_loss"]))
            for mine, its in zip(acting(learner.actor).parameters(), learner.actor.parameters(), strict=True):
                assert torch.equal(mine, its.cpu()), "the acting copy missed an update"
        nets[graphed] = _params(learner)
        if graphed:
            assert learner.graph.failed is None
            assert learner.graph.captures == {"sac": 1, "td3": 2}[algo]
    assert losses[True] == pytest.approx(losses[False], rel=1e-5, abs=1e-6)
    for a, b in zip(nets[True], nets[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ learning
SOLVE = {
    "ppo": ("CartPole-v1", 40_000),
    "dqn": ("CartPole-v1", 40_000),
    "sac": ("Pendulum-v1", 20_000),
    "td3": ("Pendulum-v1", 20_000),
}


@pytest.mark.learning
@pytest.mark.parametrize("algo", sorted(SOLVE))
def test_solves_with_the_learner_on_the_gpu(algo, run_opts):
    env, budget = SOLVE[algo]
    result = train(algo, env, seed=0, steps=budget, eval_every=2_000, device="cuda", **run_opts)
    r = result.result
    assert r["device"].startswith("cuda")
    assert r["solved"], f"{algo} on the GPU did not solve {env} in {budget} steps: eval {r['eval_return_mean']}"


# ------------------------------------------------------------------------------------------ across devices
def test_trained_on_the_gpu_evaluates_and_resumes_on_the_cpu(run_opts):
    kw = dict(seed=1, steps=4_096, eval_every=2_048, stop_return=1e9, **run_opts)
    trained = train("ppo", "CartPole-v1", device="cuda", name="gpu", **kw)
    saved = torch.load(trained.run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert all(t.is_cuda for t in saved["algo"]["model"].values())  # as trained; read back onto the CPU:
    result = evaluate_checkpoint(trained.run_dir, episodes=3)
    assert len(result["returns"]) == 3 and np.isfinite(result["return_mean"])
    resumed = train(resume=trained.run_dir, steps=6_144, device="cpu", progress=False)
    assert resumed["env_steps"] == 6_144 and resumed["device"] == "cpu"
    assert json.loads((trained.run_dir / "result.json").read_text())["device"] == "cpu"


def test_a_graphed_learner_resumes_across_devices(run_opts):
    """SAC's updates are CUDA graphs on the GPU, with a `capturable` optimizer that a checkpoint carries: a run
    trained on the GPU resumes on the CPU, and one trained on the CPU resumes on the GPU and captures its update."""
    small = {"learning_starts": 100, "random_steps": 100, "batch_size": 64}
    kw = dict(seed=3, steps=500, eval_every=500, eval_episodes=1, stop_return=1e9, overrides=small, **run_opts)
    gpu = train("sac", "Pendulum-v1", device="cuda", name="sac-gpu", **kw)
    assert gpu.algo.graph.captures == 1 and gpu.algo.graph.failed is None
    assert train(resume=gpu.run_dir, steps=700, device="cpu", progress=False)["env_steps"] == 700
    cpu = train("sac", "Pendulum-v1", device="cpu", name="sac-cpu", **kw)
    resumed = train(resume=cpu.run_dir, steps=700, device="cuda", progress=False)
    assert resumed["env_steps"] == 700 and resumed.algo.graph.captures == 1


RESUMED = {  # algo: env, steps, the step the first part stops at, overrides
    "ppo": ("CartPole-v1", 2_048, 1_024, {}),
    "sac": ("Pendulum-v1", 600, 300, {"learning_starts": 100, "random_steps": 100, "batch_size": 64}),
}


@pytest.mark.parametrize("algo", RESUMED)
def test_a_run_resumed_on_the_gpu_ends_where_an_uninterrupted_one_does(algo, run_opts):
    """PPO's draws are the CPU's; SAC draws its actions in each update on the GPU, from a generator the checkpoint
    carries, and replays its update as a CUDA graph."""
    env, steps, half, overrides = RESUMED[algo]
    kw = dict(seed=2, steps=steps, eval_every=half, checkpoint_every=half, stop_return=1e9, device="cuda",
              overrides=overrides, **run_opts)  # fmt: skip
    whole = train(algo, env, name="whole", **kw)
    again = train(algo, env, name="again", **kw)
    for a, b in zip(_params(whole), _params(again), strict=True):
        assert torch.equal(a, b), "two runs with the same seed differ on the GPU (nondeterministic kernels)"
    part = train(algo, env, name="part", callbacks=[lambda i: i["env_steps"] >= half], **kw)
    assert part["stopped_by"] == "interrupted"
    resumed = train(resume=part.run_dir, progress=False)
    for a, b in zip(_params(whole), _params(resumed), strict=True):
        assert torch.equal(a, b)


def test_a_step_that_reads_a_value_on_the_host_is_never_captured():
    """A step that reads a value on the host (here `float(loss)`) cannot be a CUDA graph, and a failed capture would
    leave the process's CUDA state in capture mode: the warm-up call before the capture sees the read (sync debug
    mode), a warning says so, nothing is captured, and every call runs eagerly, with the same result as eager
    steps. Random draws and freeing cached memory work afterwards, as they would not after a failed capture."""
    x = torch.ones(3, device=GPU)
    weights = {}
    for graphed in (True, False):
        graph = StepGraph(torch.device(GPU), enabled=graphed, warmup=1)
        p = torch.nn.Parameter(torch.ones(3, device=GPU))
        opt = make_optimizer("adam", [p], 0.1, **StepGraph(torch.device(GPU)).optimizer_options)

        def step(b, p=p, opt=opt):
            loss = (p * p * b.x * torch.rand_like(b.x)).sum()
            optimize(opt, loss, [p], None)
            return {"loss": float(loss)}

        torch.manual_seed(0)
        if graphed:
            with pytest.warns(RuntimeWarning, match="cannot be replayed as a CUDA graph .*synchronizes with the host"):
                for _ in range(4):
                    graph(step, Batch(x=x), opt)
            assert graph.failed and graph.captures == 0
        else:
            for _ in range(4):
                graph(step, Batch(x=x), opt)
        weights[graphed] = p.detach().cpu()
    torch.testing.assert_close(weights[True], weights[False])
    assert torch.isfinite(torch.randn(1, device=GPU)).all()
    torch.cuda.empty_cache()

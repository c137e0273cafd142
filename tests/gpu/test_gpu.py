"""Learners on a GPU (skipped on a machine without CUDA): every algorithm on every architecture that takes a device
updates there; an update on the GPU equals the CPU's to float tolerance; PPO and DQN solve CartPole-v1 and SAC
Pendulum-v1 with the learner on the GPU; a run trained there evaluates, and resumes, on the CPU.

    pytest tests/gpu -m "gpu" -p no:cacheprovider
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from device_cases import CASES, case_id, run_case

from rlfleet import train
from rlfleet.run.evaluate import evaluate_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_every_algorithm_updates_on_the_gpu(case, run_opts):
    result = run_case(train, case, "cuda", run_opts)
    assert result["device"].startswith("cuda")
    learner = result.algo
    tensors = [t for m in vars(learner).values() if isinstance(m, torch.nn.Module) for t in m.state_dict().values()]
    assert tensors and all(t.is_cuda for t in tensors)


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


# one update's worth of steps (ppo: 8 envs x 32 steps, 10 epochs of 4 minibatches), and a few for the replay ones
EQUAL = {
    "ppo": ("CartPole-v1", 256, {}),
    "dqn": ("CartPole-v1", 1_040, {"learning_starts": 1_000, "train_freq": 4}),
    "sac": ("Pendulum-v1", 310, {"learning_starts": 300, "random_steps": 300}),
}


@pytest.mark.parametrize("algo", sorted(EQUAL))
def test_a_gpu_update_equals_the_cpu_update(algo, run_opts, monkeypatch):
    env, steps, overrides = EQUAL[algo]
    cpu_draws = torch.Generator()

    def randn_like(x, **kwargs):  # the same normal draws on both devices (SAC samples its actions in the update)
        return torch.randn(x.shape, generator=cpu_draws, dtype=x.dtype).to(x.device)

    monkeypatch.setattr(torch, "randn_like", randn_like)
    runs = {}
    for device in ("cpu", "cuda"):
        cpu_draws.manual_seed(0)
        runs[device] = train(
            algo, env, steps=steps, seed=3, device=device, stop_return=1e9, eval_episodes=1, name=device,
            overrides=overrides, **run_opts,
        )  # fmt: skip
    assert runs["cpu"]["updates"] == runs["cuda"]["updates"] > 0
    for a, b in zip(_params(runs["cpu"]), _params(runs["cuda"]), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------ learning
SOLVE = {"ppo": ("CartPole-v1", 40_000), "dqn": ("CartPole-v1", 40_000), "sac": ("Pendulum-v1", 20_000)}


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


def test_a_run_resumed_on_the_gpu_ends_where_an_uninterrupted_one_does(run_opts):
    kw = dict(seed=2, steps=2_048, eval_every=1_024, checkpoint_every=1_024, stop_return=1e9, device="cuda")
    whole = train("ppo", "CartPole-v1", name="whole", **kw, **run_opts)
    part = train("ppo", "CartPole-v1", name="part", callbacks=[lambda i: i["env_steps"] >= 1_024], **kw, **run_opts)
    assert part["stopped_by"] == "interrupted"
    resumed = train(resume=part.run_dir, progress=False)
    for a, b in zip(_params(whole), _params(resumed), strict=True):
        assert torch.equal(a, b)

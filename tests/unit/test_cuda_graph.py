"""`StepGraph` off the GPU: a plain call, an optimizer made as before, copies without graphs. (What it does on CUDA,
capture and replay equal to eager updates, is `tests/gpu`'s.)"""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos import resolve
from rlfleet.cuda_graph import StepGraph
from rlfleet.data.batch import Batch

PENDULUM = gym.spaces.Box(-8, 8, (3,), np.float32), gym.spaces.Box(-2, 2, (1,), np.float32)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_off_cuda_a_step_is_a_plain_call(device):
    graph = StepGraph(torch.device(device))
    assert not graph.on and graph.optimizer_options == {}
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1)
    out = {"x": torch.ones(())}
    calls = []
    for _ in range(6):  # past the warm-up: nothing is captured off CUDA
        assert graph(lambda b: calls.append(b) or out, Batch(x=np.ones(2)), opt) is out
    assert len(calls) == 6 and graph.captures == 0


@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_the_replay_learners_take_the_setting_and_copy_without_graphs(algo):
    algo_cls, config_cls, _, _ = resolve(algo)
    learner = algo_cls(config_cls(cuda_graph=True), *PENDULUM, seed=0)
    assert not learner.graph.on  # on the CPU
    assert not any(g.get("capturable") for g in learner.optimizer.param_groups)
    learner.graph._graphs["kind"] = object()  # what a capture leaves: it belongs to the tensors it was made on
    learner.graph._eager["kind"] = 3
    for copied in (copy.deepcopy(learner), pickle.loads(pickle.dumps(learner))):
        assert copied.graph._graphs == {} and copied.graph._eager == {}
    assert "kind" in learner.graph._graphs


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_a_checkpoint_of_a_graphed_gpu_learner_resumes_on_the_cpu(algo):
    """A GPU learner's optimizer is `capturable`, which a CPU optimizer cannot step with, and a checkpoint carries its
    options: loading it on the CPU makes the optimizer the CPU's again, and the next update steps."""
    algo_cls, config_cls, _, _ = resolve(algo)
    saved = algo_cls(config_cls(), *PENDULUM, seed=0).state_dict()
    for group in saved["optimizer"]["param_groups"]:
        group["capturable"] = True  # as a learner on CUDA saves it
    learner = algo_cls(config_cls(), *PENDULUM, seed=0)
    learner.load_state_dict(saved)
    assert not any(g["capturable"] for g in learner.optimizer.param_groups)
    rng, n = np.random.default_rng(0), 32
    obs = rng.standard_normal((n, 3)).astype(np.float32)
    batch = Batch(
        obs=obs, act=rng.uniform(-2, 2, (n, 1)).astype(np.float32), rew=np.zeros(n, np.float32), next_obs=obs,
        terminated=np.zeros(n, np.float32), discount=np.full(n, 0.99, np.float32), weight=np.ones(n, np.float32),
    )  # fmt: skip
    for _ in range(2):  # the second: Adam's state exists (the first makes it)
        assert np.isfinite(float(learner.update(batch)["critic_loss"]))


def test_a_graph_needs_a_warm_up_call():
    with pytest.raises(ValueError, match="at least one eager call"):
        StepGraph(torch.device("cpu"), warmup=0)

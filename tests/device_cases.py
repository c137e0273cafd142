"""The runs that check a learner on a device: every algorithm (and the variants with code paths of their own: LSTM,
gSDE) on `single`, the architectures with a central learner with a rollout and a replay algorithm each, and
allreduce and gossip learners (in the test's process, with the serial backend: a meta tensor's reads are only stood
in for there). Run with the learner on `meta` by `tests/unit/test_device.py` (every machine) and on CUDA by `tests/gpu`
(a GPU's, which also runs allreduce and gossip learners in processes of their own)."""

from __future__ import annotations

import torch

STEPS = 400
LEARN_SOON = {"learning_starts": 100}  # replay: updates within STEPS (the defaults start at 1,000 steps or later)
ACT_AND_LEARN_SOON = {**LEARN_SOON, "random_steps": 100}  # and the policy acts after uniform actions
SINGLE = [
    ("pg", "CartPole-v1", {}),
    ("a2c", "CartPole-v1", {}),
    ("a3c", "CartPole-v1", {"arch": "single"}),
    ("ppo", "CartPole-v1", {}),
    ("ppo", "CartPole-v1", {"overrides": {"lstm": 16, "epochs": 1, "rollout_len": 8}}),  # meta ops are slow
    ("ppo", "Pendulum-v1", {"overrides": {"sde": True}}),
    ("dqn", "CartPole-v1", {"overrides": LEARN_SOON}),
    ("dqn", "CartPole-v1", {"preset": "lstm", "overrides": LEARN_SOON}),
    ("onestep_q", "CartPole-v1", {}),
    ("sarsa", "CartPole-v1", {}),
    ("nstep_q", "CartPole-v1", {}),
    ("ddpg", "Pendulum-v1", {"overrides": ACT_AND_LEARN_SOON}),
    ("td3", "Pendulum-v1", {"overrides": ACT_AND_LEARN_SOON}),
    ("sac", "Pendulum-v1", {"overrides": ACT_AND_LEARN_SOON}),
    ("sac", "Pendulum-v1", {"overrides": {"sde": True, **ACT_AND_LEARN_SOON}}),
]
CENTRAL = [
    ("ppo", "CartPole-v1", {"arch": "data_parallel", "workers": 2}),
    ("dqn", "CartPole-v1", {"arch": "data_parallel", "workers": 2, "overrides": {"learning_starts": 100}}),
    ("a2c", "CartPole-v1", {"arch": "grad_parallel", "workers": 2}),
    ("a2c", "CartPole-v1", {"arch": "async_grad", "workers": 2}),
    ("dqn", "CartPole-v1", {"arch": "apex", "actors": 2, "steps": 800, "overrides": {"learning_starts": 200}}),
    ("td3", "Pendulum-v1", {"arch": "apex", "actors": 2, "steps": 800, "overrides": {"learning_starts": 200}}),
    ("ppo", "CartPole-v1", {"arch": "allreduce", "workers": 1, "backend": "serial"}),  # the learner in this process
    ("a2c", "CartPole-v1", {"arch": "gossip", "learners": 2, "backend": "serial"}),  # the learners take turns in it
]
CASES = SINGLE + CENTRAL
PROCESSES = [
    ("ppo", "CartPole-v1", {"arch": "allreduce", "workers": 2}),
    ("a2c", "CartPole-v1", {"arch": "gossip", "learners": 2}),
]
"""Learners on the device in worker processes: a GPU's only (a meta tensor's reads are stood in for in this process)."""
QUICK = {"eval_episodes": 2, "eval_max_steps": 50}


def case_id(case) -> str:
    algo, env, kw = case
    return "-".join([algo, env.split("-")[0], *(f"{k}={v}" for k, v in kw.items())])


def run_case(train, case, device: str, run_opts: dict):
    """Train one case briefly with the learner on `device`; its `RunResult`."""
    algo, env, kw = case
    kw = {"steps": STEPS, **kw}
    result = train(algo, env, device=device, **QUICK, **kw, **run_opts)
    assert result["updates"] > 0 and result["env_steps"] >= kw["steps"]
    learner = result.algo
    tensors = {
        f"{name}.{key}": t
        for name, module in vars(learner).items()
        if isinstance(module, torch.nn.Module) and not getattr(module, "host_only", False)  # a clock the host reads
        for key, t in module.state_dict().items()
    }
    elsewhere = [name for name, t in tensors.items() if t.device.type != torch.device(device).type]
    assert tensors and not elsewhere, f"{algo}'s tensors not on {device}: {elsewhere}"
    return result

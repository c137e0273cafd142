"""ddpg, td3 and sac: the same seed gives the same run, and a run stopped half-way and resumed ends exactly where
an uninterrupted one does (replay buffer, exploration and torch RNGs, warm-up counter, delayed-update counter);
also with the exploration options: td3's Ornstein–Uhlenbeck noise, sac's and ppo's gSDE noise matrices."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from rlfleet import train

STEPS = 1_600
OVERRIDES = {"learning_starts": "400", "random_steps": "400"}  # learn for most of the short run
# the exploration options, their state mid-way at the stop (step 1,100, mid-episode: Pendulum-v1's end every 200
# steps): OU noise between episode starts, gSDE matrices between resamples (ppo: 200 steps an iteration, stopped
# at 1,200, a new matrix every 4 of each rollout's 25 vector steps)
STOP = {"ppo-sde": 1_200}
CASES = {
    "sac": OVERRIDES,
    "td3": OVERRIDES,
    "td3-ou": {**OVERRIDES, "action_noise": "ou", "exploration_noise": "0.5"},
    "sac-sde": {**OVERRIDES, "sde": "true", "sde_sample_freq": "7"},
    "ppo-sde": {"sde": "true", "sde_sample_freq": "4", "rollout_len": "25", "n_envs": "8", "init_std": "0.3"},
}


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths at which two nested state dicts differ (tensors and arrays compared exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys differ"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{path}: lengths differ"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return [] if a.shape == b.shape and torch.equal(a, b) else [path]
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return [] if np.array_equal(a, b) else [path]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_stop_and_resume_equals_uninterrupted(case: str, run_opts: dict):
    algo = case.split("-")[0]
    opts = dict(seed=5, steps=STEPS, eval_every=800, eval_episodes=2, stop_return=1e9, overrides=CASES[case])
    opts.update(run_opts)
    whole = train(algo, "Pendulum-v1", name="whole", **opts)
    again = train(algo, "Pendulum-v1", name="again", **opts)
    assert differences(whole.algo.state_dict(), again.algo.state_dict()) == []

    stop = STOP.get(case, 1_100)
    stopped = train(algo, "Pendulum-v1", name="halves", callbacks=[lambda info: info["env_steps"] >= stop], **opts)
    assert stopped["stopped_by"] == "interrupted" and stopped["env_steps"] == stop
    resumed = train(resume=stopped.run_dir, progress=False)
    assert resumed["env_steps"] == whole["env_steps"] == STEPS
    assert differences(whole.algo.state_dict(), resumed.algo.state_dict()) == []
    assert resumed["eval_return_mean"] == whole["eval_return_mean"]

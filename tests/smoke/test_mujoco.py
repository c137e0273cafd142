"""MuJoCo envs: the algorithms with a `mujoco` preset (picked automatically) run and write their run; a MuJoCo run
stopped half-way and resumed ends exactly where an uninterrupted one does (the physics state is checkpointed)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import numpy as np
import pytest

from rlfleet import train
from rlfleet.algos import REGISTRY, resolve
from rlfleet.envs import make_vector_env
from rlfleet.envs import snapshot as env_state
from rlfleet.run.checkpoint import load_checkpoint

pytest.importorskip("gymnasium.envs.mujoco", reason='needs MuJoCo: pip install "rlfleet[mujoco]"')

STEPS = 2_048
# every algorithm with a mujoco preset (ppo, sac, td3, ddpg)
ALGOS = sorted(name for name in REGISTRY if "mujoco" in resolve(name)[2])


def _short_overrides(algo: str) -> dict[str, str]:
    """Replay algorithms stop acting at random and learn for the last 256 steps of the short run (their
    presets' 256-256 networks and 256-sample minibatches make each step slow on a CPU)."""
    fields = {f.name for f in dataclasses.fields(resolve(algo)[1])}
    return {k: str(STEPS - 256) for k in ("learning_starts", "random_steps") if k in fields}


@pytest.mark.parametrize("algo", ALGOS)
def test_algorithm_runs_on_inverted_pendulum(algo: str, run_opts: dict):
    overrides = _short_overrides(algo)
    result = train(
        algo,
        "InvertedPendulum-v5",
        steps=STEPS,
        eval_episodes=2,
        eval_every=10 * STEPS,
        overrides=overrides,
        **run_opts,
    )
    run = result.run_dir
    saved = json.loads((run / "result.json").read_text())
    assert saved["env_steps"] >= STEPS and saved["stopped_by"] == "steps"
    assert 0 < saved["eval_return_mean"] <= 1000  # +1 per step balanced, 1,000 steps at most
    config = json.loads((run / "config.json").read_text())
    assert config["preset"] == "mujoco"
    latest = load_checkpoint(run / "checkpoints" / "latest.pt")
    if config["algo"].get("obs_norm"):
        assert latest["obs_norm"]["count"] == saved["env_steps"] + config["algo"]["n_envs"]
    with open(run / "metrics.csv", newline="") as f:
        keys = {row["key"]: float(row["value"]) for row in csv.DictReader(f)}
    losses = {k: v for k, v in keys.items() if k.startswith("losses/")}
    assert losses and all(math.isfinite(v) for v in losses.values()), keys


@pytest.mark.parametrize("env_id", ["Hopper-v5", "Ant-v5"])
def test_mujoco_physics_survives_a_snapshot(env_id: str):
    """Ant's reward reads the torso's position before its step, as the last step left it (one substep behind the
    state): the snapshot holds those derived arrays too, so even the first reward after a restore agrees."""
    envs = make_vector_env(env_id, 2, seed=0, mode="sync")
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (240, *envs.action_space.shape)).astype(np.float32)
    for act in actions[:40]:
        envs.step(act)
    copy = make_vector_env(env_id, 2, seed=0, mode="sync")
    copy.reset(seed=0)
    assert env_state.restore(copy, env_state.snapshot(envs))
    ended = 0
    for act in actions[40:]:
        a, b = envs.step(act), copy.step(act)
        for x, y in zip(a[:4], b[:4], strict=True):
            np.testing.assert_array_equal(x, y)
        ended += int((a[2] | a[3]).sum())
    assert ended > 0, "no episode ended: resets after a restore were not checked"
    envs.close()
    copy.close()


def test_ppo_on_hopper_stops_and_resumes_exactly(run_opts: dict):
    total = 2_048  # 8 segments of 256 steps; Hopper's episodes end early (it falls), so resets are crossed too
    opts = dict(
        seed=4,
        steps=total,
        eval_every=1_024,
        eval_episodes=2,
        stop_return=1e9,
        preset="mujoco",  # the family preset (Hopper-v5 has a per-env entry), with shorter segments
        overrides={"rollout_len": "256", "minibatch_size": "128", "epochs": "2"},
        **run_opts,
    )
    whole = train("ppo", "Hopper-v5", name="whole", **opts)
    stopped = train("ppo", "Hopper-v5", name="halves", callbacks=[lambda info: info["env_steps"] >= total // 2], **opts)
    assert stopped["stopped_by"] == "interrupted"
    assert load_checkpoint(stopped.run_dir)["envs"] is not None
    resumed = train(resume=stopped.run_dir, steps=total, progress=False)
    for key in ("env_steps", "episodes", "updates", "eval_return_mean", "best_eval_return"):
        assert resumed[key] == whole[key], key
    a, b = load_checkpoint(whole.run_dir), load_checkpoint(resumed.run_dir)
    for name, tensor in a["algo"]["model"].items():
        assert np.array_equal(tensor.numpy(), b["algo"]["model"][name].numpy()), name
    assert a["obs_norm"]["count"] == b["obs_norm"]["count"]
    np.testing.assert_array_equal(a["obs_norm"]["var"], b["obs_norm"]["var"])

"""Runs with observation normalisation: statistics from training only, frozen for evaluation, and a checkpoint that
evaluates exactly as the run did before saving it (`rlfleet eval`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlfleet import train
from rlfleet.cli import main
from rlfleet.envs import make_vector_env
from rlfleet.envs.normalize import NormalizeObservation
from rlfleet.run.checkpoint import load_checkpoint
from rlfleet.run.config import ConfigError
from rlfleet.run.evaluate import evaluate, evaluate_checkpoint, load_agent


def _train_with_obs_norm(run_opts: dict, **options):
    runs = []

    def keep(info):  # the run object, to evaluate its live algorithm with its live statistics
        runs.append(info["trainer"])

    opts = dict(seed=2, steps=3_000, eval_every=1_000, eval_episodes=4, stop_return=1e9, overrides={"obs_norm": "true"})
    result = train("ppo", "CartPole-v1", callbacks=[keep], **{**opts, **options, **run_opts})
    return result, runs[-1]


def test_checkpoint_restores_evaluation_exactly(run_opts: dict, capsys):
    result, run = _train_with_obs_norm(run_opts)
    stats = run.obs_stats
    assert stats.count == result["env_steps"] + run.algo_cfg.n_envs  # training observations only
    before = stats.state_dict()

    # before saving: the run's own (last) evaluation, and the live agent on freshly built, frozen envs
    last_eval_seed = run.eval_seed(run.state["last_eval"]["step"])
    episodes, seed = 6, 321
    envs = NormalizeObservation(make_vector_env("CartPole-v1", episodes, seed=seed, training=False), stats, False)
    live = evaluate(result.algo, envs, episodes, seed).returns
    envs.close()
    assert stats.state_dict()["count"] == before["count"], "evaluation changed the statistics"

    # after loading
    saved = load_checkpoint(result.run_dir)
    assert saved["obs_norm"]["count"] == before["count"]
    np.testing.assert_array_equal(saved["obs_norm"]["mean"], before["mean"])
    loaded = evaluate_checkpoint(result.run_dir, episodes=episodes, seed=seed)
    assert loaded["returns"] == [float(r) for r in live]
    assert len(set(loaded["returns"])) > 1, "every episode alike: a weak comparison"
    again = evaluate_checkpoint(result.run_dir, episodes=run.cfg.eval_episodes, seed=last_eval_seed)
    assert again["return_mean"] == result["eval_return_mean"]
    assert again["return_std"] == result["eval_return_std"]

    # the same through the command line
    assert main(["eval", str(result.run_dir), "--episodes", str(episodes), "--seed", str(seed)]) == 0
    assert json.loads(capsys.readouterr().out)["returns"] == loaded["returns"]

    # the statistics matter: without them the loaded network acts differently on raw observations
    agent, _ = load_agent(result.run_dir)
    raw = (np.random.default_rng(0).normal(size=(256, 4)) * [2.0, 2.0, 0.2, 2.0]).astype(np.float32)
    with_stats = agent.act(raw, explore=False)[0]
    without = agent.algo.act(raw, explore=False)[0]
    assert not np.array_equal(with_stats, without)


@pytest.mark.parametrize(("option", "clip"), [("obs_norm", "obs_clip"), ("reward_norm", "reward_clip")])
def test_normalisation_is_rejected_where_it_cannot_run(option: str, clip: str, run_opts: dict):
    with pytest.raises(ConfigError, match=f"{option} runs on the single architecture"):
        train("a2c", "CartPole-v1", arch="hogwild", backend="serial", steps=100, overrides={option: "true"}, **run_opts)
    with pytest.raises(ConfigError, match=rf"{clip}=0.0 is out of range: must be > 0"):
        train("ppo", "CartPole-v1", steps=100, overrides={option: "true", clip: "0"}, **run_opts)

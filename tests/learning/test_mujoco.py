"""MuJoCo: PPO with the `mujoco` preset (picked automatically, observation normalisation on) must solve
InvertedPendulum-v5 (mean greedy return ≥ 950 over 10 episodes) within a step budget."""

import json

import pytest

from rlfleet import train

pytest.importorskip("gymnasium.envs.mujoco", reason='needs MuJoCo: pip install "rlfleet[mujoco]"')

# budget: 3.7x the most steps seeds 1-3 needed, and the learning rate's annealing horizon in those runs
# (docs/continuous_control.md)
BUDGET = 150_000


@pytest.mark.learning
def test_ppo_solves_inverted_pendulum(run_opts):
    result = train("ppo", "InvertedPendulum-v5", seed=1, steps=BUDGET, eval_every=10_240, **run_opts)
    r = result.result
    assert json.loads((result.run_dir / "config.json").read_text())["preset"] == "mujoco"
    assert r["stop_return"] == 950.0  # the env's reward_threshold
    assert r["solved"], f"ppo did not solve InvertedPendulum-v5 in {BUDGET} steps: eval {r['eval_return_mean']}"
    assert r["eval_return_mean"] >= 950.0

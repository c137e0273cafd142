"""The CNN pipeline learns from pixels: PPO, DQN and A3C (hogwild, two worker processes) each reach a mean greedy
return of 4 on MinAtar Breakout (ten times a random policy's 0.4) within a step budget, with the `minatar` preset the
env picks by itself."""

import json

import pytest

from rlfleet import train

pytest.importorskip("minatar")

ENV = "MinAtar/Breakout-v1"
SCORE = 4.0
"""Greedy mean over 10 games; uniformly random actions score 0.4 (100 games), so 4 is a paddle that returns the
ball. The budgets are at least 1.6× the most steps seeds 0 to 3 needed (docs/minatar.md)."""
CASES = {
    # the preset as is: 8 envs, 128-step segments
    "ppo": dict(algo="ppo", steps=500_000, eval_every=25_000),
    # the MinAtar paper's DQN, on 4 envs instead of 1: an update every 4 env steps, faster per env step on 2 cores
    # for about the same return per step (docs/minatar.md)
    "dqn": dict(algo="dqn", steps=150_000, n_envs=4, eval_every=10_000),
    # the A3C paper's settings on 2 hogwild workers
    "a3c": dict(algo="a3c", arch="hogwild", workers=2, steps=250_000, eval_every=25_000),
}
SLOW = {"dqn"}  # -m slow: 75 s of CI, the longest; DQN's CNN path is also in the Pong smoke run


@pytest.mark.learning
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in sorted(CASES)])
def test_reaches_a_score_on_minatar_breakout(case, run_opts):
    options = dict(CASES[case])
    algo = options.pop("algo")
    result = train(algo, ENV, seed=0, stop_return=SCORE, eval_episodes=10, **options, **run_opts)
    r = result.result
    assert json.loads((result.run_dir / "config.json").read_text())["preset"] == "minatar"
    assert r["solved"], f"{case} did not reach {SCORE} on {ENV} in {options['steps']} steps: {r['eval_return_mean']}"
    assert r["eval_return_mean"] >= SCORE

"""Every discrete-action algorithm must solve CartPole-v1 (mean ≥ 475 over 10 greedy episodes) in its budget."""

import pytest

from rlfleet import train

# step budgets: about twice what the default configuration needs with this seed (docs/algorithms.md)
BUDGETS = {
    "ppo": 40_000,
    "a2c": 80_000,
    "pg": 150_000,
    "dqn": 40_000,
    "nstep_q": 200_000,
    "onestep_q": 200_000,
    "sarsa": 200_000,
}


@pytest.mark.learning
@pytest.mark.parametrize("algo", sorted(BUDGETS))
def test_solves_cartpole(algo, run_opts):
    result = train(algo, "CartPole-v1", seed=0, steps=BUDGETS[algo], eval_every=2_000, **run_opts)
    r = result.result
    assert r["solved"], f"{algo} did not solve CartPole-v1 in {BUDGETS[algo]} steps: eval {r['eval_return_mean']}"
    assert r["eval_return_mean"] >= 475
    assert r["solved_at_step"] <= BUDGETS[algo]

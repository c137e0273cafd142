"""A user's own MLP (tests/user_nets.py, given with `net=`) under PPO and DQN solves CartPole-v1 in the budgets the
built-in networks have (tests/learning/test_cartpole.py)."""

import pytest

from rlfleet import train

pytestmark = pytest.mark.learning

BUDGETS = {"ppo": 40_000, "dqn": 40_000}  # the built-in networks' (tests/learning/test_cartpole.py)


@pytest.mark.parametrize("algo, width", [("ppo", 64), ("dqn", 128)])  # the built-in MLPs' widths
def test_a_user_mlp_solves_cartpole(algo, width, run_opts):
    result = train(algo, "CartPole-v1", net="user_nets:mlp", net_kwargs={"width": width}, seed=0, steps=BUDGETS[algo],
                   eval_every=2_000, **run_opts)  # fmt: skip
    assert result["solved"], f"{algo} with a user MLP: {result.result}"
    assert result["eval_return_mean"] >= 475

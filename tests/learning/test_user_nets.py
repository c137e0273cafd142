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


def test_sac_with_a_user_actor_and_user_critics_solves_pendulum(run_opts):
    """The user's whole actor (mean and log σ) and twin critics, as wide as SAC's own MLPs, in their place: solved
    within 1.5x the budget of SAC's own networks (tests/learning/test_continuous.py)."""
    result = train("sac", "Pendulum-v1", actor_net="user_nets:Actor", actor_net_kwargs={"gaussian": True},
                   critic_net="user_nets:Critic", seed=0, steps=12_000, eval_every=2_000, **run_opts)  # fmt: skip
    assert result["solved"], f"sac with a user actor and critics: {result.result}"
    assert result["eval_return_mean"] >= -250


def test_an_lstm_on_a_user_mlp_solves_cartpole_without_velocities(run_opts):
    """rlfleet's LSTM core on top of the user's MLP (the built-in encoder's shape) with A2C's `lstm` preset: solved
    within the built-in recurrent agent's budget (tests/learning/test_recurrent.py)."""
    result = train("a2c", "rlfleet/CartPoleNoVel-v1", preset="lstm", net="user_nets:mlp", seed=0, steps=150_000,
                   eval_every=10_000, **run_opts)  # fmt: skip
    assert result["solved"], f"a2c with an LSTM on a user MLP: {result.result}"
    assert result["eval_return_mean"] >= 475

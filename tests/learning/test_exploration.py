"""Exploration on sparse rewards: TD3 with Ornstein–Uhlenbeck action noise and SAC with gSDE find a reward that
independent noise at every step never reaches, on Gymnasium's MountainCarContinuous-v0 and on a task of our own
(`sparse_env:FarGoal-v0`, a point mass with friction paid only at a goal 40 units away; see tests/sparse_env.py)."""

import pytest

from rlfleet import train

ENV = "MountainCarContinuous-v0"
SOLVED = 90.0  # the env's reward_threshold
BUDGETS = {"td3": 30_000, "sac": 10_000}  # a little over what seed 0 needs (docs/continuous_control.md)


@pytest.mark.learning
@pytest.mark.parametrize("algo", [pytest.param("td3", marks=pytest.mark.slow), "sac"])  # td3's 80 s: slow (CI time)
def test_correlated_exploration_solves_what_the_defaults_do_not(algo, run_opts):
    """MountainCarContinuous-v0 pays +100 at a flag that the car reaches only after swinging back and forth (a
    run-up), and costs 0.1 a² per step. With their plain defaults (independent noise at every step) TD3 and SAC
    never reach the flag: they learn that doing nothing is safest, end at a return of about 0 and the run says so
    (its hint). TD3 with Ornstein–Uhlenbeck noise and SAC with gSDE (their per-env presets,
    picked by the env id) solve it (mean greedy return ≥ 90 over 10 episodes) within the same budget
    (docs/continuous_control.md has the seeds and the rl-zoo3 comparison)."""
    budget = BUDGETS[algo]
    opts = dict(seed=0, steps=budget, eval_every=2_000, eval_episodes=10, **run_opts)
    tuned = train(algo, ENV, name="tuned", **opts)
    option = {"td3": ("action_noise", "ou"), "sac": ("sde", True)}[algo]
    assert getattr(tuned.algo.cfg, option[0]) == option[1]  # the per-env preset was picked by the env id
    r = tuned.result
    assert r["stop_return"] == SOLVED
    assert r["solved"], f"{algo} with {option[0]}={option[1]} did not solve {ENV} in {budget} steps: {r}"
    assert r["solved_at_step"] <= budget and r["eval_return_mean"] >= SOLVED and r["exploration_hint"] is None

    plain = train(algo, ENV, name="plain", preset="default", **opts)
    assert getattr(plain.algo.cfg, option[0]) != option[1]
    p = plain.result
    assert not p["solved"] and p["env_steps"] >= budget
    assert p["best_eval_return"] < 1.0, f"the plain {algo} found the flag after all: {p}"
    assert p["exploration_hint"] is not None and f"--set {option[0]}=" in p["exploration_hint"]


FAR_GOAL = "sparse_env:FarGoal-v0"
FAR_GOAL_SOLVED = 90.0  # its reward_threshold
# algo: (budget in env steps, the settings both runs share, the option only the tuned run sets, and the settings
# that come with it); budgets: 1.2x (td3) and 1.8x (sac) the most steps seeds 0-4 needed (docs/continuous_control.md)
FAR_GOAL_RUNS = {
    "td3": (10_000, {"exploration_noise": 1.0, "train_freq": 2}, ("action_noise", "ou"), {}),
    "sac": (
        8_000,
        {"alpha": 0.1, "auto_alpha": False, "gamma": 0.99, "train_freq": 2},
        ("sde", True),
        {"sde_sample_freq": 100},
    ),
}


@pytest.mark.learning
@pytest.mark.slow  # -m slow: CI keeps SAC with gSDE on MountainCarContinuous above
@pytest.mark.parametrize("algo", sorted(FAR_GOAL_RUNS))
def test_correlated_exploration_reaches_a_far_goal(algo, run_opts):
    """`sparse_env:FarGoal-v0` pays +100 only at a goal 40 units away, which takes a push of about 0.45 or more held
    for the whole 100-step episode, and costs 0.05 a² per step. Two runs of the same algorithm with the same settings
    and budget differ in one option: with it (TD3: action_noise=ou; SAC: sde=true, its noise matrix drawn every
    100 steps) the agent reaches the goal and solves the task (mean greedy return ≥ 90 over 10 episodes); without
    it (independent noise at every step: TD3 Gaussian noise of the same σ 1.0, SAC its squashed Gaussian) no
    episode reaches the goal, the agent learns that doing nothing is safest and the run's hint names the option.
    The shared settings make the runs cheap (an update every second env step, half the defaults' cost) and, for
    SAC, set a fixed α of 0.1 (as MountainCarContinuous-v0's per-env preset does) and γ 0.99 (see
    docs/continuous_control.md)."""
    budget, shared, (option, value), with_it = FAR_GOAL_RUNS[algo]
    opts = dict(seed=0, steps=budget, eval_every=500, eval_episodes=10, preset="default", **run_opts)
    tuned = train(algo, FAR_GOAL, name="tuned", overrides={**shared, option: value, **with_it}, **opts)
    assert getattr(tuned.algo.cfg, option) == value
    r = tuned.result
    assert r["stop_return"] == FAR_GOAL_SOLVED
    assert r["solved"], f"{algo} with {option}={value} did not reach the far goal in {budget} steps: {r}"
    assert r["solved_at_step"] <= budget and r["eval_return_mean"] >= FAR_GOAL_SOLVED and r["exploration_hint"] is None

    plain = train(algo, FAR_GOAL, name="plain", overrides=shared, **opts)
    assert getattr(plain.algo.cfg, option) != value
    p = plain.result
    assert not p["solved"] and p["env_steps"] >= budget
    assert p["best_eval_return"] < 1.0, f"the plain {algo} reached the far goal after all: {p}"
    assert p["exploration_hint"] is not None and f"--set {option}=" in p["exploration_hint"]

"""Action masks: observations that carry their legal actions (a Dict with an "action_mask" entry, as PettingZoo's
turn-based games give) restrict every algorithm with Discrete actions to those, acting and learning: no illegal
action is ever picked (greedy, ε-greedy, sampled; NumPy and PyTorch passes), the policy-gradient family's recorded
log-probabilities are those of the masked policy, DQN's and n-step Q's targets bootstrap from the legal actions
only, one update of each runs to finite losses, and a row with no legal action counts as all legal. Algorithms
that would ignore the mask refuse it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from rlfleet.algos import algorithm_names, resolve
from rlfleet.algos.acting import epsilon_greedy
from rlfleet.algos.spaces import UnsupportedSpaceError
from rlfleet.data.batch import Batch, obs_tensor
from rlfleet.data.rollout import RolloutStorage, Segment
from rlfleet.nets.heads import MASKED_LOGIT, action_mask_of, masked_logits

N_ACTIONS = 5
OBS = gym.spaces.Dict(
    {
        "observation": gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
        "action_mask": gym.spaces.Box(0, 1, (N_ACTIONS,), np.int8),
    }
)
ACT = gym.spaces.Discrete(N_ACTIONS)
N = 256
DISCRETE = [name for name in algorithm_names() if "Discrete" in resolve(name)[0].action_spaces]
RECURRENT = {"dqn-lstm": ("dqn", dict(lstm=8, burn_in=2, train_len=4)), "ppo-lstm": ("ppo", dict(lstm=8))}
CASES = {**{name: (name, {}) for name in DISCRETE}, **RECURRENT, "a2c-lstm": ("a2c", dict(lstm=8))}
POLICY_GRADIENT = ["pg", "a2c", "a3c", "ppo", "ppo-lstm", "a2c-lstm"]


def build(case: str, n_envs: int = N, seed: int = 0, **overrides):
    name, own = CASES[case]
    cls, config_cls, _, variant = resolve(name)
    settings = {**variant, **own, **overrides}
    if "n_envs" in config_cls.__dataclass_fields__:
        settings["n_envs"] = n_envs  # n-step Q's per-env ε is as long as the batches it acts on
    torch.manual_seed(seed)
    return cls(config_cls(**settings), OBS, ACT, seed=seed)


def random_masks(n: int, rng: np.random.Generator) -> np.ndarray:
    """`[n, A]` int8 masks, about half the actions legal, at least one in each row."""
    mask = rng.integers(0, 2, (n, N_ACTIONS)).astype(np.int8)
    mask[np.arange(n), rng.integers(N_ACTIONS, size=n)] = 1
    return mask


def observations(n: int, rng: np.random.Generator, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
    return {
        "observation": rng.uniform(-1, 1, (n, 4)).astype(np.float32),
        "action_mask": random_masks(n, rng) if mask is None else mask,
    }


def legal(actions: np.ndarray, mask: np.ndarray) -> bool:
    return bool(np.all(mask[np.arange(len(mask)), actions.astype(np.int64)] == 1))


# ----------------------------------------------------------------------------------------------- the helpers
def test_the_mask_of_observations_counts_a_row_with_no_legal_action_as_all_legal():
    masks = np.array([[1, 0, 1, 0, 0], [0, 0, 0, 0, 0]], np.int8)
    want = np.array([[True, False, True, False, False], [True] * 5])
    np.testing.assert_array_equal(action_mask_of({"action_mask": masks}), want)
    np.testing.assert_array_equal(action_mask_of({"action_mask": torch.as_tensor(masks)}).numpy(), want)
    np.testing.assert_array_equal(action_mask_of(Batch(action_mask=masks)), want)
    assert action_mask_of(np.zeros((2, 4))) is None and action_mask_of({"observation": np.zeros((2, 4))}) is None
    logits = torch.zeros(2, N_ACTIONS)
    out = masked_logits(logits, torch.as_tensor(want))
    assert out[0, 1] == MASKED_LOGIT and torch.equal(out[1], logits[1])
    np.testing.assert_array_equal(masked_logits(logits.numpy(), want), out.numpy())


def test_epsilon_greedy_is_greedy_and_uniform_over_the_legal_actions_only():
    rng = np.random.default_rng(0)
    q = np.tile(np.arange(N_ACTIONS, dtype=np.float32), (4000, 1))  # the last action is best, and illegal
    mask = np.tile(np.array([True, False, True, True, False]), (4000, 1))
    np.testing.assert_array_equal(epsilon_greedy(q, 0.0, rng, mask), 3)
    actions = epsilon_greedy(q, 1.0, rng, mask)
    counts = np.bincount(actions, minlength=N_ACTIONS) / len(actions)
    np.testing.assert_allclose(counts, [1 / 3, 0, 1 / 3, 1 / 3, 0], atol=0.03)
    one = np.zeros((10, N_ACTIONS), bool)
    one[:, 1] = True  # a single legal action: every draw is it
    np.testing.assert_array_equal(epsilon_greedy(q[:10], 1.0, rng, one), 1)


# ----------------------------------------------------------------------------------------------- acting
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("explore", [True, False])
def test_no_illegal_action_is_ever_chosen(case, explore):
    algo = build(case)
    if hasattr(algo, "eps"):  # half the actions random, half greedy
        algo.eps = 0.5 if np.ndim(algo.eps) == 0 else np.full(N, 0.5)
    rng = np.random.default_rng(1)
    for _ in range(3):
        obs = observations(N, rng)
        actions, _, _ = algo.act(obs, None, explore)
        assert actions.shape == (N,) and legal(actions, obs["action_mask"]), case


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_row_with_no_legal_action_acts_as_if_all_were_legal(case):
    algo = build(case, n_envs=4)
    mask = np.array([[0] * 5, [0] * 5, [0, 0, 1, 0, 0], [1, 1, 0, 0, 0]], np.int8)
    for explore in (True, False):
        actions, extras, _ = algo.act(observations(4, np.random.default_rng(2), mask), None, explore)
        assert np.all((actions >= 0) & (actions < N_ACTIONS)) and legal(actions[2:], mask[2:])
        assert all(np.all(np.isfinite(v)) for v in extras.values())


@pytest.mark.parametrize("case", POLICY_GRADIENT)
def test_the_recorded_log_probabilities_are_those_of_the_masked_policy(case):
    """PPO records them (`logp`); every policy's NumPy pass agrees with its PyTorch one, which is
    log_softmax over the legal logits (the others −∞), whatever the path."""
    algo = build(case)
    rng = np.random.default_rng(3)
    obs = observations(N, rng)
    actions, extras, _ = algo.act(obs, None, True)
    model = algo.model
    x = obs_tensor(obs)
    with torch.no_grad():
        if model.core is None:
            dist, _ = model(x)
            raw = model.policy.linear(model.actor_body(x))
        else:
            dist, _, _ = model.unroll(x, None)
            features = model.actor_body(x).unsqueeze(0)
            out, _ = model.core(features, model.core.initial_state(N), None)
            raw = model.policy.linear(out[0])
        want = torch.log_softmax(raw.masked_fill(torch.as_tensor(obs["action_mask"]) == 0, -torch.inf), -1)
        logp = dist.log_prob(torch.as_tensor(actions))
    taken = want[torch.arange(N), torch.as_tensor(actions).long()]
    torch.testing.assert_close(logp, taken)
    illegal = torch.as_tensor(obs["action_mask"]) == 0
    assert torch.all(dist.probs[illegal] == 0) and torch.all(torch.isfinite(dist.entropy()))
    torch.testing.assert_close(dist.entropy(), -(want.exp() * want.nan_to_num(neginf=0.0)).sum(-1))
    if "logp" in extras:
        torch.testing.assert_close(torch.as_tensor(extras["logp"]), taken)
    fast = model.numpy_forward(obs)
    if fast is not None:
        np.testing.assert_allclose(fast[0][~illegal.numpy()], raw[~illegal].numpy(), rtol=1e-5, atol=1e-6)
        assert np.all(fast[0][illegal.numpy()] == MASKED_LOGIT)


# ----------------------------------------------------------------------------------------------- targets
def constant_q(net, values) -> None:
    """Make a plain (non-dueling) QNetwork give `values` for every observation."""
    with torch.no_grad():
        net.head.linear.weight.zero_()
        net.head.linear.bias.copy_(torch.as_tensor(values, dtype=torch.float32))


@pytest.mark.parametrize("double", [True, False])
def test_dqns_target_bootstraps_from_the_best_legal_next_action(double):
    """Q(s', ·) = (0, 1, 2, 3, 10): the illegal action 4 is the best; the target takes the best legal one, 3 or
    2 (as each row's next mask says); a terminal row with no legal action is not bootstrapped and stays finite."""
    algo = build("dqn", n_envs=4, double=double, dueling=False)
    constant_q(algo.q, [0, 1, 2, 3, 10])
    constant_q(algo.q_target, [0, 1, 2, 3, 10])
    rng = np.random.default_rng(4)
    next_mask = np.array([[1, 1, 1, 1, 0], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], np.int8)
    batch = Batch(
        obs=observations(4, rng),
        act=np.array([0, 1, 2, 3]),
        rew=np.array([1.0, 2.0, 3.0, 4.0], np.float32),
        next_obs=observations(4, rng, next_mask),
        terminated=np.array([0, 0, 1, 0], np.float32),
        discount=np.full(4, 0.5, np.float32),
        weight=np.ones(4, np.float32),
    )
    loss, _, td_abs = algo.td_loss(batch)
    y = np.array([1 + 0.5 * 3, 2 + 0.5 * 2, 3.0, 4 + 0.5 * 10])  # the last row: every action legal
    q = np.array([0.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(td_abs, np.abs(y - q), rtol=1e-6)
    torch.testing.assert_close(loss, F.smooth_l1_loss(torch.as_tensor(q), torch.as_tensor(y)).float())


def test_the_recurrent_dqn_target_bootstraps_from_legal_actions_only():
    algo = build("dqn-lstm", n_envs=1, dueling=False, n_step=1, gamma=0.5)
    constant_q(algo.q, [0, 1, 2, 3, 10])
    constant_q(algo.q_target, [0, 1, 2, 3, 10])
    rng = np.random.default_rng(5)
    steps = 6
    obs = observations(steps, rng)
    next_mask = np.tile(np.array([1, 1, 1, 1, 0], np.int8), (steps, 1))  # action 4 never legal next
    batch = Batch(
        obs=obs,
        act=np.zeros(steps, np.int64),
        rew=np.zeros(steps, np.float32),
        next_obs=observations(steps, rng, next_mask),
        terminated=np.zeros(steps, bool),
        truncated=np.zeros(steps, bool),
        starts=np.zeros(steps, np.float32),
    ).apply(lambda x: x[None])  # one sequence of burn_in + train_len steps
    batch["weight"] = np.ones(1, np.float32)
    _, _, td_abs = algo.td_loss(batch)
    np.testing.assert_allclose(td_abs, [0.5 * 3], rtol=1e-6)  # y = 0 + 0.5 · Q(s', 3), Q(s, 0) = 0


@pytest.mark.parametrize("target", ["onestep_q", "nstep_q", "sarsa"])
def test_n_step_q_bootstraps_from_the_legal_actions(target):
    algo = build(target, n_envs=4, dueling=False)
    constant_q(algo.q_target, [0, 1, 2, 3, 10])
    mask = np.array([[1, 1, 1, 1, 0], [1, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 1, 0, 0, 0]], np.int8)
    values = algo.value(observations(4, np.random.default_rng(6), mask))
    if target == "sarsa":  # Q⁻ at an ε-greedy legal action
        assert np.isin(values[0], [0, 1, 2, 3]) and np.isin(values[1], [0, 2]) and values[3] == 1
    else:
        np.testing.assert_array_equal(values, [3, 2, 10, 1])


# ----------------------------------------------------------------------------------------------- updates
def rollout(algo, n_envs: int, length: int, rng: np.random.Generator) -> Segment:
    """A segment of random masked observations, acted on by `algo` (as the Collector would store it); every third
    step ends an episode, its last observation allowing nothing."""
    storage = RolloutStorage(length, n_envs)
    state = None
    for t in range(length):
        obs = observations(n_envs, rng)
        terminated = np.full(n_envs, t % 3 == 2)
        if t % 3 == 2:
            obs["action_mask"][0] = 0
        actions, extras, state = algo.act(obs, state, True)
        storage.write(
            t,
            obs=obs,
            act=actions,
            rew=rng.standard_normal(n_envs).astype(np.float32),
            terminated=terminated,
            truncated=np.zeros(n_envs, bool),
            bootstrap=np.zeros(n_envs, np.float32),
            **extras,
        )
        if state is not None:
            storage.write(t, starts=np.full(n_envs, t % 3 == 0, np.float32))
    last = observations(n_envs, rng)
    value = algo.value(last, state) if state is not None else algo.value(last)
    return Segment(storage.batch(), last, np.asarray(value, np.float32), None)


def finite(metrics: dict) -> bool:
    return all(np.all(np.isfinite(np.asarray(v, dtype=np.float64))) for v in metrics.values())


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_update_on_masked_batches_gives_finite_losses(case):
    rng = np.random.default_rng(7)
    algo = build(case, n_envs=4)
    if algo.data == "rollout":
        metrics = algo.update(rollout(algo, 4, algo.cfg.rollout_len, rng))
    elif algo.data == "replay":
        buffer = algo.make_buffer(4, 1_000, seed=0)
        obs, state = observations(4, rng), None
        for t in range(24):
            actions, _, next_state = algo.act(obs, state, True)
            next_obs = observations(4, rng)
            terminated = np.full(4, t % 5 == 4)
            if t % 5 == 4:
                next_obs["action_mask"][:2] = 0  # a terminal next state with no legal action
            extra = {"state": state} if algo.replays_sequences else {}
            buffer.add(obs, actions, rng.standard_normal(4).astype(np.float32), next_obs, terminated,
                       np.zeros(4, bool), **extra)  # fmt: skip
            obs, state = next_obs, next_state
        metrics = algo.update(buffer.sample(8))
    else:
        mask = random_masks(64, rng)
        expert = np.array([rng.choice(np.flatnonzero(row)) for row in mask])
        metrics = algo.update(algo.process(Batch(obs=observations(64, rng, mask), act=expert)))
    assert metrics and finite(metrics), (case, metrics)
    losses = [key for key in metrics if "loss" in key or key in ("cross_entropy", "entropy")]
    assert losses, metrics


def test_bcs_loss_is_the_cross_entropy_of_the_masked_policy():
    algo = build("bc")
    rng = np.random.default_rng(8)
    mask = random_masks(64, rng)
    expert = np.array([rng.choice(np.flatnonzero(row)) for row in mask])
    batch = algo.process(Batch(obs=observations(64, rng, mask), act=expert))
    loss, metrics = algo.loss(batch)
    b = batch.to_torch()
    with torch.no_grad():
        raw = algo.model.policy.linear(algo.model.actor_body(b.obs))
        want = F.cross_entropy(raw.masked_fill(b.obs.action_mask == 0, -torch.inf), b.act)
    torch.testing.assert_close(loss.detach(), want)


# ----------------------------------------------------------------------------------------------- spaces
@pytest.mark.parametrize("name", ["ddpg", "td3", "sac", "ppo", "pg", "a2c"])
def test_an_algorithm_that_would_ignore_the_mask_refuses_it(name):
    cls, config_cls, _, variant = resolve(name)
    action_space = gym.spaces.Box(-1.0, 1.0, (N_ACTIONS,), np.float32)
    with pytest.raises(UnsupportedSpaceError, match="action_mask"):
        cls(config_cls(**variant), OBS, action_space, seed=0)
    if name in ("ppo", "pg", "a2c"):
        with pytest.raises(UnsupportedSpaceError, match="action_mask"):
            cls(config_cls(**variant), OBS, gym.spaces.MultiDiscrete([5, 5]), seed=0)


@pytest.mark.parametrize(
    "mask",
    [
        gym.spaces.Box(0, 1, (N_ACTIONS + 1,), np.int8),  # not one entry per action
        gym.spaces.Box(-10.0, 10.0, (N_ACTIONS,), np.float32),  # rescaled (obs_norm): no longer 0/1
        gym.spaces.Discrete(N_ACTIONS),
    ],
)
def test_a_mask_that_is_not_one_0_1_entry_per_action_is_refused(mask):
    space = gym.spaces.Dict({"observation": OBS["observation"], "action_mask": mask})
    cls, config_cls, _, variant = resolve("dqn")
    with pytest.raises(UnsupportedSpaceError, match="one entry"):
        cls(config_cls(**variant), space, ACT, seed=0)
    bits = gym.spaces.Dict({"observation": OBS["observation"], "action_mask": gym.spaces.MultiBinary(N_ACTIONS)})
    cls(config_cls(**variant), bits, ACT, seed=0)  # a MultiBinary mask is one


def test_obs_norm_leaves_a_float_mask_as_it_is():
    """A float 0/1 mask beside float observations: obs_norm normalises the observations, never the mask (rescaled,
    its 0s would read as legal, every action with them)."""
    from rlfleet.envs.normalize import make_obs_stats
    from rlfleet.nets.heads import action_mask_of

    space = gym.spaces.Dict(
        {"obs": gym.spaces.Box(-5, 5, (3,), np.float32), "action_mask": gym.spaces.Box(0, 1, (4,), np.float32)}
    )
    stats = make_obs_stats(space, clip=10.0)
    rng = np.random.default_rng(0)
    masks = np.zeros((64, 4), np.float32)
    masks[np.arange(64), rng.integers(4, size=64)] = 1.0  # one legal action a row
    batch = {"obs": rng.normal(3.0, 2.0, (64, 3)).astype(np.float32), "action_mask": masks}
    stats.update(batch)
    seen = stats.normalize(batch)
    np.testing.assert_array_equal(seen["action_mask"], masks)
    assert abs(float(seen["obs"].mean())) < 0.1  # the observations themselves are normalised
    assert (action_mask_of(seen).sum(axis=1) == 1).all()


def test_a_dataset_action_its_observation_s_mask_forbids_is_named():
    """bc trained on it with a loss of 1e8 (the masked logit) that nothing moved, and said nothing."""
    from rlfleet.data.demos import illegal_actions_problem

    space = gym.spaces.Discrete(3)
    mask = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0], [1, 0, 0]], np.int8)  # row 2: no legal action, so all are
    assert illegal_actions_problem(np.array([0, 2, 2, 0]), mask, space) is None
    said = illegal_actions_problem(np.array([0, 0, 2, 1]), mask, space)
    assert said == "action 1 is 0, illegal under its observation's action_mask (2 of 4 actions are)"
    started = gym.spaces.Discrete(3, start=1)  # actions 1..3: mask column 0 is action 1
    assert illegal_actions_problem(np.array([1, 3, 2, 1]), mask, started) is None

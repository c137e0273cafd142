"""Learners on another device (PyTorch's `meta`, with the `meta_learner` fixture standing in for a GPU's host
reads) fed every kind of input they take, beyond the default networks on CartPole and Pendulum of
`tests/device_cases.py`: each observation space (Discrete, MultiDiscrete, MultiBinary, Dict, Tuple, images, a Dict
with an image), action masks, recurrent policies on vectors and on frames, networks of the user's own (`net`,
`actor_net`, `critic_net`), normalised observations and rewards, a recurrent CNN run resumed onto the device, and
frames on the architectures whose learners act on the device. Each case trains about a hundred steps (acting,
exploring and greedy, bootstrapping truncated episodes, updating, evaluating) and checks that every network stayed
on the device (`device_cases.run_case`); bc, which learns from a dataset, acts and updates directly.

`DeviceInputs-v0` (below) gives the spaces no small registered env has: random observations of the space named by
`obs`, any action of the space named by `act`, episodes ended at random or cut at 4 steps.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import space_envs  # noqa: F401 (registers the tasks)
from device_cases import QUICK, run_case

from rlfleet import train
from rlfleet.algos import resolve
from rlfleet.data.batch import Batch, stack_obs

pytestmark = pytest.mark.usefixtures("meta_learner")

FRAMES = gym.spaces.Box(0, 1, (2, 10, 10), np.uint8)
MASK = gym.spaces.Box(0, 1, (3,), np.int8)
OBSERVATIONS = {
    "discrete": gym.spaces.Discrete(5, start=2),
    "multidiscrete": gym.spaces.MultiDiscrete([3, 4], start=[1, -1]),
    "multibinary": gym.spaces.MultiBinary(4),
    "frames": FRAMES,
    "frames_dict": gym.spaces.Dict({"frame": FRAMES, "cell": gym.spaces.MultiDiscrete([3, 4])}),
    "masked": gym.spaces.Dict({"observation": gym.spaces.Box(-1, 1, (3,), np.float32), "action_mask": MASK}),
    "masked_frames": gym.spaces.Dict({"frame": FRAMES, "action_mask": MASK}),
}
ACTIONS = {
    "discrete": gym.spaces.Discrete(3),
    "multidiscrete": gym.spaces.MultiDiscrete([2, 3]),
    "multibinary": gym.spaces.MultiBinary(2),
    "box": gym.spaces.Box(-1, 1, (2,), np.float32),
}


class DeviceInputs(gym.Env):
    """Random observations of `OBSERVATIONS[obs]` (with at least one legal action where they carry a mask), any
    action of `ACTIONS[act]`, a reward of 1 per step; an episode ends with probability 1/4 per step."""

    def __init__(self, obs: str = "discrete", act: str = "discrete", render_mode: str | None = None):
        self.observation_space = OBSERVATIONS[obs]
        self.action_space = ACTIONS[act]

    def _observe(self) -> Any:
        obs = self.observation_space.sample()
        if isinstance(obs, dict) and "action_mask" in obs:
            obs["action_mask"][self.np_random.integers(len(obs["action_mask"]))] = 1
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        return self._observe(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        return self._observe(), 1.0, bool(self.np_random.random() < 0.25), False, {}


ENV = "DeviceInputs-v0"
if ENV not in gym.registry:
    gym.register(ENV, entry_point=DeviceInputs, max_episode_steps=4)
MINATAR = "MinAtar/Breakout-v1"  # frames: 10x10 grids, the smallest a built-in CNN takes (if minatar is installed)
NO_VELOCITY = "rlfleet/CartPoleNoVel-v1"

STEPS = 96
SMALL: dict[str, dict[str, Any]] = {
    "pg": {"n_envs": 2, "rollout_len": 16},
    "a2c": {"n_envs": 2, "rollout_len": 8},
    "ppo": {"n_envs": 2, "rollout_len": 16, "minibatch_size": 16, "epochs": 1},
    "dqn": {"learning_starts": 32, "batch_size": 8, "train_freq": 8, "buffer_size": 200},
    "sarsa": {"n_envs": 2, "rollout_len": 8},
    "onestep_q": {"n_envs": 2, "rollout_len": 8},
    "nstep_q": {"n_envs": 2, "rollout_len": 8},
    **{
        algo: {"learning_starts": 32, "random_steps": 32, "batch_size": 8, "train_freq": 8, "buffer_size": 200}
        for algo in ("sac", "td3", "ddpg")
    },
}
LSTM = {
    "a2c": {"lstm": 8, "n_envs": 2, "rollout_len": 8},
    "ppo": {"lstm": 8, "n_envs": 2, "rollout_len": 8, "minibatch_size": 8, "epochs": 1},
    "dqn": {"lstm": 8, "hidden": (16,), "burn_in": 2, "train_len": 4, "batch_size": 4, "train_freq": 16,
            "gradient_steps": 1, "learning_starts": 48, "buffer_size": 200},
}  # fmt: skip


def train_on_meta(algo: str, env: str, run_opts: dict, steps: int = STEPS, overrides: dict | None = None, **options):
    """`run_case` of `algo` on `env` with the learner on `meta`, at SMALL's sizes (and `overrides`)."""
    if env == MINATAR:
        pytest.importorskip("minatar")
    overrides = {**SMALL[algo], **(overrides or {})}
    case = (algo, env, {"steps": steps, "eval_every": steps, "overrides": overrides, **options})
    return run_case(train, case, "meta", run_opts)


def case_id(value: Any) -> str:
    return value.split(":")[-1].split("/")[-1] if isinstance(value, str) else ""


# ------------------------------------------------------------------------------------------ observation spaces
SPACES = [
    ("ppo", "FrozenLake-v1", {}),  # Discrete
    ("dqn", "FrozenLake-v1", {}),
    ("sarsa", "FrozenLake-v1", {}),
    ("sac", ENV, {"obs": "discrete", "act": "box"}),
    ("pg", ENV, {"obs": "multidiscrete", "act": "discrete"}),
    ("dqn", ENV, {"obs": "multidiscrete", "act": "discrete"}),
    ("td3", ENV, {"obs": "multidiscrete", "act": "box"}),
    ("a2c", "space_envs:BitMatch-v0", {}),  # MultiBinary observations and actions
    ("dqn", ENV, {"obs": "multibinary", "act": "discrete"}),
    ("ddpg", ENV, {"obs": "multibinary", "act": "box"}),
    ("ppo", "space_envs:DictCue-v0", {}),  # Dict of a Discrete and a MultiBinary
    ("dqn", "space_envs:DictCue-v0", {}),
    ("nstep_q", "space_envs:DictCue-v0", {}),
    ("sac", "space_envs:DictPendulum-v0", {}),
    ("a2c", "Blackjack-v1", {}),  # Tuple
    ("dqn", "Blackjack-v1", {}),
    ("sarsa", "Blackjack-v1", {}),
    ("pg", MINATAR, {}),  # frames: a CNN that acts on the device
    ("a2c", MINATAR, {}),
    ("ppo", MINATAR, {}),
    ("dqn", MINATAR, {}),
    ("onestep_q", MINATAR, {}),
    ("ppo", ENV, {"obs": "frames", "act": "box"}),
    ("a2c", ENV, {"obs": "frames", "act": "multibinary"}),
    ("ppo", ENV, {"obs": "frames", "act": "multidiscrete"}),
    ("sac", ENV, {"obs": "frames", "act": "box"}),
    ("ppo", ENV, {"obs": "frames_dict", "act": "multidiscrete"}),  # a CNN beside one-hots
    ("dqn", ENV, {"obs": "frames_dict", "act": "discrete"}),
    ("td3", ENV, {"obs": "frames_dict", "act": "box"}),
    ("ppo", ENV, {"obs": "masked", "act": "discrete"}),  # legal actions
    ("dqn", ENV, {"obs": "masked", "act": "discrete"}),
    ("sarsa", ENV, {"obs": "masked", "act": "discrete"}),
    ("pg", ENV, {"obs": "masked_frames", "act": "discrete"}),
    ("a2c", ENV, {"obs": "masked_frames", "act": "discrete"}),
    ("dqn", ENV, {"obs": "masked_frames", "act": "discrete"}),
    ("nstep_q", ENV, {"obs": "masked_frames", "act": "discrete"}),
]


@pytest.mark.parametrize(
    "algo, env, spaces", SPACES, ids=[f"{a}-{case_id(e)}{''.join(f'-{v}' for v in s.values())}" for a, e, s in SPACES]
)
def test_each_observation_space_reaches_a_learner_on_another_device(algo, env, spaces, run_opts):
    train_on_meta(algo, env, run_opts, env_kwargs=spaces)


# ------------------------------------------------------------------------------------------ recurrent policies
RECURRENT = [
    ("a2c", NO_VELOCITY, {}, {"preset": "lstm"}),
    ("ppo", NO_VELOCITY, {}, {}),
    ("dqn", NO_VELOCITY, {}, {"preset": "lstm"}),
    ("a2c", MINATAR, {}, {"preset": "lstm"}),  # an LSTM on a CNN: its state lives on the device
    ("ppo", MINATAR, {}, {"overrides": {"net": "user_nets:SmallCNN"}}),
    ("dqn", MINATAR, {}, {"preset": "lstm"}),  # the sequence replay stores the state on the host
    ("dqn", MINATAR, {}, {"preset": "lstm", "overrides": {"stored_state": False}}),
    ("ppo", ENV, {"obs": "masked_frames", "act": "discrete"}, {}),
    ("dqn", ENV, {"obs": "masked_frames", "act": "discrete"}, {"preset": "lstm"}),
]


@pytest.mark.parametrize(
    "algo, env, spaces, options",
    RECURRENT,
    ids=[f"{a}-{case_id(e)}{'-masked' if s else ''}{'-user' if 'overrides' in o else ''}" for a, e, s, o in RECURRENT],
)
def test_recurrent_learners_act_and_learn_on_another_device(algo, env, spaces, options, run_opts):
    options = dict(options)
    overrides = {**LSTM[algo], **options.pop("overrides", {})}
    train_on_meta(algo, env, run_opts, steps=128, overrides=overrides, env_kwargs=spaces, **options)


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")  # meta holds no values to load
@pytest.mark.parametrize("env", [MINATAR, NO_VELOCITY], ids=["cnn", "mlp"])
def test_a_recurrent_run_resumes_with_its_learner_on_another_device(env, run_opts, tmp_path):
    """The policy's state saved with the envs comes back from the checkpoint on the CPU: a CNN policy, which acts on
    the learner's device, takes it there; an MLP one acts on the CPU with it. (a2c: RMSProp. Adam's moments saved by
    the CPU's fused Adam load into `meta`'s unfused one with a step count that reads as 0 there.)"""
    if env == MINATAR:
        pytest.importorskip("minatar")
    first = train("a2c", env, steps=48, eval_every=48, overrides=LSTM["a2c"], name="first", **QUICK, **run_opts)
    resumed = train(resume=first.run_dir, steps=96, device="meta", progress=False)
    assert resumed["device"] == "meta" and resumed["updates"] > 0 and resumed["env_steps"] >= 96


# ------------------------------------------------------------------------------------------ networks of the user's
USERS = [
    ("pg", MINATAR, {"net": "user_nets:SmallCNN"}),
    ("a2c", MINATAR, {"net": "user_nets:SmallCNN"}),
    ("ppo", MINATAR, {"net": "user_nets:SmallCNN"}),
    ("dqn", MINATAR, {"net": "user_nets:SmallCNN"}),
    ("sarsa", MINATAR, {"net": "user_nets:SmallCNN"}),
    ("sac", ENV, {"net": "user_nets:SmallCNN", "sde": True}),
    ("td3", ENV, {"net": "user_nets:SmallCNN", "prioritized": True}),
    ("ddpg", ENV, {"net": "user_nets:SmallCNN"}),
    ("ppo", "CartPole-v1", {"net": "user_nets:Scaled"}),
    ("sac", "Pendulum-v1", {"actor_net": "user_nets:Actor", "actor_net_kwargs": {"gaussian": True},
                            "critic_net": "user_nets:Critic"}),
    ("td3", "Pendulum-v1", {"actor_net": "user_nets:Actor", "critic_net": "user_nets:Critic"}),
    ("ddpg", "Pendulum-v1", {"net": "user_nets:Scaled", "critic_net": "user_nets:Critic"}),
]  # fmt: skip


@pytest.mark.parametrize(
    "algo, env, nets",
    USERS,
    ids=[f"{a}-{case_id(e)}-{'-'.join(v for k, v in n.items() if k.endswith('net'))}" for a, e, n in USERS],
)
def test_networks_of_the_users_act_and_learn_on_the_learners_device(algo, env, nets, run_opts):
    spaces = {"obs": "frames", "act": "box"} if env == ENV else {}
    train_on_meta(algo, env, run_opts, overrides=nets, env_kwargs=spaces)


# ------------------------------------------------------------------------------------------ normalisation
@pytest.mark.parametrize("algo, env", [("ppo", "CartPole-v1"), ("dqn", "CartPole-v1"), ("sac", "Pendulum-v1"),
                                       ("a2c", "space_envs:DictPendulum-v0")])  # fmt: skip
def test_normalised_observations_and_rewards_reach_a_learner_on_another_device(algo, env, run_opts):
    train_on_meta(algo, env, run_opts, overrides={"obs_norm": True, "reward_norm": True})


# ------------------------------------------------------------------------------------------ architectures
ARCHS = [
    ("dqn", MINATAR, {"arch": "apex", "actors": 1, "backend": "serial"}, {}),
    ("dqn", MINATAR, {"arch": "data_parallel", "workers": 2, "backend": "serial"}, LSTM["dqn"]),
    ("ppo", MINATAR, {"arch": "allreduce", "workers": 1, "backend": "serial"}, LSTM["ppo"]),
    ("a2c", MINATAR, {"arch": "gossip", "learners": 2, "backend": "serial"}, LSTM["a2c"]),
    ("ppo", "pettingzoo:pettingzoo.classic.tictactoe_v3", {}, {}),  # a turn-based game's legal moves
    ("dqn", "pettingzoo:pettingzoo.classic.tictactoe_v3", {}, {}),
]


@pytest.mark.parametrize(
    "algo, env, options, overrides",
    ARCHS,
    ids=[f"{a}-{case_id(e)}-{o.get('arch', 'single')}{'-lstm' if v else ''}" for a, e, o, v in ARCHS],
)
def test_frames_and_masks_on_the_architectures(algo, env, options, overrides, run_opts):
    if "pettingzoo" in env:
        pytest.importorskip("pettingzoo")
    train_on_meta(algo, env, run_opts, steps=128, overrides=overrides, **options)


# ------------------------------------------------------------------------------------------ bc
@pytest.mark.parametrize(
    "obs, act, net",
    [("frames", "box", ""), ("masked_frames", "discrete", ""), ("multidiscrete", "discrete", ""),
     ("frames", "discrete", "user_nets:SmallCNN")],
)  # fmt: skip
def test_bc_acts_and_learns_on_another_device(obs, act, net):
    obs_space, act_space = OBSERVATIONS[obs], ACTIONS[act]
    algo_cls, config_cls, _, _ = resolve("bc")
    bc = algo_cls(config_cls(net=net), obs_space, act_space, device="meta")
    observations = stack_obs([obs_space.sample() for _ in range(4)])
    actions, _, _ = bc.act(observations)
    assert actions.shape == (4, *(act_space.shape or ()))
    demos = Batch(obs=observations, act=np.stack([act_space.sample() for _ in range(4)]))
    assert "grad_norm" in bc.update(bc.process(demos))

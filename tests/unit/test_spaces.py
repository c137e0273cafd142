"""Every Gymnasium space: observations of every kind encoded (one-hots, bits, dict entries side by side), kept
nested from the env through rollouts, replay buffers and checkpoints; factorised categorical and Bernoulli
policies against their log-probabilities and entropies computed by hand; clear errors for spaces an algorithm
does not take."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos import resolve
from rlfleet.algos.acting import policy_step
from rlfleet.algos.spaces import UnsupportedSpaceError, algorithms_taking
from rlfleet.data import Batch, PrioritizedReplayBuffer, ReplayBuffer, SequenceReplayBuffer
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs import make_env, make_vector_env
from rlfleet.envs.wrappers import FlatDictObservation
from rlfleet.nets.encoders import FlatInput, MultiInputEncoder, make_encoder
from rlfleet.nets.fast import discrete_actions
from rlfleet.nets.heads import Bernoulli, MultiCategorical
from rlfleet.nets.models import ActorCritic, QNetwork
from rlfleet.run.checkpoint import load_checkpoint, save_checkpoint

MIXED = gym.spaces.Dict(
    {
        "cue": gym.spaces.Discrete(3, start=1),
        "grid": gym.spaces.MultiDiscrete([2, 4]),
        "bits": gym.spaces.MultiBinary(2),
        "x": gym.spaces.Box(-5.0, 5.0, (2,), np.float32),
    }
)


def mixed_obs(n: int, t: int = 0) -> dict[str, np.ndarray]:
    """n observations of MIXED that differ per row and per step t."""
    rows = np.arange(n)
    return {
        "cue": 1 + (rows + t) % 3,
        "grid": np.stack([(rows + t) % 2, (rows * 3 + t) % 4], axis=1),
        "bits": np.stack([rows % 2, (rows + t) % 2], axis=1).astype(np.int8),
        "x": np.stack([rows + 0.5, np.full(n, float(t))], axis=1).astype(np.float32),
    }


# ----------------------------------------------------------------------------------------------- encodings
def test_discrete_observations_are_one_hot_from_their_start():
    inputs = FlatInput(gym.spaces.Discrete(4, start=-1))
    obs = np.array([-1, 2, 0])
    expected = np.array([[1, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]], np.float32)
    np.testing.assert_array_equal(inputs.numpy(obs), expected)
    np.testing.assert_array_equal(inputs(torch.as_tensor(obs)).numpy(), expected)
    assert inputs.out_dim == 4


def test_multi_discrete_observations_are_one_hots_side_by_side():
    inputs = FlatInput(gym.spaces.MultiDiscrete([2, 3, 1]))
    obs = np.array([[1, 0, 0], [0, 2, 0]])
    expected = np.array([[0, 1, 1, 0, 0, 1], [1, 0, 0, 0, 1, 1]], np.float32)
    np.testing.assert_array_equal(inputs.numpy(obs), expected)
    np.testing.assert_array_equal(inputs(torch.as_tensor(obs)).numpy(), expected)


def test_multi_binary_and_box_observations_are_their_values_flattened():
    bits = FlatInput(gym.spaces.MultiBinary([2, 2]))
    np.testing.assert_array_equal(bits.numpy(np.array([[[1, 0], [0, 1]]], np.int8)), [[1, 0, 0, 1]])
    box = FlatInput(gym.spaces.Box(0, 1, (2, 3)))
    np.testing.assert_array_equal(box.numpy(np.arange(6.0).reshape(1, 2, 3)), [np.arange(6.0)])


def test_dict_observations_are_their_entries_side_by_side_in_key_order():
    inputs = FlatInput(MIXED)
    obs = {
        "cue": np.array([3]),
        "grid": np.array([[1, 2]]),
        "bits": np.array([[0, 1]], np.int8),
        "x": np.array([[0.5, -2.0]]),
    }
    # keys in the space's order: bits, cue, grid, x
    expected = [[0, 1] + [0, 0, 1] + [0, 1, 0, 0, 1, 0] + [0.5, -2.0]]
    np.testing.assert_allclose(inputs.numpy(obs), expected)
    torch_obs = {k: torch.as_tensor(v) for k, v in obs.items()}
    np.testing.assert_allclose(inputs(torch_obs).numpy(), expected)
    assert inputs.out_dim == 13


def test_spaces_no_encoder_takes_are_rejected_clearly():
    with pytest.raises(ValueError, match="Text.*not supported.*Box, Discrete, MultiDiscrete, MultiBinary"):
        make_encoder(gym.spaces.Text(4))
    with pytest.raises(ValueError, match="needs image observations"):
        make_encoder(gym.spaces.Discrete(3), kind="nature")


def test_dict_observations_with_images_get_a_cnn_per_image_entry():
    space = gym.spaces.Dict({"frames": gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), "cue": gym.spaces.Discrete(3)})
    encoder = make_encoder(space, "auto", (32,), "relu")
    assert isinstance(encoder, MultiInputEncoder) and list(encoder.cnns) == ["frames"]
    obs = {"frames": torch.zeros(2, 4, 84, 84, dtype=torch.uint8), "cue": torch.tensor([0, 2])}
    assert encoder(obs).shape == (2, 32)
    model = ActorCritic(space, 3, hidden=(32,), shared=True)
    dist, value = model(obs)
    assert dist.logits.shape == (2, 3) and value.shape == (2,)


@pytest.mark.parametrize("lstm", [0, 8])
def test_the_numpy_acting_path_matches_torch_on_dict_observations(lstm):
    model = ActorCritic(MIXED, gym.spaces.MultiDiscrete([3, 2]), lstm=lstm)
    obs = mixed_obs(5, t=1)
    with torch.inference_mode():
        torch_obs = {k: torch.as_tensor(v) for k, v in obs.items()}
        dist, value = model(torch_obs) if lstm == 0 else model.unroll(torch_obs, None)[:2]
    if lstm == 0:
        logits, np_value = model.numpy_forward(obs)
        np.testing.assert_allclose(logits, dist.logits.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np_value, value.numpy(), rtol=1e-5, atol=1e-6)
    else:
        assert model.numpy_forward(obs) is None  # LSTM cores act in PyTorch
    actions, logp, _, _ = policy_step(model, obs, False, np.random.default_rng(0))
    assert actions.shape == (5, 2)
    np.testing.assert_allclose(logp, dist.log_prob(torch.as_tensor(actions)).numpy(), rtol=1e-5, atol=1e-6)


def test_a_q_network_on_dict_observations_unrolls_sequences():
    q = QNetwork(MIXED, 4, hidden=(16,), lstm=8)
    seq = {k: torch.as_tensor(np.stack([mixed_obs(3, t)[k] for t in range(5)])) for k in MIXED.spaces}
    values, (h, _) = q.unroll(seq, None)
    assert values.shape == (5, 3, 4) and h.shape == (5, 3, 8)
    one, _ = q.unroll({k: v[0] for k, v in seq.items()}, None)
    torch.testing.assert_close(one, values[0])


# ----------------------------------------------------------------------------------------- env wrappers
def test_tuple_observations_reach_the_agent_as_a_dict_keyed_by_position():
    envs = make_vector_env("Blackjack-v1", 3, seed=0, mode="sync")
    space = envs.single_observation_space
    assert isinstance(space, gym.spaces.Dict) and list(space.spaces) == ["0", "1", "2"]
    assert [s.n for s in space.spaces.values()] == [32, 11, 2]
    obs, _ = envs.reset(seed=0)
    assert set(obs) == {"0", "1", "2"} and all(v.shape == (3,) for v in obs.values())
    envs.close()


def test_nested_dict_and_tuple_observations_are_flattened_to_one_level():
    class Nested(gym.Env):
        observation_space = gym.spaces.Dict(
            {
                "arm": gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3))),
                "id": gym.spaces.Discrete(2),
            }
        )
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return {"arm": (np.zeros(2, np.float32), 1), "id": 0}, {}

    env = FlatDictObservation(Nested())
    assert list(env.observation_space.spaces) == ["arm.0", "arm.1", "id"]
    obs, _ = env.reset()
    assert obs["arm.1"] == 1 and obs["id"] == 0 and obs["arm.0"].shape == (2,)
    assert env.observation_space.contains(obs)


class Frames(gym.Env):
    """Pixel observations as Gymnasium's pixel envs give them: `(H, W, 3)` uint8 frames (each pixel's red channel
    its row, green its column), alone or beside a vector in a Dict."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, in_dict=False, render_mode=None):
        frame = gym.spaces.Box(0, 255, (12, 10, 3), np.uint8)
        self.in_dict = in_dict
        self.observation_space = (
            gym.spaces.Dict({"pixels": frame, "speed": gym.spaces.Box(-1, 1, (1,))}) if in_dict else frame
        )

    def _obs(self):
        frame = np.zeros((12, 10, 3), np.uint8)
        frame[..., 0] = np.arange(12)[:, None]
        frame[..., 1] = np.arange(10)[None, :]
        return {"pixels": frame, "speed": np.zeros(1, np.float32)} if self.in_dict else frame

    def reset(self, *, seed=None, options=None):
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, True, False, {}


@pytest.mark.parametrize("in_dict", [False, True], ids=["box", "dict-entry"])
def test_channels_last_frames_reach_the_agent_channels_first_and_get_a_cnn_of_their_channels(in_dict):
    """A `(H, W, 3)` frame (CarRacing's, a pixel wrapper's) is `(3, H, W)` for the agent, pixel for pixel, so the CNN
    has 3 input channels (not H) and sees H x W; channels-first stacks and small grids are left as they are."""
    from rlfleet.envs.wrappers import is_channels_last_image

    env = make_env(lambda: Frames(in_dict))
    space = env.observation_space["pixels"] if in_dict else env.observation_space
    assert space.shape == (3, 12, 10) and space.dtype == np.uint8
    obs, _ = env.reset()
    frame = obs["pixels"] if in_dict else obs
    assert env.observation_space.contains(obs) and frame.flags.c_contiguous
    assert (frame[0] == np.arange(12)[:, None]).all() and (frame[1] == np.arange(10)[None, :]).all()
    encoder = make_encoder(env.observation_space)
    first = next(m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d))
    assert first.in_channels == 3
    for kept in [(4, 84, 84), (1, 84, 84), (4, 10, 10), (3, 3, 3)]:  # Atari stacks, MinAtar grids, a tiny cube
        assert not is_channels_last_image(gym.spaces.Box(0, 255, kept, np.uint8)), kept
    assert not is_channels_last_image(gym.spaces.Box(0, 1, (84, 84, 3), np.float32))  # not a uint8 image


class Echo(gym.Env):
    """Records the action the env receives."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self, action_space):
        self.action_space, self.received = action_space, []

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.received.append(action)
        return np.zeros(2, np.float32), 0.0, False, False, {}


@pytest.mark.parametrize(
    "space, agent_space, choice, received",
    [
        (gym.spaces.Discrete(3, start=-1), gym.spaces.Discrete(3), 0, -1),
        (gym.spaces.Discrete(4, start=5), gym.spaces.Discrete(4), 3, 8),
        (gym.spaces.MultiDiscrete([3, 2], start=[-1, 4]), gym.spaces.MultiDiscrete([3, 2]), [2, 0], [1, 4]),
    ],
)
def test_actions_that_start_elsewhere_than_0_reach_the_agent_0_based(space, agent_space, choice, received):
    """The agent picks k in 0..n−1 (what a categorical head gives); the env gets start + k, inside its space."""
    echo = Echo(space)
    env = make_env(lambda: echo)
    assert env.action_space == agent_space
    env.reset()
    env.step(np.asarray(choice))
    assert np.array_equal(echo.received[0], received) and space.contains(echo.received[0])
    algo_cls, config_cls, _, variant = resolve("ppo")
    with pytest.raises(UnsupportedSpaceError, match="start at 0.*ZeroBasedActions"):  # the raw space, unwrapped
        algo_cls(config_cls(**variant), echo.observation_space, space, seed=0)


# ------------------------------------------------------------------------------ storage and replay, nested
def test_nested_observations_round_trip_through_the_rollout_storage():
    storage = RolloutStorage(4, 3)
    for t in range(4):
        storage.write(t, obs=mixed_obs(3, t), act=np.arange(3), rew=np.zeros(3, np.float32))
    batch = storage.batch()
    assert isinstance(batch.obs, Batch)
    for t in range(4):
        for key, value in mixed_obs(3, t).items():
            np.testing.assert_array_equal(batch.obs[key][t], value)
            assert batch.obs[key].dtype == value.dtype  # stored as they came, not flattened or cast
    flat = batch.flatten_leading(2).to_torch()
    assert flat.obs["grid"].shape == (12, 2) and flat.obs["x"].dtype == torch.float32


def fill_buffer(buf, steps: int, n_envs: int, state_size: int = 0):
    for t in range(steps):
        done = np.zeros(n_envs, bool)
        state = None if state_size == 0 else (np.full((n_envs, state_size), t, np.float32),) * 2
        kwargs = {} if state_size == 0 else {"state": state}
        buf.add(
            mixed_obs(n_envs, t),
            np.full(n_envs, t),
            np.full(n_envs, float(t), np.float32),
            mixed_obs(n_envs, t + 1),
            done,
            done,
            **kwargs,
        )


def make_buffers():
    return {
        "uniform": ReplayBuffer(64, n_envs=2, seed=0),
        "n_step": ReplayBuffer(64, n_envs=2, n_step=3, gamma=0.5, seed=0),
        "prioritized": PrioritizedReplayBuffer(64, n_envs=2, n_step=2, seed=0),
        "sequence": SequenceReplayBuffer(64, n_envs=2, seq_len=4, state_size=3, seed=0),
    }


@pytest.mark.parametrize("kind", ["uniform", "n_step", "prioritized", "sequence"])
def test_nested_observations_round_trip_through_every_replay_buffer_and_a_checkpoint(kind, tmp_path):
    buf = make_buffers()[kind]
    fill_buffer(buf, 12, 2, state_size=3 if kind == "sequence" else 0)
    sample = buf.sample(16)
    assert isinstance(sample.obs, Batch) and set(sample.obs) == set(MIXED.spaces)
    steps, n = sample.act, buf.n_step
    for key in MIXED.spaces:
        if kind == "sequence":  # [B, L, ...]: row b, step l is the stream's step act[b, l]
            for b in range(len(steps)):
                for step_i, t in enumerate(steps[b]):
                    env = sample.index[b] % 2
                    np.testing.assert_array_equal(sample.obs[key][b, step_i], mixed_obs(2, t)[key][env])
                    np.testing.assert_array_equal(sample.next_obs[key][b, step_i], mixed_obs(2, t + 1)[key][env])
            continue
        for b, t in enumerate(steps):
            env = sample.index[b] % 2
            np.testing.assert_array_equal(sample.obs[key][b], mixed_obs(2, t)[key][env])
            last = min(t + n, 12)  # n-step: the observation n steps on (no episode ends in the stream)
            np.testing.assert_array_equal(sample.next_obs[key][b], mixed_obs(2, last)[key][env])
        assert sample.obs[key].dtype == mixed_obs(1)[key].dtype
    save_checkpoint(
        tmp_path / "buffer.pt", {"buffer": buf.state_dict(), "run_config": {}, "algo_config": {}, "algo": {}}
    )
    loaded = make_buffers()[kind]
    loaded._rng = np.random.default_rng(99)
    loaded.load_state_dict(load_checkpoint(tmp_path / "buffer.pt")["buffer"])
    a, b = buf.sample(8), loaded.sample(8)
    for key in MIXED.spaces:
        np.testing.assert_array_equal(a.obs[key], b.obs[key])
        np.testing.assert_array_equal(a.next_obs[key], b.next_obs[key])


# ------------------------------------------------------------------------------------- factorised policies
def test_multi_categorical_log_prob_and_entropy_are_sums_over_the_factors_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0), 1.0, 2.0, 3.0]])  # factor 0: 2 choices, factor 1: 3
    dist = MultiCategorical(logits, [2, 3])
    p0 = np.array([1.0, 3.0]) / 4.0
    p1 = np.exp([1.0, 2.0, 3.0]) / np.exp([1.0, 2.0, 3.0]).sum()
    action = torch.tensor([[1, 0]])
    assert dist.log_prob(action).item() == pytest.approx(math.log(p0[1]) + math.log(p1[0]), rel=1e-6)
    entropy = -(p0 * np.log(p0)).sum() - (p1 * np.log(p1)).sum()
    assert dist.entropy().item() == pytest.approx(entropy, rel=1e-6)
    assert dist.mode.tolist() == [[1, 2]]
    logp_np = discrete_actions("multi_categorical", logits.numpy(), False, np.random.default_rng(0), [2, 3])
    assert logp_np[0].tolist() == [[1, 2]] and logp_np[1][0] == pytest.approx(math.log(p0[1] * p1[2]), rel=1e-6)


def test_bernoulli_log_prob_and_entropy_are_sums_over_the_bits_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0), -2.0]])
    p = np.array([0.5, 0.75, 1 / (1 + math.exp(2.0))])
    dist = Bernoulli(logits)
    bits = torch.tensor([[1, 0, 0]], dtype=torch.int8)
    assert dist.log_prob(bits).item() == pytest.approx(math.log(0.5) + math.log(0.25) + math.log(1 - p[2]), rel=1e-6)
    entropy = -(p * np.log(p) + (1 - p) * np.log(1 - p)).sum()
    assert dist.entropy().item() == pytest.approx(entropy, rel=1e-6)
    assert dist.mode.tolist() == [[0.0, 1.0, 0.0]]
    actions, logp = discrete_actions("bernoulli", logits.numpy(), False, np.random.default_rng(0))
    assert actions.dtype == np.int8 and actions.tolist() == [[0, 1, 0]]
    assert logp[0] == pytest.approx(dist.log_prob(torch.as_tensor(actions)).item(), rel=1e-6)


@pytest.mark.parametrize("kind, sizes", [("multi_categorical", [2, 3]), ("bernoulli", None)])
def test_sampled_factorised_actions_follow_the_policy(kind, sizes):
    logits = np.tile(np.array([[0.0, math.log(3.0), 1.0, 2.0, 3.0]]), (20_000, 1))
    if kind == "bernoulli":
        logits = logits[:, :3]
    actions, logp = discrete_actions(kind, logits, True, np.random.default_rng(0), sizes)
    torch_logits = torch.as_tensor(logits)
    dist = MultiCategorical(torch_logits, sizes) if sizes else Bernoulli(torch_logits)
    np.testing.assert_allclose(logp, dist.log_prob(torch.as_tensor(actions)).numpy(), rtol=1e-5, atol=1e-6)
    if kind == "bernoulli":
        np.testing.assert_allclose(actions.mean(0), 1 / (1 + np.exp(-logits[0])), atol=0.015)
    else:
        np.testing.assert_allclose(np.bincount(actions[:, 0]) / len(actions), [0.25, 0.75], atol=0.015)
        p1 = np.exp([1.0, 2.0, 3.0]) / np.exp([1.0, 2.0, 3.0]).sum()
        np.testing.assert_allclose(np.bincount(actions[:, 1]) / len(actions), p1, atol=0.015)


# ----------------------------------------------------------------------------------------- what takes what
@pytest.mark.parametrize("space", [gym.spaces.MultiDiscrete([3, 2]), gym.spaces.MultiBinary(3)])
@pytest.mark.parametrize("algo", ["pg", "a2c", "a3c", "ppo"])
def test_the_policy_gradient_family_takes_multi_discrete_and_multi_binary_actions(algo, space):
    algo_cls, config_cls, _, variant = resolve(algo)
    agent = algo_cls(config_cls(**variant), MIXED, space, seed=0)
    actions, _, _ = agent.act(mixed_obs(4))
    assert actions.shape == (4, *space.shape) and all(space.contains(a.astype(space.dtype)) for a in actions)


@pytest.mark.parametrize("algo", ["dqn", "nstep_q", "sarsa", "onestep_q", "ddpg", "td3", "sac", "bc"])
def test_algorithms_that_cannot_take_multi_discrete_actions_say_which_can(algo):
    algo_cls, config_cls, _, variant = resolve(algo)
    with pytest.raises(UnsupportedSpaceError, match=rf"'{algo}'.*MultiDiscrete.*a2c, a3c, pg, ppo"):
        algo_cls(config_cls(**variant), MIXED, gym.spaces.MultiDiscrete([3, 2]), seed=0)


def test_every_algorithm_says_which_action_spaces_it_takes():
    assert algorithms_taking("MultiBinary") == ["a2c", "a3c", "pg", "ppo"]
    assert "dqn" in algorithms_taking("Discrete") and "dqn" not in algorithms_taking("Box")
    assert algorithms_taking("Box") == ["a2c", "a3c", "bc", "ddpg", "pg", "ppo", "sac", "td3"]


def test_text_arrays_of_an_env_state_survive_a_checkpoint(tmp_path):
    """FrozenLake keeps its map as a bytes array, which torch tensors cannot hold."""
    desc = np.asarray(["SFFF", "FHFH"], dtype="c")
    names = np.array(["left", "right"])
    state = {"desc": desc, "names": names, "run_config": {}, "algo_config": {}, "algo": {}}
    save_checkpoint(tmp_path / "text.pt", state)
    loaded = load_checkpoint(tmp_path / "text.pt")
    assert loaded["desc"].dtype == desc.dtype and np.array_equal(loaded["desc"], desc)
    assert loaded["names"].dtype == names.dtype and np.array_equal(loaded["names"], names)


def test_rlfleet_spaces_shows_what_each_algorithm_takes(capsys):
    from rlfleet.cli import main

    assert main(["spaces", "dqn", "ppo"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header, rows = lines[1].split(), {line.split()[0]: line.split()[1:] for line in lines[2:4]}
    assert header == ["Discrete", "MultiDiscrete", "MultiBinary", "Box"]
    assert rows == {"dqn": ["y", "-", "-", "-"], "ppo": ["y", "y", "y", "y"]}
    assert "Box, Discrete, MultiDiscrete, MultiBinary, and Dict or Tuple of these" in out
    assert main(["spaces", "nope"]) == 2
    assert "unknown algorithm 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_an_observation_space_no_network_takes_is_one_line_before_anything_is_written(algo, tmp_path):
    """A Text observation failed with a TypeError traceback inside the memory check (its shape is None)."""
    import space_envs  # noqa: F401  # registers TextObservation-v0

    from rlfleet import train
    from rlfleet.fields import ConfigError

    with pytest.raises(ConfigError, match=r"^observation space Text\(1, 5, .* is not one rlfleet's networks take: Box"):
        train(algo, "TextObservation-v0", steps=100, logdir=str(tmp_path), progress=False)
    assert not any(tmp_path.iterdir())

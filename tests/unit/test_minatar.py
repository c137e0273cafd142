"""MinAtar: its ids resolve without the user registering them, observations reach the agent channels-first as 0/1
bytes, episodes have a limit, the family preset and the MinAtar network are picked by themselves."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos import resolve
from rlfleet.envs import env_spec_info, make_env, make_vector_env, resolve_env_spec
from rlfleet.envs import snapshot as env_state
from rlfleet.envs.minatar import DEFAULT_MAX_EPISODE_STEPS
from rlfleet.nets.encoders import MinAtarCNN, NatureCNN, make_encoder
from rlfleet.run.config import build_algo_config

pytest.importorskip("minatar")

GAMES = {"Asterix": 4, "Breakout": 4, "Freeway": 7, "Seaquest": 10, "SpaceInvaders": 6}  # game -> channels


@pytest.fixture
def unregistered(monkeypatch: pytest.MonkeyPatch):
    """Gymnasium's registry without MinAtar's ids, as in a fresh process where nobody called register_envs()."""
    registry = {k: v for k, v in gym.registry.items() if not k.startswith("MinAtar/")}
    monkeypatch.setattr(gym.envs.registration, "registry", registry)
    monkeypatch.setattr(gym, "registry", registry)
    return registry


def test_an_id_resolves_without_registering_minatar_first(unregistered):
    assert "MinAtar/Breakout-v1" not in unregistered
    assert resolve_env_spec("MinAtar/Breakout-v1").id == "MinAtar/Breakout-v1"
    assert {f"MinAtar/{g}-v{v}" for g in GAMES for v in (0, 1)} <= set(unregistered)


def test_without_the_package_the_error_says_how_to_install(unregistered, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "minatar", None)  # `import minatar` raises ImportError
    monkeypatch.setitem(sys.modules, "minatar.gym", None)
    with pytest.raises(ImportError, match=r'needs minatar.*pip install "rlfleet\[minatar\]"'):
        make_env("MinAtar/Breakout-v1")


def test_a_misspelt_id_suggests_the_games():
    with pytest.raises(ValueError, match="did you mean 'MinAtar/Breakout-v1'"):
        make_env("MinAtar/Breakou-v1")


@pytest.mark.parametrize("game", sorted(GAMES))
@pytest.mark.filterwarnings("ignore:.*is out of date:DeprecationWarning")  # v0 is made on purpose: all six actions
def test_observations_are_the_grid_channels_first_as_bytes(game):
    env = make_env(f"MinAtar/{game}-v1", seed=3)
    raw = env.unwrapped
    obs, _ = env.reset()
    channels = GAMES[game]
    assert env.observation_space == gym.spaces.Box(0, 1, (channels, 10, 10), np.uint8)
    assert obs.shape == (channels, 10, 10) and obs.dtype == np.uint8 and obs.flags.c_contiguous
    np.testing.assert_array_equal(obs, raw.game.state().transpose(2, 0, 1))  # the same cells, moved, not changed
    for _ in range(20):
        obs, *_ = env.step(env.action_space.sample())
        np.testing.assert_array_equal(obs, raw.game.state().transpose(2, 0, 1).astype(np.uint8))
    # v1 is the minimal action set (Breakout: no-op, left, right), v0 all six
    assert env.action_space.n == len(raw.game.minimal_action_set())
    assert make_env(f"MinAtar/{game}-v0").action_space.n == 6


def test_the_same_seed_gives_the_same_game():
    def play(seed: int) -> list[float]:
        env = make_env("MinAtar/Breakout-v1", seed=seed)
        env.reset()
        rng = np.random.default_rng(0)
        trace = []
        for _ in range(300):
            obs, reward, terminated, truncated, _ = env.step(int(rng.integers(3)))
            trace.append(float(obs.sum()) + 100 * reward)
            if terminated or truncated:
                env.reset()
        return trace

    assert play(5) == play(5)
    assert play(5) != play(6)  # sticky actions and the ball's start are drawn from the seed


def test_an_env_reset_with_a_seed_plays_that_seeds_episode_whatever_the_last_one_ended_on():
    """(An evaluation env is reset with the evaluation's seeds: its episodes must not depend on the previous
    evaluation.) The package's sticky actions may repeat the game's last action on an episode's first step."""
    env = make_vector_env("MinAtar/Breakout-v1", 1, seed=0, mode="sync", training=False)

    def episode(seed: int) -> np.ndarray:
        frames = [env.reset(seed=seed)[0]]
        frames += [env.step(np.zeros(1, np.int64))[0] for _ in range(40)]
        return np.stack(frames)

    first = episode(5)
    for _ in range(5):
        env.step(np.full(1, 2))  # the last episode ends on "right", held
    assert np.array_equal(episode(5), first)


def test_episodes_are_truncated_at_the_default_limit_or_the_given_one():
    assert env_spec_info("MinAtar/Breakout-v1")["max_episode_steps"] == DEFAULT_MAX_EPISODE_STEPS
    env = make_env("MinAtar/Freeway-v1", seed=0, max_episode_steps=7)  # Freeway never ends within 7 steps
    env.reset()
    ends = [env.step(0)[2:4] for _ in range(7)]
    assert ends[-1] == (False, True) and all(end == (False, False) for end in ends[:-1])


def test_the_package_options_pass_through():
    # no sticky actions: the paddle always moves as told
    env = make_env("MinAtar/Breakout-v1", seed=0, sticky_action_prob=0.0, difficulty_ramping=False)
    obs, _ = env.reset()
    paddle = int(np.argmax(obs[0, 9]))
    for _ in range(3):
        obs, *_ = env.step(1)  # left
    assert int(np.argmax(obs[0, 9])) == max(0, paddle - 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sticky'"):
        make_env("MinAtar/Breakout-v1", sticky=0.0)


def test_a_vector_env_steps_in_one_process():
    vec = make_vector_env("MinAtar/Breakout-v1", 4, seed=0)
    obs, _ = vec.reset()
    assert obs.shape == (4, 4, 10, 10) and obs.dtype == np.uint8
    assert type(vec.unwrapped).__name__ == "SyncVectorEnv"  # a fast env: no subprocesses
    vec.close()


@pytest.mark.parametrize("game", sorted(GAMES))
def test_a_snapshot_restores_the_game_so_fresh_envs_go_on_exactly(game: str):
    """The game lives one object in (`game`, its `env`), with a legacy RandomState for sticky actions and spawns:
    fresh envs given a snapshot step exactly as the originals, across episode ends (a resumed run's envs)."""
    env_id, rng = f"MinAtar/{game}-v1", np.random.default_rng(0)
    envs = make_vector_env(env_id, 2, seed=0)
    envs.reset(seed=0)
    for _ in range(100):
        envs.step(rng.integers(envs.single_action_space.n, size=2))
    snap = env_state.snapshot(envs)
    fresh = make_vector_env(env_id, 2, seed=5)
    fresh.reset(seed=5)
    assert env_state.restore(fresh, snap)
    ends = 0
    for actions in rng.integers(envs.single_action_space.n, size=(150, 2)):
        (obs, rew, term, trunc, _), (obs2, rew2, term2, trunc2, _) = envs.step(actions), fresh.step(actions)
        assert np.array_equal(obs, obs2) and np.array_equal(rew, rew2) and np.array_equal(term | trunc, term2 | trunc2)
        ends += int((term | trunc).sum())
    assert ends > 0 or game == "Freeway", "no episode ended: resets after a restore went unchecked"
    envs.close()
    fresh.close()


def test_the_minatar_network_is_picked_for_small_grids_and_nature_cnn_for_atari_frames():
    grid = gym.spaces.Box(0, 1, (4, 10, 10), np.uint8)
    encoder = make_encoder(grid)
    assert isinstance(encoder, MinAtarCNN)
    convs = [m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in encoder.modules() if isinstance(m, torch.nn.Linear)]
    # the paper's network: one 16×3×3 convolution of stride 1, then 128 units
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [(16, (3, 3), (1, 1))]
    assert [(lin.in_features, lin.out_features) for lin in linears] == [(16 * 8 * 8, 128)]
    # 0/1 cells are not divided by 255: a cell that is on reaches the network as 1
    ones = torch.ones(1, 4, 10, 10, dtype=torch.uint8)
    conv, linear = convs[0], linears[0]
    with torch.no_grad():
        expected = torch.relu(linear(torch.relu(conv(ones.float())).flatten(1)))
        torch.testing.assert_close(encoder(ones), expected)
    assert encoder.scale == 1.0
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert isinstance(make_encoder(frames), NatureCNN) and make_encoder(frames).scale == 255.0


def test_a_cnn_too_big_for_the_grid_is_a_clear_error():
    with pytest.raises(
        ValueError, match=r"encoder 'nature' takes frames of at least 36×36, the observations are 10×10"
    ):
        make_encoder(gym.spaces.Box(0, 1, (4, 10, 10), np.uint8), "nature")
    with pytest.raises(ValueError, match=r"encoder 'mnih2013' takes frames of at least 20×20"):
        make_encoder(gym.spaces.Box(0, 1, (4, 10, 10), np.uint8), "mnih2013")


@pytest.mark.parametrize("algo", ["dqn", "ppo", "a2c", "a3c", "pg", "nstep_q", "onestep_q", "sarsa"])
def test_every_discrete_action_family_has_a_minatar_preset_picked_by_the_env(algo):
    info = env_spec_info("MinAtar/Breakout-v1")
    assert info["family"] == "minatar"
    cfg, preset = build_algo_config(algo, None, {}, info["family"], "MinAtar/Breakout-v1")
    assert preset == "minatar" and cfg.encoder == "minatar"
    assert "minatar" in resolve(algo)[2]


def test_the_dqn_preset_is_the_minatar_papers():
    cfg, _ = build_algo_config("dqn", None, {}, "minatar", "MinAtar/Breakout-v1")
    paper = dict(buffer_size=100_000, batch_size=32, learning_starts=5_000, lr=2.5e-4, target_update_every=1_000)
    paper |= dict(eps_start=1.0, eps_final=0.1, eps_anneal_steps=100_000, gamma=0.99, total_steps=5_000_000)
    paper |= dict(n_step=1, double=False, dueling=False, prioritized=False, n_envs=1, train_freq=1, gradient_steps=1)
    assert {k: getattr(cfg, k) for k in paper} == paper

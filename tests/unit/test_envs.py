"""Unit tests for rlfleet.envs: env construction, SAME_STEP vector envs, seeding, Atari preprocessing."""

from __future__ import annotations

import functools
import importlib.util
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit

from rlfleet.envs import (
    CARTPOLE_NO_VELOCITY_ID,
    EnvPoolVectorEnv,
    UnknownEnvError,
    VelocityMaskedObservation,
    env_spec_info,
    finished_episodes,
    make_env,
    make_vector_env,
)
from rlfleet.run.config import build_algo_config

HAS_ALE = importlib.util.find_spec("ale_py") is not None
HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
needs_ale = pytest.mark.skipif(not HAS_ALE, reason='needs ale-py: pip install "rlfleet[atari]"')
needs_envpool = pytest.mark.skipif(not HAS_ENVPOOL, reason="needs envpool")

CARTPOLE_X_LIMIT = 2.4
CARTPOLE_THETA_LIMIT = 12 * 2 * np.pi / 360
CARTPOLE_RESET_BOUND = 0.05


def time_limited_cartpole(max_steps: int) -> gym.Env:
    """Module-level (picklable) env factory: a bare CartPole with a short TimeLimit."""
    return TimeLimit(CartPoleEnv(), max_episode_steps=max_steps)


def count_wrappers(env: gym.Env, wrapper_type: type[gym.Wrapper]) -> int:
    count = 0
    while isinstance(env, gym.Wrapper):
        count += isinstance(env, wrapper_type)
        env = env.env
    return count


def run_actions(env: gym.Env, actions: list[int]) -> np.ndarray:
    """Reset (without a seed) and play ``actions``; return the stacked observations."""
    obs, _ = env.reset()
    trajectory = [obs]
    for action in actions:
        obs, _, terminated, truncated, _ = env.step(action)
        trajectory.append(obs)
        if terminated or truncated:
            obs, _ = env.reset()
    return np.stack(trajectory)


# ----------------------------------------------------------------------------- single envs


def test_make_env_from_id_records_episode_statistics() -> None:
    env = make_env("CartPole-v1", seed=0)
    assert count_wrappers(env, RecordEpisodeStatistics) == 1
    obs, _ = env.reset()
    assert obs.shape == (4,) and obs.dtype == np.float32
    steps, info, done = 0, {}, False
    while not done:
        _, _, terminated, truncated, info = env.step(1)
        steps += 1
        done = terminated or truncated
    assert info["episode"]["l"] == steps and info["episode"]["r"] == steps
    env.close()


def test_an_env_whose_constructor_takes_no_render_mode_is_made_as_gym_makes_it() -> None:
    """gym.make("NoRenderMode-v0") works; rlfleet passed render_mode=None to every env, which such an env refuses."""
    import space_envs  # noqa: F401  # registers it

    env = make_env("NoRenderMode-v0", seed=0)
    assert env.reset(seed=0)[0].shape == (2,)
    env.close()


def test_make_env_from_callable() -> None:
    env = make_env(lambda: gym.make("CartPole-v1"), seed=1)
    obs, _ = env.reset()
    assert obs.shape == (4,)
    assert count_wrappers(env, RecordEpisodeStatistics) == 1
    already_recorded = make_env(lambda: RecordEpisodeStatistics(gym.make("CartPole-v1")))
    assert count_wrappers(already_recorded, RecordEpisodeStatistics) == 1
    with pytest.raises(ValueError, match="callable"):
        make_env(lambda: gym.make("CartPole-v1"), frame_stack=4)
    with pytest.raises(TypeError, match="gymnasium.Env"):
        make_env(lambda: 42)


def test_unknown_id_suggests_close_matches() -> None:
    with pytest.raises(UnknownEnvError, match="'CartPole-v1'") as error:
        make_env("CartPol-v1")
    assert isinstance(error.value, ValueError)
    assert "CartPol-v1" in str(error.value)


def test_ale_id_without_ale_py_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ale_py", None)  # makes `import ale_py` raise ImportError
    with pytest.raises(ImportError, match=r'pip install "rlfleet\[atari\]"'):
        make_env("ALE/NotAGame-v5")


def test_invalid_options_are_rejected_early() -> None:
    with pytest.raises(ValueError, match="only apply to Atari"):
        make_env("CartPole-v1", frame_stack=4)
    with pytest.raises(ValueError, match="valid modes"):
        make_vector_env("CartPole-v1", 2, mode="threads")
    with pytest.raises(ValueError, match="n_envs"):
        make_vector_env("CartPole-v1", 0)
    with pytest.raises(ValueError, match="picklable"):
        make_vector_env(lambda: gym.make("CartPole-v1"), 2, mode="async")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("clip_rewards", "no"),
        ("terminal_on_life_loss", "off"),
        ("full_action_space", "no"),
        ("terminal_on_life_loss", 0),
        ("frame_stack", True),
        ("noop_max", False),
        ("repeat_action_probability", True),  # 1: every action repeats the last one, and the agent learns nothing
        ("repeat_action_probability", "0.25"),
    ],
)
def test_atari_switches_take_true_or_false_and_counts_take_whole_numbers(option, value) -> None:
    """An Atari switch given "no" or "off" (text, which Python reads as true) turned the option on; a bool counted as
    an int for frame_stack. Each is one ValueError naming the option, on the Gymnasium and EnvPool paths alike."""
    pytest.importorskip("ale_py")
    with pytest.raises(ValueError, match=f"^{option} must be"):
        make_env("ALE/Pong-v5", **{option: value})


def test_env_spec_info_cartpole() -> None:
    info = env_spec_info("CartPole-v1")
    assert info["reward_threshold"] == 475.0
    assert info["max_episode_steps"] == 500
    assert info["is_atari"] is False
    assert info["observation_space"].shape == (4,)
    assert info["action_space"] == gym.spaces.Discrete(2)
    assert info["family"] is None  # the algorithms' own defaults
    callable_info = env_spec_info(functools.partial(time_limited_cartpole, 7))
    assert callable_info["max_episode_steps"] == 7 and callable_info["reward_threshold"] is None


def test_box_actions_pick_the_continuous_preset() -> None:
    """Pendulum-v1 with no --preset gets ppo's, a2c's and a3c's `continuous` preset; sac has none and keeps its
    defaults; an explicit preset wins."""
    family = env_spec_info("Pendulum-v1")["family"]
    assert family == "continuous"
    for algo in ("ppo", "a2c", "a3c"):
        cfg, preset = build_algo_config(algo, None, {}, family)
        assert preset == "continuous" and cfg.gamma == 0.9
    assert build_algo_config("sac", None, {}, family)[1] is None
    assert build_algo_config("ppo", "atari", {}, family)[1] == "atari"


# ----------------------------------------------------------------------------- velocity-masked CartPole


def test_velocity_masked_cartpole_keeps_positions() -> None:
    env = make_env(CARTPOLE_NO_VELOCITY_ID, seed=0)
    assert env.observation_space.shape == (2,)
    obs, _ = env.reset()
    for action in [0, 1, 1, 0, 1]:
        state = np.asarray(env.unwrapped.state, dtype=np.float32)
        assert obs.shape == (2,)
        np.testing.assert_allclose(obs, state[[0, 2]], rtol=0, atol=1e-6)
        obs, *_ = env.step(action)
    info = env_spec_info(CARTPOLE_NO_VELOCITY_ID)
    assert info["max_episode_steps"] == 500 and info["reward_threshold"] == 475.0
    with pytest.raises(ValueError, match="Box\\(4,\\)"):
        VelocityMaskedObservation(gym.make("Pendulum-v1"))


# ----------------------------------------------------------------------------- seeding


def test_same_seed_same_trajectory_different_seed_differs() -> None:
    actions = [int(a) for a in np.random.default_rng(0).integers(0, 2, size=60)]
    first = run_actions(make_env("CartPole-v1", seed=3), actions)
    second = run_actions(make_env("CartPole-v1", seed=3), actions)
    other = run_actions(make_env("CartPole-v1", seed=4), actions)
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first[0], other[0])
    a, b = make_env("CartPole-v1", seed=5), make_env("CartPole-v1", seed=5)
    assert [a.action_space.sample() for _ in range(20)] == [b.action_space.sample() for _ in range(20)]


def test_vector_env_seeds_sub_env_i_with_seed_plus_i() -> None:
    vector_env = make_vector_env("CartPole-v1", 3, seed=10, mode="sync")
    obs, _ = vector_env.reset()
    for i in range(3):
        single_obs, _ = make_env("CartPole-v1", seed=10 + i).reset()
        np.testing.assert_array_equal(obs[i], single_obs)
    again, _ = make_vector_env("CartPole-v1", 3, seed=10, mode="sync").reset()
    np.testing.assert_array_equal(obs, again)
    assert vector_env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP


# ----------------------------------------------------------------------------- SAME_STEP contract


def check_same_step_termination(vector_env: gym.vector.VectorEnv, n_envs: int, seed: int) -> None:
    """Random actions until sub-envs terminate; check final_obs, reset obs and episode statistics."""
    rng = np.random.default_rng(seed)
    obs, _ = vector_env.reset()
    steps_in_episode = np.zeros(n_envs, dtype=np.int64)
    finished = 0
    for _ in range(500):
        obs, rewards, terminated, truncated, info = vector_env.step(rng.integers(0, 2, size=n_envs))
        steps_in_episode += 1
        done = terminated | truncated
        assert obs.shape == (n_envs, 4) and rewards.shape == (n_envs,)
        if not done.any():
            assert "final_obs" not in info
            continue
        np.testing.assert_array_equal(info["_final_obs"], done)
        for i in range(n_envs):
            if not done[i]:
                assert info["final_obs"][i] is None
                continue
            final_obs = info["final_obs"][i]
            assert final_obs.shape == (4,)
            assert abs(final_obs[0]) > CARTPOLE_X_LIMIT or abs(final_obs[2]) > CARTPOLE_THETA_LIMIT
            assert np.all(np.abs(obs[i]) <= CARTPOLE_RESET_BOUND), "obs must be a fresh reset observation"
        episodes = finished_episodes(info)
        assert [i for i, _, _ in episodes] == list(np.flatnonzero(done))
        for i, episode_return, length in episodes:
            assert length == steps_in_episode[i] and episode_return == length
        np.testing.assert_array_equal(info["_episode"], done)
        steps_in_episode[done] = 0
        finished += int(done.sum())
        if finished >= 2 * n_envs:
            return
    pytest.fail("sub-envs did not terminate within 500 steps of random actions")


def check_truncation(vector_env: gym.vector.VectorEnv, n_envs: int, limit: int) -> None:
    """Balancing actions never terminate before ``limit`` steps; the limit step truncates every sub-env."""
    obs, _ = vector_env.reset()
    for step in range(1, limit + 1):
        obs, _, terminated, truncated, info = vector_env.step(np.full(n_envs, step % 2))
    assert not terminated.any() and truncated.all()
    np.testing.assert_array_equal(info["_final_obs"], np.ones(n_envs, dtype=bool))
    for i in range(n_envs):
        assert info["final_obs"][i].shape == (4,)
        assert not np.array_equal(info["final_obs"][i], obs[i])
        assert np.all(np.abs(obs[i]) <= CARTPOLE_RESET_BOUND)
    assert finished_episodes(info) == [(i, float(limit), limit) for i in range(n_envs)]


def test_sync_vector_env_same_step_termination() -> None:
    vector_env = make_vector_env("CartPole-v1", 4, seed=0)
    assert isinstance(vector_env.unwrapped, SyncVectorEnv)  # "auto" picks sync for classic control
    check_same_step_termination(vector_env, 4, seed=0)
    vector_env.close()


def test_sync_vector_env_truncation_gives_final_obs() -> None:
    vector_env = make_vector_env(functools.partial(time_limited_cartpole, 5), 3, seed=0, mode="sync")
    check_truncation(vector_env, 3, limit=5)
    vector_env.close()


def test_finished_episodes_reads_gymnasium_final_info_layout() -> None:
    mask = np.array([False, True])
    info = {"final_info": {"episode": {"r": np.array([0.0, 3.5]), "l": np.array([0, 7])}, "_episode": mask}}
    assert finished_episodes(info) == [(1, 3.5, 7)]
    assert finished_episodes({}) == []


# ----------------------------------------------------------------------------- EnvPool


def test_envpool_mode_without_envpool_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(ImportError, match="envpool"):
        make_vector_env("CartPole-v1", 2, mode="envpool")


@needs_envpool
def test_envpool_matches_sync_contract_on_cartpole() -> None:
    envpool_env = make_vector_env("CartPole-v1", 4, seed=0, mode="envpool")
    sync_env = make_vector_env("CartPole-v1", 4, seed=0, mode="sync")
    assert isinstance(envpool_env, EnvPoolVectorEnv)
    assert envpool_env.single_observation_space.shape == sync_env.single_observation_space.shape
    assert envpool_env.single_action_space == sync_env.single_action_space
    assert envpool_env.action_space == sync_env.action_space
    assert envpool_env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    check_same_step_termination(envpool_env, 4, seed=0)

    # Same action sequence: same shapes/dtypes; pushing right ends every episode after about 10 steps.
    lengths: dict[str, list[int]] = {}
    for name, vector_env in (("envpool", envpool_env), ("sync", sync_env)):
        vector_env.reset(seed=1)
        lengths[name] = []
        for _ in range(30):
            obs, rewards, terminated, truncated, info = vector_env.step(np.ones(4, dtype=np.int64))
            assert obs.shape == (4, 4) and obs.dtype == np.float32
            assert rewards.dtype == np.float64 and terminated.dtype == np.bool_
            lengths[name] += [length for _, _, length in finished_episodes(info)]
        vector_env.close()
    assert all(8 <= length <= 12 for length in lengths["envpool"] + lengths["sync"])
    assert abs(len(lengths["envpool"]) - len(lengths["sync"])) <= 2


@needs_envpool
def test_envpool_truncation_and_seeding() -> None:
    vector_env = make_vector_env("CartPole-v1", 3, seed=0, mode="envpool", max_episode_steps=5)
    check_truncation(vector_env, 3, limit=5)
    first, _ = vector_env.reset(seed=7)
    again, _ = make_vector_env("CartPole-v1", 3, seed=7, mode="envpool").reset()
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first[0], first[1])
    vector_env.close()


# ----------------------------------------------------------------------------- Atari


@needs_ale
@pytest.mark.atari
def test_atari_training_env_shapes_and_clipped_rewards() -> None:
    env = make_env("ALE/Pong-v5", seed=0, max_episode_steps=200)
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    assert env.action_space == gym.spaces.Discrete(6)
    obs, _ = env.reset()
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    rewards, info, done = [], {}, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        rewards.append(reward)
        done = terminated or truncated
    assert truncated and len(rewards) == 200
    assert set(rewards) <= {-1.0, 0.0, 1.0}
    assert info["episode"]["l"] == 200 and info["episode"]["r"] == sum(rewards)  # Pong scores are +-1
    assert env_spec_info("ALE/Pong-v5")["is_atari"] is True
    env.close()


@needs_ale
@pytest.mark.atari
def test_an_atari_episode_bound_is_the_whole_bound_past_the_ales_own_cap() -> None:
    """The ALE cuts a v5 episode at 108,000 frames (27,000 agent steps) unless the bound replaces it: a bound of
    30,000 steps would otherwise end at 27,000 on the Gymnasium path and at 30,000 on EnvPool's."""
    ale = make_env("ALE/Pong-v5", seed=0).unwrapped.ale  # type: ignore[attr-defined]
    assert ale.getInt("max_num_frames_per_episode") == 108_000
    env = make_env("ALE/Pong-v5", seed=0, max_episode_steps=30_000)
    assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == 0  # type: ignore[attr-defined]  # none
    assert env_spec_info("ALE/Pong-v5", max_episode_steps=30_000)["max_episode_steps"] == 30_000


@needs_ale
@pytest.mark.atari
def test_atari_episode_statistics_are_unclipped() -> None:
    def play(training: bool) -> tuple[list[float], float]:
        env = make_env("ALE/SpaceInvaders-v5", seed=0, training=training, max_episode_steps=250)
        env.reset()
        rewards, done, info = [], False, {}
        while not done:
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            rewards.append(float(reward))
            done = terminated or truncated
        env.close()
        return rewards, float(info["episode"]["r"])

    train_rewards, train_return = play(training=True)
    assert set(train_rewards) <= {0.0, 1.0} and sum(train_rewards) > 0
    assert train_return > sum(train_rewards)  # every Space Invaders alien is worth >= 5 points
    eval_rewards, eval_return = play(training=False)
    assert max(eval_rewards) >= 5.0 and eval_return == sum(eval_rewards)


@needs_ale
@pytest.mark.atari
def test_atari_terminal_on_life_loss_continues_the_game() -> None:
    env = make_env("ALE/Breakout-v5", seed=0, terminal_on_life_loss=True)
    _, info = env.reset()
    lives_at_start = info["lives"]
    terminations = 0
    for _ in range(5000):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            terminations += 1
            if "episode" in info:
                break
            _, reset_info = env.reset()
            assert reset_info["lives"] == lives_at_start - terminations  # same game, one life fewer
    assert terminations == lives_at_start and info["episode"]["l"] > 0

    eval_env = make_env("ALE/Breakout-v5", seed=0, training=False, terminal_on_life_loss=True)
    eval_env.reset()
    for _ in range(5000):
        _, _, terminated, truncated, info = eval_env.step(eval_env.action_space.sample())
        if terminated or truncated:
            break
    assert "episode" in info and info["lives"] == 0  # evaluation plays the whole game
    env.close()
    eval_env.close()


@needs_ale
@pytest.mark.atari
def test_atari_async_vector_env() -> None:
    vector_env = make_vector_env("ALE/Pong-v5", 2, seed=0, max_episode_steps=20)
    assert isinstance(vector_env.unwrapped, AsyncVectorEnv)  # "auto" picks async for Atari
    obs, _ = vector_env.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    for _ in range(20):
        obs, rewards, terminated, truncated, info = vector_env.step(vector_env.action_space.sample())
    assert obs.shape == (2, 4, 84, 84) and rewards.shape == (2,)
    assert truncated.all() and info["final_obs"][0].shape == (4, 84, 84)
    assert [length for _, _, length in finished_episodes(info)] == [20, 20]
    vector_env.close()


def test_mujocos_warnings_reach_the_log_not_stderr_or_a_file_in_the_working_folder(
    tmp_path, monkeypatch, capfd, caplog
):
    """HalfCheetah's model file makes MuJoCo warn of a deprecated attribute each time it is compiled; MuJoCo's own
    handler prints it and appends it to MUJOCO_LOG.TXT in the working folder."""
    pytest.importorskip("mujoco")
    import logging

    from rlfleet.envs import make_env

    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="rlfleet.envs.make"):
        make_env("HalfCheetah-v5").close()
        make_env("HalfCheetah-v5", ctrl_cost_weight=0.2).close()
    assert list(tmp_path.iterdir()) == []
    assert "settotalmass" not in capfd.readouterr().err
    assert "MuJoCo: compiler attribute 'settotalmass' is deprecated" in caplog.text

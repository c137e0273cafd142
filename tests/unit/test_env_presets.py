"""Per-env presets (a data file of tuned settings, picked by env id, `--preset` still overriding) and the hint of a
continuous-control run that never beat a policy that does nothing."""

from __future__ import annotations

import logging
import math

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.algos import resolve
from rlfleet.algos.env_presets import all_env_presets, env_preset
from rlfleet.envs import make_vector_env
from rlfleet.fields import ConfigError
from rlfleet.run.config import build_algo_config
from rlfleet.run.hints import DoNothing, exploration_hint

ACT = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))


# ----------------------------------------------------------------------------------------------- presets
def shown(value) -> str:
    """A setting as the "preset for" line writes it: hidden sizes as `256,256`."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def test_every_per_env_preset_is_a_valid_config_and_is_picked_by_env_id(caplog):
    table = all_env_presets()
    assert table["td3"] and table["sac"], "the table is seeded with MountainCarContinuous-v0 for td3 and sac"
    assert {"Hopper-v5", "HalfCheetah-v5"} <= set(table["ppo"]), (
        "and with MuJoCo envs where ppo's family preset is slow"
    )
    for algo, envs in table.items():
        for env in envs:
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="rlfleet.run.config"):
                cfg, preset = build_algo_config(algo, None, {}, "continuous", env)
            assert [r.getMessage() for r in caplog.records] == [
                f"preset for {env}: {algo} with "
                + ", ".join(f"{k}={shown(v)}" for k, v in env_preset(algo, env).items())
                + " (--preset default: the algorithm's own defaults)"
            ]
            assert preset == env
            for key, value in env_preset(algo, env).items():
                assert getattr(cfg, key) == value, (algo, env, key)
            # --preset overrides; "default" is the algorithm's own defaults; --set still wins over the entry
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="rlfleet.run.config"):
                default_cfg, none = build_algo_config(algo, "default", {}, "continuous", env)
            assert none is None and default_cfg == resolve(algo)[1](**resolve(algo)[3])
            assert caplog.records == []  # nothing picked, nothing said
            assert build_algo_config(algo, None, {"gamma": "0.5"}, None, env)[0].gamma == 0.5


def test_a_mujoco_env_with_an_entry_picks_it_over_the_family_preset():
    cfg, preset = build_algo_config("ppo", None, {}, "mujoco", "Hopper-v5")
    assert preset == "Hopper-v5"
    # rl-zoo3's tuned entry, not the family preset's 2,048-step segments, 64-64 tanh nets and annealed lr
    assert (cfg.rollout_len, cfg.minibatch_size, cfg.epochs, cfg.hidden, cfg.activation) == (
        512,
        32,
        5,
        (256, 256),
        "relu",
    )
    assert (cfg.lr, cfg.lr_anneal, cfg.gamma, cfg.obs_norm, cfg.reward_norm) == (9.80828e-05, False, 0.999, True, True)
    assert cfg.init_std == math.exp(-2)
    assert build_algo_config("ppo", None, {}, "mujoco", "HalfCheetah-v5")[0].epochs == 20
    # an env without an entry, or --preset mujoco, still gets the family preset
    for env, named in (("Walker2d-v5", None), ("Hopper-v5", "mujoco")):
        cfg, preset = build_algo_config("ppo", named, {}, "mujoco", env)
        assert preset == "mujoco" and (cfg.rollout_len, cfg.hidden, cfg.lr_anneal) == (2048, (64, 64), True)


def test_a_per_env_preset_can_be_named_for_another_env_and_unknown_presets_list_the_choices():
    cfg, preset = build_algo_config("td3", "MountainCarContinuous-v0", {}, "continuous", "Pendulum-v1")
    assert preset == "MountainCarContinuous-v0" and cfg.action_noise == "ou"
    assert build_algo_config("ppo", None, {}, "continuous", "Pendulum-v1")[1] == "continuous"  # no entry: as before
    with pytest.raises(ConfigError) as error:
        build_algo_config("td3", "fast", {}, None, "Pendulum-v1")
    choices = "apex, mujoco, MountainCarContinuous-v0, default"
    assert str(error.value) == f"unknown preset 'fast' for td3; choose one of: {choices}"


# ----------------------------------------------------------------------------------------------- the hint
def test_do_nothing_takes_the_middle_of_the_box():
    policy = DoNothing(ACT)
    actions, _, _ = policy.act(np.zeros((3, 3), np.float32))
    np.testing.assert_array_equal(actions, [[0.0, 5.0]] * 3)
    half_open = gym.spaces.Box(np.array([0.5, -np.inf], np.float32), np.array([np.inf, np.inf], np.float32))
    np.testing.assert_array_equal(DoNothing(half_open).action, [0.5, 0.0])


def test_hint_names_the_options_when_the_best_evaluation_never_beat_doing_nothing():
    def envs():
        return make_vector_env("MountainCarContinuous-v0", 2, seed=0, mode="sync", training=False)

    space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    hint = exploration_hint("td3", -0.01, space, envs, 2, 0)  # doing nothing returns exactly 0 there
    assert "never beat a policy that does nothing (0.00)" in hint and "--set action_noise=ou" in hint
    assert "\n" not in hint
    with_ou = exploration_hint(
        "td3", -0.01, space, envs, 2, 0, build_algo_config("td3", None, {"action_noise": "ou"})[0]
    )
    assert "even with action_noise=ou: try a larger exploration_noise" in with_ou
    assert "--set action_noise=ou" not in with_ou
    assert "--set sde=true" in exploration_hint("sac", 0.0, space, envs, 2, 0)
    own_actor = build_algo_config("sac", None, {"actor_net": "user_nets:Actor"})[0]  # sde refuses it
    hint = exploration_hint("sac", 0.0, space, envs, 2, 0, own_actor)
    assert "--set sde=true" not in hint and "target_entropy_scale" in hint
    assert exploration_hint("td3", 0.5, space, envs, 2, 0) is None  # it did beat doing nothing
    assert exploration_hint("dqn", -1.0, gym.spaces.Discrete(2), envs, 2, 0) is None  # no such options


def test_the_off_policy_mujoco_presets_start_as_their_references_do():
    """SAC's temperature starts at 1 (SB3's ent_coef="auto", CleanRL's log α = 0), learned toward −|A| nats;
    TD3 delays its policy by 2, DDPG (SB3's) steps it with every critic step."""
    sac, _ = build_algo_config("sac", None, {}, "mujoco", "HalfCheetah-v5")
    assert (sac.alpha, sac.auto_alpha, sac.learning_starts, sac.batch_size) == (1.0, True, 10_000, 256)
    td3, _ = build_algo_config("td3", None, {}, "mujoco", "HalfCheetah-v5")
    ddpg, _ = build_algo_config("ddpg", None, {}, "mujoco", "HalfCheetah-v5")
    assert (td3.policy_delay, td3.target_noise, td3.target_noise_clip) == (2, 0.2, 0.5)
    assert ddpg.exploration_noise == td3.exploration_noise == 0.1 and ddpg.learning_starts == 25_000

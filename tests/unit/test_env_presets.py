"""Per-env presets (a data file of tuned settings, picked by env id, `--preset` still overriding) and the hint of a
continuous-control run that never beat a policy that does nothing."""

from __future__ import annotations

import logging

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
def test_every_per_env_preset_is_a_valid_config_and_is_picked_by_env_id(caplog):
    table = all_env_presets()
    assert table["td3"] and table["sac"], "the table is seeded with MountainCarContinuous-v0 for td3 and sac"
    for algo, envs in table.items():
        for env in envs:
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="rlfleet.run.config"):
                cfg, preset = build_algo_config(algo, None, {}, "continuous", env)
            assert [r.getMessage() for r in caplog.records] == [
                f"preset for {env}: {algo} with "
                + ", ".join(f"{k}={v}" for k, v in env_preset(algo, env).items())
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


def test_a_per_env_preset_can_be_named_for_another_env_and_unknown_presets_list_the_choices():
    cfg, preset = build_algo_config("td3", "MountainCarContinuous-v0", {}, "continuous", "Pendulum-v1")
    assert preset == "MountainCarContinuous-v0" and cfg.action_noise == "ou"
    assert build_algo_config("ppo", None, {}, "continuous", "Pendulum-v1")[1] == "continuous"  # no entry: as before
    with pytest.raises(ConfigError) as error:
        build_algo_config("td3", "fast", {}, None, "Pendulum-v1")
    assert str(error.value) == "unknown preset 'fast' for td3; choose one of: mujoco, MountainCarContinuous-v0, default"


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
    assert exploration_hint("td3", 0.5, space, envs, 2, 0) is None  # it did beat doing nothing
    assert exploration_hint("dqn", -1.0, gym.spaces.Discrete(2), envs, 2, 0) is None  # no such options

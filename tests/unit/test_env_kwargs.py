"""`--env-kwargs KEY=VALUE` / `env_kwargs={...}`: items parsed and typed, the run option checked, and the env's own
refusals (an unknown keyword, a value it rejects) as one line before a run writes anything."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from rlfleet import train
from rlfleet.cli import build_parser
from rlfleet.envs.kwargs import env_info, parse_env_kwargs
from rlfleet.run.config import ConfigError, RunConfig, check_run_config

HAS_ALE = importlib.util.find_spec("ale_py") is not None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("false", False),
        ("True", True),
        ("TRUE", True),
        ("5", 5),
        ("-3", -3),
        ("5.0", 5.0),
        ("1e-3", 0.001),
        ("None", None),
        ("null", None),
        ("8x8", "8x8"),
        ("'8x8'", "8x8"),
        ('"None"', "None"),
        ("'5'", "5"),
        ("[1, 2]", [1, 2]),
        ("['SFF', 'FHF', 'FFG']", ["SFF", "FHF", "FFG"]),
        ("a b", "a b"),
        ("a=b", "a=b"),
        ("1j", "1j"),
        ("[false, true]", [False, True]),  # the words inside a list or dict are typed as they are alone
        ('{"a": null, "b": TRUE}', {"a": None, "b": True}),
        ("['false', none]", ["false", None]),  # quoted: text
        ("[a, b]", "[a, b]"),
    ],
)
def test_values_are_typed(text: str, value):
    parsed = parse_env_kwargs([f"key={text}"])["key"]
    assert parsed == value and type(parsed) is type(value)


def test_inf_is_a_float_and_items_add_up():
    assert parse_env_kwargs(["x=inf"])["x"] == math.inf
    assert parse_env_kwargs(["map_name=8x8", " is_slippery = false "]) == {"map_name": "8x8", "is_slippery": False}


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        (["foo"], ["--env-kwargs expects KEY=VALUE", "'foo'"]),
        (["=5"], ["--env-kwargs expects KEY=VALUE", "'=5'"]),
        (["bad-key=1"], ["'bad-key'", "not a keyword argument name"]),
        (["g="], ["'g='", "no value"]),
        (["g=1", "g=2"], ["'g' twice"]),
    ],
)
def test_malformed_items_are_one_line(items: list[str], expected: list[str]):
    with pytest.raises(ConfigError) as err:
        parse_env_kwargs(items)
    assert "\n" not in str(err.value)
    for text in expected:
        assert text in str(err.value)


def test_the_flag_takes_several_items_and_repeats():
    args = build_parser().parse_args(
        ["train", "dqn", "--env", "FrozenLake-v1", "--env-kwargs", "map_name=8x8", "is_slippery=false"]
        + ["--env-kwargs", "success_rate=0.5"]
    )
    assert args.env_kwargs == ["map_name=8x8", "is_slippery=false", "success_rate=0.5"]
    assert "env_kwargs" not in vars(build_parser().parse_args(["train", "dqn", "--env", "CartPole-v1"]))


def test_the_built_env_is_the_variant():
    assert env_info("Pendulum-v1", {"max_episode_steps": 50})["max_episode_steps"] == 50
    assert env_info("Pendulum-v1", {})["max_episode_steps"] == 200


@pytest.mark.parametrize(
    ("env", "kwargs", "expected"),
    [
        (
            "CartPole-v1",
            {"sutton_barto_rewrd": True},
            [
                "env CartPole-v1 does not take the keyword argument 'sutton_barto_rewrd'",
                "did you mean 'sutton_barto_reward'?",
                "(its keyword arguments: sutton_barto_reward, max_episode_steps, disable_env_checker)",
            ],
        ),
        ("Pendulum-v1", {"g": 5.0, "l": 2, "m": 1}, ["keyword arguments 'l', 'm'", "its keyword arguments: g, "]),
        ("Pendulum-v1", {"g": "abc"}, ["env Pendulum-v1 rejects --env-kwargs g='abc': TypeError"]),
        ("CartPole-v1", {"max_episode_steps": -3}, ["rejects --env-kwargs max_episode_steps=-3", "positive"]),
        ("CartPole-v1", {"frame_stack": 2}, ["['frame_stack'] only apply to Atari envs"]),
    ],
)
def test_what_the_env_refuses_is_one_line(env: str, kwargs: dict, expected: list[str]):
    with pytest.raises(ConfigError) as err:
        env_info(env, kwargs)
    assert "\n" not in str(err.value)
    for text in expected:
        assert text in str(err.value)


@pytest.mark.skipif(not HAS_ALE, reason='needs ale-py: pip install "rlfleet[atari]"')
def test_atari_ids_keep_their_options():
    assert env_info("ALE/Pong-v5", {"frame_stack": 2})["observation_space"].shape == (2, 84, 84)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['frame_stak'\] for Atari env .*valid options"):
        env_info("ALE/Pong-v5", {"frame_stak": 2})


def nested(depth: int, kind: type = list):
    """A value `depth` lists (or dicts) deep: deeper than Python's recursion limit, printing it would fail."""
    value: object = 1
    for _ in range(depth):
        value = [value] if kind is list else {"a": value}
    return value


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("g=5", "--env-kwargs='g=5' is not a dict"),
        ({"render_mode": "human"}, "cannot set 'render_mode': the run sets it itself"),
        ({"seed": 3}, "cannot set 'seed'"),
        ({"not a name": 3}, "'not a name', which is not a keyword argument name"),
        ({"g": np.zeros(2)}, "a value for 'g' that the run cannot save with its config (ndarray)"),
        ({"g": nested(5_000)}, "--env-kwargs={'g': [[[[[[...]]]]]]} is nested more than 100 deep"),
        ({"g": nested(101, dict)}, "is nested more than 100 deep"),
    ],
)
def test_the_run_option_is_checked(value, expected: str):
    with pytest.raises(ConfigError) as err:
        check_run_config(RunConfig("ppo", "CartPole-v1", env_kwargs=value))
    assert expected in str(err.value)


def test_the_python_api_refuses_before_writing(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not take the keyword argument 'sutton_barto_rewrd'"):
        train("ppo", "CartPole-v1", env_kwargs={"sutton_barto_rewrd": True}, logdir=str(tmp_path / "runs"))
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "env_kwargs, stop_return, note",
    [
        ({"map_name": "8x8", "is_slippery": False}, None, True),  # the id's 0.7, which the variant did not register
        ({"map_name": "8x8", "is_slippery": False}, 1.0, False),  # given: taken as it is
        ({}, None, False),  # the env as the id builds it: its own threshold
    ],
)
def test_a_variant_run_says_where_its_stop_return_comes_from(env_kwargs, stop_return, note, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="rlfleet.run.config"):
        r = train(
            "dqn",
            "FrozenLake-v1",
            env_kwargs=env_kwargs,
            stop_return=stop_return,
            steps=64,
            eval_every=64,
            eval_episodes=1,
            logdir=str(tmp_path),
        )
    lines = [rec.getMessage() for rec in caplog.records if "stop return" in rec.getMessage()]
    expected = ["stop return 0.7: the reward_threshold of FrozenLake-v1 without --env-kwargs; "
                "set --stop-return if this variant's returns differ"]  # fmt: skip
    assert lines == (expected if note else [])
    assert r.result["stop_return"] == (stop_return if stop_return is not None else 0.7)


def test_an_expert_of_another_variant_is_refused(tmp_path: Path):
    import dataclasses

    import gymnasium as gym

    from rlfleet.algos import resolve
    from rlfleet.data.demos import Demonstrations
    from rlfleet.run.checkpoint import save_checkpoint

    algo_cls, config_cls, _, _ = resolve("ppo")
    env = gym.make("CartPole-v1")
    cfg = config_cls()
    run = RunConfig("ppo", "CartPole-v1", env_kwargs={"sutton_barto_reward": True})
    payload = {
        "run_config": dataclasses.asdict(run),
        "algo_config": dataclasses.asdict(cfg),
        "algo": algo_cls(cfg, env.observation_space, env.action_space).state_dict(),
    }
    expert = save_checkpoint(tmp_path / "expert.pt", payload)
    obs, starts = np.zeros((3, 4), np.float32), np.array([True, False, False])
    demos = Demonstrations(obs, np.zeros(3, np.int64), np.ones(3), starts, "CartPole-v1", env.action_space)
    dataset = demos.save(tmp_path / "demos.npz")
    with pytest.raises(ConfigError, match="with --env-kwargs sutton_barto_reward=True, this run has none"):
        train("bc", "CartPole-v1", dataset=str(dataset), expert=str(expert), logdir=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_a_checkpoint_whose_env_kwargs_are_no_dict_is_refused(tmp_path: Path):
    import dataclasses

    from rlfleet.run.checkpoint import CheckpointError, save_checkpoint
    from rlfleet.run.evaluate import load_agent

    run = {**dataclasses.asdict(RunConfig("ppo", "CartPole-v1")), "env_kwargs": ["g=5"]}
    path = save_checkpoint(tmp_path / "c.pt", {"run_config": run, "algo_config": {}, "algo": {}})
    with pytest.raises(CheckpointError, match=r"env_kwargs that are not a dict: \['g=5'\]"):
        load_agent(path)

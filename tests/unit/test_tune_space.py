"""A sweep's search space: `--search NAME=DIST(ARGS)` parsed, typed and checked against each field's declared range,
and set into a trial's `rlfleet.train` options; the best trial's `rlfleet train` command reads back to its values."""

from __future__ import annotations

import shlex

import pytest

pytest.importorskip("ray.tune", reason="the tune extra is not installed")

from rlfleet.arch.hogwild import HogwildRunner
from rlfleet.arch.single import SingleRunner
from rlfleet.cli import build_parser
from rlfleet.fields import ConfigError
from rlfleet.run.config import parse_overrides
from rlfleet.tuning.report import train_command
from rlfleet.tuning.space import apply, parse_param, parse_space

SINGLE = SingleRunner.Options


def test_each_distribution_is_parsed_and_typed_by_its_field():
    lr = parse_param("lr=loguniform(1e-4, 1e-2)", "ppo", SINGLE)
    assert (lr.kind, lr.dist, lr.args, lr.log_scale) == ("algo", "loguniform", (1e-4, 1e-2), True)
    epochs = parse_param("epochs=randint(2,6)", "ppo", SINGLE)
    assert epochs.args == (2, 6) and all(type(a) is int for a in epochs.args)
    assert epochs.domain().upper == 7  # both ends drawn: Tune's upper end is excluded
    hidden = parse_param("hidden=choice((64,64),(128,128))", "ppo", SINGLE)
    assert hidden.args == ((64, 64), (128, 128))  # each value typed as --set types it
    anneal = parse_param("lr_anneal=choice(true,false)", "ppo", SINGLE)
    assert anneal.args == (True, False)
    seed = parse_param("seed=randint(0,9)", "ppo", SINGLE)
    assert seed.kind == "run"
    workers = parse_param("workers=choice(1,2,4)", "a3c", HogwildRunner.Options)
    assert (workers.kind, workers.args) == ("option", (1, 2, 4))
    env = parse_param("env_kwargs.gravity=choice(9.8,'x',true)", "ppo", SINGLE)
    assert (env.kind, env.args) == ("env", (9.8, "x", True))  # typed as --env-kwargs types its values


@pytest.mark.parametrize(
    "spec, says",
    [
        ("lr=uniform(-1,1)", "ppo config lr=-1.0 is negative: must be >= 0"),
        ("gamma=choice(0.99,1.5)", "ppo config gamma=1.5 is out of range: must be in [0, 1]"),
        ("clip=uniform(0,0.3)", "ppo config clip=0.0 is out of range: must be > 0"),
        ("lr=loguniform(0,1e-2)", "loguniform's low end must be above 0"),
        ("lr=loguniform(1e-2,1e-4)", "the high end must be above the low end"),
        ("lr=loguniform(1e-4)", "loguniform takes two numbers"),
        ("lr=uniform(a,1)", "'a' is not a number"),
        ("lr=uniform(0,inf)", "must be finite"),
        ("epochs=uniform(1,10)", "is an int field; uniform draws floats (use randint or choice)"),
        ("epochs=randint(1.5,3)", "randint takes two integers"),
        ("epochs=randint(5,3)", "the high end 3 is below the low end 5"),
        ("epochs=randint(0,3)", "ppo config epochs=0 is out of range: must be >= 1"),
        ("activation=uniform(0,1)", "is a str field; uniform draws floats (use choice)"),
        ("epochs=choice(2,x)", "bad value 'x' for epochs"),
        ("lr=normal(0,1)", "unknown distribution 'normal'"),
        ("lr~loguniform(1e-4,1e-2)", "is not NAME=DIST(ARGS)"),
        ("lr=choice()", "choice takes one or more values"),
        ("learning_rate=uniform(0,1)", "not a field of ppo's config"),
        ("logdir=choice(a,b)", "a sweep's trials share their logdir"),
        ("workers=choice(1,2)", "not a field of ppo's config"),  # single has no --workers
        ("env_kwargs.=choice(1)", "name the keyword"),
        ("n_envs=randint(1,100000)", "ppo config n_envs=100000 is out of range: must be in [1, 4096]"),
    ],
)
def test_a_bad_search_item_is_one_line_naming_it(spec, says):
    with pytest.raises(ConfigError) as err:
        parse_param(spec, "ppo", SINGLE)
    message = str(err.value)
    assert says in message and "\n" not in message
    assert message.startswith("--search")


def test_a_name_searched_twice_is_refused():
    with pytest.raises(ConfigError, match="--search lr is given twice"):
        parse_space(["lr=uniform(0,1)", "lr=choice(0.1)"], "ppo", SINGLE)


def test_a_trial_sample_goes_where_each_name_belongs():
    params = parse_space(
        ["lr=loguniform(1e-4,1e-2)", "seed=randint(0,3)", "env_kwargs.sutton_barto_reward=choice(true,false)"],
        "ppo",
        SINGLE,
    )
    fixed = {"steps": 5000, "overrides": {"epochs": "4"}, "env_kwargs": {"render_mode": None}}
    options = apply(params, {"lr": 3e-3, "seed": 2, "env_kwargs.sutton_barto_reward": True}, fixed)
    assert options == {
        "steps": 5000,
        "seed": 2,
        "overrides": {"epochs": "4", "lr": 3e-3},
        "env_kwargs": {"render_mode": None, "sutton_barto_reward": True},
    }
    assert fixed == {"steps": 5000, "overrides": {"epochs": "4"}, "env_kwargs": {"render_mode": None}}  # untouched


def test_the_best_trials_command_reads_back_to_its_options():
    options = {
        "steps": 30000,
        "seed": 3,
        "arch": "hogwild",
        "workers": 2,
        "oversubscribe": True,
        "progress": False,
        "overrides": {"lr": 0.0012345678901234567, "hidden": (32, 32), "lr_anneal": False, "activation": "relu"},
        "env_kwargs": {"map_name": "8x8", "label": "12"},
    }
    command = train_command("a3c", "CartPole-v1", options)
    argv = shlex.split(command)
    assert argv[:3] == ["rlfleet", "train", "a3c"]
    args = build_parser().parse_args(argv[1:])
    assert (args.env, args.steps, args.seed, args.arch, args.workers, args.oversubscribe) == (
        "CartPole-v1", 30000, 3, "hogwild", 2, True
    )  # fmt: skip
    from rlfleet.envs.kwargs import parse_env_kwargs
    from rlfleet.run.config import parse_field

    overrides = {k: parse_field("a3c", k, v) for k, v in parse_overrides(args.set).items()}
    assert overrides == {"lr": 0.0012345678901234567, "hidden": (32, 32), "lr_anneal": False, "activation": "relu"}
    assert parse_env_kwargs(args.env_kwargs) == {"map_name": "8x8", "label": "12"}  # "12" stays text

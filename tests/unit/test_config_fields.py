"""Config fields declare the values they allow (`rlfleet.fields`), and one check refuses every other value.

The cases are generated from the dataclasses themselves, so a field added later is covered the day it is added:
every number field of every algorithm's `Config` and of `RunConfig` has a declared range, every float must be
finite, every field's type is checked, and every preset lies inside the ranges.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing

import numpy as np
import pytest

from rlfleet import train
from rlfleet.algos import REGISTRY, resolve
from rlfleet.fields import CHECK, Bounds, ConfigError, field_bounds
from rlfleet.launch import check_run
from rlfleet.run.checkpoint import load_checkpoint
from rlfleet.run.config import RunConfig, build_algo_config

ALGOS = sorted(REGISTRY)

# number fields where every finite value means something, so they declare no range
UNBOUNDED = {
    "target_entropy_scale",  # SAC: the target entropy is -scale * |A|; either sign is a valid target
    "stop_return",  # any return can be the one that counts as solved
}


def number_kind(annotation) -> type | None:
    """int or float for a number field (also `X | None` and `tuple[X, ...]`), else None."""
    args = typing.get_args(annotation)
    if annotation in (int, float):
        return annotation
    if typing.get_origin(annotation) is tuple:
        return number_kind(args[0])
    numbers = [a for a in args if a in (int, float)]
    return numbers[0] if len(numbers) == 1 and set(args) <= {numbers[0], type(None)} else None


def config_fields(cls) -> list[tuple[dataclasses.Field, object]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def algo_number_fields() -> list[tuple[str, str, object, Bounds | None]]:
    out = []
    for algo in ALGOS:
        for f, annotation in config_fields(resolve(algo)[1]):
            if number_kind(annotation) is not None:
                out.append((algo, f.name, annotation, field_bounds(f)))
    return out


def outside(bounds: Bounds, annotation) -> list:
    """Values just outside the declared range (below its low end, above its high end); tuples for tuple fields."""
    kind = number_kind(annotation)
    step = 1 if kind is int else 1e-3
    values = []
    if bounds.ge is not None:
        values.append(bounds.ge - step)
    if bounds.gt is not None:
        values.append(bounds.gt)
    if bounds.le is not None:
        values.append(bounds.le + step)
    if bounds.lt is not None:
        values.append(bounds.lt)
    values = [kind(v) for v in values]
    return [(v,) for v in values] if typing.get_origin(annotation) is tuple else values


def test_every_number_field_declares_its_range():
    undeclared = [f"{algo} {name}" for algo, name, _, bounds in algo_number_fields() if bounds is None]
    undeclared += [
        f"RunConfig {f.name}"
        for f, annotation in config_fields(RunConfig)
        if number_kind(annotation) is not None and field_bounds(f) is None
    ]
    assert [u for u in undeclared if u.split()[-1] not in UNBOUNDED] == []


@pytest.mark.parametrize("algo, name, annotation, bounds", [c for c in algo_number_fields() if c[3] is not None])
def test_values_outside_a_declared_range_are_refused(algo, name, annotation, bounds):
    values = outside(bounds, annotation)
    assert values, f"{algo} {name}: a range without ends"
    for value in values:
        with pytest.raises(ConfigError) as error:
            build_algo_config(algo, None, {name: value})
        message = str(error.value)
        assert f"{algo} config {name}=" in message and f"must be {bounds}" in message, message
        assert "\n" not in message


@pytest.mark.parametrize("algo", ALGOS)
def test_every_float_must_be_finite(algo):
    for f, annotation in config_fields(resolve(algo)[1]):
        if number_kind(annotation) is not float:
            continue
        for value in (math.nan, math.inf, -math.inf):
            bad = (value,) if typing.get_origin(annotation) is tuple else value
            with pytest.raises(ConfigError, match=rf"{algo} config {f.name}=.* is not a finite number"):
                build_algo_config(algo, None, {f.name: bad})
        # the text of `--set` takes the same way
        with pytest.raises(ConfigError, match=rf"{f.name}=.*finite"):
            build_algo_config(algo, None, {f.name: "nan" if typing.get_origin(annotation) is not tuple else "nan,1"})


WRONG_TYPE = {int: 2.5, float: (1.0,), bool: 1, str: 3, dict[str, typing.Any]: [1]}


@pytest.mark.parametrize("algo", ALGOS)
def test_every_field_is_checked_for_its_type(algo):
    for f, annotation in config_fields(resolve(algo)[1]):
        origin = typing.get_origin(annotation)
        bad = 64 if origin is tuple else WRONG_TYPE[annotation]  # Python values skip the parsing of `--set`
        with pytest.raises(ConfigError, match=rf"{algo} config {f.name}=.* is not a"):
            build_algo_config(algo, None, {f.name: bad})


def algo_text_fields() -> list[tuple[str, str]]:
    return [(algo, f.name) for algo in ALGOS for f, annotation in config_fields(resolve(algo)[1]) if annotation is str]


@pytest.mark.parametrize("algo, name", algo_text_fields())
def test_every_text_field_declares_the_values_it_takes(algo, name):
    """A name no network, optimizer or target knows is refused with the config, also where the run would not read
    it (an activation under a network of the user's own, log_std on Discrete actions)."""
    f = config_fields_by_name(algo)[name]
    assert f.metadata.get(CHECK) is not None, f"{algo} config {name} declares no check"
    with pytest.raises(ConfigError, match=rf"{algo} config {name}='no-such-thing' "):
        build_algo_config(algo, None, {name: "no-such-thing"})


def config_fields_by_name(algo: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(resolve(algo)[1])}


REPLAY_ALGOS = [algo for algo in ALGOS if "buffer_size" in config_fields_by_name(algo)]


def test_every_replay_algorithm_is_checked():
    assert REPLAY_ALGOS == ["ddpg", "dqn", "sac", "td3"]


@pytest.mark.parametrize("algo", REPLAY_ALGOS)
@pytest.mark.parametrize("preset", [None, "lstm"])
def test_a_replay_that_never_holds_a_batch_or_learning_starts_is_refused(algo, preset):
    """Learning starts once the replay holds max(batch_size, learning_starts) transitions, and it never holds more
    than buffer_size: past that, a run would step its envs to the end without one update (dqn's recurrent replay
    too, whose batches count sequences)."""
    if preset is not None and preset not in resolve(algo)[2]:
        pytest.skip(f"{algo} has no {preset} preset")
    with pytest.raises(ConfigError) as error:
        build_algo_config(algo, preset, {"buffer_size": 100, "batch_size": 101, "learning_starts": 0})
    assert f"{algo} config buffer_size=100 holds fewer transitions than a batch (batch_size=101)" in str(error.value)
    with pytest.raises(ConfigError) as error:
        build_algo_config(algo, preset, {"buffer_size": 100, "batch_size": 16, "learning_starts": 101})
    assert f"{algo} config learning_starts=101 is more than buffer_size=100" in str(error.value)
    cfg, _ = build_algo_config(algo, preset, {"buffer_size": 100, "batch_size": 100, "learning_starts": 100})
    assert cfg.buffer_size == cfg.batch_size == cfg.learning_starts == 100  # a full replay is ready


@pytest.mark.parametrize("algo", ALGOS)
def test_every_preset_lies_inside_the_ranges(algo):
    _, _, presets, _ = resolve(algo)
    for preset in [None, *presets]:
        build_algo_config(algo, preset, {})


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"gamma": "1.5"}, ["ppo config gamma=1.5 is out of range", "must be in [0, 1]"]),
        ({"lr": "inf"}, ["ppo config lr=inf is not a finite number", "must be >= 0"]),
        ({"clip": "0"}, ["ppo config clip=0.0 is out of range", "must be > 0"]),
        ({"lr": "-0.1"}, ["ppo config lr=-0.1 is negative", "must be >= 0"]),
        ({"hidden": "64,0"}, ["ppo config hidden=(64, 0)", "every entry must be >= 1"]),
        ({"n_envs": 2.5}, ["ppo config n_envs=2.5 is not an int"]),
        ({"n_envs": True}, ["ppo config n_envs=True is not an int"]),
        ({"n_envs": "1e400"}, ["bad value '1e400' for n_envs"]),
        ({"lr_anneal": 1}, ["ppo config lr_anneal=1 is not a bool"]),
        ({"obs_clip": "0"}, ["ppo config obs_clip=0.0 is out of range", "must be > 0"]),
    ],
)
def test_config_messages_name_the_field_the_value_and_the_range(overrides, fragments):
    with pytest.raises(ConfigError) as error:
        build_algo_config("ppo", None, overrides)
    for fragment in fragments:
        assert fragment in str(error.value)


# the same for run options through the Python API: ConfigError, and nothing written
RUN_OPTION_ERRORS = {
    "steps-zero": (dict(steps=0), ["--steps=0", "must be >= 1"]),
    "steps-text": (dict(steps="100"), ["--steps='100' is not an int"]),
    "seed-negative": (dict(seed=-1), ["--seed=-1 is negative", "must be in [0, 2147483647]"]),
    "seed-past-64-bits": (dict(seed=2**64), ["--seed=18446744073709551616 is out of range", "[0, 2147483647]"]),
    "n-envs-float": (dict(n_envs=2.0), ["--n-envs=2.0 is not an int"]),
    "time-limit-negative": (dict(time_limit=-1.0), ["--time-limit=-1.0 is negative", "must be > 0"]),
    "time-limit-zero": (dict(time_limit=0), ["--time-limit=0 is out of range", "must be > 0"]),
    "time-limit-nan": (dict(time_limit=math.nan), ["--time-limit=nan is not a number"]),
    "stop-return-nan": (dict(stop_return=math.nan), ["--stop-return=nan is not a number"]),
    "eval-episodes-zero": (dict(eval_episodes=0), ["--eval-episodes=0", "must be in [1, 4096]"]),
    "eval-episodes-huge": (dict(eval_episodes=10**7), ["--eval-episodes=10000000", "must be in [1, 4096]"]),
    "n-envs-huge": (dict(n_envs=10**9), ["--n-envs=1000000000", "must be in [1, 4096]"]),
    "eval-max-steps-zero": (dict(eval_max_steps=0), ["--eval-max-steps=0 is out of range", "must be >= 1"]),
    "eval-max-steps-float": (dict(eval_max_steps=2.5), ["--eval-max-steps=2.5 is not an int"]),
    "eval-every-negative": (dict(eval_every=-5), ["--eval-every=-5 is negative"]),
    "workers-zero": (dict(arch="data_parallel", workers=0), ["--workers=0", "must be in [1, 1024]"]),
    # absurd counts are refused before they reach the allocator or the OS
    "workers-huge": (dict(arch="data_parallel", workers=10**9), ["--workers=1000000000", "must be in [1, 1024]"]),
    "learners-huge": (dict(arch="gossip", learners=10**9), ["--learners=1000000000", "must be in [1, 1024]"]),
    "actors-huge": (dict(arch="apex", actors=10**6), ["--actors=1000000", "must be in [1, 1024]"]),
    "replay-shards-huge": (dict(arch="apex", replay_shards=10**6), ["--replay-shards=1000000", "[1, 1024]"]),
    "shards-huge": (dict(arch="param_server", shards=10**6), ["--shards=1000000", "must be in [1, 1024]"]),
    "torch-threads-huge": (dict(torch_threads=10**6), ["--torch-threads=1000000", "must be in [1, 1024]"]),
    "torch-threads-past-64-bits": (dict(torch_threads=10**23), ["--torch-threads=" + "1" + "0" * 23, "[1, 1024]"]),
    "grad-sets-negative": (dict(arch="grad_parallel", grad_sets=-1), ["--grad-sets=-1 is negative"]),
    "max-restarts-negative": (dict(arch="hogwild", max_restarts=-1), ["--max-restarts=-1 is negative"]),
    # an architecture's option given to another: where it belongs, and what this one has
    "workers-on-single": (
        dict(workers=2),
        ["--workers is an option of hogwild, data_parallel, grad_parallel", "not of single", "its options: none"],
    ),
    "grad-sets-on-hogwild": (
        dict(arch="hogwild", grad_sets=2),
        ["--grad-sets is an option of grad_parallel", "not of hogwild", "--workers", "--optimizer"],
    ),
    "unknown-option": (dict(wrokers=2), ["unknown run option(s) ['wrokers']", "workers", "grad_sets"]),
    "torch-threads-zero": (dict(torch_threads=0), ["--torch-threads=0", "must be in [1, 1024], or auto"]),
    "vector-mode-unknown": (dict(vector_mode="fast"), ["--vector-mode='fast'", "auto, sync, async, envpool"]),
    "progress-not-bool": (dict(progress="no"), ["progress='no' is not a bool"]),
    "overrides-not-dict": (dict(overrides=["lr=1"]), ["--set", "is not a dict"]),
    "name-parent": (dict(name=".."), ["--name='..'", "a single folder name"]),
    "name-separator": (dict(name="a/b"), ["--name='a/b'", "a single folder name"]),
    "name-escapes": (dict(name="../x"), ["--name='../x'", "a single folder name"]),
}


@pytest.mark.parametrize("case", list(RUN_OPTION_ERRORS))
def test_run_options_are_checked_before_anything_is_written(tmp_path, case):
    logdir = tmp_path / "runs"
    options, fragments = RUN_OPTION_ERRORS[case]
    with pytest.raises(ConfigError) as error:
        train("ppo", "CartPole-v1", logdir=str(logdir), **{"progress": False, **options})
    for fragment in fragments:
        assert fragment in str(error.value), str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_an_empty_env_id_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--env=''"):
        train("ppo", "", logdir=str(tmp_path), progress=False)


def test_a_path_object_is_a_fine_logdir(tmp_path):
    """Path options are kept as text: a PosixPath in the checkpoint made it unreadable (weights_only loading)."""
    result = train("ppo", "CartPole-v1", logdir=tmp_path, name="p", steps=256, eval_episodes=1, progress=False)
    assert result.run_dir == tmp_path / "p"
    assert load_checkpoint(result.run_dir)["run_config"]["logdir"] == str(tmp_path)


def test_runs_started_in_the_same_second_get_their_own_default_folders(tmp_path, monkeypatch):
    import rlfleet.run.runner as runner
    from rlfleet import train

    monkeypatch.setattr(runner, "_run_name", lambda cfg: "same-second")
    first = train("a2c", "CartPole-v1", steps=64, eval_every=64, eval_episodes=1, logdir=str(tmp_path), progress=False)
    second = train("a2c", "CartPole-v1", steps=64, eval_every=64, eval_episodes=1, logdir=str(tmp_path), progress=False)
    assert first.run_dir.name == "same-second" and second.run_dir.name == "same-second-2"
    assert (first.run_dir / "result.json").exists() and (second.run_dir / "result.json").exists()


def test_a_presets_replay_is_shrunk_to_half_the_machines_memory_and_the_users_is_kept(monkeypatch, caplog):
    """The paper's 2M Atari transitions (2 x 4 x 84 x 84 bytes each, with the next observation) on a machine of
    1 GB: half of it holds 1e9 / 2 / (2 * 28,224 + 64) = 8,847 transitions."""
    import logging

    import gymnasium as gym
    import numpy as np

    import rlfleet.run.config as config

    monkeypatch.setattr(config, "machine_memory", lambda: 10**9)
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    cfg, preset = build_algo_config("dqn", "apex", {})
    with caplog.at_level(logging.INFO, logger="rlfleet.run.config"):
        config.fit_preset_replay(cfg, {}, frames, preset)
    assert cfg.buffer_size == 10**9 // 2 // (2 * 4 * 84 * 84 + 64) == 8_847
    assert "buffer_size 2,000,000 (preset 'apex') would take ~113 GB once full" in caplog.text
    mine, _ = build_algo_config("dqn", "apex", {"buffer_size": "2e6"})
    config.fit_preset_replay(mine, {"buffer_size": "2e6"}, frames, preset)
    assert mine.buffer_size == 2_000_000  # the user's own choice stands


def test_a_replay_shrunk_below_the_presets_learning_starts_starts_learning_once_full(monkeypatch, caplog):
    """The apex preset learns once 50,000 transitions are stored: a replay fitted to 8,847 would never hold them, so
    learning starts once it is full, and the line says so; a learning_starts of the user's own is refused instead."""
    import logging

    import gymnasium as gym
    import numpy as np

    import rlfleet.run.config as config

    monkeypatch.setattr(config, "machine_memory", lambda: 10**9)
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    cfg, preset = build_algo_config("dqn", "apex", {})
    assert cfg.learning_starts == 50_000
    with caplog.at_level(logging.INFO, logger="rlfleet.run.config"):
        config.fit_preset_replay(cfg, {}, frames, preset)
    assert cfg.buffer_size == cfg.learning_starts == 8_847
    assert "and learning starts once it is full (the preset's learning_starts: 50,000)" in caplog.text
    mine, _ = build_algo_config("dqn", "apex", {"learning_starts": "20000"})
    with pytest.raises(ConfigError, match="learning_starts=20000 is more than the 8,847 transitions"):
        config.fit_preset_replay(mine, {"learning_starts": "20000"}, frames, preset)


def test_meta_is_the_tests_own_device(tmp_path):
    """`--device meta` (no values: nothing would be learned) is refused outside the `meta_device` fixture, before a
    run folder is made."""
    with pytest.raises(ConfigError, match="device.*must be one of auto, cpu, cuda, cuda:N"):
        train("ppo", "CartPole-v1", device="meta", logdir=str(tmp_path), progress=False)
    assert not any(tmp_path.iterdir())


def test_numpy_scalars_are_taken_as_the_python_numbers_they_stand_for(tmp_path):
    """`for seed in np.arange(3): train(..., seed=seed)`: a NumPy integer seed reached the vector env, which took it
    for a list of seeds (a TypeError from inside gymnasium), and `config.json` held a NumPy step count as text."""
    result = train("ppo", "CartPole-v1", seed=np.int64(1), steps=np.int64(300), stop_return=np.float32(1e9),
                   overrides={"gamma": np.float64(0.98)}, logdir=str(tmp_path), progress=False)  # fmt: skip
    saved = json.loads((result.run_dir / "config.json").read_text())
    assert (saved["run"]["seed"], saved["run"]["steps"], saved["algo"]["gamma"]) == (1, 300, 0.98)
    assert type(load_checkpoint(result.run_dir)["run_config"]["seed"]) is int


@pytest.mark.parametrize(
    "given, message",
    [
        ({"callbacks": "x"}, "callbacks='x' is not a list of callables"),
        ({"callbacks": [print, 1]}, "callbacks=[<built-in function print>, 1] is not a list of callables"),
        ({"resume": 5}, "resume=5 is not a path"),
    ],
)
def test_train_s_own_arguments_are_checked_before_anything_is_written(tmp_path, given, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        train("ppo", "CartPole-v1", steps=300, logdir=str(tmp_path), progress=False, **given)
    assert not any(tmp_path.iterdir())


def test_config_and_result_are_strict_json_with_infinite_values(tmp_path):
    """--stop-return inf and --time-limit inf were written as Infinity, which only Python's reader takes."""
    result = train("ppo", "CartPole-v1", steps=300, stop_return=math.inf, time_limit=math.inf, logdir=str(tmp_path),
                   progress=False)  # fmt: skip

    def strict(text: str) -> dict:
        return json.loads(text, parse_constant=lambda word: pytest.fail(f"{word} is not JSON"))

    config = strict((result.run_dir / "config.json").read_text())
    assert config["run"]["stop_return"] == config["run"]["time_limit"] == "inf" and float(config["stop_return"]) > 0
    assert strict((result.run_dir / "result.json").read_text())["stop_return"] == "inf"


def test_settings_that_need_a_switch_pass_with_it():
    """The other side of the refusals of idle settings (tests/smoke/test_cli.py): with the switch they need, or
    on an architecture that turns it on (apex's replay is always prioritized), they are taken."""
    resolved, _ = check_run("td3", "Pendulum-v1", overrides={"action_noise": "ou", "ou_theta": "0.5"})
    assert resolved.algo_cfg.ou_theta == 0.5
    resolved, _ = check_run("dqn", "CartPole-v1", arch="apex", overrides={"alpha": "0.7", "beta": "0.5"})
    assert (resolved.algo_cfg.alpha, resolved.algo_cfg.beta) == (0.7, 0.5)
    resolved, _ = check_run("ppo", "CartPole-v1", steps=600, overrides={"total_steps": "600", "lr": "1e-3"})
    assert resolved.total_steps == 600


def test_vector_mode_is_taken_on_atari_by_every_architecture():
    """Atari evaluation envs follow --vector-mode on every architecture (async by default: ten processes), so it
    is no idle setting there, as it is for the training envs of workers that step their own."""
    resolved, _ = check_run("a2c", "ALE/Pong-v5", arch="data_parallel", vector_mode="sync", steps=1_000)
    assert resolved.opts.workers >= 1
    with pytest.raises(ConfigError, match="--vector-mode sync has no effect on --arch data_parallel"):
        check_run("a2c", "CartPole-v1", arch="data_parallel", vector_mode="sync")

"""Every per-env preset of `rlfleet/algos/env_presets.toml` runs (a short run each, picked by the env id alone), and
the CLI says which preset a run picked and, at the end of a run that never beat doing nothing, that the agent
may not be exploring."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from procs import RLFLEET

from rlfleet import train
from rlfleet.algos.env_presets import all_env_presets, env_preset
from rlfleet.run import runner as runner_module

ENTRIES = [(algo, env) for algo, envs in all_env_presets().items() for env in envs]


@pytest.mark.parametrize("algo, env", ENTRIES, ids=[f"{a}-{e}" for a, e in ENTRIES])
def test_every_per_env_preset_runs(algo, env, run_opts):
    result = train(algo, env, seed=0, steps=1_500, eval_every=1_500, eval_episodes=2, **run_opts)
    assert result["env_steps"] >= 1_500 and result["updates"] > 0
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["preset"] == env
    for key, value in env_preset(algo, env).items():
        assert config["algo"][key] == (list(value) if isinstance(value, tuple) else value), key


def rlfleet(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RLFLEET, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )


def test_cli_prints_the_picked_preset_and_the_hint_of_a_run_that_never_beat_doing_nothing(tmp_path):
    common = ("--steps", 1_200, "--eval-every", 600, "--eval-episodes", 2, "--logdir", tmp_path, "--no-progress")
    tuned = rlfleet("train", "td3", "--env", "MountainCarContinuous-v0", "--name", "tuned", *common, cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    first = tuned.stdout.splitlines()[0]
    assert first == (
        "preset for MountainCarContinuous-v0: td3 with action_noise=ou, exploration_noise=0.5, gamma=0.99 "
        "(--preset default: the algorithm's own defaults)"
    )
    # the plain defaults (--preset default) print no preset line; 1,200 steps never beat doing nothing (return 0)
    plain = rlfleet(
        "train", "td3", "--env", "MountainCarContinuous-v0", "--preset", "default", "--name", "plain", *common,
        cwd=tmp_path,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert not lines[0].startswith("preset for")
    assert (
        lines[-1].startswith("hint: the best evaluation (")
        and "never beat a policy that does nothing (0.00)" in lines[-1]
    )
    assert "--set action_noise=ou" in lines[-1]
    result = json.loads((tmp_path / "plain" / "result.json").read_text())
    assert result["exploration_hint"] == lines[-1] and not result["solved"]
    # bad input is still one error line and nothing on stdout: the preset is named once the config is valid
    bad = rlfleet("train", "td3", "--env", "MountainCarContinuous-v0", "--set", "gamma=2", *common, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    # a solved run gets no hint (the solved return set below anything an evaluation can give)
    solved = rlfleet("train", "td3", "--env", "MountainCarContinuous-v0", "--preset", "default", "--name", "solved",
                     "--stop-return", -1e9, *common, cwd=tmp_path)  # fmt: skip
    assert solved.returncode == 0, solved.stderr
    assert json.loads((tmp_path / "solved" / "result.json").read_text())["exploration_hint"] is None
    assert "hint:" not in solved.stdout


def test_a_run_that_made_no_update_is_told_so_not_to_explore_more(tmp_path):
    """Ended before learning_starts, its evaluations are of the initial network: the exploration advice was wrong."""
    result = train("td3", "Pendulum-v1", steps=600, eval_every=600, eval_episodes=1, logdir=str(tmp_path),
                   progress=False)  # fmt: skip
    assert result["updates"] == 0 and result["exploration_hint"] == (
        "hint: the run made no update: its replay learns after learning_starts=1000 env steps; give it more --steps or "
        "a smaller --set learning_starts"
    )


def test_a_hint_that_fails_loses_nothing_of_the_finished_run(tmp_path, monkeypatch):
    """The do-nothing baseline plays the env once more at the end: an env that fails then cost the run its
    result.json and curves.png."""

    def failing(*args, **kwargs):
        raise RuntimeError("the env broke")

    monkeypatch.setattr(runner_module, "exploration_hint", failing)
    result = train("td3", "Pendulum-v1", steps=1_200, eval_every=1_200, eval_episodes=1, logdir=str(tmp_path),
                   name="r", progress=False)  # fmt: skip
    assert result["updates"] > 0 and result["exploration_hint"] is None
    assert (tmp_path / "r" / "result.json").exists() and (tmp_path / "r" / "curves.png").exists()

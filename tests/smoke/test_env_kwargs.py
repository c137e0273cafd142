"""An env variant (`--env-kwargs`) is the env of the whole run: training, evaluation, `rlfleet eval`, `collect`,
a resumed run, and the worker processes of a parallel architecture.

CartPole's `sutton_barto_reward=true` makes it visible in the returns: 0 a step and -1 when the pole falls, so
every episode returns -1 (or 0 if it lasts the 500 steps), where the default CartPole returns 1 a step (>= 8)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from rlfleet import train
from rlfleet.data.demos import load_demonstrations
from rlfleet.run.checkpoint import load_checkpoint

VARIANT = {"sutton_barto_reward": True}


def run_main(args) -> int:
    """`rlfleet.cli.main` as the `rlfleet` command runs it: argparse's own errors exit through SystemExit."""
    from rlfleet.cli import main

    try:
        return main([str(a) for a in args])
    except SystemExit as exit_:
        return exit_.code


def metric(run: Path, key: str, after: int = 0) -> list[float]:
    with open(run / "metrics.csv", newline="") as f:
        return [float(r["value"]) for r in csv.DictReader(f) if r["key"] == key and int(r["step"]) > after]


def assert_variant_returns(returns: list[float]) -> None:
    """Returns (or means of them) of the variant: -1 for an episode that fell, 0 for one that stood to its end;
    CartPole's own rewards make every return at least 8."""
    assert returns, "no episode finished"
    assert all(-1.0 <= r <= 0.0 for r in returns), f"not the sutton_barto_reward variant: {returns}"


def test_the_variant_is_trained_evaluated_collected_and_resumed(tmp_path: Path, capsys):
    train_args = ("train", "ppo", "--env", "CartPole-v1", "--logdir", tmp_path / "runs", "--name", "x")
    options = ("--eval-every", 256, "--eval-episodes", 2, "--no-progress")
    assert run_main((*train_args, "--env-kwargs", "sutton_barto_reward=true", "--steps", 512, *options)) == 0
    run = tmp_path / "runs" / "x"
    assert_variant_returns(metric(run, "charts/episodic_return"))  # the training envs
    assert_variant_returns(metric(run, "eval/return_mean"))  # the run's evaluation envs
    assert json.loads((run / "config.json").read_text())["run"]["env_kwargs"] == VARIANT
    assert json.loads((run / "result.json").read_text())["env_kwargs"] == VARIANT
    capsys.readouterr()

    assert run_main(("eval", run, "--episodes", 2)) == 0  # rebuilt from the checkpoint's run config
    out = json.loads(capsys.readouterr().out)
    assert out["env_kwargs"] == VARIANT
    assert_variant_returns(out["returns"])

    assert run_main(("collect", run, "--episodes", 2, "-o", tmp_path / "d.npz")) == 0
    demos = load_demonstrations(tmp_path / "d.npz")
    assert_variant_returns(list(demos.episode_returns))
    assert demos.env_kwargs == VARIANT  # the dataset records the variant ...
    bc = ("train", "bc", "--env", "CartPole-v1", "--dataset", tmp_path / "d.npz", "--logdir", tmp_path / "runs")
    capsys.readouterr()
    assert run_main((*bc, "--name", "bc-plain", "--no-progress")) == 2  # ... so bc on the plain env is refused
    err = capsys.readouterr().err
    assert "dataset was recorded on CartPole-v1 with --env-kwargs sutton_barto_reward=True, this run has none" in err
    assert not (tmp_path / "runs" / "bc-plain").exists()
    bc_options = ("--steps", 100, "--eval-every", 100, "--eval-episodes", 1, "--no-progress")
    assert run_main((*bc, "--name", "bc-variant", "--env-kwargs", "sutton_barto_reward=true", *bc_options)) == 0

    assert run_main(("train", "--resume", run, "--env-kwargs", "sutton_barto_reward=false")) == 2
    assert "a resumed run keeps its configuration" in capsys.readouterr().err
    assert run_main(("train", "--resume", run, "--steps", 1024, "--no-progress")) == 0
    assert_variant_returns(metric(run, "charts/episodic_return", after=512))  # the resumed run's training envs
    assert_variant_returns(metric(run, "eval/return_mean", after=512))  # and its evaluation envs, built anew
    assert load_checkpoint(run)["run_config"]["env_kwargs"] == VARIANT


@pytest.mark.timeout(120)
def test_parallel_workers_build_the_variant(tmp_path: Path):
    result = train(
        "a2c",
        "CartPole-v1",
        env_kwargs=VARIANT,
        arch="data_parallel",
        workers=2,
        steps=1000,
        eval_episodes=2,
        logdir=str(tmp_path),
        name="dp",
        progress=False,
    )
    assert result["env_kwargs"] == VARIANT
    assert_variant_returns(metric(result.run_dir, "charts/episodic_return"))  # only the workers step training envs
    assert_variant_returns(metric(result.run_dir, "eval/return_mean"))

"""The `rlfleet` command as a user runs it (a real subprocess): clean usage errors, and train -> eval -> plot."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from procs import RLFLEET

from rlfleet.algos import REGISTRY
from rlfleet.run.checkpoint import load_checkpoint

ALGOS = ("a2c", "a3c", "bc", "ddpg", "dqn", "nstep_q", "onestep_q", "pg", "ppo", "sac", "sarsa", "td3")
RESULT_KEYS = {
    *("solved", "solved_at_step", "solved_at_s", "eval_return_mean", "eval_return_std", "env_steps", "wall_time_s")
}


def rlfleet(*args: object, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RLFLEET, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its content (None for folders): to see that nothing was created or changed."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def make_workdir(folder: Path) -> Path:
    """A folder with a garbage checkpoint, a foreign torch file and an existing (fake) run folder in it."""
    (folder / "garbage.pt").write_bytes(b"this is not a checkpoint\n" * 10)
    (folder / "empty.pt").write_bytes(b"")
    torch.save({"weights": torch.zeros(3)}, folder / "foreign.pt")
    run = folder / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest.pt").write_bytes(b"\x80\x02garbage")
    (run / "config.json").write_text('{"keep": "me"}')
    (run / "metrics.csv").write_text("step,wall_time,key,value\n1,0.1,charts/episodic_return,9\n")
    return folder


TRAIN = ("train", "ppo", "--env", "CartPole-v1", "--steps", "600", "--logdir", "runs", "--no-progress")

# (id, arguments, substrings the one error line must contain); each runs as a real `rlfleet` process
USAGE_ERRORS = {
    "unknown-algo": (("train", "ppq", "--env", "CartPole-v1", "--logdir", "runs"), ["'ppq'", *ALGOS]),
    "unknown-env": (("train", "ppo", "--env", "CartPol-v1", "--logdir", "runs"), ["'CartPol-v1'", "'CartPole-v1'"]),
    "unknown-set-key": ((*TRAIN, "--set", "learning_rate=0.1"), ["'learning_rate'", "lr", "clip", "rollout_len"]),
    "set-bad-float": ((*TRAIN, "--set", "lr=fast"), ["'fast'", "lr", "float"]),
    "unknown-preset": ((*TRAIN, "--preset", "fast"), ["'fast'", "atari"]),
    "unsupported-space": (("train", "dqn", "--env", "Pendulum-v1", "--logdir", "runs"), ["dqn", "discrete", "Box"]),
    "eval-garbage": (("eval", "garbage.pt"), ["garbage.pt", "cannot read checkpoint"]),
    "eval-missing": (("eval", "nowhere/latest.pt"), ["nowhere", "no checkpoint"]),
    "resume-garbage-run": (("train", "--resume", "runs/old", "--no-progress"), ["latest.pt", "cannot read checkpoint"]),
    "resume-missing": (("train", "--resume", "runs/nope", "--no-progress"), ["runs/nope", "no checkpoint"]),
}

# more of the same, checked in-process with `rlfleet.cli.main` (a subprocess costs seconds of imports)
MORE_USAGE_ERRORS = {
    "set-no-equals": ((*TRAIN, "--set", "lr"), ["key=value", "'lr'"]),
    "set-bad-int": ((*TRAIN, "--set", "epochs=2.5"), ["'2.5'", "epochs", "int"]),
    "set-bad-bool": ((*TRAIN, "--set", "lr_anneal=maybe"), ["'maybe'", "lr_anneal", "bool"]),
    "set-bad-tuple": ((*TRAIN, "--set", "hidden=64,x"), ["'64,x'", "hidden"]),
    "set-negative": ((*TRAIN, "--set", "lr=-0.1"), ["lr", "negative"]),
    "set-zero-envs": ((*TRAIN, "--set", "n_envs=0"), ["n_envs"]),
    "set-bad-activation": ((*TRAIN, "--set", "activation=gelu"), ["'gelu'", "relu", "tanh"]),
    "n-envs-zero": ((*TRAIN, "--n-envs", "0"), ["--n-envs", "0"]),
    "sac-discrete": (("train", "sac", "--env", "CartPole-v1"), ["'sac'", "continuous", "Discrete(2)"]),
    "td3-discrete": (("train", "td3", "--env", "CartPole-v1"), ["'td3'", "continuous", "Discrete(2)"]),
    "ddpg-discrete": (("train", "ddpg", "--env", "CartPole-v1"), ["'ddpg'", "continuous", "Discrete(2)"]),
    "dqn-preset-unknown": (("train", "dqn", "--env", "CartPole-v1", "--preset", "paper"), ["'paper'", "atari"]),
    "unknown-arch": ((*TRAIN, "--arch", "gossamer"), ["'gossamer'", "single", "hogwild", "data_parallel"]),
    "replay-on-hogwild": (("train", "dqn", "--env", "CartPole-v1", "--arch", "hogwild"), ["dqn", "replay", "hogwild"]),
    "workers-zero": ((*TRAIN, "--arch", "hogwild", "--workers", "0"), ["--workers", "0"]),
    "unknown-optimizer": (
        ("train", "a3c", "--env", "CartPole-v1", "--optimizer", "adagrad"),
        ["'adagrad'", "shared_rmsprop"],
    ),
    "negative-eval-every": ((*TRAIN, "--eval-every", "-5"), ["--eval-every", "-5"]),
    "negative-checkpoint-every": ((*TRAIN, "--checkpoint-every", "-1"), ["--checkpoint-every", "-1"]),
    "train-without-env": (("train", "ppo"), ["--env"]),
    "set-bad-encoder": ((*TRAIN, "--set", "encoder=resnet"), ["'resnet'", "mlp", "nature"]),
    "run-folder-exists": ((*TRAIN, "--name", "old"), ["already exists", "--resume"]),
    "eval-foreign": (("eval", "foreign.pt"), ["foreign.pt", "not an rlfleet checkpoint"]),
    "plot-not-a-run": (("plot", "runs/nope", "-o", "x.png"), ["runs/nope", "metrics.csv"]),
    "eval-empty": (("eval", "empty.pt"), ["empty.pt", "cannot read checkpoint"]),
    "eval-garbage-run": (("eval", "runs/old"), ["latest.pt", "cannot read checkpoint"]),
    "resume-garbage-file": (("train", "--resume", "garbage.pt"), ["garbage.pt", "cannot read checkpoint"]),
}


def check_one_error_line(returncode: int, stdout: str, stderr: str, expected: list[str]) -> None:
    lines = stderr.strip().splitlines()
    assert returncode == 2, f"exit {returncode}\n{stderr}"
    assert "Traceback" not in stderr
    assert len(lines) == 1, f"expected one error line, got:\n{stderr}"
    assert lines[0].startswith("rlfleet: error: "), lines[0]
    for text in expected:
        assert text in lines[0], f"{text!r} missing from: {lines[0]}"
    assert stdout == ""


@pytest.fixture(scope="module")
def usage_error_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, dict, dict]]:
    """Every USAGE_ERRORS command, three at a time, each in its own fresh work folder: (process, before, after)."""

    def run(case: str):
        folder = make_workdir(tmp_path_factory.mktemp(case))
        before = tree(folder)
        proc = rlfleet(*USAGE_ERRORS[case][0], cwd=folder, timeout=90)
        return case, (proc, before, tree(folder))

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(run, USAGE_ERRORS))


@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_usage_error_is_one_clean_line(usage_error_runs, case: str):
    proc, before, after = usage_error_runs[case]
    check_one_error_line(proc.returncode, proc.stdout, proc.stderr, USAGE_ERRORS[case][1])
    assert after == before, "a failed command created or changed files"


@pytest.mark.timeout(60)  # a bad interval once made training loop forever
@pytest.mark.parametrize("case", list(MORE_USAGE_ERRORS))
def test_more_usage_errors_in_process(tmp_path: Path, monkeypatch, capsys, case: str):
    from rlfleet.cli import main

    folder = make_workdir(tmp_path)
    monkeypatch.chdir(folder)
    before = tree(folder)
    args, expected = MORE_USAGE_ERRORS[case]
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    check_one_error_line(code, out, err, expected)
    assert tree(folder) == before, "a failed command created or changed files"


def test_list_shows_every_algorithm(tmp_path: Path):
    proc = rlfleet("list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ") and line.split()}
    assert set(ALGOS) == set(REGISTRY) <= listed
    for name in ALGOS:
        assert f"  {name} " in proc.stdout
    for arch in ("single", "hogwild", "data_parallel", "grad_parallel", "offline"):
        assert f"  {arch} " in proc.stdout


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """`rlfleet train ppo` for 3,000 steps, done once for the tests that read its run folder."""
    root = tmp_path_factory.mktemp("cli")
    args = ("train", "ppo", "--env", "CartPole-v1", "--steps", 3000, "--logdir", root / "TMP", "--name", "x")
    proc = rlfleet(*args, "--no-progress", cwd=root, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    run = root / "TMP" / "x"
    assert str(run) in proc.stdout
    return run


def test_train_writes_the_run_folder(trained_run: Path):
    for name in ("config.json", "metrics.csv", "curves.png", "result.json", "checkpoints/latest.pt"):
        assert (trained_run / name).is_file(), f"{name} missing"
    assert (trained_run / "checkpoints" / "best.pt").is_file()
    assert (trained_run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = list((trained_run / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100

    config = json.loads((trained_run / "config.json").read_text())
    assert config["run"]["algo"] == "ppo" and config["run"]["env"] == "CartPole-v1"
    assert config["total_steps"] == 3000

    result = json.loads((trained_run / "result.json").read_text())
    assert set(result) >= RESULT_KEYS, RESULT_KEYS - set(result)
    assert 3000 <= result["env_steps"] < 3000 + 8 * 32  # stops within one PPO iteration (8 envs x 32 steps)
    assert isinstance(result["solved"], bool)
    if not result["solved"]:
        assert result["solved_at_step"] is None and result["solved_at_s"] is None
    assert math.isfinite(result["eval_return_mean"]) and result["eval_return_mean"] >= 8  # CartPole lasts >= 8 steps
    assert math.isfinite(result["eval_return_std"]) and result["eval_return_std"] >= 0
    assert result["wall_time_s"] > 0
    assert result["stopped_by"] == "steps"

    with open(trained_run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    keys = {row["key"] for row in rows}
    assert {"charts/episodic_return", "eval/return_mean", "charts/SPS"} <= keys
    assert any(k.startswith("losses/") for k in keys)
    final_eval = [float(r["value"]) for r in rows if r["key"] == "eval/return_mean"][-1]
    assert final_eval == pytest.approx(result["eval_return_mean"], rel=1e-5)

    latest = load_checkpoint(trained_run)
    assert latest["env_steps"] == result["env_steps"]
    assert latest["run_config"]["algo"] == "ppo"
    best = load_checkpoint(trained_run / "checkpoints" / "best.pt")
    assert best["algo"].keys() == latest["algo"].keys()


def test_eval_prints_json(trained_run: Path):
    proc = rlfleet("eval", trained_run, "--episodes", 3, cwd=trained_run.parent)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["algo"] == "ppo" and out["env"] == "CartPole-v1" and out["episodes"] == 3
    assert len(out["returns"]) == 3 and all(1 <= r <= 500 for r in out["returns"])
    assert out["return_mean"] == pytest.approx(sum(out["returns"]) / 3)
    assert out["video_dir"] is None


def test_eval_records_a_gif(trained_run: Path, tmp_path: Path):
    from PIL import Image

    video = tmp_path / "video"
    proc = rlfleet("eval", trained_run, "--episodes", 1, "--video", video, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    gifs = sorted(video.glob("*.gif"))
    assert len(gifs) == 1 and out["video_dir"] == str(video)
    with Image.open(gifs[0]) as gif:
        assert gif.format == "GIF" and gif.n_frames > 1


def test_plot_writes_a_png(trained_run: Path, tmp_path: Path):
    out = tmp_path / "plots" / "out.png"
    proc = rlfleet("plot", trained_run, "-o", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out) in proc.stdout

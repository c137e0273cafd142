"""The `rlfleet` command as a user runs it (a real subprocess): clean usage errors, and train -> eval -> plot."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.algos import REGISTRY
from rlfleet.run.checkpoint import load_checkpoint

_SCRIPT = Path(sys.executable).with_name("rlfleet")
RLFLEET = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "rlfleet.cli"]
ALGOS = ("a2c", "dqn", "nstep_q", "onestep_q", "pg", "ppo", "sarsa")
RESULT_KEYS = {"solved", "solved_at_step", "solved_at_s", "eval_return_mean", "eval_return_std", "env_steps"}
RESULT_KEYS |= {"wall_time_s"}


def rlfleet(*args: object, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RLFLEET, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root with its content (None for folders): to see that nothing was created or changed."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A folder with a garbage checkpoint, a foreign torch file and an existing (fake) run folder in it."""
    (tmp_path / "garbage.pt").write_bytes(b"this is not a checkpoint\n" * 10)
    (tmp_path / "empty.pt").write_bytes(b"")
    import torch

    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    run = tmp_path / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "latest.pt").write_bytes(b"\x80\x02garbage")
    (run / "config.json").write_text('{"keep": "me"}')
    (run / "metrics.csv").write_text("step,wall_time,key,value\n1,0.1,charts/episodic_return,9\n")
    return tmp_path


TRAIN = ("train", "ppo", "--env", "CartPole-v1", "--steps", "600", "--logdir", "runs", "--no-progress")

# (id, arguments, substrings the one error line must contain)
USAGE_ERRORS = [
    ("unknown-algo", ("train", "ppq", "--env", "CartPole-v1", "--logdir", "runs"), ["'ppq'", *ALGOS]),
    ("unknown-env", ("train", "ppo", "--env", "CartPol-v1", "--logdir", "runs"), ["'CartPol-v1'", "'CartPole-v1'"]),
    ("unknown-set-key", (*TRAIN, "--set", "learning_rate=0.1"), ["'learning_rate'", "lr", "clip", "rollout_len"]),
    ("set-no-equals", (*TRAIN, "--set", "lr"), ["key=value", "'lr'"]),
    ("set-bad-float", (*TRAIN, "--set", "lr=fast"), ["'fast'", "lr", "float"]),
    ("set-bad-int", (*TRAIN, "--set", "epochs=2.5"), ["'2.5'", "epochs", "int"]),
    ("set-bad-bool", (*TRAIN, "--set", "lr_anneal=maybe"), ["'maybe'", "lr_anneal", "bool"]),
    ("set-bad-tuple", (*TRAIN, "--set", "hidden=64,x"), ["'64,x'", "hidden"]),
    ("set-negative", (*TRAIN, "--set", "lr=-0.1"), ["lr", "negative"]),
    ("set-zero-envs", (*TRAIN, "--set", "n_envs=0"), ["n_envs"]),
    ("set-bad-encoder", (*TRAIN, "--set", "encoder=resnet"), ["'resnet'", "mlp", "nature"]),
    ("unknown-preset", (*TRAIN, "--preset", "fast"), ["'fast'", "atari"]),
    ("unsupported-space", ("train", "ppo", "--env", "Pendulum-v1", "--logdir", "runs"), ["ppo", "discrete", "Box"]),
    ("negative-eval-every", (*TRAIN, "--eval-every", "-5"), ["--eval-every", "-5"]),
    ("run-folder-exists", (*TRAIN, "--name", "old"), ["already exists", "--resume"]),
    ("eval-garbage", ("eval", "garbage.pt"), ["garbage.pt", "cannot read checkpoint"]),
    ("eval-empty", ("eval", "empty.pt"), ["empty.pt", "cannot read checkpoint"]),
    ("eval-foreign", ("eval", "foreign.pt"), ["foreign.pt", "not an rlfleet checkpoint"]),
    ("eval-missing", ("eval", "nowhere/latest.pt"), ["nowhere", "no checkpoint"]),
    ("eval-garbage-run", ("eval", "runs/old"), ["latest.pt", "cannot read checkpoint"]),
    ("resume-garbage-run", ("train", "--resume", "runs/old", "--no-progress"), ["latest.pt", "cannot read checkpoint"]),
    ("resume-garbage-file", ("train", "--resume", "garbage.pt", "--no-progress"), ["garbage.pt", "cannot read"]),
    ("resume-missing", ("train", "--resume", "runs/nope", "--no-progress"), ["runs/nope", "no checkpoint"]),
    ("plot-not-a-run", ("plot", "runs/nope", "-o", "x.png"), ["runs/nope", "metrics.csv"]),
]


@pytest.mark.parametrize(("args", "expected"), [c[1:] for c in USAGE_ERRORS], ids=[c[0] for c in USAGE_ERRORS])
def test_usage_error_is_one_clean_line(workdir: Path, args: tuple[str, ...], expected: list[str]):
    before = tree(workdir)
    proc = rlfleet(*args, cwd=workdir, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert len(lines) == 1, f"expected one error line, got:\n{proc.stderr}"
    assert lines[0].startswith("rlfleet: error: "), lines[0]
    for text in expected:
        assert text in lines[0], f"{text!r} missing from: {lines[0]}"
    assert proc.stdout == ""
    assert tree(workdir) == before, "a failed command created or changed files"


def test_list_shows_every_algorithm(tmp_path: Path):
    proc = rlfleet("list", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ") and line.split()}
    assert set(ALGOS) == set(REGISTRY) <= listed
    for name in ALGOS:
        assert f"  {name} " in proc.stdout


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """`rlfleet train ppo` for 3,000 steps, done once for the tests that read its run folder."""
    root = tmp_path_factory.mktemp("cli")
    proc = rlfleet(
        "train", "ppo", "--env", "CartPole-v1", "--steps", 3000, "--logdir", root / "TMP", "--name", "x", "--no-progress",
        cwd=root, timeout=240,
    )  # fmt: skip
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
    assert RESULT_KEYS <= set(result), RESULT_KEYS - set(result)
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

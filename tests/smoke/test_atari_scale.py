"""`benchmarks/atari_scale.py` runs every experiment end to end on MinAtar Breakout for 20,000 frames each, so that the
script the GPU machine runs on Pong cannot rot. (A frame budget, not a few seconds: on a busy machine a run of a
few seconds can end before its learners have started.)"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("minatar")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "atari_scale.py"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_every_experiment_writes_its_runs_tables_and_curves(tmp_path):
    out = tmp_path / "scale"
    options = ["--minutes", "1", "--frames", "20000", "--workers", "2", "--learners", "2", "--actors", "1",
               "--eval-every", "2000"]  # fmt: skip
    done = run("all", "--env", "MinAtar/Breakout-v1", *options, "--eval-episodes", "2", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reference"] == 3.0 and summary["machine"]["cores"] >= 1
    names = {e: [r["name"] for r in runs] for e, runs in summary["experiments"].items()}
    assert names == {"ppo": ["ppo"], "a3c": ["a3c-2"], "apex": ["apex-1"], "gala": ["gala-2", "a2c"]}
    for runs in summary["experiments"].values():
        for r in runs:
            assert 20_000 <= r["frames"] < 40_000 and r["frames_per_s"] > 0, r["name"]  # stopped by the budget
            assert r["evals"] and all(len(e) == 3 for e in r["evals"]), r["name"]
    a3c = summary["experiments"]["a3c"][0]
    assert set(a3c["segment_ms"]) == {"pull", "act", "loss", "backward", "apply"}  # where a worker's segment goes
    apex = summary["experiments"]["apex"][0]
    assert apex["options"]["unpaced"] is True and apex["actor_frames_per_s"] > 0
    # A2C runs for as many frames as GALA took (or until its own time limit)
    gala, a2c = summary["experiments"]["gala"]
    assert a2c["frames"] <= gala["frames"]
    for experiment in names:
        assert (out / f"curves_{experiment}.png").stat().st_size > 0
    table = (out / "summary.md").read_text()
    assert "| workers | frames/s | scaling |" in table and "| actors | actor frames/s |" in table
    assert "(1 min or 20,000 frames a run)" in table and "A2C at these frames" in table
    assert table == done.stdout.strip() + "\n"


def test_bad_input_is_one_line_before_any_run(tmp_path):
    done = run("a3c", "--env", "MinAtar/Breakout-v1", "--workers", "0", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2 and "--workers takes counts >= 1" in done.stderr
    done = run("ppo", "--env", "MinAtar/Breakout-v1", "--frames", "0", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2 and "--frames must be >= 1, got 0" in done.stderr
    done = run("ppo", "--env", "CartPole-v1", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2 and "no reference score known for CartPole-v1: give --reference" in done.stderr
    assert not (tmp_path / "o").exists()

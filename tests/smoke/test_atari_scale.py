"""`benchmarks/atari_scale.py` runs every experiment end to end on MinAtar Breakout for 20,000 frames each, so that the
script the GPU machine runs on Pong cannot rot. (A frame budget, not a few seconds: on a busy machine a run of a
few seconds can end before its learners have started.)"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("minatar")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "atari_scale.py"


def run(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_every_experiment_writes_its_runs_tables_and_curves(tmp_path):
    out = tmp_path / "scale"
    # the frame budget ends each run (about 15 s here); the time budget only guards a slow or busy machine
    options = ["--minutes", "3", "--frames", "20000", "--workers", "2", "--learners", "2", "--actors", "1",
               "--eval-every", "2000"]  # fmt: skip
    done = run("all", "--env", "MinAtar/Breakout-v1", *options, "--eval-episodes", "2", "--out", str(out), cwd=tmp_path,
               timeout=1_800)  # fmt: skip
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
    assert "(3 min or 20,000 frames a run)" in table and "A2C at these frames" in table
    assert table == done.stdout.strip() + "\n"


def test_bad_input_is_one_line_before_any_run(tmp_path):
    done = run("a3c", "--env", "MinAtar/Breakout-v1", "--workers", "0", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2 and "--workers takes counts >= 1" in done.stderr
    done = run("ppo", "--env", "MinAtar/Breakout-v1", "--frames", "0", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2 and "--frames must be >= 1, got 0" in done.stderr
    done = run("ppo", "--env", "CartPole-v1", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert done.returncode == 2 and "no reference score known for CartPole-v1: give --reference" in done.stderr
    assert not (tmp_path / "o").exists()


def script_module():
    if str(SCRIPT.parent) not in sys.path:  # its `harness`, as when the script is run
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("atari_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_steady_rate_leaves_out_the_rows_whose_interval_holds_an_evaluation():
    """The runner's SPS row after an evaluation counts the evaluation's time: frames/s would fall with --eval-every."""
    scale = script_module()
    sps = [(1000, 1.0, 100.0), (2000, 2.0, 1000.0), (3000, 3.0, 1000.0), (4000, 5.0, 500.0), (5000, 6.0, 1000.0)]
    sps += [(6000, 8.0, 500.0), (7000, 10.0, 500.0)]
    evals = [(3000, 3.0, 1.0), (5000, 6.001, 2.0), (6000, 8.0, 3.0)]  # at or just after the SPS row of their update
    rows = {"charts/SPS": sps, "eval/return_mean": evals, "charts/actor_sps": sps}
    assert scale.steady_rows(rows, "charts/SPS") == [1000.0, 1000.0, 1000.0]
    assert scale.median_of(rows, "charts/SPS") == scale.median_of(rows, "charts/actor_sps") == 1000.0
    every = {"charts/SPS": sps[:3], "eval/return_mean": [(1000, 1.0, 0.0), (2000, 2.0, 0.0)]}
    assert scale.steady_rows(every, "charts/SPS") == [] and scale.median_of(every, "charts/SPS") == 1000.0
    assert scale.median_of({"charts/SPS": sps[:1]}, "charts/SPS") == 100.0 and scale.median_of({}, "x") is None


def test_experiments_run_one_at_a_time_add_to_one_summary(tmp_path):
    """A second experiment into the same --out adds its table; one run again, or other settings, is one error line."""
    out = tmp_path / "scale"
    out.mkdir()
    a3c = {"name": "a3c-1", "options": {"workers": 1}, "frames_per_s": 900.0, "frames": 2000, "score": 20.0,
           "reference_at_s": None, "segment_ms": None, "evals": []}  # fmt: skip
    earlier = {"machine": {}, "env": "CartPole-v1", "minutes": 0.5, "frames": 2000, "reference": 100.0,
               "experiments": {"a3c": [a3c]}}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(earlier))
    options = ["--env", "CartPole-v1", "--reference", "100", "--minutes", "0.5", "--frames", "2000", "--envs", "2",
               "--eval-every", "1000", "--eval-episodes", "2", "--out", str(out)]  # fmt: skip
    done = run("ppo", *options, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["experiments"]) == ["ppo", "a3c"] and summary["experiments"]["a3c"] == [a3c]
    table = (out / "summary.md").read_text()
    assert "### ppo on CartPole-v1" in table and "### a3c on CartPole-v1" in table and "| 1 | 900 |" in table

    again = run("ppo", *options, cwd=tmp_path)
    assert again.returncode == 2 and f"{out / 'runs'} already holds ppo" in again.stderr, again.stderr
    assert "Traceback" not in again.stderr and json.loads((out / "summary.json").read_text()) == summary
    other = run("apex", *options[:-2], "--out", str(out), "--minutes", "1", "--actors", "1", cwd=tmp_path)
    assert other.returncode == 2 and "holds runs with --minutes 0.5" in other.stderr, other.stderr
    assert not (out / "runs" / "apex-1").exists()


def test_the_summary_is_written_after_each_run_so_a_timeout_loses_only_the_run_it_cut(tmp_path, monkeypatch):
    """On the GPU machine the A3C runs at five worker counts share one timeout: the tables were written only once
    every count had run, so a timeout in the 16-worker run left none."""
    scale = script_module()

    def one_run(name, algo, args, out, **options):
        if options["workers"] == 4:
            raise KeyboardInterrupt  # the timeout's signal, in the third run
        return {"name": name, "options": options, "frames_per_s": 100.0 * options["workers"], "frames": 2000,
                "score": 1.0, "reference_at_s": None, "segment_ms": None, "evals": []}  # fmt: skip

    monkeypatch.setattr(scale, "one_run", one_run)
    out = tmp_path / "scale"
    argv = ["atari_scale.py", "a3c", "--env", "CartPole-v1", "--reference", "100", "--workers", "1,2,4", "--out"]
    monkeypatch.setattr(sys, "argv", [*argv, str(out)])
    with pytest.raises(KeyboardInterrupt):
        scale.main()
    summary = json.loads((out / "summary.json").read_text())
    assert [r["name"] for r in summary["experiments"]["a3c"]] == ["a3c-1", "a3c-2"]
    assert "| 2 | 200 |" in (out / "summary.md").read_text()

"""`rlfleet tune` on a real Ray instance: an ASHA sweep of PPO on CartPole-v1 whose best trial solves, with one run
folder, one table row and one scatter point per trial; PBT that hands a trial another trial's learner, which it goes
on from with its own perturbed config; and Ctrl-C on a sweep, which ends every trial with its checkpoint, leaves no
process, and resumes to the end (`rlfleet tune --resume`) in the folder given, moved since; a sweep stopped before Ray
Tune saved it resumes too, afresh."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from procs import RLFLEET, assert_nothing_left, ray_processes, rlfleet_session

from rlfleet.cli import build_parser
from rlfleet.run.checkpoint import load_checkpoint
from rlfleet.run.config import parse_overrides
from rlfleet.run.evaluate import evaluate_checkpoint
from rlfleet.run.plot import read_metrics
from rlfleet.tuning import sweep as tune_sweep
from rlfleet.tuning.report import scatter_figure
from rlfleet.tuning.sweep import read_sweep, tune

pytestmark = pytest.mark.learning
LR = "lr=loguniform(1e-4,1e-2)"


def eval_steps(run_dir: Path) -> list[int]:
    return read_metrics(run_dir)["eval/return_mean"][0]


def test_an_asha_sweep_of_ppo_on_cartpole_finds_a_trial_that_solves(ray_instance, tmp_path: Path):
    result = tune("ppo", "CartPole-v1", search=[LR], trials=8, scheduler="asha", steps=30_000, logdir=str(tmp_path),
                  name="asha", progress=False, seed=1)  # fmt: skip
    assert not result.interrupted
    assert len(result.trials) == 8 and len({r["trial"] for r in result.trials}) == 8
    assert result.best is not None and result.best["solved"], result.trials
    assert result.best["score"] >= 475
    for row in result.trials:  # every trial an ordinary run folder
        run = Path(row["run_dir"])
        assert run.parent == tmp_path / "asha" / "trials"
        assert (run / "config.json").is_file() and (run / "checkpoints" / "latest.pt").is_file()
        assert eval_steps(run), row
        assert row["status"] in ("solved", "finished", "stopped by the scheduler"), row
    best = Path(result.best["run_dir"])
    assert evaluate_checkpoint(best, episodes=3, seed=0)["return_mean"] > 100  # `rlfleet eval` takes a trial
    with open(tmp_path / "asha" / "trials.csv") as f:
        assert len(list(csv.DictReader(f))) == 8
    assert {"summary.md", "scatter.png", "curves.png", "sweep.json"} <= {p.name for p in (tmp_path / "asha").iterdir()}
    spec = read_sweep(tmp_path / "asha")
    fig = scatter_figure(spec, spec.params, result.trials)
    assert sum(len(c.get_offsets()) for c in fig.axes[0].collections) == 8  # one point per trial
    assert fig.axes[0].get_xscale() == "log"
    # the best trial's command trains with the best trial's values
    args = build_parser().parse_args(shlex.split(result.command)[1:])
    assert args.algo == "ppo" and args.env == "CartPole-v1" and args.steps == 30_000
    assert float(parse_overrides(args.set)["lr"]) == result.best["lr"]
    assert load_checkpoint(best)["algo_config"]["lr"] == result.best["lr"]
    assert args.seed == load_checkpoint(best)["run_config"]["seed"]


def test_pbt_hands_a_weak_trial_a_strong_trials_learner_and_it_goes_on_from_it(ray_instance, tmp_path: Path):
    result = tune("ppo", "CartPole-v1", search=[LR, "ent_coef=uniform(0,0.01)"], trials=4, scheduler="pbt",
                  perturbation_interval=2, cpus_per_trial=0.5, steps=12_000, stop_return=float("inf"),
                  logdir=str(tmp_path), name="pbt", progress=False)  # fmt: skip
    assert not result.interrupted and all(r["status"] == "finished" for r in result.trials), result.trials
    exploited = [r for r in result.trials if r["exploits"]]
    assert exploited, "no trial took another's learner"
    for row in exploited:
        run = Path(row["run_dir"])
        records = [json.loads(line) for line in (run / "exploits.jsonl").read_text().splitlines()]
        assert all(r["trial"] != row["trial"] and r["env_steps"] > 0 for r in records)
        last = records[-1]
        saved = load_checkpoint(run)
        for name in ("lr", "ent_coef"):  # its own perturbed config, which the sweep reports as the trial's
            assert saved["algo_config"][name] == last["config"][name] == row[name]
        assert saved["env_steps"] >= 12_000
        steps = eval_steps(run)
        assert steps == sorted(set(steps)), "the curve goes on from the donor's step, once"


@pytest.mark.slow  # -m slow: CI keeps ASHA, PBT and Ctrl-C's sweeps (docs/tuning.md's A3C sweep runs hogwild trials)
def test_trials_of_a_parallel_architecture_reserve_a_cpu_per_role_and_run_as_many_at_a_time_as_asked(
    ray_instance, tmp_path: Path
):
    result = tune("a3c", "CartPole-v1", search=["lr=choice(0.001,0.003)"], trials=2, max_concurrent=1, workers=2,
                  steps=20_000, eval_every=5_000, logdir=str(tmp_path), name="a3c", progress=False)  # fmt: skip
    assert read_sweep(tmp_path / "a3c").tune.cpus_per_trial == 2  # one CPU per role by default
    spans = []
    for row in result.trials:
        run = Path(row["run_dir"])
        config = json.loads((run / "config.json").read_text())
        assert config["run"]["arch"] == "hogwild" and config["run"]["options"]["workers"] == 2
        assert row["status"] in ("solved", "finished") and eval_steps(run)
        spans.append(((run / "config.json").stat().st_mtime, (run / "result.json").stat().st_mtime))  # start, end
    first, second = sorted(spans)
    assert first[1] <= second[0], f"--max-concurrent 1 ran two trials at once: {spans}"


@pytest.mark.slow  # -m slow, as the test above
def test_hyperband_pauses_trials_and_they_go_on_from_their_checkpoints(ray_instance, tmp_path: Path):
    # 9 evaluations a run: HyperBand (η 3) puts 3 trials in a bracket of whole runs and 5 in one that halves at 3
    result = tune("ppo", "CartPole-v1", search=[LR], trials=8, scheduler="hyperband", steps=9_000, eval_every=1_000,
                  stop_return=float("inf"), logdir=str(tmp_path), name="hb", progress=False)  # fmt: skip
    assert not result.interrupted and len(result.trials) == 8
    statuses = [r["status"] for r in result.trials]
    assert set(statuses) <= {"finished", "stopped by the scheduler"} and "stopped by the scheduler" in statuses
    resumed = 0
    for row in result.trials:
        run = Path(row["run_dir"])
        steps = eval_steps(run)
        assert steps == sorted(set(steps)), "a paused trial goes on from its checkpoint, not from the start"
        resumed += len(list((run / "tb").iterdir())) > 1  # a run that started again writes a second events file
    assert resumed, "no trial was paused and went on"


def test_ctrl_c_ends_every_trial_with_its_checkpoint_and_the_sweep_resumes_where_it_was_moved(tmp_path: Path):
    before = set(ray_processes())
    sweep = tmp_path / "sweep"
    cmd = ["tune", "ppo", "--env", "CartPole-v1", "--search", LR, "--trials", "2", "--steps", "30000",
           "--stop-return", "inf", "--logdir", tmp_path, "--name", "sweep", "--no-progress"]  # fmt: skip
    with rlfleet_session(cmd, tmp_path) as proc:
        deadline = time.monotonic() + 180
        while not any(f.is_file() for f in sweep.glob("trials/*/checkpoints/latest.pt")):
            assert proc.poll() is None, f"the sweep ended early ({proc.returncode}):\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, "no trial checkpoint after 180 s"
            time.sleep(0.2)
        started = set(ray_processes()) - before
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, f"exit {proc.returncode} after SIGINT:\n{err[-3000:]}"
        assert f"rlfleet tune --resume {sweep}" in err and "Traceback" not in err, err[-3000:]
        assert "unfinished" in out
        assert_nothing_left(proc.pid, started)
    interrupted = {}
    for run in sweep.glob("trials/*"):  # each trial that had started kept a checkpoint where it stopped
        saved = load_checkpoint(run)
        assert 0 < saved["env_steps"] < 30_000
        interrupted[run.name] = saved["env_steps"]
    assert interrupted
    sweep = sweep.rename(tmp_path / "moved")  # the sweep is the folder --resume is given: its trials go on there
    done = subprocess.run([*RLFLEET, "tune", "--resume", "moved", "--no-progress"], cwd=tmp_path, text=True,
                          capture_output=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "sweep").exists()
    with open(sweep / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and all(r["status"] == "finished" for r in rows), rows
    assert all(Path(r["run_dir"]).parent == sweep / "trials" for r in rows), rows
    for name, steps in interrupted.items():  # went on from its checkpoint, not from the start
        run = sweep / "trials" / name
        assert load_checkpoint(run)["env_steps"] >= 30_000
        evals = eval_steps(run)
        assert evals == sorted(set(evals)) and any(s <= steps for s in evals) and evals[-1] >= 30_000


def test_a_sweep_stopped_before_ray_tune_saved_it_resumes_afresh(ray_instance, tmp_path: Path, monkeypatch):
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C after Ray started, before Ray Tune wrote its experiment

    monkeypatch.setattr(tune_sweep, "_tuner", stopped)
    with pytest.raises(KeyboardInterrupt):
        tune("ppo", "CartPole-v1", search=[LR], trials=2, steps=2_000, eval_every=1_000, stop_return=float("inf"),
             logdir=str(tmp_path), name="early", progress=False)  # fmt: skip
    assert not (tmp_path / "early" / "tune").exists()
    monkeypatch.undo()
    result = tune(resume=tmp_path / "early", progress=False)
    assert not result.interrupted and [r["status"] for r in result.trials] == ["finished", "finished"], result.trials
    assert all(Path(r["run_dir"]).parent == tmp_path / "early" / "trials" for r in result.trials)

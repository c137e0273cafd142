"""`rlfleet tune`'s bad input is one line (exit 2) before Ray starts or anything is written; and what PBT's exploit
rests on: a run started from another run's checkpoint with other hyperparameters takes the learner and keeps its
own hyperparameters (`rlfleet.launch.train_from`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # test_cli's helpers, under --import-mode=importlib

from test_cli import check_one_error_line, run_main, tree  # noqa: E402

from rlfleet.launch import train, train_from  # noqa: E402
from rlfleet.run.checkpoint import load_checkpoint  # noqa: E402

TUNE = ("tune", "ppo", "--env", "CartPole-v1", "--logdir", "sweeps", "--no-progress")
LR = ("--search", "lr=loguniform(1e-4,1e-2)")
FROZEN_LAKE = ("tune", "ppo", "--env", "FrozenLake-v1", "--logdir", "sweeps", "--no-progress")
PARALLEL = ("tune", "a3c", "--env", "CartPole-v1", "--arch", "data_parallel", "--workers", "2", "--logdir", "sweeps",
            "--no-progress")  # fmt: skip

BAD_SWEEPS = {
    "out-of-range": ((*TUNE, "--search", "lr=uniform(-1,1)"), ["--search lr=uniform(-1,1)", "must be >= 0"]),
    "unknown-field": ((*TUNE, "--search", "learning_rate=uniform(0,1)"), ["learning_rate", "not a field of ppo"]),
    "malformed": ((*TUNE, "--search", "lr=loguniform(1e-4"), ["is not NAME=DIST(ARGS)"]),
    "unknown-distribution": ((*TUNE, "--search", "lr=gauss(1,2)"), ["unknown distribution 'gauss'"]),
    "nothing-searched": (TUNE, ["tune needs something to search"]),
    "unknown-metric": ((*TUNE, *LR, "--metric", "losses/value"), ["--metric='losses/value'", "eval/return_mean"]),
    "zero-trials": ((*TUNE, *LR, "--trials", "0"), ["--trials=0", "must be in [1, 100000]"]),
    "unknown-scheduler": ((*TUNE, *LR, "--scheduler", "bohb"), ["--scheduler='bohb'", "asha", "pbt"]),
    "zero-cpus": ((*TUNE, *LR, "--cpus-per-trial", "0"), ["--cpus-per-trial=0", "must be in (0, 1024]"]),
    "pbt-network-shape": (
        (*TUNE, "--search", "hidden=choice((64,64),(32,32))", "--scheduler", "pbt"),
        ["--scheduler pbt cannot search hidden", "would not load", "fifo, asha or hyperband"],
    ),
    "trial-on-ray-backend": (
        ("tune", "a3c", "--env", "CartPole-v1", *LR, "--backend", "ray", "--logdir", "sweeps"),
        ["a trial's roles run as local processes", "drop --backend ray"],
    ),
    "unknown-env": (("tune", "ppo", "--env", "CartPol-v1", *LR, "--logdir", "sweeps"), ["'CartPol-v1'"]),
    "bad-set-with-search": ((*TUNE, *LR, "--set", "epochs=0"), ["ppo config epochs=0", ">= 1"]),
    "action-space": (("tune", "dqn", "--env", "Pendulum-v1", *LR, "--logdir", "sweeps"), ["dqn", "Box"]),
    # what the architecture refuses (its own check_config) is found before the trials too
    "architecture-refuses": (
        ("tune", "dqn", "--env", "CartPole-v1", "--arch", "hogwild", *LR, "--logdir", "sweeps"),
        ["dqn learns from replay; the hogwild architecture runs on-policy algorithms"],
    ),
    "setting-that-does-nothing": (
        (*TUNE, "--search", "obs_clip=uniform(1,10)"),
        ["obs_clip", "has no effect while obs_norm=False"],
    ),
    # every choice is checked against the whole configuration, not only the first and the last
    "invalid-middle-choice": (
        (*FROZEN_LAKE, "--search", "env_kwargs.map_name=choice('4x4','9x9','8x8')"),
        ["env FrozenLake-v1 rejects --env-kwargs map_name='9x9'"],
    ),
    "pbt-network-shape-in-the-middle": (
        (*TUNE, "--search", "hidden=choice((64,64),(32,32),(64,64))", "--scheduler", "pbt"),
        ["--scheduler pbt cannot search hidden", "would not load"],
    ),
    # what a trial may not take is refused when searched as when fixed
    "searched-ray-backend": (
        (*PARALLEL, "--search", "backend=choice(local,ray)"),
        ["--search backend=choice(local,ray)", "drop --backend ray"],
    ),
    "searched-ray-option": (
        (*PARALLEL, "--search", "cpus_per_role=uniform(0.5,1)"),
        ["--search cpus_per_role=uniform(0.5,1)", "drop --backend ray"],
    ),
    # a scheduler's setting given to a scheduler that has no use for it
    "grace-period-with-fifo": ((*TUNE, *LR, "--grace-period", "3"), ["--grace-period 3 has no effect", "asha"]),
    "grace-period-with-hyperband": (
        (*TUNE, *LR, "--scheduler", "hyperband", "--grace-period", "3"),
        ["--grace-period 3 has no effect with --scheduler hyperband"],
    ),
    "interval-with-fifo": ((*TUNE, *LR, "--perturbation-interval", "2"), ["--perturbation-interval 2 has no effect"]),
    "interval-with-asha": (
        (*TUNE, *LR, "--scheduler", "asha", "--perturbation-interval", "2"),
        ["--perturbation-interval 2 has no effect with --scheduler asha", "pbt"],
    ),
    "resume-not-a-sweep": (("tune", "--resume", "sweeps"), ["sweeps is not a sweep folder", "sweep.json"]),
    "resume-with-options": (("tune", "--resume", "done", "--steps", "10"), ["a resumed sweep keeps", "--steps"]),
}


@pytest.mark.parametrize("case", list(BAD_SWEEPS))
def test_a_bad_sweep_is_one_line_and_writes_nothing(tmp_path: Path, monkeypatch, capsys, case: str):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "sweep.json").write_text(
        '{"algo": "ppo", "env": "CartPole-v1", "search": ["lr=uniform(0,1)"], "options": {}, "tune": {},'
        ' "folder": "done", "max_evaluations": 5}'
    )
    before = tree(tmp_path)
    code = run_main(BAD_SWEEPS[case][0])
    out, err = capsys.readouterr()
    check_one_error_line(code, out, err, BAD_SWEEPS[case][1])
    assert tree(tmp_path) == before, "a refused sweep created or changed files"
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized(), "Ray started for a refused sweep"


def test_a_run_from_another_runs_learner_keeps_its_own_hyperparameters(tmp_path: Path):
    donor = train("ppo", "CartPole-v1", steps=2048, seed=0, logdir=str(tmp_path), name="donor", progress=False,
                  overrides={"lr": 1e-3, "lr_anneal": False})  # fmt: skip
    payload = load_checkpoint(donor.run_dir)
    taker = tmp_path / "taker"
    taker.mkdir()
    # no step left to take: what the run holds is what it took
    result = train_from(payload, taker, "ppo", "CartPole-v1", steps=payload["env_steps"], seed=5, progress=False,
                        overrides={"lr": 3e-4, "lr_anneal": False})  # fmt: skip
    algo = result.algo
    for name, tensor in donor.algo.model.state_dict().items():
        assert torch.equal(algo.model.state_dict()[name], tensor), name
    assert [g["lr"] for g in algo.optimizer.param_groups] == [3e-4]  # its own, not the donor's 1e-3
    donor_moments = donor.algo.optimizer.state_dict()["state"]
    for key, state in algo.optimizer.state_dict()["state"].items():
        assert torch.equal(state["exp_avg"], donor_moments[key]["exp_avg"])  # Adam's moments came with the learner
    assert result["env_steps"] == payload["env_steps"]  # the donor's counters go on
    saved = load_checkpoint(taker)
    assert saved["algo_config"]["lr"] == 3e-4 and saved["run_config"]["seed"] == 5

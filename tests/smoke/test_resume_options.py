"""What `--resume` may change (how long and how and where the run trains) and what it must keep (everything else):
a change is applied, a value equal to the saved one is accepted, a difference is one error line that names it; and
a preset's normalisation on an architecture that cannot run it is switched off with a line, never a refusal."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import shutil
import weakref
from pathlib import Path

import pytest

import rlfleet.launch
from rlfleet import train
from rlfleet.cli import main
from rlfleet.launch import resumed_config
from rlfleet.run.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.run.config import ConfigError, RunConfig


def run_main(args) -> int:
    return main([str(a) for a in args])


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


A2C = ("--steps", "256", "--eval-every", "256", "--eval-episodes", "1", "--no-progress")


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """An a2c run on data_parallel (serial backend), stopped at 256 steps: the run every case resumes."""
    logdir = tmp_path_factory.mktemp("runs")
    args = ("train", "a2c", "--env", "CartPole-v1", "--arch", "data_parallel", "--backend", "serial")
    assert run_main((*args, "--logdir", logdir, "--name", "run", *A2C)) == 0
    return logdir / "run"


# what a resume must keep: given with a different value, one line names each (the checkpoint untouched)
KEPT = {
    "another-algorithm": (("ppo",), ["ALGO ppo (the run's: a2c)"]),
    "another-env": (("--env", "Acrobot-v1"), ["--env Acrobot-v1 (the run's: CartPole-v1)"]),
    "a-set-value": (("--set", "lr=0.5"), ["--set lr=0.5 (the run's: 0.003)"]),
    "two-set-values": (
        ("--set", "lr=0.5", "--set", "gamma=0.9"),
        ["--set lr=0.5", "--set gamma=0.9 (the run's: 0.99)"],
    ),
    "env-kwargs": (("--env-kwargs", "sutton_barto_reward=true"), ["--env-kwargs {'sutton_barto_reward': True}"]),
    "seed": (("--seed", "3"), ["--seed 3 (the run's: 0)"]),
    "workers": (("--workers", "3"), ["--workers 3 (the run's: 2)"]),
    "n-envs": (("--n-envs", "2"), ["--n-envs 2 (the run's: 8)"]),
    "eval-every": (("--eval-every", "512"), ["--eval-every 512 (the run's: 256)"]),
    "arch": (("--arch", "single"), ["--arch single (the run's: data_parallel)"]),
    "preset": (("--preset", "paper"), ["--preset paper (the run's: not given: its default)"]),
    # a larger --steps has a note of its own, said only once the resume is taken: not before the refusal
    "steps-and-a-set-value": (("--steps", "512", "--set", "lr=0.5"), ["--set lr=0.5 (the run's: 0.003)"]),
}


@pytest.mark.parametrize("case", list(KEPT))
def test_a_resume_refuses_what_it_must_keep_in_one_line(saved_run: Path, capsys, case: str):
    given, expected = KEPT[case]
    before = tree(saved_run)
    algo = given[:1] if not given[0].startswith("--") else ()
    code = run_main(("train", *algo, "--resume", saved_run, *given[len(algo) :], "--no-progress"))
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    for text in ["rlfleet: error: a resumed run keeps its configuration", *expected, "--steps, --time-limit"]:
        assert text in err
    assert tree(saved_run) == before


def test_a_resume_applies_what_it_may_change_and_accepts_equal_values(saved_run: Path, tmp_path: Path, capsys):
    """The same ALGO, --env, --set and --env-kwargs as saved pass; --steps, --torch-threads and --backend apply (a
    new --steps says in one line that what the run schedules over its budget follows it)."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)  # a copy: the module's run stays as the refusals expect it
    same = ("--env", "CartPole-v1", "--set", "lr=3e-3", "--set", "hidden=64,64", "--n-envs", "8")  # 8: a2c's own
    changes = ("--steps", "512", "--torch-threads", "2", "--backend", "local", "--max-restarts", "3")
    assert run_main(("train", "a2c", "--resume", run, *same, *changes, "--no-progress")) == 0
    assert "--steps 512 (the run's: 256): what the run schedules over its budget" in capsys.readouterr().out
    payload = load_checkpoint(run)
    assert payload["env_steps"] >= 512
    saved = payload["run_config"]
    assert saved["steps"] == 512 and saved["torch_threads"] == 2
    assert saved["options"]["backend"] == "local" and saved["options"]["max_restarts"] == 3
    assert json.loads((run / "config.json").read_text())["torch_threads"] == 2


def test_a_resume_refuses_an_env_timeout_its_run_has_no_env_processes_for(saved_run: Path, capsys):
    """A new run refuses --env-timeout-s where no env process would wait; a resume, which may change it, took it."""
    before = tree(saved_run)
    assert run_main(("train", "--resume", saved_run, "--steps", "512", "--env-timeout-s", "5", "--no-progress")) == 2
    assert "rlfleet: error: --env-timeout-s 5 has no effect: this run has no env processes" in capsys.readouterr().err
    assert tree(saved_run) == before


@pytest.mark.parametrize("option", ["--eval-every", "--checkpoint-every"])
def test_a_resume_takes_0_for_an_interval_the_run_left_at_its_default(tmp_path: Path, option: str):
    """0 means the default, as not giving the option does: a resume refused it as a change from the run's."""
    args = ("train", "a2c", "--env", "CartPole-v1", "--steps", "256", "--eval-episodes", "1", "--no-progress")
    assert run_main((*args, "--logdir", tmp_path, "--name", "run")) == 0
    assert run_main(("train", "--resume", tmp_path / "run", "--steps", "512", option, "0", "--no-progress")) == 0


def test_a_run_folder_without_latest_pt_points_at_its_best_pt(saved_run: Path, tmp_path: Path, capsys):
    """A run killed before its first latest.pt (saved every --checkpoint-every steps) still has a best.pt; and its
    checkpoints/ folder is taken as the run folder is."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    assert run_main(("train", "--resume", run / "checkpoints", "--steps", "512", "--no-progress")) == 0
    assert load_checkpoint(run)["env_steps"] >= 512 and not (run / "checkpoints" / "checkpoints").exists()
    (run / "checkpoints" / "latest.pt").unlink()
    assert run_main(("train", "--resume", run, "--steps", "768", "--no-progress")) == 2
    said = f"no checkpoint at {run / 'checkpoints' / 'latest.pt'} (the folder holds {run / 'checkpoints' / 'best.pt'}"
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("steps", "total_steps", "given", "said"),
    [
        (None, 2_000, 4_000, "--steps 4000 (the run's: 2000)"),  # the run's budget was --set total_steps=2000
        (6_000, 6_000, 5_000, "--steps 5000 (the run's: 6000)"),  # a smaller budget squeezes the schedules as much
        (6_000, 6_000, 6_000, None),
    ],
)
def test_a_resume_says_when_its_budget_is_not_the_run_s(steps, total_steps, given, said, caplog):
    """The line came only with a larger --steps than a --steps the run was given: not where the run's budget was
    --set total_steps (or the algorithm's default), nor for a smaller --steps, which moves the schedules as much."""
    run = dataclasses.asdict(RunConfig(algo="dqn", env="CartPole-v1", steps=steps))
    with caplog.at_level(logging.WARNING, logger="rlfleet"):
        cfg = resumed_config(run, {"total_steps": total_steps}, None, None, {"steps": given})
    assert cfg.steps == given
    lines = [r.getMessage() for r in caplog.records if "what the run schedules over its budget" in r.getMessage()]
    assert lines == ([] if said is None else [lines[0]]) and (said is None or lines[0].startswith(said)), lines


def test_a_run_keeps_a_setting_that_a_new_run_would_refuse_for_doing_nothing(saved_run: Path, tmp_path: Path):
    """A run started by a version that accepted a setting which does nothing (here obs_clip without obs_norm, and
    --heartbeat-s on the serial backend) resumes with it: refusals of such settings are for new runs."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    for name in ("latest.pt", "best.pt"):
        path = run / "checkpoints" / name
        payload = load_checkpoint(path)
        payload["run_config"]["overrides"]["obs_clip"] = "5"
        payload["algo_config"]["obs_clip"] = 5.0
        payload["run_config"]["options"]["heartbeat_s"] = 30.0
        save_checkpoint(path, payload)
    with pytest.raises(ConfigError, match="obs_clip=5 has no effect while obs_norm=False"):  # as a new run
        train("a2c", "CartPole-v1", arch="data_parallel", backend="serial", overrides={"obs_clip": "5"},
              logdir=str(tmp_path), name="new", progress=False)  # fmt: skip
    assert run_main(("train", "--resume", run, "--steps", "512", "--no-progress")) == 0
    assert load_checkpoint(run)["env_steps"] >= 512


def test_resume_through_the_python_api_refuses_a_different_set_value(saved_run: Path):
    with pytest.raises(ConfigError, match=r"--set gamma=0.5 \(the run's: 0.99\)"):
        train(resume=saved_run, overrides={"gamma": 0.5}, progress=False)


@pytest.mark.parametrize("steps", ["128", "256"])
def test_a_resume_refuses_steps_the_run_has_reached(saved_run: Path, capsys, steps: str):
    """The run is at 256 steps: --steps at or below that would record a budget it never trained to."""
    before = tree(saved_run)
    assert run_main(("train", "--resume", saved_run, "--steps", steps, "--no-progress")) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert f"rlfleet: error: --steps {steps}: the run is at 256 steps already; --steps must exceed it" in err
    assert tree(saved_run) == before


def test_a_resume_from_an_earlier_checkpoint_says_what_it_replaces(saved_run: Path, tmp_path: Path, capsys):
    """--resume RUN/checkpoints/best.pt goes on from best's step, as it always did, and says in one line that the
    later latest.pt and the rows logged after that step are replaced; a resume from latest.pt says nothing."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    checkpoints = run / "checkpoints"
    shutil.copy(checkpoints / "latest.pt", checkpoints / "early.pt")  # at step 256
    later = load_checkpoint(checkpoints / "latest.pt")
    later["env_steps"] = 4096
    save_checkpoint(checkpoints / "latest.pt", later)
    assert run_main(("train", "--resume", checkpoints / "early.pt", "--steps", "512", "--no-progress")) == 0
    out = capsys.readouterr().out
    said = (
        f"resuming from {checkpoints / 'early.pt'} at step 256: it replaces {checkpoints / 'latest.pt'} at step 4096, "
        "and what the run logged after step 256"
    )
    assert said in out, out
    assert load_checkpoint(run)["env_steps"] >= 512
    assert run_main(("train", "--resume", checkpoints / "latest.pt", "--steps", "768", "--no-progress")) == 0
    assert "replaces" not in capsys.readouterr().out


def test_a_resume_keeps_a_best_pt_better_than_its_checkpoint_knew(saved_run: Path, tmp_path: Path, capsys):
    """A run killed without its last latest.pt (saved every --checkpoint-every steps) can leave a later, better
    best.pt. Its resume knew only the older best, and its first evaluation above that replaced the better network."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    best = load_checkpoint(run / "checkpoints" / "best.pt")
    best["state"]["best_eval"], best["env_steps"] = 1e6, 400  # as if saved after latest.pt's step 256, and better
    save_checkpoint(run / "checkpoints" / "best.pt", best)
    before = (run / "checkpoints" / "best.pt").read_bytes()
    assert run_main(("train", "--resume", run, "--steps", "768", "--no-progress")) == 0
    out = capsys.readouterr().out
    assert f"{run / 'checkpoints' / 'best.pt'} (return 1e+06 at step 400) stays the run's best network" in out, out
    assert (run / "checkpoints" / "best.pt").read_bytes() == before
    assert json.loads((run / "result.json").read_text())["best_eval_return"] == 1e6


@pytest.mark.parametrize("given", [("--heartbeat-s", "30"), ("--backend", "serial", "--max-restarts", "2")])
def test_a_resume_refuses_a_process_option_its_in_process_backend_has_no_use_for(saved_run: Path, capsys, given):
    """The run is on the serial backend: --heartbeat-s or --max-restarts given with its resume would do nothing, as a
    new run says; the resume says it too, in one line, the run folder untouched."""
    before = tree(saved_run)
    assert run_main(("train", "--resume", saved_run, "--steps", "512", *given, "--no-progress")) == 2
    err = capsys.readouterr().err
    assert f"rlfleet: error: {given[-2]} is for roles that run as processes (--backend local or ray)" in err, err
    assert tree(saved_run) == before


def test_a_resume_of_a_run_with_nothing_left_to_do_is_one_line(saved_run: Path, tmp_path: Path, capsys):
    """A run that took its whole budget resumes only with a larger --steps; one that solved would stop again at its
    next evaluation (rewriting its result.json): both are refused in one line, the run folder untouched."""
    before = tree(saved_run)
    assert run_main(("train", "--resume", saved_run, "--no-progress")) == 2
    assert "rlfleet: error: the run has taken its 256 steps (256): give --steps above 256 to train on" in (
        capsys.readouterr().err
    )
    solved = tmp_path / "solved"
    args = ("train", "ppo", "--env", "CartPole-v1", "--stop-return", "9", "--eval-every", "512", "--eval-episodes", "1")
    assert run_main((*args, "--logdir", tmp_path, "--name", "solved", "--no-progress")) == 0
    capsys.readouterr()
    solved_before = tree(solved)
    assert run_main(("train", "--resume", solved, "--steps", "100000", "--no-progress")) == 2
    assert "the run solved at step 512 (an evaluation reached its --stop-return) and stopped there" in (
        capsys.readouterr().err
    )
    assert tree(saved_run) == before and tree(solved) == solved_before


def test_a_resume_from_best_counts_on_its_episodes_and_says_its_replay_is_gone(tmp_path: Path, caplog):
    """best.pt keeps the learner and the counters, not the data: a run resumed from it counts its episodes on from
    best's, and says in one line that its replay starts empty (no update until learning_starts again)."""
    kw = dict(eval_episodes=1, stop_return=1e9, logdir=str(tmp_path), name="r", progress=False)
    overrides = {"learning_starts": 200, "buffer_size": 5_000}
    train("dqn", "CartPole-v1", steps=1_200, eval_every=600, overrides=overrides, **kw)
    best = load_checkpoint(tmp_path / "r" / "checkpoints" / "best.pt")
    assert best["collector"]["episodes"] > 0 and "buffer" not in best
    with caplog.at_level(logging.WARNING, logger="rlfleet"):
        resumed = train(resume=tmp_path / "r" / "checkpoints" / "best.pt", steps=1_800, progress=False)
    assert resumed["episodes"] > best["collector"]["episodes"]
    assert "the checkpoint holds no replay (best.pt keeps the learner alone)" in caplog.text


@pytest.mark.parametrize("arch", ["data_parallel", "allreduce", "gossip"])
def test_a_presets_normalisation_is_switched_off_with_a_line_where_the_architecture_lacks_it(
    arch: str, run_opts: dict, caplog
):
    """`ppo` on Pendulum-v1 picks the `continuous` preset, which sets reward_norm for --arch single."""
    options = {"learners": 2} if arch == "gossip" else {"workers": 1 if arch == "allreduce" else 2}
    with caplog.at_level(logging.INFO, logger="rlfleet.run.config"):
        result = train("ppo", "Pendulum-v1", arch=arch, backend="serial", steps=512, eval_every=512, eval_episodes=1,
                       **options, **run_opts)  # fmt: skip
    assert f"reward_norm: off on the {arch} architecture" in caplog.text
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["preset"] == "continuous" and config["algo"]["reward_norm"] is False


def test_the_users_own_normalisation_is_still_refused_where_the_architecture_lacks_it(run_opts: dict):
    with pytest.raises(ConfigError, match="reward_norm runs on the single architecture only"):
        train("ppo", "Pendulum-v1", arch="data_parallel", backend="serial", overrides={"reward_norm": "true"},
              **run_opts)  # fmt: skip
    assert list(Path(run_opts["logdir"]).iterdir()) == []


def test_a_per_env_presets_obs_norm_is_switched_off_too(run_opts: dict, caplog):
    with caplog.at_level(logging.INFO, logger="rlfleet.run.config"):
        result = train("ppo", "MountainCarContinuous-v0", arch="data_parallel", backend="serial", steps=64,
                       eval_every=64, eval_episodes=1, **run_opts)  # fmt: skip
    assert "obs_norm and reward_norm: off on the data_parallel architecture" in caplog.text
    algo = json.loads((result.run_dir / "config.json").read_text())["algo"]
    assert algo["obs_norm"] is False and algo["reward_norm"] is False


@pytest.mark.parametrize("damage", ["no-state", "steps-as-text"])
def test_a_checkpoint_without_a_runs_counters_is_one_line(saved_run: Path, tmp_path: Path, capsys, damage: str):
    """A hand-made or edited checkpoint without `state`, or with `env_steps` of another type, made the resume fail
    with a KeyError or TypeError deep in the runner."""
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    path = run / "checkpoints" / "latest.pt"
    payload = load_checkpoint(path)
    if damage == "no-state":
        del payload["state"]
    else:
        payload["env_steps"] = "256"
    save_checkpoint(path, payload)
    before = tree(run)
    assert run_main(("train", "--resume", run, "--no-progress")) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert f"rlfleet: error: checkpoint {run} cannot be resumed: it lacks the counters of a run" in err
    assert tree(run) == before


def test_a_resumed_run_does_not_keep_the_loaded_checkpoint_while_it_trains(tmp_path: Path, monkeypatch):
    """The replay a checkpoint holds is copied into the run's buffer; the loaded one stayed referenced for the whole
    resumed run: twice the replay's memory (a preset's replay is sized to half the machine's)."""
    train("dqn", "CartPole-v1", steps=1_200, eval_every=1_200, eval_episodes=1, logdir=str(tmp_path), name="r",
          progress=False, overrides={"learning_starts": 500})  # fmt: skip
    loaded = []
    load = rlfleet.launch.load_checkpoint

    def load_and_watch(path):
        payload = load(path)
        loaded.append(weakref.ref(payload["buffer"]["storage"]["obs"]))
        return payload

    monkeypatch.setattr(rlfleet.launch, "load_checkpoint", load_and_watch)
    alive = []

    def watch(info):
        gc.collect()
        alive.append(loaded[0]() is not None)

    train(resume=tmp_path / "r", steps=2_400, progress=False, callbacks=[watch])
    assert alive and not any(alive)

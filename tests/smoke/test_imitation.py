"""Imitation through the real `rlfleet` command: collect -> train bc (and DAgger) -> eval, and its usage errors."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the CLI helpers of test_cli
from test_cli import check_one_error_line, rlfleet, tree  # noqa: E402

from rlfleet.data.demos import Demonstrations, load_demonstrations  # noqa: E402
from rlfleet.run.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A short PPO run (the expert), its demonstrations, and a bc run trained on them, all by the CLI."""
    root = tmp_path_factory.mktemp("imitation")
    expert = ("train", "ppo", "--env", "CartPole-v1", "--steps", 3000, "--name", "expert", "--no-progress")
    proc = rlfleet(*expert, cwd=root)
    assert proc.returncode == 0, proc.stderr
    proc = rlfleet("collect", "runs/expert", "--episodes", 3, "-o", "data.npz", "--seed", 5, cwd=root)
    assert proc.returncode == 0, proc.stderr
    (root / "collect.out").write_text(proc.stdout)
    bc = ("train", "bc", "--env", "CartPole-v1", "--dataset", "data.npz", "--steps", 300, "--eval-every", 100)
    proc = rlfleet(*bc, "--name", "bc", "--stop-return", 1e9, "--no-progress", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return root


def test_collect_writes_demonstrations(work: Path):
    demos = load_demonstrations(work / "data.npz")
    assert demos.env == "CartPole-v1" and demos.action_kind == "discrete"
    assert demos.starts.sum() == 3 and len(demos) == len(demos.act) == len(demos.obs)
    assert demos.obs.shape[1:] == (4,) and set(np.unique(demos.act)) <= {0, 1}
    assert demos.source == str((work / "runs" / "expert" / "checkpoints" / "latest.pt").resolve())  # not "runs/expert"
    out = (work / "collect.out").read_text()
    mean = demos.episode_returns.mean()
    assert f"3 episodes, {len(demos)} (obs, act) pairs, return {mean:.1f}" in out, out
    assert "data.npz" in out
    expert = load_checkpoint(work / "runs" / "expert")  # greedy CartPole returns are the episode lengths
    assert expert["run_config"]["algo"] == "ppo"
    assert demos.episode_returns.sum() == len(demos)


def test_collect_replaces_only_its_own_dataset(work: Path, tmp_path: Path, monkeypatch, capsys):
    """-o may name an earlier dataset (replaced) or a file in folders still to be made; other files are refused."""
    from rlfleet.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.npz").write_bytes((work / "data.npz").read_bytes())
    expert = str(work / "runs" / "expert")
    assert main(["collect", expert, "--episodes", "1", "-o", "old.npz"]) == 0
    assert load_demonstrations(tmp_path / "old.npz").starts.sum() == 1
    assert main(["collect", expert, "--episodes", "1", "-o", "new/folder/d.npz"]) == 0
    assert load_demonstrations(tmp_path / "new" / "folder" / "d.npz").starts.sum() == 1
    (tmp_path / "notes.npz").write_bytes(b"the user's own file")
    capsys.readouterr()
    assert main(["collect", expert, "--episodes", "1", "-o", "notes.npz"]) == 2
    assert "not an rlfleet dataset; refusing to overwrite it" in capsys.readouterr().err
    assert (tmp_path / "notes.npz").read_bytes() == b"the user's own file"


def test_bc_run_folder_and_eval(work: Path):
    run = work / "runs" / "bc"
    for name in ("config.json", "metrics.csv", "curves.png", "result.json", "checkpoints/latest.pt"):
        assert (run / name).is_file(), f"{name} missing"
    result = json.loads((run / "result.json").read_text())
    assert result["algo"] == "bc" and result["arch"] == "offline" and isinstance(result["solved"], bool)
    assert result["gradient_steps"] == result["env_steps"] == 300 and result["stopped_by"] == "steps"
    assert result["dataset_size"] == len(load_demonstrations(work / "data.npz"))
    config = json.loads((run / "config.json").read_text())
    assert config["run"]["options"]["dataset"] == str((work / "data.npz").resolve()) and config["eval_every"] == 100
    rows = (run / "metrics.csv").read_text().splitlines()
    assert sum(",eval/return_mean," in r for r in rows) == 3
    assert any(",losses/cross_entropy," in r for r in rows) and any(",losses/accuracy," in r for r in rows)

    proc = rlfleet("eval", run, "--episodes", 2, cwd=work)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["algo"] == "bc" and out["env"] == "CartPole-v1" and len(out["returns"]) == 2


def test_dagger_with_an_expert(work: Path):
    args = ("train", "bc", "--env", "CartPole-v1", "--dataset", "data.npz", "--expert", "runs/expert")
    sets = ("--set", "dagger_iterations=2", "--set", "dagger_episodes=2")
    proc = rlfleet(*args, *sets, "--steps", 150, "--stop-return", 1e9, "--name", "dagger", "--no-progress", cwd=work)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((work / "runs" / "dagger" / "result.json").read_text())
    assert result["dagger_rounds"] == 2 and result["episodes"] == 4
    assert result["training_size"] == result["dataset_size"] + result["dagger_env_steps"]
    options = load_checkpoint(work / "runs" / "dagger")["run_config"]["options"]
    assert options["expert"] == str((work / "runs" / "expert").resolve())


def test_an_expert_without_dagger_rounds_is_refused(work: Path):
    """With dagger_iterations=0 no round asks the expert for labels: the run was plain bc, without a word."""
    args = ("train", "bc", "--env", "CartPole-v1", "--dataset", "data.npz", "--expert", "runs/expert")
    proc = rlfleet(*args, "--set", "dagger_iterations=0", "--name", "no-rounds", "--no-progress", cwd=work)
    check_one_error_line(proc.returncode, proc.stdout, proc.stderr, ["--expert has no effect with dagger_iterations=0"])
    assert not (work / "runs" / "no-rounds").exists()


def test_a_bc_run_resumes_from_another_folder_and_takes_its_dataset_spelled_otherwise(
    work: Path, tmp_path: Path, monkeypatch, capsys
):
    """The bc run was started with --dataset data.npz (relative): it keeps the absolute path, so a resume from
    another folder finds the file, and the same file named by its absolute path is no other dataset."""
    from rlfleet.cli import main

    run = tmp_path / "runs" / "bc"
    shutil.copytree(work / "runs" / "bc", run)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", str(run), "--steps", "400", "--no-progress"]) == 0
    dataset = str((work / "data.npz").resolve())
    assert main(["train", "--resume", "runs/bc", "--dataset", dataset, "--steps", "500", "--no-progress"]) == 0
    assert load_checkpoint(run)["env_steps"] == 500
    capsys.readouterr()
    assert main(["train", "--resume", "runs/bc", "--dataset", "data.npz", "--steps", "600", "--no-progress"]) == 2
    assert f"--dataset data.npz (the run's: {dataset})" in capsys.readouterr().err  # not the file here: none is


def test_a_bc_run_saved_with_a_relative_dataset_resumes_from_its_folder(work: Path, tmp_path: Path, monkeypatch):
    """A run of an older version kept --dataset as given: from the folder it was started in, it resumes, and the
    same file by its absolute path is the same dataset; the resumed run keeps the absolute path from then on."""
    from rlfleet.cli import main

    run = tmp_path / "runs" / "bc"
    shutil.copytree(work / "runs" / "bc", run)
    for name in ("latest.pt", "best.pt"):
        payload = load_checkpoint(run / "checkpoints" / name)
        payload["run_config"]["options"]["dataset"] = "data.npz"
        save_checkpoint(run / "checkpoints" / name, payload)
    monkeypatch.chdir(work)
    dataset = str((work / "data.npz").resolve())
    assert main(["train", "--resume", str(run), "--dataset", dataset, "--steps", "400", "--no-progress"]) == 0
    assert load_checkpoint(run)["run_config"]["options"]["dataset"] == dataset


def fake_demos(folder: Path) -> None:
    """Datasets that do not fit: another env, and the right env id with another action space."""
    rng = np.random.default_rng(0)
    starts = np.array([True, False, False])
    acrobot = Demonstrations(
        rng.normal(size=(3, 6)).astype(np.float32), np.zeros(3, np.int64), np.zeros(3), starts,
        env="Acrobot-v1", action_space=gym.spaces.Discrete(3),
    )  # fmt: skip
    acrobot.save(folder / "acrobot.npz")
    three = Demonstrations(
        rng.normal(size=(3, 4)).astype(np.float32), np.zeros(3, np.int64), np.zeros(3), starts,
        env="CartPole-v1", action_space=gym.spaces.Discrete(3),
    )  # fmt: skip
    three.save(folder / "three.npz")
    (folder / "garbage.npz").write_bytes(b"not a zip\n" * 10)
    np.savez(folder / "foreign.npz", weights=np.zeros(3))


BC = ("train", "bc", "--env", "CartPole-v1", "--no-progress")
# (arguments, substrings the one error line must contain)
ERRORS = {
    "missing-dataset": ((*BC, "--dataset", "nowhere.npz"), ["nowhere.npz", "no dataset"]),
    "garbage-dataset": ((*BC, "--dataset", "garbage.npz"), ["garbage.npz", "cannot read dataset"]),
    "foreign-dataset": ((*BC, "--dataset", "foreign.npz"), ["foreign.npz", "not an rlfleet dataset"]),
    "other-env": ((*BC, "--dataset", "acrobot.npz"), ["'Acrobot-v1'", "'CartPole-v1'", "--env Acrobot-v1"]),
    "other-action-space": ((*BC, "--dataset", "three.npz"), ["Discrete(3)", "Discrete(2)"]),
    "bc-without-dataset": (BC, ["bc", "--dataset FILE", "rlfleet collect"]),
    "dataset-to-ppo": (
        ("train", "ppo", "--env", "CartPole-v1", "--dataset", "data.npz"),
        ["--dataset", "imitation", "ppo"],
    ),
    "expert-to-ppo": (("train", "ppo", "--env", "CartPole-v1", "--expert", "runs/expert"), ["--expert", "ppo"]),
    "bc-on-hogwild": ((*BC, "--dataset", "data.npz", "--arch", "hogwild"), ["bc", "offline", "hogwild"]),
    "ppo-offline": (("train", "ppo", "--env", "CartPole-v1", "--arch", "offline"), ["offline", "ppo"]),
    "missing-expert": ((*BC, "--dataset", "data.npz", "--expert", "nope.pt"), ["nope.pt", "no checkpoint"]),
    "expert-other-env": (
        ("train", "bc", "--env", "Acrobot-v1", "--dataset", "acrobot.npz", "--expert", "runs/expert"),
        ["runs/expert", "'CartPole-v1'", "'Acrobot-v1'"],
    ),
    "bc-n-envs": ((*BC, "--dataset", "data.npz", "--n-envs", "4"), ["--n-envs", "bc"]),
    "collect-missing": (("collect", "nowhere/latest.pt", "-o", "x.npz"), ["nowhere", "no checkpoint"]),
    "collect-no-episodes": (("collect", "runs/expert", "--episodes", "0", "-o", "x.npz"), ["--episodes", "0"]),
}
AS_PROCESSES = ("missing-dataset", "other-env", "dataset-to-ppo", "bc-without-dataset")


@pytest.fixture(scope="module")
def error_folder(work: Path, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("errors")
    (folder / "data.npz").write_bytes((work / "data.npz").read_bytes())
    (folder / "runs").mkdir()
    (folder / "runs" / "expert").symlink_to(work / "runs" / "expert")
    fake_demos(folder)
    return folder


@pytest.mark.parametrize("case", list(ERRORS))
def test_usage_error_is_one_clean_line(error_folder: Path, monkeypatch, capsys, case: str):
    args, expected = ERRORS[case]
    before = tree(error_folder)
    if case in AS_PROCESSES:  # a few as the user runs them, the rest in-process (imports cost seconds)
        proc = rlfleet(*args, cwd=error_folder)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        from rlfleet.cli import main

        monkeypatch.chdir(error_folder)
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
    check_one_error_line(code, out, err, expected)
    assert tree(error_folder) == before, "a failed command created or changed files"

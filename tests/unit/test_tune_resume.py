"""`rlfleet tune --resume SWEEP`, checked without starting Ray: the sweep is the folder given (a copied or moved one
resumes where it is now, Ray Tune's record and the progress callback with it), a sweep stopped before Ray Tune saved
its experiment starts afresh from its sweep.json, and every option but --address and --no-progress is refused, the
folder's own (--name, --logdir) included."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("ray.tune", reason="the tune extra is not installed")

from rlfleet.cli import main
from rlfleet.fields import ConfigError
from rlfleet.tuning import sweep
from rlfleet.tuning.report import ProgressCallback
from rlfleet.tuning.spec import SPEC_FILE, TUNE_FOLDER, Sweep

SEARCH = ["lr=uniform(0.001,0.01)"]


def made_sweep(monkeypatch, logdir: Path, name: str = "s") -> Sweep:
    """A sweep folder as `rlfleet tune` writes it before Ray starts (its sweep.json only); `sweep._run` now hands back
    what it was asked to run (the spec, and whether it restores), with Ray not started."""
    monkeypatch.setattr(sweep, "_run", lambda spec, restore: (spec, restore))
    spec, restore = sweep.tune("ppo", "CartPole-v1", search=SEARCH, trials=2, steps=4096, logdir=str(logdir),
                               name=name, progress=False)  # fmt: skip
    assert not restore and {p.name for p in (logdir / name).iterdir()} == {SPEC_FILE}
    return spec


def saved_experiment(spec: Sweep) -> None:
    """Ray Tune's record of the sweep in its tune/ folder, as `Tuner` writes it before any trial starts."""
    from ray import tune

    trainable = tune.with_parameters(sweep.run_trial, sweep=spec.to_json())
    made = ProgressCallback(spec)
    sweep._tuner(spec, trainable, made, restore=False)
    made.close()


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_a_copied_or_moved_sweep_folder_resumes_where_it_is_now(monkeypatch, tmp_path: Path, how: str):
    from ray import tune

    first = made_sweep(monkeypatch, tmp_path / "runs")
    saved_experiment(first)
    (tmp_path / "elsewhere").mkdir()
    (shutil.copytree if how == "copied" else shutil.move)(tmp_path / "runs" / "s", tmp_path / "elsewhere" / "s2")
    monkeypatch.chdir(tmp_path)
    spec, restore = sweep.tune(resume="elsewhere/s2", progress=True)
    here = tmp_path.resolve() / "elsewhere" / "s2"
    assert restore and spec.folder == str(here) and spec.trials_dir == here / "trials"
    trainable = tune.with_parameters(sweep.run_trial, sweep=spec.to_json())
    again = ProgressCallback(spec)
    restored = sweep._tuner(spec, trainable, again, restore=True)
    run_config = restored._local_tuner.get_run_config()  # noqa: SLF001 (where the restored Tuner runs its trials)
    assert Path(run_config.storage_path) / run_config.name == here / TUNE_FOLDER
    assert run_config.callbacks == [again]  # the resuming command's callback, not one for the folder's old name
    again.close()
    if how == "copied":  # the original is left as it was
        assert {p.name for p in (tmp_path / "runs" / "s").iterdir()} == {SPEC_FILE, TUNE_FOLDER}


def test_a_sweep_stopped_before_ray_tune_saved_it_starts_afresh_on_resume(monkeypatch, tmp_path: Path, capsys):
    first = made_sweep(monkeypatch, tmp_path)  # Ctrl-C while the private Ray instance started: sweep.json only
    with pytest.raises(ConfigError, match=f"already exists; rlfleet tune --resume {tmp_path / 's'} goes on with it"):
        made_sweep(monkeypatch, tmp_path)
    spec, restore = sweep.tune(resume=tmp_path / "s", progress=False)
    assert not restore  # a new Ray Tune experiment, in the same folder, of the same sweep
    assert (spec.search, spec.options, spec.tune, spec.folder) == (
        first.search,
        first.options,
        first.tune,
        first.folder,
    )
    assert "starts afresh" in capsys.readouterr().out


@pytest.mark.parametrize("given", [["--name", "other"], ["--logdir", "elsewhere"], ["--trials", "3"]])
def test_resume_refuses_every_option_but_where_the_sweep_runs(monkeypatch, tmp_path: Path, capsys, given):
    made_sweep(monkeypatch, tmp_path)
    monkeypatch.setattr(sweep, "_run", lambda spec, restore: pytest.fail(f"resumed with {given}"))
    assert main(["tune", "--resume", str(tmp_path / "s"), "--no-progress", *given]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(f"not {given[0]}"), err
    with pytest.raises(ConfigError, match="a resumed sweep keeps its configuration"):
        sweep.tune(resume=tmp_path / "s", **{given[0][2:]: given[1]})


@pytest.mark.parametrize("finished", [True, False], ids=["finished", "interrupted"])
def test_a_trial_run_again_resumes_its_run_unless_the_run_had_ended(monkeypatch, tmp_path: Path, finished: bool):
    """A trial Ray Tune runs again (a resumed sweep, HyperBand's pause) resumes its run from its checkpoint; one whose
    run had ended before Tune heard (its budget taken, or solved) is done, not refused as `train --resume` refuses
    it."""
    from ray import tune

    from rlfleet import launch
    from rlfleet.launch import train

    spec = made_sweep(monkeypatch, tmp_path)
    stop = None if finished else [lambda info: info["env_steps"] >= 1_024]
    train("ppo", "CartPole-v1", steps=2_048, eval_every=10**6, eval_episodes=1, logdir=str(spec.trials_dir),
          name="t_00001", callbacks=stop, progress=False)  # fmt: skip
    monkeypatch.setattr(tune, "get_context", lambda: type("Context", (), {"get_trial_id": lambda self: "t_00001"})())
    monkeypatch.setattr(tune, "get_checkpoint", lambda: None)
    monkeypatch.setattr(tune, "report", lambda *args, **kwargs: None)
    resumed: list[Path] = []
    monkeypatch.setattr(launch, "train", lambda resume=None, **kwargs: resumed.append(Path(resume)))
    sweep.run_trial({"lr": 0.003}, spec.to_json())
    assert resumed == ([] if finished else [spec.trials_dir / "t_00001"])

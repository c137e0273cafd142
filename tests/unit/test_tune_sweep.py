"""What a sweep hands Ray Tune, checked without starting Ray: PBT's explore step keeps every value one the search
space draws, the schedulers' horizon and each trial's CPUs fit the longest and largest trial, a value both given and
searched is refused before Ray starts, a resumed sweep shows its progress as the resuming command asks, and the
summary ranks the trials that ended before those that failed or have not."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.tune", reason="the tune extra is not installed")

from rlfleet.cli import main
from rlfleet.fields import ConfigError
from rlfleet.launch import check_run
from rlfleet.tuning import sweep
from rlfleet.tuning.report import ProgressCallback
from rlfleet.tuning.spec import Sweep, SweepResult, TuneOptions

PBT_SEARCH = [
    "gamma=choice(0.98,0.99,0.995)",
    "activation=choice(tanh,relu)",
    "gae_lambda=uniform(0.9,0.99)",
    "epochs=randint(2,6)",
    "lr=loguniform(1e-4,1e-3)",
]


def checked_sweep(monkeypatch, tmp_path: Path, algo: str, search: list[str], **options) -> Sweep:
    """The sweep `rlfleet.tune` would run, after all its checks (Ray is not started)."""
    monkeypatch.setattr(sweep, "_run", lambda spec, restore: spec)
    return sweep.tune(algo, "CartPole-v1", search=search, logdir=str(tmp_path), name="s", progress=False, **options)


def test_pbt_moves_a_choice_to_a_neighbour_and_keeps_a_range_within_its_ends():
    spec = Sweep("ppo", "CartPole-v1", PBT_SEARCH, {"steps": 4096}, TuneOptions(scheduler="pbt"), "/nowhere", 10)
    pbt = sweep._scheduler(spec)
    donor = SimpleNamespace(config={"gamma": 0.99, "activation": "tanh", "gae_lambda": 0.985, "epochs": 6, "lr": 9e-4})
    seen: dict[str, set] = {name: set() for name in donor.config}
    for seed in range(300):
        random.seed(seed)
        config, _ = pbt._get_new_config(None, donor)  # noqa: SLF001 (Ray Tune's explore step, as PBT runs it)
        for name, value in config.items():
            seen[name].add(value)
        assert 0.9 <= config["gae_lambda"] <= 0.99 and 1e-4 <= config["lr"] <= 1e-3, config
        assert type(config["epochs"]) is int and 2 <= config["epochs"] <= 6, config
        check_run("ppo", "CartPole-v1", **spec.trial_options(config, "t_00000"))  # every explored trial can run
    assert seen["gamma"] == {0.98, 0.99, 0.995}  # the neighbours of 0.99 (and a fresh draw): never 0.99 x 1.2
    assert seen["activation"] == {"tanh", "relu"}
    assert 0.99 in seen["gae_lambda"] and 6 in seen["epochs"] and 1e-3 in seen["lr"]  # x1.2 stops at the high end


def test_the_schedulers_horizon_is_the_longest_trials(monkeypatch, tmp_path: Path):
    spec = checked_sweep(monkeypatch, tmp_path, "ppo", ["steps=choice(10000,50000)"], eval_every=2000,
                         scheduler="asha")  # fmt: skip
    assert spec.max_evaluations == 25  # 50,000 steps evaluated every 2,000, not the 10,000-step trials' 5
    assert sweep._scheduler(spec)._max_t == 25  # noqa: SLF001


def test_the_horizon_is_the_longest_trials_where_too_many_combinations_to_check_them_all(monkeypatch, tmp_path: Path):
    """Over 64 combinations each name varies alone; the longest trial (most steps, shortest interval) is checked too."""
    lrs = ",".join(f"{k}e-4" for k in range(1, 18))  # 17 x 2 x 2 = 68 combinations
    search = ["steps=choice(4000,20000)", "eval_every=choice(4000,1000)", f"lr=choice({lrs})"]
    spec = checked_sweep(monkeypatch, tmp_path, "ppo", search, scheduler="asha")
    assert spec.max_evaluations == 20  # 20,000 steps evaluated every 1,000: no one name's value makes it alone


@pytest.mark.parametrize("workers", ["1,2", "2,1", "1,4,2"])
def test_each_trial_reserves_the_cpus_of_the_largest_trial(monkeypatch, tmp_path: Path, workers: str):
    spec = checked_sweep(monkeypatch, tmp_path, "a3c", [f"workers=choice({workers})"], arch="hogwild", steps=4000)
    assert spec.tune.cpus_per_trial == max(int(w) for w in workers.split(","))


def test_a_resumed_sweep_shows_progress_as_the_resuming_command_asks(tmp_path: Path):
    import ray
    from ray import tune

    spec = Sweep("ppo", "CartPole-v1", ["lr=uniform(0.001,0.01)"], {"steps": 4096}, TuneOptions(progress=False),
                 str(tmp_path), 2)  # fmt: skip
    trainable = tune.with_parameters(sweep.run_trial, sweep=spec.to_json())
    first = ProgressCallback(spec)
    sweep._tuner(spec, trainable, first, restore=False)  # writes tune/tuner.pkl, with its callbacks
    first.close()
    spec.tune.progress = True  # `rlfleet tune --resume SWEEP` without --no-progress
    again = ProgressCallback(spec)
    restored = sweep._tuner(spec, trainable, again, restore=True)
    callbacks = restored._local_tuner.get_run_config().callbacks  # noqa: SLF001 (what the restored Tuner runs)
    assert [c.spec.tune.progress for c in callbacks] == [True] and callbacks[0] is again
    again.close()
    assert not ray.is_initialized()


@pytest.mark.parametrize(
    ("given", "search"),
    [
        (["--set", "lr=0.0003"], "lr=choice(0.001,0.002)"),
        (["--steps", "2000"], "steps=choice(4000,8000)"),
        (["--n-envs", "8"], "n_envs=choice(2,4)"),  # a run option that sets the config field of its name
        (["--env-kwargs", "sutton_barto_reward=true"], "env_kwargs.sutton_barto_reward=choice(true,false)"),
    ],
)
def test_a_value_both_given_and_searched_is_refused_in_one_line_naming_both(
    monkeypatch, tmp_path: Path, capsys, given: list[str], search: str
):
    monkeypatch.setattr(sweep, "_run", lambda spec, restore: pytest.fail("the sweep ran"))
    argv = ["tune", "ppo", "--env", "CartPole-v1", "--search", search, *given, "--logdir", str(tmp_path), "--name", "s"]
    assert main(argv) == 2
    name = search.split("=", 1)[0]
    says = f"rlfleet: error: {' '.join(given)} and --search {search} both set {name}: give one"
    assert capsys.readouterr().err.startswith(says + " (each trial takes the searched value)\n")
    assert not (tmp_path / "s").exists()


def test_a_given_option_of_another_meaning_than_the_searched_name_stays(monkeypatch, tmp_path: Path):
    """The sweep's --seed seeds Ray Tune's draws as well as the trials; hogwild's --optimizer picks its shared
    optimizer, while the config's optimizer (which `optimizer` searches) is the algorithm's own (--optimizer algo)."""
    spec = checked_sweep(monkeypatch, tmp_path, "ppo", ["seed=randint(0,9)"], seed=3, steps=4000)
    assert spec.options["seed"] == 3
    spec = checked_sweep(monkeypatch, tmp_path / "a3c", "a3c", ["optimizer=choice(adam,rmsprop)"], arch="hogwild",
                         optimizer="algo", steps=4000)  # fmt: skip
    assert spec.options["optimizer"] == "algo" and [p.kind for p in spec.params] == ["algo"]


def summary_of(folder: Path, statuses: list[tuple[float, str]]) -> SweepResult:
    """The summary of a sweep whose trials (`t_00000`, ...) last reported each score and have each Ray Tune status (a
    failed one with its traceback)."""
    from rlfleet.tuning.report import summarize

    folder.mkdir(exist_ok=True)
    (folder / "error.txt").write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    trials = [
        SimpleNamespace(
            trial_id=f"t_{i:05d}",
            config={"lr": 0.001 * (i + 1)},
            status=status,
            last_result={"eval/return_mean": score, "env_steps": 2048, "solved": False},
            error_file=str(folder / "error.txt") if status == "ERROR" else None,
        )
        for i, (score, status) in enumerate(statuses)
    ]
    spec = Sweep("ppo", "CartPole-v1", ["lr=uniform(0.001,0.01)"], {"steps": 4096}, TuneOptions(progress=False),
                 str(folder), 2)  # fmt: skip
    return summarize(spec, SimpleNamespace(_experiment_analysis=SimpleNamespace(trials=trials)), interrupted=True)


def test_the_best_trial_is_the_best_that_ended_not_a_failed_or_unfinished_one(tmp_path: Path, capsys):
    """A failed trial's last score may be its moment before the crash, an unfinished one's is where it stopped."""
    result = summary_of(tmp_path / "s", [(90, "ERROR"), (40, "TERMINATED"), (70, "RUNNING"), (20, "TERMINATED")])
    assert [(r["trial"], r["status"]) for r in result.trials] == [  # best first: the ended, then the rest, by score
        ("t_00001", "stopped by the scheduler"),
        ("t_00003", "stopped by the scheduler"),
        ("t_00000", "error: RuntimeError: boom"),
        ("t_00002", "unfinished"),
    ]
    assert result.best is result.trials[0]
    assert "best trial t_00001: eval/return_mean 40\n" in capsys.readouterr().out
    assert "Best trial: t_00001 (eval/return_mean 40); train it with:" in (tmp_path / "s" / "summary.md").read_text()


def test_where_no_trial_ended_the_best_is_the_best_of_the_rest_and_says_so(tmp_path: Path, capsys):
    result = summary_of(tmp_path / "s", [(90, "ERROR"), (95, "RUNNING")])
    assert result.best is not None and result.best["trial"] == "t_00001"
    assert "best trial t_00001: eval/return_mean 95 (unfinished; no trial ended)\n" in capsys.readouterr().out
    summary = (tmp_path / "s" / "summary.md").read_text()
    assert "Best trial: t_00001 (eval/return_mean 95, unfinished; no trial ended); train it with:" in summary


def test_a_setting_searched_with_its_switch_is_idle_only_in_the_trials_where_the_switch_is_off(
    monkeypatch, tmp_path: Path
):
    """prioritized=choice(true,false) with alpha=uniform(...): alpha does nothing in the uniform-replay trials, which
    is no reason to refuse the sweep (nor a trial). Searched alone beside a switch fixed off, it is refused, named as
    searched."""
    search = ["prioritized=choice(true,false)", "alpha=uniform(0.4,0.8)"]
    spec = checked_sweep(monkeypatch, tmp_path, "dqn", search, steps=4000)
    options = spec.trial_options({"prioritized": False, "alpha": 0.5}, "t_00001")
    with sweep.searched_fields(["prioritized", "alpha"]):
        check_run("dqn", "CartPole-v1", **options)  # as run_trial runs it
    with pytest.raises(ConfigError, match="alpha=0.5 has no effect while prioritized=False"):
        check_run("dqn", "CartPole-v1", **options)  # what a run given both by hand is told
    with pytest.raises(ConfigError, match=r"^--search alpha=0.4 has no effect while prioritized=False"):
        checked_sweep(monkeypatch, tmp_path / "fixed", "dqn", search[1:], overrides={"prioritized": "false"})


def test_a_setting_whose_switch_no_trial_turns_on_is_refused(monkeypatch, tmp_path: Path):
    """Searched beside its switch, a setting was let through whatever values the switch took: obs_norm=choice(false)
    made obs_clip idle in every trial, and the sweep searched a value nothing reads."""
    with pytest.raises(ConfigError, match=r"^--search obs_clip has no effect in any trial: it needs obs_norm"):
        checked_sweep(monkeypatch, tmp_path, "ppo", ["obs_clip=uniform(5,10)", "obs_norm=choice(false)"])


def test_the_best_trial_s_command_leaves_out_a_setting_idle_in_it(monkeypatch, tmp_path: Path):
    """The best trial had obs_norm off: its command gave obs_clip too, which `rlfleet train` refuses."""
    from rlfleet.tuning import report

    search = ["obs_clip=uniform(5,10)", "obs_norm=choice(true,false)"]
    spec = checked_sweep(monkeypatch, tmp_path, "ppo", search, steps=4000)
    trial = spec.trials_dir / "t_00001"
    trial.mkdir(parents=True)
    (trial / "config.json").write_text(json.dumps({"algo": {"obs_norm": False, "obs_clip": 6.0}}))
    options = spec.trial_options({"obs_clip": 6.0, "obs_norm": False}, "t_00001")
    command = report.train_command("ppo", "CartPole-v1", report._acting(spec, options, {"trial": "t_00001"}))
    assert "obs_norm=false" in command and "obs_clip" not in command
    (trial / "config.json").write_text(json.dumps({"algo": {"obs_norm": True, "obs_clip": 6.0}}))
    on = spec.trial_options({"obs_clip": 6.0, "obs_norm": True}, "t_00001")
    kept = report.train_command("ppo", "CartPole-v1", report._acting(spec, on, {"trial": "t_00001"}))
    assert "--set obs_clip=6.0" in kept


def test_a_trial_whose_run_ended_as_the_sweep_was_interrupted_is_finished_not_unfinished(tmp_path: Path, capsys):
    """Tune's last saved state may still say RUNNING for a trial whose run has just written its result.json: a
    Ctrl-C at that moment called it unfinished, and the summary said no trial ended."""
    for trial, stopped_by, steps in (("t_00000", "steps", 4096), ("t_00001", "solved", 2048)):
        run = tmp_path / "s" / "trials" / trial
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"total_steps": 4096}))
        (run / "result.json").write_text(json.dumps({"stopped_by": stopped_by, "env_steps": steps}))
    result = summary_of(tmp_path / "s", [(500, "RUNNING"), (475, "RUNNING"), (30, "RUNNING")])
    assert [(r["trial"], r["status"]) for r in result.trials] == [
        ("t_00000", "finished"),
        ("t_00001", "solved"),
        ("t_00002", "unfinished"),
    ]
    assert "best trial t_00000: eval/return_mean 500\n" in capsys.readouterr().out

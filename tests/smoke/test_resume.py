"""Determinism and exact resume: a run stopped half-way and resumed ends in the same state as an uninterrupted one."""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rlfleet import train
from rlfleet.arch.single import SingleRunner
from rlfleet.envs import snapshot as env_state
from rlfleet.run.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.run.config import RunConfig

STEPS = {"ppo": 4_000, "dqn": 3_000}  # ppo: 256 steps an iteration, dqn: 64 (learning starts at 1,000)
# the same runs with observation and reward normalisation: their running statistics (and DQN's replay of raw data)
# must resume exactly too
# and recurrent DQN: its collector's LSTM state and the buffer's stored states must resume exactly
RECURRENT_DQN = {"lstm": 8, "hidden": "32", "batch_size": 8, "burn_in": 2, "train_len": 4, "gradient_steps": 4}
NORMALISED = {"obs_norm": "true", "reward_norm": "true"}
CASES = [(algo, {}) for algo in sorted(STEPS)] + [("ppo", NORMALISED), ("dqn", NORMALISED), ("dqn", RECURRENT_DQN)]
CASE_IDS = [f"{algo}{''.join(f'-{k}' for k in overrides if k in (*NORMALISED, 'lstm'))}" for algo, overrides in CASES]


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths at which two nested state dicts differ (tensors and arrays compared exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(str, a.keys() ^ b.keys()))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return [] if a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) else [path]
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return [] if a.dtype == b.dtype and np.array_equal(a, b) else [path]
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} != {b!r}"]


def metric_rows(run_dir: Path, skip: tuple[str, ...] = ("charts/SPS",)) -> list[tuple[str, str, str]]:
    """(step, key, value) rows of metrics.csv, without wall times and the speed metric."""
    with open(run_dir / "metrics.csv", newline="") as f:
        return [(r["step"], r["key"], r["value"]) for r in csv.DictReader(f) if r["key"] not in skip]


@pytest.mark.parametrize("algo", sorted(STEPS))
def test_same_seed_same_run(algo: str, run_opts: dict):
    opts = dict(seed=7, steps=STEPS[algo] // 2, eval_every=10**9, eval_episodes=2, **run_opts)
    first = train(algo, "CartPole-v1", name="first", **opts)
    second = train(algo, "CartPole-v1", name="second", **opts)
    assert differences(first.algo.state_dict(), second.algo.state_dict()) == []
    returns = metric_rows(first.run_dir, skip=())
    returns = [row for row in returns if row[1] == "charts/episodic_return"]
    assert len(returns) > 3
    assert returns == [row for row in metric_rows(second.run_dir, skip=()) if row[1] == "charts/episodic_return"]
    for key in ("env_steps", "episodes", "updates", "eval_return_mean"):
        assert first[key] == second[key], key
    if algo == "ppo":  # the comparison can tell runs apart: another seed gives other weights
        other = train(algo, "CartPole-v1", name="other", **{**opts, "seed": 8})
        assert differences(first.algo.state_dict(), other.algo.state_dict()) != []


@pytest.mark.parametrize(("algo", "overrides"), CASES, ids=CASE_IDS)
def test_stop_and_resume_equals_uninterrupted(algo: str, overrides: dict, run_opts: dict):
    total = STEPS[algo]
    # evaluations (and best.pt) every 1,000 steps in both runs: resuming must also keep their schedule
    opts = dict(seed=3, steps=total, eval_every=1_000, eval_episodes=2, stop_return=1e9, overrides=overrides)
    opts.update(run_opts)
    whole = train(algo, "CartPole-v1", name="whole", **opts)
    assert whole["stopped_by"] == "steps"

    stop_half_way = lambda info: info["env_steps"] >= total // 2  # noqa: E731
    stopped = train(algo, "CartPole-v1", name="halves", callbacks=[stop_half_way], **opts)
    assert stopped["stopped_by"] == "interrupted"
    assert total // 2 <= stopped["env_steps"] < total
    saved = load_checkpoint(stopped.run_dir)
    assert saved["env_steps"] == stopped["env_steps"]
    assert saved["envs"] is not None, "the sync vector env's state was not saved"

    resumed = train(resume=stopped.run_dir, steps=total, progress=False)
    assert resumed.run_dir == stopped.run_dir
    assert resumed["stopped_by"] == "steps"
    for key in ("env_steps", "episodes", "updates", "eval_return_mean", "best_eval_return"):
        assert resumed[key] == whole[key], key
    assert differences(whole.algo.state_dict(), resumed.algo.state_dict()) == []
    # the resumed run's log continues the first half's: the same rows as the uninterrupted run's
    assert metric_rows(resumed.run_dir) == metric_rows(whole.run_dir)
    assert differences(load_checkpoint(whole.run_dir)["algo"], load_checkpoint(resumed.run_dir)["algo"]) == []
    if overrides.get("obs_norm"):
        whole_stats, resumed_stats = (
            load_checkpoint(whole.run_dir)["obs_norm"],
            load_checkpoint(resumed.run_dir)["obs_norm"],
        )
        n_envs = load_checkpoint(whole.run_dir)["algo_config"]["n_envs"]
        assert whole_stats["count"] == whole["env_steps"] + n_envs  # every observation acted on, the first resets too
        assert differences(whole_stats, resumed_stats) == []
    if overrides.get("reward_norm"):
        whole_rewards = load_checkpoint(whole.run_dir)["reward_norm"]
        assert whole_rewards["count"] == whole["env_steps"]  # one discounted return per env step
        assert differences(whole_rewards, load_checkpoint(resumed.run_dir)["reward_norm"]) == []


def test_a_resume_after_a_crash_logs_each_step_once(run_opts):
    """Rows logged after the last checkpoint are logged again by the resumed run: metrics.csv and TensorBoard
    keep only the resumed run's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    opts = dict(seed=3, steps=4_096, eval_every=1_000, eval_episodes=2, stop_return=1e9, checkpoint_every=2_000)
    opts.update(run_opts)
    whole = train("ppo", "CartPole-v1", name="whole", **opts)

    def crash(info):
        if info["env_steps"] >= 3_000:
            raise RuntimeError("the machine went down")

    with pytest.raises(RuntimeError, match="went down"):
        train("ppo", "CartPole-v1", name="crashed", callbacks=[crash], **opts)
    run = Path(run_opts["logdir"]) / "crashed"
    saved = load_checkpoint(run)["env_steps"]
    assert max(int(step) for step, _, _ in metric_rows(run)) > saved  # logged after the checkpoint
    resumed = train(resume=run, progress=False)
    assert metric_rows(resumed.run_dir) == metric_rows(whole.run_dir)
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    steps = [e.step for e in events.Scalars("eval/return_mean")]
    assert steps == [int(step) for step, key, _ in metric_rows(whole.run_dir) if key == "eval/return_mean"]


def test_a_time_limit_is_a_budget_for_each_invocation(run_opts):
    """A run with a time limit, resumed, gets the limit again (the time it already spent is its total only)."""
    opts = dict(seed=0, steps=2_048, time_limit=600, eval_every=10**9, eval_episodes=1, stop_return=1e9)
    stopped = train("ppo", "CartPole-v1", name="r", callbacks=[lambda info: info["env_steps"] >= 1_024],
                    **opts, **run_opts)  # fmt: skip
    path = stopped.run_dir / "checkpoints" / "latest.pt"
    payload = load_checkpoint(path)
    payload["state"]["elapsed"] = 1_000.0  # as if the first invocation had run into its limit
    save_checkpoint(path, payload)
    resumed = train(resume=stopped.run_dir, progress=False)
    assert resumed["stopped_by"] == "steps" and resumed["env_steps"] == 2_048
    assert resumed["wall_time_s"] >= 1_000.0  # the run's total time


def test_a_resume_given_an_infinite_time_limit_trains_without_one(run_opts):
    """`--time-limit inf` is how a resume drops the limit of its run: one that ran into it trains to its steps."""
    opts = dict(seed=0, steps=2_048, time_limit=1e-9, eval_every=10**9, eval_episodes=1, stop_return=1e9)
    cut = train("ppo", "CartPole-v1", name="c", **opts, **run_opts)
    assert cut["stopped_by"] == "time_limit" and cut["env_steps"] < 2_048
    again = train(resume=cut.run_dir, progress=False)  # the run's limit holds on a resume that names none
    assert again["stopped_by"] == "time_limit" and again["env_steps"] < 2_048
    resumed = train(resume=cut.run_dir, time_limit=math.inf, progress=False)
    assert resumed["stopped_by"] == "steps" and resumed["env_steps"] == 2_048
    assert load_checkpoint(resumed.run_dir)["run_config"]["time_limit"] == math.inf


def test_the_last_checkpoint_holds_the_final_evaluation(run_opts):
    result = train("ppo", "CartPole-v1", steps=1_024, eval_every=10**9, eval_episodes=2, stop_return=1e9, **run_opts)
    state = load_checkpoint(result.run_dir)["state"]
    assert state["evals"] == 1 and state["last_eval"]["step"] == result["env_steps"]
    assert state["best_eval"] == result["best_eval_return"]


def test_a_resume_that_cannot_restore_the_envs_ends_the_stored_episodes(run_opts, monkeypatch, caplog):
    """Envs that cannot be restored (Box2D's, async vector envs) start new episodes, not the first run's again: the
    last stored step of every column becomes a boundary, and reward normalisation's running returns start over. The
    run says so, once: it will not repeat the uninterrupted run."""
    stopped = train("dqn", "CartPole-v1", name="r", steps=3_000, eval_every=10**9, eval_episodes=1, stop_return=1e9,
                    overrides={"reward_norm": "true"}, callbacks=[lambda info: info["env_steps"] >= 1_200],
                    **run_opts)  # fmt: skip
    payload = load_checkpoint(stopped.run_dir)
    before = payload["buffer"]["storage"]
    newest = int(payload["buffer"]["ptr"]) - 1
    done = before["terminated"][newest] | before["truncated"][newest]
    assert not done.all() and payload["reward_norm"]["returns"].any()  # episodes were going on
    monkeypatch.setattr(env_state, "restore", lambda envs, state: False)
    trainer = SingleRunner(RunConfig(**payload["run_config"]), resume_from=payload, run_dir=stopped.run_dir)
    try:
        said = [r.getMessage() for r in caplog.records if "starts new episodes" in r.getMessage()]
        assert len(said) == 1 and "does not repeat the uninterrupted run exactly" in said[0], said
        after = trainer.buffer.state_dict()["storage"]
        assert (after["truncated"][newest] | after["terminated"][newest]).all()
        assert torch.equal(after["terminated"], before["terminated"])
        assert torch.equal(after["truncated"][:newest], before["truncated"][:newest])
        assert not trainer.reward_norm.returns.any()
        first_run = SingleRunner(RunConfig(**{**payload["run_config"], "name": "fresh"}))
        assert not np.allclose(trainer.collector.obs, first_run.collector.obs)  # not the first run's episodes
        first_run.envs.close()
        first_run.eval_envs.close()
    finally:
        trainer.envs.close()
        trainer.eval_envs.close()


def test_a_resume_that_cannot_restore_the_envs_restarts_the_ou_noise(run_opts, monkeypatch):
    """The OU processes belong to the episodes that were going on: when the envs begin new ones, so does the noise
    (the checkpoint's mid-episode noise would otherwise carry over into unrelated episodes)."""
    stopped = train("td3", "Pendulum-v1", name="ou", steps=3_000, eval_every=10**9, eval_episodes=1, stop_return=1e9,
                    overrides={"action_noise": "ou", "learning_starts": 100, "random_steps": 100},
                    callbacks=[lambda info: info["env_steps"] >= 1_100], **run_opts)  # fmt: skip
    payload = load_checkpoint(stopped.run_dir)
    assert np.abs(payload["algo"]["noise"]["x"]).sum() > 0  # mid-episode: the processes have moved
    monkeypatch.setattr(env_state, "restore", lambda envs, state: False)
    runner = SingleRunner(RunConfig(**payload["run_config"]), resume_from=payload, run_dir=stopped.run_dir)
    try:
        assert not runner.algo.noise.x.any() and runner.collector.starts.all()
    finally:
        runner.envs.close()
        runner.eval_envs.close()


class RunnerClock:
    """The runner's clock, moved past the time limit by a callback once a run reaches a given step: a stop there
    takes the time-limit path, as a slow machine would make it, without waiting for it."""

    def __init__(self, limit: float):
        self.limit = limit
        self.ahead = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.ahead

    def run_out_at(self, step: int) -> Callable[[dict[str, Any]], bool]:
        def callback(info: dict[str, Any]) -> bool:
            if info["env_steps"] >= step:
                self.ahead += self.limit
            return False  # not a stop request: the time limit, checked next, stops the run

        return callback


# (env, total steps, steps at which the time limit runs out, overrides): two stops, a scheduled evaluation (every 600
# steps) between them, and the off-policy ones with learning under way
TIME_LIMIT_CASES = {
    "ppo": ("CartPole-v1", 2_048, (300, 1_000), {}),
    "dqn": ("CartPole-v1", 2_000, (700, 1_300), {"learning_starts": "300"}),
    "sac": ("Pendulum-v1", 1_000, (500, 700), {"learning_starts": "300", "random_steps": "300"}),
}

WALL_CLOCK = (".episode_start_time:", ".time_queue.")  # the episode times of RecordEpisodeStatistics: each run's own


@pytest.mark.parametrize("algo", sorted(TIME_LIMIT_CASES))
def test_stops_at_the_time_limit_and_resumes_equal_uninterrupted(algo: str, run_opts: dict, monkeypatch):
    """A run stopped by its time limit evaluates before its checkpoint; resumed, it ends where the run made in one
    go ends: every tensor of the final checkpoint and the final evaluation."""
    env, total, stops, overrides = TIME_LIMIT_CASES[algo]
    clock = RunnerClock(limit=3_600.0)
    monkeypatch.setattr("rlfleet.run.runner.time", clock)
    opts = dict(seed=4, steps=total, eval_every=600, eval_episodes=2, stop_return=1e9, time_limit=clock.limit)
    whole = train(algo, env, name="whole", overrides=overrides, **opts, **run_opts)
    assert whole["stopped_by"] == "steps"

    stopped = train(algo, env, name="stopped", overrides=overrides, callbacks=[clock.run_out_at(stops[0])],
                    **opts, **run_opts)  # fmt: skip
    for stop in (*stops[1:], None):
        assert stopped["stopped_by"] == "time_limit" and stopped["env_steps"] < total
        assert load_checkpoint(stopped.run_dir)["state"]["last_eval"]["step"] == stopped["env_steps"]
        callbacks = [clock.run_out_at(stop)] if stop is not None else []
        stopped = train(resume=stopped.run_dir, callbacks=callbacks, progress=False)

    assert stopped["stopped_by"] == "steps"
    for key in ("env_steps", "episodes", "updates", "eval_return_mean"):
        assert stopped[key] == whole[key], key
    # the networks, targets, optimisers and RNGs, replay buffer, collector and envs; not the run's name and times
    ends = load_checkpoint(whole.run_dir), load_checkpoint(stopped.run_dir)
    compared = [key for key in ends[0] if key not in ("run_config", "state")]
    found = differences(*({key: end[key] for key in compared} for end in ends))
    assert [path for path in found if not any(field in path for field in WALL_CLOCK)] == []


@pytest.mark.parametrize("arch", ["single", "hogwild"])
def test_a_checkpoint_whose_algorithm_state_does_not_fit_is_one_line_and_changes_nothing(tmp_path, arch):
    """A checkpoint of another version of an algorithm (a counter or network it lacks) is refused on --resume as on
    eval: one CheckpointError naming the checkpoint and the missing part, the run folder left as it was."""
    from rlfleet.run.checkpoint import CheckpointError

    algo = "a3c" if arch == "hogwild" else "ppo"
    options = {"workers": 1} if arch == "hogwild" else {}
    train(algo, "CartPole-v1", steps=512, eval_every=512, eval_episodes=1, stop_return=1e9, logdir=str(tmp_path),
          name="r", progress=False, **options)  # fmt: skip
    latest = tmp_path / "r" / "checkpoints" / "latest.pt"
    payload = load_checkpoint(latest)
    del payload["algo"]["optimizer"]  # as if written by a version whose algorithm had no optimizer state
    save_checkpoint(latest, payload)
    before = {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file()}
    with pytest.raises(
        CheckpointError, match=rf"^checkpoint .*r does not fit rlfleet's {algo} \(KeyError: 'optimizer'\)$"
    ):
        train(resume=tmp_path / "r", steps=1_024, progress=False)
    assert {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file()} == before


def test_a_minatar_run_resumes_exactly(run_opts: dict):
    """MinAtar's games (held one object inside the env, with a legacy RandomState) are in the checkpoint's env
    snapshot: the resumed run logs the uninterrupted run's rows and ends with its weights."""
    pytest.importorskip("minatar")
    total = 3_072  # three segments of the minatar preset's 8 envs x 128 steps
    opts = dict(seed=3, steps=total, eval_every=10**9, stop_return=1e9, **run_opts)
    whole = train("ppo", "MinAtar/Breakout-v1", name="whole", **opts)
    half_way = lambda info: info["env_steps"] >= total // 2  # noqa: E731
    stopped = train("ppo", "MinAtar/Breakout-v1", name="halves", callbacks=[half_way], **opts)
    assert stopped["stopped_by"] == "interrupted" and load_checkpoint(stopped.run_dir)["envs"] is not None
    resumed = train(resume=stopped.run_dir, steps=total, progress=False)
    assert resumed["episodes"] == whole["episodes"] and resumed["env_steps"] == whole["env_steps"]
    assert metric_rows(resumed.run_dir) == metric_rows(whole.run_dir)
    assert differences(whole.algo.state_dict(), resumed.algo.state_dict()) == []

"""Imitation: the demonstrations file, the bc loss (classification and rescaled regression), and DAgger."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlfleet import train
from rlfleet.algos import resolve
from rlfleet.algos.bc import BC, Config
from rlfleet.data.batch import Batch
from rlfleet.data.demos import (
    DatasetError,
    Demonstrations,
    actions_problem,
    load_demonstrations,
    observations_problem,
)
from rlfleet.run.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.run.config import RunConfig
from rlfleet.run.evaluate import load_agent


def demos(n: int = 12, env: str = "CartPole-v1", box: bool = False, seed: int = 0) -> Demonstrations:
    rng = np.random.default_rng(seed)
    starts = np.zeros(n, dtype=bool)
    starts[[0, n // 3, n // 2]] = True
    if box:
        space = gym.spaces.Box(np.float32([-2.0]), np.float32([2.0]), dtype=np.float32)
        act = rng.uniform(-2, 2, size=(n, 1)).astype(np.float32)
        obs = rng.normal(size=(n, 3)).astype(np.float32)
    else:
        space = gym.spaces.Discrete(2)
        act = rng.integers(2, size=n)
        obs = rng.normal(size=(n, 4)).astype(np.float32)
    return Demonstrations(obs, act, rng.normal(size=n).astype(np.float32), starts, env=env, action_space=space)


def fake_checkpoint(path: Path, algo: str = "ppo", env: str = "CartPole-v1", seed: int = 3) -> Path:
    """An untrained agent saved as a checkpoint (what `load_agent` reads)."""
    algo_cls, config_cls, _, _ = resolve(algo)
    info = gym.make(env)
    cfg = config_cls()
    agent = algo_cls(cfg, info.observation_space, info.action_space, seed=seed)
    payload = {
        "run_config": dataclasses.asdict(RunConfig(algo=algo, env=env)),
        "algo_config": dataclasses.asdict(cfg),
        "algo": agent.state_dict(),
        "env_steps": 0,
        "state": {},
    }
    return save_checkpoint(path, payload)


# ---------------------------------------------------------------------------------------------- dataset
@pytest.mark.parametrize("box", [False, True], ids=["discrete", "box"])
def test_dataset_round_trip(tmp_path: Path, box: bool):
    env = "Pendulum-v1" if box else "CartPole-v1"
    d = demos(box=box, env=env)
    path = d.save(tmp_path / "sub" / "d")  # no .npz suffix added, folders made
    assert path == tmp_path / "sub" / "d" and path.is_file()
    back = load_demonstrations(path)
    np.testing.assert_array_equal(back.obs, d.obs)
    np.testing.assert_array_equal(back.act, d.act)
    np.testing.assert_array_equal(back.rew, d.rew)
    np.testing.assert_array_equal(back.starts, d.starts)
    assert back.env == env and back.action_kind == ("box" if box else "discrete")
    assert back.action_space == d.action_space
    np.testing.assert_allclose(back.episode_returns, [d.rew[0:4].sum(), d.rew[4:6].sum(), d.rew[6:].sum()], rtol=1e-6)
    with np.load(path, allow_pickle=False) as raw:  # plain arrays only: nothing needs unpickling
        assert {"obs", "act", "rew", "starts", "episode_returns", "env", "action_kind"} <= set(raw.files)


def test_dataset_errors(tmp_path: Path):
    with pytest.raises(DatasetError, match="no dataset at"):
        load_demonstrations(tmp_path / "nowhere.npz")
    (tmp_path / "garbage.npz").write_bytes(b"not a zip file\n" * 20)
    with pytest.raises(DatasetError, match="cannot read dataset"):
        load_demonstrations(tmp_path / "garbage.npz")
    np.savez(tmp_path / "foreign.npz", x=np.zeros(3))
    with pytest.raises(DatasetError, match="not an rlfleet dataset"):
        load_demonstrations(tmp_path / "foreign.npz")
    cartpole = gym.make("CartPole-v1")
    d = demos()
    d.check_fits("CartPole-v1", cartpole.observation_space, cartpole.action_space)
    with pytest.raises(DatasetError, match="recorded on 'CartPole-v1', not on 'Acrobot-v1'"):
        d.check_fits("Acrobot-v1", cartpole.observation_space, cartpole.action_space)
    with pytest.raises(DatasetError, match=r"Discrete\(2\), but CartPole-v1 has Discrete\(3\)"):
        d.check_fits("CartPole-v1", cartpole.observation_space, gym.spaces.Discrete(3))
    with pytest.raises(DatasetError, match="first observation"):
        Demonstrations(d.obs, d.act, d.rew, np.zeros(len(d), dtype=bool), "CartPole-v1", d.action_space)


def test_dataset_records_env_kwargs_and_reads_files_without_them(tmp_path: Path):
    d = dataclasses.replace(demos(), env_kwargs={"sutton_barto_reward": True, "name": "x", "scale": 0.5})
    assert load_demonstrations(d.save(tmp_path / "d.npz")).env_kwargs == d.env_kwargs
    cartpole = gym.make("CartPole-v1")
    d.check_fits("CartPole-v1", cartpole.observation_space, cartpole.action_space, d.env_kwargs)
    with pytest.raises(DatasetError, match="with --env-kwargs sutton_barto_reward=True name='x' scale=0.5, this run"):
        d.check_fits("CartPole-v1", cartpole.observation_space, cartpole.action_space)
    with np.load(tmp_path / "d.npz") as data:  # a file written before datasets recorded them
        arrays = {k: data[k] for k in data.files if k != "env_kwargs"}
    np.savez(tmp_path / "old.npz", **arrays)
    assert load_demonstrations(tmp_path / "old.npz").env_kwargs == {}
    np.savez(tmp_path / "bad.npz", **arrays, env_kwargs=np.array("[1, 2]"))
    with pytest.raises(DatasetError, match="not a valid rlfleet dataset: env_kwargs is"):
        load_demonstrations(tmp_path / "bad.npz")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"starts": np.ones((12, 2), bool)}, r"starts has shape \[12, 2\], not one entry a step"),
        ({"act": np.array(1)}, r"act has shape \[\], not one entry a step"),
        ({"action_kind": np.array("multi")}, "action_kind is 'multi', not 'discrete' or 'box'"),
        ({"action_kind": np.array("box")}, "'action_low' is missing"),  # a Discrete dataset called box
    ],
)
def test_a_malformed_dataset_names_what_is_wrong(tmp_path: Path, change, message):
    """These said "the truth value of an array ... is ambiguous" or only "'action_low'"."""
    with np.load(demos().save(tmp_path / "d.npz")) as data:
        arrays = {**{k: data[k] for k in data.files}, **change}
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DatasetError, match=f"bad.npz is not a valid rlfleet dataset: {message}"):
        load_demonstrations(tmp_path / "bad.npz")


def test_a_save_cut_short_leaves_the_earlier_dataset_whole(tmp_path: Path, monkeypatch):
    """`rlfleet collect -o` over an earlier dataset writes a temp file beside it and renames it over the old one
    once whole: a write stopped half-way (Ctrl-C here, a full disk, a crash) loses nothing and leaves no temp file."""
    import rlfleet.data.demos as demos_module

    path = demos().save(tmp_path / "d.npz")
    before = path.read_bytes()
    savez = np.savez_compressed

    def cut_short(file, **arrays):
        savez(file, **arrays)
        file.truncate(100)  # half of a zip on disk, then the interruption
        raise KeyboardInterrupt

    monkeypatch.setattr(demos_module.np, "savez_compressed", cut_short)
    with pytest.raises(KeyboardInterrupt):
        demos(n=30, seed=1).save(path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["d.npz"]
    monkeypatch.undo()
    demos(n=30, seed=1).save(path)  # replaced once whole
    assert len(load_demonstrations(path)) == 30 and sorted(p.name for p in tmp_path.iterdir()) == ["d.npz"]


@pytest.mark.parametrize(
    ("obs", "problem"),
    [
        (np.zeros((3, 2), np.float32), None),
        (np.array([[0.0, 1.0], [np.nan, 0.0], [np.nan, 2.0]], np.float32), "observation 1 holds nan, not a finite"),
        (np.array([[0.0, -np.inf]]), "observation 0 holds -inf, not a finite number (1 of 1 observations do)"),
        ({"a": np.zeros((2, 1), np.uint8), "b": np.array([0.0, np.inf])}, "observation 1 (entry 'b') holds inf"),
        (np.zeros((0, 4), np.float32), None),
    ],
)
def test_observations_must_be_finite(obs, problem):
    found = observations_problem(obs)
    assert found == problem if problem is None else problem in found


DICT_CUE = gym.spaces.Dict({"goal": gym.spaces.Discrete(4), "heading": gym.spaces.Box(-1, 1, (2,))})


@pytest.mark.parametrize(
    ("obs", "space", "problem"),
    [
        ({"goal": np.array([0, 3]), "heading": np.zeros((2, 2), np.float32)}, DICT_CUE, None),
        ({"goal": np.array([0, 13]), "heading": np.zeros((2, 2))}, DICT_CUE, "observation 1 (entry 'goal') is 13, out"),
        ({"goal": np.array([0.5, 1.5]), "heading": np.zeros((2, 2))}, DICT_CUE, "observations (entry 'goal') are fl"),
        (np.array([0, 16]), gym.spaces.Discrete(16), "observation 1 is 16, outside Discrete(16) (1 of 2 observations"),
        (np.array([[0, 1], [1, 1]], np.int8), gym.spaces.MultiBinary(2), None),
        (np.array([[0, 1], [2, 1]]), gym.spaces.MultiBinary(2), "observation 1 is [2, 1], outside MultiBinary(2)"),
        (np.array([[5.0, -9.0]], np.float32), gym.spaces.Box(-1, 1, (2,)), None),  # a Box's bounds: not checked
    ],
)
def test_observations_of_whole_number_spaces_are_checked_against_them(obs, space, problem):
    """Discrete, MultiDiscrete and MultiBinary observations (or Dict entries) are one-hot by the networks: a value
    outside the space or a fraction fails (or is cut) inside an update, so the dataset is refused before."""
    found = observations_problem(obs, space)
    assert found == problem if problem is None else problem in found


def test_dict_observations_with_entries_of_different_lengths_are_refused():
    with pytest.raises(DatasetError, match=r"Dict observations must be equally long, got \{'a': 3, 'b': 2\}"):
        Demonstrations(
            obs={"a": np.zeros((3, 1)), "b": np.zeros((2, 1))},
            act=np.zeros(3, np.int64),
            rew=np.zeros(3),
            starts=np.array([True, False, False]),
            env="x",
            action_space=gym.spaces.Discrete(2),
        )


def test_an_empty_dataset_has_no_action_out_of_range():
    """No pairs at all: nothing outside the space (the run refuses the empty dataset itself, by name)."""
    assert actions_problem(np.zeros(0, np.int64), gym.spaces.Discrete(2)) is None
    assert actions_problem(np.zeros((0, 1), np.float32), gym.spaces.Box(-1, 1, (1,))) is None


# ---------------------------------------------------------------------------------------------- bc
def test_bc_classifies_a_separable_dataset():
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, size=(256, 2)).astype(np.float32)
    act = (obs[:, 0] + 0.5 * obs[:, 1] > 0).astype(np.int64)  # a linear boundary
    space = gym.spaces.Box(-1, 1, (2,), dtype=np.float32)
    bc = BC(Config(lr=3e-3), space, gym.spaces.Discrete(2), seed=0)
    data = bc.process(Batch(obs=obs, act=act))
    first = bc.loss(data)[0].item()
    for _ in range(300):
        idx = rng.integers(len(data), size=64)
        metrics = bc.update(data[idx])
    assert metrics["cross_entropy"] < 0.2 * first
    assert bc.loss(data)[1]["accuracy"] >= 0.98
    actions, extras, state = bc.act(obs, explore=True)  # greedy whatever explore says
    assert state is None and extras == {}
    assert (actions == act).mean() >= 0.98


def test_bc_regresses_box_actions_in_the_policy_space():
    space = gym.spaces.Box(np.array([-2.0, 0.0], dtype=np.float32), np.array([2.0, 10.0], dtype=np.float32))
    obs_space = gym.spaces.Box(-1, 1, (3,), dtype=np.float32)
    bc = BC(Config(lr=3e-3), obs_space, space, seed=0)
    rng = np.random.default_rng(1)
    obs = rng.uniform(-1, 1, size=(128, 3)).astype(np.float32)
    env_act = np.stack([2.0 * obs[:, 0], 5.0 + 5.0 * obs[:, 1]], axis=1).astype(np.float32)
    data = bc.process(Batch(obs=obs, act=env_act))
    # targets: [low, high] ↦ [-1, 1], the inverse of the rescaling acting applies
    np.testing.assert_allclose(data.act, obs[:, :2], atol=1e-6)
    np.testing.assert_allclose(bc.process(Batch(obs=obs[:1], act=np.array([[-2.0, 10.0]]))).act, [[-1.0, 1.0]])
    np.testing.assert_allclose(bc.process(Batch(obs=obs[:1], act=np.array([[9.0, -3.0]]))).act, [[1.0, -1.0]])
    first = bc.loss(data)[0].item()
    for _ in range(600):
        metrics = bc.update(data[rng.integers(len(data), size=64)])
    assert metrics["mse"] < 0.02 * first
    actions, _, _ = bc.act(obs)
    assert actions.dtype == np.float32
    np.testing.assert_allclose(actions, env_act, atol=0.25)  # back in the env's own units


# ---------------------------------------------------------------------------------------------- DAgger
def test_dagger_aggregates_states_labelled_by_the_expert(tmp_path: Path, run_opts):
    data = tmp_path / "data.npz"
    demos(n=60).save(data)
    expert_path = fake_checkpoint(tmp_path / "expert.pt")
    overrides = {"dagger_iterations": 2, "dagger_episodes": 3}
    result = train(
        "bc", "CartPole-v1", dataset=str(data), expert=str(expert_path), steps=90, overrides=overrides,
        stop_return=1e9, eval_every=1_000, **run_opts,
    )  # fmt: skip
    r = result.result
    assert r["dagger_rounds"] == 2 and r["episodes"] == 6 and r["gradient_steps"] == 90 == r["env_steps"]
    payload = load_checkpoint(result.run_dir)
    obs, act = payload["offline"]["aggregated_obs"], payload["offline"]["aggregated_act"]
    assert len(obs) == r["dagger_env_steps"] > 0
    assert r["training_size"] == 60 + len(obs)
    expert, _ = load_agent(expert_path)
    np.testing.assert_array_equal(act, expert.act(obs, explore=False)[0])  # every visited state has its label
    # the states are the learner's: CartPole starts near 0, and the episodes' first states are in there
    assert np.abs(obs[0]).max() <= 0.05
    assert payload["state"]["dagger_round"] == 2


def dagger_run_options(tmp_path: Path, run_opts: dict) -> tuple[Path, Path, dict]:
    """A dataset of 60 pairs, an untrained expert, and the options of a 120-step DAgger run of 3 rounds over them
    (evaluated and saved every 40 steps): (dataset, expert, options)."""
    data = tmp_path / "data.npz"
    demos(n=60).save(data)
    expert = fake_checkpoint(tmp_path / "expert.pt")
    kw = dict(
        dataset=str(data), expert=str(expert), steps=120, overrides={"dagger_iterations": 3, "dagger_episodes": 2},
        stop_return=1e9, eval_every=40, checkpoint_every=40, **run_opts,
    )  # fmt: skip
    return data, expert, kw


def stopped_at_50(kw: dict) -> Any:
    """The DAgger run of `kw`, stopped at gradient step 50 (after its first round)."""
    return train("bc", "CartPole-v1", name="part", callbacks=[lambda info: info["env_steps"] >= 50], **kw)


def test_an_interrupted_dagger_run_resumes_exactly(tmp_path: Path, run_opts):
    _, _, kw = dagger_run_options(tmp_path, run_opts)
    full = train("bc", "CartPole-v1", name="full", **kw)
    part = stopped_at_50(kw)
    assert part["stopped_by"] == "interrupted" and part["gradient_steps"] == 50
    resumed = train(resume=part.run_dir, progress=False)
    a, b = load_checkpoint(full.run_dir), load_checkpoint(resumed.run_dir)
    for key in ("gradient_steps", "epoch", "position", "dagger_round", "dagger_env_steps"):
        assert a["state"][key] == b["state"][key], key
    np.testing.assert_array_equal(a["offline"]["aggregated_obs"], b["offline"]["aggregated_obs"])
    for name, tensor in a["algo"]["model"].items():
        assert (tensor == b["algo"]["model"][name]).all(), name


def test_a_resume_refuses_a_dataset_whose_pairs_changed_and_warns_of_an_expert_that_did(
    tmp_path: Path, run_opts, caplog
):
    """A dataset re-recorded to the same path (as many pairs, other ones) is not what the run trained on: its resume
    stops in one line, its checkpoint untouched. An expert that trained on since is named in a warning (its later
    labels are its new weights'), and the run goes on."""
    data, expert, kw = dagger_run_options(tmp_path, run_opts)
    part = stopped_at_50(kw)
    latest = part.run_dir / "checkpoints" / "latest.pt"
    saved = latest.read_bytes()
    demos(n=60, seed=1).save(data)
    with pytest.raises(DatasetError, match=r"is not the one the run was trained on \(its pairs changed since"):
        train(resume=part.run_dir, progress=False)
    assert latest.read_bytes() == saved
    demos(n=60).save(data)  # the same pairs again: a new file, the same content
    fake_checkpoint(expert, seed=4)
    with caplog.at_level(logging.WARNING, logger="rlfleet"):
        resumed = train(resume=part.run_dir, progress=False)
    assert f"expert {expert} changed since the run started" in caplog.text
    assert resumed["gradient_steps"] == 120


def test_a_dagger_run_resumed_from_best_says_its_labelled_pairs_are_gone(tmp_path: Path, run_opts, caplog):
    """best.pt keeps the learner and the counters, not the pairs DAgger's rounds labelled: a resume from it trains on
    without them, and says so in one line rather than in silence."""
    data = tmp_path / "data.npz"
    demos(n=60).save(data)
    train(
        "bc", "CartPole-v1", dataset=str(data), expert=str(fake_checkpoint(tmp_path / "expert.pt")), steps=120,
        overrides={"dagger_iterations": 3, "dagger_episodes": 2}, stop_return=1e9, eval_every=40, name="r",
        **run_opts,
    )  # fmt: skip
    best = tmp_path / "r" / "checkpoints" / "best.pt"
    rounds = load_checkpoint(best)["state"]["dagger_round"]
    assert rounds > 0
    with caplog.at_level(logging.WARNING, logger="rlfleet"):
        train(resume=best, steps=130, progress=False)
    assert f"holds none of the pairs DAgger's {rounds} rounds so far labelled" in caplog.text


def test_dagger_keeps_the_experts_labels_whatever_the_datasets_action_dtype(tmp_path: Path, run_opts):
    """Demonstrations of Discrete(3) actions stored as int8: the labels DAgger aggregates stay whole int64 labels
    (a dataset's bool actions would have turned the expert's 2 into 1 in the checkpoint, not in the running run)."""
    d = demos(n=60)
    d.act = d.act.astype(np.int8)
    d.save(tmp_path / "data.npz")
    run = train(
        "bc", "CartPole-v1", dataset=str(tmp_path / "data.npz"), expert=str(fake_checkpoint(tmp_path / "expert.pt")),
        steps=40, overrides={"dagger_iterations": 1, "dagger_episodes": 2}, stop_return=1e9, eval_every=1_000,
        **run_opts,
    )  # fmt: skip
    assert load_checkpoint(run.run_dir)["offline"]["aggregated_act"].dtype == np.int64


def test_collect_refuses_an_agent_whose_actions_no_dataset_holds_before_any_episode(tmp_path: Path, monkeypatch):
    """A MultiDiscrete agent's episodes could not be saved: `collect` says so before it runs them (thousands of
    Atari-length episodes would all be for nothing)."""
    from rlfleet.run import recording

    pytest.importorskip("space_envs")
    checkpoint = fake_checkpoint(tmp_path / "agent.pt", env="space_envs:JointChoice-v0")
    monkeypatch.setattr(recording, "record_episodes", lambda *a, **k: pytest.fail("episodes were run"))
    with pytest.raises(DatasetError, match=r"need a Discrete or Box action space, got MultiDiscrete\(\[4 4\]"):
        recording.collect_demonstrations(checkpoint, episodes=100_000)


MULTI_DISCRETE = gym.spaces.MultiDiscrete([3, 2], start=[1, 0])
BOX = gym.spaces.Box(np.float32([-1, 0]), np.float32([1, np.inf]))


@pytest.mark.parametrize(
    ("space", "act", "problem"),
    [
        (gym.spaces.Discrete(3), np.array([0, 2, 1]), None),
        (gym.spaces.Discrete(3), np.array([0, 3]), "action 1 is 3, outside Discrete(3)"),
        (gym.spaces.Discrete(3, start=-1), np.array([-1, 1]), None),
        (gym.spaces.Discrete(3), np.array([True, False]), None),
        (gym.spaces.Discrete(3), np.array([0.0, 1.0]), "actions are float64, but Discrete(3) takes whole numbers"),
        (MULTI_DISCRETE, np.array([[1, 0], [3, 1]]), None),
        (MULTI_DISCRETE, np.array([[1, 0], [0, 1]]), "action 1 is [0, 1], outside MultiDiscrete"),
        (MULTI_DISCRETE, np.array([[4, 0]]), "action 0 is [4, 0], outside MultiDiscrete"),
        (
            MULTI_DISCRETE,
            np.array([1, 2]),
            "each action has shape (), but MultiDiscrete([3 2], start=[1 0]) takes shape (2,)",
        ),
        (gym.spaces.MultiBinary(3), np.array([[0, 1, 1]], np.int8), None),
        (gym.spaces.MultiBinary(3), np.array([[0, 2, 1]]), "action 0 is [0, 2, 1], outside MultiBinary(3)"),
        (gym.spaces.MultiBinary(3), np.array([[0, 1]]), "each action has shape (2,), but MultiBinary(3) takes"),
        (BOX, np.array([[-1.0, 1e9], [0.5, 0.0]], np.float32), None),
        (BOX, np.array([[0.0, 0.0], [1.5, 0.0]]), "action 1 is [1.5, 0.0], outside Box"),
        (BOX, np.array([[0.0, -0.1]]), "action 0 is [0.0, -0.1"),
        (BOX, np.array([[np.nan, 0.0]]), "action 0 is [nan, 0.0]"),
        (BOX, np.array([["a", "b"]]), "actions are <U1, but Box"),
    ],
)
def test_actions_are_checked_against_the_action_space(space, act, problem):
    found = actions_problem(act, space)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found and "\n" not in found

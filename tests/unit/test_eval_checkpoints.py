"""`rlfleet eval` and `rlfleet collect` on checkpoints: videos of envs whose observations are Dict or Tuple ones and of
envs whose frames are tiny float grids (MinAtar), a checkpoint read once and mapped (its replay is never read), seeds
bounded so that every env seed derived from them is a 32-bit one, and a multi-agent run refused by collect in one
line."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from PIL import Image
from procs import RLFLEET

import rlfleet
from rlfleet.envs import make_vector_env
from rlfleet.fields import MAX_ENVS, ConfigError
from rlfleet.run import checkpoint as checkpoint_module
from rlfleet.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rlfleet.run.config import MAX_SEED, RunConfig
from rlfleet.run.evaluate import (
    GIF_MIN_SIDE,
    GifFrames,
    _evaluate_on_video,
    _save_gif,
    evaluate_checkpoint,
    gif_fps,
    gif_frame,
    load_agent,
)
from rlfleet.run.recording import collect_demonstrations


@pytest.fixture(scope="module")
def dict_obs_run(tmp_path_factory):
    """A tiny ppo run on Blackjack-v1, whose Tuple observation rlfleet gives as a Dict one."""
    logdir = tmp_path_factory.mktemp("runs")
    return rlfleet.train(
        "ppo", "Blackjack-v1", steps=64, n_envs=2, eval_episodes=2, logdir=str(logdir), name="bj", progress=False
    ).run_dir


def test_video_of_a_dict_observation_env(dict_obs_run, tmp_path):
    out = evaluate_checkpoint(dict_obs_run, episodes=2, seed=3, video_dir=tmp_path / "videos")
    assert out["episodes"] == 2 and out["video_dir"] == str(tmp_path / "videos")
    assert sorted(p.name for p in (tmp_path / "videos").iterdir()) == ["episode-0.gif", "episode-1.gif"]
    plain = evaluate_checkpoint(dict_obs_run, episodes=2, seed=3)
    assert out["returns"] == plain["returns"]  # the same greedy episodes, one by one as side by side


def spy_torch_load(monkeypatch) -> list[dict]:
    calls: list[dict] = []
    real = torch.load

    def load(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "load", load)
    return calls


def test_eval_and_collect_read_the_checkpoint_once_mapped(dict_obs_run, tmp_path, monkeypatch):
    """A latest.pt holds the run's replay (gigabytes on Atari): mapped, it is never read into memory."""
    calls = spy_torch_load(monkeypatch)
    evaluate_checkpoint(dict_obs_run, episodes=1)
    assert [c.get("mmap") for c in calls] == [True]
    calls.clear()
    collect_demonstrations(dict_obs_run, episodes=1, output=tmp_path / "d.npz")
    assert [c.get("mmap") for c in calls] == [True]
    calls.clear()
    load_agent(dict_obs_run)
    assert [c.get("mmap") for c in calls] == [True]


class Still:
    """A greedy policy that checks it is given a batch of one observation (a dict of arrays for a Dict one)."""

    def act(self, obs, state=None, explore=False):
        assert isinstance(obs, dict) and all(np.shape(v) == (1,) for v in obs.values()), obs
        return np.zeros(1, dtype=np.int64), {}, state


def test_video_episodes_batch_a_dict_observation(tmp_path):
    run = {"env": "Blackjack-v1", "env_kwargs": {}}
    result = _evaluate_on_video(Still(), run, 2, 0, 100, tmp_path)
    assert len(result.returns) == 2 and result.cut == 0
    assert (tmp_path / "episode-1.gif").is_file()


def test_a_tiny_float_frame_becomes_a_viewable_gif_frame():
    grid = np.zeros((10, 10, 3))  # MinAtar's render: floats in [0, 1]
    grid[2, 3] = (1.0, 0.5, 0.0)
    frame = gif_frame(grid)
    scale = -(-GIF_MIN_SIDE // 10)
    assert frame.dtype == np.uint8 and frame.shape == (10 * scale, 10 * scale, 3)
    assert (frame[2 * scale : 3 * scale, 3 * scale : 4 * scale] == (255, 128, 0)).all()  # a cell: a block of pixels
    assert frame.sum() == (255 + 128) * scale * scale
    big = np.full((400, 300, 3), 7, np.uint8)
    assert gif_frame(big).shape == big.shape and (gif_frame(big) == big).all()  # an Atari-sized frame stays as it is


def test_a_gif_keeps_each_frame_small_and_a_repeated_frame_once():
    """Every raw frame of an episode was held, enlarged, until its GIF was written: about 17 GB for an Atari agent
    that never starts its game in 27,000 steps. A frame equal to the one before only lengthens it."""
    atari = np.zeros((210, 160, 3), np.uint8)
    frames = GifFrames()
    for k in (0, 0, 0, 1, 1, 0):
        frames.append(atari + k)
    assert len(frames) == 6 and frames.repeats == [3, 2, 1] and len(frames.images) == 3
    assert all(im.mode == "P" and im.size == (160, 210) for im in frames.images)  # a byte a pixel, not enlarged
    assert gif_frame(atari).shape == atari.shape  # an Atari frame is not a grid to enlarge


def test_a_gif_shows_repeated_frames_for_as_long(tmp_path):
    frames = [np.full((10, 10, 3), v) for v in (0.0, 0.0, 0.0, 1.0)]
    _save_gif(frames, tmp_path / "g.gif", fps=10)
    assert gif_durations(tmp_path / "g.gif") == [300, 100]


def gif_durations(path) -> list[int]:
    with Image.open(path) as gif:
        durations = []
        for k in range(gif.n_frames):
            gif.seek(k)
            durations.append(gif.info["duration"])
    return durations


def test_a_video_plays_at_the_env_s_own_frame_rate(tmp_path):
    """Every GIF played at 30 frames a second: Blackjack's declares 4 (250 ms a frame), CartPole's 50."""
    _evaluate_on_video(Still(), {"env": "Blackjack-v1", "env_kwargs": {}}, 1, 0, 100, tmp_path)
    assert set(gif_durations(tmp_path / "episode-0.gif")) <= {250 * n for n in range(1, 4)}
    assert gif_fps(gym.make("CartPole-v1"), 30) == 50 and gif_fps(gym.make("Acrobot-v1"), 30) == 15


@pytest.mark.parametrize("declared", [None, 0, -5, "fast", True, float("nan")])
def test_a_frame_rate_the_env_does_not_declare_is_the_default(declared):
    env = type("Env", (), {"metadata": {"render_fps": declared}})()
    assert gif_fps(env, 30) == 30


@pytest.mark.parametrize("declared", [500, float("inf")])
def test_a_frame_rate_past_what_gif_viewers_show_is_capped(declared):
    assert gif_fps(type("Env", (), {"metadata": {"render_fps": declared}})(), 30) == 50


def test_a_video_folder_keeps_only_this_evaluation_s_gifs(tmp_path):
    (tmp_path / "episode-5.gif").write_bytes(b"an earlier evaluation's")
    (tmp_path / "notes.txt").write_text("the user's")
    _evaluate_on_video(Still(), {"env": "Blackjack-v1", "env_kwargs": {}}, 2, 0, 100, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episode-0.gif", "episode-1.gif", "notes.txt"]


def test_an_env_that_cannot_render_frames_is_one_error_line(tmp_path):
    import space_envs  # noqa: F401  # registers DictCue-v0, which has no render modes

    with pytest.raises(ConfigError, match=r"^--video: DictCue-v0 cannot render rgb_array frames \(AssertionError"):
        _evaluate_on_video(Still(), {"env": "DictCue-v0", "env_kwargs": {}}, 1, 0, 10, tmp_path / "v")
    assert not (tmp_path / "v").exists()


def test_a_gif_of_float_frames(tmp_path):
    frames = [np.full((10, 10, 3), v) for v in (0.0, 0.5, 1.0)]
    _save_gif(frames, tmp_path / "g.gif")
    with Image.open(tmp_path / "g.gif") as gif:
        assert gif.n_frames == 3 and min(gif.size) >= GIF_MIN_SIDE


@pytest.mark.filterwarnings("ignore:.*RGB-array rendering should return a numpy array with dtype uint8")
@pytest.mark.filterwarnings("ignore:.*No render fps was declared")  # MinAtar's metadata: Gymnasium's checker says so
def test_video_of_a_minatar_env(tmp_path):
    pytest.importorskip("minatar")

    class Noop:
        def act(self, obs, state=None, explore=False):
            return np.zeros(len(obs), dtype=np.int64), {}, state

    result = _evaluate_on_video(Noop(), {"env": "MinAtar/Breakout-v1", "env_kwargs": {}}, 1, 0, 20, tmp_path)
    assert len(result.returns) == 1
    with Image.open(tmp_path / "episode-0.gif") as gif:
        assert gif.n_frames > 1 and min(gif.size) >= GIF_MIN_SIDE


@pytest.mark.parametrize("command", ["eval", "collect"])
def test_a_seed_past_the_bound_is_one_error_line_before_the_checkpoint_is_read(command, tmp_path):
    with pytest.raises(ConfigError, match=rf"--seed={MAX_SEED + 1} is out of range: must be in \[0, {MAX_SEED}\]"):
        if command == "eval":
            evaluate_checkpoint(tmp_path / "no-run", seed=MAX_SEED + 1)
        else:
            collect_demonstrations(tmp_path / "no-run", episodes=1, seed=MAX_SEED + 1)


def test_a_run_seed_past_the_bound_is_refused_before_the_run_folder_is_made(tmp_path):
    with pytest.raises(ConfigError, match=r"--seed=4294967295 is out of range"):
        rlfleet.train("ppo", "CartPole-v1", seed=2**32 - 1, logdir=str(tmp_path), name="r", progress=False)
    assert not (tmp_path / "r").exists()


def test_every_env_seed_derived_from_the_largest_seed_is_a_32_bit_one():
    """Sub-env i: seed + i; evaluation envs: seed + 10_000 + i; an evaluation's episodes and collect's groups."""
    assert MAX_SEED + 10_000 + 2 * MAX_ENVS < 2**32
    pytest.importorskip("minatar")  # its envs seed a legacy RandomState, which takes no larger seed
    envs = make_vector_env("MinAtar/Breakout-v1", 2, seed=MAX_SEED, mode="sync", training=False)
    try:
        envs.reset(seed=MAX_SEED + 10_000)
    finally:
        envs.close()


def multi_agent_checkpoint(tmp_path):
    run = dataclasses.asdict(RunConfig(algo="ppo", env="pettingzoo:mpe2.simple_spread_v3"))
    return save_checkpoint(
        tmp_path / "ma" / "checkpoints" / "latest.pt", {"run_config": run, "algo_config": {}, "algo": {}}
    )


def test_collect_refuses_a_multi_agent_run_in_one_line(tmp_path):
    path = multi_agent_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="rlfleet collect does not take multi-agent runs") as caught:
        collect_demonstrations(tmp_path / "ma", episodes=2, output=tmp_path / "d.npz")
    assert "\n" not in str(caught.value) and "KeyError" not in str(caught.value)
    with pytest.raises(CheckpointError, match="is a multi-agent run"):  # a DAgger expert, say
        load_agent(path)
    assert not (tmp_path / "d.npz").exists()


def test_the_best_checkpoint_of_the_solving_evaluation_knows_the_run_solved(tmp_path):
    """`best.pt` of the evaluation that solved the run is saved after the run notes it solved, so a run resumed from
    it (or a sweep's trial handed it) does not go on as unsolved."""
    result = rlfleet.train("ppo", "CartPole-v1", steps=4_096, eval_every=512, eval_episodes=1, stop_return=9.0,
                           logdir=str(tmp_path), name="r", progress=False)  # fmt: skip
    assert result["solved_at_step"] is not None
    best = load_checkpoint(tmp_path / "r" / "checkpoints" / "best.pt")
    assert best["state"]["solved_at_step"] == result["solved_at_step"]


def test_the_time_to_solve_includes_the_evaluation_that_solved(monkeypatch, tmp_path):
    """`solved_at_s` (and the evaluation row's time) is read once the solving evaluation is over, as the peers'
    times to solve are: an evaluation of 0.5 s is in it."""
    from rlfleet.run.runner import RunBase

    def slow_solving_evaluation(self, step):
        time.sleep(0.5)
        return np.full(2, 1e6), 0, {}

    monkeypatch.setattr(RunBase, "run_evaluation", slow_solving_evaluation)
    result = rlfleet.train("ppo", "CartPole-v1", steps=4_096, eval_every=512, eval_episodes=2, stop_return=1e5,
                           logdir=str(tmp_path), name="r", progress=False)  # fmt: skip
    assert result["solved_at_step"] == 512 and result["solved_at_s"] >= 0.5, result


def test_a_mujoco_env_that_cannot_render_is_one_line_saying_how_to_give_it_opengl(monkeypatch, tmp_path):
    from rlfleet.run import evaluate

    FatalError = type("FatalError", (Exception,), {"__module__": "mujoco"})  # what MuJoCo raises without OpenGL

    class NoOpenGL:
        closed = False

        def reset(self, seed=None):
            return np.zeros(4, np.float32), {}

        def render(self):
            raise FatalError("an OpenGL platform library has not been loaded into this process")

        def close(self):
            self.closed = True

    env = NoOpenGL()
    monkeypatch.setattr(evaluate, "make_env", lambda *args, **kwargs: env)
    with pytest.raises(ConfigError, match=r"^--video: Hopper-v5 cannot render rgb_array frames \(FatalError: an Open"
                       r".*MUJOCO_GL=egl"):  # fmt: skip
        _evaluate_on_video(Still(), {"env": "Hopper-v5", "env_kwargs": {}}, 1, 0, 10, tmp_path)
    assert env.closed
    env.render = lambda: (_ for _ in ()).throw(ValueError("a bug of the env's own"))
    with pytest.raises(ConfigError, match=r"cannot render rgb_array frames \(ValueError: a bug of the env's own\);"):
        _evaluate_on_video(Still(), {"env": "Hopper-v5", "env_kwargs": {}}, 1, 0, 10, tmp_path)  # a MuJoCo env's


def test_a_video_that_cannot_render_leaves_no_folder(monkeypatch, tmp_path):
    """`eval --video DIR` whose env cannot render stops at its first frame without making DIR."""
    from rlfleet.run import evaluate

    class CannotRender:
        def reset(self, seed=None):
            return np.zeros(4, np.float32), {}

        def render(self):
            raise type("FatalError", (Exception,), {"__module__": "mujoco"})("no OpenGL")

        def close(self):
            pass

    monkeypatch.setattr(evaluate, "make_env", lambda *args, **kwargs: CannotRender())
    with pytest.raises(ConfigError, match="cannot render"):
        _evaluate_on_video(Still(), {"env": "Hopper-v5", "env_kwargs": {}}, 1, 0, 10, tmp_path / "videos")
    assert not (tmp_path / "videos").exists()


def test_a_mujoco_renderer_that_does_not_load_is_one_line_without_a_video(tmp_path):
    """MUJOCO_GL=osmesa on a machine without libOSMesa (what the --video error line suggests trying) failed inside
    `import mujoco` with an AttributeError traceback, for training and evaluation alike."""
    pytest.importorskip("mujoco")
    env = {**os.environ, "MUJOCO_GL": "osmesa"}
    if subprocess.run([sys.executable, "-c", "import mujoco"], env=env, capture_output=True).returncode == 0:
        pytest.skip("this machine has the osmesa renderer")
    proc = subprocess.run([*RLFLEET, "train", "td3", "--env", "InvertedPendulum-v5", "--steps", "300", "--logdir",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "MuJoCo does not load with MUJOCO_GL='osmesa'" in lines[0]
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="needs envpool")
def test_eval_plays_an_envpool_atari_run_s_episodes_on_envpool(tmp_path):
    """An Atari run evaluates on its own vector envs; EnvPool's games differ from Gymnasium's in their details, so
    `eval` on Gymnasium's played other episodes than the run's evaluation with the same seed (here 3.33 against the
    run's 1.67)."""
    result = rlfleet.train("dqn", "ALE/SpaceInvaders-v5", vector_mode="envpool", n_envs=1, steps=600, eval_every=600,
                           eval_episodes=3, eval_max_steps=300, logdir=str(tmp_path), name="r", progress=False,
                           overrides={"learning_starts": 1_000, "buffer_size": 1_000})  # fmt: skip
    seed = (0 + 10_000 * (1 + result["env_steps"])) % 2**31  # the run's evaluation seed at that step (`eval_seed`)
    again = evaluate_checkpoint(tmp_path / "r", episodes=3, seed=seed, max_steps=300)
    assert again["return_mean"] == pytest.approx(result["eval_return_mean"])

"""Greedy evaluation on separate envs: K episodes run side by side, one per env, unclipped returns.

Every evaluation episode ends: at the env's own time limit where it has one (`max_episode_steps`, a `TimeLimit`),
else after `EVAL_MAX_STEPS` steps or the run's `--eval-max-steps` (`rlfleet eval`/`collect`: `--max-steps`). A
greedy policy can walk in circles forever in an env without a limit (CliffWalking-v1); an episode cut there
counts with the return it had, and the evaluation says how many were cut (`Evaluation.cut`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from rlfleet.algos import resolve
from rlfleet.data.batch import stack_obs
from rlfleet.envs import make_env, make_vector_env
from rlfleet.envs.kwargs import env_info
from rlfleet.envs.normalize import ObsNormalizedAgent
from rlfleet.envs.pettingzoo import agent_spaces, is_pettingzoo_id, make_agent_env
from rlfleet.fields import MAX_ENVS, Bounds, ConfigError, check_fields, check_value, error_line
from rlfleet.run.checkpoint import MISFITS, CheckpointError, load_algo_state, load_checkpoint, misfit
from rlfleet.run.config import EVAL_MAX_STEPS, MAX_SEED, saved_run_config
from rlfleet.run.multi_agent import AgentEvaluation, Policies, checkpoint_policies, evaluate_agents
from rlfleet.run.paths import check_output_folder

EPISODES = Bounds(ge=1, le=1_000_000)
"""Episodes `rlfleet collect` runs (`--episodes`; `MAX_ENVS` at a time): up to a million, whose transitions a
machine's memory can hold for short episodes (`1e30` ran until killed, its dataset growing)."""
EVAL_EPISODES = Bounds(ge=1, le=MAX_ENVS)
"""Episodes `rlfleet eval` runs (`--episodes`): one env each, all at once, as a run's evaluation (`--eval-episodes`)."""
SEED = Bounds(ge=0, le=MAX_SEED)
"""Seeds of evaluation envs (`--seed`): those of a run (`MAX_SEED`), so that episode i's `seed + i` stays a 32-bit
seed, which envs that seed a legacy `RandomState` (MinAtar) take."""
MAX_STEPS = Bounds(ge=1)
"""Steps an evaluation episode of an env without a time limit may take (`--max-steps`, `--eval-max-steps`)."""


@dataclass(frozen=True)
class Evaluation:
    """What `evaluate` found: each counted episode's return, and how many of them it cut at `max_steps` (the env
    had not ended them; their returns are those they had)."""

    returns: np.ndarray
    cut: int
    max_steps: int


def episode_bound(own_limit: int | None, max_steps: int) -> int:
    """The steps an evaluation episode may take: `max_steps`, or the env's own time limit where that is shorter (its
    episodes end there by themselves, as in training)."""
    return int(max_steps) if own_limit is None else min(int(own_limit), int(max_steps))


def evaluate(
    algo: Any,
    envs: VectorEnv,
    n_episodes: int,
    seed: int,
    on_step: Callable[..., None] | None = None,
    max_steps: int = EVAL_MAX_STEPS,
) -> Evaluation:
    """Run exactly one episode in each of `n_episodes` envs with the greedy policy, each at most `max_steps`
    steps (see `episode_bound`); their returns, and how many were cut at that bound.

    `envs` is a vector env with at least `n_episodes` sub-envs (built with `training=False`, so returns
    are the real, unclipped ones). Finished envs keep stepping (autoreset) but are no longer counted. A
    recurrent policy's state (what `act` returns) is carried across steps and reset with
    `algo.reset_state` where an episode ends, as the `Collector` does.

    `on_step(obs, act, rew, done, counted)`, if given, sees every vector step: the observations acted
    on, the actions, rewards and `terminated | truncated` (or cut at the bound), and the `[num_envs]` mask of
    envs whose episode is still counted (recording demonstrations, DAgger).
    """
    if envs.num_envs < n_episodes:
        raise ValueError(f"evaluation needs {n_episodes} envs, got a vector env of {envs.num_envs}")
    obs, _ = envs.reset(seed=seed)
    n = envs.num_envs
    returns = np.zeros(n, dtype=np.float64)
    lengths = np.zeros(n, dtype=np.int64)
    finished = np.zeros(n, dtype=bool)
    cut = np.zeros(n, dtype=bool)
    state = None
    while not finished[:n_episodes].all():
        act, _, state = algo.act(obs, state, explore=False)
        next_obs, rew, terminated, truncated, _ = envs.step(act)
        returns += np.where(finished, 0.0, rew)
        lengths += ~finished
        ended = terminated | truncated
        cut_now = ~finished & ~ended & (lengths >= max_steps)  # the env would go on: evaluation ends it here
        cut |= cut_now
        done = ended | cut_now
        if on_step is not None:
            counted = ~finished
            counted[n_episodes:] = False
            on_step(obs, act, rew, done, counted)
        obs = next_obs
        if state is not None and done.any():  # a recurrent policy starts the next episode from a fresh state
            state = algo.reset_state(state, done)
        finished |= done
    return Evaluation(returns[:n_episodes], int(cut[:n_episodes].sum()), int(max_steps))


def load_agent(checkpoint: str | Path) -> tuple[Any, dict[str, Any]]:
    """The trained algorithm of a checkpoint (file or run folder) and the run config it was trained with.

    The agent acts on raw observations: one trained with `obs_norm` normalises them with the checkpoint's
    frozen statistics (`ObsNormalizedAgent`). The checkpoint's tensors are mapped, not read: the replay buffer
    that a `latest.pt` holds (gigabytes for an Atari DQN run) is never read into memory."""
    payload = load_checkpoint(checkpoint, mmap=True)
    return agent_of(payload, checkpoint, saved_run_config(payload, checkpoint))


def agent_of(payload: dict[str, Any], checkpoint: str | Path, run: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`load_agent` of a checkpoint already loaded (`payload`, with its run config `run`)."""
    if not isinstance(run["algo"], str) or not isinstance(run["env"], str):
        raise CheckpointError(f"checkpoint {checkpoint} names no algorithm and env in its run config")
    if is_pettingzoo_id(run["env"]):
        raise CheckpointError(
            f"checkpoint {checkpoint} is a multi-agent run ({run['env']}): it holds no single agent to load "
            "(rlfleet eval evaluates it)"
        )
    if not isinstance(run["env_kwargs"], dict):
        raise CheckpointError(f"checkpoint {checkpoint} has env_kwargs that are not a dict: {run['env_kwargs']!r}")
    algo_cls, config_cls, _, _ = resolve(run["algo"])
    info = env_info(run["env"], run["env_kwargs"])
    try:
        cfg = config_cls(**payload["algo_config"])
        check_fields(cfg, lambda f: f"{run['algo']} config {f.name}")
        algo = algo_cls(cfg, info["observation_space"], info["action_space"])
    except MISFITS as exc:  # another version's config
        raise misfit(checkpoint, run["algo"], exc) from None
    load_algo_state(algo, payload, checkpoint, run["algo"])  # another version's networks: the same one line
    return ObsNormalizedAgent.from_checkpoint(algo, payload), run


GIF_MIN_SIDE = 240
"""Pixels a GIF frame's shorter side has at least where it is a grid (`GIF_GRID_SIDE`): smaller frames (MinAtar's
10×10) are enlarged by a whole factor, each cell a block of pixels (nearest neighbour), so that the GIF can be
watched."""
GIF_GRID_SIDE = 100
"""Frames whose shorter side has fewer pixels are grids to enlarge; larger ones (Atari's 210×160) stay as they are."""


def gif_pixels(frame: Any) -> np.ndarray:
    """An env's `rgb_array` frame as `uint8` pixels (a float frame, MinAtar's, holds [0, 1] intensities)."""
    frame = np.asarray(frame)
    if frame.dtype.kind == "f":
        frame = np.rint(np.clip(np.nan_to_num(frame), 0.0, 1.0) * 255)
    if frame.dtype.kind == "b":
        frame = frame * 255
    return frame.astype(np.uint8, copy=False)


def gif_scale(frame: np.ndarray) -> int:
    """The whole factor a frame of this size is enlarged by in a GIF (1: not at all)."""
    side = max(1, min(frame.shape[:2]))
    return -(-GIF_MIN_SIDE // side) if side < GIF_GRID_SIDE else 1  # ceiling


def gif_frame(frame: Any) -> np.ndarray:
    """An env's `rgb_array` frame as a GIF shows it: `uint8`, a grid enlarged to `GIF_MIN_SIDE` pixels."""
    pixels = gif_pixels(frame)
    scale = gif_scale(pixels)
    return pixels.repeat(scale, axis=0).repeat(scale, axis=1) if scale > 1 else pixels


class GifFrames:
    """An episode's frames for a GIF, kept small as they come: each a palette image (a byte a pixel, where the frame
    has three) at the env's own size, and a frame equal to the one before only lengthens that one's time on screen.
    An Atari agent that never starts its game keeps one frame for its 27,000 steps, where holding every frame
    enlarged took about 17 GB. `len` counts the frames given."""

    def __init__(self) -> None:
        self.images: list[Any] = []
        self.repeats: list[int] = []
        self.count = 0
        self._last: np.ndarray | None = None

    def append(self, frame: Any) -> None:
        from PIL import Image

        self.count += 1
        pixels = gif_pixels(frame)
        if self._last is not None and pixels.shape == self._last.shape and np.array_equal(pixels, self._last):
            self.repeats[-1] += 1
            return
        self._last = pixels
        image = Image.fromarray(pixels)
        self.images.append(image.convert("P", palette=Image.Palette.ADAPTIVE) if image.mode == "RGB" else image)
        self.repeats.append(1)

    def __len__(self) -> int:
        return self.count

    @property
    def scale(self) -> int:
        """The whole factor the GIF enlarges the frames by (`gif_scale`)."""
        return gif_scale(self._last) if self._last is not None else 1


GIF_MAX_FPS = 50  # a GIF frame shorter than 20 ms is shown for 100 ms by most viewers


def gif_fps(env: Any, default: int) -> int:
    """The frames a second a GIF of `env` plays at: the env's own `render_fps` (its metadata's; at most
    `GIF_MAX_FPS`), `default` where it names none."""
    fps = getattr(env, "metadata", None) or {}
    fps = fps.get("render_fps") if isinstance(fps, dict) else None
    if isinstance(fps, (int, float)) and not isinstance(fps, bool) and fps > 0:
        return max(1, round(min(GIF_MAX_FPS, fps)))
    return default


def _save_gif(frames: GifFrames | list[Any], path: Path, fps: int = 30) -> None:
    """Write `frames` (a `GifFrames`, or the env's frames themselves) as a looping GIF of `fps` frames a second."""
    from PIL import Image

    if not isinstance(frames, GifFrames):
        kept = GifFrames()
        for frame in frames:
            kept.append(frame)
        frames = kept
    scale = frames.scale
    images = [im.resize((im.width * scale, im.height * scale), Image.Resampling.NEAREST) for im in frames.images]
    durations = [round(1000 * n / fps) for n in frames.repeats]
    images[0].save(path, save_all=True, append_images=images[1:], duration=durations, loop=0)


def checkpoint_bound(run: dict[str, Any], max_steps: int | None) -> int:
    """The step bound of a checkpoint's evaluation episodes (`episode_bound`): `max_steps`, else the run's
    `eval_max_steps`, or the env's own time limit where that is shorter."""
    if max_steps is None:
        max_steps = run["eval_max_steps"]
    return episode_bound(env_info(run["env"], run["env_kwargs"])["max_episode_steps"], max_steps)


def cut_note(cut: int, episodes: int, max_steps: int, option: str) -> str | None:
    """The line that says evaluation episodes were cut at the bound (None when none was)."""
    if not cut:
        return None
    return (
        f"note: {cut} of {episodes} episodes were cut at {max_steps} steps (the env had not ended them; {option} sets "
        "the bound); their returns are those they had"
    )


def evaluate_checkpoint(
    checkpoint: str | Path,
    episodes: int = 10,
    seed: int = 12345,
    video_dir: str | Path | None = None,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Rebuild the agent of a checkpoint, run `episodes` greedy episodes (each at most `checkpoint_bound` steps),
    optionally save each as a GIF (into `video_dir`, made if missing)."""

    check_value("--episodes", episodes, int, EVAL_EPISODES)
    check_value("--seed", seed, int, SEED)
    if max_steps is not None:
        check_value("--max-steps", max_steps, int, MAX_STEPS)
    if video_dir is not None:
        check_output_folder(video_dir, "--video")
    payload = load_checkpoint(checkpoint, mmap=True)  # once, mapped: a latest.pt's replay is never read
    run = saved_run_config(payload, checkpoint)
    if is_pettingzoo_id(run.get("env")):
        return _evaluate_agents_checkpoint(checkpoint, payload, run, episodes, seed, video_dir, max_steps)
    algo, run = agent_of(payload, checkpoint, run)
    bound = checkpoint_bound(run, max_steps)
    if video_dir is None:
        envs = make_vector_env(
            run["env"], episodes, seed=seed, mode=_eval_mode(run), training=False, **run["env_kwargs"]
        )
        try:
            result = evaluate(algo, envs, episodes, seed, max_steps=bound)
        finally:
            envs.close()
    else:
        result = _evaluate_on_video(algo, run, episodes, seed, bound, Path(video_dir))
    return _record(checkpoint, run, result.returns, result.cut, result.max_steps, video_dir)


def _eval_mode(run: dict[str, Any]) -> str:
    """The vector envs `eval` plays a run's episodes on: EnvPool's for an Atari run that evaluated on them (EnvPool's
    Atari games differ from Gymnasium's in their details: the same seed plays other episodes), Gymnasium's otherwise."""
    envpool = run.get("vector_mode") == "envpool" and env_info(run["env"], run["env_kwargs"])["is_atari"]
    return "envpool" if envpool else "sync"


def _record(
    checkpoint: str | Path,
    run: dict[str, Any],
    returns: np.ndarray,
    cut: int,
    max_steps: int,
    video_dir: str | Path | None,
    **more: Any,
) -> dict[str, Any]:
    """What `evaluate_checkpoint` returns (and `rlfleet eval` prints)."""
    return {
        "checkpoint": str(checkpoint),
        "algo": run["algo"],
        "env": run["env"],
        "env_kwargs": run["env_kwargs"],
        "episodes": len(returns),
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "returns": [float(r) for r in returns],
        **more,
        "max_steps": max_steps,
        "episodes_cut": cut,
        "video_dir": str(video_dir) if video_dir else None,
    }


def _evaluate_on_video(algo, run: dict[str, Any], episodes: int, seed: int, bound: int, video_dir: Path) -> Evaluation:
    """`evaluate`, one episode after another on a rendering env, each saved as `episode-<i>.gif` in `video_dir`."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # rendering to arrays needs no display
    returns, cut = np.zeros(episodes), 0
    for i in range(episodes):
        env, obs, first = _rendering_env(run, seed + i)
        frames = GifFrames()
        frames.append(first)
        done, state, steps = False, None, 0
        while not done and steps < bound:
            act, _, state = algo.act(stack_obs([obs]), state, explore=False)  # a batch of one
            obs, rew, terminated, truncated, _ = env.step(act[0])
            returns[i] += float(rew)
            frames.append(env.render())
            done, steps = terminated or truncated, steps + 1
        cut += not done
        fps = gif_fps(env, 30)
        env.close()
        if i == 0:  # not before: an env that cannot render leaves no empty folder
            _start_video_folder(video_dir)
        _save_gif(frames, video_dir / f"episode-{i}.gif", fps)
    return Evaluation(returns, cut, bound)


def _start_video_folder(video_dir: Path) -> None:
    """Make `video_dir`, without the GIFs an earlier `--video` into it left (which this one's would seem to be)."""
    video_dir.mkdir(parents=True, exist_ok=True)
    for old in video_dir.glob("episode-*.gif"):
        old.unlink()


def _rendering_env(run: dict[str, Any], seed: int) -> tuple[Any, Any, Any]:
    """A single env of the run that renders `rgb_array` frames, reset with `seed`: (env, first observation, first
    frame). An env that cannot render so — made without the render mode, no frame, or (MuJoCo) no OpenGL: `MUJOCO_GL`
    unset on a machine without a display — is one `ConfigError` (with how MuJoCo gets a renderer)."""
    env_id, env = run["env"], None
    try:
        with warnings.catch_warnings():  # an env that declares no rgb_array mode: the frame it gives, or the line below
            warnings.filterwarnings("ignore", message=".*not in the possible render_modes")
            env = make_env(env_id, seed=seed, training=False, render_mode="rgb_array", **run["env_kwargs"])
        obs, _ = env.reset(seed=seed)
        frame = env.render()
        if not isinstance(frame, np.ndarray):
            raise TypeError(f"render() gave {type(frame).__name__}, not an array")
        return env, obs, frame
    except Exception as exc:  # the env's own code may raise anything
        if env is not None:
            env.close()
        advice = (
            "; MuJoCo renders offscreen with MUJOCO_GL=egl (a GPU's) or MUJOCO_GL=osmesa (software)"
            if "mujoco" in f"{type(exc).__module__} {error_line(exc)}".lower()
            or env_info(env_id, run["env_kwargs"])["family"] == "mujoco"
            else ""
        )
        raise ConfigError(f"--video: {env_id} cannot render rgb_array frames ({error_line(exc)}){advice}") from None


def _evaluate_agents_on_video(
    policies: Policies, run: dict[str, Any], episodes: int, seed: int, bound: int, video_dir: Path
) -> AgentEvaluation:
    """`evaluate_agents` one episode at a time on a rendering env (episode i reset with `seed + i`), its frames
    from the reset on saved as `episode-<i>.gif` when it ends."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # rendering to arrays needs no display
    parts = []
    for i in range(episodes):
        env = make_agent_env(run["env"], "rgb_array", **run["env_kwargs"])
        frames = GifFrames()
        record = lambda _, env=env, frames=frames: frames.append(env.render())  # noqa: E731
        try:
            parts.append(evaluate_agents(policies, [env], seed + i, bound, record))
            fps = gif_fps(env.env, 10)  # the PettingZoo env's own
        finally:
            env.close()
        if i == 0:
            _start_video_folder(video_dir)
        _save_gif(frames, video_dir / f"episode-{i}.gif", fps)
    return AgentEvaluation(
        {agent: np.concatenate([p.agents[agent] for p in parts]) for agent in parts[0].agents},
        np.concatenate([p.returns for p in parts]),
        sum(p.cut for p in parts),
    )


def _evaluate_agents_checkpoint(
    checkpoint: str | Path,
    payload: dict[str, Any],
    run: dict[str, Any],
    episodes: int,
    seed: int,
    video_dir: str | Path | None,
    max_steps: int | None,
) -> dict[str, Any]:
    """`evaluate_checkpoint` of a multi-agent run (its checkpoint `payload`, run config `run`): its policies in
    `episodes` copies of the env side by side, each agent's return too; with `video_dir`, one episode after another
    on a rendering env (episode i reset with `seed + i`), each saved as `episode-<i>.gif` as soon as it ends, so that
    only one episode's frames are held at a time."""
    algo_cls, config_cls, _, _ = resolve(run["algo"])
    try:
        cfg = config_cls(**payload["algo_config"])
        check_fields(cfg, lambda f: f"{run['algo']} config {f.name}")
        policies = checkpoint_policies(
            algo_cls, cfg, run, agent_spaces(run["env"], **run["env_kwargs"]), payload["algo"], seed
        )
    except MISFITS as exc:
        raise misfit(checkpoint, run["algo"], exc) from None
    bound = checkpoint_bound(run, max_steps)
    if video_dir is None:
        envs = [make_agent_env(run["env"], None, **run["env_kwargs"]) for _ in range(episodes)]
        try:
            result = evaluate_agents(policies, envs, seed, bound)
        finally:
            for env in envs:
                env.close()
    else:
        result = _evaluate_agents_on_video(policies, run, episodes, seed, bound, Path(video_dir))
    return _record(
        checkpoint,
        run,
        result.returns,
        result.cut,
        bound,
        video_dir,
        agents={agent: float(r.mean()) for agent, r in result.agents.items()},
        agent_returns={agent: [float(x) for x in r] for agent, r in result.agents.items()},
        policy_map=policies.of_agent,
    )

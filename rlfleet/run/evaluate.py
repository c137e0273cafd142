"""Greedy evaluation on separate envs: K episodes run side by side, one per env, unclipped returns."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.algos import resolve
from rlfleet.envs import make_env, make_vector_env
from rlfleet.envs.normalize import ObsNormalizedAgent
from rlfleet.fields import Bounds, check_fields, check_value
from rlfleet.run.checkpoint import CheckpointError, load_checkpoint
from rlfleet.run.env_kwargs import env_info
from rlfleet.run.paths import check_output_folder

EPISODES = Bounds(ge=1)
"""Episodes `rlfleet eval` and `rlfleet collect` run (`--episodes`)."""
SEED = Bounds(ge=0)
"""Seeds of evaluation envs (`--seed`)."""


def evaluate(algo, envs, n_episodes: int, seed: int, on_step: Callable[..., None] | None = None) -> np.ndarray:
    """Run exactly one episode in each of `n_episodes` envs with the greedy policy; returns their returns.

    `envs` is a vector env with at least `n_episodes` sub-envs (built with `training=False`, so returns
    are the real, unclipped ones). Finished envs keep stepping (autoreset) but are no longer counted. A
    recurrent policy's state (what `act` returns) is carried across steps and reset with
    `algo.reset_state` where an episode ends, as the `Collector` does.

    `on_step(obs, act, rew, done, counted)`, if given, sees every vector step: the observations acted
    on, the actions, rewards and `terminated | truncated`, and the `[num_envs]` mask of envs whose
    episode is still counted (recording demonstrations, DAgger).
    """
    if envs.num_envs < n_episodes:
        raise ValueError(f"evaluation needs {n_episodes} envs, got a vector env of {envs.num_envs}")
    obs, _ = envs.reset(seed=seed)
    n = envs.num_envs
    returns = np.zeros(n, dtype=np.float64)
    finished = np.zeros(n, dtype=bool)
    state = None
    while not finished[:n_episodes].all():
        act, _, state = algo.act(obs, state, explore=False)
        next_obs, rew, terminated, truncated, _ = envs.step(act)
        returns += np.where(finished, 0.0, rew)
        done = terminated | truncated
        if on_step is not None:
            counted = ~finished
            counted[n_episodes:] = False
            on_step(obs, act, rew, done, counted)
        obs = next_obs
        if state is not None and done.any():  # a recurrent policy starts the next episode from a fresh state
            state = algo.reset_state(state, done)
        finished |= done
    return returns[:n_episodes]


def load_agent(checkpoint: str | Path) -> tuple[Any, dict[str, Any]]:
    """The trained algorithm of a checkpoint (file or run folder) and the run config it was trained with (its
    `env_kwargs` always there: `{}` for a checkpoint written before runs had them).

    The agent acts on raw observations: one trained with `obs_norm` normalises them with the checkpoint's
    frozen statistics (`ObsNormalizedAgent`)."""

    payload = load_checkpoint(checkpoint)
    run = payload["run_config"]
    if not isinstance(run.get("algo"), str) or not isinstance(run.get("env"), str):
        raise CheckpointError(f"checkpoint {checkpoint} names no algorithm and env in its run config")
    run = {**run, "env_kwargs": run.get("env_kwargs") or {}}
    if not isinstance(run["env_kwargs"], dict):
        raise CheckpointError(f"checkpoint {checkpoint} has env_kwargs that are not a dict: {run['env_kwargs']!r}")
    algo_cls, config_cls, _, _ = resolve(run["algo"])
    info = env_info(run["env"], run["env_kwargs"])
    try:
        cfg = config_cls(**payload["algo_config"])
        check_fields(cfg, lambda f: f"{run['algo']} config {f.name}")
        algo = algo_cls(cfg, info["observation_space"], info["action_space"])
        algo.load_state_dict(payload["algo"])
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:  # another version's config or networks
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise CheckpointError(
            f"checkpoint {checkpoint} does not fit rlfleet's {run['algo']} ({exc.__class__.__name__}: {detail})"
        ) from None
    return ObsNormalizedAgent.from_checkpoint(algo, payload), run


def _save_gif(frames: list[np.ndarray], path: Path, fps: int = 30) -> None:
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)


def evaluate_checkpoint(
    checkpoint: str | Path, episodes: int = 10, seed: int = 12345, video_dir: str | Path | None = None
) -> dict[str, Any]:
    """Rebuild the agent of a checkpoint, run `episodes` greedy episodes, optionally save each as a GIF
    (into `video_dir`, made if missing)."""

    check_value("--episodes", episodes, int, EPISODES)
    check_value("--seed", seed, int, SEED)
    if video_dir is not None:
        check_output_folder(video_dir, "--video")
    algo, run = load_agent(checkpoint)
    if video_dir is None:
        envs = make_vector_env(run["env"], episodes, seed=seed, mode="sync", training=False, **run["env_kwargs"])
        try:
            returns = evaluate(algo, envs, episodes, seed)
        finally:
            envs.close()
    else:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # rendering to arrays needs no display
        video_dir = Path(video_dir)
        video_dir.mkdir(parents=True, exist_ok=True)
        returns = np.zeros(episodes)
        for i in range(episodes):
            env = make_env(run["env"], seed=seed + i, training=False, render_mode="rgb_array", **run["env_kwargs"])
            obs, _ = env.reset(seed=seed + i)
            frames, done, state = [env.render()], False, None
            while not done:
                act, _, state = algo.act(np.asarray(obs)[None], state, explore=False)
                obs, rew, terminated, truncated, _ = env.step(act[0])
                returns[i] += float(rew)
                frames.append(env.render())
                done = terminated or truncated
            env.close()
            _save_gif(frames, video_dir / f"episode-{i}.gif")
    return {
        "checkpoint": str(checkpoint),
        "algo": run["algo"],
        "env": run["env"],
        "env_kwargs": run["env_kwargs"],
        "episodes": episodes,
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "returns": [float(r) for r in returns],
        "video_dir": str(video_dir) if video_dir else None,
    }

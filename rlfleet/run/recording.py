"""Recording demonstrations: a trained agent's greedy episodes as (obs, act) pairs (`rlfleet collect`).

`EpisodeRecorder` is an `on_step` hook of `evaluate`: it keeps the steps of every counted episode, env by
env, and hands them back as whole episodes one after another. `collect_demonstrations` loads a checkpoint
the way `rlfleet eval` does and records K episodes in groups of at most `ENVS` envs side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.data.batch import map_obs, stack_obs
from rlfleet.data.demos import Demonstrations, action_space_kind, is_dataset_file
from rlfleet.envs import env_spec_info, make_vector_env
from rlfleet.envs.pettingzoo import is_pettingzoo_id
from rlfleet.fields import ConfigError, check_value
from rlfleet.run.checkpoint import checkpoint_file, load_checkpoint
from rlfleet.run.config import EVAL_MAX_STEPS, saved_run_config
from rlfleet.run.evaluate import (
    EPISODES,
    MAX_STEPS,
    SEED,
    Evaluation,
    agent_of,
    checkpoint_bound,
    evaluate,
)
from rlfleet.run.paths import check_output_file

ENVS = 16  # episodes recorded side by side (one per env)


Labels = Callable[[Any, np.ndarray], np.ndarray]
"""`labels(obs, done) -> actions`: the actions to store instead of those taken."""


class EpisodeRecorder:
    """Collects (obs, act, rew) of the counted envs of `evaluate`, one list per env; a `labeller`'s labels replace
    `act`.

    `labeller() -> labels`, if given, makes the `Labels` of each group of episodes (`new_group`: envs that all start
    new episodes), which are asked for the actions to store instead of those taken (DAgger: the expert's action in
    every state the learner visits); they see every step of every env of the group, so a recurrent labeller can
    carry its own state, and each group's starts from none.
    """

    def __init__(self, labeller: Callable[[], Labels] | None = None) -> None:
        self.labeller = labeller
        self.labels: Labels | None = None
        self.episodes: list[tuple[list, list, list]] = []  # finished, in recording order
        self._open: dict[int, tuple[list, list, list]] = {}

    def new_group(self) -> None:
        """Before each `evaluate` of `record_episodes`: its envs all start new episodes."""
        self.labels = self.labeller() if self.labeller is not None else None

    def __call__(self, obs: Any, act: np.ndarray, rew: np.ndarray, done: np.ndarray, counted: np.ndarray) -> None:
        if self.labels is not None:
            act = self.labels(obs, done)
        for i in np.flatnonzero(counted):
            steps = self._open.setdefault(int(i), ([], [], []))
            steps[0].append(map_obs(itemgetter(i), obs))
            steps[1].append(act[i])
            steps[2].append(rew[i])
            if done[i]:
                self.episodes.append(self._open.pop(int(i)))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(obs, act, rew, starts) of the finished episodes, concatenated in the order they ended."""
        if not self.episodes:
            raise ValueError("no finished episode was recorded")
        obs = stack_obs([o for ep in self.episodes for o in ep[0]])
        act = np.stack([a for ep in self.episodes for a in ep[1]])
        rew = np.asarray([r for ep in self.episodes for r in ep[2]], dtype=np.float32)
        starts = np.zeros(len(rew), dtype=bool)
        starts[np.cumsum([0] + [len(ep[0]) for ep in self.episodes[:-1]])] = True
        return obs, act, rew, starts


def record_episodes(
    algo: Any,
    env_id: str,
    episodes: int,
    seed: int,
    recorder: EpisodeRecorder,
    env_kwargs: dict[str, Any] | None = None,
    max_steps: int = EVAL_MAX_STEPS,
) -> Evaluation:
    """Run `episodes` greedy episodes of `algo` on `env_id` built with `env_kwargs` (at most `ENVS` at a time, each
    at most `max_steps` steps: see `evaluate`) into `recorder`; their returns and how many were cut."""
    parts = []
    done = 0
    with_envs = min(episodes, ENVS)
    envs = make_vector_env(env_id, with_envs, seed=seed, mode="sync", training=False, **(env_kwargs or {}))
    try:
        while done < episodes:
            group = min(with_envs, episodes - done)
            recorder.new_group()
            parts.append(evaluate(algo, envs, group, seed + done, on_step=recorder, max_steps=max_steps))
            done += group
    finally:
        envs.close()
    return Evaluation(np.concatenate([p.returns for p in parts]), sum(p.cut for p in parts), max_steps)


def collect_demonstrations(
    checkpoint: str | Path,
    episodes: int,
    seed: int = 0,
    output: str | Path | None = None,
    max_steps: int | None = None,
) -> tuple[Demonstrations, Evaluation]:
    """`episodes` greedy episodes of a checkpoint's agent on its own env (each at most `checkpoint_bound` steps), as
    demonstrations, and the evaluation of those episodes (how many were cut); saved to `output` if given (checked
    before anything runs: not a folder, not another kind of file, in a writable folder). A multi-agent run's
    checkpoint is a `ConfigError`: its agents' episodes are no single agent's demonstrations."""
    check_value("--episodes", episodes, int, EPISODES)
    check_value("--seed", seed, int, SEED)
    if max_steps is not None:
        check_value("--max-steps", max_steps, int, MAX_STEPS)
    if output is not None:
        check_output_file(output, "-o", ours=is_dataset_file, kind="an rlfleet dataset")
    payload = load_checkpoint(checkpoint, mmap=True)  # mapped: a latest.pt's replay is never read
    run = saved_run_config(payload, checkpoint)
    if is_pettingzoo_id(run.get("env")):
        raise ConfigError(
            f"rlfleet collect does not take multi-agent runs: {checkpoint} trained on {run['env']} (collect records "
            "the episodes of a single-agent run)"
        )
    algo, run = agent_of(payload, checkpoint, run)
    action_space = env_spec_info(run["env"], **run["env_kwargs"])["action_space"]
    action_space_kind(action_space)  # before any episode: a MultiDiscrete agent's would all be for nothing
    recorder = EpisodeRecorder()
    bound = checkpoint_bound(run, max_steps)
    evaluation = record_episodes(algo, run["env"], episodes, seed, recorder, run["env_kwargs"], bound)
    obs, act, rew, starts = recorder.arrays()
    source = str(checkpoint_file(checkpoint).resolve())  # the file itself, absolute: a run folder's latest.pt moves on
    demos = Demonstrations(obs, act, rew, starts, run["env"], action_space, source=source, env_kwargs=run["env_kwargs"])
    if output is not None:
        demos.save(output)
    return demos, evaluation

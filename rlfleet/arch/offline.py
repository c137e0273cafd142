"""The `offline` architecture: an imitation algorithm learns from a dataset of demonstrations (and DAgger).

One process. The demonstrations (`--dataset`, written by `rlfleet collect`) are checked against the env,
turned into training data once (`algo.process`), and learned from in shuffled minibatches, one
`algo.update` per gradient step. **A step of this runner is a gradient step**: `--steps`, `--eval-every`,
`--checkpoint-every`, the `step` column of `metrics.csv` and `env_steps`/`solved_at_step` in
`result.json` all count gradient steps (`result.json` also says `gradient_steps` and `dagger_env_steps`).
Everything else is what every run does (`RunBase`): greedy evaluation on separate envs, best/latest
checkpoints, stop once solved, `result.json`, `curves.png`; the checkpoints work with `rlfleet eval`.

With an expert checkpoint (`--expert`), DAgger (Ross, Gordon & Bagnell 2011): the budget is split into
`dagger_iterations` + 1 equal phases; after each phase but the last, the learner runs `dagger_episodes`
greedy episodes, the expert's greedy action labels every state visited, the pairs join the training data,
and training continues on the aggregate (a new shuffled epoch).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.data.batch import Batch, map_obs, obs_len
from rlfleet.data.demos import DatasetError, kwargs_items, load_demonstrations
from rlfleet.run.checkpoint import content_digest, load_algo_state, load_checkpoint
from rlfleet.run.config import ConfigError, RunConfig, saved_run_config
from rlfleet.run.evaluate import agent_of
from rlfleet.run.recording import EpisodeRecorder, record_episodes
from rlfleet.run.runner import FAILURES, RunBase, RunResult, StopRequest, as_failure

log = logging.getLogger(__name__)

DAGGER_SEED = 20_000  # offset of the DAgger episodes' env seeds from the run's seed


@dataclass
class OfflineOptions:
    """The offline architecture's options."""

    dataset: str | None = None
    """Demonstrations (an .npz written by `rlfleet collect`) to imitate; the run keeps its absolute path."""
    expert: str | None = None
    """Checkpoint (file or run folder) of an expert whose greedy actions label the learner's states (DAgger); the run
    keeps its absolute path."""


PATH_OPTIONS = ("dataset", "expert")
"""The offline options that name files. A run keeps them as absolute paths (`OfflineRunner.check_config`), so that
`--resume` finds them from any folder; a resume compares them as the files they name (`same_path`)."""


def same_path(given: str, saved: str) -> bool:
    """Whether two spellings of a path name the same file, seen from this folder (`data.npz`, `./data.npz` and its
    absolute path alike); a run saved with a relative path compares as it did in the folder it was started in."""
    return Path(given).resolve() == Path(saved).resolve()


def check_data_source(cfg: RunConfig, algo_cls: type) -> None:
    """Imitation algorithms need `--dataset` and the offline architecture; the others must not get either."""
    options = cfg.options
    if getattr(algo_cls, "data", None) != "dataset":
        for flag, value in (("--dataset", options.get("dataset")), ("--expert", options.get("expert"))):
            if value is not None:
                raise ConfigError(
                    f"{flag} is for imitation algorithms (bc); {cfg.algo} learns from its own env steps: drop {flag}"
                )
        if cfg.arch == "offline":
            raise ConfigError(f"the offline architecture runs imitation algorithms (bc), not {cfg.algo}")
        return
    if cfg.arch != "offline":
        raise ConfigError(f"{cfg.algo} learns from a dataset: it runs on the offline architecture, not {cfg.arch}")
    if options.get("dataset") is None:
        raise ConfigError(
            f"{cfg.algo} imitates demonstrations: give --dataset FILE "
            "(record one with rlfleet collect CHECKPOINT -o FILE)"
        )


class OfflineRunner(RunBase):
    """Minibatch gradient steps on demonstrations (aggregated with expert-labelled learner states under DAgger)."""

    Options = OfflineOptions
    single_process = True

    log_every = 100
    min_eval_every = 500

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        self.state.update(
            gradient_steps=0,
            epoch=0,
            position=0,
            dagger_round=0,
            dagger_env_steps=0,
            dagger_episodes=0,
            dataset_size=len(self.demos),
            dataset_digest=content_digest([self.demos.obs, self.demos.act, self.demos.starts]),
            expert_digest=self.expert_digest,
        )
        self.returns: deque[float] = deque(maxlen=100)
        empty = map_obs(lambda v: v[:0], self.demos.obs)
        label = np.int64 if self.demos.action_kind == "discrete" else np.float32
        self.aggregated = Batch(obs=empty, act=np.zeros((0, *self.demos.act.shape[1:]), label))  # expert-labelled
        if resume_from is not None:
            self._restore(resume_from)
        self.data = self.algo.process(Batch.cat([Batch(obs=self.demos.obs, act=self.demos.act), self.aggregated]))
        self._perm: tuple[tuple[int, int], np.ndarray] | None = None
        self.eval_envs = self.make_eval_envs()
        self._write_config(
            {
                "dataset": {
                    "path": str(self.opts.dataset),
                    "size": len(self.demos),
                    "episodes": int(self.demos.starts.sum()),
                }
            }
        )

    def check_config(self) -> None:
        cfg = self.cfg
        if cfg.n_envs is not None:
            raise ConfigError(f"--n-envs does not apply to {cfg.algo} (the offline runner steps no training envs)")
        dagger = [key for key in ("dagger_iterations", "dagger_episodes") if key in cfg.overrides]
        if dagger and self.opts.expert is None and not self.resuming:
            raise ConfigError(f"--set {dagger[0]}={cfg.overrides[dagger[0]]} has no effect without --expert (DAgger's)")
        if self.opts.expert is not None and self.algo_cfg.dagger_iterations == 0 and not self.resuming:
            raise ConfigError(
                "--expert has no effect with dagger_iterations=0 (no DAgger round asks it for labels): leave --expert "
                "out for plain bc, or give rounds"
            )
        info = self.env_info
        self.demos = load_demonstrations(self.opts.dataset)
        if len(self.demos) == 0:  # before the checks of its arrays, which have nothing to look at
            raise DatasetError(f"dataset {self.opts.dataset} holds no demonstrations")
        self.demos.check_fits(cfg.env, info["observation_space"], info["action_space"], cfg.env_kwargs)
        self.expert, self.expert_digest = None, None
        if self.opts.expert is not None:
            payload = load_checkpoint(self.opts.expert, mmap=True)  # mapped: a latest.pt's replay is never read
            self.expert, expert_run = agent_of(payload, self.opts.expert, saved_run_config(payload, self.opts.expert))
            self.expert_digest = content_digest([payload["algo"], payload.get("obs_norm")])
            if expert_run["env"] != cfg.env:
                raise ConfigError(f"expert {self.opts.expert} was trained on {expert_run['env']!r}, not on {cfg.env!r}")
            if expert_run["env_kwargs"] != cfg.env_kwargs:
                raise ConfigError(
                    f"expert {self.opts.expert} was trained on {cfg.env} with --env-kwargs "
                    f"{kwargs_items(expert_run['env_kwargs'])}, this run has {kwargs_items(cfg.env_kwargs)}: "
                    "give the same"
                )
        for key in PATH_OPTIONS:  # what was read, as the run keeps it (config.json, checkpoints): found from anywhere
            path = getattr(self.opts, key)
            if path is not None:
                setattr(self.opts, key, str(Path(path).resolve()))
                cfg.options[key] = getattr(self.opts, key)

    # ----------------------------------------------------------------------------------------- state
    @property
    def env_steps(self) -> int:
        """Gradient steps taken (the offline runner's unit of progress)."""
        steps: int = self.state["gradient_steps"]
        return steps

    @property
    def episodes(self) -> int:
        """Learner episodes run for DAgger."""
        episodes: int = self.state["dagger_episodes"]
        return episodes

    def _payload(self, with_data: bool) -> dict[str, Any]:
        payload = super()._payload(with_data)
        if with_data:
            payload["offline"] = {
                "aggregated_obs": self.aggregated.to_dict()["obs"],  # a dict for Dict observations
                "aggregated_act": self.aggregated.act,
                "returns": list(self.returns),
            }
        return payload

    def _restore(self, payload: dict[str, Any]) -> None:
        size, digest, expert = (self.state[k] for k in ("dataset_size", "dataset_digest", "expert_digest"))
        load_algo_state(self.algo, payload, self.run_dir, self.cfg.algo)
        self.state.update(payload["state"])
        if self.state["dataset_size"] != size:
            raise DatasetError(
                f"dataset {self.opts.dataset} has {size} pairs, but the run was trained on "
                f"{self.state['dataset_size']}: resume with the same file"
            )
        if self.state.get("dataset_digest", digest) != digest:  # checkpoints of older versions hold none
            raise DatasetError(
                f"dataset {self.opts.dataset} is not the one the run was trained on (its pairs changed since, "
                "re-recorded to the same path?): resume with the same file"
            )
        self.state["dataset_digest"] = digest
        if expert is not None and self.state.get("expert_digest", expert) != expert:
            log.warning(
                f"warning: expert {self.opts.expert} changed since the run started (it trained on?): DAgger's "
                "later rounds are labelled by its weights as they are now"
            )
        self.state["expert_digest"] = expert
        saved = payload.get("offline") or {}
        if "aggregated_obs" in saved:
            self.aggregated = Batch(obs=saved["aggregated_obs"], act=saved["aggregated_act"])
        elif self.state["dagger_round"] > 0:  # best.pt: the learner and the counters alone
            log.warning(
                f"the checkpoint holds none of the pairs DAgger's {self.state['dagger_round']} rounds so far labelled "
                "(best.pt keeps the learner alone): the resumed run trains on without them, and does not run those "
                "rounds again"
            )
        self.returns.extend(saved.get("returns", []))

    def _result(self, stopped_by: str, wall: float) -> dict[str, Any]:
        return {
            **super()._result(stopped_by, wall),
            "gradient_steps": self.state["gradient_steps"],
            "dataset": str(self.opts.dataset),
            "dataset_size": len(self.demos),
            "training_size": len(self.data),
            "dagger_rounds": self.state["dagger_round"],
            "dagger_env_steps": self.state["dagger_env_steps"],
        }

    # ----------------------------------------------------------------------------------------- data
    def _minibatch(self) -> Batch:
        """The next minibatch of a shuffled pass over the training data (a pass drops its incomplete tail)."""
        n = len(self.data)
        size = min(self.algo_cfg.batch_size, n)
        if self.state["position"] + size > n:
            self.state["epoch"] += 1
            self.state["position"] = 0
        key = (self.state["epoch"], n)
        if self._perm is None or self._perm[0] != key:  # the pass's order follows from (seed, epoch) alone
            self._perm = (key, np.random.default_rng([self.cfg.seed, self.state["epoch"]]).permutation(n))
        start = self.state["position"]
        self.state["position"] += size
        minibatch: Batch = self.data[self._perm[1][start : start + size]]
        return minibatch

    def _dagger_due(self) -> bool:
        rounds: int = self.algo_cfg.dagger_iterations
        done: int = self.state["dagger_round"]
        if self.expert is None or done >= rounds:
            return False
        return self.env_steps >= (done + 1) * self.total_steps // (rounds + 1)

    def _expert_labels(self) -> Callable[[Any, np.ndarray], np.ndarray]:
        """Labels for `EpisodeRecorder` (its `labeller`: one for each group of episodes, starting from no state): the
        expert's greedy actions, its recurrent state carried along."""
        expert, state = self.expert, None
        assert expert is not None  # DAgger runs with an expert

        def labels(obs: Any, done: np.ndarray) -> np.ndarray:
            nonlocal state
            act: np.ndarray
            act, _, state = expert.act(obs, state, explore=False)
            if state is not None and done.any():
                state = expert.reset_state(state, done)
            return act

        return labels

    def dagger_round(self) -> list[float]:
        """Run the learner, label the states it visits with the expert, aggregate; the learner's returns."""
        self.state["dagger_round"] += 1
        episodes = self.algo_cfg.dagger_episodes
        seed = self.cfg.seed + DAGGER_SEED + 1_000 * self.state["dagger_round"]
        recorder = EpisodeRecorder(labeller=self._expert_labels)
        evaluation = record_episodes(
            self.algo, self.cfg.env, episodes, seed, recorder, self.cfg.env_kwargs, self.eval_max_steps
        )
        obs, act, _, _ = recorder.arrays()
        act = act.astype(self.aggregated.act.dtype)  # the expert's own labels (not the dataset's dtype: bool, int8)
        self.aggregated = Batch.cat([self.aggregated, Batch(obs=obs, act=act)])
        self.data = Batch.cat([self.data, self.algo.process(Batch(obs=obs, act=act))])
        self.state["dagger_env_steps"] += obs_len(obs)
        self.state["dagger_episodes"] += episodes
        self.state["epoch"] += 1  # a new pass that includes the new pairs
        self.state["position"] = 0
        returns = [float(r) for r in evaluation.returns]
        self.returns.extend(returns)
        return returns

    # ----------------------------------------------------------------------------------------- loop
    def run(self) -> RunResult:
        logger, start = self.start_logging()
        stopped_by, failure = "steps", None
        try:
            with StopRequest() as stop:
                try:
                    while self.state["gradient_steps"] < self.total_steps:
                        new_returns: list[float] = []
                        if self._dagger_due():
                            new_returns = self.dagger_round()
                            logger.log(self.env_steps, {"charts/training_pairs": len(self.data)})
                        self.algo.schedule(self.state["gradient_steps"], self.total_steps)
                        metrics = self.algo.update(self._minibatch())
                        self.state["gradient_steps"] += 1
                        reason = self.after_update(logger, start, new_returns, self.returns, metrics, stop.requested)
                        if reason is not None:
                            stopped_by = reason
                            break
                except FAILURES as exc:  # an evaluation env process that died or hung
                    failure, stopped_by = as_failure(exc), "failure"
            stopped_by = self.finish(logger, start, stopped_by)
        finally:
            logger.close()
            self.eval_envs.close()
        return self.conclude(stopped_by, start, failure)

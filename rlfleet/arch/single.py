"""`single`: one process steps a vector env and learns — the default architecture of every algorithm but `a3c`
and `bc`. The on- and off-policy loops are two short methods: collect a rollout segment and `update` on it, or
collect `train_freq` vector steps into the replay buffer and take `gradient_steps` updates from it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlfleet.data.rollout import RolloutStorage
from rlfleet.device import algorithm_acts_on_device
from rlfleet.envs import make_vector_env
from rlfleet.envs import snapshot as env_state
from rlfleet.envs.normalize import ObsNormalizedAgent, ReplayNormalizer, normalize_training_envs
from rlfleet.run.checkpoint import load_algo_state
from rlfleet.run.collector import Collector
from rlfleet.run.config import RunConfig
from rlfleet.run.multi_agent import MultiAgentCollector
from rlfleet.run.multi_agent_runner import MultiAgentRunBase, make_agent_envs
from rlfleet.run.runner import FAILURES, RunBase, RunResult, StopRequest, as_failure, workers_ignore_sigint

log = logging.getLogger(__name__)


class SingleRunner(RunBase):
    """The `single` architecture: one process steps a vector env and learns.

    An iteration is: collect (a rollout segment, or `train_freq` steps into replay) and learn from it;
    then schedules, logging, evaluation, checkpoints and stop checks, all at iteration boundaries so
    that a resumed run repeats the uninterrupted one exactly.
    """

    single_process = True
    takes_vector_mode = True

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        n_envs = self.algo_cfg.n_envs
        with workers_ignore_sigint():
            envs = make_vector_env(
                cfg.env,
                n_envs,
                seed=cfg.seed,
                mode=cfg.vector_mode,
                training=True,
                timeout_s=cfg.env_timeout_s,
                **cfg.env_kwargs,
            )
            # replay keeps raw observations and rewards, normalised when sampled (rlfleet.envs.normalize)
            replay = self.algo.data == "replay"
            self.envs = normalize_training_envs(envs, self.obs_stats, self.reward_norm, raw=replay)
            self.eval_envs = self.make_eval_envs()
        agent = ObsNormalizedAgent(self.algo, self.obs_stats) if replay and self.obs_stats is not None else self.algo
        self.collector = Collector(self.envs, agent, seed=cfg.seed)
        self.buffer = None
        self.storage = None
        if replay:
            self.buffer = self.algo.make_buffer(n_envs, self.total_steps, seed=cfg.seed)
            if self.obs_stats is not None or self.reward_norm is not None:
                self.buffer.normalizer = ReplayNormalizer(self.obs_stats, self.reward_norm)
        else:
            self.storage = RolloutStorage(self.algo_cfg.rollout_len, n_envs)
        if resume_from is not None:
            self._restore(resume_from)
        self._write_config()

    @property
    def env_steps(self) -> int:
        return self.collector.env_steps

    @property
    def episodes(self) -> int:
        return self.collector.episodes

    # ----------------------------------------------------------------------------------------- state
    def _payload(self, with_data: bool) -> dict[str, Any]:
        """The run's checkpoint; the episodes counted and their recent returns in every one (`best.pt` too: a run
        resumed from it counts on), the envs, the collector's place in them and the replay with the data."""
        payload = super()._payload(with_data)
        payload["collector"] = {
            "episodes": self.collector.episodes,
            "returns": list(self.collector.returns),
            "lengths": list(self.collector.lengths),
        }
        if with_data:
            payload["torch_rng"] = torch.get_rng_state()
            if self.device.type == "cuda":  # what a learner draws on its GPU (SAC's actions in an update)
                payload["cuda_rng"] = torch.cuda.get_rng_state(self.device)
            payload["collector"] |= {
                "obs": self.collector.obs,
                "state": self.collector.state,  # a recurrent policy's state goes with obs (None: feed-forward)
                "starts": self.collector.starts,
            }
            payload["envs"] = env_state.snapshot(self.envs)
            if self.buffer is not None:
                payload["buffer"] = self.buffer.state_dict()
        return payload

    def _restore(self, payload: dict[str, Any]) -> None:
        load_algo_state(self.algo, payload, self.run_dir, self.cfg.algo)
        if self.obs_stats is not None:
            self.obs_stats.load_state_dict(payload["obs_norm"])
        if self.reward_norm is not None:
            self.reward_norm.load_state_dict(payload["reward_norm"])
        self.state.update(payload["state"])
        c = self.collector
        c.env_steps = int(payload["env_steps"])
        envs_restored = False
        if "collector" in payload:
            col = payload["collector"]
            c.episodes = int(col["episodes"])
            c.returns.extend(col["returns"])
            c.lengths.extend(col["lengths"])
            envs_restored = "obs" in col and env_state.restore(self.envs, payload.get("envs"))
            if envs_restored:
                c.obs = col["obs"]
                c.state = col.get("state")  # loaded on the CPU; a CNN policy acts (and keeps it) on the device
                if c.state is not None and algorithm_acts_on_device(self.algo):
                    c.state = tuple(s.to(self.device) for s in c.state)
                c.starts = col.get("starts", c.starts)
        if "torch_rng" in payload:
            torch.set_rng_state(payload["torch_rng"])
        if "cuda_rng" in payload and self.device.type == "cuda":  # on another device, its draws start from the seed
            torch.cuda.set_rng_state(payload["cuda_rng"], self.device)
        if self.buffer is not None and "buffer" in payload:
            self.buffer.load_state_dict(payload["buffer"])
        elif self.buffer is not None:  # best.pt: the learner and the counters alone
            log.warning(
                "the checkpoint holds no replay (best.pt keeps the learner alone): the resumed run fills it anew and "
                "makes no update until it holds learning_starts transitions again"
            )
        if not envs_restored:  # the envs begin new episodes: what was stored of the old ones ends here
            why = env_state.uncaptured(self.envs) or "the checkpoint holds none"
            log.warning(
                f"the training envs' state could not be saved ({why}): the resumed run starts new episodes, so it "
                "does not repeat the uninterrupted run exactly"
            )
            c.restart(seed=self.cfg.seed + c.env_steps)  # new episodes, not the first run's again
            if self.buffer is not None:
                self.buffer.mark_boundary(np.arange(self.collector.n_envs))
            if self.reward_norm is not None:
                self.reward_norm.restart_returns()

    # ----------------------------------------------------------------------------------------- loop
    def _learn_rollout(self) -> tuple[dict[str, float], int]:
        """A segment collected and learned from: its metrics, and one update."""
        assert self.storage is not None  # a rollout algorithm's run has its storage
        segment = self.collector.collect_rollout(self.storage)
        metrics: dict[str, float] = self.algo.update(segment)
        return metrics, 1

    def _learn_replay(self) -> tuple[dict[str, float], int]:
        """`train_freq` steps into replay, then a pass of `gradient_steps` updates once it holds enough (each counted,
        as every architecture counts a replay algorithm's updates; none before `learning_starts`)."""
        cfg = self.algo_cfg
        assert self.buffer is not None  # a replay algorithm's run has its buffer
        self.collector.collect(self.buffer, n_step=cfg.train_freq * self.collector.n_envs)
        if not self.buffer.ready(cfg.batch_size, cfg.learning_starts):
            return {}, 0
        return self.replay_updates(), cfg.gradient_steps

    def run(self) -> RunResult:
        learn = self._learn_rollout if self.algo.data == "rollout" else self._learn_replay
        c = self.collector
        logger, start = self.start_logging()
        stopped_by, failure = "steps", None
        try:
            with StopRequest() as stop:
                try:
                    while c.env_steps < self.total_steps:
                        self.algo.schedule(c.env_steps, self.total_steps)
                        metrics, updates = learn()
                        returns = c.pop_new_returns()
                        reason = self.after_update(logger, start, returns, c.returns, metrics, stop.requested, updates)
                        if reason is not None:
                            stopped_by = reason
                            break
                except FAILURES as exc:  # an env process that died or hung: a clean stop, then the run says why
                    failure, stopped_by = as_failure(exc), "failure"
            stopped_by = self.finish(logger, start, stopped_by)
        finally:
            logger.close()
            self.envs.close()
            self.eval_envs.close()
        return self.conclude(stopped_by, start, failure)


class MultiAgentSingleRunner(MultiAgentRunBase):
    """The `single` architecture on a PettingZoo env: one process steps `n_envs` copies of the env with every policy
    of the run and each trained policy learns from its own agents' transitions (`rlfleet.run.multi_agent`). An
    iteration is `rollout_len` steps (rollout algorithms: each finished segment learned from) or `train_freq` steps
    (replay: `gradient_steps` updates), then the same bookkeeping as `SingleRunner`'s. A resumed run starts new
    episodes (PettingZoo envs have no snapshot); its replay buffers are restored."""

    single_process = True

    def __init__(
        self,
        cfg: RunConfig,
        resume_from: dict[str, Any] | None = None,
        run_dir: Path | None = None,
        callbacks: list[Callable[[dict[str, Any]], bool | None]] | None = None,
    ):
        super().__init__(cfg, resume_from, run_dir, callbacks)
        copies = self.algo_cfg.n_envs
        self.envs = make_agent_envs(cfg, copies)
        self.eval_envs = self.make_eval_envs()
        self.data = self.policy_data(copies)
        self.collector = MultiAgentCollector(self.envs, self.algo, self.data, seed=cfg.seed)
        if resume_from is not None:
            self._restore(resume_from)
        self._write_config()

    @property
    def env_steps(self) -> int:
        return self.collector.env_steps

    @property
    def episodes(self) -> int:
        return self.collector.episodes

    def agent_returns(self) -> dict[str, list[float]]:
        return self.collector.pop_agent_returns()

    def _payload(self, with_data: bool) -> dict[str, Any]:
        payload = super()._payload(with_data)
        payload["episodes"] = self.collector.episodes
        if with_data:
            payload["buffers"] = {n: d.buffer.state_dict() for n, d in self.data.items() if d.buffer is not None}
        return payload

    def _restore(self, payload: dict[str, Any]) -> None:
        load_algo_state(self.algo, payload, self.run_dir, self.cfg.algo)  # every policy's (`Policies`)
        self.state.update(payload["state"])
        c = self.collector
        c.env_steps = int(payload["env_steps"])
        c.stats.episodes = int(payload.get("episodes", 0))
        c.restart(seed=self.cfg.seed + c.env_steps)  # new episodes, not the first run's again
        for name, state in payload.get("buffers", {}).items():
            buffer = self.data[name].buffer if name in self.data else None
            if buffer is not None:
                buffer.load_state_dict(state)
                buffer.mark_boundary(np.arange(self.data[name].lanes))

    def run(self) -> RunResult:
        steps = self.algo_cfg.rollout_len if self.algo.data == "rollout" else self.algo_cfg.train_freq
        c = self.collector
        logger, start = self.start_logging()
        stopped_by = "steps"
        try:
            with StopRequest() as stop:
                while c.env_steps < self.total_steps:
                    self.algo.schedule(c.env_steps, self.total_steps)
                    for _ in range(steps):
                        c.step()
                    metrics, updates = self.learn(self.data)
                    reason = self.after_update(
                        logger, start, c.pop_new_returns(), c.stats.returns, metrics, stop.requested, updates
                    )
                    if reason is not None:
                        stopped_by = reason
                        break
            stopped_by = self.finish(logger, start, stopped_by)
        finally:
            logger.close()
            self.envs.close()
            self.eval_envs.close()
        return self.write_result(stopped_by, time.perf_counter() - start)

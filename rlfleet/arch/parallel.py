"""What every multi-process runner shares: the global step and episode counters, their checkpointing,
the option checks, and how worker trouble is reported.

A runner keeps its counters in the coordinator process (`counter` is a shared integer so that workers
can read the global step count for their schedules and stop at the budget). Its checkpoint adds one
entry under the architecture's name with the episode count, the recent returns and whatever
`_extra_state()` returns; `_restore_extra(saved)` reads that back.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

import torch

from rlfleet.optim import HOGWILD_OPTIMIZERS
from rlfleet.run.config import ConfigError
from rlfleet.run.train import RunBase


class ParallelRunner(RunBase):
    """Base of the `hogwild`, `data_parallel` and `grad_parallel` runners (not used on its own)."""

    arch = "parallel"
    """Name of the architecture; also the checkpoint entry of its counters."""

    def check_parallel(self, on_policy_only: bool, uses_optimizer: bool) -> None:
        cfg = self.cfg
        if on_policy_only and self.algo.data != "rollout":
            raise ConfigError(
                f"{cfg.algo} learns from replay; the {self.arch} architecture runs on-policy algorithms "
                "(a2c/a3c, pg, ppo, onestep_q, sarsa, nstep_q): use --arch data_parallel or single for it"
            )
        if cfg.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {cfg.workers}")
        if self.obs_stats is not None:
            raise ConfigError(
                f"obs_norm runs on the single architecture only (each {self.arch} worker steps its own envs); "
                "use --arch single or --set obs_norm=false"
            )
        if uses_optimizer and cfg.optimizer not in HOGWILD_OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {cfg.optimizer!r}; choose one of {', '.join(HOGWILD_OPTIMIZERS)}")

    def start_counters(self) -> None:
        """The global step counter (shared with the workers), the episode count and the recent returns."""
        self.counter = torch.multiprocessing.get_context("spawn").Value("q", 0)
        self._episodes = 0
        self.returns: deque[float] = deque(maxlen=100)

    @property
    def env_steps(self) -> int:
        return int(self.counter.value)

    @property
    def episodes(self) -> int:
        return self._episodes

    def count_returns(self, returns: list[float]) -> None:
        self._episodes += len(returns)
        self.returns.extend(returns)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _restore_extra(self, saved: dict[str, Any]) -> None:
        """Read back what `_extra_state` saved (nothing by default)."""

    def _payload(self, with_data: bool) -> dict[str, Any]:
        payload = super()._payload(with_data)
        payload[self.arch] = {"episodes": self._episodes, "returns": list(self.returns), **self._extra_state()}
        return payload

    def _restore(self, payload: dict[str, Any]) -> None:
        self.algo.load_state_dict(payload["algo"])  # copies into the shared tensors, sharing kept
        self.state.update(payload["state"])
        self.counter.value = int(payload["env_steps"])
        saved = payload.get(self.arch) or {}
        self._episodes = int(saved.get("episodes", 0))
        self.returns.extend(saved.get("returns", []))
        self._restore_extra(saved)

    def _report(self, text: str) -> None:
        """Worker trouble: printed, and appended to `<run>/workers.log`."""
        print(text, file=sys.stderr, flush=True)
        with open(self.run_dir / "workers.log", "a") as f:
            f.write(f"[step {self.env_steps}] {text}\n")

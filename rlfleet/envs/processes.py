"""Env processes that are watched: Gymnasium's `AsyncVectorEnv` (one process per sub-env), whose processes may die
(a crash in the emulator, the kernel's OOM killer, a `kill`) or stop answering (a deadlock, a SIGSTOP).

Gymnasium's own vector env meets a dead process as a `BrokenPipeError` or `EOFError` from deep inside its pipes,
and waits for an answer that never comes for ever. `WatchedAsyncVectorEnv` turns both into one `EnvProcessError`
that names the sub-env, its process and what happened to it, after it has ended every process of the vector env
(a hung one with SIGKILL, which also ends a stopped process): the run that steps it stops cleanly on it, as on any
other failure it cannot go on past (checkpoint and `result.json`, `rlfleet.backends.RunFailure`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import signal
from collections.abc import Iterator
from typing import Any

from gymnasium.vector import AsyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState

ENV_TIMEOUT_S = 300.0
"""How long an env process may take to answer one reset, step or call, by default (`--env-timeout-s`)."""


class EnvProcessError(RuntimeError):
    """An env process died, or gave no answer within its vector env's timeout."""


def exit_reason(exitcode: int | None) -> str:
    """How a process ended, in words: "killed by SIGKILL", "exit code 1"."""
    if exitcode is not None and exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


class WatchedAsyncVectorEnv(AsyncVectorEnv):
    """`AsyncVectorEnv` whose every reset, step and call waits at most `timeout_s` (None: for ever) for its env
    processes, and whose dead or silent processes are one `EnvProcessError` (see the module docstring). Once it has
    raised, the vector env is closed."""

    def __init__(self, *args: Any, timeout_s: float | None = ENV_TIMEOUT_S, name: str = "env", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.timeout_s = timeout_s
        self.name = name  # what its errors call a sub-env: "training env 3 (pid 1234) died"

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        with self._watched("reset"):
            self.reset_async(seed=seed, options=options)
            return self.reset_wait(self.timeout_s)

    def step(self, actions: Any) -> Any:
        with self._watched("step"):
            self.step_async(actions)
            return self.step_wait(self.timeout_s)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        with self._watched(name):
            self.call_async(name, *args, **kwargs)
            return self.call_wait(self.timeout_s)

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Gymnasium's close, which asks each process to close over its pipe; where a process has died meanwhile (a
        SIGTERM to the whole process group: a scheduler's preemption), its pipe is gone, and the close ends the rest
        instead of raising BrokenPipeError past the run's own end."""
        try:
            super().close_extras(timeout=timeout, terminate=terminate)
        except (ConnectionError, EOFError):
            self._state = AsyncState.DEFAULT
            super().close_extras(terminate=True)

    @contextlib.contextmanager
    def _watched(self, what: str) -> Iterator[None]:
        try:
            yield
        except multiprocessing.TimeoutError:
            silent = [i for i, pipe in enumerate(self.parent_pipes) if pipe is not None and not pipe.poll()]
            raise self._end(
                silent, f"gave no answer to {what} for {self.timeout_s:g} s (hung), so it was killed"
            ) from None
        except (ConnectionError, EOFError):  # a pipe whose other end is gone: its process died
            raise self._end(None, "died") from None

    def _end(self, silent: list[int] | None, what: str) -> EnvProcessError:
        """Every process of this vector env ended and the env closed; the error naming the sub-envs `silent` (None:
        those whose process died) and `what` happened to them."""
        dead: list[int] = []
        if silent is None:  # the dead: their sentinels are ready (before the process can be reaped, which waits)
            ended = multiprocessing.connection.wait([process.sentinel for process in self.processes], timeout=1.0)
            dead = [i for i, process in enumerate(self.processes) if process.sentinel in ended]
        for i, process in enumerate(self.processes):
            if i not in dead:
                process.kill()  # SIGKILL: a stopped process ignores SIGTERM until it is continued
            process.join()
        named = (dead if silent is None else silent) or list(range(len(self.processes)))
        self._state = AsyncState.DEFAULT  # nothing is pending any more: close() must not wait for an answer
        self.close(terminate=True)
        described = [
            f"{self.name} {i} (pid {self.processes[i].pid}) {what}"
            + (f" ({exit_reason(self.processes[i].exitcode)})" if silent is None else "")
            for i in named
        ]
        return EnvProcessError("; ".join(described))

"""`WatchedAsyncVectorEnv` (rlfleet.envs.processes): a dead or silent env process is one `EnvProcessError` that names
it, every process of the vector env is ended, and the env is closed."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from rlfleet.envs import EnvProcessError, make_vector_env
from rlfleet.envs.processes import WatchedAsyncVectorEnv, exit_reason


@pytest.mark.parametrize(
    ("how", "said"),
    [
        (signal.SIGKILL, r"^training env 1 \(pid {pid}\) died \(killed by SIGKILL\)$"),
        (signal.SIGSTOP, r"^training env 1 \(pid {pid}\) gave no answer to step for 1 s \(hung\), so it was killed$"),
    ],
)
def test_a_dead_or_silent_env_process_is_one_error_naming_it(how, said):
    envs = make_vector_env("CartPole-v1", 3, seed=0, mode="async", timeout_s=1.0)
    watched = envs.unwrapped
    assert isinstance(watched, WatchedAsyncVectorEnv)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(3, dtype=np.int64))
        victim = watched.processes[1].pid
        os.kill(victim, how)
        started = time.monotonic()
        with pytest.raises(EnvProcessError, match=said.format(pid=victim)):
            for _ in range(100):  # a kill lands between steps: the next step meets it
                envs.step(np.zeros(3, dtype=np.int64))
        assert time.monotonic() - started < 30
        assert watched.closed and not any(p.is_alive() for p in watched.processes)
    finally:
        envs.close()  # closed already: nothing to do, nothing raised
        for process in watched.processes:
            if process.is_alive():
                process.kill()


def test_closing_envs_whose_processes_died_between_steps_ends_them_without_an_error():
    """A SIGTERM to the whole process group (a scheduler's preemption) kills the env processes while the trainer
    stops politely: its close met their dead pipes and raised BrokenPipeError past the run's end (no result.json)."""
    envs = make_vector_env("CartPole-v1", 3, seed=0, mode="async", timeout_s=5.0)
    watched = envs.unwrapped
    envs.reset(seed=0)
    for process in watched.processes:
        os.kill(process.pid, signal.SIGTERM)
    for process in watched.processes:
        process.join(timeout=30)
    envs.close()
    assert watched.closed and not any(p.is_alive() for p in watched.processes)


def test_a_reset_that_does_not_come_back_is_named_too():
    envs = make_vector_env("CartPole-v1", 2, seed=0, mode="async", training=False, timeout_s=1.0)
    watched = envs.unwrapped
    victim = watched.processes[0].pid
    os.kill(victim, signal.SIGSTOP)
    with pytest.raises(EnvProcessError, match=rf"^evaluation env 0 \(pid {victim}\) gave no answer to reset for 1 s"):
        envs.reset(seed=0)
    assert not any(p.is_alive() for p in watched.processes)


def test_exit_reason():
    assert exit_reason(-9) == "killed by SIGKILL" and exit_reason(1) == "exit code 1"


def test_a_command_whose_env_process_died_says_so_in_one_line(monkeypatch, capsys):
    """`rlfleet eval` or `collect` outside a run: no checkpoint to speak of, the same one line, exit 1."""
    from rlfleet import cli

    def dies(args):
        raise EnvProcessError("evaluation env 3 (pid 4242) died (killed by SIGKILL)")

    monkeypatch.setattr(cli, "_eval", dies)
    assert cli.main(["eval", "runs/r"]) == 1
    err = capsys.readouterr().err
    assert err == "rlfleet: error: evaluation env 3 (pid 4242) died (killed by SIGKILL)\n"

"""`rlfleet.cli.main` around its commands: a SIGTERM outside a run's loop (which stops politely on its own) is a
Ctrl-C, one line and not silence; an allocation that fails is one line, not a traceback."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rlfleet import cli


def test_a_sigterm_outside_a_run_is_a_ctrl_c_and_the_handler_before_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), cli._sigterm_as_ctrl_c():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at once
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_command_says_it_was_interrupted(monkeypatch, capsys):
    def terminated(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(cli, "_list", terminated)
    assert cli.main(["list"]) == cli.INTERRUPTED
    assert capsys.readouterr().err == "rlfleet: interrupted\n"


@pytest.mark.parametrize(
    "raised",
    [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")],
)
def test_an_allocation_that_fails_is_one_line(monkeypatch, capsys, raised):
    def allocate(args):
        raise raised

    monkeypatch.setattr(cli, "_list", allocate)
    assert cli.main(["list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlfleet: error: out of memory") and len(err.splitlines()) == 1, err


def test_another_runtime_error_is_not_taken_for_one(monkeypatch):
    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "_list", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["list"])


@pytest.mark.parametrize(("text", "value"), [("-1e3", -1000.0), ("-2.5E+2", -250.0), ("-150", -150.0), ("-.5", -0.5)])
def test_a_negative_number_in_any_notation_is_a_value_not_an_option(text, value):
    """`--stop-return -1e3` was "expected one argument": before Python 3.13, argparse's negative numbers have no
    exponent."""
    args = cli.build_parser().parse_args(["train", "ppo", "--env", "CartPole-v1", "--stop-return", text])
    assert args.stop_return == value


def test_an_unknown_option_is_still_one(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["train", "ppo", "--env", "CartPole-v1", "--stop-return", "-x"])
    assert exited.value.code == 2 and "expected one argument" in capsys.readouterr().err

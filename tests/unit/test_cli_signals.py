"""A SIGTERM to `rlfleet` outside a run's loop (which stops politely on its own) is a Ctrl-C: what the command
started goes with it, and it ends with one line, not in silence."""

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

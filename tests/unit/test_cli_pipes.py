"""`rlfleet list | head`: a reader that closes standard output early ends the command quietly (exit 0); a broken pipe
anywhere else (an env process that died, say) is not mistaken for it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlfleet import cli


class PipeOut:
    """A standard output that is the write end of a pipe."""

    def __init__(self, fd: int):
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def write(self, text: str) -> int:
        return os.write(self.fd, text.encode())

    def flush(self) -> None:
        pass


class Pipe:
    """A pipe whose write end `into()` makes standard output (in the test's body: pytest's own capture of standard
    output replaces a `sys.stdout` that a fixture sets) and whose reader can leave (`close_reader()`)."""

    def __init__(self, monkeypatch):
        self.read, self.write = os.pipe()
        self.monkeypatch = monkeypatch

    def into(self) -> None:
        self.monkeypatch.setattr(sys, "stdout", PipeOut(self.write))

    def close_reader(self) -> None:
        os.close(self.read)
        self.read = None

    def close(self) -> None:
        for fd in (self.read, self.write):
            if fd is not None:
                os.close(fd)


@pytest.fixture
def pipe(monkeypatch):
    made = Pipe(monkeypatch)
    yield made
    made.close()


def test_the_reader_is_gone_only_once_it_closed_the_pipe(pipe):
    pipe.into()
    assert not cli._reader_gone()
    pipe.close_reader()
    with pytest.raises(BrokenPipeError):  # what the command meets first
        sys.stdout.write("line\n")
    assert cli._reader_gone()


def test_a_broken_pipe_of_the_command_itself_is_raised(pipe, monkeypatch):
    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")  # as a dead env process's pipe raises it

    pipe.into()
    monkeypatch.setattr(cli, "_list", broken)
    with pytest.raises(BrokenPipeError):
        cli.main(["list"])


def test_a_reader_that_left_ends_the_command_quietly(pipe, monkeypatch):
    pipe.into()
    pipe.close_reader()

    def printing(args):
        sys.stdout.write("line\n" * 10)  # EPIPE: the reader is gone
        return 0

    monkeypatch.setattr(cli, "_list", printing)
    monkeypatch.setattr(sys, "stderr", open(os.devnull, "w"))  # noqa: SIM115 (main closes it)
    assert cli.main(["list"]) == 0


def test_rlfleet_list_into_head_exits_cleanly():
    shell = f"{sys.executable} -m rlfleet.cli list | head -1"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("algorithms")

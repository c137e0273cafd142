"""Shared test settings: one torch thread (as in every rlfleet worker), quiet runs in a temp folder, and Ctrl-C's
handling as each test found it."""

import signal
import threading
import warnings

import pytest
import torch

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # pytest started in the background by a non-interactive shell (`pytest ... &`), which starts it with SIGINT
    # ignored; every process it starts would inherit that, and the Ctrl-C tests need Ctrl-C as a terminal sends it
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _sigint_as_found(request):
    """A test that leaves SIGINT handled otherwise, or blocked, in the test process would change what later tests
    see (and what every process they start inherits): put it back, and say which test it was."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    yield
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    if signal.getsignal(signal.SIGINT) is not handler or blocked:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        warnings.warn(
            f"{request.node.nodeid} left SIGINT {'blocked' if blocked else 'handled otherwise'}", stacklevel=1
        )


@pytest.fixture
def run_opts(tmp_path):
    """Options for `rlfleet.train` that keep test runs quiet and inside the test's temp folder."""
    return {"logdir": str(tmp_path), "progress": False}

"""What every child process of the local backend does first, workers and services alike: leave Ctrl-C to the
coordinator, take one torch thread, and exit at once when the coordinator dies without stopping it."""

from __future__ import annotations

import os
import signal
import threading
from multiprocessing.connection import wait

import torch
import torch.multiprocessing as mp


def exit_with_parent() -> None:
    """Leave at once if the coordinator dies without stopping us (SIGKILL, out of memory): no orphans."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="rlfleet-parent-watch", daemon=True).start()


def child_setup() -> None:
    """SIGINT ignored (the coordinator stops its children), one torch thread, and `exit_with_parent`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    exit_with_parent()

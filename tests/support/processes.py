"""Child processes that end with the test run that started them.

A broker or RabbitMQ node a test starts must not outlive pytest: a worker killed by a
timeout, or a run interrupted with kill -9, runs no `finally`, so the child is told by
the kernel instead (Linux's PR_SET_PDEATHSIG: SIGTERM when the parent dies).

The kernel sends it when the *thread* that started the child ends, not the process:
a child started from a short-lived thread would be stopped with that thread. So
`die_with_parent()` arms the signal only when called on the main thread, and returns
None elsewhere (and off Linux): such children rely on the test's own cleanup.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from typing import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(then: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """A `preexec_fn` that arms SIGTERM-on-parent-death, then runs `then` (None if the
    guard cannot apply and there is nothing else to run)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return then
    parent = os.getpid()

    def preexec() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
        if then is not None:
            then()

    return preexec

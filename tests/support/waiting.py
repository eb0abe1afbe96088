"""Waiting in tests for a condition, never for a time.

`wait_until(condition, what, timeout, interval)` polls `condition()` every `interval`
seconds and returns its first true value. Once `timeout` seconds have passed it
raises AssertionError naming `what`, the last value (or error) seen and, when `log`
is given, `log()`'s text (a broker's log tail). With `retry_errors=True` an exception
from the condition counts as "not yet" (a node may be starting or stopping);
otherwise it propagates at once.

The bound is the caller's and generous: the suite must pass on a loaded machine, so
a test waits for what it needs and never asserts on how long that took.

`SlowStop` is the warning the broker and cluster fixtures give when a node did not end
within their bound after SIGTERM and was killed: a graceful stop that hangs is a bug
of its own, and the bound it waits out is suite time (the warnings summary lists them).

Not here: waits with more to say than "not yet" (a cluster's convergence keeps its
own CONVERGE_TIMEOUT in cluster.py; Prometheus scrapes in prometheus.py).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class SlowStop(UserWarning):
    """A node did not end within the bound after SIGTERM; it was SIGKILLed."""


def slow_stop(name: str, timeout: float) -> None:
    warnings.warn(SlowStop(f"{name} did not end within {timeout:.0f} s of SIGTERM "
                           "(a graceful stop that hangs): SIGKILLed"), stacklevel=3)


def wait_until(condition: Callable[[], T], what: str, timeout: float,
               interval: float = 0.05, *, retry_errors: bool = False,
               log: Callable[[], str] | None = None) -> T:
    """condition()'s first true value, polled every `interval` s until `timeout` s."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = condition()
        except Exception as error:  # noqa: BLE001 - "not yet", when asked for
            if not retry_errors:
                raise
            last = error
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            tail = f"\n{log()}" if log is not None else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; "
                                 f"last: {last!r}{tail}")
        time.sleep(interval)

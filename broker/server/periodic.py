"""Periodic work that outlives a failing round.

The server's ticker runs the same steps twice a second. They are heartbeats, queue
expiry, metadata timeouts, policies, shovels and the resource alarms. `Steps.run`
runs one step on its own. A step that raises is logged and skipped for that round.
The other steps, and the next rounds, run as usual. So one bug never stops the
heartbeats and the alarms for good. Nor does one exhausted resource (EMFILE while
reading /proc). Before, an exception ended the ticker's task without a word.

Logging, so that a step failing every round does not flood the log:
- its first failure logs the traceback;
- while it keeps failing, one line every REPEAT_LOG_SECONDS says how often, and
  the latest error;
- its first success after failures says so.

Not here: what the steps do (server.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

REPEAT_LOG_SECONDS = 60.0


@dataclass(slots=True)
class _Failing:
    since: float         # monotonic time of the first failure of this run of failures
    logged_at: float     # when the last line about it was logged
    count: int = 1       # failures since `since`
    unlogged: int = 0    # failures since `logged_at`


class Steps:
    """The steps of one periodic task (`name`, for the log), each run on its own."""

    def __init__(self, name: str, log: logging.Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._log = log
        self._clock = clock
        self._failing: dict[str, _Failing] = {}

    def run(self, step: str, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)`'s result, or None when it raised (logged)."""
        try:
            result = function(*args)
        except Exception as error:  # noqa: BLE001 - the point: any failure of one step
            self._failed(step, error)
            return None
        if step in self._failing:
            failing = self._failing.pop(step)
            self._log.warning("%s: %s works again after %d failed rounds in %.0f s",
                              self.name, step, failing.count, self._clock() - failing.since)
        return result

    def _failed(self, step: str, error: Exception) -> None:
        now = self._clock()
        failing = self._failing.get(step)
        if failing is None:
            self._failing[step] = _Failing(now, now)
            self._log.error("%s: %s failed; skipped this round, the other steps and the "
                            "next rounds go on", self.name, step, exc_info=error)
            return
        failing.count += 1
        failing.unlogged += 1
        if now - failing.logged_at >= REPEAT_LOG_SECONDS:
            self._log.error("%s: %s failed %d more times in %.0f s, still failing: %s: %s",
                            self.name, step, failing.unlogged, now - failing.logged_at,
                            type(error).__name__, error)
            failing.logged_at = now
            failing.unlogged = 0

    @property
    def failing(self) -> list[str]:
        """The steps whose last run failed."""
        return sorted(self._failing)

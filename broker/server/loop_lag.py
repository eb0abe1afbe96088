"""The sampler behind the event-loop lag histogram (broker/metrics/loop_lag.py).

How it works: a timer due every SAMPLE_INTERVAL_S notes how late it ran (the time
from when it was due to when its callback began) into a `LoopLag`, then sets itself
again. A callback that holds the loop for L seconds shows as one sample between
L - SAMPLE_INTERVAL_S and L; anything that delays the Raft ticks, heartbeats and
fsync results by more than the interval shows. About 100 wake-ups a second: a
few microseconds each.

Not here: the buckets and the exported families (metrics/loop_lag.py).
"""

from __future__ import annotations

import asyncio
import time

from ..metrics.loop_lag import LoopLag

SAMPLE_INTERVAL_S = 0.01


class LagSampler:
    def __init__(self, lag: LoopLag, interval: float = SAMPLE_INTERVAL_S) -> None:
        self.lag = lag
        self.interval = interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due = time.monotonic() + self.interval
        self._handle = loop.call_later(self.interval, self._sample)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _sample(self) -> None:
        now = time.monotonic()
        self.lag.observe(now - self._due)
        self._due = now + self.interval
        self._handle = self._loop.call_later(self.interval, self._sample)

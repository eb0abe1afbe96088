"""The event loop's lag: how late its timers run, as a Prometheus histogram.

Responsibilities: count lag samples into fixed buckets (`LoopLag.observe`) and
export them as `quorumqueue_event_loop_lag_seconds` (a histogram) and
`quorumqueue_event_loop_lag_max_seconds` (the largest sample since the node
started). The server's sampler (broker/server/loop_lag.py) feeds it.

Why its own prefix: a node's clients, Raft heartbeats, elections and fsync results
all wait on one asyncio event loop, so a callback that runs long delays every one of
them. RabbitMQ runs on Erlang's schedulers and rabbitmq_prometheus has no such
metric; this family is quorumqueue's own, named in rabbitmq_prometheus's style
(base unit in the name, `_bucket`/`_sum`/`_count` samples) under `quorumqueue_`, so
that nothing on a RabbitMQ dashboard is mistaken for it.

How it works: plain int counts per bucket, the sum and the largest sample; no lock
(the loop's thread alone writes it, and a scrape reads it on that thread).

Not here: the timer that takes the samples (server/loop_lag.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric

# upper bounds (le) in seconds; 0.1 s is one: the bound on the worst lag
LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

LAG_FAMILY = "quorumqueue_event_loop_lag_seconds"
LAG_MAX_FAMILY = "quorumqueue_event_loop_lag_max_seconds"


class LoopLag:
    """Lag samples of one event loop, in LAG_BUCKETS."""

    __slots__ = ("counts", "total", "count", "max")

    def __init__(self) -> None:
        self.counts = [0] * (len(LAG_BUCKETS) + 1)   # the last: above every bound
        self.total = 0.0
        self.count = 0
        self.max = 0.0

    def observe(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.counts[bisect_left(LAG_BUCKETS, seconds)] += 1
        self.total += seconds
        self.count += 1
        if seconds > self.max:
            self.max = seconds

    def families(self) -> Iterator[Metric]:
        buckets, running = [], 0
        for bound, count in zip((*map(str, LAG_BUCKETS), "+Inf"), self.counts):
            running += count
            buckets.append((bound, running))
        yield HistogramMetricFamily(
            LAG_FAMILY, "How late the event loop ran a timer due: the time every client, "
            "Raft message and fsync result waited for one callback to finish",
            buckets=buckets, sum_value=self.total)
        yield GaugeMetricFamily(LAG_MAX_FAMILY, "The largest event-loop lag since the node "
                                "started", value=self.max)

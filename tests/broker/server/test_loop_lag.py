"""The node's event-loop lag, as its Prometheus endpoint exports it (issue 31,
"nothing stops the loop"): `quorumqueue_event_loop_lag_seconds`, a histogram of how
late the loop ran a timer due, and `quorumqueue_event_loop_lag_max_seconds`
(broker/metrics/loop_lag.py, sampled by broker/server/loop_lag.py). A callback that
holds the loop shows up in both; an idle node's samples stay small."""

from __future__ import annotations

import asyncio
import time

import pytest

from quorumqueue.broker.config import Settings
from quorumqueue.broker.metrics.loop_lag import LAG_BUCKETS, LoopLag
from quorumqueue.broker.server.loop_lag import LagSampler
from tests.support.prometheus import scrape, value

from .inprocess import call, running_server, wait_until

pytestmark = pytest.mark.timeout(120)

HELD_S = 0.3


def test_a_sample_falls_in_the_first_bucket_at_or_above_it():
    lag = LoopLag()
    for seconds in (0.0005, 0.001, 0.0011, 0.1, 0.25, 30.0, -0.001):
        lag.observe(seconds)
    counts = dict(zip((*LAG_BUCKETS, float("inf")), lag.counts))
    assert counts[0.001] == 3      # -0.001 counts as 0; 0.001 is le="0.001"
    assert counts[0.002] == 1
    assert counts[0.1] == 1
    assert counts[0.5] == 1
    assert counts[float("inf")] == 1
    assert lag.max == 30.0 and lag.count == 7


def test_a_callback_holding_the_loop_is_one_sample_as_long_as_it():
    async def run() -> LoopLag:
        lag = LoopLag()
        sampler = LagSampler(lag)
        sampler.start(asyncio.get_running_loop())
        await asyncio.sleep(0.1)
        time.sleep(HELD_S)                      # the loop held
        await asyncio.sleep(0.1)
        sampler.stop()
        return lag

    lag = asyncio.run(run())
    assert HELD_S - 0.02 <= lag.max < HELD_S + 0.5
    held = sum(count for bound, count in zip((*LAG_BUCKETS, float("inf")), lag.counts)
               if bound >= 0.5)
    assert held == 1   # le="0.5": the one late timer; the others ran on time
    assert lag.count >= 5


@pytest.fixture
def server(tmp_path):
    yield from running_server(Settings(host="127.0.0.1", port=0,
                                       data_dir=str(tmp_path / "node"), prometheus_port=0))


def _port(server) -> int:
    return server.metrics.port


def test_the_endpoint_exports_the_lag_of_the_nodes_own_loop(server):
    port = _port(server)
    wait_until(lambda: value(scrape(port), "quorumqueue_event_loop_lag_seconds_count") > 10,
               "lag samples")
    before = scrape(port)
    assert before["quorumqueue_event_loop_lag_seconds_bucket"][0][2] == "histogram"
    call(server, time.sleep, HELD_S)            # a callback on the node's loop
    after = scrape(port)
    assert value(after, "quorumqueue_event_loop_lag_max_seconds") >= HELD_S - 0.02
    inf = value(after, "quorumqueue_event_loop_lag_seconds_bucket", le="+Inf")
    assert inf == value(after, "quorumqueue_event_loop_lag_seconds_count")
    late = inf - value(after, "quorumqueue_event_loop_lag_seconds_bucket", le="0.2")
    late_before = (value(before, "quorumqueue_event_loop_lag_seconds_bucket", le="+Inf")
                   - value(before, "quorumqueue_event_loop_lag_seconds_bucket", le="0.2"))
    assert late >= late_before + 1   # (a busy machine may add its own)
    per_object = scrape(port, "/metrics/per-object")
    assert value(per_object, "quorumqueue_event_loop_lag_max_seconds") >= HELD_S - 0.02

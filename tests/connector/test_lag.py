"""How far behind a running query is (connector/lag.py), as a Spark user reads it.

connector/README.md, "Lag": after each trigger Spark asks the source for its latest
offset (`reportLatestOffset`, PySpark >= 4.2) and shows it in the query's progress
next to the batch's end offset; the source puts each queue's tail there, in the
offset's form, and the query's lag under `metrics` (Kafka's avgOffsetsBehindLatest
and friends, counted in messages). `QueueLagListener` logs the same for every
progress. Real local-Spark queries against the bundled broker, in both modes.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from pyspark.sql.streaming import StreamingQueryListener

from quorumqueue.connector.lag import (QueueFigures, QueueLagListener, lag_metrics,
                                       latest_report)

from .queues import quorum_queue

pytestmark = pytest.mark.timeout(240)

WAIT = 120.0  # seconds: generous, the machine is shared


def wait_for(condition, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def start_query(spark, uri: str, queue: str, name: str, checkpoint: str, **options):
    reader = spark.readStream.format("quorumqueue").option("uri", uri).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().writeStream.format("memory").queryName(name)
            .option("checkpointLocation", checkpoint).start())


def data_batches(query) -> list[dict]:
    """The progress of each batch that read something, in order (one per batch id)."""
    by_batch = {p["batchId"]: p for p in query.recentProgress if p["numInputRows"]}
    return [by_batch[batch] for batch in sorted(by_batch)]


def rows_read(query) -> int:
    """Rows the query has read so far, from its progress reports.

    Waiting on this runs no Spark job: polling `spark.table(name).count()` ran one
    per poll, and under local[2] those jobs took the two task slots the query's own
    batches needed, so on a busy machine the query fell minutes behind.
    """
    return sum(p["numInputRows"] for p in data_batches(query))


# ------------------------------------------------------------------ the report (pure)


def test_the_report_is_the_tail_in_the_offsets_form_with_the_lag_summed_up():
    figures = {"orders": QueueFigures(tail=50, ready=30, held=20, unacked=25),
               "audit": QueueFigures(tail=7, ready=0, held=7, unacked=7)}
    report = latest_report({"lease": "spark-1"}, "queues", figures,
                           {"orders": 20, "audit": 7})
    assert report == {"lease": "spark-1", "queues": {"audit": 7, "orders": 50},
                      "metrics": {"minMessagesBehindLatest": 0,
                                  "avgMessagesBehindLatest": 15.0,
                                  "maxMessagesBehindLatest": 30, "readyMessages": 30,
                                  "heldMessages": 27, "unackedMessages": 32}}
    # what lag_metrics reads back from a progress, where Spark keeps it as JSON text
    assert lag_metrics({"latestOffset": json.dumps(report)}) == report["metrics"]


def test_an_unknown_figure_is_left_out_and_a_tail_behind_the_batch_is_zero_behind():
    figures = {"q": QueueFigures(tail=5, ready=0, held=2, unacked=None)}
    metrics = latest_report({}, "delivered", figures, {"q": 9})["metrics"]
    assert metrics == {"minMessagesBehindLatest": 0, "avgMessagesBehindLatest": 0.0,
                       "maxMessagesBehindLatest": 0, "readyMessages": 0, "heldMessages": 2}


@pytest.mark.parametrize("latest", [None, "None", "null", "{}", '{"0": 12}',
                                    '{"queues": {"q": 1}}', "not json"])
def test_a_progress_without_quorumqueue_metrics_has_none(latest):
    # "None": what PySpark shows when a source reported no latest offset
    assert lag_metrics({"latestOffset": latest}) is None


# ------------------------------------------------------------------ real queries


@pytest.mark.parametrize("mode", ["lease", "consume"])
def test_a_running_query_shows_the_tail_and_how_far_behind_it_is(spark, broker, tmp_path,
                                                                 mode):
    queue = quorum_queue(broker.uri, 50)
    name = f"lag_{mode}"
    query = start_query(spark, broker.uri, queue, name, str(tmp_path / "checkpoint"),
                        maxMessagesPerTrigger="10", mode=mode)
    try:
        wait_for(lambda: rows_read(query) >= 50, "the query to read 50 messages")
        assert spark.table(name).count() == 50
        wait_for(lambda: len(data_batches(query)) == 5, "five progress reports")
        batches = data_batches(query)
        latest = [json.loads(p["sources"][0]["latestOffset"]) for p in batches]
        behind = [lag_metrics(p["sources"][0])["maxMessagesBehindLatest"] for p in batches]
        if mode == "lease":
            # the tail, in the offset's form: the lease's end plus what is ready
            assert [offset["queues"] for offset in latest] == [{queue: 50}] * 5
            assert {offset["lease"] for offset in latest} == {
                json.loads(batches[0]["sources"][0]["endOffset"])["lease"]}
            assert behind == [40, 30, 20, 10, 0]
        else:
            # deliveries still on their way to the driver count as neither received
            # nor ready: until they arrive, the tail (and so behind) is a lower bound
            assert latest[-1]["delivered"] == {queue: 50}
            assert behind[0] > 0 and behind[-1] == 0
        last = lag_metrics(batches[-1]["sources"][0])
        assert last["minMessagesBehindLatest"] == last["avgMessagesBehindLatest"] == 0
        assert last["readyMessages"] == 0
        if mode == "lease":
            # the lease holds the last batch until the next one commits it; as
            # administrator (guest) the broker's unacked count is there too
            assert last["heldMessages"] > 0 and last["unackedMessages"] >= last["heldMessages"]
        else:
            assert last["heldMessages"] > 0 and "unackedMessages" not in last
    finally:
        query.stop()


def test_the_listener_logs_the_lag_of_every_progress(spark, broker, tmp_path, caplog):
    queue = quorum_queue(broker.uri, 30)
    listener = QueueLagListener()
    assert isinstance(listener, StreamingQueryListener)
    spark.streams.addListener(listener)
    caplog.set_level(logging.INFO, logger="quorumqueue.connector.lag")
    query = start_query(spark, broker.uri, queue, "lag_listener", str(tmp_path / "checkpoint"),
                        maxMessagesPerTrigger="10")
    try:
        wait_for(lambda: rows_read(query) >= 30, "30 messages read")
        assert spark.table("lag_listener").count() == 30
        key = str(query.id)
        wait_for(lambda: listener.latest.get(key, {}).get("batchId", -1) >= 2,
                 "the listener to see batch 2")
        assert listener.latest[key]["sources"][0]["maxMessagesBehindLatest"] == 0
        logged = [r.getMessage() for r in caplog.records if r.name == "quorumqueue.connector.lag"]
        assert any(f"{query.id}), batch 0, source 0: minMessagesBehindLatest=20" in line
                   for line in logged), logged
    finally:
        query.stop()
        spark.streams.removeListener(listener)

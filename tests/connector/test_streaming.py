"""Real streaming queries from a quorum queue on the bundled broker (local Spark).

connector/lease_reader.py's header: Spark logs batch N's end offset, then commits the
source up to N-1's end, runs N, commits the sink, then writes commit log N; a query
restarted from its checkpoint re-plans a logged but uncommitted batch with the same
(start, end] and must read the same rows. These tests run whole queries with
Trigger.AvailableNow and check that every message arrives exactly once, with the
right columns.
"""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest
from chispa import assert_df_equality

from quorumqueue.client.http_management import HttpManagement
from quorumqueue.client.lease_client import LeaseClient
from quorumqueue.connector.schema import SCHEMA

from tests.support.cluster import wait_for

from .queues import order_body, order_properties, publish_orders, quorum_queue

pytestmark = pytest.mark.timeout(180)


def source(spark, uri: str, queue: str, **options):
    reader = spark.readStream.format("quorumqueue").option("uri", uri).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(stream, checkpoint: str, sink: str = "memory", **options):
    writer = (stream.writeStream.format(sink).option("checkpointLocation", checkpoint)
              .trigger(availableNow=True))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


def expected_rows(queue: str, numbers) -> list[tuple]:
    rows = []
    for offset, number in enumerate(numbers, start=1):
        p = order_properties(number)
        rows.append((order_body(number), queue, queue, "", offset, 0, False, p.content_type,
                     None, {k: str(v) for k, v in p.headers.items()}, p.delivery_mode,
                     p.priority, p.correlation_id, None, None, p.message_id,
                     # PySpark shows timestamps as naive datetimes in local time
                     dt.datetime.fromtimestamp(p.timestamp), p.type, None, p.app_id))
    return rows


def test_available_now_delivers_every_message_once_with_its_columns(spark, broker, tmp_path):
    queue = quorum_queue(broker.uri, 25)
    stream = source(spark, broker.uri, queue, maxMessagesPerTrigger="10")
    assert stream.isStreaming and stream.schema == SCHEMA
    query = run_available_now(stream, str(tmp_path / "checkpoint"), queryName="available_now")
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [10, 10, 5]
    actual = spark.table("available_now").orderBy("offset")
    expected = spark.createDataFrame(expected_rows(queue, range(25)), SCHEMA)
    assert_df_equality(actual, expected, ignore_nullable=True)


def broker_connections(broker) -> list[str]:
    """The client product of every connection the broker holds (/api/connections)."""
    return [(row.get("client_properties") or {}).get("product", "")
            for row in HttpManagement(broker.management_url).get("connections")]


def test_a_finished_query_leaves_at_most_one_connection_per_python_worker(
        spark, fresh_broker, tmp_path):
    queue = quorum_queue(fresh_broker.uri, 30)
    stream = source(spark, fresh_broker.uri, queue, maxMessagesPerTrigger="10")
    run_available_now(stream, str(tmp_path / "checkpoint"), sink="noop")
    # the driver's connection closes as the query stops (its runner's stop() may end
    # just after awaitTermination returns); each Python worker (local[2]: at most 2)
    # keeps its range-read connection for a next task, and no more. Spark ends a worker
    # idle for a minute, and its connection with it (70 s measured; not waited for here)
    def only_range_readers() -> tuple[list[str]] | None:
        products = broker_connections(fresh_broker)
        return (products,) if set(products) <= {"quorumqueue range reader"} else None

    (left,) = wait_for("only range readers left", only_range_readers, timeout=60,
                       interval=0.5)
    assert len(left) <= 2, left


@pytest.mark.parametrize("crash", [False, True],
                         ids=["stopped-after-batch-1", "crashed-before-batch-1-was-committed"])
def test_a_restarted_query_continues_from_its_checkpoint_exactly_once(spark, broker, tmp_path,
                                                                       crash):
    queue = quorum_queue(broker.uri, 20)
    checkpoint, output = str(tmp_path / "checkpoint"), str(tmp_path / "table")
    stream = source(spark, broker.uri, queue, maxMessagesPerTrigger="10")
    first = run_available_now(stream, checkpoint, "parquet", path=output)
    assert [p["batchId"] for p in first.recentProgress if p["numInputRows"]] == [0, 1]
    lease = json.loads(first.lastProgress["sources"][0]["endOffset"])["lease"]
    if crash:
        # The driver died after batch 1's offset log, before its sink commit: neither
        # the sink nor the commit log knows batch 1 (its data files are orphans).
        for log in (os.path.join(checkpoint, "commits"), os.path.join(output, "_spark_metadata")):
            for name in ("1", ".1.crc"):
                if os.path.exists(os.path.join(log, name)):
                    os.remove(os.path.join(log, name))
    publish_orders(broker.uri, queue, range(20, 35), declare=False)

    second = run_available_now(stream, checkpoint, "parquet", path=output)
    batches = [(p["batchId"], p["numInputRows"]) for p in second.recentProgress
               if p["numInputRows"]]
    assert batches == ([(1, 10)] if crash else []) + [(2, 10), (3, 5)]
    table = spark.read.parquet(output)
    ids = [row.message_id for row in table.select("message_id").collect()]
    assert sorted(ids) == sorted(f"order-{n}" for n in range(35))  # once each
    assert sorted(row.offset for row in table.select("offset").collect()) == list(range(1, 36))
    with LeaseClient(broker.uri) as client:
        # batch 3 is not committed to the source until a next batch is planned; the
        # run came back well inside the broker's lease_timeout (30 minutes)
        assert client.info(queue, lease) == {"first": 31, "end": 35, "timeout_ms": 1_800_000,
                                             "fence": None, "ready": 0, "unacked": 5}


def test_an_invalid_option_fails_at_load_naming_it(spark, broker):
    # PySpark lower-cases option names before the source sees them
    with pytest.raises(Exception, match="unknown option 'maxmessagespertriger' for the "
                                        "quorumqueue source"):
        source(spark, broker.uri, "orders", maxMessagesPerTriger="10")
    with pytest.raises(Exception, match="option 'maxMessagesPerTrigger' must be a positive"):
        source(spark, broker.uri, "orders", maxMessagesPerTrigger="0")


def test_with_its_own_schema_the_query_fails_when_it_starts(spark, broker, tmp_path):
    stream = (spark.readStream.format("quorumqueue").schema(SCHEMA).option("uri", broker.uri)
              .option("queue", "orders").option("leaseTimeout", "soon").load())
    with pytest.raises(Exception, match="option 'leaseTimeout' must be a duration"):
        run_available_now(stream, str(tmp_path / "checkpoint"), queryName="invalid")


def test_a_missing_queue_fails_the_query_naming_the_queue_option_on_the_first_line(
        spark, broker, tmp_path):
    from pyspark.errors import StreamingQueryException

    query = (source(spark, broker.uri, "no-such-orders").writeStream.format("memory")
             .queryName("missing_queue").option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
    with pytest.raises(StreamingQueryException) as failure:
        query.awaitTermination(120)
    first_line = str(failure.value).splitlines()[0]
    assert "option 'queue': no queue 'no-such-orders' in vhost '/' at amqp://guest:***@" \
        in first_line, first_line
    assert "declare it first" in first_line

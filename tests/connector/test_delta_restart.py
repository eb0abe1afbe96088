"""Exactly-once into Delta when the driver dies at each step of Spark's commit protocol.

connector/lease_reader.py's header: for batch N Spark writes offset log N, settles the
source up to N-1, runs the batch (here: a Delta commit with txnAppId/txnVersion),
then writes commit log N. A driver (its JVM and Python workers) is SIGKILLed for
real at one of three points of batch 1 (`quorumqueue.jobs.driver`):

    before-batch        offset log 1 written, batch 1 not run
    after-sink-commit   Delta commit of batch 1 done, commit log 1 not written
    after-commit-log    commit log 1 written, the lease not settled up to batch 1

Each test first checks the checkpoint, the table and the lease really are in that
state, then publishes more orders, restarts the query from the same checkpoint
(AvailableNow) and checks with chispa that the Delta table holds every published
order exactly once, with its columns, and that after settling the last committed
batch the queue is empty (nothing ready, nothing unacked).
"""

from __future__ import annotations

import json

import pytest
from chispa import assert_df_equality

from quorumqueue.client.lease_client import LeaseClient
from quorumqueue.client.management import call
from quorumqueue.jobs import checkpoint as ckpt
from quorumqueue.jobs.driver import QueryPaths, StopPoint, run_killed_driver, start_query
from quorumqueue.jobs.orders import order_message, publish_orders

from .queues import unique

pytestmark = pytest.mark.timeout(600)

PER_BATCH = 5
COLUMNS = ["message_id", "order_id", "customer", "sku", "quantity", "express", "tenant",
           "region", "priority", "app_id", "lease_seq"]


def expected_rows(spark, numbers):
    rows = []
    for number in numbers:
        body, properties, _ = order_message(number)
        order = json.loads(body)
        rows.append((properties.message_id, order["order_id"], order["customer"], order["sku"],
                     order["quantity"], order["express"], properties.headers["tenant"],
                     properties.headers["region"], properties.priority, properties.app_id,
                     number + 1))
    schema = ("message_id string, order_id long, customer string, sku string, quantity int, "
              "express boolean, tenant string, region string, priority int, app_id string, "
              "lease_seq long")
    return spark.createDataFrame(rows, schema)


def table_rows(spark, paths: QueryPaths):
    return spark.read.format("delta").load(str(paths.table)).select(*COLUMNS)


def queue_counts(uri: str, queue: str) -> tuple[int, int]:
    (row,) = [row for row in call(uri, "queues.list", vhost="/") if row["name"] == queue]
    return row["ready"], row["unacked"]


# (stop point, batches in the commit log, orders in the table) when the driver died
STATES = {
    "before-batch": ([0], 5),
    "after-sink-commit": ([0], 10),
    "after-commit-log": ([0, 1], 10),
}


@pytest.mark.parametrize("step", list(STATES))
def test_a_driver_killed_during_batch_1_restarts_into_delta_exactly_once(
        delta_spark, broker, tmp_path, step):
    spark, queue = delta_spark, unique("orders")
    paths = QueryPaths(tmp_path / "table", tmp_path / "checkpoint")
    publish_orders(broker.uri, queue, range(2 * PER_BATCH))  # batches 0 and 1, no more

    run_killed_driver(broker.uri, queue, paths, PER_BATCH, StopPoint(step, 1), tmp_path)

    committed, in_table = STATES[step]
    assert ckpt.logged_batches(paths.checkpoint) == [0, 1]
    assert ckpt.committed_batches(paths.checkpoint) == committed
    assert table_rows(spark, paths).count() == in_table
    lease = ckpt.source_offset(paths.checkpoint, 1).lease
    with LeaseClient(broker.uri) as client:
        # batch 0 was settled when batch 1 was planned; batch 1 is still held
        assert client.info(queue, lease)["first"] == PER_BATCH + 1
        assert client.info(queue, lease)["end"] == 2 * PER_BATCH

    publish_orders(broker.uri, queue, range(2 * PER_BATCH, 3 * PER_BATCH))
    query = start_query(spark, broker.uri, queue, paths, PER_BATCH, available_now=True)
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()

    actual = table_rows(spark, paths).orderBy("lease_seq")
    assert_df_equality(actual, expected_rows(spark, range(3 * PER_BATCH)), ignore_nullable=True)
    versions = spark.sql(f"DESCRIBE HISTORY delta.`{paths.table}`").count()
    assert versions == 3  # one Delta commit per batch: the replayed batch added nothing
    assert ckpt.committed_batches(paths.checkpoint) == [0, 1, 2]

    assert queue_counts(broker.uri, queue) == (0, PER_BATCH)  # batch 2, held by the lease
    ckpt.settle_committed(paths.checkpoint, broker.uri)
    assert queue_counts(broker.uri, queue) == (0, 0)

"""Consume mode (at-least-once) into a Delta table that holds each message once: Delta's
Python API, MERGE keyed on message_id (quorumqueue.jobs.delta.merge_on_message_id;
connector/README.md, "Consume mode: each message once in Delta").

The same message ids arrive twice, as they do when a batch is delivered again after a
driver restart (here: published again and read by a second query), and the table
still has one row per message_id; messages without one are inserted each time.
"""

from __future__ import annotations

import pika
import pytest

from quorumqueue.jobs.delta import merge_on_message_id

from .queues import publish_orders, unique

pytestmark = pytest.mark.timeout(300)


def run_into(spark, uri: str, queue: str, table: str, checkpoint: str) -> None:
    query = (spark.readStream.format("quorumqueue").option("uri", uri).option("queue", queue)
             .option("mode", "consume").option("maxMessagesPerTrigger", "10").load()
             .writeStream.foreachBatch(merge_on_message_id(table))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None, query.exception()


def publish_without_message_id(uri: str, queue: str, body: bytes) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def test_messages_delivered_twice_are_one_row_each(delta_spark, broker, tmp_path):
    from delta.tables import DeltaTable

    spark, queue, table = delta_spark, unique("merge"), str(tmp_path / "orders")
    publish_orders(broker.uri, queue, range(20))
    publish_without_message_id(broker.uri, queue, b"anonymous")
    run_into(spark, broker.uri, queue, table, str(tmp_path / "first"))

    publish_orders(broker.uri, queue, range(10, 25), declare=False)   # 10..19 again
    publish_without_message_id(broker.uri, queue, b"anonymous")
    run_into(spark, broker.uri, queue, table, str(tmp_path / "second"))

    delta = DeltaTable.forPath(spark, table)
    rows = delta.toDF()
    ids = [row.message_id for row in rows.where("message_id IS NOT NULL").collect()]
    assert sorted(ids) == sorted(f"order-{n}" for n in range(25))   # each once
    assert rows.where("message_id IS NULL").count() == 2             # no key, no match
    operations = [row.operation for row in delta.history().orderBy("version").collect()]
    assert operations[0] == "CREATE TABLE" and set(operations[1:]) == {"MERGE"}
    merged = delta.history().where("operation = 'MERGE'").collect()
    assert sum(int(row.operationMetrics["numTargetRowsUpdated"]) for row in merged) == 10

"""The options a Kafka-source user reaches for, in real local-Spark queries against the
bundled broker (connector/README.md, "Options", and its Kafka table).

- minMessagesPerTrigger / maxTriggerDelay (Kafka's minOffsetsPerTrigger /
  maxTriggerDelay): a trigger with fewer messages plans no batch until the delay has
  passed since the last batch;
- minPartitions / maxMessagesPerPartition (Kafka's minPartitions /
  maxRecordsPerPartition): how a batch is cut into Spark partitions;
- queuePattern (Kafka's subscribePattern): every quorum queue of the vhost whose
  name matches, queues created while the query runs included.

Nothing here measures time: tests wait, with a generous bound, for what a user would
see (rows in the sink, a progress report).
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pika
import pytest
from pyspark.sql import functions as F

from quorumqueue.client.management import call
from quorumqueue.connector.lag import lag_metrics

from .queues import publish_orders, quorum_queue, unique
from .test_lag import wait_for

pytestmark = pytest.mark.timeout(300)


def stream(spark, uri: str, **options):
    reader = spark.readStream.format("quorumqueue").option("uri", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


@contextmanager
def running(df, name: str, checkpoint: str, **trigger):
    writer = (df.writeStream.format("memory").queryName(name)
              .option("checkpointLocation", checkpoint))
    if trigger:
        writer = writer.trigger(**trigger)
    query = writer.start()
    try:
        yield query
    finally:
        query.stop()


@contextmanager
def frequent_idle_progress(spark):
    """Progress reports for triggers that planned no batch every 100 ms (Spark's
    default is every 10 s), so a test sees a waiting query's latest offset."""
    key = "spark.sql.streaming.noDataProgressEventInterval"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "100ms")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def batch_sizes(query) -> list[int]:
    by_batch = {p["batchId"]: p["numInputRows"] for p in query.recentProgress
                if p["numInputRows"]}
    return [by_batch[batch] for batch in sorted(by_batch)]


# ------------------------------------------------------------------ minMessagesPerTrigger


@pytest.mark.parametrize("mode", ["lease", "consume"])
def test_too_few_messages_wait_for_the_minimum_and_show_as_behind(spark, broker, tmp_path,
                                                                 mode):
    queue = quorum_queue(broker.uri, 3)
    name = f"minimum_{mode}"
    df = stream(spark, broker.uri, queue=queue, mode=mode, minMessagesPerTrigger="10",
                maxTriggerDelay="1h")
    with frequent_idle_progress(spark), running(df, name, str(tmp_path / "cp")) as query:
        def waiting_with_three_behind():
            progress = query.lastProgress
            metrics = progress and lag_metrics(progress["sources"][0])
            return metrics and metrics["maxMessagesBehindLatest"] == 3
        # the source was asked, saw the 3 messages, and planned no batch
        wait_for(waiting_with_three_behind, "a progress showing 3 messages behind")
        assert spark.table(name).count() == 0 and batch_sizes(query) == []
        publish_orders(broker.uri, queue, range(3, 10), declare=False)
        # waiting on the progress runs no Spark job (tests/connector/test_lag.py, rows_read)
        wait_for(lambda: sum(batch_sizes(query)) >= 10, "the batch of 10")
        assert batch_sizes(query) == [10] and spark.table(name).count() == 10


def test_max_trigger_delay_lets_a_small_batch_through_in_the_end(spark, broker, tmp_path):
    queue = quorum_queue(broker.uri, 4)
    df = stream(spark, broker.uri, queue=queue, minMessagesPerTrigger="1000",
                maxTriggerDelay="2s")
    with running(df, "delayed", str(tmp_path / "cp")) as query:
        wait_for(lambda: sum(batch_sizes(query)) >= 4, "the 4 messages, after 2 s")
        assert batch_sizes(query) == [4] and spark.table("delayed").count() == 4


def test_available_now_does_not_wait_for_the_minimum(spark, broker, tmp_path):
    queue = quorum_queue(broker.uri, 4)
    df = stream(spark, broker.uri, queue=queue, minMessagesPerTrigger="1000",
                maxTriggerDelay="1h")
    with running(df, "minimum_available_now", str(tmp_path / "cp"),
                 availableNow=True) as query:
        assert query.awaitTermination(120)
        assert query.exception() is None and batch_sizes(query) == [4]


# ------------------------------------------------------------------ partitions


@pytest.mark.parametrize("mode", ["lease", "consume"])
@pytest.mark.parametrize("options, partitions", [
    ({}, [100]),                                    # today's cut: one partition this small
    ({"minPartitions": "4"}, [25, 25, 25, 25]),
    ({"maxMessagesPerPartition": "30"}, [30, 30, 30, 10]),
    ({"minPartitions": "3", "maxMessagesPerPartition": "20"}, [20] * 5),
])
def test_a_batch_is_cut_into_the_partitions_the_options_ask_for(spark, broker, tmp_path, mode,
                                                               options, partitions):
    queue = quorum_queue(broker.uri, 100)
    name = unique("partitions").replace("-", "_")
    df = (stream(spark, broker.uri, queue=queue, mode=mode, **options)
          .select(F.spark_partition_id().alias("partition"), "offset"))
    with running(df, name, str(tmp_path / "cp"), availableNow=True) as query:
        assert query.awaitTermination(120) and query.exception() is None
    rows = spark.table(name).groupBy("partition").agg(F.count("*").alias("n"),
                                                      F.min("offset").alias("first"))
    assert [row.n for row in rows.orderBy("first").collect()] == partitions


# ------------------------------------------------------------------ queuePattern


def declare(uri: str, queue: str, kind: str = "quorum") -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        connection.channel().queue_declare(queue, durable=True,
                                           arguments={"x-queue-type": kind})
    finally:
        connection.close()


def test_queue_pattern_reads_every_matching_quorum_queue_new_ones_too(spark, broker, tmp_path):
    prefix = unique("shop")
    publish_orders(broker.uri, f"{prefix}.eu", range(5))
    publish_orders(broker.uri, f"{prefix}.us", range(3))
    declare(broker.uri, f"{prefix}.classic", "classic")   # matches, not a quorum queue
    publish_orders(broker.uri, f"other.{prefix}.eu", range(4))      # does not match
    df = stream(spark, broker.uri, queuePattern=f"{prefix}\\..*")
    eu, us, asia = f"{prefix}.eu", f"{prefix}.us", f"{prefix}.asia"
    with running(df, "pattern", str(tmp_path / "cp")) as query:
        def counts():
            rows = spark.table("pattern").groupBy("queue").count().collect()
            return {row.queue: row["count"] for row in rows}

        def committed():
            """Each queue's end offset in the last progress (reported once the batch
            is in the sink): waiting on it runs no Spark job (test_lag.py, rows_read)."""
            progress = query.lastProgress
            return progress and json.loads(progress["sources"][0]["endOffset"])["queues"]

        wait_for(lambda: committed() == {eu: 5, us: 3}, "the two matching quorum queues")
        assert counts() == {eu: 5, us: 3}
        publish_orders(broker.uri, asia, range(6))   # created while running
        wait_for(lambda: committed() == {eu: 5, us: 3, asia: 6}, "the new queue's messages")
        assert counts() == {eu: 5, us: 3, asia: 6}
        # a matching queue deleted while the query runs leaves it; the others go on
        call(broker.uri, "queues.delete", vhost="/", name=us)
        publish_orders(broker.uri, eu, range(5, 8), declare=False)
        wait_for(lambda: (committed() or {}).get(eu) == 8, "the next messages of the rest")
        assert counts() == {eu: 8, us: 3, asia: 6}
        assert query.isActive and query.exception() is None


def test_queue_pattern_and_queue_together_fail_at_load_naming_both(spark, broker):
    with pytest.raises(Exception, match="options 'queue' and 'queuePattern' cannot be used "
                                        "together"):
        stream(spark, broker.uri, queue="orders", queuePattern="orders.*")


def test_queue_pattern_on_rabbitmq_fails_when_the_query_starts(spark, rabbitmq, tmp_path):
    df = stream(spark, rabbitmq.uri, queuePattern="orders.*")
    with pytest.raises(Exception, match="option 'queuePattern' needs lease mode"):
        with running(df, "pattern_rabbitmq", str(tmp_path / "cp")) as query:
            query.awaitTermination(60)


def user_uri(broker, tags: list[str]) -> str:
    """A new user with every permission on '/', and these tags."""
    name = unique("reader")
    call(broker.uri, "users.add", name=name, password="pw", tags=tags)
    call(broker.uri, "permissions.set", user=name, vhost="/", configure=".*", write=".*",
         read=".*")
    return f"amqp://{name}:pw@127.0.0.1:{broker.port}/%2F"


def test_queue_pattern_needs_an_administrator_and_says_so(spark, broker, tmp_path):
    uri = user_uri(broker, tags=[])
    df = stream(spark, uri, queuePattern="orders.*")
    with running(df, "pattern_not_admin", str(tmp_path / "cp")) as query:
        with pytest.raises(Exception) as failure:
            query.awaitTermination(120)
    assert "option 'queuePattern': cannot list the queues of vhost '/' (ACCESS_REFUSED" in str(
        failure.value)
    assert "needs a user tagged administrator" in str(failure.value)


def test_without_the_administrator_tag_the_lag_leaves_out_the_brokers_unacked(spark, broker,
                                                                              tmp_path):
    queue = quorum_queue(broker.uri, 12)
    df = stream(spark, user_uri(broker, tags=[]), queue=queue, maxMessagesPerTrigger="5")
    with running(df, "lag_not_admin", str(tmp_path / "cp"), availableNow=True) as query:
        assert query.awaitTermination(120) and query.exception() is None
    metrics = [lag_metrics(p["sources"][0]) for p in query.recentProgress if p["numInputRows"]]
    assert [m["maxMessagesBehindLatest"] for m in metrics] == [7, 2, 0]
    assert all("unackedMessages" not in m and m["heldMessages"] > 0 for m in metrics)

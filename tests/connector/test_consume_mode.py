"""Consume mode (connector/consume_reader.py) against the bundled broker and RabbitMQ 3.10.8.

connector/README.md, "Consume mode": on any AMQP 0-9-1 broker the driver consumes with
manual acks and acks a batch only once Spark has committed it; what is not acked
returns to the queue, so nothing is lost, and a batch handed to Spark but not acked
when the driver stops comes back (at-least-once, deduplicated on `message_id`).

Every test runs against both brokers: the bundled one with `mode` = `consume`, and
RabbitMQ (detected from its product name), which is skipped with the reason only when
it is not installed. The reader tests drive the reader in Spark's order without Spark;
the Spark tests run real queries with Trigger.AvailableNow.
"""

from __future__ import annotations

import pickle
import time

import pika
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from quorumqueue.connector.consume_reader import ConsumeStreamReader, Ledger
from quorumqueue.connector.lease_reader import LeaseStreamReader
from quorumqueue.connector.offsets import ConsumeOffset, OffsetError
from quorumqueue.connector.options import OptionError
from quorumqueue.connector.schema import ARROW_SCHEMA, SCHEMA
from quorumqueue.connector.source import QuorumQueueDataSource

from .queues import order_numbers, publish_orders, quorum_queue

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["bundled", "rabbitmq"])
def target(request) -> tuple[str, dict]:
    """(uri, the options that select consume mode on that broker)."""
    if request.param == "bundled":
        return request.getfixturevalue("broker").uri, {"mode": "consume"}
    return request.getfixturevalue("rabbitmq").uri, {}


def make_reader(uri: str, queue: str, **options) -> ConsumeStreamReader:
    source = QuorumQueueDataSource({"uri": uri, "queue": queue, **options})
    reader = source.streamReader(SCHEMA)
    assert isinstance(reader, ConsumeStreamReader)
    return reader


def run_batch(reader: ConsumeStreamReader, start: dict, limit=None,
              previous: dict | None = None) -> tuple[dict, list[int]]:
    """One micro-batch in Spark's order: (end offset, order numbers read). Like Spark,
    a trigger whose latestOffset is its start runs no batch and asks again (a busy
    broker may not have delivered to a consumer that has just started)."""
    for _trigger in range(5):
        end = reader.latestOffset(start, limit or reader.getDefaultReadLimit())
        if end != start:
            break
    if previous is not None:
        reader.commit(previous)
    parts = pickle.loads(pickle.dumps(reader.partitions(start, end)))  # to the executors
    executor = pickle.loads(pickle.dumps(reader))
    batches = [batch for part in parts for batch in executor.read(part)]
    assert all(batch.schema.equals(ARROW_SCHEMA) for batch in batches)
    return end, order_numbers(batches)


def queue_counts(uri: str, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of `queue`."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        method = connection.channel().queue_declare(queue, passive=True).method
        return method.message_count, method.consumer_count
    finally:
        connection.close()


def settled_counts(uri: str, queue: str) -> tuple[int, int]:
    """`queue_counts` once no consumer is left: a reader stopped in another process
    (Spark's) closes its connection shortly after the query ends."""
    deadline = time.monotonic() + 30
    while (counts := queue_counts(uri, queue))[1] and time.monotonic() < deadline:
        time.sleep(0.1)
    return counts


# ------------------------------------------------------------------ pure parts


class _Method:
    exchange, routing_key, redelivered = "", "q", False


def ledger_with(start: int, tags: range) -> Ledger:
    ledger = Ledger()
    ledger.start_at(start)
    for tag in tags:
        ledger.add(tag, _Method(), pika.BasicProperties(), b"")
    return ledger


def test_the_ledger_numbers_deliveries_on_from_the_checkpoint():
    ledger = ledger_with(40, range(1, 6))              # tags 1..5 numbered 41..45
    assert [d.seq for d in ledger.held] == [41, 42, 43, 44, 45] and ledger.last == 45
    assert ledger.ahead(42) == 3
    assert [d.tag for d in ledger.span(41, 43)] == [2, 3]
    assert ledger.span(43, 47) is None                 # not all held
    assert ledger.through(42) == 2                     # ack tag 2, multiple
    assert ledger.through(42) is None                  # nothing more to ack
    assert [d.seq for d in ledger.held] == [43, 44, 45]


def test_the_ledger_forgets_a_lost_channel_and_renumbers_for_a_replanned_batch():
    ledger = ledger_with(20, range(1, 5))              # 21..24; Spark was handed 21..22
    assert ledger.forget(handed=22) == 2               # those two will come again
    assert ledger.held == [] and ledger.next_seq == 23
    for tag in (1, 2, 3):                              # the new channel's deliveries
        ledger.add(tag, _Method(), pika.BasicProperties(), b"")
    assert [d.seq for d in ledger.held] == [23, 24, 25]
    assert ledger.span(20, 22) is None                 # batch (20, 22] is planned again:
    ledger.renumber_from(20)                           # the next deliveries make it up
    assert [d.seq for d in ledger.held] == [21, 22, 23] and ledger.next_seq == 24
    assert [d.tag for d in ledger.span(20, 22)] == [1, 2]


@pytest.mark.parametrize("document", [
    {"lease": "spark-1", "queues": {"q": 1}}, {"delivered": {"q": -1}},
    {"delivered": {"q": True}}, {"delivered": [1]}, {"delivered": {}, "more": 1}, None,
])
def test_a_checkpoint_that_is_not_a_consume_offset_is_refused(document):
    with pytest.raises(OffsetError):
        ConsumeOffset.from_json(document)


def test_consume_offsets_are_canonical_and_never_move_back():
    offset = ConsumeOffset.of({"b": 2, "a": 1})
    assert offset.to_json() == {"delivered": {"a": 1, "b": 2}}
    assert ConsumeOffset.from_json(offset.to_json()) == offset
    assert offset.advanced({"a": 5}).to_json() == {"delivered": {"a": 5, "b": 2}}
    with pytest.raises(OffsetError, match="would move back from 2 to 1"):
        offset.advanced({"b": 1})


# ------------------------------------------------------------------ the reader


def test_batches_are_acked_once_spark_asks_for_the_next_one(target):
    uri, mode = target
    queue = quorum_queue(uri, 25)
    reader = make_reader(uri, queue, maxMessagesPerTrigger="10", **mode)
    assert reader.limits.prefetch > 20 and reader.getDefaultReadLimit() == ReadMaxRows(10)
    start = reader.initialOffset()
    assert start == {"delivered": {queue: 0}}
    end1, read1 = run_batch(reader, start)
    end2, read2 = run_batch(reader, end1, previous=start)
    assert (end1, end2) == ({"delivered": {queue: 10}}, {"delivered": {queue: 20}})
    assert read1 + read2 == list(range(20))
    reader.stop()  # batch 1 was acked (Spark asked for batch 2); batch 2 was not
    assert settled_counts(uri, queue) == (15, 0)


def test_a_batch_logged_before_a_crash_is_replanned_with_the_same_count(target):
    uri, mode = target
    queue = quorum_queue(uri, 12)
    crashed = make_reader(uri, queue, maxMessagesPerTrigger="5", **mode)
    start = crashed.initialOffset()
    end, numbers = run_batch(crashed, start)
    assert numbers == [0, 1, 2, 3, 4]
    crashed.stop()  # died after offset log 0: nothing was acked, all comes back
    assert settled_counts(uri, queue) == (12, 0)

    restarted = make_reader(uri, queue, maxMessagesPerTrigger="5", **mode)
    parts = restarted.partitions(start, end)  # Spark re-plans batch 0 first
    replanned = order_numbers(b for part in parts for b in restarted.read(part))
    assert len(replanned) == 5
    rows = [row for part in parts for row in part.batch.to_pylist()]
    assert [row["offset"] for row in rows] == [1, 2, 3, 4, 5]
    assert all(row["redelivered"] for row in rows)
    end2, rest = run_batch(restarted, end, ReadAllAvailable())
    end3, more = run_batch(restarted, end2, ReadAllAvailable())
    assert end3 == end2 and not more
    assert set(replanned + rest) == set(range(12))  # none lost
    restarted.stop()
    assert settled_counts(uri, queue) == (0, 0)


def test_several_queues_share_the_limit_and_take_turns(target):
    uri, mode = target
    first, second = quorum_queue(uri, 10, "a"), quorum_queue(uri, 10, "b")
    reader = make_reader(uri, f"{first},{second}", maxMessagesPerTrigger="6", **mode)
    offset, taken = reader.initialOffset(), []
    for _ in range(4):
        end, _numbers = run_batch(reader, offset)
        taken.append(tuple(end["delivered"][q] - offset["delivered"][q]
                           for q in (first, second)))
        offset = end
    assert taken == [(6, 0), (0, 6), (4, 2), (0, 2)]
    reader.stop()


def test_the_driver_reconnects_and_loses_nothing(fresh_broker):
    queue = quorum_queue(fresh_broker.uri, 9)
    reader = make_reader(fresh_broker.uri, queue, maxMessagesPerTrigger="3", mode="consume")
    end1, numbers1 = run_batch(reader, reader.initialOffset())
    fresh_broker.restart()  # the channel and its delivery tags are gone
    offset, numbers = end1, list(numbers1)
    while True:
        end, more = run_batch(reader, offset, previous=offset)
        if end == offset:
            break
        numbers += more
        offset = end
    assert set(numbers) == set(range(9))  # at least once: batch 1 may come again
    reader.stop()
    assert settled_counts(fresh_broker.uri, queue) == (0, 0)


def test_an_idle_driver_keeps_its_connection_between_triggers(target):
    uri, mode = target
    queue = quorum_queue(uri, 10)
    beating = f"{uri}?heartbeat=1"  # the broker drops a client silent for 2 heartbeats
    reader = make_reader(beating, queue, maxMessagesPerTrigger="5", **mode)
    start = reader.initialOffset()
    end1, numbers1 = run_batch(reader, start)
    time.sleep(3.5)  # a long batch, or a long trigger interval: no call reaches the reader
    end2, numbers2 = run_batch(reader, end1, previous=start)
    assert numbers1 + numbers2 == list(range(10))
    reader.stop()
    # batch 1 was acked on the channel that received it: only batch 2 comes back
    assert settled_counts(uri, queue) == (5, 0)


def test_a_missing_queue_is_named(target):
    uri, mode = target
    reader = make_reader(uri, "no-such-queue", **mode)
    with pytest.raises(RuntimeError, match="queue 'no-such-queue' \\(option 'queue'\\)"):
        reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
    reader.stop()


# ------------------------------------------------------------------ options and mode


def test_prefetch_must_exceed_two_batches(target):
    uri, mode = target
    with pytest.raises(OptionError, match=r"option 'prefetch' \(20\) must exceed two batches "
                                          r"of option 'maxMessagesPerTrigger' \(10\)"):
        make_reader(uri, "q", maxMessagesPerTrigger="10", prefetch="20", **mode)
    assert make_reader(uri, "q", maxMessagesPerTrigger="10", prefetch="21",
                       **mode).limits.prefetch == 21
    assert make_reader(uri, "q", maxMessagesPerTrigger="10", **mode).limits.prefetch == 30


def test_mode_detection_routes_each_broker(broker, rabbitmq):
    def reader_of(uri: str, **options):
        return QuorumQueueDataSource({"uri": uri, "queue": "q", **options}).streamReader(SCHEMA)

    assert isinstance(reader_of(rabbitmq.uri), ConsumeStreamReader)
    assert isinstance(reader_of(broker.uri), LeaseStreamReader)
    assert isinstance(reader_of(broker.uri, mode="consume"), ConsumeStreamReader)
    with pytest.raises(OptionError, match="'lease', which needs the bundled quorumqueue"):
        reader_of(rabbitmq.uri, mode="lease")


# ------------------------------------------------------------------ Spark queries


def stream(spark, uri: str, queue: str, **options):
    reader = spark.readStream.format("quorumqueue").option("uri", uri).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_available_now_into_memory_gets_every_message_and_acks_it(spark, target, tmp_path):
    uri, mode = target
    queue = quorum_queue(uri, 25)
    query = (stream(spark, uri, queue, maxMessagesPerTrigger="10", **mode).writeStream
             .format("memory").queryName(f"consumed_{queue.replace('-', '_')}")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [10, 10, 5]
    rows = spark.table(f"consumed_{queue.replace('-', '_')}").collect()
    assert sorted(row.message_id for row in rows) == sorted(f"order-{n}" for n in range(25))
    assert sorted(row.offset for row in rows) == list(range(1, 26))
    assert {(row.queue, row.routing_key, row.exchange) for row in rows} == {(queue, queue, "")}
    assert settled_counts(uri, queue) == (0, 0)  # a clean run acks its last batch too


def test_a_query_restarted_after_failing_in_a_batch_loses_nothing(spark, target, tmp_path):
    # (a clean run acks all it read: test_available_now_into_memory_gets_every_message...)
    uri, mode = target
    queue = quorum_queue(uri, 20)
    checkpoint = str(tmp_path / "checkpoint")
    seen: list[tuple[int, str]] = []

    def run(fail_batch: int | None) -> object:
        def sink(frame, batch_id: int) -> None:
            if batch_id == fail_batch:
                raise RuntimeError("the sink is down")
            seen.extend((batch_id, row.message_id) for row in frame.collect())

        query = (stream(spark, uri, queue, maxMessagesPerTrigger="10", **mode).writeStream
                 .foreachBatch(sink).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(120)
        except Exception:  # noqa: BLE001 - the failing run; checked below
            pass
        return query

    first = run(fail_batch=1)
    assert "the sink is down" in str(first.exception())
    # batch 1 is logged but not committed: its messages, never acked, return to the
    # queue when the driver's connection closes
    assert settled_counts(uri, queue) == (10, 0)
    publish_orders(uri, queue, range(20, 35), declare=False)

    second = run(fail_batch=None)
    assert second.exception() is None, second.exception()
    batches = [(p["batchId"], p["numInputRows"]) for p in second.recentProgress
               if p["numInputRows"]]
    assert batches == [(1, 10), (2, 10), (3, 5)]  # batch 1 re-planned: 10 messages again
    ids = [message_id for _batch, message_id in seen]
    assert set(ids) == {f"order-{n}" for n in range(35)}  # every message at least once
    # here even exactly once: a quorum queue serves returned messages first, so the
    # re-planned batch 1 got the same messages back
    assert len(ids) == 35
    assert settled_counts(uri, queue) == (0, 0)


def test_a_too_small_prefetch_fails_the_query_naming_both_options(spark, broker, tmp_path):
    query = (stream(spark, broker.uri, "orders", mode="consume", maxMessagesPerTrigger="100",
                    prefetch="150").writeStream.format("memory").queryName("too_small")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="option 'prefetch' \\(150\\) must exceed two batches "
                                        "of option 'maxMessagesPerTrigger' \\(100\\)"):
        query.awaitTermination(60)

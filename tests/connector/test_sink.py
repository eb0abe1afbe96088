"""The Spark sink: `df.write` / `df.writeStream` `.format("quorumqueue")` (connector/sink.py).

connector/README.md, "Sink": publisher confirms on every partition; with the
bundled broker, publishing is idempotent per (query, partition, batch), so a batch
Spark runs again adds nothing twice. What arrives is checked with pika (or, for a
source-to-sink pipeline, read back through the source and compared with chispa).
The sink's pure parts (options, columns, rows) are tables at the end.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import struct

import pika
import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.types import (BinaryType, IntegerType, LongType, MapType, StringType,
                               StructField, StructType, TimestampType)

from quorumqueue.connector.options import OptionError, SinkOptions, parse_sink_options
from quorumqueue.connector.publisher import ConfirmedPublisher, Outgoing, PublishError
from quorumqueue.connector.schema import SCHEMA
from quorumqueue.connector.sink_rows import (IdempotencyKey, RowError, input_plan,
                                             returned_row, to_messages)
from tests.support.broker import BrokerProcess

from .queues import order_body, order_properties, publish_orders, quorum_queue, unique

pytestmark = pytest.mark.timeout(180)

PUBLISHER, SEQ = "x-quorumqueue-publisher", "x-quorumqueue-seq"
EVENT = StructType([StructField("id", LongType()), StructField("tenant", StringType())])


# ------------------------------------------------------------------ helpers


def declare(uri: str, prefix: str = "sink", **arguments) -> str:
    name = unique(prefix)
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        connection.channel().queue_declare(name, durable=True,
                                           arguments={"x-queue-type": "quorum", **arguments})
    return name


def drain(uri: str, queue: str) -> list[tuple[bytes, pika.BasicProperties, str, str]]:
    """(body, properties, exchange, routing key) of every message in `queue`, removed."""
    messages = []
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        channel = connection.channel()
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return messages
            messages.append((body, properties, method.exchange, method.routing_key))


def bodies(uri: str, queue: str) -> list[bytes]:
    return [body for body, *_ in drain(uri, queue)]


def write(df, uri: str, **options) -> None:
    writer = df.write.format("quorumqueue").mode("append").option("uri", uri)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def write_events(directory, number: int, ids) -> None:
    with open(os.path.join(directory, f"events-{number:03d}.json"), "w") as handle:
        for event in ids:
            handle.write(json.dumps({"id": event, "tenant": "acme"}) + "\n")


def stream_events(spark, directory):
    return (spark.readStream.schema(EVENT).option("maxFilesPerTrigger", 1).json(str(directory))
            .select(F.to_json(F.struct("id", "tenant")).alias("body"),
                    F.create_map(F.lit("tenant"), F.col("tenant")).alias("headers")))


def run_to_queue(stream, uri: str, checkpoint: str, **options):
    writer = (stream.writeStream.format("quorumqueue").option("uri", uri)
              .option("checkpointLocation", checkpoint).trigger(availableNow=True))
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    query.awaitTermination(120)
    if query.exception() is not None:
        raise query.exception()
    return query


def ids(messages: list[bytes]) -> list[int]:
    return [json.loads(body)["id"] for body in messages]


def escape(text: str) -> str:
    return re.escape(text)


# ------------------------------------------------------------------ batch writes


def test_a_batch_write_publishes_every_row_with_its_properties(spark, broker):
    queue = declare(broker.uri)
    schema = StructType([
        StructField("body", BinaryType()), StructField("routing_key", StringType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("content_type", StringType()), StructField("message_id", StringType()),
        StructField("delivery_mode", IntegerType()), StructField("priority", IntegerType()),
        StructField("timestamp", TimestampType()),
    ])
    moment = dt.datetime(2026, 1, 2, 3, 4, 5, 600_000, tzinfo=dt.timezone.utc)
    rows = [(b"first", None, {"tenant": "acme"}, "text/plain", "m-1", None, 7, moment),
            (b"second", queue, None, None, None, 1, None, None)]
    write(spark.createDataFrame(rows, schema).coalesce(1), broker.uri, routingKey=queue)

    (first, p1, x1, k1), (second, p2, x2, k2) = drain(broker.uri, queue)
    assert (first, x1, k1, second, x2, k2) == (b"first", "", queue, b"second", "", queue)
    assert (p1.content_type, p1.message_id, p1.delivery_mode, p1.priority, p1.timestamp) == (
        "text/plain", "m-1", 2, 7, int(moment.timestamp()))   # persistent unless told
    assert (p2.content_type, p2.delivery_mode, p2.priority, p2.timestamp) == (None, 1, None, None)
    assert p1.headers["tenant"] == "acme"
    assert p1.headers[PUBLISHER] == p2.headers[PUBLISHER]     # one task, one publisher
    assert p1.headers[PUBLISHER].startswith("spark-write/")
    assert (p1.headers[SEQ], p2.headers[SEQ]) == (1, 2)


def test_string_bodies_and_an_exchange_route_by_each_rows_key(spark, broker):
    high, low = declare(broker.uri, "high"), declare(broker.uri, "low")
    exchange = unique("sink-direct")
    with pika.BlockingConnection(pika.URLParameters(broker.uri)) as connection:
        channel = connection.channel()
        channel.exchange_declare(exchange, "direct")
        channel.queue_bind(high, exchange, "high")
        channel.queue_bind(low, exchange, "low")
    df = spark.range(10).select(F.col("id").cast("string").alias("body"),
                                F.when(F.col("id") < 3, "high").alias("routing_key"))
    write(df, broker.uri, exchange=exchange, routingKey="low")
    assert sorted(bodies(broker.uri, high)) == [b"0", b"1", b"2"]
    assert sorted(bodies(broker.uri, low)) == [str(n).encode() for n in range(3, 10)]


def test_a_nacked_publish_fails_the_write_naming_the_rows(spark, broker):
    """reject-publish: the broker nacks publishes while the queue is at its length
    limit. The bundled broker takes the sink's rows as one batch publish, nacked whole
    when any of its messages is refused: the error names the batch's rows and says
    that those before the first refused one are stored (they are)."""
    queue = declare(broker.uri, **{"x-max-length": 5, "x-overflow": "reject-publish"})
    df = spark.range(50).select(F.col("id").cast("string").alias("body")).coalesce(1)
    with pytest.raises(Exception, match=r"the broker nacked 50 message\(s\) \(rows 0, 1, 2, "
                                        r"3, 4 and 45 more of this task's partition\); a "
                                        r"queue refused them, or in a batch publish at least "
                                        r"one of them \(the broker nacks a batch whole; its "
                                        r"rows before the first refused one are stored\)"):
        write(df, broker.uri, routingKey=queue)
    assert bodies(broker.uri, queue) == [str(n).encode() for n in range(6)]


def test_an_unroutable_mandatory_message_fails_the_write(spark, broker):
    exchange = unique("sink-unbound")
    with pika.BlockingConnection(pika.URLParameters(broker.uri)) as connection:
        connection.channel().exchange_declare(exchange, "direct")
    df = spark.range(3).select(F.col("id").cast("string").alias("body")).coalesce(1)
    with pytest.raises(Exception, match=f"3 mandatory message\\(s\\) could not be routed "
                                        f"\\(rows 0, 1, 2 of this task's partition; first: "
                                        f"exchange '{exchange}', routing key 'nowhere': "
                                        f"312 NO_ROUTE\\)"):
        write(df, broker.uri, exchange=exchange, routingKey="nowhere", mandatory="true")
    write(df, broker.uri, exchange=exchange, routingKey="nowhere")  # not mandatory: dropped


def test_a_row_amqp_cannot_carry_fails_the_write_naming_it(spark, broker):
    queue = declare(broker.uri)
    df = spark.range(3).select(F.when(F.col("id") != 1, F.lit("x")).alias("body")).coalesce(1)
    with pytest.raises(Exception, match="row 1 of this task: column 'body' is null"):
        write(df, broker.uri, routingKey=queue)


def test_empty_partitions_publish_nothing(spark, broker):
    queue = declare(broker.uri)
    df = spark.range(0, 4, 1, 4).where("id = 2").select(F.lit("only").alias("body"))
    write(df, broker.uri, routingKey=queue)
    assert bodies(broker.uri, queue) == [b"only"]


# ------------------------------------------------------------------ streaming


def test_a_streaming_query_publishes_each_batch_and_a_replayed_batch_adds_nothing(
        spark, broker, tmp_path):
    queue = declare(broker.uri)
    events, checkpoint = tmp_path / "events", str(tmp_path / "checkpoint")
    events.mkdir()
    for number in range(3):
        write_events(events, number, range(number * 10, number * 10 + 10))
    first = run_to_queue(stream_events(spark, events), broker.uri, checkpoint, routingKey=queue)
    assert [p["batchId"] for p in first.recentProgress if p["numInputRows"]] == [0, 1, 2]
    # Forget that batch 2 was committed: on restart Spark runs batch 2 again, with the
    # same files (its offset log), and the sink publishes its rows with the same keys.
    for name in ("2", ".2.crc"):
        os.remove(os.path.join(checkpoint, "commits", name))
    write_events(events, 3, range(30, 35))
    second = run_to_queue(stream_events(spark, events), broker.uri, checkpoint,
                          routingKey=queue)
    assert [(p["batchId"], p["numInputRows"]) for p in second.recentProgress
            if p["numInputRows"]] == [(2, 10), (3, 5)]
    messages = drain(broker.uri, queue)
    assert sorted(ids([body for body, *_ in messages])) == list(range(35))  # once each
    keys = {(p.headers[PUBLISHER], p.headers[SEQ]) for _, p, _, _ in messages}
    assert len(keys) == 35
    assert {publisher.rsplit("/", 1)[0] for publisher, _ in keys} == {
        f"spark-query/{first.id}"}
    assert {seq >> 32 for _, seq in keys} == {0, 1, 2, 3}                   # the batch ids
    assert all(p.headers["tenant"] == "acme" for _, p, _, _ in messages)


def test_a_source_to_sink_pipeline_copies_messages_exactly_once(spark, broker, tmp_path):
    source_queue, target = quorum_queue(broker.uri, 15), declare(broker.uri)
    checkpoint = str(tmp_path / "checkpoint")
    stream = (spark.readStream.format("quorumqueue").option("uri", broker.uri)
              .option("queue", source_queue).option("maxMessagesPerTrigger", "10").load()
              .drop("routing_key"))  # else each message goes back to the queue it came from
    run_to_queue(stream, broker.uri, checkpoint, routingKey=target)
    publish_orders(broker.uri, source_queue, range(15, 20), declare=False)
    run_to_queue(stream, broker.uri, checkpoint, routingKey=target)

    read_back = (spark.readStream.format("quorumqueue").option("uri", broker.uri)
                 .option("queue", target).load()
                 .writeStream.format("memory").queryName("copied")
                 .option("checkpointLocation", str(tmp_path / "read-back"))
                 .trigger(availableNow=True).start())
    read_back.awaitTermination(120)
    assert read_back.exception() is None, read_back.exception()
    copied = spark.table("copied").withColumn(
        "headers", F.map_filter("headers", lambda key, _: ~key.startswith("x-quorumqueue-")))
    expected = spark.createDataFrame(copied_rows(target, range(20)), SCHEMA)
    assert_df_equality(copied.orderBy("offset"), expected, ignore_nullable=True)


def copied_rows(queue: str, numbers) -> list[tuple]:
    """The source's rows for orders `numbers` after a trip through the sink into `queue`:
    published to the default exchange with routing key `queue`, headers as strings."""
    rows = []
    for offset, number in enumerate(numbers, start=1):
        p = order_properties(number)
        rows.append((order_body(number), queue, queue, "", offset, 0, False, p.content_type,
                     None, {k: str(v) for k, v in p.headers.items()}, p.delivery_mode,
                     p.priority, p.correlation_id, None, None, p.message_id,
                     dt.datetime.fromtimestamp(p.timestamp), p.type, None, p.app_id))
    return rows


def test_the_sink_refuses_async_progress_tracking(spark, broker, tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    # Spark itself refuses it before the sink sees the option (it allows async progress
    # tracking only with its own Kafka, memory, console and noop sinks); the sink's own
    # refusal (test_sink_options_refused) is the second line.
    with pytest.raises(Exception, match="Sink quorumqueue does not support async progress "
                                        "tracking"):
        run_to_queue(stream_events(spark, events), broker.uri, str(tmp_path / "checkpoint"),
                     routingKey="anything", asyncProgressTrackingEnabled="true")


# ------------------------------------------------------------------ refused at start


@pytest.mark.parametrize("options, message", [
    ({"routingKey": "q", "mandatroy": "true"},
     "unknown option 'mandatroy' for the quorumqueue sink (did you mean 'mandatory'?)"),
    ({"routingKey": "q", "mandatory": "yes"}, "option 'mandatory' must be true or false"),
    ({"routingKey": "q", "confirmTimeout": "soon"}, "option 'confirmTimeout' must be a "
                                                    "duration"),
    ({}, "option 'routingKey' (or a 'routing_key' column) is required with the default "
         "exchange"),
    ({"exchange": "no-such-exchange"},
     "option 'exchange': NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'"),
], ids=["unknown", "mandatory", "timeout", "no-routing-key", "no-exchange"])
def test_a_bad_option_fails_the_write_naming_it(spark, broker, options, message):
    df = spark.range(1).select(F.lit("x").alias("body"))
    with pytest.raises(Exception, match=escape(message)):
        write(df, broker.uri, **options)


@pytest.mark.parametrize("columns, message", [
    ("id", "the quorumqueue sink cannot write column 'id': it accepts body, routing_key"),
    ("cast(id as string) as routing_key", "needs a 'body' column"),
    ("id as body", "column 'body' of the quorumqueue sink must be binary or string, got "
                   "bigint; cast it"),
    ("'x' as body; 'p' as priority", "column 'priority' of the quorumqueue sink must be "
                                     "an integer type, got string"),
    ("'x' as body; map('a', 1) as headers", "column 'headers' of the quorumqueue sink must "
                                            "be map<string,string>, got map<string,int>"),
    ("'x' as body; 'y' as Body", "columns 'body' and 'Body' both mean 'body'"),
], ids=["unknown", "no-body", "body-type", "priority-type", "headers-type", "twice"])
def test_a_column_the_sink_cannot_write_fails_at_start_naming_it(spark, broker, columns,
                                                                  message):
    df = spark.range(1).selectExpr(*columns.split("; "))
    with pytest.raises(Exception, match=escape(message)):
        write(df, broker.uri, routingKey="q")


def test_overwrite_is_refused(spark, broker):
    df = spark.range(1).select(F.lit("x").alias("body"))
    with pytest.raises(Exception, match="cannot overwrite a queue"):
        df.write.format("quorumqueue").mode("overwrite").option("uri", broker.uri).save()


# ------------------------------------------------------------------ RabbitMQ


def test_against_rabbitmq_the_headers_are_harmless(spark, rabbitmq):
    queue = declare(rabbitmq.uri)
    df = spark.range(3).select(F.col("id").cast("string").alias("body")).coalesce(1)
    write(df, rabbitmq.uri, routingKey=queue)
    write(df, rabbitmq.uri, routingKey=queue)  # at-least-once: no de-duplication there
    messages = drain(rabbitmq.uri, queue)
    assert [body for body, *_ in messages] == [b"0", b"1", b"2"] * 2
    assert [p.headers[SEQ] for _, p, _, _ in messages] == [1, 2, 3] * 2


# ------------------------------------------------------------------ publisher (no Spark)


def outgoing(queue: str, count: int, publisher: str = "test", after=None):
    """`count` messages for `queue` with keys (publisher, row + 1); `after(row)` runs
    once each message has been handed to the publisher."""
    schema = pa.schema([("body", pa.binary())])
    batch = pa.record_batch([pa.array([b"%d" % n for n in range(count)])], schema=schema)
    options = parse_sink_options({"uri": "amqp://unused", "routingKey": queue})
    plan = input_plan(StructType([StructField("body", BinaryType())]), options)
    for message in to_messages([batch], plan, options, IdempotencyKey(publisher, 0)):
        yield message
        if after is not None:
            after(message.row)


def publish(broker: BrokerProcess, messages, timeout_s: float = 30.0) -> int:
    options = parse_sink_options({"uri": broker.uri, "routingKey": "unused"})
    return ConfirmedPublisher(options.addresses, False, timeout_s, returned_row).run(messages)


def test_a_task_retried_after_a_lost_connection_adds_nothing_twice(fresh_broker):
    # The first attempt loses the broker (killed) after handing over 300 of 1,000
    # messages; the retry publishes all 1,000 with the same keys and the restarted
    # broker stores only those the first attempt did not get stored.
    queue = declare(fresh_broker.uri)
    pid = fresh_broker.process.pid

    def kill_at_300(row: int) -> None:
        if row == 300:
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(PublishError, match="the connection was lost"):
        publish(fresh_broker, outgoing(queue, 1000, after=kill_at_300))
    fresh_broker.restart()
    assert publish(fresh_broker, outgoing(queue, 1000)) == 1000
    assert bodies(fresh_broker.uri, queue) == [b"%d" % n for n in range(1000)]


def test_no_confirm_within_the_timeout_fails_the_task():
    # A disk alarm that never clears: as RabbitMQ does, the broker stops reading from
    # a connection once it publishes, so the confirms of what it has not read never come.
    with BrokerProcess(extra_config='disk_free_limit.absolute = "1000000GB"\n') as blocked:
        queue = declare(blocked.uri)
        with pytest.raises(PublishError, match=r"no publisher confirm arrived for \d+s \("
                                               r"option 'confirmTimeout' is 1s\) with \d+ "
                                               r"messages unconfirmed"):
            publish(blocked, outgoing(queue, 20_000), timeout_s=1.0)


def test_an_unreachable_broker_is_named_without_its_password():
    options = parse_sink_options({"uri": "amqp://guest:secret@127.0.0.1:1/%2F",
                                  "routingKey": "q"})
    publisher = ConfirmedPublisher(options.addresses, False, 5.0, returned_row)
    with pytest.raises(PublishError, match=r"cannot connect to the broker \(option 'uri'\): "
                                           r"amqp://guest:\*\*\*@127.0.0.1:1/%2F"):
        publisher.run(iter(()))


# ------------------------------------------------------------------ options and rows (pure)


def test_sink_options_defaults_and_spellings():
    options = parse_sink_options({"URI": "amqp://h/%2F,amqp://g/%2F", "routingkey": "orders",
                                  "checkpointLocation": "/tmp/x",
                                  "asyncProgressTrackingEnabled": "false"})
    assert options == SinkOptions(addresses=options.addresses, exchange="",
                                  routing_key="orders", mandatory=False,
                                  confirm_timeout_ms=30_000)
    assert [a.host for a in options.addresses] == ["h", "g"]
    assert parse_sink_options({"uri": "amqp://h", "confirmTimeout": "2m",
                               "mandatory": "TRUE", "exchange": "events"}).confirm_timeout_ms \
        == 120_000


@pytest.mark.parametrize("options, message", [
    ({"routingKey": "q"}, "option 'uri' is required"),
    ({"uri": "amqp://h", "confirmTimeout": "0"}, "option 'confirmTimeout' must be a positive "
                                                 "duration"),
    ({"uri": "amqp://h", "exchange": "e" * 256}, "option 'exchange' is longer than 255 bytes"),
    ({"uri": "amqp://h", "queue": "q"}, "unknown option 'queue' for the quorumqueue sink"),
    ({"uri": "amqp://h", "asyncProgressTrackingEnabled": "true"},
     "option 'asyncProgressTrackingEnabled' is not supported by the quorumqueue sink"),
])
def test_sink_options_refused(options, message):
    with pytest.raises(OptionError, match=escape(message)):
        parse_sink_options(options)


def test_rows_become_messages_with_growing_sequence_numbers():
    schema = StructType([StructField("body", StringType()), StructField("exchange", StringType()),
                         StructField("offset", LongType()), StructField("queue", StringType()),
                         StructField("headers", MapType(StringType(), StringType()))])
    options = parse_sink_options({"uri": "amqp://h", "exchange": "events", "routingKey": "k"})
    arrow = pa.schema([("body", pa.string()), ("exchange", pa.string()),
                       ("offset", pa.int64()), ("queue", pa.string()),
                       ("headers", pa.map_(pa.string(), pa.string()))])
    batches = [pa.record_batch([["a", "b"], [None, "other"], [1, 2], ["q", "q"],
                                [[("x-delivery-count", "2"), ("h", "1")], None]], schema=arrow),
               pa.record_batch([["c"], [None], [3], ["q"], [None]], schema=arrow)]
    key = IdempotencyKey("spark-query/abc/1", 7 << 32)
    messages = list(to_messages(batches, input_plan(schema, options), options, key))
    assert [(m.row, m.exchange, m.routing_key, m.body) for m in messages] == [
        (0, "events", "k", b"a"), (1, "other", "k", b"b"), (2, "events", "k", b"c")]
    assert messages[0].properties.headers == {"h": "1", PUBLISHER: "spark-query/abc/1",
                                              SEQ: (7 << 32) + 1}
    assert [m.properties.headers[SEQ] - (7 << 32) for m in messages] == [1, 2, 3]
    assert [returned_row(m.properties) for m in messages] == [0, 1, 2]
    assert {m.properties.delivery_mode for m in messages} == {2}


def test_rows_go_on_the_wire_as_pika_would_encode_them():
    # rows that share their properties share one encoded content header with their own
    # seq in it (sink_rows._Stamped); the bytes must be pika's for the same properties
    schema = StructType([StructField("body", BinaryType()), StructField("type", StringType()),
                         StructField("message_id", StringType()),
                         StructField("headers", MapType(StringType(), StringType()))])
    arrow = pa.schema([("body", pa.binary()), ("type", pa.string()),
                       ("message_id", pa.string()), ("headers", pa.map_(pa.string(), pa.string()))])
    rows = 200  # more distinct message ids than templates are kept for
    batch = pa.record_batch(
        [[b"x"] * rows, ["order" if n % 3 else None for n in range(rows)],
         [None if n < 100 else f"id-{n}" for n in range(rows)],
         [[("tenant", "acme")] if n % 2 else None for n in range(rows)]], schema=arrow)
    options = parse_sink_options({"uri": "amqp://h", "routingKey": "k"})
    key = IdempotencyKey("spark-query/abc/3", 3 << 32)
    messages = list(to_messages([batch], input_plan(schema, options), options, key))
    for n, message in enumerate(messages):
        expected = pika.BasicProperties(
            delivery_mode=2, type="order" if n % 3 else None,
            message_id=None if n < 100 else f"id-{n}",
            headers={**({"tenant": "acme"} if n % 2 else {}),
                     PUBLISHER: "spark-query/abc/3", SEQ: (3 << 32) + n + 1})
        assert b"".join(message.properties.encode()) == b"".join(expected.encode()), n
        assert message.properties.headers == expected.headers
        assert (message.properties.type, message.properties.message_id) == (
            expected.type, expected.message_id)


@pytest.mark.parametrize("column, arrow_type, value, message", [
    ("body", pa.binary(), None, "row 0 of this task: column 'body' is null"),
    ("delivery_mode", pa.int32(), 3, "column 'delivery_mode' must be 1 (transient) or 2"),
    ("priority", pa.int64(), 256, "column 'priority' must be 0..255"),
])
def test_a_row_amqp_cannot_carry_fails_naming_row_and_column(column, arrow_type, value,
                                                             message):
    spark_types = {"body": BinaryType(), "delivery_mode": IntegerType(), "priority": LongType()}
    names = ["body"] if column == "body" else ["body", column]
    schema = StructType([StructField(name, spark_types[name]) for name in names])
    columns = [pa.array([value], arrow_type)] if column == "body" else [
        pa.array([b"x"]), pa.array([value], arrow_type)]
    batch = pa.record_batch(columns, names=names)
    options = parse_sink_options({"uri": "amqp://h", "routingKey": "k"})
    with pytest.raises(RowError, match=escape(message)):
        list(to_messages([batch], input_plan(schema, options), options,
                         IdempotencyKey("p", 0)))


@pytest.mark.parametrize("mandatory", [False, True])
def test_messages_go_on_the_wire_as_pikas_basic_publish_sends_them(mandatory):
    # the publisher writes a fill's frames at once instead of calling basic_publish per
    # message; the bytes must be those pika's basic_publish sends: method, content
    # header, and the body split at the frame size (an empty body: no body frame)
    from types import SimpleNamespace

    from pika.connection import Connection

    options = parse_sink_options({"uri": "amqp://h", "routingKey": "k"})
    plain = pika.BasicProperties(delivery_mode=2, content_type="text/plain",
                                 headers={"tenant": "acme", "n": 7})
    rows = [("", "orders", b"", plain), ("events", "k" * 255, b"x" * 99, plain),
            ("", "orders", b"y" * 100, pika.BasicProperties()), ("", "q", b"z" * 250, plain),
            *(("", "k", m.body, m.properties) for m in outgoing("k", 3))]
    messages = [Outgoing(n, *row) for n, row in enumerate(rows)]
    publisher = ConfirmedPublisher(options.addresses, mandatory, 1.0, returned_row)
    publisher._channel = SimpleNamespace(channel_number=5)
    publisher._body_max = 100
    ours: list[bytes] = []
    for message in messages:
        publisher._encode(message, ours)
    pikas: list[bytes] = []
    pika_connection = SimpleNamespace(_body_max_length=100,
                                      _output_marshaled_frames=pikas.extend)
    for message in messages:
        Connection._send_message(pika_connection, 5, pika.spec.Basic.Publish(
            exchange=message.exchange, routing_key=message.routing_key, mandatory=mandatory),
            (message.properties, message.body))
    assert b"".join(ours) == b"".join(pikas)


def test_a_routing_key_amqp_cannot_carry_fails_naming_the_row():
    from types import SimpleNamespace

    options = parse_sink_options({"uri": "amqp://h", "routingKey": "k"})
    publisher = ConfirmedPublisher(options.addresses, False, 1.0, returned_row)
    publisher._channel = SimpleNamespace(channel_number=1, is_open=True)
    publisher._connection = SimpleNamespace(_output_marshaled_frames=lambda frames: None)
    publisher._body_max = 100
    publisher._messages = iter([Outgoing(0, "", "ok", b"a", pika.BasicProperties()),
                                Outgoing(1, "", "k" * 256, b"b", pika.BasicProperties())])
    with pytest.raises(ValueError, match=escape("row 1 of this task cannot be sent as an "
                                                "AMQP message")):
        publisher._fill()


def test_rows_without_property_columns_are_encoded_as_pika_would():
    # the common shape (a body, maybe exchange/routing_key): one shared header
    schema = StructType([StructField("body", StringType()),
                         StructField("routing_key", StringType())])
    arrow = pa.schema([("body", pa.string()), ("routing_key", pa.string())])
    batches = [pa.record_batch([["a", "b"], ["k1", None]], schema=arrow),
               pa.record_batch([["c", None], [None, None]], schema=arrow)]
    options = parse_sink_options({"uri": "amqp://h", "routingKey": "fallback"})
    # a seq beyond 32 bits, which pika encodes as the stamp's 'l' field (df.write's seqs
    # start at 1: the stamp keeps 'l', where pika would choose a 32-bit 'I')
    key = IdempotencyKey("spark-write/w/0", 5 << 32)
    messages = to_messages(batches, input_plan(schema, options), options, key)
    for n, expected_key in enumerate(["k1", "fallback", "fallback"]):
        message = next(messages)
        expected = pika.BasicProperties(delivery_mode=2, headers={
            PUBLISHER: "spark-write/w/0", SEQ: (5 << 32) + n + 1})
        assert (message.row, message.exchange, message.routing_key, message.body) == (
            n, "", expected_key, "abc"[n].encode())
        assert b"".join(message.properties.encode()) == b"".join(expected.encode())
        assert message.properties.headers == expected.headers
        assert message.properties.delivery_mode == 2
    with pytest.raises(RowError, match=escape("row 3 of this task: column 'body' is null")):
        next(messages)



@pytest.mark.parametrize("base", [0, 5 << 32])
def test_the_broker_reads_a_sink_rows_key_in_place(base):
    # the broker's fast path for keyed publishes (broker/amqp/properties.py,
    # `_sink_key`) takes exactly the table the sink writes: publisher, then the seq
    # as 'l' (also for df.write's small seqs); if the sink's bytes ever change, the
    # broker falls back to walking the table, correct but slower: this says so
    from quorumqueue.broker.amqp.properties import (_sink_key, decode_properties,
                                                    publisher_sequence)

    schema = StructType([StructField("body", BinaryType())])
    batch = pa.record_batch([[b"x", b"y"]], names=["body"])
    options = parse_sink_options({"uri": "amqp://h", "routingKey": "k"})
    key = IdempotencyKey("spark-write/w/2", base)
    for n, message in enumerate(to_messages([batch], input_plan(schema, options), options, key)):
        payload = (struct.pack(">HHQ", 60, 0, len(message.body))
                   + b"".join(message.properties.encode()))
        properties = decode_properties(payload)[1]
        assert _sink_key(properties.raw, properties.headers_at) == ("spark-write/w/2",
                                                                    base + n + 1)
        assert publisher_sequence(properties) == ("spark-write/w/2", base + n + 1)

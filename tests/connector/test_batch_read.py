"""Batch reads (connector/batch_reader.py): `spark.read.format("quorumqueue")`.

A drain reads up to `maxMessages` per queue and settles them: they are gone from the
queue; a peek (`peek` = true) reads them and returns them to the queue, redelivered.
Lease mode (the bundled broker) reads through a fresh lease; consume mode (RabbitMQ,
or the bundled broker with `mode` = `consume`) through basic.get. Real local Spark.
"""

from __future__ import annotations

import json

import pika
import pytest

from quorumqueue.connector.schema import SCHEMA

from .queues import quorum_queue, ready, unique

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["lease", "consume", "rabbitmq"])
def target(request) -> tuple[str, dict]:
    """(uri, options) of each way to read: the bundled broker in both modes, RabbitMQ."""
    if request.param == "rabbitmq":
        return request.getfixturevalue("rabbitmq").uri, {}
    return request.getfixturevalue("broker").uri, {"mode": request.param}


def read(spark, uri: str, queue: str, **options):
    reader = spark.read.format("quorumqueue").option("uri", uri).option("queue", queue)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()



def orders(rows) -> list[int]:
    return sorted(json.loads(row.body)["order"] for row in rows)


def test_drain_reads_up_to_max_messages_and_settles_them(spark, target):
    uri, mode = target
    queue = quorum_queue(uri, 12)
    frame = read(spark, uri, queue, maxMessages="5", **mode)
    assert not frame.isStreaming and frame.schema == SCHEMA
    rows = frame.collect()
    assert orders(rows) == [0, 1, 2, 3, 4]
    assert sorted(row.offset for row in rows) == [1, 2, 3, 4, 5]
    assert ready(uri, queue) == 7
    # every action reads again: the next messages, then what is left
    assert orders(frame.collect()) == [5, 6, 7, 8, 9]
    assert orders(read(spark, uri, queue, maxMessages="100", **mode).collect()) == [10, 11]
    assert ready(uri, queue) == 0
    assert read(spark, uri, queue, maxMessages="5", **mode).count() == 0


def test_peek_returns_what_it_read_to_the_queue(spark, target):
    uri, mode = target
    queue = quorum_queue(uri, 6)
    rows = read(spark, uri, queue, maxMessages="4", peek="true", **mode).collect()
    assert orders(rows) == [0, 1, 2, 3]
    assert not any(row.redelivered for row in rows)
    assert ready(uri, queue) == 6
    again = read(spark, uri, queue, maxMessages="10", **mode).collect()  # now drain
    assert orders(again) == list(range(6))
    assert ready(uri, queue) == 0


def test_several_queues_are_read_in_one_frame(spark, broker):
    first, second = quorum_queue(broker.uri, 3, "a"), quorum_queue(broker.uri, 4, "b")
    rows = read(spark, broker.uri, f"{first},{second}", maxMessages="10").collect()
    assert sorted((row.queue, row.offset) for row in rows) == (
        [(first, n) for n in (1, 2, 3)] + [(second, n) for n in (1, 2, 3, 4)])


def test_a_classic_queue_in_lease_mode_says_to_use_consume_mode(spark, broker):
    classic = unique("classic")
    connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
    connection.channel().queue_declare(classic, durable=True)
    connection.close()
    with pytest.raises(Exception, match="cannot be read in lease mode.*set option 'mode' "
                                        "to 'consume'"):
        read(spark, broker.uri, classic, maxMessages="5").collect()


@pytest.mark.parametrize("options, message", [
    ({}, "option 'maxMessages' is required for a batch read"),
    ({"maxMessages": "0"}, "option 'maxMessages' must be a positive integer"),
    ({"maxMessages": "5", "peek": "maybe"}, "option 'peek' must be true or false"),
    ({"maxMessages": "5", "maxMessagesPerTrigger": "5"},
     "option 'maxMessagesPerTrigger' is an option of streaming reads"),
])
def test_bad_batch_options_are_named(spark, broker, options, message):
    with pytest.raises(Exception, match=message):
        read(spark, broker.uri, "orders", **options).collect()


def test_a_stream_refuses_the_batch_options(spark, broker):
    frame = (spark.readStream.format("quorumqueue").option("uri", broker.uri)
             .option("queue", "orders").option("maxMessages", "5").load())
    with pytest.raises(Exception, match="option 'maxMessages' is an option of batch reads"):
        frame.writeStream.format("memory").queryName("refused").start().awaitTermination(30)

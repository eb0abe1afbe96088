"""Durable leases over AMQP (broker/README.md "Leases"), as the Spark connector uses them.

A lease is grown by a logged command, so its ranges are fixed; reading a range any
number of times, from any connection, before or after a crash, gives the same bytes
in the same order; settling removes messages for good; releasing (or idling past the
timeout) returns them to the queue for ordinary consumers, delivery count + 1.
"""

from __future__ import annotations

import time

import pika
import pytest

from broker.lease_client import LeaseClient
from broker.management_client import ManagementError

from .pika_support import channel_error, connect, unique

pytestmark = pytest.mark.timeout(60)


def quorum_queue_with(broker, count: int, prefix: str = "lease") -> str:
    name = unique(prefix)
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    for number in range(count):
        channel.basic_publish(
            "", name, f"message {number} ".encode() + bytes([number % 256]) * number,
            pika.BasicProperties(delivery_mode=2, content_type="application/octet-stream",
                                 message_id=f"id-{number}", headers={"n": number}))
    connection.close()
    return name


def snapshot(messages) -> list[tuple]:
    return [(m.seq, m.body, m.exchange, m.routing_key, m.properties.message_id,
             m.properties.content_type, m.properties.headers.get("n")) for m in messages]


def test_a_grown_range_reads_back_identically_any_number_of_times(broker):
    queue = quorum_queue_with(broker, 30)
    with LeaseClient(broker.uri) as client:
        assert client.grow(queue, "q1", max_messages=10) == (1, 10)
        assert client.grow(queue, "q1", max_messages=10) == (11, 20)
        first = client.read(queue, "q1", 0, 20)
        assert [m.seq for m in first] == list(range(1, 21))
        assert [m.properties.message_id for m in first] == [f"id-{n}" for n in range(20)]
        assert snapshot(client.read(queue, "q1", 0, 20)) == snapshot(first)
        assert snapshot(client.read(queue, "q1", 5, 12)) == snapshot(first[5:12])
    with LeaseClient(broker.uri) as other:  # the lease outlives the connection
        assert snapshot(other.read(queue, "q1", 10, 20)) == snapshot(first[10:20])
        assert other.info(queue, "q1") == {"first": 1, "end": 20, "timeout_ms": 0}


def test_leased_messages_are_not_delivered_to_consumers_and_settle_removes_them(broker):
    queue = quorum_queue_with(broker, 6)
    with LeaseClient(broker.uri) as client:
        assert client.grow(queue, "q", max_messages=4) == (1, 4)
        connection = connect(broker)
        channel = connection.channel()
        declared = channel.queue_declare(queue, passive=True).method
        assert declared.message_count == 2  # only the unleased ones are ready
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        assert body.startswith(b"message 4 ")
        assert client.settle(queue, "q", 3) == 3
        assert client.info(queue, "q")["first"] == 4
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            client.read(queue, "q", 0, 4)
        assert info.value.reply_code == 406 and "settled" in info.value.reply_text
        connection.close()


def test_release_returns_unsettled_messages_to_consumers_with_a_delivery_count(broker):
    queue = quorum_queue_with(broker, 5)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "q", max_messages=5)
        client.settle(queue, "q", 2)
        assert client.release(queue, "q") == 3
        # offsets never go backwards: the next grow continues after the old end
        connection = connect(broker)
        channel = connection.channel()
        seen = []
        for _ in range(3):
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            seen.append((body.split(b" ")[1], method.redelivered,
                         properties.headers.get("x-delivery-count")))
        assert seen == [(b"2", True, 1), (b"3", True, 1), (b"4", True, 1)]
        connection.close()
        assert client.grow(queue, "q", max_messages=5) == (6, 5)  # nothing ready


def test_max_bytes_limits_a_grow(broker):
    queue = quorum_queue_with(broker, 10)
    with LeaseClient(broker.uri) as client:
        first, end = client.grow(queue, "q", max_messages=100, max_bytes=30)
        sizes = [len(m.body) for m in client.read(queue, "q", 0, end)]
        assert first == 1 and 1 <= end < 10
        assert sum(sizes[:-1]) < 30  # it stops once the byte budget is used up


def test_an_idle_lease_is_released_after_its_timeout(broker):
    queue = quorum_queue_with(broker, 3)
    with LeaseClient(broker.uri) as client:
        client.grow(queue, "idle", max_messages=3, timeout_ms=300)
        connection = connect(broker)
        channel = connection.channel()
        deadline = time.monotonic() + 10
        while channel.queue_declare(queue, passive=True).method.message_count < 3:
            assert time.monotonic() < deadline, "the idle lease was never released"
            time.sleep(0.1)
        connection.close()
        assert client.grow(queue, "idle", max_messages=3, timeout_ms=0) == (4, 6)


@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
def test_leases_and_their_ranges_survive_a_restart(fresh_broker, kill):
    queue = quorum_queue_with(fresh_broker, 12)
    with LeaseClient(fresh_broker.uri) as client:
        client.grow(queue, "q", max_messages=8)
        client.settle(queue, "q", 3)
        before = snapshot(client.read(queue, "q", 3, 8))
    fresh_broker.restart(kill=kill)
    with LeaseClient(fresh_broker.uri) as client:
        assert client.info(queue, "q") == {"first": 4, "end": 8, "timeout_ms": 0}
        assert snapshot(client.read(queue, "q", 3, 8)) == before
        assert client.grow(queue, "q", max_messages=100) == (9, 12)


def test_lease_errors_name_what_is_wrong(broker):
    queue = quorum_queue_with(broker, 1)
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(classic := unique("classic"))
    with LeaseClient(broker.uri) as client:
        with pytest.raises(ManagementError, match="NOT_FOUND - no queue 'nope'"):
            client.grow("nope", "q", max_messages=1)
        with pytest.raises(ManagementError, match="is not a quorum queue"):
            client.grow(classic, "q", max_messages=1)
        with pytest.raises(ManagementError, match="no lease 'ghost'"):
            client.info(queue, "ghost")
        with pytest.raises(ManagementError, match="max_messages"):
            client.call("lease.grow", queue=queue, lease="q", max_messages=-1)
    error = channel_error(lambda: channel.basic_consume(
        queue, lambda *a: None, auto_ack=True,
        arguments={"x-lease": "ghost", "x-lease-start": 0, "x-lease-end": 1}))
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - no lease 'ghost' on queue '{queue}' in vhost '/'")
    channel = connection.channel()
    error = channel_error(lambda: channel.basic_consume(
        queue, lambda *a: None, auto_ack=False,
        arguments={"x-lease": "q", "x-lease-start": 0, "x-lease-end": 1}))
    assert error.reply_code == 406 and "no-ack" in error.reply_text
    connection.close()

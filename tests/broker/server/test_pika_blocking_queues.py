"""Queues through pika's BlockingConnection, as in RabbitMQ: server-named, exclusive,
auto-delete, durable and transient queues; declare-ok counts; priorities and length
limits; purge and conditional delete; the last-declared-queue shortcut; argument
validation and equivalence on redeclare.
"""

from __future__ import annotations

import pika
import pytest

from .pika_support import (Collector, channel_error, connect, get_bodies, publish_bodies, pump,
                          ready_count, unique)

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- declaring


def test_server_named_queue(channel):
    """queue.declare with an empty name: the server picks an 'amq.gen-' name and
    returns it in declare-ok."""
    name = channel.queue_declare("", exclusive=True).method.queue
    assert name.startswith("amq.gen-")
    assert len(name) > len("amq.gen-") + 10
    assert channel.queue_declare(name, passive=True).method.queue == name


def test_exclusive_queue_is_locked_to_its_connection_and_deleted_on_close(broker):
    """queue.declare exclusive=true: other connections get 405 RESOURCE_LOCKED for
    every queue operation (but may publish to it); the queue is deleted when its
    owning connection closes."""
    name = unique("exclusive")
    owner = connect(broker)
    owner.channel().queue_declare(name, exclusive=True)
    other = connect(broker)
    try:
        for action in (lambda ch: ch.queue_declare(name, passive=True),
                       lambda ch: ch.queue_declare(name, exclusive=True),
                       lambda ch: ch.basic_consume(name, lambda *a: None),
                       lambda ch: ch.basic_get(name),
                       lambda ch: ch.queue_purge(name),
                       lambda ch: ch.queue_bind(name, "amq.fanout"),
                       lambda ch: ch.queue_delete(name)):
            channel = other.channel()
            error = channel_error(lambda: action(channel))
            assert error.reply_code == 405
            assert error.reply_text == (
                f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' "
                "in vhost '/'. It could be originally declared on another connection or the "
                "exclusive property value does not match that of the original declaration.")
        publisher = other.channel()   # publishing is not an access: it is routed there
        publisher.confirm_delivery()
        publisher.basic_publish("", name, b"for-the-owner")
        assert get_bodies(owner.channel(), name) == [b"for-the-owner"]
        owner.close()
        channel = other.channel()
        error = channel_error(lambda: channel.queue_declare(name, passive=True))
        assert error.reply_code == 404
        assert error.reply_text == f"NOT_FOUND - no queue '{name}' in vhost '/'"
    finally:
        other.close()
        if owner.is_open:
            owner.close()


def test_auto_delete_queue_goes_when_last_consumer_cancels(connection):
    """queue.declare auto-delete=true: deleted when its last consumer is cancelled
    (not before the first consumer, not while one remains)."""
    channel = connection.channel()
    name = unique("autodel")
    channel.queue_declare(name, auto_delete=True)
    first = channel.basic_consume(name, lambda *a: None)
    second = channel.basic_consume(name, lambda *a: None)
    channel.basic_cancel(first)
    assert channel.queue_declare(name, passive=True).method.consumer_count == 1
    channel.basic_cancel(second)
    error = channel_error(lambda: channel.queue_declare(name, passive=True))
    assert error.reply_code == 404


def test_auto_delete_queue_goes_when_consumer_channel_closes(connection):
    """auto-delete: closing the channel cancels its consumers, which deletes the
    queue; a queue that never had a consumer stays."""
    name, idle_name = unique("autodel-close"), unique("autodel-idle")
    channel = connection.channel()
    channel.queue_declare(name, auto_delete=True)
    channel.queue_declare(idle_name, auto_delete=True)
    channel.basic_consume(name, lambda *a: None)
    channel.close()
    channel = connection.channel()
    channel.queue_declare(idle_name, passive=True)
    error = channel_error(lambda: channel.queue_declare(name, passive=True))
    assert error.reply_code == 404
    connection.channel().queue_delete(idle_name)


def test_durable_and_transient_queues_are_not_equivalent(connection):
    """queue.declare: durable is part of the queue's identity; redeclaring with the
    other value is 406 with RabbitMQ's inequivalent-arg text."""
    channel = connection.channel()
    durable, transient = unique("durable"), unique("transient")
    channel.queue_declare(durable, durable=True)
    channel.queue_declare(transient, durable=False)
    channel.queue_declare(durable, durable=True)
    error = channel_error(lambda: channel.queue_declare(durable, durable=False))
    assert error.reply_code == 406
    assert error.reply_text == (f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue "
                                f"'{durable}' in vhost '/': received 'false' but current is "
                                "'true'")
    channel = connection.channel()
    error = channel_error(lambda: channel.queue_declare(transient, durable=True))
    assert error.reply_code == 406
    channel = connection.channel()
    channel.queue_delete(durable)
    channel.queue_delete(transient)


def test_declare_ok_reports_ready_messages_and_consumers(connection):
    """queue.declare-ok: message-count counts ready (not unacked) messages,
    consumer-count the consumers."""
    channel = connection.channel()
    channel.confirm_delivery()   # counts are exact once the publishes are confirmed
    name = unique("counts")
    channel.queue_declare(name, auto_delete=False)
    publish_bodies(channel, name, [b"1", b"2", b"3"])
    ok = channel.queue_declare(name).method
    assert (ok.message_count, ok.consumer_count) == (3, 0)
    consumer_channel = connection.channel()
    consumer_channel.basic_qos(prefetch_count=1)
    received = Collector()
    consumer_channel.basic_consume(name, received)
    pump(connection, lambda: len(received) == 1)
    ok = channel.queue_declare(name, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (2, 1)
    consumer_channel.close()
    channel.queue_delete(name)


def test_queue_amq_prefix_is_reserved_403(channel):
    """queue.declare: names starting with 'amq.' are reserved, 403 ACCESS_REFUSED."""
    error = channel_error(lambda: channel.queue_declare("amq.mine"))
    assert error.reply_code == 403
    assert error.reply_text == ("ACCESS_REFUSED - queue name 'amq.mine' contains reserved "
                                "prefix 'amq.*'")


def test_last_declared_queue_shortcut(connection):
    """AMQP queue name "" in queue.bind/purge/delete and basic.get means the channel's
    last declared queue; with none declared it is 404 'no previously declared queue'.
    A passive queue.declare of "" is not expanded (RabbitMQ: 404 no queue '')."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind("", "amq.direct")   # routing key "" means the queue's name too
    channel.basic_publish("amq.direct", queue, b"one")
    channel.basic_publish("amq.direct", queue, b"two")
    method, _, body = channel.basic_get("", auto_ack=True)
    assert (method.routing_key, body) == (queue, b"one")
    assert channel.queue_purge("").method.message_count == 1
    error = channel_error(lambda: channel.queue_declare("", passive=True))
    assert (error.reply_code, error.reply_text) == (404, "NOT_FOUND - no queue '' in vhost '/'")
    for action in (lambda ch: ch.basic_get(""), lambda ch: ch.queue_delete(""),
                   lambda ch: ch.queue_bind("", "amq.direct", "k")):
        channel = connection.channel()
        error = channel_error(lambda: action(channel))
        assert (error.reply_code, error.reply_text) == (
            404, "NOT_FOUND - no previously declared queue")


# ---------------------------------------------------------------- arguments


def test_queue_redeclare_with_other_arguments_is_406(connection):
    """queue.declare: the x-arguments RabbitMQ knows (x-max-length, ...) must match the
    existing queue's (406 with rabbit_misc's wording); unknown ones may differ."""
    channel = connection.channel()
    name = unique("args")
    channel.queue_declare(name, arguments={"x-max-length": 10, "x-custom": "a"})
    channel.queue_declare(name, arguments={"x-max-length": 10, "x-custom": "b"})
    channel.queue_declare(name, arguments={"x-max-length": 10})
    error = channel_error(lambda: channel.queue_declare(name, arguments={"x-max-length": 20}))
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{name}' in vhost "
        "'/': received '20' but current is '10'")
    channel = connection.channel()
    error = channel_error(lambda: channel.queue_declare(name))
    assert error.reply_code == 406
    assert error.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{name}' in vhost "
        "'/': received none but current is the value '10' of type 'signedint'")
    connection.channel().queue_delete(name)


INVALID_QUEUE_ARGUMENTS = [
    ({"x-max-priority": 256}, "x-max-priority", "{max_value_exceeded,256}"),
    ({"x-max-priority": -1}, "x-max-priority", "{value_negative,-1}"),
    ({"x-max-length": -1}, "x-max-length", "{value_negative,-1}"),
    ({"x-max-length": "5"}, "x-max-length", '"expected integer, got longstr"'),
    ({"x-max-length-bytes": True}, "x-max-length-bytes", '"expected integer, got bool"'),
    ({"x-max-priority": None}, "x-max-priority", '"expected integer, got void"'),
    ({"x-overflow": "bogus"}, "x-overflow", "invalid_overflow"),
    ({"x-overflow": 1}, "x-overflow", "{unacceptable_type,signedint}"),
    ({"x-queue-type": "bogus"}, "x-queue-type", "\"unsupported queue type 'bogus'\""),
    ({"x-queue-mode": "bogus"}, "x-queue-mode", "\"unsupported queue mode 'bogus'\""),
    ({"x-single-active-consumer": "yes"}, "x-single-active-consumer",
     "{unacceptable_type,longstr}"),
]


@pytest.mark.parametrize("arguments, key, detail", INVALID_QUEUE_ARGUMENTS)
def test_invalid_queue_arguments_are_406(channel, arguments, key, detail):
    """queue.declare validates the x-arguments it knows (RabbitMQ declare_args): 406
    with RabbitMQ's 'invalid arg' wording, and no queue is created."""
    name = unique("bad-args")
    error = channel_error(lambda: channel.queue_declare(name, arguments=arguments))
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/': "
        f"{detail}")


def test_priority_queue_delivers_highest_priority_first(channel):
    """x-max-priority (RabbitMQ priority queues): higher priorities first, FIFO within
    a priority, priorities above the maximum count as the maximum."""
    name = unique("prio")
    channel.queue_declare(name, exclusive=True, arguments={"x-max-priority": 5})
    sent = [(1, b"p1"), (0, b"p0"), (5, b"p5-a"), (3, b"p3"), (9, b"p9-as-5"), (5, b"p5-b")]
    for priority, body in sent:
        channel.basic_publish("", name, body, pika.BasicProperties(priority=priority))
    assert get_bodies(channel, name) == [b"p5-a", b"p9-as-5", b"p5-b", b"p3", b"p1", b"p0"]


def test_max_length_drops_from_the_head(channel):
    """x-max-length / x-max-length-bytes with the default overflow (drop-head): the
    oldest messages are dropped to make room."""
    by_count = channel.queue_declare("", exclusive=True, arguments={"x-max-length": 2})
    publish_bodies(channel, by_count.method.queue, [b"0", b"1", b"2", b"3"])
    assert get_bodies(channel, by_count.method.queue) == [b"2", b"3"]
    by_bytes = channel.queue_declare("", exclusive=True, arguments={"x-max-length-bytes": 5})
    publish_bodies(channel, by_bytes.method.queue, [b"abc", b"de", b"f"])
    assert get_bodies(channel, by_bytes.method.queue) == [b"de", b"f"]


# ---------------------------------------------------------------- purge and delete


def test_queue_purge_removes_ready_messages_only(connection):
    """queue.purge: returns the number of ready messages removed; unacked deliveries
    are not purged and come back when their channel closes."""
    channel = connection.channel()
    channel.confirm_delivery()
    name = unique("purge")
    channel.queue_declare(name)
    publish_bodies(channel, name, [b"a", b"b", b"c"])
    getter = connection.channel()
    method, _, body = getter.basic_get(name)
    assert body == b"a"
    assert channel.queue_purge(name).method.message_count == 2
    assert ready_count(channel, name) == 0
    getter.close()
    assert ready_count(channel, name) == 1
    method, _, body = channel.basic_get(name, auto_ack=True)
    assert (body, method.redelivered) == (b"a", True)
    channel.queue_delete(name)


def test_queue_delete_if_unused_and_if_empty(connection):
    """queue.delete: if-unused refuses a queue with consumers, if-empty one with
    messages (406); a plain delete returns the ready message count."""
    channel = connection.channel()
    name = unique("del")
    channel.queue_declare(name)
    tag = channel.basic_consume(name, lambda *a: None)
    error = channel_error(lambda: channel.queue_delete(name, if_unused=True))
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - queue '{name}' in vhost '/' in use"
    channel = connection.channel()
    publish_bodies(channel, name, [b"x", b"y"])
    error = channel_error(lambda: channel.queue_delete(name, if_empty=True))
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - queue '{name}' in vhost '/' not empty"
    del tag
    channel = connection.channel()
    assert channel.queue_delete(name).method.message_count == 2
    error = channel_error(lambda: channel.queue_declare(name, passive=True))
    assert error.reply_code == 404

"""Consuming through pika's BlockingConnection, as in RabbitMQ: basic.qos (per
consumer and global), consume and cancel, exclusive consumers, consumer priorities,
round-robin dispatch, basic.get, ack/nack/reject and requeueing, the redelivered
flag, basic.recover, delivery-tag errors and consumer-cancel notifications.
"""

from __future__ import annotations

import pytest
from pika import exceptions as pe

from .pika_support import (Collector, channel_error, get_bodies, idle, publish_bodies, pump,
                          ready_count, unique)

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- qos


def test_per_consumer_prefetch(connection):
    """basic.qos global=false (RabbitMQ): the limit applies to each new consumer."""
    channel = connection.channel()
    queues = [channel.queue_declare("", exclusive=True).method.queue for _ in range(2)]
    for queue in queues:
        publish_bodies(channel, queue, [b"m"] * 5)
    channel.basic_qos(prefetch_count=2)
    received = Collector()
    tags = [channel.basic_consume(queue, received) for queue in queues]
    pump(connection, lambda: len(received) == 4)
    idle(connection)
    assert sorted(d[0] for d in received.deliveries) == sorted(tags * 2)
    channel.basic_ack(received.deliveries[0][1])
    pump(connection, lambda: len(received) == 5)
    idle(connection)
    assert len(received) == 5


def test_global_prefetch_is_shared_by_the_channel(connection):
    """basic.qos global=true (RabbitMQ): one limit shared by all consumers of the
    channel."""
    channel = connection.channel()
    queues = [channel.queue_declare("", exclusive=True).method.queue for _ in range(2)]
    for queue in queues:
        publish_bodies(channel, queue, [b"m"] * 5)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    received = Collector()
    for queue in queues:
        channel.basic_consume(queue, received)
    pump(connection, lambda: len(received) == 3)
    idle(connection)
    assert len(received) == 3
    channel.basic_ack(received.deliveries[-1][1], multiple=True)
    pump(connection, lambda: len(received) == 6)
    idle(connection)
    assert len(received) == 6


def test_per_consumer_and_global_prefetch_combine(connection):
    """RabbitMQ applies both limits when both are set: each consumer stops at its own
    prefetch and all of them together at the channel's global one."""
    channel = connection.channel()
    queues = [channel.queue_declare("", exclusive=True).method.queue for _ in range(2)]
    for queue in queues:
        publish_bodies(channel, queue, [b"m"] * 5)
    channel.basic_qos(prefetch_count=2)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    received = Collector()
    first, second = [channel.basic_consume(queue, received) for queue in queues]
    pump(connection, lambda: len(received) == 3)
    idle(connection)
    assert [d[0] for d in received.deliveries] == [first, first, second]


def test_prefetch_changes_apply_as_in_rabbitmq(connection):
    """basic.qos global=false only affects consumers created afterwards; a new
    global=true limit applies at once (raising it delivers more right away)."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    publish_bodies(channel, queue, [b"m"] * 10)
    channel.basic_qos(prefetch_count=2)
    received = Collector()
    channel.basic_consume(queue, received)
    pump(connection, lambda: len(received) == 2)
    channel.basic_qos(prefetch_count=5)          # not for the existing consumer
    idle(connection)
    assert len(received) == 2
    channel.basic_qos(prefetch_count=4, global_qos=True)
    channel.basic_ack(received.deliveries[-1][1], multiple=True)
    pump(connection, lambda: len(received) == 4)
    idle(connection)
    assert len(received) == 4


def test_prefetch_size_is_not_implemented_540(connection):
    """basic.qos prefetch-size != 0: RabbitMQ closes the connection with 540."""
    channel = connection.channel()
    with pytest.raises(pe.ConnectionClosedByBroker) as info:
        channel.basic_qos(prefetch_size=4096)
    assert (info.value.reply_code, info.value.reply_text) == (
        540, "NOT_IMPLEMENTED - prefetch_size!=0 (4096)")


# ---------------------------------------------------------------- consumers


def test_consume_then_cancel_stops_deliveries(connection):
    """basic.consume / basic.cancel: after cancel-ok no more deliveries to that tag."""
    channel = connection.channel()
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True).method.queue
    received = Collector()
    tag = channel.basic_consume(queue, received, auto_ack=True)
    publish_bodies(channel, queue, [b"1", b"2"])
    pump(connection, lambda: len(received) == 2)
    assert received.bodies == [b"1", b"2"]
    assert {d[0] for d in received.deliveries} == {tag}
    channel.basic_cancel(tag)
    publish_bodies(channel, queue, [b"3"])
    idle(connection)
    assert len(received) == 2
    assert ready_count(channel, queue) == 1


def test_cancelled_consumer_deliveries_can_still_be_acked(connection):
    """basic.cancel does not requeue what the consumer already received; those
    deliveries stay unacked on the channel and can be acked afterwards."""
    channel = connection.channel()
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True).method.queue
    publish_bodies(channel, queue, [b"1", b"2", b"3"])
    received = Collector()
    tag = channel.basic_consume(queue, received)
    pump(connection, lambda: len(received) == 3)
    channel.basic_cancel(tag)
    assert ready_count(channel, queue) == 0
    for delivery in received.deliveries:
        channel.basic_ack(delivery[1])
    channel.close()
    assert ready_count(connection.channel(), queue) == 0


def test_exclusive_consumer_refuses_others_403(connection):
    """basic.consume exclusive=true: no other consumer may join (403), and an exclusive
    consumer cannot join a queue that already has consumers."""
    channel = connection.channel()
    busy = channel.queue_declare("", exclusive=True).method.queue
    locked = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_consume(locked, lambda *a: None, exclusive=True)
    error = channel_error(lambda: channel.basic_consume(locked, lambda *a: None))
    assert error.reply_code == 403
    assert error.reply_text == f"ACCESS_REFUSED - queue '{locked}' in vhost '/' in exclusive use"
    channel = connection.channel()
    channel.basic_consume(busy, lambda *a: None)
    error = channel_error(lambda: channel.basic_consume(busy, lambda *a: None, exclusive=True))
    assert error.reply_code == 403
    assert error.reply_text == f"ACCESS_REFUSED - queue '{busy}' in vhost '/' in exclusive use"


def test_invalid_consumer_priority_is_406(channel):
    """basic.consume x-priority must be an integer (RabbitMQ consume_args): 406 naming
    the queue."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    error = channel_error(lambda: channel.basic_consume(queue, lambda *a: None,
                                                        arguments={"x-priority": "high"}))
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{queue}' in vhost "
        "'/': \"expected integer, got longstr\"")


def test_consumer_priorities(connection):
    """Consumer priorities (x-priority, RabbitMQ): the highest-priority consumer gets
    messages while it has prefetch capacity; lower ones only when it is full."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_qos(prefetch_count=2)
    received = Collector()
    low = channel.basic_consume(queue, received, arguments={"x-priority": 1})
    high = channel.basic_consume(queue, received, arguments={"x-priority": 10})
    publish_bodies(channel, queue, [b"1", b"2", b"3"])
    pump(connection, lambda: len(received) == 3)
    assert [(d[0], d[3]) for d in received.deliveries] == [(high, b"1"), (high, b"2"),
                                                           (low, b"3")]


def test_round_robin_among_consumers(connection):
    """RabbitMQ delivers a queue's messages round-robin among its consumers (equal
    priority, within prefetch)."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    received = Collector()
    tags = [channel.basic_consume(queue, received, auto_ack=True) for _ in range(3)]
    publish_bodies(channel, queue, [str(i).encode() for i in range(9)])
    pump(connection, lambda: len(received) == 9)
    per_consumer = {tag: [d[3] for d in received.deliveries if d[0] == tag] for tag in tags}
    assert sorted(len(bodies) for bodies in per_consumer.values()) == [3, 3, 3]
    order = [d[0] for d in received.deliveries]
    assert order[:3] == order[3:6] == order[6:]


def test_fair_dispatch_with_prefetch_one(connection):
    """basic.qos prefetch=1: a busy consumer (unacked delivery) is skipped; the other
    consumers take the queue's messages."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_qos(prefetch_count=1)
    slow, fast = Collector(), Collector()
    channel.basic_consume(queue, slow)
    channel.basic_consume(queue, fast)
    publish_bodies(channel, queue, [b"1", b"2"])
    pump(connection, lambda: len(slow) == 1 and len(fast) == 1)
    publish_bodies(channel, queue, [b"3", b"4"])
    for _ in range(2):
        channel.basic_ack(fast.deliveries[-1][1])
        count = len(fast)
        pump(connection, lambda: len(fast) == count + 1)
    idle(connection)
    assert slow.bodies == [b"1"]
    assert fast.bodies == [b"2", b"3", b"4"]


def test_consumer_cancel_notification_when_queue_is_deleted(connection):
    """consumer_cancel_notify (RabbitMQ): deleting a consumed queue sends basic.cancel
    to the consumer; pika calls the channel's on-cancel callback."""
    channel = connection.channel()
    name = unique("cancelled")
    channel.queue_declare(name)
    cancelled = []
    channel.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = channel.basic_consume(name, lambda *a: None)
    connection.channel().queue_delete(name)
    pump(connection, lambda: cancelled)
    assert cancelled == [tag]
    assert channel.is_open
    assert channel.consumer_tags == []


# ---------------------------------------------------------------- get, acks and redelivery


def test_basic_get_and_get_empty(channel):
    """basic.get: get-ok carries the remaining message count; an empty queue answers
    get-empty (pika returns (None, None, None))."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    assert channel.basic_get(queue) == (None, None, None)
    publish_bodies(channel, queue, [b"a", b"b"], content_type="text/plain")
    method, properties, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.message_count, method.redelivered) == (b"a", 1, False)
    assert (method.exchange, method.routing_key) == ("", queue)
    assert properties.content_type == "text/plain"
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (body, method.message_count) == (b"b", 0)
    assert channel.basic_get(queue) == (None, None, None)


def test_ack_nack_reject_with_multiple_and_requeue(connection):
    """basic.ack/nack multiple=true settle every unacked tag up to the given one;
    requeued messages come back in their original order with redelivered=true;
    reject/nack without requeue drop the message."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    publish_bodies(channel, queue, [str(i).encode() for i in range(1, 8)])
    tags = [channel.basic_get(queue)[0].delivery_tag for _ in range(7)]
    channel.basic_ack(tags[2], multiple=True)            # 1, 2, 3 acked
    channel.basic_nack(tags[4], multiple=True, requeue=True)   # 4, 5 back
    channel.basic_reject(tags[5], requeue=False)          # 6 dropped
    channel.basic_nack(tags[6], requeue=False)            # 7 dropped
    method, _, body = channel.basic_get(queue)
    assert (body, method.redelivered) == (b"4", True)
    channel.basic_reject(method.delivery_tag, requeue=True)
    redelivered = []
    while True:
        method, _, body = channel.basic_get(queue)
        if method is None:
            break
        redelivered.append((body, method.redelivered))
        channel.basic_ack(method.delivery_tag)
    assert redelivered == [(b"4", True), (b"5", True)]


def test_ack_and_nack_multiple_with_tag_zero_settle_everything(channel):
    """basic.ack/nack multiple=true with delivery-tag 0: every outstanding delivery."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    publish_bodies(channel, queue, [b"0", b"1", b"2"])
    for _ in range(3):
        channel.basic_get(queue)
    channel.basic_nack(0, multiple=True, requeue=True)
    redelivered = [channel.basic_get(queue) for _ in range(3)]
    assert [(m.redelivered, body) for m, _, body in redelivered] == [
        (True, b"0"), (True, b"1"), (True, b"2")]
    channel.basic_ack(0, multiple=True)
    assert ready_count(channel, queue) == 0
    channel.close()


def test_requeued_messages_keep_their_queue_position(channel):
    """A requeued message goes back to its original position (RabbitMQ 2.7+), ahead of
    messages published after it."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    publish_bodies(channel, queue, [str(i).encode() for i in range(5)])
    tags = [channel.basic_get(queue)[0].delivery_tag for _ in range(3)]
    channel.basic_nack(tags[1], requeue=True)
    channel.basic_nack(tags[0], requeue=True)
    channel.basic_ack(tags[2])
    assert get_bodies(channel, queue) == [b"0", b"1", b"3", b"4"]


def test_redelivered_flag_after_channel_close(connection):
    """Unacked deliveries return to the queue when their channel closes and are then
    delivered with redelivered=true (AMQP basic.deliver 'redelivered')."""
    first = connection.channel()
    queue = first.queue_declare("", exclusive=True).method.queue
    publish_bodies(first, queue, [b"once"])
    method, _, _ = first.basic_get(queue)
    assert not method.redelivered
    first.close()
    method, _, body = connection.channel().basic_get(queue, auto_ack=True)
    assert (body, method.redelivered) == (b"once", True)


def test_basic_recover_redelivers_unacked(connection):
    """basic.recover requeue=true: every unacked delivery of the channel is requeued
    and redelivered with redelivered=true."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    received = Collector()
    channel.basic_consume(queue, received)
    publish_bodies(channel, queue, [b"a", b"b"])
    pump(connection, lambda: len(received) == 2)
    channel.basic_recover(requeue=True)
    pump(connection, lambda: len(received) == 4)
    assert [(d[3], d[2]) for d in received.deliveries] == [
        (b"a", False), (b"b", False), (b"a", True), (b"b", True)]
    assert received.deliveries[2][1] > received.deliveries[1][1]


def test_ack_of_unknown_delivery_tag_is_406(channel):
    """basic.ack of a tag that was never delivered: channel closed 406 PRECONDITION_FAILED
    'unknown delivery tag'."""
    channel.basic_ack(42)
    error = channel_error(lambda: channel.queue_declare("", exclusive=True))
    assert error.reply_code == 406
    assert error.reply_text == "PRECONDITION_FAILED - unknown delivery tag 42"


def test_double_ack_is_406(channel):
    """basic.ack of a tag already acked is an unknown delivery tag (406)."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    publish_bodies(channel, queue, [b"x"])
    method, _, _ = channel.basic_get(queue)
    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(method.delivery_tag)
    error = channel_error(lambda: channel.queue_declare("", exclusive=True))
    assert error.reply_code == 406
    assert error.reply_text == f"PRECONDITION_FAILED - unknown delivery tag {method.delivery_tag}"

"""Quorum queues (x-queue-type: quorum) through pika's BlockingConnection, as a user of
RabbitMQ 4.x observes them. The spec is RabbitMQ 4.2's quorum queues guide and, for
what 4.2 keeps, the 3.x edition; where RabbitMQ's source settles a
detail the guide leaves open, the docstring says so.

Sections: declaring ("Declaring", feature matrix: always durable, never exclusive or
auto-delete), publishing and consuming (confirms, manual acks, basic.get), poison
message handling (x-delivery-count, delivery limits, "Repeated Requeues"), consumers
(prefetch, consumer priority, cancel, channel close), message priorities ("Priorities":
two levels served 2:1), global QoS, purge and delete, no-ack, transactions and fanout,
wire fidelity of redeliveries, and restarts.

Every test declares its own queues (unique names) on the module's broker; only the
restart tests start a broker of their own.
"""

from __future__ import annotations

import signal
import struct
import time

import pika
import pytest
from pamqp import commands as amqp
from pamqp import encode as pamqp_encode
from pika import exceptions as pe
from pika.compat import long

from tests.differential.probe import Probe

from .pika_support import Collector, channel_error, connect, idle, publish_bodies, pump, unique

pytestmark = pytest.mark.timeout(60)

QUORUM = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def quorum_queue(channel, prefix: str, **arguments) -> str:
    """Declare a quorum queue with a unique name (durable, as quorum queues must be)."""
    name = unique(prefix)
    channel.queue_declare(name, durable=True, arguments={**QUORUM, **arguments})
    return name


def confirmed_channel(connection):
    """A channel in confirm mode: basic_publish returns once the broker confirmed."""
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def counts(channel, queue: str) -> tuple[int, int]:
    ok = channel.queue_declare(queue, passive=True).method
    return ok.message_count, ok.consumer_count


def get(channel, queue: str, auto_ack: bool = False):
    """basic.get that must find a message: (method, properties, body)."""
    method, properties, body = channel.basic_get(queue, auto_ack=auto_ack)
    assert method is not None, f"basic.get on '{queue}': get-empty"
    return method, properties, body


def delivery_count(properties) -> int | None:
    return (properties.headers or {}).get("x-delivery-count")


def drain(channel, queue: str) -> list[tuple[bytes, bool, int | None]]:
    """Every ready message, auto-acked: (body, redelivered, x-delivery-count)."""
    seen = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return seen
        seen.append((body, method.redelivered, delivery_count(properties)))


# ================================================================ declaring


def test_declare_ok_counts_ready_messages_and_consumers(connection):
    """queue.declare-ok of a quorum queue: message-count is the ready messages (not the
    one delivered and unacked), consumer-count the consumers."""
    channel = confirmed_channel(connection)
    name = unique("qq-counts")
    ok = channel.queue_declare(name, durable=True, arguments=QUORUM).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
    publish_bodies(channel, name, [b"1", b"2", b"3"])
    assert counts(channel, name) == (3, 0)
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    received = Collector()
    consumer.basic_consume(name, received)
    pump(connection, lambda: len(received) == 1)
    ok = channel.queue_declare(name, durable=True, arguments=QUORUM).method
    assert (ok.message_count, ok.consumer_count) == (2, 1)


def test_redeclare_with_the_same_properties_is_equivalent(channel):
    """Redeclaring with the same durable flag and x-arguments (x-delivery-limit too)
    is declare-ok; passive declare needs neither."""
    arguments = {**QUORUM, "x-delivery-limit": 5}
    name = unique("qq-same")
    channel.queue_declare(name, durable=True, arguments=arguments)
    assert channel.queue_declare(name, durable=True, arguments=arguments).method.queue == name
    assert channel.queue_declare(name, passive=True).method.queue == name


INEQUIVALENT_REDECLARATIONS = [
    pytest.param({"durable": True, "arguments": {"x-queue-type": "classic",
                                                 "x-delivery-limit": 5}},
                 "inequivalent arg 'x-queue-type' for {q}: received 'classic' but current "
                 "is 'quorum'", id="as-classic"),
    pytest.param({"durable": True, "arguments": {"x-delivery-limit": 5}},
                 "inequivalent arg 'x-queue-type' for {q}: received none but current is the "
                 "value 'quorum' of type 'longstr'", id="without-type"),
    pytest.param({"durable": True, "arguments": {**QUORUM, "x-delivery-limit": 6}},
                 "inequivalent arg 'x-delivery-limit' for {q}: received '6' but current is "
                 "'5'", id="other-delivery-limit"),
    pytest.param({"durable": True, "arguments": QUORUM},
                 "inequivalent arg 'x-delivery-limit' for {q}: received none but current is "
                 "the value '5' of type 'signedint'", id="without-delivery-limit"),
    pytest.param({"durable": False, "arguments": {**QUORUM, "x-delivery-limit": 5}},
                 "inequivalent arg 'durable' for {q}: received 'false' but current is 'true'",
                 id="non-durable"),
    pytest.param({"durable": True, "auto_delete": True,
                  "arguments": {**QUORUM, "x-delivery-limit": 5}},
                 "inequivalent arg 'auto_delete' for {q}: received 'true' but current is "
                 "'false'", id="auto-delete"),
]


@pytest.mark.parametrize("options, detail", INEQUIVALENT_REDECLARATIONS)
def test_redeclare_with_other_properties_is_406(connection, options, detail):
    """Redeclaring an existing quorum queue with another type, durable or auto-delete
    flag, or x-delivery-limit: 406 with rabbit_misc's inequivalent-arg text (RabbitMQ
    4.x compares every argument a quorum queue knows, x-delivery-limit included; 3.10.8
    answers the same)."""
    name = unique("qq-ineq")
    connection.channel().queue_declare(name, durable=True,
                                       arguments={**QUORUM, "x-delivery-limit": 5})
    channel = connection.channel()
    error = channel_error(lambda: channel.queue_declare(name, **options))
    assert (error.reply_code, error.reply_text) == (
        406, "PRECONDITION_FAILED - " + detail.format(q=f"queue '{name}' in vhost '/'"))


REFUSED_FLAGS = [
    # rabbit_quorum_queue:declare checks auto-delete, then exclusive, then durable
    pytest.param({"durable": False}, "non-durable", id="non-durable"),
    pytest.param({"durable": False, "exclusive": True}, "exclusive-owner",
                 id="exclusive-pika-default"),
    pytest.param({"durable": True, "exclusive": True}, "exclusive-owner", id="exclusive"),
    pytest.param({"durable": False, "auto_delete": True}, "auto-delete",
                 id="auto-delete-pika-default"),
    pytest.param({"durable": True, "auto_delete": True}, "auto-delete", id="auto-delete"),
    pytest.param({"durable": True, "auto_delete": True, "exclusive": True}, "auto-delete",
                 id="auto-delete-and-exclusive"),
]


@pytest.mark.parametrize("flags, prop", REFUSED_FLAGS)
def test_non_durable_exclusive_and_auto_delete_are_refused(connection, flags, prop):
    """Feature matrix: quorum queues are always durable, never exclusive; nor can they
    be auto-delete. 406 "invalid property '...'" naming the first failed check in
    RabbitMQ's order (auto-delete, exclusive, non-durable), and no queue is created;
    the connection stays usable."""
    name = unique("qq-refused")
    channel = connection.channel()
    error = channel_error(lambda: channel.queue_declare(name, arguments=QUORUM, **flags))
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{name}' in "
        "vhost '/'")
    channel = connection.channel()
    error = channel_error(lambda: channel.queue_declare(name, passive=True))
    assert error.reply_code == 404


def test_server_named_quorum_queue_is_refused(channel):
    """Quorum queues cannot be server-named (4.2 feature matrix): queue.declare with
    an empty name is 406 with RabbitMQ's text, naming the queue type's module."""
    error = channel_error(lambda: channel.queue_declare("", durable=True, arguments=QUORUM))
    assert (error.reply_code, error.reply_text) == (
        406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type "
        "rabbit_quorum_queue")


# ================================================================ publishing and consuming


def test_confirmed_messages_are_consumed_in_order_with_their_properties(connection):
    """Publisher confirms then a manual-ack consumer without a prefetch limit: every
    message arrives once, in publish order, body and properties intact, not
    redelivered and without x-delivery-count (4.x adds it to redeliveries only);
    acked messages are gone."""
    publisher = confirmed_channel(connection)
    name = quorum_queue(publisher, "qq-order")
    sent = []
    for index in range(30):
        properties = pika.BasicProperties(
            content_type="application/json", content_encoding="utf-8", delivery_mode=2,
            priority=index % 3, correlation_id=f"c-{index}", reply_to="replies",
            message_id=f"m-{index}", timestamp=1700000000 + index, type="order",
            app_id="shop", headers={"index": index, "tags": ["a", "b"], "big": 2 ** 40,
                                    "nested": {"ok": True}})
        body = f"order-{index}".encode() * (index + 1)
        publisher.basic_publish("", name, body, properties)
        sent.append((body, properties))
    consumer = connection.channel()   # no basic.qos: prefetch 0, unlimited
    received = []

    def on_message(channel, method, properties, body):
        received.append((method.redelivered, method.routing_key, method.exchange, body,
                         properties))
        channel.basic_ack(method.delivery_tag)

    consumer.basic_consume(name, on_message)
    pump(connection, lambda: len(received) == 30)
    for (redelivered, routing_key, exchange, body, got), (sent_body, properties) in zip(
            received, sent):
        assert (redelivered, routing_key, exchange, body) == (False, name, "", sent_body)
        for field in ("content_type", "content_encoding", "delivery_mode", "priority",
                      "correlation_id", "reply_to", "message_id", "timestamp", "type",
                      "app_id", "headers"):
            assert getattr(got, field) == getattr(properties, field), field
    idle(connection, 0.1)
    assert len(received) == 30
    consumer.close()
    assert counts(publisher, name) == (0, 0)


def test_basic_get_reports_the_ready_messages_left(connection):
    """basic.get-ok's message-count is the number of ready messages left after this
    one; an empty quorum queue answers get-empty."""
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, "qq-get")
    assert channel.basic_get(name) == (None, None, None)
    publish_bodies(channel, name, [b"a", b"b", b"c"])
    seen = []
    for _ in range(3):
        method, _properties, body = get(channel, name)
        seen.append((body, method.message_count, method.redelivered))
    assert seen == [(b"a", 2, False), (b"b", 1, False), (b"c", 0, False)]
    assert channel.basic_get(name) == (None, None, None)
    channel.basic_ack(0, multiple=True)
    assert counts(channel, name) == (0, 0)


@pytest.mark.parametrize("verb", ["nack", "reject"])
def test_requeued_message_comes_back_first_marked_with_its_delivery_count(connection, verb):
    """basic.nack/reject requeue=true: the message is delivered again with
    redelivered=true and x-delivery-count 1, then 2; with a delivery limit set (the
    default is 20 since 4.0) it returns near the head of the queue, before messages
    that were never delivered (4.2 guide, "Repeated Requeues")."""
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, f"qq-{verb}")
    publish_bodies(channel, name, [b"first", b"second"])
    settle = (lambda tag: channel.basic_nack(tag, requeue=True)) if verb == "nack" else (
        lambda tag: channel.basic_reject(tag, requeue=True))
    seen = []
    for _ in range(3):
        method, properties, body = get(channel, name)
        seen.append((body, method.redelivered, delivery_count(properties),
                     method.message_count))
        settle(method.delivery_tag)
    assert seen == [(b"first", False, None, 1), (b"first", True, 1, 1),
                    (b"first", True, 2, 1)]
    assert drain(channel, name) == [(b"first", True, 3), (b"second", False, None)]


def test_requeued_message_goes_to_the_back_without_a_delivery_limit(connection):
    """x-delivery-limit -1 restores the unlimited behaviour of 3.13; a message
    rejected back to such a queue goes to its back (4.2 guide, "Repeated
    Requeues"), still counted."""
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, "qq-unlimited", **{"x-delivery-limit": -1})
    publish_bodies(channel, name, [b"first", b"second", b"third"])
    method, _properties, body = get(channel, name)
    assert body == b"first"
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert drain(channel, name) == [(b"second", False, None), (b"third", False, None),
                                    (b"first", True, 1)]


@pytest.mark.parametrize("verb", ["nack", "reject"])
def test_nack_or_reject_without_requeue_drops_the_message(connection, verb):
    """basic.nack/reject requeue=false: the message is gone (no dead-letter exchange
    is configured); the others stay, in order."""
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, f"qq-drop-{verb}")
    publish_bodies(channel, name, [b"bad", b"good"])
    method, _properties, body = get(channel, name)
    assert body == b"bad"
    if verb == "nack":
        channel.basic_nack(method.delivery_tag, requeue=False)
    else:
        channel.basic_reject(method.delivery_tag, requeue=False)
    assert counts(channel, name) == (1, 0)
    assert drain(channel, name) == [(b"good", False, None)]


def test_delivery_limit_one_drops_a_message_returned_twice(connection):
    """Poison message handling: with x-delivery-limit 1 a message may be returned once
    (redelivered with x-delivery-count 1); returned a second time it is dropped."""
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, "qq-limit-1", **{"x-delivery-limit": 1})
    publish_bodies(channel, name, [b"poison", b"fine"])
    method, properties, body = get(channel, name)
    assert (body, delivery_count(properties)) == (b"poison", None)
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, properties, body = get(channel, name)
    assert (body, method.redelivered, delivery_count(properties)) == (b"poison", True, 1)
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert counts(channel, name) == (1, 0)
    assert drain(channel, name) == [(b"fine", False, None)]


def test_default_delivery_limit_is_20(connection):
    """Since 4.0 a quorum queue declared without x-delivery-limit has a limit of 20:
    the message is delivered 21 times (the last with x-delivery-count 20) and dropped
    when returned the 21st time."""
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, "qq-limit-20")
    publish_bodies(channel, name, [b"poison"])
    seen = []
    for _ in range(21):
        method, properties, _body = get(channel, name)
        seen.append(delivery_count(properties))
        channel.basic_reject(method.delivery_tag, requeue=True)
    assert seen == [None] + list(range(1, 21))
    assert channel.basic_get(name) == (None, None, None)
    assert counts(channel, name) == (0, 0)


# ================================================================ consumers


def test_closing_a_channel_returns_its_unacked_messages_counted(connection):
    """A channel closed with unacked deliveries: they return to the queue (ahead of
    the never-delivered ones), each redelivered=true with x-delivery-count + 1."""
    publisher = confirmed_channel(connection)
    name = quorum_queue(publisher, "qq-close")
    publish_bodies(publisher, name, [b"m0", b"m1", b"m2", b"m3"])
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=2)
    received = Collector()
    consumer.basic_consume(name, received)
    pump(connection, lambda: len(received) == 2)
    assert received.bodies == [b"m0", b"m1"]
    consumer.close()
    assert counts(publisher, name) == (4, 0)
    assert drain(publisher, name) == [(b"m0", True, 1), (b"m1", True, 1),
                                      (b"m2", False, None), (b"m3", False, None)]


def test_cancelled_consumer_can_still_ack_what_it_received(connection):
    """basic.cancel keeps the consumer's unacked deliveries with it: no more
    deliveries come, those received can still be acked (and stay gone) or rejected
    (and come back)."""
    publisher = confirmed_channel(connection)
    name = quorum_queue(publisher, "qq-cancel")
    publish_bodies(publisher, name, [b"m0", b"m1", b"m2", b"m3"])
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=2)
    received = Collector()
    tag = consumer.basic_consume(name, received)
    pump(connection, lambda: len(received) == 2)
    consumer.basic_cancel(tag)
    assert counts(publisher, name)[0] == 2
    consumer.basic_ack(received.deliveries[0][1])
    consumer.basic_reject(received.deliveries[1][1], requeue=True)
    idle(connection, 0.1)
    assert consumer.is_open
    assert len(received) == 2
    assert drain(publisher, name) == [(b"m1", True, 1), (b"m2", False, None),
                                      (b"m3", False, None)]


def test_prefetch_bounds_the_unacked_deliveries(connection):
    """basic.qos prefetch-count (per consumer): never more than that many unacked
    deliveries; each ack lets exactly one more in, in queue order."""
    publisher = confirmed_channel(connection)
    name = quorum_queue(publisher, "qq-prefetch")
    publish_bodies(publisher, name, [f"m{i}".encode() for i in range(8)])
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=3)
    received = Collector()
    consumer.basic_consume(name, received)
    pump(connection, lambda: len(received) == 3)
    idle(connection, 0.2)
    assert received.bodies == [b"m0", b"m1", b"m2"]
    for acked in range(5):
        consumer.basic_ack(received.deliveries[acked][1])
        pump(connection, lambda: len(received) == 4 + acked)
        idle(connection, 0.05)
        assert len(received) - (acked + 1) == 3, "more than prefetch outstanding"
    assert received.bodies == [f"m{i}".encode() for i in range(8)]


def test_a_consumer_tagged_get_is_not_held_back_by_its_channels_basic_get(connection):
    """basic.get's messages do not count against a consumer's prefetch, whatever the
    consumer's tag: a consumer tagged "get" (prefetch 1) gets its next message once it
    acked its first, while a message the same channel took by basic.get is still
    unacked. (The channel's basic.get messages were held under ".../get", the key of a
    consumer tagged "get", so they filled its prefetch.)"""
    publisher = confirmed_channel(connection)
    name = quorum_queue(publisher, "qq-get-tag")
    publish_bodies(publisher, name, [b"m1", b"m2", b"m3"])
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1)
    received = Collector()
    channel.basic_consume(name, received, consumer_tag="get")
    pump(connection, lambda: len(received) == 1, timeout=30)
    method, _properties, body = get(channel, name)
    assert (received.bodies, body) == ([b"m1"], b"m2")
    channel.basic_ack(received.deliveries[0][1])
    pump(connection, lambda: len(received) == 2, timeout=30)
    assert received.bodies == [b"m1", b"m3"]
    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(received.deliveries[1][1])
    assert counts(publisher, name) == (0, 1)


def test_higher_priority_consumer_is_served_while_it_has_capacity(connection):
    """Consumer priorities (x-priority): the highest-priority consumer with spare
    prefetch gets each message; a lower one only when it is full; acks make room for
    the higher one again."""
    publisher = confirmed_channel(connection)
    name = quorum_queue(publisher, "qq-cprio")
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=2)
    received = Collector()
    consumer.basic_consume(name, received, consumer_tag="low")
    consumer.basic_consume(name, received, consumer_tag="high", arguments={"x-priority": 10})
    consumer.basic_consume(name, received, consumer_tag="default")
    publish_bodies(publisher, name, [f"m{i}".encode() for i in range(5)])
    pump(connection, lambda: len(received) == 5)
    by_tag = {}
    for tag, _delivery_tag, _redelivered, body in received.deliveries:
        by_tag.setdefault(tag, []).append(body)
    assert by_tag["high"] == [b"m0", b"m1"]
    assert sorted(by_tag.get("low", []) + by_tag.get("default", [])) == [b"m2", b"m3", b"m4"]
    for tag, delivery_tag, _redelivered, _body in list(received.deliveries):
        if tag == "high":
            consumer.basic_ack(delivery_tag)
    publish_bodies(publisher, name, [b"m5", b"m6"])
    pump(connection, lambda: len(received) == 7)
    assert [d[0] for d in received.deliveries[5:]] == ["high", "high"]


def test_exclusive_flag_on_consume_is_not_enforced(connection):
    """Quorum queues do not support consumer exclusivity (4.2 feature matrix: use
    single active consumer): RabbitMQ accepts basic.consume exclusive=true and does
    not enforce it, so other consumers, exclusive or not, are accepted and served."""
    publisher = confirmed_channel(connection)
    name = quorum_queue(publisher, "qq-excl")
    received = Collector()
    channels = [connection.channel() for _ in range(3)]
    for channel, (tag, exclusive) in zip(channels, (("a", True), ("b", False), ("c", True))):
        channel.basic_qos(prefetch_count=1)
        channel.basic_consume(name, received, consumer_tag=tag, exclusive=exclusive)
    assert counts(publisher, name) == (0, 3)
    publish_bodies(publisher, name, [b"m0", b"m1", b"m2"])
    pump(connection, lambda: len(received) == 3)
    assert sorted(tag for tag, _t, _r, _b in received.deliveries) == ["a", "b", "c"]


MESSAGE_PRIORITIES = [
    pytest.param([("n1", None), ("n2", None), ("n3", None)] + [(f"h{i}", 9) for i in range(1, 7)],
                 ["h1", "h2", "n1", "h3", "h4", "n2", "h5", "h6", "n3"], id="2-to-1"),
    pytest.param([("none", None), ("p4", 4), ("p5", 5), ("p255", 255)],
                 ["p5", "p255", "none", "p4"], id="above-4-is-high"),
    pytest.param([("h1", 6), ("h2", 7), ("h3", 8), ("n1", 0), ("h4", 9)],
                 ["h1", "h2", "h3", "n1", "h4"], id="older-high-goes-first"),
    pytest.param([("n1", 1), ("n2", 3), ("n3", 0)], ["n1", "n2", "n3"], id="normal-is-fifo"),
]


@pytest.mark.parametrize("sent, expected", MESSAGE_PRIORITIES)
def test_two_message_priority_levels_served_two_to_one(connection, sent, expected):
    """Message priorities (4.2 guide, "Priorities"): priorities 0-4 and none are
    normal, above 4 high; high messages are served 2:1 against normal ones, FIFO
    within a level, and a high message published before the normal head goes first
    even on the normal level's turn."""
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, "qq-mprio")
    for body, priority in sent:
        channel.basic_publish("", name, body.encode(), pika.BasicProperties(priority=priority))
    assert [body.decode() for body, _redelivered, _count in drain(channel, name)] == expected


def test_consuming_with_global_qos_closes_the_connection(broker, connection):
    """Global QoS is not supported (4.2 guide, "Global QoS"): basic.consume from a
    quorum queue on a channel with basic.qos global=true is refused with 540
    NOT_IMPLEMENTED. 540 is a hard error, so RabbitMQ (3.10 as 4.x:
    rabbit_quorum_queue:consume returns not_implemented) closes the connection,
    whatever the guide's "channel error" says, and so does quorumqueue. On a new
    connection, per-consumer prefetch works."""
    name = quorum_queue(connection.channel(), "qq-global")
    channel = connection.channel()
    channel.basic_qos(prefetch_count=5, global_qos=True)
    with pytest.raises(pe.ConnectionClosedByBroker) as info:
        channel.basic_consume(name, lambda *a: None)
    assert (info.value.reply_code, info.value.reply_text) == (
        540, f"NOT_IMPLEMENTED - queue '{name}' in vhost '/' does not support global qos")
    assert not connection.is_open
    other = connect(broker)
    try:
        channel = other.channel()
        channel.basic_qos(prefetch_count=5)
        channel.basic_consume(name, lambda *a: None)
        assert counts(other.channel(), name) == (0, 1)
    finally:
        other.close()


# ================================================================ purge, delete


def test_purge_counts_and_removes_ready_messages_only(connection):
    """queue.purge-ok counts the ready messages it removed; an unacked delivery
    survives the purge and can still be rejected back to the queue."""
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, "qq-purge")
    publish_bodies(channel, name, [b"a", b"b", b"c", b"d"])
    getter = connection.channel()
    method, _properties, body = get(getter, name)
    assert body == b"a"
    assert channel.queue_purge(name).method.message_count == 3
    assert channel.queue_purge(name).method.message_count == 0
    getter.basic_reject(method.delivery_tag, requeue=True)
    assert drain(channel, name) == [(b"a", True, 1)]


def test_delete_counts_ready_messages_and_cancels_consumers(connection):
    """queue.delete-ok counts the ready messages; consumers of the deleted queue get a
    server-sent basic.cancel (pika: the on-cancel callback), their unacked deliveries
    can still be acked without error, and the queue is gone (404)."""
    publisher = confirmed_channel(connection)
    name = quorum_queue(publisher, "qq-delete")
    publish_bodies(publisher, name, [b"m0", b"m1", b"m2", b"m3", b"m4"])
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=2)
    cancelled = []
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    received = Collector()
    tag = consumer.basic_consume(name, received)
    pump(connection, lambda: len(received) == 2)
    assert publisher.queue_delete(name).method.message_count == 3
    pump(connection, lambda: cancelled)
    assert cancelled == [tag]
    consumer.basic_ack(received.deliveries[1][1], multiple=True)
    idle(connection, 0.1)
    assert consumer.is_open
    channel = connection.channel()
    error = channel_error(lambda: channel.queue_declare(name, passive=True))
    assert (error.reply_code, error.reply_text) == (404, f"NOT_FOUND - no queue '{name}' in "
                                                         "vhost '/'")


# ================================================================ no-ack, tx, fanout


def test_no_ack_consumer_gets_every_message_once(connection):
    """basic.consume no-ack: every message is delivered once, in order (thousands of
    them: a no-ack consumer has no prefetch limit), and is settled by its delivery:
    nothing is left or comes back when the channel closes."""
    publisher = confirmed_channel(connection)
    name = quorum_queue(publisher, "qq-noack")
    bodies = [f"m{i}".encode() for i in range(3000)]
    unconfirmed = connection.channel()
    publish_bodies(unconfirmed, name, bodies[:-1])
    publish_bodies(publisher, name, bodies[-1:])  # confirmed: so are the ones before it
    consumer = connection.channel()
    received = Collector()
    consumer.basic_consume(name, received, auto_ack=True)
    pump(connection, lambda: len(received) == len(bodies), timeout=10)
    assert received.bodies == bodies
    assert not any(redelivered for _c, _t, redelivered, _b in received.deliveries)
    consumer.close()
    assert counts(publisher, name) == (0, 0)


def test_transactional_publishes_arrive_only_on_commit(connection):
    """tx.select: publishes to a quorum queue are enqueued at tx.commit, dropped by
    tx.rollback."""
    channel = connection.channel()
    name = quorum_queue(channel, "qq-tx")
    channel.tx_select()
    publish_bodies(channel, name, [b"rolled-back"])
    channel.tx_rollback()
    publish_bodies(channel, name, [b"t1", b"t2"])
    assert counts(channel, name) == (0, 0)
    channel.tx_commit()
    assert counts(channel, name) == (2, 0)
    assert drain(channel, name) == [(b"t1", False, None), (b"t2", False, None)]


def test_fanout_to_a_quorum_and_a_classic_queue_with_confirms(connection):
    """One confirmed publish routed by a fanout exchange to a quorum queue and a
    classic queue: each confirm covers both, and both queues hold every message."""
    channel = confirmed_channel(connection)
    exchange = unique("qq-fanout")
    channel.exchange_declare(exchange, "fanout")
    quorum = quorum_queue(channel, "qq-fan-quorum")
    classic = unique("qq-fan-classic")
    channel.queue_declare(classic, durable=True)
    channel.queue_bind(quorum, exchange)
    channel.queue_bind(classic, exchange)
    for index in range(10):
        channel.basic_publish(exchange, "", f"m{index}".encode(), PERSISTENT)
    assert counts(channel, quorum)[0] == counts(channel, classic)[0] == 10
    expected = [(f"m{i}".encode(), False, None) for i in range(10)]
    assert drain(channel, quorum) == expected
    assert drain(channel, classic) == expected


# ================================================================ wire fidelity


def test_delivery_count_header_is_a_long(connection):
    """RabbitMQ sends x-delivery-count as a long (AMQP field type 'l', Java Long):
    pika decodes that type, and only that one, as pika.compat.long."""
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, "qq-long")
    publish_bodies(channel, name, [b"m"])
    method, _properties, _body = get(channel, name)
    channel.basic_nack(method.delivery_tag, requeue=True)
    _method, properties, _body = get(channel, name)
    assert properties.headers["x-delivery-count"] == 1
    assert type(properties.headers["x-delivery-count"]) is long


_pamqp_table_value = pamqp_encode.encode_table_value


def _table_value_with_doubles(value):
    """pamqp's field encoding, but a float goes as a double ('d', what Java and .NET
    send for a double; pika cannot send floats at all)."""
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    return _pamqp_table_value(value)


def test_redelivery_keeps_the_publishers_header_values(broker, monkeypatch):
    """Adding x-delivery-count to a redelivery must not re-encode the publisher's other
    headers: a double (field type 'd') comes back as the same double, not narrowed to
    a float. Raw frames (tests/differential/probe.py), as pika cannot send doubles."""
    name = unique("qq-double")
    with Probe.open(broker.uri) as c:
        c.call(1, amqp.Channel.Open())
        c.call(1, amqp.Queue.Declare(queue=name, durable=True, arguments=QUORUM))
        c.call(1, amqp.Confirm.Select())
        monkeypatch.setattr(pamqp_encode, "encode_table_value", _table_value_with_doubles)
        c.publish(1, "", name, "m", properties=amqp.Basic.Properties(
            headers={"ratio": 0.1, "n": 7, "s": "text"}))
        monkeypatch.undo()
        c.collect(1)
        first = c.call(1, amqp.Basic.Get(queue=name))
        c.send(1, amqp.Basic.Nack(delivery_tag=1, requeue=True))
        again = c.call(1, amqp.Basic.Get(queue=name))
    assert first["properties"]["headers"] == {"ratio": 0.1, "n": 7, "s": "text"}
    assert again["properties"]["headers"] == {"ratio": 0.1, "n": 7, "s": "text",
                                              "x-delivery-count": 1}


# ================================================================ restarts


def _restart(broker, kill: bool, connection) -> None:
    """Restart with the client still connected: SIGKILL crashes at once; on SIGTERM the
    broker closes the connection (320) and the client answers, as an application's
    would."""
    if not kill:
        broker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        try:
            while connection.is_open and time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.05)
        except pe.ConnectionClosedByBroker as error:
            assert error.reply_code == 320, error
    broker.restart(kill=kill)


@pytest.mark.parametrize("kill", [pytest.param(False, id="sigterm"),
                                  pytest.param(True, id="sigkill")])
def test_restart_keeps_confirmed_messages_and_returns_unacked_ones(fresh_broker, kill):
    """Across a clean stop or a crash: the quorum queue and its arguments survive;
    every confirmed message is still there — transient ones too, as quorum queues
    persist every message whatever its delivery mode; messages that were delivered
    and not acked come back first, redelivered=true with x-delivery-count 1; acked
    ones stay gone."""
    connection = connect(fresh_broker)
    channel = confirmed_channel(connection)
    name = quorum_queue(channel, "qq-restart", **{"x-delivery-limit": 5})
    for index in range(5):
        channel.basic_publish("", name, f"p{index}".encode(), pika.BasicProperties(
            delivery_mode=2, message_id=f"id-{index}", headers={"index": index}))
    channel.basic_publish("", name, b"transient", pika.BasicProperties(delivery_mode=1))
    getter = connection.channel()
    acked, _properties, _body = get(getter, name)
    getter.basic_ack(acked.delivery_tag)
    get(getter, name)
    get(getter, name)
    assert counts(channel, name)[0] == 3   # a round trip: the ack is applied
    _restart(fresh_broker, kill, connection)

    connection = connect(fresh_broker)
    channel = connection.channel()
    ok = channel.queue_declare(name, durable=True,
                               arguments={**QUORUM, "x-delivery-limit": 5}).method
    assert (ok.message_count, ok.consumer_count) == (5, 0)
    seen = []
    while True:
        method, properties, body = channel.basic_get(name, auto_ack=True)
        if method is None:
            break
        headers = dict(properties.headers or {})
        seen.append((body, method.redelivered, headers.pop("x-delivery-count", None),
                     properties.delivery_mode, properties.message_id, headers))
    assert seen == [
        (b"p1", True, 1, 2, "id-1", {"index": 1}),
        (b"p2", True, 1, 2, "id-2", {"index": 2}),
        (b"p3", False, None, 2, "id-3", {"index": 3}),
        (b"p4", False, None, 2, "id-4", {"index": 4}),
        (b"transient", False, None, 1, None, {}),
    ]
    connection.close()

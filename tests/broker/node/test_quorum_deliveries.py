"""A quorum queue's deliveries as a client reads them (queues/quorum/deliveries.py): each
message of a Deliver effect read back from the log and written as basic.deliver, its
content header and body frames — the bytes pamqp marshals for the same delivery, the
header as published (plus x-delivery-count once a message was returned), delivery
tags in order, redelivered set for what came back. AMQP 0-9-1 section 1.8.3.9
(basic.deliver) and the quorum queues guide ("Poison Message Handling": the
x-delivery-count header)."""

from __future__ import annotations

import pytest
from pamqp import commands

from tests.broker.node.harness import Client, content_frames, marshal, method, new_node


def quorum_client(frame_max: int | None = None) -> Client:
    client = Client(new_node())
    client.handshake(frame_max=frame_max)
    client.open_channel(1)
    client.declare_queue(1, "q", durable=True, arguments={"x-queue-type": "quorum"})
    client.call(1, method(commands.Exchange.Declare, exchange="ex-\u00e9", exchange_type="topic"),
                "Exchange.DeclareOk")
    client.call(1, method(commands.Queue.Bind, queue="q", exchange="ex-\u00e9",
                          routing_key="#"), "Queue.BindOk")
    return client


def consume(client: Client, channel: int, tag: str, **fields) -> bytes:
    """basic.consume; what arrives after its consume-ok in the same read (the
    deliveries of the messages waiting), as raw bytes."""
    client.send(channel, method(commands.Basic.Consume, queue="q", consumer_tag=tag, **fields))
    data = client.read_raw()
    ok = marshal(commands.Basic.ConsumeOk(consumer_tag=tag), channel)
    assert data.startswith(ok)
    return data[len(ok):]


def consume_deliveries(client: Client, channel: int, tag: str, **fields) -> list:
    """basic.consume; the deliveries (harness Delivery) that arrive after its
    consume-ok in the same read."""
    client.send(channel, method(commands.Basic.Consume, queue="q", consumer_tag=tag, **fields))
    (_channel, ok), *deliveries = client.read_deliveries()
    assert (type(ok), ok.consumer_tag) == (commands.Basic.ConsumeOk, tag)
    return deliveries


def expected_delivery(tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                      routing_key: str, props: commands.Basic.Properties, body: bytes,
                      frame_max: int) -> bytes:
    """What pamqp marshals for basic.deliver and the message's content frames."""
    return (marshal(method(commands.Basic.Deliver, consumer_tag=tag,
                           delivery_tag=delivery_tag, redelivered=redelivered,
                           exchange=exchange, routing_key=routing_key), 1)
            + content_frames(1, body, props, frame_max))


MESSAGES = [  # (exchange, routing key, properties, body)
    ("", "q", commands.Basic.Properties(delivery_mode=2), b"one"),
    ("ex-\u00e9", "key.\u00fc", commands.Basic.Properties(content_type="text/plain",
                                                          headers={"h": 1}), b"two" * 100),
    ("ex-\u00e9", "", commands.Basic.Properties(), b""),
    ("", "q", commands.Basic.Properties(message_id="m4"), bytes(range(256)) * 40),
]


@pytest.mark.parametrize("frame_max", [None, 8192])  # 8192: the smallest allowed
def test_a_deliver_effect_is_the_bytes_pamqp_marshals_for_each_message(frame_max):
    """One basic.consume over four waiting messages: one Deliver effect, written as
    the four deliveries in queue order with tags 1-4, names, header and body exactly
    as published (an empty body has no body frame; a long one is split by frame_max)."""
    client = quorum_client(frame_max)
    for exchange, routing_key, props, body in MESSAGES:
        client.publish(1, exchange, routing_key, body, props)
    client.read()
    assert consume(client, 1, "ctag") == b"".join(
        expected_delivery("ctag", n, False, exchange, routing_key, props, body,
                          client.frame_max)
        for n, (exchange, routing_key, props, body) in enumerate(MESSAGES, 1))


def test_returned_messages_come_back_redelivered_with_their_delivery_count():
    """nack with requeue returns the messages (delivery count + 1): delivered again
    with redelivered set and x-delivery-count in the headers, beside the headers the
    publisher set; a message never returned keeps its header byte for byte."""
    client = quorum_client()
    for exchange, routing_key, props, body in MESSAGES[:2]:
        client.publish(1, exchange, routing_key, body, props)
    client.read()
    client.call(1, commands.Basic.Qos(prefetch_count=2), "Basic.QosOk")
    first = consume_deliveries(client, 1, "c")
    assert [d.method.delivery_tag for d in first] == [1, 2]
    client.send(1, commands.Basic.Nack(delivery_tag=1, multiple=False, requeue=True))
    client.publish(1, "", "q", b"three", commands.Basic.Properties())
    again = client.read_deliveries()
    assert [(d.method.delivery_tag, d.method.redelivered, d.body) for d in again] == [
        (3, True, b"one")]
    assert again[0].header.properties.headers == {"x-delivery-count": 1}
    client.send(1, commands.Basic.Nack(delivery_tag=3, multiple=False, requeue=True))
    client.send(1, commands.Basic.Nack(delivery_tag=2, multiple=False, requeue=True))
    later = client.read_deliveries()
    assert [(d.method.delivery_tag, d.method.redelivered, d.body) for d in later] == [
        (4, True, b"one"), (5, True, b"two" * 100)]
    assert later[0].header.properties.headers == {"x-delivery-count": 2}
    assert later[1].header.properties.headers == {"h": 1, "x-delivery-count": 1}
    assert later[1].header.properties.content_type == "text/plain"
    client.send(1, commands.Basic.Ack(delivery_tag=5, multiple=True))
    fresh = client.read_raw()
    assert fresh == expected_delivery("c", 6, False, "", "q", commands.Basic.Properties(),
                                      b"three", client.frame_max)


def test_single_acks_free_prefetch_one_message_each():
    """A consumer acking each delivery on its own (multiple=false) with prefetch 2:
    every ack lets one more message through, in order, until the queue is empty."""
    client = quorum_client()
    for n in range(6):
        client.publish(1, "", "q", b"m%d" % n)
    client.read()
    client.call(1, commands.Basic.Qos(prefetch_count=2), "Basic.QosOk")
    bodies = [d.body for d in consume_deliveries(client, 1, "c")]
    tag = 0
    while len(bodies) < 6:
        tag += 1
        client.send(1, commands.Basic.Ack(delivery_tag=tag, multiple=False))
        bodies += [d.body for d in client.read_deliveries()]
    assert bodies == [b"m%d" % n for n in range(6)]


def test_a_no_ack_consumer_gets_every_message_and_leaves_none_behind():
    """A no-ack consumer's deliveries are settled as they are written: everything
    arrives once, and the queue is empty afterwards (passive declare counts)."""
    client = quorum_client()
    for n in range(50):
        client.publish(1, "", "q", b"m%d" % n)
    client.read()
    bodies = [d.body for d in consume_deliveries(client, 1, "c", no_ack=True)]
    assert bodies == [b"m%d" % n for n in range(50)]
    ok = client.declare_queue(1, "q", passive=True)
    assert (ok.message_count, ok.consumer_count) == (0, 1)


def test_a_channel_closed_before_its_deliveries_are_written_gets_none():
    """Messages the machine hands to a consumer whose channel closed in the same read
    (before the entries were applied) are not written: they go back to the queue, and
    another channel's consumer gets them all, in order."""
    client = quorum_client()
    client.call(1, commands.Basic.Qos(prefetch_count=3), "Basic.QosOk")
    assert consume_deliveries(client, 1, "c") == []
    client.send_bytes(b"".join(
        marshal(method(commands.Basic.Publish, exchange="", routing_key="q"), 1)
        + content_frames(1, b"m%d" % n) for n in range(3))
        + marshal(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0,
                                         method_id=0), 1))
    assert [name for name in client.read_names()] == ["Channel.CloseOk"]
    client.open_channel(2)
    got = consume_deliveries(client, 2, "d")
    assert [(d.method.consumer_tag, d.method.delivery_tag, d.body) for d in got] == [
        ("d", 1, b"m0"), ("d", 2, b"m1"), ("d", 3, b"m2")]


def test_unacked_messages_of_a_closed_channel_go_to_the_next_consumer_redelivered():
    """Messages written to a consumer and not acked when its channel closes come back
    (delivery count + 1): another channel's consumer gets them, redelivered."""
    client = quorum_client()
    client.call(1, commands.Basic.Qos(prefetch_count=3), "Basic.QosOk")
    assert consume_deliveries(client, 1, "c") == []
    for n in range(3):
        client.publish(1, "", "q", b"m%d" % n)
    assert [d.body for d in client.read_deliveries()] == [b"m0", b"m1", b"m2"]
    client.call(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0,
                                          method_id=0), "Channel.CloseOk")
    client.open_channel(2)
    got = consume_deliveries(client, 2, "d")
    assert [(d.method.consumer_tag, d.method.redelivered, d.body,
             d.header.properties.headers) for d in got] == [
        ("d", True, b"m%d" % n, {"x-delivery-count": 1}) for n in range(3)]


def test_a_returned_message_far_back_in_the_log_and_a_new_one_in_one_deliver():
    """One Deliver effect with a message returned from far back in the log (a closed
    channel's, 100 messages before) and a new one: both read (runs of nearby
    entries are read at once, a distant one on its own) and written in the
    machine's order, the returned one redelivered with its delivery count."""
    client = quorum_client()
    client.call(1, commands.Basic.Qos(prefetch_count=1), "Basic.QosOk")
    client.publish(1, "", "q", b"old")
    assert [d.body for d in consume_deliveries(client, 1, "a")] == [b"old"]
    client.open_channel(2)
    client.call(2, commands.Basic.Qos(prefetch_count=100), "Basic.QosOk")
    assert consume_deliveries(client, 2, "b") == []
    for n in range(100):
        client.publish(2, "", "q", b"m%d" % n)
    assert len(client.read_deliveries()) == 100
    client.call(1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0,
                                          method_id=0), "Channel.CloseOk")
    client.publish(2, "", "q", b"new")
    client.send(2, commands.Basic.Ack(delivery_tag=100, multiple=True))
    got = client.read_deliveries()
    assert [(d.method.delivery_tag, d.method.redelivered, d.body,
             d.header.properties.headers) for d in got] == [
        (101, True, b"old", {"x-delivery-count": 1}), (102, False, b"new", None)]

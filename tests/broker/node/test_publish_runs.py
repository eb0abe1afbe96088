"""Publishes pipelined in one read: what the client sees is what it sees one at a time.

A client with publisher confirms pipelines many basic.publish frames; one socket read
then carries many whole messages, which the session hands on as one run (routed once
per exchange and routing key, proposed to a quorum queue as one log append). These
tests feed the same bytes in one read and one byte at a time and compare what the
client gets back: the returns (basic.return before the confirm of the same message,
as RabbitMQ sends them), every confirm exactly once (acks may be `multiple`: they are
expanded to one per sequence number), the channel error of a message that fails in the
middle of a read (those before it are published and confirmed, those after it are
discarded, spec 1.5.2.5), and the queues' contents in publish order. The same
scenarios run against RabbitMQ 3.10.8 in tests/differential/ (basic_publish_runs_*).
"""

from __future__ import annotations

import pytest
from pamqp import commands

from tests.broker.node.harness import (Client, Delivery, content_frames, marshal, method,
                                       name, new_node, properties)

HEADERS_MATCH = {"x-match": "all", "colour": "red"}


def publish_frames(exchange: str, routing_key: str, body: bytes, mandatory: bool = False,
                   props: commands.Basic.Properties | None = None) -> bytes:
    return (marshal(method(commands.Basic.Publish, exchange=exchange,
                           routing_key=routing_key, mandatory=mandatory), 1)
            + content_frames(1, body, props or properties(delivery_mode=2)))


def confirmed_client(byte_at_a_time: bool) -> Client:
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "runs-qq", durable=True, arguments={"x-queue-type": "quorum"})
    client.declare_queue(1, "runs-classic", durable=True)
    client.call(1, method(commands.Queue.Bind, queue="runs-classic", exchange="amq.direct",
                          routing_key="k"), "Queue.BindOk")
    client.call(1, method(commands.Queue.Bind, queue="runs-classic", exchange="amq.headers",
                          routing_key="", arguments=HEADERS_MATCH), "Queue.BindOk")
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    client.byte_at_a_time = byte_at_a_time
    return client


def events(client: Client) -> list[tuple]:
    """What came back, confirms expanded to one event per sequence number."""
    out: list[tuple] = []
    confirmed: set[int] = set()
    for reply in client.read_deliveries():
        if isinstance(reply, Delivery):
            assert name(reply.method) == "Basic.Return"
            out.append(("return", reply.method.reply_code, reply.method.exchange,
                        reply.method.routing_key, reply.body))
            continue
        value = reply[1]
        if name(value) in ("Basic.Ack", "Basic.Nack"):
            tags = ([n for n in range(1, value.delivery_tag + 1) if n not in confirmed]
                    if value.multiple else [value.delivery_tag])
            assert not confirmed & set(tags), f"confirmed twice: {value}"
            confirmed.update(tags)
            out.extend((name(value), tag) for tag in tags)
        elif name(value) == "Channel.Close":
            out.append(("close", value.reply_code, value.reply_text))
        else:
            out.append((name(value),))
    return out


def bodies(client: Client, queue: str) -> list[bytes]:
    client.byte_at_a_time = False
    got = []
    while (delivery := client.get(1, queue)) is not None:
        got.append(delivery.body)
    return got


RED, BLUE = properties(headers={"colour": "red"}), properties(headers={"colour": "blue"})
MIXED = [
    ("", "runs-qq", b"q1", False, None),
    ("", "runs-qq", b"q2", True, None),
    ("", "runs-nowhere", b"returned 1", True, None),
    ("", "runs-qq", b"q3", False, None),
    ("amq.direct", "k", b"c1", True, None),
    ("amq.direct", "k", b"c2", False, None),
    ("amq.direct", "other", b"dropped", False, None),
    ("amq.direct", "other", b"returned 2", True, None),
    ("amq.headers", "", b"c3", True, RED),
    ("amq.headers", "", b"returned 3", True, BLUE),
    ("", "runs-classic", b"c4", False, None),
    ("", "runs-qq", b"q4", False, None),
]


@pytest.mark.parametrize("byte_at_a_time", [False, True], ids=["one-read", "byte-by-byte"])
def test_a_read_of_publishes_to_many_queues_and_exchanges(byte_at_a_time):
    client = confirmed_client(byte_at_a_time)
    client.send_bytes(b"".join(publish_frames(*message) for message in MIXED))
    got = events(client)
    returns = [event for event in got if event[0] == "return"]
    assert returns == [("return", 312, "", "runs-nowhere", b"returned 1"),
                       ("return", 312, "amq.direct", "other", b"returned 2"),
                       ("return", 312, "amq.headers", "", b"returned 3")]
    acks = [event[1] for event in got if event[0] == "Basic.Ack"]
    assert sorted(acks) == list(range(1, len(MIXED) + 1))  # each once, none nacked
    for seq in (3, 8, 10):  # a returned message's return comes before its confirm
        assert got.index(("Basic.Ack", seq)) > got.index(returns[(3, 8, 10).index(seq)])
    assert len(got) == len(MIXED) + 3
    assert bodies(client, "runs-qq") == [b"q1", b"q2", b"q3", b"q4"]
    assert bodies(client, "runs-classic") == [b"c1", b"c2", b"c3", b"c4"]


@pytest.mark.parametrize("byte_at_a_time", [False, True], ids=["one-read", "byte-by-byte"])
def test_a_publish_that_fails_in_the_middle_of_a_read(byte_at_a_time):
    """The messages before it are published and confirmed, the channel is closed
    with its error, and the rest of the read on that channel is discarded."""
    client = confirmed_client(byte_at_a_time)
    client.send_bytes(b"".join(publish_frames(*message) for message in [
        ("", "runs-qq", b"kept", False, None),
        ("", "runs-nowhere", b"returned", True, None),
        ("runs-missing", "k", b"refused", False, None),
        ("", "runs-nowhere", b"discarded", True, None),
        ("", "runs-qq", b"discarded too", False, None)]))
    got = events(client)
    close = ("close", 404, "NOT_FOUND - no exchange 'runs-missing' in vhost '/'")
    assert [event for event in got if event[0] in ("return", "close")] == [
        ("return", 312, "", "runs-nowhere", b"returned"), close]
    # nothing for the failed message or after it (its confirm number is never taken);
    # confirms not released before the channel closed are not sent (RabbitMQ's
    # channel ends with its unconfirmed messages too)
    assert {event[1] for event in got if event[0] == "Basic.Ack"} <= {1, 2}
    client.send(1, commands.Channel.CloseOk())
    client.open_channel(1)
    assert bodies(client, "runs-qq") == [b"kept"]


def test_one_read_and_byte_by_byte_answer_the_same():
    answers = []
    for byte_at_a_time in (False, True):
        client = confirmed_client(byte_at_a_time)
        client.send_bytes(b"".join(publish_frames(*message) for message in MIXED * 3))
        answers.append(events(client))
    assert answers[0] == answers[1]


@pytest.mark.parametrize("byte_at_a_time", [False, True], ids=["one-read", "byte-by-byte"])
def test_a_consumer_with_room_gets_a_run_in_order_and_before_what_follows(byte_at_a_time):
    """A consumer with room while a read of publishes arrives: each message once, in
    publish order, with consecutive delivery tags; a basic.get on its channel in the
    same read, after the publishes, is answered after their deliveries (the queue
    applies the publishes first, and the deliveries, handed over as one batch, never
    pass the next command's answer)."""
    client = confirmed_client(False)
    client.send(2, commands.Channel.Open())
    client.expect_one("Channel.OpenOk", channel=2)
    client.call(2, commands.Basic.Qos(prefetch_count=100), "Basic.QosOk")
    client.call(2, method(commands.Basic.Consume, queue="runs-qq", consumer_tag="c"),
                "Basic.ConsumeOk")
    client.byte_at_a_time = byte_at_a_time
    sent = [f"m{number}".encode() for number in range(12)]
    client.send_bytes(b"".join(publish_frames("", "runs-qq", body) for body in sent)
                      + marshal(method(commands.Basic.Get, queue="runs-qq", no_ack=True), 2))
    on_two = [reply for reply in client.read_deliveries()
              if (reply.channel if isinstance(reply, Delivery) else reply[0]) == 2]
    assert [reply.body for reply in on_two[:-1]] == sent
    assert [reply.method.delivery_tag for reply in on_two[:-1]] == list(range(1, 13))
    assert name(on_two[-1][1]) == "Basic.GetEmpty"

"""Settlements of a quorum queue's deliveries arriving together are proposed together.

A client that acks every message (RabbitMQ's PerfTest does by default) would
otherwise cost a log entry per ack, appended, fsynced, sent and applied on every
member. What one read settles for a consumer becomes one Settle (Return, Discard)
command, proposed before the queue's next command or at the node's next round, so it
is never reordered against the queue's other commands: an ack followed by a
channel.close in the same read still settles the message.
"""

from __future__ import annotations

from pamqp import commands

from .harness import Client, Delivery, marshal, method, name, new_node


def connect(node) -> Client:
    client = Client(node, now=node.now)
    client.handshake()
    client.open_channel(1)
    return client


def quorum_queue_with(client: Client, queue: str, count: int) -> None:
    client.declare_queue(1, queue, durable=True, arguments={"x-queue-type": "quorum"})
    for number in range(count):
        client.publish(1, "", queue, f"m{number}".encode())
    client.read()


def consume(client: Client, queue: str, channel: int = 1) -> list[Delivery]:
    client.send(channel, method(commands.Basic.Consume, queue=queue, consumer_tag="c"))
    replies = client.read_deliveries()
    assert name(replies[0][1]) == "Basic.ConsumeOk", replies
    return [reply for reply in replies if isinstance(reply, Delivery)]


def log_end(node, queue: str) -> int:
    return node.vhosts["/"].queues[queue].raft.log.last_index()


def test_acks_in_one_read_are_one_log_entry_and_settle_every_message():
    node = new_node()
    client = connect(node)
    quorum_queue_with(client, "q", 5)
    deliveries = consume(client, "q")
    assert [d.body for d in deliveries] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    before = log_end(node, "q")
    client.send_bytes(b"".join(
        marshal(commands.Basic.Ack(delivery_tag=d.method.delivery_tag), 1)
        for d in deliveries))
    client.read()
    assert log_end(node, "q") == before + 1  # one Settle for the five acks
    queue = node.vhosts["/"].queues["q"]
    assert (queue.state.ready_count, sum(len(c.checked)
                                         for c in queue.state.consumers.values())) == (0, 0)
    # nothing comes back when the consumer's channel closes: all five were settled
    client.call(1, commands.Channel.Close(reply_code=200, class_id=0, method_id=0), "Channel.CloseOk")
    client.open_channel(2)
    assert consume(client, "q", channel=2) == []


def test_an_ack_then_a_channel_close_in_one_read_keeps_the_ack():
    node = new_node()
    client = connect(node)
    quorum_queue_with(client, "q", 2)
    first, _second = consume(client, "q")
    client.send_bytes(marshal(commands.Basic.Ack(delivery_tag=first.method.delivery_tag), 1)
                      + marshal(commands.Channel.Close(reply_code=200, class_id=0, method_id=0), 1))
    assert [name(value) for _channel, value in client.read()] == ["Channel.CloseOk"]
    client.open_channel(2)
    again = consume(client, "q", channel=2)
    assert [(d.body, d.method.redelivered) for d in again] == [(b"m1", True)]


def test_a_nack_between_acks_keeps_its_place():
    """ack 1, nack-requeue 2, ack 3 in one read: three commands in that order (a run
    of one kind is merged, different kinds are not), and message 2 comes back."""
    node = new_node()
    client = connect(node)
    quorum_queue_with(client, "q", 3)
    first, second, third = consume(client, "q")
    before = log_end(node, "q")
    client.send_bytes(
        marshal(commands.Basic.Ack(delivery_tag=first.method.delivery_tag), 1)
        + marshal(commands.Basic.Nack(delivery_tag=second.method.delivery_tag,
                                      requeue=True), 1)
        + marshal(commands.Basic.Ack(delivery_tag=third.method.delivery_tag), 1))
    redelivered = [d for d in client.read_deliveries() if isinstance(d, Delivery)]
    assert [(d.body, d.method.redelivered) for d in redelivered] == [(b"m1", True)]
    assert log_end(node, "q") == before + 3

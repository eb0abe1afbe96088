"""The delivery acknowledgement timeout, with time driven by the test (the consumers
guide's "Delivery Acknowledgement Timeout", RabbitMQ 4.2's rabbit_channel).

A delivery (basic.deliver or basic.get-ok) left unacked for longer than its queue's
timeout closes its channel, at the next channel tick, with
`406 PRECONDITION_FAILED - delivery acknowledgement on channel N timed out. Timeout
value used: T ms. This timeout value can be configured, see consumers doc guide to
learn more` (class and method 0), and its unacked messages return to the queue,
redelivered. The timeout: the lower of x-consumer-timeout and a consumer-timeout
policy, else the node's consumer_timeout (`"undefined"`: none). Classic and quorum
queues alike.
"""

from __future__ import annotations

import pytest
from pamqp import commands

from quorumqueue.broker.groups import metadata as meta
from quorumqueue.broker.config import Settings
from quorumqueue.broker.node.policies import parse_policy

from .harness import Client, Delivery, method, name, new_node

QUEUE_TYPES = ("classic", "quorum")


def text(channel: int, timeout: int) -> str:
    return (f"PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out. "
            f"Timeout value used: {timeout} ms. This timeout value can be configured, see "
            "consumers doc guide to learn more")


def node_with(**settings):
    # a channel tick every 100 ms (RabbitMQ's channel_tick_interval, 60 s by default)
    return new_node(Settings(channel_tick_interval_ms=100, **settings))


def connect(node, channel: int = 1) -> Client:
    client = Client(node, now=node.now)
    client.handshake()
    client.open_channel(channel)
    return client


def at(node, clients, now: float) -> None:
    """Time passes to `now`: the node's clock (what deliveries are stamped with) and
    every session's tick, as the server's ticker does."""
    node.set_clock(now, int(now * 1000))
    for client in clients:
        client.now = now
        client.session.tick(now)


def declare(client: Client, queue: str, queue_type: str, **arguments):
    return client.declare_queue(1, queue, durable=True,
                                arguments={"x-queue-type": queue_type, **arguments})


def consume(client: Client, queue: str, channel: int = 1, no_ack: bool = False) -> list:
    """basic.consume; the deliveries that came with the consume-ok."""
    client.send(channel, method(commands.Basic.Consume, queue=queue, consumer_tag="c",
                                no_ack=no_ack))
    replies = client.read_deliveries()
    assert name(replies[0][1]) == "Basic.ConsumeOk", replies
    return [d for d in replies if isinstance(d, Delivery)]


def channel_close(client: Client):
    frames = client.read_methods()
    closes = [value for _channel, value in frames if name(value) == "Channel.Close"]
    return closes[0] if closes else None


def set_policy(node, definition: dict, apply_to: str = "queues") -> None:
    policy = parse_policy("/", "timeout", ".*", definition, 0, apply_to)
    node.cluster.meta.propose_data(meta.encode("policy.set", policy=policy.as_dict()),
                                   lambda _reply: None)
    node.flush()


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_an_unacked_delivery_past_the_timeout_closes_the_channel_and_comes_back(queue_type):
    node = node_with()
    client = connect(node)
    declare(client, "work", queue_type, **{"x-consumer-timeout": 1000})
    client.publish(1, "", "work", b"job")
    first = consume(client, "work")
    assert [d.body for d in first] == [b"job"] and not first[0].method.redelivered

    at(node, [client], 1.0)        # 1000 ms: not over the timeout yet
    assert channel_close(client) is None
    at(node, [client], 1.2)        # over it, at the next channel tick
    close = channel_close(client)
    assert (close.reply_code, close.reply_text) == (406, text(1, 1000))
    assert (close.class_id, close.method_id) == (0, 0)  # no method failed: RabbitMQ's too

    other = connect(node)
    again = consume(other, "work")
    assert [d.body for d in again] == [b"job"] and again[0].method.redelivered
    # the connection stays open: a channel error
    client.open_channel(2)


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_a_basic_get_delivery_times_out_too(queue_type):
    # RabbitMQ records basic.get's manual-ack deliveries as pending acks as well
    # (consumer_timeout_SUITE's consumer_timeout_basic_get)
    node = node_with(consumer_timeout_ms=500)
    client = connect(node)
    declare(client, "polled", queue_type)
    client.publish(1, "", "polled", b"m")
    assert client.get(1, "polled", no_ack=False).body == b"m"
    at(node, [client], 0.7)
    close = channel_close(client)
    assert (close.reply_code, close.reply_text) == (406, text(1, 500))
    other = connect(node)
    again = other.get(1, "polled", no_ack=False)
    assert again.body == b"m" and again.method.redelivered


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_acked_in_time_or_no_ack_never_times_out(queue_type):
    node = node_with(consumer_timeout_ms=500)
    client = connect(node)
    declare(client, "fast", queue_type)
    declare(client, "auto", queue_type)
    client.publish(1, "", "fast", b"a")
    client.publish(1, "", "auto", b"b")
    [delivery] = consume(client, "fast")
    at(node, [client], 0.4)
    client.send(1, commands.Basic.Ack(delivery_tag=delivery.method.delivery_tag))
    client.open_channel(2)
    assert [d.body for d in consume(client, "auto", channel=2, no_ack=True)] == [b"b"]
    at(node, [client], 60.0)
    assert channel_close(client) is None


def test_argument_and_policy_the_lower_wins_over_the_configuration():
    node = node_with(consumer_timeout_ms=60_000)
    set_policy(node, {"consumer-timeout": 2000})
    client = connect(node)
    declare(client, "both", "quorum", **{"x-consumer-timeout": 3000})
    declare(client, "argument", "classic", **{"x-consumer-timeout": 1000})
    declare(client, "policy", "classic")
    client.publish(1, "", "both", b"x")
    client.publish(1, "", "argument", b"y")
    client.publish(1, "", "policy", b"z")
    for number, queue in ((2, "both"), (3, "argument"), (4, "policy")):
        client.open_channel(number)
        consume(client, queue, channel=number)
    at(node, [client], 1.5)   # over the argument's 1000 ms, under the policy's 2000
    close = channel_close(client)
    assert close.reply_text == text(3, 1000)
    at(node, [client], 2.5)   # the policy's 2000 ms, lower than both's argument
    closes = [value for _c, value in client.read_methods() if name(value) == "Channel.Close"]
    assert sorted(c.reply_text for c in closes) == [text(2, 2000), text(4, 2000)]


def test_a_policy_set_after_the_delivery_counts():
    # rabbit_channel reads the queue's policy when it checks, not when it delivered
    node = node_with()
    client = connect(node)
    declare(client, "later", "classic")
    client.publish(1, "", "later", b"x")
    consume(client, "later")
    at(node, [client], 5.0)
    assert channel_close(client) is None   # 30 minutes by default
    set_policy(node, {"consumer-timeout": 3000}, apply_to="classic_queues")
    at(node, [client], 5.2)
    assert channel_close(client).reply_text == text(1, 3000)


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_no_timeout_when_the_configuration_says_undefined(queue_type):
    # RabbitMQ 4.2 turns the timeout off only globally ({consumer_timeout, undefined});
    # an argument or policy value of 0 is a timeout of 0 ms, not "off"
    node = node_with(consumer_timeout_ms=None)
    client = connect(node)
    declare(client, "forever", queue_type)
    declare(client, "zero", queue_type, **{"x-consumer-timeout": 0})
    client.publish(1, "", "forever", b"x")
    consume(client, "forever")
    at(node, [client], 10 ** 7)   # four months
    assert channel_close(client) is None
    client.publish(1, "", "zero", b"y")
    client.open_channel(2)
    consume(client, "zero", channel=2)
    at(node, [client], 10 ** 7 + 0.2)
    close = channel_close(client)
    assert close.reply_text == text(2, 0)


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_what_the_channel_published_and_had_confirmed_stays(queue_type):
    node = node_with(consumer_timeout_ms=1000)
    client = connect(node)
    declare(client, "in", queue_type)
    declare(client, "out", queue_type)
    client.publish(1, "", "in", b"task")
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    assert [d.body for d in consume(client, "in")] == [b"task"]
    client.publish(1, "", "out", b"result")
    acks = [value for _c, value in client.read_methods() if name(value) == "Basic.Ack"]
    assert [a.delivery_tag for a in acks] == [1]
    at(node, [client], 1.2)
    assert channel_close(client).reply_code == 406
    reader = connect(node)
    assert reader.get(1, "out").body == b"result"
    assert reader.get(1, "in").body == b"task"
    assert reader.get(1, "out") is None and reader.get(1, "in") is None


def test_only_the_tick_checks_and_the_oldest_delivery_decides():
    # RabbitMQ looks at the channel's oldest unacked delivery, every channel tick
    node = new_node(Settings(channel_tick_interval_ms=10_000, consumer_timeout_ms=1000))
    client = connect(node)
    declare(client, "q", "classic")
    client.publish(1, "", "q", b"1")
    client.publish(1, "", "q", b"2")
    first, _second = consume(client, "q")
    at(node, [client], 5.0)       # past the timeout, but no tick yet
    assert channel_close(client) is None
    client.send(1, commands.Basic.Ack(delivery_tag=first.method.delivery_tag))
    at(node, [client], 10.0)      # the tick: the oldest unacked is the second
    assert channel_close(client).reply_text == text(1, 1000)


@pytest.mark.parametrize("arguments, detail", [
    ({"x-consumer-timeout": -1}, "invalid arg 'x-consumer-timeout' for queue 'q' in vhost "
                                 "'/': {value_negative,-1}"),
    ({"x-consumer-timeout": "60000"}, "invalid arg 'x-consumer-timeout' for queue 'q' in "
                                      "vhost '/': \"expected integer, got longstr\""),
])
def test_an_invalid_x_consumer_timeout_is_refused(arguments, detail):
    node = node_with()
    client = connect(node)
    client.send(1, method(commands.Queue.Declare, queue="q", durable=True,
                          arguments=arguments))
    close = channel_close(client)
    assert (close.reply_code, close.reply_text) == (406, f"PRECONDITION_FAILED - {detail}")

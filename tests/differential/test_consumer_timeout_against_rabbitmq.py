"""The delivery acknowledgement timeout against RabbitMQ 3.10.8 (the consumers guide's
"Delivery Acknowledgement Timeout").

Both brokers get consumer_timeout = 2000 in their configuration (rabbitmq.conf; 3.10.8
knows only this global setting: x-consumer-timeout and the consumer-timeout policy
came in 3.12, so they are compared with the 4.2 guide in
tests/broker/server/test_consumer_timeout.py, not here) and a channel tick of 500 ms
(RabbitMQ's channel_tick_interval, an advanced.config key; 60 s by default, which
would make this test wait a minute). A consumer, or a basic.get, that never acks
then sees the same thing on both: its channel closed with the same 406 text while the
connection stays open, and the message given to the next consumer, redelivered. On
classic and quorum queues.
"""

from __future__ import annotations

import pika
import pytest

from tests.broker.server.pika_support import pump, unique
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode

pytestmark = pytest.mark.timeout(240)

TIMEOUT_MS = 2000


@pytest.fixture(scope="module")
def rabbitmq_with_timeout():
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with RabbitMQNode(extra_config=f"consumer_timeout = {TIMEOUT_MS}",
                      advanced_config="[{rabbit, [{channel_tick_interval, 500}]}].") as node:
        yield node


@pytest.fixture(scope="module")
def broker_with_timeout():
    with BrokerProcess(extra_config=f"consumer_timeout = {TIMEOUT_MS}\n"
                                    "channel_tick_interval = 500\n") as process:
        yield process


def outcome(uri: str, queue_type: str, use_get: bool) -> dict:
    """Publish one message, take it without acking (basic.consume or basic.get), wait
    (bounded) for the broker to close the channel; then take it on a new connection."""
    queue = unique(f"timeout-{queue_type}")
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    closes = []  # the close, as the channel underneath the blocking one reports it
    channel._impl.add_on_close_callback(lambda _channel, reason: closes.append(reason))
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
    channel.basic_publish("", queue, b"job", pika.BasicProperties(delivery_mode=2))
    received = []
    if use_get:  # until the queue has the message (a quorum queue's enqueue is async)
        def got() -> bool:
            if channel.basic_get(queue)[2] is not None:
                received.append(1)
            return bool(received)
        pump(connection, got, timeout=30)
    else:
        channel.basic_consume(queue, lambda *_args: received.append(1))
        pump(connection, lambda: received, timeout=30)
    pump(connection, lambda: closes, timeout=60)
    connection_open = connection.is_open
    connection.close()

    other = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        again = other.channel()
        seen = []
        again.basic_consume(queue, lambda ch, method, _p, body: (
            seen.append((body, method.redelivered)), ch.basic_ack(method.delivery_tag)))
        pump(other, lambda: seen, timeout=60)
        again.queue_delete(queue)
    finally:
        other.close()
    return {"close": (type(closes[0]).__name__, closes[0].reply_code, closes[0].reply_text),
            "connection still open": connection_open, "next consumer got": seen[0]}


@pytest.mark.parametrize("use_get", [False, True], ids=["consume", "get"])
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_the_channel_close_and_the_redelivery_are_rabbitmqs(rabbitmq_with_timeout,
                                                            broker_with_timeout, queue_type,
                                                            use_get):
    theirs = outcome(rabbitmq_with_timeout.uri, queue_type, use_get)
    ours = outcome(broker_with_timeout.uri, queue_type, use_get)
    assert ours == theirs
    assert theirs == {
        "close": ("ChannelClosedByBroker", 406,
                  "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. "
                  f"Timeout value used: {TIMEOUT_MS} ms. This timeout value can be "
                  "configured, see consumers doc guide to learn more"),
        "connection still open": True, "next consumer got": (b"job", True)}

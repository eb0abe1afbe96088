"""The delivery acknowledgement timeout on a running broker, seen by a pika client
(the consumers guide's "Delivery Acknowledgement Timeout", RabbitMQ 4.2).

A consumer that never acks has its channel closed with `406 PRECONDITION_FAILED -
delivery acknowledgement on channel N timed out. Timeout value used: T ms. This
timeout value can be configured, see consumers doc guide to learn more`; the
connection stays open and the message goes to another consumer, redelivered. T is
the lower of x-consumer-timeout and a consumer-timeout policy, else the node's
consumer_timeout. This module's broker checks every 500 ms (channel_tick_interval;
RabbitMQ checks every minute) and has consumer_timeout = 2000.
"""

from __future__ import annotations

import pika
import pytest
from pika import exceptions as pe

from tests.support.broker import BrokerProcess

from .pika_support import connect, pump, unique
from .test_definitions import ctl

pytestmark = pytest.mark.timeout(180)

CONFIG = "consumer_timeout = 2000\nchannel_tick_interval = 500\n"


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(extra_config=CONFIG) as process:
        yield process


def text(channel: int, timeout: int) -> str:
    return (f"PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out. "
            f"Timeout value used: {timeout} ms. This timeout value can be configured, see "
            "consumers doc guide to learn more")


def declare(channel, queue: str, queue_type: str, **arguments) -> None:
    channel.queue_declare(queue, durable=True,
                          arguments={"x-queue-type": queue_type, **arguments})


def never_ack(connection, channel, queue: str) -> tuple[list, pe.ChannelClosedByBroker]:
    """Consume `queue` without acking until the broker closes the channel (bounded:
    60 s); returns the bodies received and the close."""
    received = []
    channel.basic_consume(queue, lambda _ch, _method, _props, body: received.append(body))
    guard = connection.call_later(60, channel.stop_consuming)
    with pytest.raises(pe.ChannelClosedByBroker) as closed:
        channel.start_consuming()
    connection.remove_timeout(guard)
    return received, closed.value


def redelivered_to_another_consumer(broker, queue: str) -> tuple[bytes, bool]:
    other = connect(broker)
    try:
        channel = other.channel()
        seen = []
        channel.basic_consume(queue, lambda ch, method, _p, body: (
            seen.append((body, method.redelivered)), ch.basic_ack(method.delivery_tag)))
        pump(other, lambda: seen, timeout=60)
        return seen[0]
    finally:
        other.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_consumer_that_never_acks_loses_its_channel_and_the_message_goes_on(broker,
                                                                              queue_type):
    queue = unique(f"stuck-{queue_type}")
    connection = connect(broker)
    channel = connection.channel()
    declare(channel, queue, queue_type, **{"x-consumer-timeout": 1000})
    channel.basic_publish("", queue, b"job", pika.BasicProperties(delivery_mode=2))
    received, closed = never_ack(connection, channel, queue)
    assert received == [b"job"]
    assert (closed.reply_code, closed.reply_text) == (406, text(channel.channel_number, 1000))
    assert connection.is_open  # a channel error only
    assert redelivered_to_another_consumer(broker, queue) == (b"job", True)
    connection.close()


def test_without_a_queue_setting_the_configuration_applies_to_basic_get_too(broker):
    queue = unique("polled")
    connection = connect(broker)
    channel = connection.channel()
    declare(channel, queue, "classic")
    channel.basic_publish("", queue, b"m")
    closes = []  # the close, as the channel underneath the blocking one reports it
    channel._impl.add_on_close_callback(lambda _channel, reason: closes.append(reason))
    _method, _props, body = channel.basic_get(queue, auto_ack=False)
    assert body == b"m"
    pump(connection, lambda: closes, timeout=60)
    assert isinstance(closes[0], pe.ChannelClosedByBroker)
    assert (closes[0].reply_code, closes[0].reply_text) == (406, text(1, 2000))
    assert redelivered_to_another_consumer(broker, queue) == (b"m", True)
    connection.close()


def test_a_policy_lower_than_the_argument_wins(broker):
    queue = unique("policed")
    ctl(broker, "set_policy", "consumer-timeout", f"^{queue}$", '{"consumer-timeout": 1500}',
        "--apply-to", "quorum_queues")
    try:
        connection = connect(broker)
        channel = connection.channel()
        declare(channel, queue, "quorum", **{"x-consumer-timeout": 5000})
        channel.basic_publish("", queue, b"x")
        _received, closed = never_ack(connection, channel, queue)
        assert closed.reply_text == text(channel.channel_number, 1500)
        connection.close()
    finally:
        ctl(broker, "clear_policy", "consumer-timeout")

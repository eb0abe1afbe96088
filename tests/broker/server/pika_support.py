"""Helpers for the pika BlockingConnection conformance tests (test_pika_blocking*.py).

Small, synchronous helpers over pika's public API: connecting with parameter
overrides, asserting a broker-side channel close, pumping I/O until a condition
holds, and collecting deliveries.
"""

from __future__ import annotations

import time
import uuid

import pika
import pytest
from pika import exceptions as pe


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def connect(broker, **options) -> pika.BlockingConnection:
    parameters = pika.URLParameters(broker.uri)
    for name, value in options.items():
        setattr(parameters, name, value)
    return pika.BlockingConnection(parameters)


def channel_error(action) -> pe.ChannelClosedByBroker:
    """Run `action`, which must make the broker close the channel; returns the error."""
    with pytest.raises(pe.ChannelClosedByBroker) as info:
        action()
    return info.value


def wait_get(channel, queue: str, timeout: float = 60.0, auto_ack: bool = True):
    """basic.get until a message arrives: (method, properties, body); fail after
    `timeout` seconds (a generous bound on the condition)."""
    deadline = time.monotonic() + timeout
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            return method, properties, body
        assert time.monotonic() < deadline, f"nothing reached '{queue}'"
        time.sleep(0.05)


def pump(connection, until, timeout: float = 60.0) -> None:
    """Process I/O until `until()` holds (or fail after `timeout` seconds: a generous
    bound, the condition is what the test waits for; a loaded machine is slow)."""
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within %.1fs" % timeout)
        connection.process_data_events(time_limit=0.02)


def idle(connection, seconds: float = 0.2) -> None:
    """Let anything in flight arrive (used before asserting that nothing more came)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.02)


def publish_bodies(channel, queue: str, bodies, **properties) -> None:
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(**properties))


def get_bodies(channel, queue: str) -> list[bytes]:
    bodies = []
    while True:
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def ready_count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


class Collector:
    """An on_message_callback that records (consumer_tag, delivery_tag, redelivered, body)."""

    def __init__(self) -> None:
        self.deliveries = []

    def __call__(self, channel, method, properties, body) -> None:
        self.deliveries.append((method.consumer_tag, method.delivery_tag, method.redelivered,
                                body))

    @property
    def bodies(self) -> list[bytes]:
        return [delivery[3] for delivery in self.deliveries]

    def __len__(self) -> int:
        return len(self.deliveries)


def consume_bodies(channel, queue: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """`count` bodies consumed from `queue` with manual acks, in delivery order; fails
    naming how many came if the queue falls silent for `timeout` seconds first."""
    got = []
    for method, _properties, data in channel.consume(queue, inactivity_timeout=timeout):
        assert method is not None, f"only {len(got)} of {count} came back from '{queue}'"
        got.append(data)
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.cancel()
    return got

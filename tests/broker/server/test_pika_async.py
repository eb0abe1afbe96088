"""pika's asynchronous adapters (SelectConnection, AsyncioConnection) against the
bundled broker: the callback-driven flow a RabbitMQ user writes.

Each scenario is a small state machine of pika callbacks; the test asserts the
sequence of events the client observed. Both adapters run the same scenarios.
"""

from __future__ import annotations

import asyncio
import uuid

import pika
import pytest
from pika import exceptions as pe
from pika.adapters.asyncio_connection import AsyncioConnection

pytestmark = pytest.mark.timeout(60)

MESSAGES = 200
DEADLINE = 10.0


class Adapter:
    """Starts, stops and times out one adapter's I/O loop the same way."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop() if kind == "asyncio" else None

    def connect(self, parameters, **callbacks):
        if self.kind == "asyncio":
            return AsyncioConnection(parameters, custom_ioloop=self.loop, **callbacks)
        return pika.SelectConnection(parameters, **callbacks)

    def run(self, connection) -> None:
        ioloop = connection.ioloop
        ioloop.call_later(DEADLINE, ioloop.stop)
        if self.kind == "asyncio":
            self.loop.run_forever()
        else:
            ioloop.start()

    def stop(self, connection) -> None:
        connection.ioloop.stop()

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()


@pytest.fixture(params=["select", "asyncio"])
def adapter(request):
    adapter = Adapter(request.param)
    yield adapter
    adapter.close()


class ConfirmConsumeFlow:
    """connect -> channel -> queue.declare -> confirm.select -> publish N -> wait for
    every confirm -> basic.qos -> consume with manual acks -> cancel -> close."""

    def __init__(self, adapter: Adapter, uri: str) -> None:
        self.adapter = adapter
        self.queue = f"async-{uuid.uuid4().hex[:10]}"
        self.events: list[str] = []
        self.confirmed: set[int] = set()
        self.nacked: set[int] = set()
        self.received: list[tuple[bytes, bool]] = []
        self.channel_close_reason = None
        self.connection_close_reason = None
        self.connection = adapter.connect(
            pika.URLParameters(uri), on_open_callback=self.on_open,
            on_open_error_callback=self.on_open_error, on_close_callback=self.on_closed)

    def on_open(self, connection) -> None:
        self.events.append("connection.open")
        connection.channel(on_open_callback=self.on_channel_open)

    def on_open_error(self, connection, error) -> None:
        self.events.append(f"open-error {error!r}")
        self.adapter.stop(connection)

    def on_channel_open(self, channel) -> None:
        self.events.append("channel.open")
        self.channel = channel
        channel.add_on_close_callback(self.on_channel_closed)
        channel.queue_declare(self.queue, auto_delete=True, callback=self.on_declared)

    def on_declared(self, frame) -> None:
        self.events.append("queue.declare-ok")
        self.channel.confirm_delivery(ack_nack_callback=self.on_confirm,
                                      callback=self.on_confirm_selected)

    def on_confirm_selected(self, frame) -> None:
        self.events.append("confirm.select-ok")
        for index in range(MESSAGES):
            self.channel.basic_publish("", self.queue, str(index).encode(),
                                       pika.BasicProperties(delivery_mode=1))

    def on_confirm(self, frame) -> None:
        method = frame.method
        lowest = 1 if method.multiple else method.delivery_tag
        tags = set(range(lowest, method.delivery_tag + 1)) - self.confirmed - self.nacked
        (self.confirmed if isinstance(method, pika.spec.Basic.Ack) else self.nacked).update(tags)
        if len(self.confirmed) + len(self.nacked) == MESSAGES:
            self.events.append("all confirmed")
            self.channel.basic_qos(prefetch_count=20, callback=self.on_qos)

    def on_qos(self, frame) -> None:
        self.events.append("basic.qos-ok")
        self.consumer_tag = self.channel.basic_consume(self.queue, self.on_message,
                                                       auto_ack=False)

    def on_message(self, channel, method, properties, body) -> None:
        self.received.append((body, method.redelivered))
        channel.basic_ack(method.delivery_tag)
        if len(self.received) == MESSAGES:
            self.events.append("all received")
            channel.basic_cancel(self.consumer_tag, callback=self.on_cancelled)

    def on_cancelled(self, frame) -> None:
        self.events.append("basic.cancel-ok")
        self.channel.close()

    def on_channel_closed(self, channel, reason) -> None:
        self.events.append("channel.closed")
        self.channel_close_reason = reason
        if self.connection.is_open:
            self.connection.close()

    def on_closed(self, connection, reason) -> None:
        self.events.append("connection.closed")
        self.connection_close_reason = reason
        self.adapter.stop(connection)


def test_confirm_publish_consume_ack_and_close(broker, adapter):
    """The canonical async flow: confirm.select (RabbitMQ extension) acks every publish
    with increasing tags; basic.consume with manual basic.ack delivers all messages in
    order, none redelivered; channel.close and connection.close complete with 200."""
    flow = ConfirmConsumeFlow(adapter, broker.uri)
    adapter.run(flow.connection)
    assert flow.events == [
        "connection.open", "channel.open", "queue.declare-ok", "confirm.select-ok",
        "all confirmed", "basic.qos-ok", "all received", "basic.cancel-ok",
        "channel.closed", "connection.closed"], flow.events
    assert flow.confirmed == set(range(1, MESSAGES + 1))
    assert flow.nacked == set()
    assert flow.received == [(str(i).encode(), False) for i in range(MESSAGES)]
    assert isinstance(flow.channel_close_reason, pe.ChannelClosedByClient)
    assert isinstance(flow.connection_close_reason, pe.ConnectionClosedByClient)
    assert flow.connection_close_reason.reply_code == 200


class ChannelErrorFlow:
    """A passive declare of a missing queue closes the channel (404); the connection
    stays open and a new channel works."""

    def __init__(self, adapter: Adapter, uri: str) -> None:
        self.adapter = adapter
        self.missing = f"missing-{uuid.uuid4().hex[:10]}"
        self.events: list[str] = []
        self.connection = adapter.connect(pika.URLParameters(uri),
                                          on_open_callback=self.on_open,
                                          on_close_callback=self.on_closed)

    def on_open(self, connection) -> None:
        connection.channel(on_open_callback=self.on_first_channel)

    def on_first_channel(self, channel) -> None:
        channel.add_on_close_callback(self.on_first_closed)
        channel.queue_declare(self.missing, passive=True,
                              callback=lambda frame: self.events.append("unexpected ok"))

    def on_first_closed(self, channel, reason) -> None:
        self.events.append((type(reason).__name__, reason.reply_code, reason.reply_text))
        self.connection.channel(on_open_callback=self.on_second_channel)

    def on_second_channel(self, channel) -> None:
        channel.queue_declare("", exclusive=True, callback=self.on_declared)

    def on_declared(self, frame) -> None:
        self.events.append(frame.method.queue.startswith("amq.gen-"))
        self.connection.close()

    def on_closed(self, connection, reason) -> None:
        self.events.append(type(reason).__name__)
        self.adapter.stop(connection)


def test_channel_error_leaves_connection_usable(broker, adapter):
    """A soft error (404 on queue.declare passive) closes only the channel; pika's
    channel close callback gets ChannelClosedByBroker and the connection goes on."""
    flow = ChannelErrorFlow(adapter, broker.uri)
    adapter.run(flow.connection)
    assert flow.events == [
        ("ChannelClosedByBroker", 404, f"NOT_FOUND - no queue '{flow.missing}' in vhost '/'"),
        True, "ConnectionClosedByClient"]

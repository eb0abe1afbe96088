"""Client side of durable leases (wire form: docs/behaviour/leases.md), over pika.

    with LeaseClient(uri) as client:
        first, end = client.grow("orders", "query-1", max_messages=1000)
        for message in client.read("orders", "query-1", first - 1, end):
            ...                     # message.seq, .body, .properties, .routing_key
        client.settle("orders", "query-1", end)

One BlockingConnection per client, one request at a time: control operations go
through the management RPC (answered once the command is committed), reads through
a no-ack basic.consume that the broker ends with a basic.cancel (pika's consume
generator: a channel the broker closes part-way raises ChannelClosedByBroker).

`read` takes one delivery per message (x-lease-seq in its headers, as any AMQP
client would see it); `read_packed` asks for the packed form (x-lease-format, see
lease_records.py) and yields the messages in chunks as the deliveries arrive: pika
then decodes a few frames per thousand messages, and messages published with the
same properties share one decoded `pika.BasicProperties` (do not mutate it). Its
headers never hold x-lease-seq (that is `seq`) and are `{}` rather than None, as
`read` gives them (which always adds x-lease-seq); x-delivery-count is set as
`read` sets it.
"""

from __future__ import annotations

import json
import ssl
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika

from ..broker.amqp.lease_records import PACKED_FORMAT
from .delivery import Delivery
from .lease_records import PackedDecoder, PackedRecords
from .tls import ClientTls, connection_parameters
from .management import REPLY_TO, ROUTING_KEY, ManagementError, redact_uri


class LeaseClient:
    def __init__(self, uri: str, vhost: str = "/", timeout: float = 30.0,
                 tls: ClientTls | None = None) -> None:
        self.vhost = vhost
        self.timeout = timeout
        try:
            self.connection = pika.BlockingConnection(connection_parameters(uri, tls))
        except (ValueError, ssl.SSLError) as error:  # TLS settings or a refused certificate
            raise ManagementError(f"{redact_uri(uri)}: {error}") from None
        except pika.exceptions.AMQPConnectionError as error:
            raise ManagementError(f"cannot connect to {redact_uri(uri)}: {error!r}. Is the broker "
                                  "running?") from None
        self.channel = self.connection.channel()
        self._replies: dict[str, bytes] = {}
        self.channel.basic_consume(REPLY_TO, self._on_reply, auto_ack=True)

    def _on_reply(self, _channel, _method, properties, body: bytes) -> None:
        self._replies[properties.correlation_id] = body

    def call(self, op: str, **arguments) -> Any:
        correlation_id = uuid.uuid4().hex
        self.channel.basic_publish(
            "", ROUTING_KEY, json.dumps({"op": op, "vhost": self.vhost, **arguments}).encode(),
            pika.BasicProperties(reply_to=REPLY_TO, correlation_id=correlation_id,
                                 content_type="application/json"))
        deadline = time.monotonic() + self.timeout
        while correlation_id not in self._replies:
            if time.monotonic() >= deadline:
                raise ManagementError(f"no reply to '{op}' within {self.timeout}s")
            self.connection.process_data_events(time_limit=0.05)
        answer = json.loads(self._replies.pop(correlation_id))
        if not answer.get("ok"):
            raise ManagementError(answer.get("error", "unknown error"))
        return answer["result"]

    # --------------------------------------------------------------- operations

    def grow(self, queue: str, lease: str, max_messages: int, max_bytes: int = 0,
             timeout_ms: int | None = None) -> tuple[int, int]:
        """Assign up to max_messages (and about max_bytes) more ready messages to the
        lease; returns (first new sequence, end sequence). first > end: none were ready.
        timeout_ms: the lease's idle timeout (0: never; None: the broker's
        lease_timeout). A fenced lease is refused (ManagementError, PRECONDITION_FAILED
        naming what went back to the queue)."""
        timeout = {} if timeout_ms is None else {"timeout_ms": timeout_ms}
        result = self.call("lease.grow", queue=queue, lease=lease, max_messages=max_messages,
                           max_bytes=max_bytes, **timeout)
        return result["first"], result["end"]

    def settle(self, queue: str, lease: str, up_to: int) -> int:
        return self.call("lease.settle", queue=queue, lease=lease, up_to=up_to)["settled"]

    def release(self, queue: str, lease: str, fence: bool = True) -> int:
        """Return the lease's unsettled messages to the queue. `fence` (an operator's
        release) makes the lease refuse its holder afterwards if it held any; its
        holder releasing its own lease passes False."""
        return self.call("lease.release", queue=queue, lease=lease, fence=fence)["released"]

    def info(self, queue: str, lease: str) -> dict:
        return self.call("lease.info", queue=queue, lease=lease)

    def ready(self, queue: str) -> int:
        """Ready messages in `queue` (a passive queue.declare), the answer awaited at
        most `timeout` like every request here (ManagementError "no reply ..."); a
        refusal (404: no such queue) raises pika's ChannelClosedByBroker, as
        `channel.queue_declare` does. That one waits for ever: a broker that never
        answers would hold its caller (the connector's driver) for good."""
        answers: list = []

        def answered(frame) -> None:
            answers.append(frame)
            # a due timer ends process_data_events at once; the answer alone would
            # leave it waiting for its whole time limit (50 ms a count, before)
            self.connection.call_later(0, _nothing)

        # the callback form of the method pika's blocking queue_declare wraps
        self.channel._impl.queue_declare(queue, passive=True, callback=answered)
        deadline = time.monotonic() + self.timeout
        while not answers:
            if self.channel.is_closed:
                reason = self.channel._closing_reason  # what the blocking form raises
                if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
                    raise reason
                raise pika.exceptions.ChannelWrongStateError(f"channel closed: {reason!r}")
            if time.monotonic() >= deadline:
                raise ManagementError(f"no reply to 'queue.declare' within {self.timeout}s")
            self.connection.process_data_events(time_limit=0.05)
        return answers[0].method.message_count

    def read(self, queue: str, lease: str, start: int, end: int) -> list[Delivery]:
        """The messages with lease sequences start+1..end, in order; settles nothing."""
        arguments = {"x-lease": lease, "x-lease-start": start, "x-lease-end": end}
        return [Delivery(int((properties.headers or {})["x-lease-seq"]), body,
                              method.exchange, method.routing_key, method.redelivered,
                              properties)
                for method, properties, body in self._range(queue, lease, arguments)]

    def read_packed(self, queue: str, lease: str, start: int,
                    end: int) -> Iterator[PackedRecords]:
        """The messages with lease sequences start+1..end, in order, in chunks as they
        arrive (packed form); settles nothing."""
        decoder = PackedDecoder()
        arguments = {"x-lease": lease, "x-lease-start": start, "x-lease-end": end,
                     "x-lease-format": PACKED_FORMAT}
        for _method, _properties, body in self._range(queue, lease, arguments):
            yield decoder.decode(body)

    def _range(self, queue: str, lease: str, arguments: dict) -> Iterator[tuple]:
        """The deliveries of a lease range, until the broker cancels the consumer (the
        range is complete). A refusal, before or during the range, raises pika's
        ChannelClosedByBroker; a range that stalls raises ManagementError."""
        what = f"reading lease '{lease}' ({arguments['x-lease-start']}, " \
               f"{arguments['x-lease-end']}]"
        try:
            for method, properties, body in self.channel.consume(
                    queue, auto_ack=True, arguments=arguments,
                    inactivity_timeout=self.timeout):
                if method is None:
                    raise ManagementError(f"{what} stalled for {self.timeout}s")
                yield method, properties, body
        finally:
            if self.channel.is_open:
                self.channel.cancel()  # a range left part-way: forget its consumer

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()

    def __enter__(self) -> "LeaseClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _nothing() -> None:
    pass

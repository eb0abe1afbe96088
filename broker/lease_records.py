"""The packed form of a lease read: many messages to one delivery body; no I/O.

Responsibilities
    `pack_records` (the broker, node/leases.py) turns a lease range's messages into
    delivery bodies; `PackedDecoder` (the client, lease_client.py) turns them back
    into `LeasedMessage`s. A reader asks for this form with the consume argument
    `x-lease-format` = "packed" (broker/README.md, "Leases (wire form)").

How it works
    A body is a run of records, one per message in sequence order. A record is
    `PACKED_RECORD` (lease sequence u64, delivery count u32, exchange length u8,
    routing key length u8, content header length u32, body length u32; big-endian)
    followed by the exchange, the routing key, the content header payload exactly as
    published (the broker adds no x-lease-seq and no x-delivery-count) and the body.
    A body holds records until PACK_BYTES or PACK_MESSAGES is reached; a message is
    never split over two bodies. The decoder decodes each distinct published property
    block once (pika's decoder) and shares the result between the messages that have it.

Invariants
    - Decoded messages equal what a per-message lease read gives (same seq, body,
      exchange, routing key, redelivered, properties), except that the properties'
      headers hold no x-lease-seq and are `{}` where the publisher sent none; when
      the delivery count is above 0, x-delivery-count replaces the publisher's and
      comes after every other header, as the broker's per-message form sets it.
    - Shared properties objects must not be mutated.

Not here
    Consuming (lease_client.py), choosing the range (fifo/leases.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pika
import pika.spec

PACKED_FORMAT = "packed"
PACKED_CONTENT_TYPE = "application/x-quorumqueue-lease-records"
PACKED_RECORD = struct.Struct(">QIBBII")
PACK_BYTES = 256 * 1024
PACK_MESSAGES = 1000

# The content header payload: class id, weight, body size, then the properties.
_PROPERTIES_AT = 12
# Headers the broker sets on a per-message lease read (replacing the publisher's).
_LEASE_HEADERS = ("x-lease-seq", "x-delivery-count")
# Distinct property blocks a decoder remembers (messages with unique headers).
_MAX_REMEMBERED = 10_000


@dataclass(frozen=True, slots=True)
class LeasedMessage:
    seq: int
    body: bytes
    exchange: str
    routing_key: str
    redelivered: bool
    properties: pika.BasicProperties

    @property
    def delivery_count(self) -> int:
        return header_delivery_count(self.properties)


def header_delivery_count(properties: pika.BasicProperties) -> int:
    """Earlier deliveries of a message, from its `x-delivery-count` header (0 if none)."""
    return int((properties.headers or {}).get("x-delivery-count", 0))


Packable = tuple[int, int, str, str, bytes, bytes]


def pack_records(messages: Iterable[Packable]) -> Iterator[bytes]:
    """Delivery bodies for (seq, delivery count, exchange, routing key, content header
    payload, body) tuples, in order."""
    parts: list[bytes] = []
    size = count = 0
    for seq, delivery_count, exchange, routing_key, header, body in messages:
        raw_exchange = exchange.encode("utf-8", "surrogateescape")
        raw_key = routing_key.encode("utf-8", "surrogateescape")
        head = PACKED_RECORD.pack(seq, delivery_count, len(raw_exchange), len(raw_key),
                                  len(header), len(body))
        parts += (head, raw_exchange, raw_key, header, body)
        size += len(head) + len(raw_exchange) + len(raw_key) + len(header) + len(body)
        count += 1
        if size >= PACK_BYTES or count >= PACK_MESSAGES:
            yield b"".join(parts)
            parts, size, count = [], 0, 0
    if parts:
        yield b"".join(parts)


class PackedDecoder:
    """Messages from packed delivery bodies; one per read (it caches properties)."""

    def __init__(self) -> None:
        self._properties: dict[bytes, pika.BasicProperties] = {}

    def decode(self, body: bytes) -> list[LeasedMessage]:
        messages = []
        record, unpack = PACKED_RECORD.size, PACKED_RECORD.unpack_from
        position, size = 0, len(body)
        while position < size:
            if position + record > size:
                raise ValueError(f"packed lease records: a record header is cut at octet "
                                 f"{position} of {size}")
            seq, count, exchange_length, key_length, header_length, body_length = unpack(
                body, position)
            position += record
            end = position + exchange_length + key_length + header_length + body_length
            if end > size or header_length < _PROPERTIES_AT + 2:
                raise ValueError(f"packed lease records: the record of sequence {seq} "
                                 f"runs past the body ({end} > {size} octets) or has no "
                                 "content header")
            exchange = body[position:position + exchange_length].decode(
                "utf-8", "surrogateescape")
            position += exchange_length
            routing_key = body[position:position + key_length].decode(
                "utf-8", "surrogateescape")
            position += key_length
            properties = self._decoded(
                body[position + _PROPERTIES_AT:position + header_length], count)
            position += header_length
            messages.append(LeasedMessage(seq, body[position:end], exchange, routing_key,
                                          count > 0, properties))
            position = end
        return messages

    def _decoded(self, raw: bytes, delivery_count: int) -> pika.BasicProperties:
        properties = self._properties.get(raw)
        if properties is None:
            properties = pika.spec.BasicProperties()
            properties.decode(raw)
            properties.headers = {key: value for key, value in
                                  (properties.headers or {}).items() if key != "x-lease-seq"}
            if len(self._properties) < _MAX_REMEMBERED:
                self._properties[raw] = properties
        if not delivery_count:
            return properties
        counted = pika.spec.BasicProperties(**vars(properties))
        counted.headers = ({key: value for key, value in properties.headers.items()
                            if key not in _LEASE_HEADERS}
                           | {"x-delivery-count": delivery_count})
        return counted

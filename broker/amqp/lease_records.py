"""The packed form of a lease read, as bytes: the record layout and its encoder; no I/O.

Responsibilities
    The wire codec of packed lease records (docs/behaviour/leases.md):
    `pack_raw_records` turns a lease range's messages into delivery bodies (the broker,
    node/leases.py, cuts them from its log entries; `pack_records` takes them
    decoded), and the constants name the format, its content type and the
    record layout that a decoder reads (quorumqueue.client.lease_records, which
    turns bodies back into messages).

Why here
    Both sides need the layout, and the broker must not import the client package
    (the client speaks through pika; `broker/` never imports it). The codec is pure
    (struct and bytes only), so it sits with the other AMQP wire formats in
    `broker/amqp/`, the lowest layer, which the client may import without pulling
    in anything of the broker above it. Decoding into pika properties is the
    client's side and lives there.

How it works
    A body is a run of records, one per message in sequence order. A record is
    `PACKED_RECORD` (lease sequence u64, delivery count u32, exchange length u8,
    routing key length u8, content header length u32, body length u32; big-endian)
    followed by the exchange, the routing key, the content header payload exactly as
    published (the broker adds no x-lease-seq and no x-delivery-count) and the body.
    A body holds records until PACK_BYTES or PACK_MESSAGES is reached.

Invariants
    - A message is never split over two bodies; records keep sequence order.
    - Names are UTF-8 with surrogateescape, so any AMQP short string round-trips.

Not here
    Decoding (quorumqueue.client.lease_records), choosing the range (fifo/leases.py),
    streaming deliveries (node/leases.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

PACKED_FORMAT = "packed"
PACKED_CONTENT_TYPE = "application/x-quorumqueue-lease-records"
PACKED_RECORD = struct.Struct(">QIBBII")
PACK_BYTES = 256 * 1024
PACK_MESSAGES = 1000
# In a record's content header payload: class id, weight and body size come first,
# the property flags and properties from this octet on.
PROPERTIES_AT = 12

Packable = tuple[int, int, str, str, bytes, bytes]
# (seq, delivery count, raw exchange, raw routing key, content header length, the
# content header followed by the body): bytes-like, typically views into log entries
RawPackable = tuple[int, int, "bytes | memoryview", "bytes | memoryview", int,
                    "bytes | memoryview"]


def pack_records(messages: Iterable[Packable]) -> Iterator[bytes]:
    """Delivery bodies for (seq, delivery count, exchange, routing key, content header
    payload, body) tuples, in order."""
    return pack_raw_records(
        (seq, count, exchange.encode("utf-8", "surrogateescape"),
         routing_key.encode("utf-8", "surrogateescape"), len(header), header + body)
        for seq, count, exchange, routing_key, header, body in messages)


def pack_raw_records(messages: Iterable[RawPackable]) -> Iterator[bytes]:
    """Delivery bodies for messages whose names are already bytes and whose content
    header and body come as one piece (RawPackable): the broker cuts them from its log
    entries, so each is copied once, into the delivery body."""
    parts: list = []
    size = count = 0
    pack, append = PACKED_RECORD.pack, parts.append
    for seq, delivery_count, exchange, routing_key, header_length, content in messages:
        exchange_length, key_length, content_length = (len(exchange), len(routing_key),
                                                       len(content))
        append(pack(seq, delivery_count, exchange_length, key_length, header_length,
                    content_length - header_length))
        append(exchange)
        append(routing_key)
        append(content)
        size += PACKED_RECORD.size + exchange_length + key_length + content_length
        count += 1
        if size >= PACK_BYTES or count >= PACK_MESSAGES:
            yield b"".join(parts)
            parts.clear()
            size = count = 0
    if parts:
        yield b"".join(parts)

"""The packed form of a lease read, as bytes: the record layout and its encoder; no I/O.

Responsibilities
    The wire codecs of bulk lease reads (docs/behaviour/leases.md):
    - "packed": `pack_raw_records` turns a lease range's messages into delivery bodies
      of records (the broker, node/leases.py, cuts them from its log entries;
      `pack_records` takes them decoded);
    - "entries": `pack_entries` sends the messages' log entries as they are stored
      (broker/raft/storage/FORMAT.md, "Quorum-queue entries"), behind a table of their
      lengths, so the broker decodes nothing and a reader finds every field with
      column operations (quorumqueue.client.lease_entries).
    The constants name the formats, their content types and the layouts that a decoder
    reads (quorumqueue.client.lease_records and lease_entries).

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

    An "entries" body is ENTRIES_HEAD (format version u8, record count N u32, the
    first record's lease sequence u64 — the others follow it one by one —, the number
    C of records delivered before u32), then C x ENTRIES_COUNTED (the record's position
    u32, its delivery count u32) in increasing position, then N entry lengths (u32),
    then the N entries back to back. Big-endian throughout, as AMQP.

Invariants
    - A message is never split over two bodies; records keep sequence order.
    - Names are UTF-8 with surrogateescape, so any AMQP short string round-trips.

Not here
    Decoding (quorumqueue.client.lease_records, lease_entries), choosing the range
    (fifo/leases.py),
    streaming deliveries (node/leases.py).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence

PACKED_FORMAT = "packed"
PACKED_CONTENT_TYPE = "application/x-quorumqueue-lease-records"
PACKED_RECORD = struct.Struct(">QIBBII")
PACK_BYTES = 256 * 1024
PACK_MESSAGES = 1000
# In a record's content header payload: class id, weight and body size come first,
# the property flags and properties from this octet on.
PROPERTIES_AT = 12

ENTRIES_FORMAT = "entries"
ENTRIES_CONTENT_TYPE = "application/x-quorumqueue-lease-entries"
ENTRIES_VERSION = 1
ENTRIES_HEAD = struct.Struct(">BIQI")
ENTRIES_COUNTED = struct.Struct(">II")
# A body holds at most this many entries, and stops growing past ENTRIES_BYTES.
ENTRIES_MESSAGES = 8192
ENTRIES_BYTES = 1 << 20
assert array("I").itemsize == 4  # the lengths' u32
# What a reader of "entries" needs of the log's entry format (FORMAT.md, "Quorum-queue
# entries"); broker/fifo and broker/raft own it, tests/broker/amqp pins these to theirs
# (this codec layer imports neither).
ENTRY_FORWARDED = 0xFE          # first octet of a forwarded command's identity ...
ENTRY_FORWARDED_SIZE = 18       # ... of this many octets
ENTRY_TIMED = 0xFF              # first octet of the time envelope ...
ENTRY_TIMED_SIZE = 9            # ... of this many octets
ENQUEUE_TAG = 1                 # the Enqueue command's tag, then
ENQUEUE_HEAD = struct.Struct(">BBIQ")  # tag, priority, body size, publisher seq
# An Enqueue with the message's BCC keys after its body (body size octets of body,
# then the keys): the same fields up to the body, which its size ends
ENQUEUE_BCC_TAG = 21

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


def pack_entries(first_seq: int, entries: Sequence[bytes], counts: dict[int, int]) -> bytes:
    """One "entries" delivery body: the log entries of lease sequences first_seq,
    first_seq + 1, ..., as stored; `counts` maps a position to its delivery count
    (the records delivered before; the others have none). Each entry is copied once."""
    lengths = array("I", map(len, entries))
    if sys.byteorder == "little":
        lengths.byteswap()
    parts = [ENTRIES_HEAD.pack(ENTRIES_VERSION, len(entries), first_seq, len(counts))]
    parts += [ENTRIES_COUNTED.pack(position, counts[position]) for position in sorted(counts)]
    parts.append(lengths.tobytes())
    parts += entries
    return b"".join(parts)

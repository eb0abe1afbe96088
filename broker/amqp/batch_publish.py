"""A batch publish: many keyed messages of one publisher in one basic.publish.

Responsibilities: telling a batch publish from a message (`is_batch`), checking it,
and cutting it into the messages it carries (`split`), each exactly what the same
row published alone would have been. This is quorumqueue's own wire form
(docs/behaviour/idempotent-publishing.md, "Batch publish"); the Spark sink sends it
to the bundled broker, and nothing else does.

How it works: a batch is a basic.publish with `immediate=true` whose header table is
exactly three entries: `x-quorumqueue-publisher` (long string), `x-quorumqueue-seq`
(signed 64-bit 'l', the first message's seq) and `x-quorumqueue-batch` (an integer:
how many messages). Its body is that many records, `u32 length | body` each.
Message k gets the batch's content header with the batch entry cut out of the
table, its own body size and seq first + k patched in: the bytes the sink's
row-by-row path sends for that row (connector/sink_rows.py `_Stamped`). So a
queue stores, de-duplicates and delivers each as it would a keyed publish of its
own. Every broker since RabbitMQ 3.0 refuses `immediate=true` (540
NOT_IMPLEMENTED), so a broker that does not know this form can never store a batch
as one message: it closes the connection instead.

Size: each message of a batch is held to the node's `max_message_size` as a
publish of its own would be (`split`: 406 with RabbitMQ's text), and the batch as a
whole to `batch_body_limit`: at least BATCH_BODY_MAX, so a node configured with a
small `max_message_size` still takes the sink's batches (about 1 MiB), and at least
the limit plus one record's length prefix, so a batch of one message of the largest
allowed size fits.

Invariants: `split` returns at least one message (it checks every length, and
makes no message: `Batch.records` makes them); each message's header table is
the sink's two entries, and its `Properties.key` is the (publisher, seq) that table
holds (so `properties.publisher_sequence` reads nothing); a batch
that breaks the form raises AMQPError 406 PRECONDITION_FAILED naming what is wrong,
before any of it is routed.

Not here: routing and confirming the messages (node/handlers.py, node/node.py).
"""

from __future__ import annotations

import struct

from . import spec
from .errors import AMQPError, message_too_large
from .properties import (_INTEGER, _SINK_PUBLISHER, _SINK_SEQ, PUBLISHER_HEADER, SEQ_HEADER,
                         Properties)

BATCH_HEADER = "x-quorumqueue-batch"
_BATCH_KEY = BATCH_HEADER.encode()
_BATCH_ENTRY_KEY = bytes([len(_BATCH_KEY)]) + _BATCH_KEY
_MAX_SEQ = (1 << 63) - 1          # the seq is patched in as a signed 64-bit 'l'
BATCH_BODY_MAX = 4 * 1024 * 1024  # a batch's body may be this big whatever the message limit
_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_i64 = struct.Struct(">q")
_FORM = (f"a batch publish must have exactly the headers '{PUBLISHER_HEADER}' (S), "
         f"'{SEQ_HEADER}' (l) and '{BATCH_HEADER}' (an integer), in that order")


class Batch:
    """A checked batch publish: the body as published (what a basic.return sends
    back) and its messages, in seq order: `records`, (Properties, body) each, made
    when first asked for. Or read in place (a quorum queue builds its log entries
    from them, queues/quorum/queue.py `publish_batch`): message k's body is
    `body[offsets[k] + 4:offsets[k] + 4 + its u32 length at offsets[k]]`; its header
    `head + u64 body size + middle + i64 (first + k) + tail`; its key
    (publisher, first + k); `properties` is the batch's own (its priority, delivery
    mode and flags are each message's)."""

    __slots__ = ("body", "offsets", "publisher", "first", "head", "middle", "tail",
                 "properties", "_records")

    def __init__(self, body: bytes, offsets: list[int], publisher: str, first: int,
                 head: bytes, middle: bytes, tail: bytes, properties: Properties) -> None:
        self.body = body
        self.offsets = offsets
        self.publisher, self.first = publisher, first
        self.head, self.middle, self.tail = head, middle, tail
        self.properties = properties
        self._records: list[tuple[Properties, bytes]] | None = None

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def records(self) -> list[tuple[Properties, bytes]]:
        """(Properties, body) of each message, as a keyed publish of its own."""
        if self._records is None:
            body, publisher, first = self.body, self.publisher, self.first
            head, middle, tail = self.head, self.middle, self.tail
            properties = self.properties
            delivery_mode, priority, flags, at = (properties.delivery_mode,
                                                  properties.priority, properties.flags,
                                                  properties.headers_at)
            view = memoryview(body)
            pack_u64, pack_i64, unpack_u32 = _u64.pack, _i64.pack, _u32.unpack_from
            records = []
            for k, offset in enumerate(self.offsets):
                length = unpack_u32(body, offset)[0]
                header = b"".join((head, pack_u64(length), middle, pack_i64(first + k), tail))
                records.append((Properties(header, length, delivery_mode, priority, flags, at,
                                           key=(publisher, first + k)),
                                bytes(view[offset + 4:offset + 4 + length])))
            self._records = records
        return self._records


def is_batch(properties: Properties) -> bool:
    """Does this publish name the batch header? (The publish must also say
    immediate=true; `split` checks the rest.)"""
    return bool(properties.headers_at) and _BATCH_ENTRY_KEY in properties.raw


def batch_body_limit(max_message_size: int) -> int:
    """The largest body a batch publish may have on a node whose messages may be
    `max_message_size` bytes (each of its messages is still held to that)."""
    return max(BATCH_BODY_MAX, max_message_size + _u32.size)


def _refuse(detail: str) -> AMQPError:
    return AMQPError(spec.PRECONDITION_FAILED, detail, spec.BASIC, 40)


def split(properties: Properties, body: bytes, max_message_size: int) -> Batch:
    """The messages of a batch publish, or AMQPError 406 if it breaks the form or a
    message is larger than `max_message_size` (RabbitMQ's text for a publish)."""
    raw, at = properties.raw, properties.headers_at
    if not at:
        raise _refuse(_FORM)
    table_end = at + 4 + _u32.unpack_from(raw, at)[0]
    position = at + 4
    if not raw.startswith(_SINK_PUBLISHER, position):
        raise _refuse(_FORM)
    position += len(_SINK_PUBLISHER)
    if position + 4 > table_end:
        raise _refuse(_FORM)
    publisher_end = position + 4 + _u32.unpack_from(raw, position)[0]
    if not position + 4 < publisher_end <= position + 4 + 255:
        raise _refuse(f"header '{PUBLISHER_HEADER}' of a batch publish must be a string of "
                      f"1 to 255 bytes")
    seq_entry = publisher_end
    if not raw.startswith(_SINK_SEQ, seq_entry):
        raise _refuse(_FORM)
    seq_at = seq_entry + len(_SINK_SEQ)
    batch_entry = seq_at + 8
    if not raw.startswith(_BATCH_ENTRY_KEY, batch_entry) or batch_entry + len(
            _BATCH_ENTRY_KEY) >= table_end:
        raise _refuse(_FORM)
    kind_at = batch_entry + len(_BATCH_ENTRY_KEY)
    reader = _INTEGER.get(raw[kind_at])
    if reader is None or kind_at + 1 + reader.size != table_end:
        raise _refuse(_FORM)
    count = reader.unpack_from(raw, kind_at + 1)[0]
    first = _i64.unpack_from(raw, seq_at)[0]
    if count < 1:
        raise _refuse(f"header '{BATCH_HEADER}' must be at least 1, got {count}")
    if first < 1 or first + count - 1 > _MAX_SEQ:
        raise _refuse(f"header '{SEQ_HEADER}' of a batch publish must be from 1 to "
                      f"2^63-{count} for {count} messages, got {first}")
    try:
        publisher = raw[position + 4:publisher_end].decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(f"header '{PUBLISHER_HEADER}' of a batch publish must be UTF-8") from None
    # the messages' header: the batch entry cut out, the table's length fixed
    table_length = batch_entry - (at + 4)
    template = b"".join((raw[:at], _u32.pack(table_length), raw[at + 4:batch_entry],
                         raw[table_end:]))
    head, middle, tail = template[:4], template[12:seq_at], template[seq_at + 8:]
    offsets: list[int] = []
    offset, size = 0, len(body)
    unpack_u32 = _u32.unpack_from
    for k in range(count):
        if offset + 4 > size:
            raise _refuse(f"the body of a batch publish holds fewer than the {count} "
                          f"messages its header '{BATCH_HEADER}' says")
        length = unpack_u32(body, offset)[0]
        end = offset + 4 + length
        if end > size:
            raise _refuse(f"message {k + 1} of a batch publish runs past its body")
        if length > max_message_size:  # as channel.header refuses a publish of its own
            raise message_too_large(length, max_message_size)
        offsets.append(offset)
        offset = end
    if offset != size:
        raise _refuse(f"the body of a batch publish holds more than the {count} messages "
                      f"its header '{BATCH_HEADER}' says")
    return Batch(body, offsets, publisher, first, head, middle, tail, properties)

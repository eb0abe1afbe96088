"""An "entries" lease read's delivery bodies as columns: no Python step per message.

Responsibilities
    `EntriesDecoder.decode(body)` turns one delivery body of the "entries" format
    (quorumqueue.broker.amqp.lease_records: a table of lengths, then the messages' log
    entries as the broker stores them, broker/raft/storage/FORMAT.md "Quorum-queue
    entries") into `EntryColumns`: numpy columns of where every message's exchange,
    routing key, properties and body lie in the body, the delivery counts, and the
    distinct property blocks decoded once each. A reader builds its Arrow columns from
    them (connector/schema.py); `EntryColumns` is also a sequence of `Delivery`, built
    on access, for everything else. `decode_group(buffer, spans)` does the same for
    several bodies received back to back into one buffer (range_reader.py
    read_groups): one EntryColumns for all of them, their entries' fields found in one
    pass.

How it works
    The lengths give every entry's start (a cumulative sum); each field's offset
    follows from the previous field's length read at once for all entries (numpy
    gathers): the optional forwarded identity and time envelope, the Enqueue head
    (tag, priority, body size, publisher seq), the publisher, the exchange, the
    routing key, the content header, the body to the entry's end (tag 1) or of its
    body size (tag 21, whose BCC keys follow the body: they are never read). The names and the
    property block are compared across all entries in one array operation: when they
    are the same (one publisher's messages) they are decoded once. Property blocks that
    differ but have the same property flags (a message id or a timestamp per message)
    are read field by field in the same way, one gather per property for all entries
    (`PropertyColumns`: spans of the short strings, the octets and timestamps as
    numbers), and only their header tables are decoded by pika, each distinct one
    once. Else (flags that differ, a timestamp beyond int64 microseconds) each distinct
    block is decoded once (a Python step per message, to find them), as are distinct
    header tables.

Invariants
    - Decoded messages equal what a per-message lease read gives (same seq, body,
      exchange, routing key, redelivered, properties), with the packed read's
      documented differences (no x-lease-seq header, `{}` for no headers, the
      broker's delivery count replacing the publisher's x-delivery-count when above 0):
      the property decoding is lease_records.PackedDecoder's, and PropertyColumns hold
      what it decodes (tests/connector/test_schema.py compares the rows on random
      properties).
    - A body that does not parse raises ValueError naming the first bad record; it
      never becomes fewer messages.

Not here
    The wire format (broker/amqp/lease_records.py), reading the socket
    (range_reader.py), Arrow (connector/schema.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
import pika

from ..broker.amqp.lease_records import (ENQUEUE_BCC_TAG, ENQUEUE_HEAD, ENQUEUE_TAG,
                                         ENTRIES_COUNTED,
                                         ENTRIES_HEAD, ENTRIES_VERSION, ENTRY_FORWARDED,
                                         ENTRY_FORWARDED_SIZE, ENTRY_TIMED,
                                         ENTRY_TIMED_SIZE, PROPERTIES_AT)
from .delivery import Delivery
from .lease_records import PackedDecoder


class EntryColumns(Sequence[Delivery]):
    """The messages of one body, column by column, in sequence order. Offsets are
    numpy int64 arrays into `buffer`; names are one string each when `exchange` /
    `routing_key` is set (every message has it), else spans. `properties` holds the
    distinct decoded property sets and `property_positions` each message's index in
    it (None: all share properties[0]); do not mutate them. When the messages'
    properties differ but have one layout, `property_columns` holds them column by
    column instead (PropertyColumns), `properties` is empty, and a message's
    properties are decoded when it is looked up (from `property_spans`)."""

    __slots__ = ("buffer", "first_seq", "count", "delivery_counts", "body_starts",
                 "body_ends", "exchange", "routing_key", "exchange_spans", "key_spans",
                 "properties", "property_positions", "property_columns", "property_spans",
                 "decoder")

    def __init__(self, buffer, first_seq: int, count: int) -> None:
        self.buffer = buffer
        self.first_seq, self.count = first_seq, count
        self.delivery_counts = np.zeros(count, np.int32)   # the broker's; 0: first time
        self.body_starts = self.body_ends = np.zeros(0, np.int64)
        self.exchange: str | None = None
        self.routing_key: str | None = None
        self.exchange_spans: tuple[np.ndarray, np.ndarray] | None = None
        self.key_spans: tuple[np.ndarray, np.ndarray] | None = None
        self.properties: list[pika.BasicProperties] = []
        self.property_positions: np.ndarray | None = None
        self.property_columns: PropertyColumns | None = None
        self.property_spans: tuple[np.ndarray, np.ndarray] | None = None
        self.decoder: PackedDecoder | None = None   # decodes property_spans on lookup

    @property
    def last_seq(self) -> int:
        return self.first_seq + self.count - 1

    @property
    def seqs(self) -> np.ndarray:
        return np.arange(self.first_seq, self.first_seq + self.count, dtype=np.int64)

    def __len__(self) -> int:
        return self.count

    @overload
    def __getitem__(self, index: int) -> Delivery: ...
    @overload
    def __getitem__(self, index: slice) -> list[Delivery]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        index = range(self.count)[index]
        return Delivery(self.first_seq + index, bytes(self._span(
                            self.body_starts[index], self.body_ends[index])),
                        self._name(self.exchange, self.exchange_spans, index),
                        self._name(self.routing_key, self.key_spans, index),
                        bool(self.delivery_counts[index] > 0), self._properties_of(index))

    def _properties_of(self, index: int) -> pika.BasicProperties:
        if self.property_columns is not None:
            starts, ends = self.property_spans
            return self.decoder._remembered(
                bytes(self._span(starts[index], ends[index])), int(self.delivery_counts[index]))
        position = 0 if self.property_positions is None else int(self.property_positions[index])
        return self.properties[position]

    def _span(self, start, end) -> bytes:
        return self.buffer[int(start):int(end)]

    def _name(self, same: str | None, spans, index: int) -> str:
        if same is not None:
            return same
        starts, ends = spans
        return bytes(self._span(starts[index], ends[index])).decode("utf-8", "surrogateescape")


class PropertyColumns:
    """The basic properties of messages that share one property layout (the same
    property flags), field by field: `texts` the (starts, ends) in the buffer of each
    short-string property present (UTF-8 as sent), `numbers` each octet or timestamp
    property present (int64 numpy; timestamps in seconds). A property in neither is
    absent from every message. The headers, which only pika decodes, are decoded once
    per distinct table and delivery count: `header_sets` holds them as properties
    objects that carry only headers (as PackedDecoder gives them: no x-lease-seq, the
    broker's x-delivery-count above 0, `{}` for none), `header_positions` each
    message's index in it (None: all share header_sets[0]); do not mutate them."""

    __slots__ = ("texts", "numbers", "header_sets", "header_positions")

    def __init__(self) -> None:
        self.texts: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.numbers: dict[str, np.ndarray] = {}
        self.header_sets: list[pika.BasicProperties] = []
        self.header_positions: np.ndarray | None = None


_SHORT, _TABLE, _OCTET, _STAMP = "shortstr", "table", "octet", "timestamp"
_FLAGS = pika.spec.BasicProperties
# The basic properties in the order of their flags and of the properties block
# (AMQP 0-9-1, class basic): (flag, name, kind).
BASIC_PROPERTIES: tuple[tuple[int, str, str], ...] = (
    (_FLAGS.FLAG_CONTENT_TYPE, "content_type", _SHORT),
    (_FLAGS.FLAG_CONTENT_ENCODING, "content_encoding", _SHORT),
    (_FLAGS.FLAG_HEADERS, "headers", _TABLE),
    (_FLAGS.FLAG_DELIVERY_MODE, "delivery_mode", _OCTET),
    (_FLAGS.FLAG_PRIORITY, "priority", _OCTET),
    (_FLAGS.FLAG_CORRELATION_ID, "correlation_id", _SHORT),
    (_FLAGS.FLAG_REPLY_TO, "reply_to", _SHORT),
    (_FLAGS.FLAG_EXPIRATION, "expiration", _SHORT),
    (_FLAGS.FLAG_MESSAGE_ID, "message_id", _SHORT),
    (_FLAGS.FLAG_TIMESTAMP, "timestamp", _STAMP),
    (_FLAGS.FLAG_TYPE, "type", _SHORT),
    (_FLAGS.FLAG_USER_ID, "user_id", _SHORT),
    (_FLAGS.FLAG_APP_ID, "app_id", _SHORT),
    (_FLAGS.FLAG_CLUSTER_ID, "cluster_id", _SHORT),
)
# A timestamp above this many seconds has no int64 count of microseconds (the Arrow
# column's); messages with one are decoded one properties object each, as before.
MAX_TIMESTAMP_SECONDS = (2**63 - 1) // 1_000_000
_NO_FLAGS = b"\x00\x00"
_HEADERS_FLAG = _FLAGS.FLAG_HEADERS.to_bytes(2, "big")


def at_every_octet(octets: np.ndarray, dtype: str) -> np.ndarray:
    """`octets` seen as a `dtype` (a big-endian integer) starting at every octet:
    item i is the integer in octets[i:i + size]. A view (no copy), so that one
    gather reads a field of every entry at once."""
    count = max(len(octets) - np.dtype(dtype).itemsize + 1, 0)
    return np.ndarray((count,), dtype, buffer=octets, strides=(1,))


def _u16(octets: np.ndarray, at: np.ndarray) -> np.ndarray:
    return at_every_octet(octets, ">u2")[at].astype(np.int64)


def _u32(octets: np.ndarray, at: np.ndarray) -> np.ndarray:
    return at_every_octet(octets, ">u4")[at].astype(np.int64)


def _table(buffer, at: int, size: int):
    """(first sequence, record count, the (position, delivery count) pairs or None, the
    entries' starts and ends in `buffer`) of the body at buffer[at:at + size]."""
    if size < ENTRIES_HEAD.size:
        raise ValueError(f"lease entries: a body of {size} octets has no head")
    version, count, first_seq, counted = ENTRIES_HEAD.unpack_from(buffer, at)
    if version != ENTRIES_VERSION:
        raise ValueError(f"lease entries: format version {version}, this reader "
                         f"knows {ENTRIES_VERSION}")
    empty = np.zeros(0, np.int64)
    if not count:
        return first_seq, 0, None, empty, empty
    position = at + ENTRIES_HEAD.size
    table_end = position + ENTRIES_COUNTED.size * counted + 4 * count
    if table_end > at + size:
        raise ValueError(f"lease entries: the table of {count} entries runs past the "
                         f"body ({size} octets)")
    pairs = None
    if counted:
        pairs = np.frombuffer(buffer, ">u4", 2 * counted, position).reshape(counted, 2)
        if int(pairs[:, 0].max()) >= count:
            raise ValueError("lease entries: a delivery count for a record past the end")
        pairs = pairs.astype(np.int64)
        position += ENTRIES_COUNTED.size * counted
    lengths = np.frombuffer(buffer, ">u4", count, position).astype(np.int64)
    ends = table_end + np.cumsum(lengths)
    if int(ends[-1]) != at + size:
        raise ValueError(f"lease entries: {count} entries of {int(ends[-1]) - table_end} "
                         f"octets in a body of {at + size - table_end} after the table")
    return first_seq, count, pairs, ends - lengths, ends


class EntriesDecoder:
    """Columns from "entries" bodies; one per read (it caches decoded properties)."""

    def __init__(self) -> None:
        self._properties = PackedDecoder()

    def decode(self, body) -> EntryColumns:
        """The messages of one delivery body."""
        return self.decode_group(body, [(0, len(body))])

    def decode_group(self, buffer, spans: Sequence[tuple[int, int]]) -> EntryColumns:
        """The messages of the delivery bodies at `spans` ((offset, length) pairs) of
        `buffer`, received back to back, as one EntryColumns: each body's head and
        tables are read on their own, then the fields of all their entries at once.
        The bodies must hold consecutive sequences, in order."""
        heads, starts, ends, counted_at = [], [], [], []
        count = 0
        for at, size in spans:
            first_seq, body_count, pairs, entry_starts, entry_ends = _table(buffer, at, size)
            if heads and first_seq != heads[0] + count:
                raise ValueError(f"lease entries: a body starting at sequence {first_seq} "
                                 f"follows one ending at {heads[0] + count - 1}")
            heads.append(first_seq)
            if pairs is not None:
                counted_at.append((count, pairs))
            starts.append(entry_starts)
            ends.append(entry_ends)
            count += body_count
        columns = EntryColumns(buffer, heads[0] if heads else 0, count)
        if not count:
            return columns
        for offset, pairs in counted_at:
            columns.delivery_counts[offset + pairs[:, 0]] = pairs[:, 1]
        starts_all = starts[0] if len(starts) == 1 else np.concatenate(starts)
        ends_all = ends[0] if len(ends) == 1 else np.concatenate(ends)
        octets = np.frombuffer(buffer, np.uint8)
        try:
            self._fields(columns, octets, starts_all, ends_all)
        except IndexError:
            raise ValueError(self._first_bad(octets, starts_all, ends_all,
                                             columns.first_seq)) from None
        return columns

    def _fields(self, columns: EntryColumns, octets: np.ndarray, starts: np.ndarray,
                ends: np.ndarray) -> None:
        at = starts + (octets[starts] == ENTRY_FORWARDED) * ENTRY_FORWARDED_SIZE
        at = at + (octets[at] == ENTRY_TIMED) * ENTRY_TIMED_SIZE
        tags = octets[at]
        with_bcc = tags == ENQUEUE_BCC_TAG
        not_enqueue = np.flatnonzero((tags != ENQUEUE_TAG) & ~with_bcc)
        if not_enqueue.size:
            raise ValueError(f"lease entries: the entry of sequence "
                             f"{columns.first_seq + int(not_enqueue[0])} is not an Enqueue "
                             f"(tag {int(octets[at[not_enqueue[0]]])})")
        body_sizes = _u32(octets, at + 2)
        at = at + ENQUEUE_HEAD.size
        at = at + 2 + _u16(octets, at)                      # the publisher
        exchange_lengths = octets[at].astype(np.int64)
        exchange_at = at + 1
        key_length_at = exchange_at + exchange_lengths
        key_lengths = octets[key_length_at].astype(np.int64)
        key_at = key_length_at + 1
        header_length_at = key_at + key_lengths
        header_lengths = _u32(octets, header_length_at)
        header_at = header_length_at + 4
        body_at = header_at + header_lengths
        body_ends = body_at + body_sizes
        # tag 1: the body ends the entry; tag 21: the BCC keys' count (u32) at least follows
        wrong = np.flatnonzero(np.where(with_bcc, ends - body_ends < 4, ends != body_ends)
                               | (header_lengths < PROPERTIES_AT + 2))
        if wrong.size:
            culprit = int(wrong[0])
            raise ValueError(f"lease entries: the entry of sequence "
                             f"{columns.first_seq + culprit} does not parse (its body of "
                             f"{int(body_sizes[culprit])} octets does not end the entry, or "
                             "it has no content header)")
        columns.body_starts, columns.body_ends = body_at, body_ends
        buffer = columns.buffer
        # both names with their length octets: equal octets, equal names
        names = PackedDecoder._uniform(octets, exchange_at - 1, header_length_at - exchange_at + 1)
        if names is not None:
            exchange_length = names[0]
            columns.exchange = names[1:1 + exchange_length].decode("utf-8", "surrogateescape")
            columns.routing_key = names[2 + exchange_length:].decode("utf-8", "surrogateescape")
        else:
            columns.exchange_spans = (exchange_at, key_length_at)
            columns.key_spans = (key_at, header_length_at)
        properties_at = header_at + PROPERTIES_AT
        counts = columns.delivery_counts
        remembered = self._properties._remembered
        raw = PackedDecoder._uniform(octets, properties_at, body_at - properties_at)
        if raw is not None and bool((counts == counts[0]).all()):
            columns.properties = [remembered(raw, int(counts[0]))]
            return
        flags = _u16(octets, properties_at)
        if bool((flags == flags[0]).all()) and not int(flags[0]) & 1:  # one layout
            by_column = self._property_columns(octets, int(flags[0]), properties_at + 2,
                                               body_at, counts)
            if by_column is not None:
                columns.property_columns, columns.decoder = by_column, self._properties
                columns.property_spans = (properties_at, body_at)
                return
        columns.properties, columns.property_positions = self._distinct(
            buffer, properties_at, body_at, counts)

    def _distinct(self, buffer, starts: np.ndarray, ends: np.ndarray, counts: np.ndarray,
                  prefix: bytes = b"") -> tuple[list[pika.BasicProperties], np.ndarray]:
        """The distinct decoded property blocks (prefix + buffer[start:end]) with their
        delivery counts, and each message's index among them (a Python step per
        message)."""
        remembered = self._properties._remembered
        position_of: dict[tuple[bytes, int], int] = {}
        distinct: list[pika.BasicProperties] = []
        positions = np.empty(len(starts), np.int32)
        for number, (start, end, count) in enumerate(zip(starts.tolist(), ends.tolist(),
                                                         counts.tolist())):
            key = (prefix + bytes(buffer[start:end]), count)
            position = position_of.get(key)
            if position is None:
                position = position_of[key] = len(distinct)
                distinct.append(remembered(*key))
            positions[number] = position
        return distinct, positions

    def _property_columns(self, octets: np.ndarray, flags: int, at: np.ndarray,
                          ends: np.ndarray, counts: np.ndarray) -> PropertyColumns | None:
        """The properties of blocks that all have `flags`, from `at` (after the flags)
        to `ends`, field by field in one pass of gathers; None if a block does not end
        where its fields do (or runs past the buffer), or holds a timestamp beyond
        MAX_TIMESTAMP_SECONDS: those are decoded one block at a time."""
        by_column = PropertyColumns()
        table: tuple[np.ndarray, np.ndarray] | None = None
        try:
            for flag, name, kind in BASIC_PROPERTIES:
                if not flags & flag:
                    continue
                if kind == _SHORT:
                    after = at + 1 + octets[at].astype(np.int64)
                    by_column.texts[name] = (at + 1, after)
                elif kind == _TABLE:
                    after = at + 4 + _u32(octets, at)
                    table = (at, after)
                elif kind == _OCTET:
                    by_column.numbers[name] = octets[at].astype(np.int64)
                    after = at + 1
                else:
                    stamps = at_every_octet(octets, ">u8")[at]
                    if int(stamps.max()) > MAX_TIMESTAMP_SECONDS:
                        return None
                    by_column.numbers[name] = stamps.astype(np.int64)
                    after = at + 8
                at = after
        except IndexError:
            return None
        if not bool((at == ends).all()):
            return None
        by_column.texts.pop("cluster_id", None)   # not a column of the source
        # the headers as a block of their own: flags, then the table (or no flags)
        if table is None:   # no headers: {} (with the broker's count when above 0)
            table = (np.zeros(len(counts), np.int64),) * 2
        prefix = _NO_FLAGS if flags & _FLAGS.FLAG_HEADERS == 0 else _HEADERS_FLAG
        table_at, table_end = table
        raw = PackedDecoder._uniform(octets, table_at, table_end - table_at)
        if raw is not None and bool((counts == counts[0]).all()):
            by_column.header_sets = [self._properties._remembered(prefix + raw,
                                                                  int(counts[0]))]
        else:
            by_column.header_sets, by_column.header_positions = self._distinct(
                octets, table_at, table_end, counts, prefix)
        return by_column

    @staticmethod
    def _first_bad(octets: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   first_seq: int) -> str:
        """Which entry runs past its end (an IndexError somewhere in the columns)."""
        for number, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
            if end - start < ENQUEUE_HEAD.size + 2:
                return (f"lease entries: the entry of sequence {first_seq + number} is "
                        f"{end - start} octets long, too short for an Enqueue")
        return "lease entries: an entry's fields run past the body"

"""Packed lease records decoded into messages, column by column; no I/O.

Responsibilities
    `PackedDecoder` turns the delivery bodies of a packed lease read (the consume
    argument `x-lease-format` = "packed"; docs/behaviour/leases.md)
    back into messages (`PackedRecords`). The record layout and the encoder the
    broker packs with are the pure codec in quorumqueue.broker.amqp.lease_records
    (there because the broker must not import this package; see its header); this
    module reads that layout and adds what needs pika, the property decoding.

How it works
    The decoder fills one list per field instead of an object per message (a reader
    turns the lists into Arrow columns), decodes each distinct published property
    block once (pika's decoder), per delivery count, and each distinct exchange and
    routing key once, and shares the results between the messages that have them.
    Python steps through a body only to find where each record begins; the record
    heads are then read as numpy columns, a body whose records all carry the same
    names (or the same properties) is recognised with one array comparison, and the
    message bodies are left in the delivery body as (start, end) offsets, which the
    connector turns into its Arrow column with one copy (connector/schema.py).
    `PackedRecords` is also a sequence of `Delivery`, built on access.

Invariants
    - Decoded messages equal what a per-message lease read gives (same seq, body,
      exchange, routing key, redelivered, properties), except that the properties'
      headers hold no x-lease-seq and are `{}` where the publisher sent none; when
      the delivery count is above 0, x-delivery-count replaces the publisher's and
      comes after every other header, as the broker's per-message form sets it.
    - Shared properties objects must not be mutated.

Not here
    Encoding (broker/amqp/lease_records.py), consuming (lease_client.py).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import overload

import numpy as np
import pika
import pika.spec

from ..broker.amqp.lease_records import PACKED_RECORD, PROPERTIES_AT

from .delivery import Delivery

# Headers the broker sets on a per-message lease read (replacing the publisher's).
_LEASE_HEADERS = ("x-lease-seq", "x-delivery-count")
# Distinct property blocks, and exchange/routing key pairs, a decoder remembers
# (messages with unique headers or keys are decoded each time).
_MAX_REMEMBERED = 10_000


# A record's fixed head (PACKED_RECORD) as a numpy structured type: a body's record
# heads are gathered into one array and read column by column.
_HEAD = np.dtype([("seq", ">u8"), ("count", ">u4"), ("exchange", "u1"), ("key", "u1"),
                  ("header", ">u4"), ("body", ">u4")])
assert _HEAD.itemsize == PACKED_RECORD.size
_HEAD_OCTETS = np.arange(PACKED_RECORD.size)
# Only the four lengths are read while walking a body (the rest column-wise after).
_LENGTHS = struct.Struct(">12xBBII")


def _words(octets: np.ndarray) -> np.ndarray:
    """`octets` as a u64 starting at every octet (a view: item i is octets[i:i + 8])."""
    return np.ndarray((max(len(octets) - 7, 0),), np.uint64, buffer=octets, strides=(1,))


class PackedRecords(Sequence[Delivery]):
    """Decoded messages, one list per field, in sequence order. Items of equal value
    are shared objects (property sets, exchange and routing key strings). The bodies
    stay where they arrived: `body_spans` holds (delivery body, starts, ends) per
    decoded delivery body, the messages' bodies being body[start:end] (a reader
    builds its Arrow column from them in one copy); `bodies` slices them out."""

    __slots__ = ("seqs", "exchanges", "routing_keys", "redelivered", "properties",
                 "body_spans")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.exchanges: list[str] = []
        self.routing_keys: list[str] = []
        self.redelivered: list[bool] = []
        self.properties: list[pika.BasicProperties] = []
        # (buffer, starts, ends): numpy int64 arrays of the bodies' offsets in buffer
        self.body_spans: list[tuple[bytes, np.ndarray, np.ndarray]] = []

    @property
    def bodies(self) -> list[bytes]:
        return [buffer[start:end] for buffer, starts, ends in self.body_spans
                for start, end in zip(starts.tolist(), ends.tolist())]

    def __len__(self) -> int:
        return len(self.seqs)

    @overload
    def __getitem__(self, index: int) -> Delivery: ...
    @overload
    def __getitem__(self, index: slice) -> list[Delivery]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = range(len(self))[index]  # negative indexes; IndexError past the end
        return Delivery(self.seqs[index], self._body(index), self.exchanges[index],
                        self.routing_keys[index], self.redelivered[index],
                        self.properties[index])

    def _body(self, index: int) -> bytes:
        for buffer, starts, ends in self.body_spans:
            if index < len(starts):
                return buffer[int(starts[index]):int(ends[index])]
            index -= len(starts)
        raise IndexError(index)

    def extend(self, other: PackedRecords) -> None:
        """Append `other`'s messages (which must follow these in sequence order)."""
        self.seqs += other.seqs
        self.body_spans += other.body_spans
        self.exchanges += other.exchanges
        self.routing_keys += other.routing_keys
        self.redelivered += other.redelivered
        self.properties += other.properties


class PackedDecoder:
    """Messages from packed delivery bodies; one per read (it caches properties)."""

    def __init__(self) -> None:
        self._properties: dict[tuple[bytes, int], pika.BasicProperties] = {}
        self._names: dict[tuple[int, bytes], tuple[str, str]] = {}

    def decode(self, body: bytes) -> PackedRecords:
        """The records of one delivery body. Python walks the records only to find
        where each begins (its four lengths); the fixed fields are then read for all
        records at once (numpy), and names and properties decoded once when every
        record of the body has the same (else once per distinct value, cached)."""
        records = PackedRecords()
        starts = self._record_starts(body)
        if not starts:
            return records
        octets = np.frombuffer(body, np.uint8)
        first = np.array(starts, np.int64)
        heads = octets[first[:, None] + _HEAD_OCTETS].view(_HEAD)[:, 0]
        exchange_lengths = heads["exchange"].astype(np.int64)
        key_lengths = heads["key"].astype(np.int64)
        header_lengths = heads["header"].astype(np.int64)
        names_at = first + PACKED_RECORD.size
        headers_at = names_at + exchange_lengths + key_lengths
        bodies_at = headers_at + header_lengths
        bodies_end = bodies_at + heads["body"].astype(np.int64)
        short = np.flatnonzero(header_lengths < PROPERTIES_AT + 2)
        if short.size or int(bodies_end[-1]) > len(body):
            culprit = int(short[0]) if short.size else len(starts) - 1
            raise ValueError(f"packed lease records: the record of sequence "
                             f"{int(heads['seq'][culprit])} runs past the body "
                             f"({int(bodies_end[culprit])} > {len(body)} octets) or has "
                             "no content header")
        count = len(starts)
        counts = heads["count"]
        records.seqs = heads["seq"].tolist()
        records.redelivered = (counts > 0).tolist()
        records.body_spans = [(body, bodies_at, bodies_end)]
        names = self._uniform(octets, names_at, exchange_lengths + key_lengths)
        if names is not None and bool((exchange_lengths == exchange_lengths[0]).all()):
            exchange, routing_key = self._names_of((int(exchange_lengths[0]), names))
            records.exchanges, records.routing_keys = [exchange] * count, [routing_key] * count
        else:
            self._names_each(body, records, names_at.tolist(), exchange_lengths.tolist(),
                             headers_at.tolist())
        properties_at = headers_at + PROPERTIES_AT
        raw = self._uniform(octets, properties_at, header_lengths - PROPERTIES_AT)
        if raw is not None and bool((counts == counts[0]).all()):
            decoded = self._remembered(raw, int(counts[0]))
            records.properties = [decoded] * count
        else:
            remembered = self._remembered
            records.properties = [
                remembered(body[at:end], delivery_count) for at, end, delivery_count in
                zip(properties_at.tolist(), bodies_at.tolist(), counts.tolist())]
        return records

    @staticmethod
    def _record_starts(body: bytes) -> list[int]:
        starts: list[int] = []
        append, lengths = starts.append, _LENGTHS.unpack_from
        record, position, size = PACKED_RECORD.size, 0, len(body)
        while position < size:
            if position + record > size:
                raise ValueError(f"packed lease records: a record header is cut at octet "
                                 f"{position} of {size}")
            exchange_length, key_length, header_length, body_length = lengths(body, position)
            append(position)
            position += record + exchange_length + key_length + header_length + body_length
        return starts

    @staticmethod
    def _uniform(octets: np.ndarray, at: np.ndarray, lengths: np.ndarray) -> bytes | None:
        """The octets at[i]:at[i] + lengths[i] if they are the same for every record,
        else None."""
        length = int(lengths[0])
        if not bool((lengths == length).all()):
            return None
        if length == 0:
            return b""
        start = int(at[0])
        if len(at) > 1:
            if length < 8:
                block = octets[at[:, None] + np.arange(length)]
                if not bool((block == block[0]).all()):
                    return None
            else:
                # eight octets at a time (the last word may overlap the one before)
                words = _words(octets)
                for step in (*range(0, length - 8, 8), length - 8):
                    column = words[at + step]
                    if not bool((column == column[0]).all()):
                        return None
        return octets[start:start + length].tobytes()

    def _names_each(self, body: bytes, records: PackedRecords, names_at: list[int],
                    exchange_lengths: list[int], names_end: list[int]) -> None:
        remembered_names = self._names
        exchanges, routing_keys = records.exchanges, records.routing_keys
        for at, exchange_length, end in zip(names_at, exchange_lengths, names_end):
            key = (exchange_length, body[at:end])
            names = remembered_names.get(key)
            if names is None:
                names = self._names_of(key)
            exchanges.append(names[0])
            routing_keys.append(names[1])

    def _remembered(self, raw: bytes, delivery_count: int) -> pika.BasicProperties:
        decoded = self._properties.get((raw, delivery_count))
        return decoded if decoded is not None else self._decoded(raw, delivery_count)

    def _names_of(self, key: tuple[int, bytes]) -> tuple[str, str]:
        exchange_length, raw = key
        names = (raw[:exchange_length].decode("utf-8", "surrogateescape"),
                 raw[exchange_length:].decode("utf-8", "surrogateescape"))
        if len(self._names) < _MAX_REMEMBERED:
            self._names[key] = names
        return names

    def _decoded(self, raw: bytes, delivery_count: int) -> pika.BasicProperties:
        plain = self._properties.get((raw, 0))
        if plain is None:
            plain = pika.spec.BasicProperties()
            plain.decode(raw)
            plain.headers = {key: value for key, value in (plain.headers or {}).items()
                             if key != "x-lease-seq"}
            self._remember(raw, 0, plain)
        if not delivery_count:
            return plain
        counted = pika.spec.BasicProperties(**vars(plain))
        counted.headers = ({key: value for key, value in plain.headers.items()
                            if key not in _LEASE_HEADERS}
                           | {"x-delivery-count": delivery_count})
        self._remember(raw, delivery_count, counted)
        return counted

    def _remember(self, raw: bytes, delivery_count: int,
                  properties: pika.BasicProperties) -> None:
        if len(self._properties) < _MAX_REMEMBERED:
            self._properties[(raw, delivery_count)] = properties

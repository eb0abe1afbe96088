"""Packed lease records decoded into messages, column by column; no I/O.

Responsibilities
    `PackedDecoder` turns the delivery bodies of a packed lease read (the consume
    argument `x-lease-format` = "packed"; broker/README.md, "Leases (wire form)")
    back into messages (`PackedRecords`). The record layout and the encoder the
    broker packs with are the pure codec in quorumqueue.broker.amqp.lease_records
    (there because the broker must not import this package; see its header); this
    module reads that layout and adds what needs pika, the property decoding.

How it works
    The decoder fills one list per field instead of an object per message (a reader
    turns the lists into Arrow columns), decodes each distinct published property
    block once (pika's decoder), per delivery count, and each distinct exchange and
    routing key once, and shares the results between the messages that have them.
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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

import pika
import pika.spec

from ..broker.amqp.lease_records import PACKED_RECORD, PROPERTIES_AT

from .delivery import Delivery

# Headers the broker sets on a per-message lease read (replacing the publisher's).
_LEASE_HEADERS = ("x-lease-seq", "x-delivery-count")
# Distinct property blocks, and exchange/routing key pairs, a decoder remembers
# (messages with unique headers or keys are decoded each time).
_MAX_REMEMBERED = 10_000


@dataclass(slots=True, eq=False)
class PackedRecords(Sequence[Delivery]):
    """Decoded messages, one list per field, in sequence order. Items of equal value
    are shared objects (property sets, exchange and routing key strings)."""

    seqs: list[int] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)
    routing_keys: list[str] = field(default_factory=list)
    redelivered: list[bool] = field(default_factory=list)
    properties: list[pika.BasicProperties] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.seqs)

    @overload
    def __getitem__(self, index: int) -> Delivery: ...
    @overload
    def __getitem__(self, index: slice) -> list[Delivery]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return Delivery(self.seqs[index], self.bodies[index], self.exchanges[index],
                             self.routing_keys[index], self.redelivered[index],
                             self.properties[index])

    def extend(self, other: PackedRecords) -> None:
        """Append `other`'s messages (which must follow these in sequence order)."""
        self.seqs += other.seqs
        self.bodies += other.bodies
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
        records = PackedRecords()
        seqs, bodies, exchanges, routing_keys = (records.seqs, records.bodies,
                                                 records.exchanges, records.routing_keys)
        redelivered, properties = records.redelivered, records.properties
        remembered_names, remembered_properties = self._names, self._properties
        record, unpack = PACKED_RECORD.size, PACKED_RECORD.unpack_from
        position, size = 0, len(body)
        while position < size:
            if position + record > size:
                raise ValueError(f"packed lease records: a record header is cut at octet "
                                 f"{position} of {size}")
            seq, count, exchange_length, key_length, header_length, body_length = unpack(
                body, position)
            position += record
            names_end = position + exchange_length + key_length
            end = names_end + header_length + body_length
            if end > size or header_length < PROPERTIES_AT + 2:
                raise ValueError(f"packed lease records: the record of sequence {seq} "
                                 f"runs past the body ({end} > {size} octets) or has no "
                                 "content header")
            names_key = (exchange_length, body[position:names_end])
            names = remembered_names.get(names_key)
            if names is None:
                names = self._names_of(names_key)
            raw_properties = body[names_end + PROPERTIES_AT:names_end + header_length]
            decoded = remembered_properties.get((raw_properties, count))
            if decoded is None:
                decoded = self._decoded(raw_properties, count)
            seqs.append(seq)
            bodies.append(body[end - body_length:end])
            exchanges.append(names[0])
            routing_keys.append(names[1])
            redelivered.append(count > 0)
            properties.append(decoded)
            position = end
        return records

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

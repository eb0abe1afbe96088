"""The source's schema, and received messages turned into Arrow record batches.

Responsibilities
    `SCHEMA` is what `spark.readStream.format("quorumqueue").load()` returns: the
    body, where the message came from (queue, exchange, routing key), its position
    (`offset`) and delivery history, and every AMQP 0-9-1 basic property.
    `to_record_batch` turns one read's messages into a `pyarrow.RecordBatch` whose
    schema equals `ARROW_SCHEMA` exactly (PySpark refuses a batch whose Arrow schema
    differs from the declared one, nullability included). It takes messages either
    one object each (`Received`) or field by field (`MessageColumns`, what a packed
    lease read decodes to, quorumqueue.client.lease_records), which saves an object
    per message. `EntryBatches` builds the batches of one lease-mode read from its
    `EntryColumns` (client.lease_entries), keeping what a run of messages shares
    between batches.

How it works
    Arrow types are PySpark's own Spark-to-Arrow conversion (timestamps in
    microseconds, UTC). Body, offset, exchange, routing key and redelivered are
    converted list to array. The property columns, and `delivery_count` (from the
    `x-delivery-count` header), are worked out once per distinct properties object
    (a packed lease read shares one between the messages that were published with
    the same properties) into a small array, and each column is that array taken
    at every message's position in it. An "entries" read whose properties differ
    per message but share one layout comes field by field (EntryColumns'
    `property_columns`): each text column is built over its spans in the buffer,
    each number column from its values, and only the headers and `delivery_count`
    per distinct header table.
    AMQP header tables are typed and nested; the `headers` column is a flat
    map<string,string>: strings stay as they are, bytes are decoded as UTF-8 (invalid
    bytes replaced), booleans are `true`/`false`, numbers and decimals their decimal
    text, timestamps ISO-8601 in UTC, nested tables and arrays JSON, void null.

Invariants
    - The same messages give the same batch (no clocks, no randomness): a replayed
      range yields identical rows.
    - The broker's bookkeeping header `x-lease-seq` is not a message header: it is the
      `offset` column. `x-delivery-count` stays in `headers`, as RabbitMQ shows it, and
      also fills `delivery_count`.

Not here
    Reading from the broker (lease_reader.py), the sink's input schema.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (BinaryType, BooleanType, IntegerType, LongType, MapType,
                               StringType, StructField, StructType, TimestampType)

from ..client.delivery import header_delivery_count
from ..client.lease_entries import EntryColumns
from . import arrays as arrays_

SCHEMA = StructType([
    StructField("body", BinaryType(), nullable=False),
    StructField("queue", StringType(), nullable=False),
    StructField("routing_key", StringType(), nullable=False),
    StructField("exchange", StringType(), nullable=False),
    # per queue, from 1: lease sequence (lease mode), messages handed to Spark
    # (consume mode), position in the read (batch reads)
    StructField("offset", LongType(), nullable=False),
    # earlier deliveries (x-delivery-count; 0 when absent)
    StructField("delivery_count", IntegerType(), nullable=False),
    StructField("redelivered", BooleanType(), nullable=False),
    StructField("content_type", StringType()),
    StructField("content_encoding", StringType()),
    StructField("headers", MapType(StringType(), StringType())),
    StructField("delivery_mode", IntegerType()),   # 1 transient, 2 persistent
    StructField("priority", IntegerType()),
    StructField("correlation_id", StringType()),
    StructField("reply_to", StringType()),
    StructField("expiration", StringType()),
    StructField("message_id", StringType()),
    StructField("timestamp", TimestampType()),     # AMQP timestamps are whole seconds
    StructField("type", StringType()),
    StructField("user_id", StringType()),
    StructField("app_id", StringType()),
])
ARROW_SCHEMA: pa.Schema = to_arrow_schema(SCHEMA, timezone="UTC")
COLUMNS: tuple[str, ...] = tuple(SCHEMA.fieldNames())

# Headers the broker adds for the reader's bookkeeping, not the publisher's.
BOOKKEEPING_HEADERS = frozenset({"x-lease-seq"})


class Properties(Protocol):
    """The AMQP basic properties, as pika.BasicProperties carries them."""

    content_type: str | None
    content_encoding: str | None
    headers: dict[str, Any] | None
    delivery_mode: int | None
    priority: int | None
    correlation_id: str | None
    reply_to: str | None
    expiration: str | None
    message_id: str | None
    timestamp: int | None
    type: str | None
    user_id: str | None
    app_id: str | None


class Received(Protocol):
    """One received message (quorumqueue.client.Delivery is one)."""

    @property
    def seq(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    @property
    def exchange(self) -> str: ...
    @property
    def routing_key(self) -> str: ...
    @property
    def redelivered(self) -> bool: ...
    @property
    def properties(self) -> Properties: ...


class MessageColumns(Protocol):
    """Received messages field by field, equal lengths, in order
    (quorumqueue.client.lease_records.PackedRecords is one)."""

    @property
    def seqs(self) -> Sequence[int]: ...
    @property
    def bodies(self) -> Sequence[bytes]: ...
    @property
    def exchanges(self) -> Sequence[str]: ...
    @property
    def routing_keys(self) -> Sequence[str]: ...
    @property
    def redelivered(self) -> Sequence[bool]: ...
    @property
    def properties(self) -> Sequence[Properties]: ...


# The columns filled from the basic properties, in ARROW_SCHEMA order after `redelivered`.
_TEXT_PROPERTIES = frozenset({"content_type", "content_encoding", "correlation_id", "reply_to",
                              "expiration", "message_id", "type", "user_id", "app_id"})
_PROPERTY_COLUMNS: tuple[str, ...] = COLUMNS[7:]
_PROPERTY_FIELDS: tuple[pa.Field, ...] = tuple(ARROW_SCHEMA.field(name)
                                               for name in _PROPERTY_COLUMNS)


def to_record_batch(queue: str, messages: Sequence[Received] | MessageColumns | EntryColumns,
                    include_headers: bool = True) -> pa.RecordBatch:
    """The rows of `messages`, all read from `queue`, in order."""
    if isinstance(messages, EntryColumns):
        return _entries_batch(queue, messages, include_headers)
    columns = messages if hasattr(messages, "seqs") else _Columns.of(messages)
    count = len(columns.seqs)
    distinct, positions = _distinct(columns.properties)
    values = [_property_values(properties, include_headers) for properties in distinct]
    per_message = [
        _taken(column, field.type, positions)
        for column, field in zip(zip(*values) if values else [()] * len(_PROPERTY_FIELDS),
                                 _PROPERTY_FIELDS)]
    delivery_counts = _taken([header_delivery_count(properties) for properties in distinct],
                             pa.int32(), positions)
    spans = getattr(columns, "body_spans", None)
    bodies = (pa.array(columns.bodies, pa.binary()) if spans is None
              else _binary_from_spans(spans))
    arrays = [bodies,
              pa.repeat(pa.scalar(queue, pa.string()), count),
              pa.array(columns.routing_keys, pa.string()),
              pa.array(columns.exchanges, pa.string()),
              pa.array(columns.seqs, pa.int64()),
              delivery_counts,
              pa.array(columns.redelivered, pa.bool_()),
              *per_message]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


class EntryBatches:
    """Arrow batches of one read's EntryColumns, all from `queue`.

    A batch's body, offset and redelivered columns are built from its columns; every
    other column is the same value for each message of a run that shares one property
    set (what one publisher's messages are) and one exchange and routing key. Those
    are built once per read, as a long enough array of the value repeated, and each
    batch takes a slice of it (no copy); messages with several property sets take
    each column from a small array of their distinct values (built once per set of
    distinct values), or, when they came field by field, from their spans and values
    (`_by_column`)."""

    def __init__(self, queue: str, include_headers: bool) -> None:
        self.queue, self.include_headers = queue, include_headers
        self._repeated: dict[tuple, pa.Array] = {}
        # id -> (the properties, kept alive so the id names them, their column values)
        self._values: dict[int, tuple[Properties, tuple]] = {}
        self._distinct: dict[tuple[int, ...], list[pa.Array | None]] = {}

    def batch(self, columns: EntryColumns) -> pa.RecordBatch:
        if len(self._values) > _MAX_KEPT or len(self._repeated) > _MAX_KEPT:
            # the kept property sets are what keeps the ids in the keys unique
            self._values.clear()
            self._distinct.clear()
            self._repeated.clear()
        count = columns.count
        distinct = columns.properties
        if columns.property_columns is not None:
            per_message = self._by_column(columns)
        elif columns.property_positions is None:
            values = self._values_of(distinct[0]) if distinct else None
            per_message = [self._same(("p", id(distinct[0]), number), value, field.type, count)
                           for number, (value, field) in enumerate(zip(values, _VALUE_FIELDS))
                           ] if values is not None else [pa.nulls(0, f.type) for f in _VALUE_FIELDS]
        else:
            smalls = self._smalls(distinct)
            positions = columns.property_positions
            per_message = [pa.nulls(count, field.type) if small is None
                           else arrays_.taken(small, positions)
                           for small, field in zip(smalls, _VALUE_FIELDS)]
        delivery_counts, *properties = per_message
        buffer = columns.buffer
        arrays = [_binary_from_spans([(buffer, columns.body_starts, columns.body_ends)]),
                  self._same(("queue",), self.queue, pa.string(), count),
                  self._name(columns.routing_key, columns.key_spans, buffer, count),
                  self._name(columns.exchange, columns.exchange_spans, buffer, count),
                  arrays_.numeric(columns.seqs, pa.int64()),
                  delivery_counts,
                  arrays_.numeric(columns.delivery_counts > 0, pa.bool_()),
                  *properties]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)

    def _by_column(self, columns: EntryColumns) -> list[pa.Array]:
        """`delivery_count`, then the property columns, of messages whose properties
        came field by field (EntryColumns.property_columns): each text a string array
        over its spans, each number an array of its values, the headers and the
        delivery count from their distinct sets."""
        by_column, count, buffer = columns.property_columns, columns.count, columns.buffer
        header_sets, positions = by_column.header_sets, by_column.header_positions
        if positions is None:
            values = self._values_of(header_sets[0])
            counted = [self._same(("p", id(header_sets[0]), number), values[number],
                                  _VALUE_FIELDS[number].type, count) for number in _COUNTED]
        else:
            smalls = self._smalls(header_sets)
            counted = [pa.nulls(count, _VALUE_FIELDS[number].type) if smalls[number] is None
                       else arrays_.taken(smalls[number], positions) for number in _COUNTED]
        arrays = [counted[0]]
        for name, field in zip(_PROPERTY_COLUMNS, _PROPERTY_FIELDS):
            if name == "headers":
                arrays.append(counted[1])
            elif name in by_column.texts:
                arrays.append(_names(None, by_column.texts[name], buffer, count))
            elif name in by_column.numbers:
                values = by_column.numbers[name]
                arrays.append(arrays_.numeric(values * 1_000_000 if name == "timestamp"
                                              else values, field.type))
            else:
                arrays.append(pa.nulls(count, field.type))
        return arrays

    def _values_of(self, properties: Properties) -> tuple:
        """`delivery_count`, then the property columns' values, of `properties`."""
        kept = self._values.get(id(properties))
        if kept is None:
            kept = self._values[id(properties)] = (
                properties, (header_delivery_count(properties),
                             *_property_values(properties, self.include_headers)))
        return kept[1]

    def _same(self, key: tuple, value: Any, type_: pa.DataType, count: int) -> pa.Array:
        """`value` repeated `count` times: a slice of an array kept under `key`."""
        if value is None:
            return pa.nulls(count, type_)
        kept = self._repeated.get(key)
        if kept is None or len(kept) < count:
            length = max(count, 2 * len(kept)) if kept is not None else count
            kept = self._repeated[key] = arrays_.repeated(arrays_.small([value], type_), length)
        return kept if len(kept) == count else kept.slice(0, count)

    def _smalls(self, distinct: Sequence[Properties]) -> list[pa.Array | None]:
        """Per column, the small array of the distinct property sets' values (None: all
        null)."""
        key = tuple(map(id, distinct))
        smalls = self._distinct.get(key)
        if smalls is None:
            values = [self._values_of(properties) for properties in distinct]
            smalls = self._distinct[key] = [
                None if all(value is None for value in column)
                else arrays_.small(column, field.type)
                for column, field in zip(zip(*values), _VALUE_FIELDS)]
        return smalls

    def _name(self, same: str | None, spans, buffer, count: int) -> pa.Array:
        if same is not None:
            return self._same(("name", same), same, pa.string(), count)
        return _names(None, spans, buffer, count)


# The columns an EntryBatches takes from the properties: delivery_count, then the rest.
_VALUE_FIELDS: tuple[pa.Field, ...] = (ARROW_SCHEMA.field("delivery_count"), *_PROPERTY_FIELDS)
# In an EntryBatches' values: delivery_count's and headers' (what depends on the headers).
_COUNTED = (0, 1 + _PROPERTY_COLUMNS.index("headers"))
# Arrays and property values an EntryBatches keeps, at most (then it starts again).
_MAX_KEPT = 10_000


def _entries_batch(queue: str, columns: EntryColumns, include_headers: bool) -> pa.RecordBatch:
    """The rows of an "entries" read's columns (EntryBatches, for one batch)."""
    return EntryBatches(queue, include_headers).batch(columns)


def _names(same: str | None, spans: tuple[np.ndarray, np.ndarray] | None, buffer,
           count: int) -> pa.Array:
    """A name column: one string repeated, or the UTF-8 strings at `spans` of `buffer`
    (invalid UTF-8 replaced, as the property columns' text is)."""
    if same is not None:
        return arrays_.repeated(arrays_.small([same], pa.string()), count)
    raw = _binary_from_spans([(buffer, *spans)])
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([bytes(value).decode("utf-8", "replace") for value in raw.to_pylist()],
                        pa.string())


def _binary_from_spans(spans: Sequence[tuple[bytes, np.ndarray, np.ndarray]]) -> pa.Array:
    """The binary column of bodies that lie at buffer[start:end] (PackedRecords'
    body_spans), copied once: the buffer is seen as an Arrow binary array whose items
    alternate between what lies before a body and the body, and the bodies taken."""
    pieces = []
    for buffer, starts, ends in spans:
        count = len(starts)
        if not count:
            continue
        large = len(buffer) >= 2**31   # int32 offsets below that (Arrow's binary)
        offsets = np.empty(2 * count + 1, np.int64 if large else np.int32)
        offsets[0] = 0
        offsets[1::2], offsets[2::2] = starts, ends
        kind = pa.large_binary() if large else pa.binary()
        whole = pa.Array.from_buffers(kind, 2 * count,
                                      [None, pa.py_buffer(offsets), pa.py_buffer(buffer)])
        bodies = arrays_.taken(whole, np.arange(1, 2 * count, 2, dtype=np.int32))
        pieces.append(bodies.cast(pa.binary()) if large else bodies)
    if not pieces:
        return pa.nulls(0, pa.binary())
    return pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)


class _Columns:
    """MessageColumns of messages that come one object each."""

    __slots__ = ("seqs", "bodies", "exchanges", "routing_keys", "redelivered", "properties")

    @classmethod
    def of(cls, messages: Sequence[Received]) -> _Columns:
        columns = cls()
        columns.seqs = [message.seq for message in messages]
        columns.bodies = [message.body for message in messages]
        columns.exchanges = [message.exchange for message in messages]
        columns.routing_keys = [message.routing_key for message in messages]
        columns.redelivered = [message.redelivered for message in messages]
        columns.properties = [message.properties for message in messages]
        return columns


def _taken(values: Sequence[Any], type_: pa.DataType, positions: pa.Array) -> pa.Array:
    """`values` (one per distinct properties object) at each message's position."""
    if all(value is None for value in values):
        return pa.nulls(len(positions), type_)
    return pa.array(values, type=type_).take(positions)


def _distinct(properties: Sequence[Properties]) -> tuple[list[Properties], pa.Array]:
    """The distinct properties objects, in order of first use, and each message's
    position among them."""
    identities = list(map(id, properties))
    if not identities or identities.count(identities[0]) == len(identities):
        distinct = list(properties[:1])
        return distinct, pa.repeat(pa.scalar(0, pa.int32()), len(identities))
    # every object is alive in `properties`, so an id names one object
    position_of: dict[int, int] = {}
    distinct, positions = [], []
    for identity, item in zip(identities, properties):
        position = position_of.get(identity)
        if position is None:
            position = position_of[identity] = len(distinct)
            distinct.append(item)
        positions.append(position)
    return distinct, pa.array(positions, pa.int32())


def _property_values(properties: Properties, include_headers: bool) -> tuple:
    """The property columns of one message (_PROPERTY_COLUMNS, in order)."""
    values = []
    for name in _PROPERTY_COLUMNS:
        value = getattr(properties, name)
        if name in _TEXT_PROPERTIES:
            value = _text(value)
        elif name == "headers":
            value = headers_map(value) if include_headers else None
        elif name == "timestamp" and value is not None:
            value = value * 1_000_000
        values.append(value)
    return tuple(values)


def headers_map(headers: dict[str, Any] | None) -> list[tuple[str, str | None]] | None:
    """An AMQP header table as map<string,string> entries (see the module header)."""
    if headers is None:
        return None
    return [(_text(key), header_text(value)) for key, value in headers.items()
            if key not in BOOKKEEPING_HEADERS]


def header_text(value: Any) -> str | None:
    match value:
        case None:
            return None
        case bool():
            return "true" if value else "false"
        case str():
            return value
        case bytes() | bytearray():
            return bytes(value).decode("utf-8", "replace")
        case int() | float() | decimal.Decimal():
            return str(value)
        case dt.datetime():
            moment = value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
            return moment.astimezone(dt.timezone.utc).isoformat()
        case dict() | list() | tuple():
            return json.dumps(_jsonable(value), separators=(",", ":"), sort_keys=False)
        case _:
            return str(value)


def _jsonable(value: Any) -> Any:
    match value:
        case dict():
            return {_text(key): _jsonable(item) for key, item in value.items()}
        case list() | tuple():
            return [_jsonable(item) for item in value]
        case None | bool() | int() | float() | str():
            return value
        case _:
            return header_text(value)


def _text(value: Any) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value

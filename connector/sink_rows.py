"""The sink's input: the columns a DataFrame may have, and its rows as AMQP messages.

Responsibilities
    `input_plan(schema, options)` checks, when a write starts, that the DataFrame
    has a `body` and only columns the sink understands, with the types it accepts,
    and fails naming the column and what is accepted otherwise. `to_messages` turns
    a task's Arrow record batches into `Outgoing` messages, numbering rows from 0 and
    stamping each with the task's idempotency key (`IdempotencyKey`); `to_outgoing`
    does the same with a batch of bodies alone as one `BodyRun`.

How it works
    The accepted columns are the source's own (schema.py), so a source-to-sink
    pipeline needs no select: `body` (binary or string), `routing_key` and `exchange`
    (a null routing key, or a null or empty exchange, falls back to the options), `headers` (map<string,string>) and the AMQP
    properties. The source's `queue`, `offset`, `delivery_count` and `redelivered`
    are ignored, and so is its `x-delivery-count` header (the broker's count for the
    message read, not one for the message written). Names match case-insensitively,
    as Spark's do. Batches are converted column by column (`to_pylist`), then one
    `pika.BasicProperties` per row; `delivery_mode` defaults to 2 (persistent).

    Every message carries `x-quorumqueue-publisher` = the key's publisher and
    `x-quorumqueue-seq` = `key.base + row + 1`: the bundled broker stores a quorum
    queue's message at most once per (publisher, seq) (docs/behaviour/idempotent-publishing.md); any other broker just passes the headers on.

    Rows whose properties differ only in that seq (all of them, when the DataFrame
    has no property or header columns) share one encoded content header: pika asks
    a message's properties to `encode()` themselves, and `_Stamped` answers with
    the shared bytes and its own 8-byte seq in place, always as a 64-bit 'l' field
    (pika itself picks a 32-bit 'I' for a seq below 2^31, e.g. df.write's; both are
    AMQP integers and the broker reads either; a table of these two entries alone,
    the seq as 'l', it reads in place: broker/amqp/properties.py `_sink_key`).
    Rows without property or header columns skip building and comparing a property
    set per row. Encoding a header table per message was the biggest cost of a sink
    task (bench/README.md, `connector_sink.py`).

    `to_outgoing` (what the sink publishes) goes further for a batch of bodies alone
    (no other column, no null or empty body): one `BodyRun`, whose `frames` builds
    every row's basic.publish, content header (the template, the row's body size and
    seq) and body frame in one `pyarrow.compute.binary_join_element_wise` over the
    batch's columns: no Python object per row. A body above the frame size sends the
    run row by row (`messages`), as `to_messages` would. For the bundled broker the
    publisher asks the run for its `batched()` form, `BatchedBodyRun`: the same rows
    as batch publishes of up to `BATCH_ROWS` rows (and about `BATCH_BYTES` of bodies)
    each, one basic.publish with immediate=true and the batch header after the two
    idempotency headers, the bodies as `u32 length | body` records
    (docs/behaviour/idempotent-publishing.md, "Batch publish"), which the broker cuts
    back into exactly the rows' messages.

Invariants
    - The same rows in the same order give the same messages and sequence numbers.
    - A `BodyRun`'s frames are byte for byte those of its rows from `to_messages`
      (tests/connector/test_sink_frames.py).
    - A value AMQP cannot carry (null body, delivery_mode not 1 or 2, priority or
      timestamp out of range) raises `RowError` naming the row and the column.

Not here
    Publishing (publisher.py); where the key comes from (sink.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pika
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (BinaryType, ByteType, DataType, IntegerType, LongType, MapType,
                               ShortType, StringType, StructType, TimestampType)

from .options import ROUTING_KEY, OptionError, SinkOptions
from .publisher import BATCH_HEADER, FRAME_BODY, FRAME_END, FRAME_HEADER, Outgoing, OutgoingRun

PUBLISHER_HEADER = "x-quorumqueue-publisher"
SEQ_HEADER = "x-quorumqueue-seq"
ROWS_PER_BATCH_ID = 1 << 32   # seq = batch id * ROWS_PER_BATCH_ID + row + 1

STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to",
                     "expiration", "message_id", "type", "user_id", "app_id")
INTEGER_PROPERTIES = ("delivery_mode", "priority")
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)

# column -> (accepted types, how a message shows them)
ACCEPTED: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "body": ((BinaryType, StringType), "binary or string"),
    "routing_key": ((StringType,), "string"),
    "exchange": ((StringType,), "string"),
    "headers": ((MapType,), "map<string,string>"),
    "timestamp": ((TimestampType,), "timestamp"),
    **{name: ((StringType,), "string") for name in STRING_PROPERTIES},
    **{name: (_INTEGRAL, "an integer type") for name in INTEGER_PROPERTIES},
}
IGNORED = ("queue", "offset", "delivery_count", "redelivered")  # the source's, not AMQP's
DROPPED_HEADERS = frozenset({"x-delivery-count"})
# Distinct property sets of a batch whose encoding is kept (rows with a property of
# their own, e.g. a message_id each, are encoded one by one past this).
SHARED_TEMPLATES = 64
# Stands for the seq in a template's encoding: found there, then cut out.
_SEQ_SENTINEL = 0x5153_5345_515F_5345
_SEQ_FIELD = struct.Struct(">q")


class RowError(ValueError):
    """A row the sink cannot publish; the message names the row and the column."""


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    publisher: str   # stable across retries and replays of the same task's rows
    base: int        # seq of row r is base + r + 1


@dataclass(frozen=True, slots=True)
class InputPlan:
    columns: dict[str, str]   # sink column name -> the DataFrame's column name
    body_is_text: bool


def input_plan(schema: StructType, options: SinkOptions) -> InputPlan:
    """What to read from each row; refuses unknown columns and wrong types."""
    columns: dict[str, str] = {}
    for field in schema.fields:
        name = field.name.lower()
        if name in IGNORED:
            continue
        if name not in ACCEPTED:
            raise OptionError(f"the quorumqueue sink cannot write column '{field.name}': it "
                              f"accepts {', '.join(ACCEPTED)} (and ignores the source's "
                              f"{', '.join(IGNORED)}); drop or rename the column")
        types, shown = ACCEPTED[name]
        if not isinstance(field.dataType, types) or not _map_of_strings(name, field.dataType):
            raise OptionError(f"column '{field.name}' of the quorumqueue sink must be {shown}, "
                              f"got {field.dataType.simpleString()}; cast it")
        if name in columns:
            raise OptionError(f"columns '{columns[name]}' and '{field.name}' both mean "
                              f"'{name}' (column names are case-insensitive); keep one")
        columns[name] = field.name
    if "body" not in columns:
        raise OptionError("the quorumqueue sink needs a 'body' column (binary or string), "
                          f"got columns {', '.join(schema.fieldNames()) or 'none'}")
    if not options.exchange and options.routing_key is None and not (
            {"routing_key", "exchange"} & columns.keys()):
        raise OptionError(f"option '{ROUTING_KEY}' (or a 'routing_key' column) is required "
                          "with the default exchange, which routes by queue name; or set "
                          "option 'exchange'")
    return InputPlan(columns, isinstance(schema[columns["body"]].dataType, StringType))


def _map_of_strings(name: str, data_type: DataType) -> bool:
    if name != "headers":
        return True
    return (isinstance(data_type.keyType, StringType)
            and isinstance(data_type.valueType, StringType))


def to_messages(batches: Iterable[pa.RecordBatch], plan: InputPlan, options: SinkOptions,
                key: IdempotencyKey) -> Iterator[Outgoing]:
    """The task's rows as messages, one by one."""
    for batch, row in _numbered(batches):
        yield from _batch_messages(batch, plan, options, key, row)


def to_outgoing(batches: Iterable[pa.RecordBatch], plan: InputPlan, options: SinkOptions,
                key: IdempotencyKey) -> Iterator[Outgoing | OutgoingRun]:
    """`to_messages`, with a batch of bodies alone (no other column, no null or empty
    body) as one `BodyRun`: the same messages, encoded column-wise by the publisher."""
    bulk = plan.columns.keys() == {"body"}
    template = _template(pika.BasicProperties(
        delivery_mode=2, headers=_headers(None, key.publisher, _SEQ_SENTINEL)))
    for batch, row in _numbered(batches):
        bodies = batch.column(batch.schema.get_field_index(plan.columns["body"]))
        if (bulk and template is not None and batch.num_rows and not bodies.null_count
                and pc.min(pc.binary_length(bodies)).as_py() > 0):
            yield BodyRun(row, batch.num_rows, options.exchange, options.routing_key or "",
                          bodies.cast(pa.large_binary()), template, key.base + row + 1)
        else:
            yield from _batch_messages(batch, plan, options, key, row)


def _numbered(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[pa.RecordBatch, int]]:
    """Each batch with the task's number of its first row."""
    row = 0
    for batch in batches:
        if row + batch.num_rows >= ROWS_PER_BATCH_ID:
            raise RowError(f"a task of the quorumqueue sink writes at most "
                           f"{ROWS_PER_BATCH_ID - 1} rows per batch; repartition the input")
        yield batch, row
        row += batch.num_rows


def _batch_messages(batch: pa.RecordBatch, plan: InputPlan, options: SinkOptions,
                    key: IdempotencyKey, first_row: int) -> Iterator[Outgoing]:
    values = {name: _column(batch, column, name) for name, column in plan.columns.items()}
    absent = [None] * batch.num_rows
    bodies = values["body"]
    exchanges = values.get("exchange", absent)
    routing_keys = values.get("routing_key", absent)
    headers = values.get("headers", absent)
    properties = [(name, values[name]) for name in (*STRING_PROPERTIES, *INTEGER_PROPERTIES,
                                                    "timestamp") if name in values]
    default_key = options.routing_key or ""
    if not properties and "headers" not in values:
        # no property or header columns: every row has the same properties but its seq
        template = _template(pika.BasicProperties(
            delivery_mode=2, headers=_headers(None, key.publisher, _SEQ_SENTINEL)))
        if template is not None:
            yield from _uniform_messages(bodies, exchanges, routing_keys, template, plan,
                                         options, key, first_row)
            return
    templates: dict[tuple, _Template | None] = {}
    for index in range(batch.num_rows):
        row = first_row + index
        body = bodies[index]
        if body is None:
            raise RowError(f"row {row} of this task: column 'body' is null, and an AMQP "
                           "message cannot be; filter out or coalesce null bodies")
        amqp = {name: column[index] for name, column in properties}
        if amqp:
            _check_properties(row, amqp)
        if amqp.get("delivery_mode") is None:
            amqp["delivery_mode"] = 2
        seq = key.base + row + 1
        shape = (tuple(amqp.items()), tuple(headers[index] or ()))
        template = templates.get(shape, _MISSING)
        if template is _MISSING:
            amqp["headers"] = _headers(headers[index], key.publisher, _SEQ_SENTINEL)
            template = _template(pika.BasicProperties(**amqp))
            if len(templates) < SHARED_TEMPLATES:
                templates[shape] = template
        if template is not None:
            stamped = _Stamped(template, seq)
        else:
            amqp["headers"] = _headers(headers[index], key.publisher, seq)
            stamped = pika.BasicProperties(**amqp)
        yield Outgoing(row, exchanges[index] or options.exchange,
                       default_key if routing_keys[index] is None else routing_keys[index],
                       body.encode() if plan.body_is_text else body, stamped)


def _uniform_messages(bodies: list, exchanges: list, routing_keys: list, template: _Template,
                      plan: InputPlan, options: SinkOptions, key: IdempotencyKey,
                      first_row: int) -> Iterator[Outgoing]:
    """`_batch_messages` for rows without property or header columns: the same
    messages, without building and comparing each row's property set."""
    default_exchange, default_key = options.exchange, options.routing_key or ""
    text = plan.body_is_text
    seq = key.base + first_row
    for index, body in enumerate(bodies):
        if body is None:
            raise RowError(f"row {first_row + index} of this task: column 'body' is null, and "
                           "an AMQP message cannot be; filter out or coalesce null bodies")
        routing_key = routing_keys[index]
        yield Outgoing(first_row + index, exchanges[index] or default_exchange,
                       default_key if routing_key is None else routing_key,
                       body.encode() if text else body, _Stamped(template, seq + index + 1))


_MISSING = object()


@dataclass(frozen=True, slots=True)
class _Template:
    properties: pika.BasicProperties   # a row's, with the seq header at the sentinel
    before: bytes                      # its encoding up to the seq's 8 bytes
    after: bytes                       # and after them


def _template(properties: pika.BasicProperties) -> _Template | None:
    """The encoding of `properties` split around the seq; None if it cannot be found
    exactly once (then the rows are encoded one by one)."""
    encoded = b"".join(properties.encode())
    mark = b"l" + _SEQ_FIELD.pack(_SEQ_SENTINEL)
    at = encoded.find(mark)
    if at < 0 or encoded.find(mark, at + 1) >= 0:
        return None
    return _Template(properties, encoded[:at + 1], encoded[at + len(mark):])


class _Stamped(pika.BasicProperties):
    """A row's properties: its template's, with its own seq. Encodes as the template's
    bytes around the seq; reads like any BasicProperties (`headers` holds the seq)."""

    def __init__(self, template: _Template, seq: int) -> None:  # noqa: D107 - fields come
        self.__dict__["_template"] = template                  # from the template
        self.__dict__["_seq"] = seq

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        template = self.__dict__["_template"]
        if name == "headers":
            return {**template.properties.headers, SEQ_HEADER: self.__dict__["_seq"]}
        return getattr(template.properties, name)

    def encode(self) -> list[bytes]:
        template = self._template
        return [template.before, _SEQ_FIELD.pack(self._seq), template.after]


class BodyRun(OutgoingRun):
    """A batch's rows when they are bodies alone: every message has the template's
    properties with its own seq (`seq` for row `first_row`, then one more each)."""

    def __init__(self, first_row: int, count: int, exchange: str, routing_key: str,
                 bodies: pa.LargeBinaryArray, template: _Template, seq: int) -> None:
        self.first_row, self.count = first_row, count
        self.exchange, self.routing_key = exchange, routing_key
        self.bodies, self.template, self.seq = bodies, template, seq
        self._encoded: tuple | None = None   # (arguments, frames) of the last frames()

    def frames(self, method: bytes, channel: int, body_max: int):
        arguments = (method, channel, body_max)
        if self._encoded is not None and self._encoded[0] == arguments:
            return self._encoded[1]
        sizes = pc.binary_length(self.bodies).to_numpy()
        if sizes.max() > body_max:
            return None
        template = self.template
        properties_size = 12 + len(template.before) + 8 + len(template.after)
        # each row: method | header frame (its body size, its seq) | body frame
        joined = pc.binary_join_element_wise(
            _same(method + struct.pack(">BHIHH", FRAME_HEADER, channel, properties_size,
                                       pika.spec.BasicProperties.INDEX, 0)),
            _fixed(sizes.astype(">u8")), _same(template.before),
            _fixed(np.arange(self.seq, self.seq + self.count, dtype=">i8")),
            _same(template.after + FRAME_END + struct.pack(">BH", FRAME_BODY, channel)),
            _fixed(sizes.astype(">u4")), self.bodies, _same(FRAME_END), _same(b""))
        data_buffer, offset_buffer = joined.buffers()[2], joined.buffers()[1]
        offsets = np.frombuffer(offset_buffer, np.int64)[joined.offset:
                                                         joined.offset + self.count + 1]
        self._encoded = (arguments, (memoryview(data_buffer), offsets.tolist()))
        return self._encoded[1]

    def messages(self, start: int, stop: int) -> Iterator[Outgoing]:
        for index, body in enumerate(self.bodies[start:stop].to_pylist(), start):
            yield Outgoing(self.first_row + index, self.exchange, self.routing_key, body,
                           _Stamped(self.template, self.seq + index))

    def batched(self, batch_rows: int = 0) -> OutgoingRun | None:
        """The same rows as batch publishes (`BatchedBodyRun`, at most `batch_rows`
        rows each, 0: BATCH_ROWS), or None if the template's header table is not the
        two idempotency headers alone."""
        head = _batch_head(self.template)
        return None if head is None else BatchedBodyRun(self, head, batch_rows or BATCH_ROWS)


# a batch publish carries at most this many rows and about this many body bytes
# (docs/behaviour/idempotent-publishing.md, "Batch publish")
BATCH_ROWS = 1000
BATCH_BYTES = 1 << 20
_BATCH_KEY = BATCH_HEADER.encode()
_PUBLISHER_ENTRY = bytes([len(PUBLISHER_HEADER)]) + PUBLISHER_HEADER.encode() + b"S"


def _batch_head(template: _Template) -> tuple[bytes, bytes] | None:
    """A batch's properties around its first seq: the template's, with the table
    made longer by the batch entry, which follows the seq. None unless the table is
    the publisher's entry then the seq's (so the seq ends the table)."""
    before = template.before
    at = before.find(_PUBLISHER_ENTRY)
    if at < 4:
        return None
    (length,) = struct.unpack_from(">I", before, at - 4)
    if at + length != len(before) + _SEQ_FIELD.size:  # the seq must end the table
        return None
    entry_size = 1 + len(_BATCH_KEY) + 1 + 8  # key, 'l', the count
    return (before[:at - 4] + struct.pack(">I", length + entry_size) + before[at:],
            template.after)


def unit_bounds(sizes: np.ndarray, batch_rows: int, batch_bytes: int) -> np.ndarray:
    """Where each batch starts, for rows of `sizes` bytes: consecutive rows, at most
    `batch_rows` of them and `batch_bytes` of records (body + 4-byte length) in each
    unit, or one row alone when it is larger. The last bound is len(sizes).

    By bytes, not by a mean size: one large row among small ones would otherwise
    make its unit many times `batch_bytes`, and the broker holds a batch's body to
    max(4 MiB, its max_message_size + 4) (broker/amqp/batch_publish.py)."""
    ends = np.cumsum(sizes.astype(np.int64) + 4)
    ends = np.concatenate(([0], ends))
    bounds, start, count = [0], 0, len(sizes)
    while start < count:
        fits = int(np.searchsorted(ends, ends[start] + batch_bytes, side="right")) - 1
        stop = max(start + 1, min(start + batch_rows, fits))
        bounds.append(stop)
        start = stop
    return np.array(bounds, dtype=np.int64)


class BatchedBodyRun(OutgoingRun):
    """A `BodyRun` sent as batch publishes: unit u is one basic.publish (immediate=true,
    the batch form the bundled broker splits into the rows' messages) of rows
    `bounds[u]` up to `bounds[u + 1]` (`unit_bounds`). `count` is the number of units;
    the rows a unit covers come from `row_range`."""

    is_batch = True

    def __init__(self, run: BodyRun, head: tuple[bytes, bytes], batch_rows: int) -> None:
        self.run, self.head = run, head
        self.first_row = run.first_row
        self.exchange, self.routing_key = run.exchange, run.routing_key
        sizes = pc.binary_length(run.bodies).to_numpy(zero_copy_only=False)
        self.bounds = unit_bounds(sizes, batch_rows, BATCH_BYTES)
        self.count = len(self.bounds) - 1
        self._encoded: tuple | None = None

    def row_range(self, start: int, stop: int) -> tuple[int, int]:
        """Rows (indices in the run) of units `start` to `stop`."""
        return int(self.bounds[start]), int(self.bounds[min(stop, self.count)])

    def units_within(self, start: int, rows: int) -> int:
        last = int(np.searchsorted(self.bounds, self.bounds[start] + rows, side="right")) - 1
        return max(1, min(last, self.count) - start)

    def messages(self, start: int, stop: int) -> Iterator[Outgoing]:
        return self.run.messages(*self.row_range(start, stop))

    def frames(self, method: bytes, channel: int, body_max: int):
        arguments = (method, channel, body_max)
        if self._encoded is not None and self._encoded[0] == arguments:
            return self._encoded[1]
        run, (before, after) = self.run, self.head
        # basic.publish's last octet before the frame end holds its bits: immediate is 2
        method = method[:-2] + bytes([method[-2] | 2]) + method[-1:]
        sizes = pc.binary_length(run.bodies).to_numpy()
        joined = pc.binary_join_element_wise(_fixed(sizes.astype(">u4")), run.bodies,
                                             _same(b""))
        records = memoryview(joined.buffers()[2])
        ends = np.frombuffer(joined.buffers()[1], np.int64)[joined.offset:
                                                             joined.offset + run.count + 1]
        properties_size = 12 + len(before) + 8 + len(after) + 1 + len(_BATCH_KEY) + 1 + 8
        parts, offsets, size = [], [0], 0
        for unit in range(self.count):
            first, last = self.row_range(unit, unit + 1)
            body = records[int(ends[first]):int(ends[last])]
            unit_parts = [method, struct.pack(">BHIHHQ", FRAME_HEADER, channel, properties_size,
                                              pika.spec.BasicProperties.INDEX, 0, len(body)),
                          before, _SEQ_FIELD.pack(run.seq + first),
                          bytes([len(_BATCH_KEY)]), _BATCH_KEY, b"l",
                          _SEQ_FIELD.pack(last - first), after, FRAME_END]
            for at in range(0, len(body), body_max):
                chunk = body[at:at + body_max]
                unit_parts += [struct.pack(">BHI", FRAME_BODY, channel, len(chunk)), chunk,
                               FRAME_END]
            parts += unit_parts
            size += sum(map(len, unit_parts))
            offsets.append(size)
        self._encoded = (arguments, (memoryview(b"".join(parts)), offsets))
        return self._encoded[1]


def _same(value: bytes) -> pa.Scalar:
    """The same bytes in every row."""
    return pa.scalar(value, pa.large_binary())


def _fixed(values: np.ndarray) -> pa.Array:
    """Each element's bytes (numpy's, in its byte order) as a binary column."""
    width = values.dtype.itemsize
    offsets = np.arange(0, width * (len(values) + 1), width, dtype=np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(values), [
        None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(values))])


def _column(batch: pa.RecordBatch, column: str, name: str) -> list:
    array = batch.column(batch.schema.get_field_index(column))
    if name == "timestamp":  # microseconds since the epoch -> AMQP's whole seconds
        return [None if us is None else us // 1_000_000
                for us in array.cast(pa.int64()).to_pylist()]
    return array.to_pylist()


def _check_properties(row: int, amqp: dict) -> None:
    mode = amqp.get("delivery_mode")
    if mode is not None and mode not in (1, 2):
        raise RowError(f"row {row} of this task: column 'delivery_mode' must be 1 "
                       f"(transient) or 2 (persistent), got {mode}")
    priority = amqp.get("priority")
    if priority is not None and not 0 <= priority <= 255:
        raise RowError(f"row {row} of this task: column 'priority' must be 0..255 (quorum "
                       f"queues treat above 4 as high), got {priority}")
    stamp = amqp.get("timestamp")
    if stamp is not None and stamp < 0:
        raise RowError(f"row {row} of this task: column 'timestamp' is before 1970, which "
                       "AMQP's unsigned timestamps cannot carry")


def _headers(entries: list[tuple[str, str | None]] | None, publisher: str,
             seq: int) -> dict[str, object]:
    headers: dict[str, object] = {}
    for name, value in entries or ():
        if name not in DROPPED_HEADERS:
            headers[name] = value
    headers[PUBLISHER_HEADER] = publisher
    headers[SEQ_HEADER] = seq
    return headers


def returned_row(properties: pika.BasicProperties) -> int | None:
    """The row of a returned message, from its sequence header (for error messages)."""
    seq = (properties.headers or {}).get(SEQ_HEADER)
    return (seq - 1) % ROWS_PER_BATCH_ID if isinstance(seq, int) else None

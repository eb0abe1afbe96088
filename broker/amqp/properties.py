"""Content headers: what the broker reads from a message's properties, and how.

Responsibilities: decoding a content header payload into `Properties` (the fields the
broker acts on, the raw payload kept for consumers), the full decode by pamqp for the
rare paths, rewriting header values in place (`with_long_headers`), and finding the
idempotent-publishing key (`publisher_sequence`) without decoding the whole table.

How it works: the fixed part of a header (class, weight, body size, property flags) is
unpacked with struct; the fields before `delivery_mode` are skipped by their lengths,
so a plain publish costs no table decoding, and where the header table starts is
kept (`headers_at`). Header tables are walked entry by entry where only a few names
matter; pamqp decodes them where everything does. The Spark sink's table (its two
idempotency headers alone) is read in place, without a walk.

Invariants: decoders raise AMQPError (501 FRAME_ERROR), never struct.error or
RecursionError; a decoded table nests at most MAX_TABLE_DEPTH levels; the raw header
is never re-encoded unless a value must change.

Not here: frames and methods (codec.py).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pamqp import decode as pamqp_decode

from ..field_values import TYPED
from . import spec, timestamps
from .errors import AMQPError

timestamps.install()  # pamqp reads 'T' as the 64-bit integer it is (timestamps.py)

_header_fixed = struct.Struct(">HHQH")
_u8 = struct.Struct(">B")
_u32 = struct.Struct(">I")
_LONG_FIELD = struct.Struct(">cq")

# Field tables nest (tables and arrays inside tables). RabbitMQ decodes any depth;
# pamqp decodes recursively, two Python frames a level, so a table thousands deep
# would end in a RecursionError. Deeper than this is a 501 FRAME_ERROR instead (no
# client nests arguments or headers anywhere near it), and every table the broker
# keeps can be compared, re-encoded and saved without reaching Python's stack limit.
MAX_TABLE_DEPTH = 100
TOO_DEEP = f"field table nested deeper than {MAX_TABLE_DEPTH} levels"


def too_deep(value: object) -> bool:
    """Whether a decoded table (dicts and lists inside) nests deeper than
    MAX_TABLE_DEPTH. Iterative: it must not recurse itself."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_TABLE_DEPTH:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (dict, list)))
    return False


# property flag bits (AMQP 0-9-1, 4.2.6.1), most significant first
_FLAG_CONTENT_TYPE = 1 << 15
_FLAG_CONTENT_ENCODING = 1 << 14
_FLAG_HEADERS = 1 << 13
_FLAG_DELIVERY_MODE = 1 << 12
_FLAG_PRIORITY = 1 << 11
_FLAG_EXPIRATION = FLAG_EXPIRATION = 1 << 8  # (public: a caller may test it first)


@dataclass(slots=True)
class Properties:
    """What the broker reads from a content header. `raw` is the whole header
    payload, forwarded to consumers byte for byte."""

    raw: bytes
    body_size: int
    delivery_mode: int = 0
    priority: int = 0
    flags: int = 0
    # where the header table starts in `raw` (its u32 length), found while decoding;
    # 0: no table, or continuation flags (then only the full decode reads it)
    headers_at: int = 0
    # the routing keys the publisher selected besides the routing key: its CC and BCC
    # headers' strings (RabbitMQ's sender-selected distribution; node/handlers.py)
    selected_keys: tuple = ()
    # the idempotency key (publisher, seq) when already known: a batch publish's
    # messages carry theirs (amqp/batch_publish.py), so `publisher_sequence` reads none
    key: tuple | None = None
    # the BCC header's strings among them: the header is removed from `raw`, and a
    # queue stores them with the message, for its dead-lettered copy is routed by them
    # too (queues/dead_letter.py); never delivered
    blind_keys: tuple = ()
    # offsets are resolved lazily for the rarely needed fields
    _decoded: dict | None = None

    @property
    def persistent(self) -> bool:
        return self.delivery_mode == 2

    def decoded(self) -> dict:
        """All properties, decoded by pamqp (rare path: headers routing,
        reply-to rewriting, user-id checks)."""
        if self._decoded is None:
            from pamqp.header import ContentHeader

            header = ContentHeader()
            try:
                header.unmarshal(self.raw)
                if too_deep(header.properties.headers or {}):
                    raise RecursionError(TOO_DEEP)
            except RecursionError:
                raise AMQPError(spec.FRAME_ERROR,
                                f"cannot decode content header: {TOO_DEEP}") from None
            except (struct.error, ValueError, TypeError, IndexError) as error:
                raise AMQPError(spec.FRAME_ERROR,
                                f"cannot decode content header: {error}") from None
            self._decoded = {name: getattr(header.properties, name)
                             for name in header.properties.attributes()}
        return self._decoded


def may_select_keys(properties: Properties) -> bool:
    """Might the header table hold a CC or BCC header (a key of 2 or 3 octets)? Only
    then is it decoded for them: a false positive costs a decode."""
    return bool(properties.flags & _FLAG_HEADERS) and (b"\x02CC" in properties.raw
                                                        or b"\x03BCC" in properties.raw)


def expiration_error(properties: Properties) -> str | None:
    """Why the message's `expiration` property is refused, in RabbitMQ's words
    (rabbit_basic:parse_expiration, with Erlang's string:to_integer: an optional sign
    and digits, nothing after them, not negative), or None when it is absent or
    valid. rabbit_channel refuses such a publish with 406 PRECONDITION_FAILED -
    invalid expiration '...': <this>."""
    if not properties.flags & _FLAG_EXPIRATION:
        return None
    text = properties.decoded().get("expiration")
    if text is None:
        return None
    unsigned = text[1:] if text[:1] in ("+", "-") else text
    rest = unsigned.lstrip("0123456789")
    if len(rest) == len(unsigned):
        return "no_integer"
    if rest:
        escaped = rest.replace("\\", "\\\\").replace('"', '\\"')
        return f'{{leftover_string,"{escaped}"}}'
    value = int(text)
    return f"{{value_negative,{value}}}" if value < 0 else None


def decode_properties(payload: bytes) -> tuple[int, Properties]:
    """(class_id, Properties) of a content header payload."""
    try:
        class_id, _weight, body_size, flags = _header_fixed.unpack_from(payload)
        properties = Properties(payload, body_size, flags=flags)
        if flags & 1:
            # continuation flags are not used by 0-9-1 basic; decode fully
            properties.decoded()
        offset = 14
        if flags & _FLAG_CONTENT_TYPE:
            offset += 1 + payload[offset]
        if flags & _FLAG_CONTENT_ENCODING:
            offset += 1 + payload[offset]
        if flags & _FLAG_HEADERS:
            if not flags & 1:
                properties.headers_at = offset
            offset += 4 + _u32.unpack_from(payload, offset)[0]
        if flags & _FLAG_DELIVERY_MODE:
            properties.delivery_mode = payload[offset]
            offset += 1
        if flags & _FLAG_PRIORITY:
            properties.priority = payload[offset]
            offset += 1
        if offset > len(payload):
            raise IndexError("property list past end of frame")
        return class_id, properties
    except (struct.error, IndexError) as error:
        raise AMQPError(spec.FRAME_ERROR, f"cannot decode content header: {error}") from None


def encode_properties(body_size: int, values: dict, class_id: int = spec.BASIC) -> bytes:
    """A content header payload from a dict of property values (pamqp names)."""
    from pamqp.commands import Basic
    from pamqp.header import ContentHeader

    header = ContentHeader(0, body_size, Basic.Properties(**values))
    header.class_id = class_id
    return header.marshal()


# ---------------------------------------------------------------- header tables

# Field-table value types (RabbitMQ's, as the errata and every RabbitMQ client encode
# them, and as pamqp reads them): fixed sizes in octets, and those that carry a u32
# length first (long string, array, table, byte array). pamqp also reads type 0 as
# void, so both readers here do.
_FIXED_SIZE = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4,
               ord("i"): 4, ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5,
               ord("T"): 8, ord("V"): 0, 0: 0}
_LENGTH_FIRST = frozenset(map(ord, "SAFx"))


def _header_table_span(raw: bytes, flags: int) -> tuple[int, int]:
    """Where a content header's header table starts (its u32 length) and ends."""
    offset = 14
    for present in (_FLAG_CONTENT_TYPE, _FLAG_CONTENT_ENCODING):
        if flags & present:
            offset += 1 + raw[offset]
    return offset, offset + 4 + int.from_bytes(raw[offset:offset + 4])


def _skip_field_value(data: bytes, offset: int) -> int:
    kind = data[offset]
    offset += 1
    size = _FIXED_SIZE.get(kind)
    if size is not None:
        return offset + size
    if kind in _LENGTH_FIRST:
        return offset + 4 + _u32.unpack_from(data, offset)[0]
    raise ValueError(f"unknown field value type {chr(kind)!r}")


def with_field_types(table: dict, data: bytes, offset: int) -> dict:
    """`table`, pamqp's decoding of the field table at `offset` of `data` (its u32
    length first), with each top-level integer or float whose wire type a plain
    Python value would not name (field_values.TYPED: 'b', 'B', 's', 'u', 'i', 'l',
    'f') as that type's class. Nested tables and arrays are left as pamqp made them."""
    end = offset + 4 + _u32.unpack_from(data, offset)[0]
    position, kept = offset + 4, None
    while position < end:
        key_end = position + 1 + data[position]
        kind = data[key_end]
        typed = TYPED.get(kind)
        if typed is not None:
            key = data[position + 1:key_end].decode("utf-8", "surrogateescape")
            value = table.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                kept = kept or dict(table)
                kept[key] = typed(value)
        position = _skip_field_value(data, key_end)
    return table if kept is None else kept


def _short_string(value: str) -> bytes:
    data = value.encode("utf-8", "surrogateescape")
    if len(data) > 255:
        raise ValueError(f"short string longer than 255 octets: {value[:40]!r}...")
    return _u8.pack(len(data)) + data


def with_long_headers(raw: bytes, values: dict[str, int]) -> bytes:
    """The content header `raw` with headers `values` set as long integers ('l', as
    RabbitMQ writes x-delivery-count), replacing fields of the same names. Every
    other byte of the header is kept as the publisher sent it: the fields are not
    decoded and re-encoded (which would change types and float precision)."""
    _class_id, _weight, _body_size, flags = _header_fixed.unpack_from(raw)
    if flags & 1:  # continuation flags: not used by 0-9-1 basic; take the slow path
        _, properties = decode_properties(raw)
        decoded = dict(properties.decoded())
        decoded["headers"] = {**(decoded.get("headers") or {}), **values}
        return encode_properties(properties.body_size, decoded, _class_id)
    added = b"".join(_short_string(name) + _LONG_FIELD.pack(b"l", value)
                     for name, value in values.items())
    if not flags & _FLAG_HEADERS:
        offset, _end = _header_table_span(raw, flags | _FLAG_HEADERS)
        table = _u32.pack(len(added)) + added
        return (_header_fixed.pack(_class_id, _weight, _body_size, flags | _FLAG_HEADERS)
                + raw[14:offset] + table + raw[offset:])
    return _rewrite_table(raw, flags, values, added)


def without_headers(raw: bytes, names) -> bytes:
    """The content header `raw` without the headers `names` (BCC once routed), every
    other byte as the publisher sent it."""
    _class_id, _weight, _body_size, flags = _header_fixed.unpack_from(raw)
    if flags & 1:  # continuation flags: the slow path
        _, properties = decode_properties(raw)
        decoded = {k: v for k, v in properties.decoded().items() if v is not None}
        decoded["headers"] = {k: v for k, v in (decoded.get("headers") or {}).items()
                              if k not in names}
        return encode_properties(properties.body_size, decoded, _class_id)
    if not flags & _FLAG_HEADERS:
        return raw
    return _rewrite_table(raw, flags, names, b"")


def _rewrite_table(raw: bytes, flags: int, names, added: bytes) -> bytes:
    """`raw` with the header table's fields `names` left out and `added` appended."""
    offset, end = _header_table_span(raw, flags)
    kept, position = [], offset + 4
    names = {name.encode("utf-8", "surrogateescape") for name in names}
    while position < end:
        name_end = position + 1 + raw[position]
        value_end = _skip_field_value(raw, name_end)
        if raw[position + 1:name_end] not in names:
            kept.append(raw[position:value_end])
        position = value_end
    fields = b"".join(kept) + added
    return raw[:offset] + _u32.pack(len(fields)) + fields + raw[end:]


def _headers(properties: Properties) -> dict | None:
    """The header table of a content header, decoded by pamqp."""
    raw = properties.raw
    flags = int.from_bytes(raw[12:14])
    if flags & 1:  # continuation flags: not used by 0-9-1 basic; decode everything
        return properties.decoded().get("headers")
    if not flags & _FLAG_HEADERS:
        return None
    offset, end = _header_table_span(raw, flags)
    return decode_table(raw[offset:end], "content header")


def decode_table(prefixed: bytes, what: str) -> dict:
    """A field table with its u32 length first; a malformed or too deeply nested one
    is 501 FRAME_ERROR naming `what` ("cannot decode content header: ...")."""
    try:
        table = pamqp_decode.field_table(prefixed)[1]
        if too_deep(table):
            raise RecursionError(TOO_DEEP)
        return table
    except RecursionError:
        raise AMQPError(spec.FRAME_ERROR, f"cannot decode {what}: {TOO_DEEP}") from None
    except (struct.error, ValueError, TypeError, IndexError) as error:
        raise AMQPError(spec.FRAME_ERROR, f"cannot decode {what}: {error}") from None


# ---------------------------------------------------------------- idempotent publishing

# The key of an idempotent publish into a quorum queue (docs/behaviour/idempotent-publishing.md,
# "Idempotent publishing").
PUBLISHER_HEADER = "x-quorumqueue-publisher"
SEQ_HEADER = "x-quorumqueue-seq"
MAX_SEQ = (1 << 64) - 1  # the fifo Enqueue's u64
_PUBLISHER_KEY, _SEQ_KEY = PUBLISHER_HEADER.encode(), SEQ_HEADER.encode()
_INTEGER = {ord("b"): struct.Struct(">b"), ord("B"): struct.Struct(">B"),
            ord("s"): struct.Struct(">h"), ord("u"): struct.Struct(">H"),
            ord("I"): struct.Struct(">i"), ord("i"): struct.Struct(">I"),
            ord("l"): struct.Struct(">q"), ord("L"): struct.Struct(">q")}


def publisher_sequence(properties: Properties) -> tuple[str, int]:
    """(publisher, seq) from a publish's headers, or ("", 0) when it carries neither.

    Only a header table naming one of the two headers is read, and only the two
    entries in it (decoding every property costs 4x more), so plain publishes keep
    the fast path. The Spark sink's table (the two headers alone, in its order) is
    read in place (`_sink_key`); any other table is walked entry by entry, and one
    the walk cannot read is decoded by pamqp. Both must be given: a publisher string
    of 1 to 255 bytes and an integer seq in 1..2^64-1; anything else is a client bug
    (PRECONDITION_FAILED)."""
    if properties.key is not None:  # a batch publish's message: checked when cut out
        return properties.key
    at = properties.headers_at
    if at and properties.raw.startswith(_SINK_PUBLISHER, at + 4):
        key = _sink_key(properties.raw, at)
        if key is not None:
            return key
    if b"x-quorumqueue-" not in properties.raw:
        return "", 0
    found = _scan_sequence_headers(properties)
    if found is None:
        headers = _headers(properties) or {}
        found = headers.get(PUBLISHER_HEADER), headers.get(SEQ_HEADER)
    publisher, seq = found
    if publisher is None and seq is None:
        return "", 0
    if isinstance(publisher, bytes):
        publisher = publisher.decode("utf-8", "surrogateescape")
    if (not isinstance(publisher, str) or not publisher
            or len(publisher.encode("utf-8", "surrogateescape")) > 255):
        raise AMQPError(spec.PRECONDITION_FAILED, f"header '{PUBLISHER_HEADER}' must be a "
                        f"string of 1 to 255 bytes (with '{SEQ_HEADER}'), got {publisher!r}",
                        60, 40)
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 < seq <= MAX_SEQ:
        raise AMQPError(spec.PRECONDITION_FAILED, f"header '{SEQ_HEADER}' must be an integer "
                        f"from 1 to 2^64-1 (with '{PUBLISHER_HEADER}'), got {seq!r}", 60, 40)
    return publisher, seq


# The Spark sink's header table, the one every keyed row carries: exactly two entries,
# the publisher (long string 'S') then the seq (signed 64-bit 'l';
# connector/sink_rows.py writes every seq so).
_SINK_PUBLISHER = bytes([len(_PUBLISHER_KEY)]) + _PUBLISHER_KEY + b"S"
_SINK_SEQ = bytes([len(_SEQ_KEY)]) + _SEQ_KEY + b"l"
_SINK_SEQ_ENTRY = len(_SINK_SEQ) + 8
_i64 = struct.Struct(">q")


def _sink_key(raw: bytes, at: int) -> tuple[str, int] | None:
    """(publisher, seq) of a header table (its u32 length at `at`, the publisher's
    entry first) that holds exactly the sink's two entries with valid values; None
    for anything else, which the general path then reads and judges. No loop and no
    per-entry lookups: a third of the walk's cost (bench/README.md, connector_sink.py)."""
    end = at + 4 + _u32.unpack_from(raw, at)[0]  # within raw: decode_properties checked
    value_at = at + 4 + len(_SINK_PUBLISHER) + 4
    if value_at + _SINK_SEQ_ENTRY > end:
        return None
    seq_at = value_at + _u32.unpack_from(raw, value_at - 4)[0]
    if seq_at + _SINK_SEQ_ENTRY != end or not raw.startswith(_SINK_SEQ, seq_at):
        return None
    seq = _i64.unpack_from(raw, end - 8)[0]
    if seq <= 0 or not value_at < seq_at <= value_at + 255:
        return None
    try:
        return raw[value_at:seq_at].decode("utf-8"), seq
    except UnicodeDecodeError:
        return None


def _scan_sequence_headers(properties: Properties) -> tuple[object, object] | None:
    """(publisher, seq) found by walking the header table's entries without decoding
    the others (the Spark sink sends them on every message; pamqp's decoding of the
    whole table was ~12% of the broker's time per keyed publish). None when the table
    is anything but a plain, well-formed one with a long-string publisher and an
    integer seq: then pamqp decodes it and the checks name what is wrong."""
    raw, offset = properties.raw, properties.headers_at
    if not offset:  # no table, or continuation flags
        return None
    end = offset + 4 + _u32.unpack_from(raw, offset)[0]  # within raw: decode_properties checked
    position = offset + 4
    publisher = seq = None
    while position < end:
        key_end = position + 1 + raw[position]
        if key_end >= end:
            return None
        key, kind, position = raw[position + 1:key_end], raw[key_end], key_end + 1
        if kind in _LENGTH_FIRST:
            if position + 4 > end:
                return None
            size = 4 + int.from_bytes(raw[position:position + 4])
        else:
            size = _FIXED_SIZE.get(kind, -1)
            if size < 0:
                return None
        if position + size > end:
            return None
        if key == _PUBLISHER_KEY:
            if kind != ord("S"):
                return None
            try:
                publisher = raw[position + 4:position + size].decode("utf-8")
            except UnicodeDecodeError:
                return None
        elif key == _SEQ_KEY:
            reader = _INTEGER.get(kind)
            if reader is None:
                return None
            seq = reader.unpack_from(raw, position)[0]
        position += size
    return publisher, seq

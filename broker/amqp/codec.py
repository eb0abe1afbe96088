"""AMQP 0-9-1 wire codec: frames in, frames out. No I/O, no protocol state.

How it works:
- `FrameReader` splits a byte stream into (type, channel, payload) frames, checking
  the end octet and the negotiated frame_max (501 FRAME_ERROR otherwise).
- `decode_method` turns a method payload into (class_id, method_id, arguments).
  The hot path (basic.publish, basic.ack/nack/reject) is decoded by hand into small
  slotted dataclasses; every other method is decoded by pamqp, RabbitMQ's own
  low-level codec, so the long tail follows the spec without hand-written code.
- Content headers (`Properties`, `decode_properties`, `with_long_headers`) live in
  properties.py and are importable from here too.
- Encoders for what the server sends are hand-written with struct; the tests check
  every one of them against pamqp's decoder.

Invariants: decoders raise AMQPError (never struct.error/UnicodeError/RecursionError);
strings that are not valid UTF-8 are kept losslessly with surrogateescape; a decoded
field table nests at most MAX_TABLE_DEPTH levels.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterator

from pamqp import commands as pamqp_commands
from pamqp import encode as pamqp_encode
from pamqp import exceptions as pamqp_exceptions

from . import spec
from .errors import AMQPError
from .properties import (MAX_TABLE_DEPTH, TOO_DEEP, Properties, decode_properties,  # noqa: F401
                         decode_table, encode_properties, too_deep, with_field_types,
                         with_long_headers)

_frame_header = struct.Struct(">BHI")
_method_ids = struct.Struct(">HH")
METHOD_INDEX = struct.Struct(">I")  # class_id << 16 | method_id, as one number
_u8 = struct.Struct(">B")
_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_ack_args = struct.Struct(">QB")

HEARTBEAT_FRAME = bytes([spec.FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, spec.FRAME_END])


def frame_error(detail: str) -> AMQPError:
    return AMQPError(spec.FRAME_ERROR, detail)


def _erlang_binary(data: bytes) -> str:
    """A binary as Erlang's ~p prints it: <<"text">> when latin-1 printable, else
    <<0,40,...>>. Octets 160-255 are kept raw (surrogateescape) as RabbitMQ sends them."""
    if data and all(32 <= octet <= 126 or octet >= 160 or octet in _ERLANG_ESCAPES
                    for octet in data):
        text = "".join(_ERLANG_ESCAPES.get(octet) or (chr(octet) if octet < 128
                                                      else chr(0xDC00 + octet))
                       for octet in data)
        return f'<<"{text}">>'
    return "<<" + ",".join(str(octet) for octet in data) + ">>"


_ERLANG_ESCAPES = {8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r",
                   27: "\\e", 34: '\\"', 92: "\\\\"}


def frame_snippet(frame_type: int, payload: bytes) -> str:
    """RabbitMQ's description of a bad frame: "type ~p, ~s octets = ~p"
    (rabbit_reader:payload_snippet shows at most the first 16 octets)."""
    label, shown = ("all", payload) if len(payload) <= 16 else ("first 16", payload[:16])
    return f"type {frame_type}, {label} octets = {_erlang_binary(shown)}"


def bad_frame(frame_type: int, payload: bytes, reason: str | tuple) -> AMQPError:
    """501 as rabbit_reader:frame_error words it: the snippet, then the reason as
    Erlang's ~p prints it at that column. io_lib_format hands io_lib_pretty the
    1-based column (one past the text before it) and a line length of 80, and a term
    stays on one line only if it is shorter than what is left of the line: a tuple
    that does not gets one element per line, aligned one past its brace (RabbitMQ
    3.10.8 wraps a reason of 29 characters after 50, not one of 28)."""
    head = frame_snippet(frame_type, payload) + ": "
    if isinstance(reason, str):
        return frame_error(head + reason)
    flat = "{" + ",".join(str(part) for part in reason) + "}"
    if len(flat) >= 80 - (len(head) + 1):
        indent = ",\n" + " " * (len(head) + 1)
        flat = "{" + indent.join(str(part) for part in reason) + "}"
    return frame_error(head + flat)


class FrameReader:
    """Splits bytes into frames. `frame_max` may change after tune-ok.

    The buffer is immutable bytes: a frame's payload is one slice of it (one copy, no
    intermediate bytearray), and `feed` keeps only the unread tail. What is unread is
    at most one partial frame (bounded by frame_max) once the connection has taken
    every whole frame, so the concatenation in `feed` stays small."""

    __slots__ = ("_buffer", "_position", "frame_max", "mark")

    def __init__(self, frame_max: int) -> None:
        self._buffer = b""
        self._position = 0  # where the next frame starts in _buffer
        self.frame_max = frame_max
        # a position `feed` keeps the bytes from (None: only the unread ones), to read
        # them again (`rewind(mark)`: a connection handed to another worker)
        self.mark: int | None = None

    def feed(self, data: bytes) -> None:
        buffer = self._buffer
        position = self._position
        mark = self.mark
        if mark is not None:
            self._buffer = buffer[mark:] + data
            self._position = position - mark
            self.mark = 0
            return
        if position >= len(buffer):  # all taken: the new bytes are the buffer
            self._buffer = bytes(data)
        else:
            self._buffer = buffer[position:] + data
        self._position = 0

    def take_protocol_header(self) -> bytes | None:
        """The first 8 bytes of a connection, once they have all arrived."""
        position = self._position
        if len(self._buffer) - position < 8:
            return None
        self._position = position + 8
        return self._buffer[position:position + 8]

    @property
    def position(self) -> int:
        """Where the next frame starts: `rewind` reads again from there (until the
        next `feed`)."""
        return self._position

    def rewind(self, position: int) -> None:
        self._position = position

    def unread(self) -> bytes:
        """The bytes from `position` on (not taken into frames yet)."""
        return self._buffer[self._position:]

    def next_frame(self) -> tuple[int, int, bytes] | None:
        """(type, channel, payload) of the next whole frame, or None until more bytes
        arrive. Raises AMQPError (501) for a frame over frame_max or a bad end octet:
        the stream cannot be resynchronised after either."""
        buffer = self._buffer
        position = self._position
        if len(buffer) - position < 7:  # spec.FRAME_HEADER_SIZE
            return None
        frame_type, channel, size = _frame_header.unpack_from(buffer, position)
        if size + 8 > self.frame_max:  # spec.FRAME_OVERHEAD
            raise bad_frame(frame_type, b"", ("frame_too_large", size,
                                              self.frame_max - spec.FRAME_OVERHEAD))
        frame_end = position + 7 + size
        if frame_end >= len(buffer):
            return None
        payload = buffer[position + 7:frame_end]
        if buffer[frame_end] != 206:  # spec.FRAME_END
            raise bad_frame(frame_type, payload,
                            ("invalid_frame_end_marker", buffer[frame_end]))
        self._position = frame_end + 1
        return frame_type, channel, payload

    def frames(self) -> Iterator[tuple[int, int, bytes]]:
        """Every whole frame buffered now."""
        while (found := self.next_frame()) is not None:
            yield found


# ---------------------------------------------------------------- client methods

# The hot-path methods are never changed once decoded; they are not frozen
# dataclasses only because those cost four times as much to build.


@dataclass(slots=True)
class Publish:
    exchange: str
    routing_key: str
    mandatory: bool
    immediate: bool


@dataclass(slots=True)
class Ack:
    delivery_tag: int
    multiple: bool


@dataclass(slots=True)
class Nack:
    delivery_tag: int
    multiple: bool
    requeue: bool


@dataclass(slots=True)
class Reject:
    delivery_tag: int
    requeue: bool


def _short_str(data: bytes, offset: int) -> tuple[str, int]:
    length = data[offset]
    end = offset + 1 + length
    if end > len(data):
        raise IndexError("short string past end of frame")
    return data[offset + 1:end].decode("utf-8", "surrogateescape"), end


# The hot decoders read the whole method payload (the four octets of class and method
# ids first): no slice of the arguments is copied per message.


def _decode_publish(payload: bytes) -> Publish:
    # ids(4) ticket(2) exchange(shortstr) routing_key(shortstr) bits(mandatory, immediate)
    end = 7 + payload[6]
    exchange = payload[7:end].decode("utf-8", "surrogateescape")
    start = end + 1
    end = start + payload[end]
    if end >= len(payload):
        raise IndexError("basic.publish arguments past end of frame")
    bits = payload[end]
    return Publish(exchange, payload[start:end].decode("utf-8", "surrogateescape"),
                   bool(bits & 1), bool(bits & 2))


def _decode_ack(payload: bytes) -> Ack:
    tag, bits = _ack_args.unpack_from(payload, 4)
    return Ack(tag, bool(bits & 1))


def _decode_nack(payload: bytes) -> Nack:
    tag, bits = _ack_args.unpack_from(payload, 4)
    return Nack(tag, bool(bits & 1), bool(bits & 2))


def _decode_reject(payload: bytes) -> Reject:
    tag, bits = _ack_args.unpack_from(payload, 4)
    return Reject(tag, bool(bits & 1))


_HOT_DECODERS = {
    spec.BASIC_PUBLISH: _decode_publish,
    spec.BASIC_ACK: _decode_ack,
    spec.BASIC_NACK: _decode_nack,
    spec.BASIC_REJECT: _decode_reject,
}


def decode_publish(payload: bytes) -> Publish:
    """basic.publish's arguments from its method payload (`decode_method` without the
    lookup, for the per-message path); the same AMQPError if they cannot be read."""
    try:
        return _decode_publish(payload)
    except IndexError as error:
        raise AMQPError(spec.FRAME_ERROR, "cannot decode basic.publish arguments: "
                        f"{error}", *spec.BASIC_PUBLISH) from None


# queue.declare and exchange.declare keep their arguments' wire types (field_values.py):
# how many short strings precede the bits octet and the arguments table
_TYPED_ARGUMENTS = {(50, 10): 1, (40, 10): 2}


def decode_method(payload: bytes) -> tuple[int, int, Any]:
    """(class_id, method_id, arguments) of a method frame payload.

    Raises AMQPError: 540 NOT_IMPLEMENTED for an unknown class/method (as RabbitMQ's
    framing does), 501 FRAME_ERROR for arguments that cannot be decoded.
    """
    if len(payload) < 4:
        raise frame_error(f"method frame too short ({len(payload)} octets)")
    class_id, method_id = _method_ids.unpack_from(payload)
    ids = (class_id, method_id)
    hot = _HOT_DECODERS.get(ids)
    try:
        if hot is not None:
            return class_id, method_id, hot(payload)
        cls = pamqp_commands.INDEX_MAPPING.get((class_id << 16) | method_id)
        if cls is None:
            raise AMQPError(spec.COMMAND_INVALID, f"unknown method {class_id}/{method_id}",
                            class_id, method_id, connection_level=True)
        method = cls()
        method.unmarshal(payload[4:])
        if any(isinstance(value, dict) and too_deep(value) for _name, value in method):
            raise RecursionError(TOO_DEEP)
        strings = _TYPED_ARGUMENTS.get(ids)
        if strings is not None:  # the arguments RabbitMQ names the types of
            offset = 6  # class and method ids, the reserved short
            for _ in range(strings):
                offset += 1 + payload[offset]
            method.arguments = with_field_types(method.arguments, payload, offset + 1)
        return class_id, method_id, method
    except RecursionError:
        raise AMQPError(spec.FRAME_ERROR,
                        f"cannot decode {spec.method_name(class_id, method_id)} "
                        f"arguments: {TOO_DEEP}", class_id, method_id) from None
    except (struct.error, IndexError, ValueError, TypeError,
            pamqp_exceptions.UnmarshalingException) as error:
        raise AMQPError(spec.FRAME_ERROR,
                        f"cannot decode {spec.method_name(class_id, method_id)} "
                        f"arguments: {error}", class_id, method_id) from None


# ---------------------------------------------------------------- server encoders


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return b"".join((_frame_header.pack(frame_type, channel, len(payload)), payload,
                     b"\xce"))


def _ss(value: str) -> bytes:
    data = value.encode("utf-8", "surrogateescape")
    if len(data) > 255:
        raise ValueError(f"short string longer than 255 octets: {value[:40]!r}...")
    return _u8.pack(len(data)) + data


def _reply_text(text: str) -> bytes:
    """A reply text as a short string, cut to 255 octets on a UTF-8 character
    boundary (details naming unicode queues can be longer than that)."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) > 255:
        end = 255
        while end and data[end] & 0xC0 == 0x80:  # do not split a multi-octet character
            end -= 1
        data = data[:end]
    return _u8.pack(len(data)) + data


def _ls(value: bytes | str) -> bytes:
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return _u32.pack(len(data)) + data


def field_table(table: dict | None) -> bytes:
    return pamqp_encode.field_table(table or {})


def decode_field_table(data: bytes) -> dict:
    return decode_table(_u32.pack(len(data)) + data, "field table")


def method(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    payload = _method_ids.pack(class_id, method_id) + args
    return b"".join((_frame_header.pack(spec.FRAME_METHOD, channel, len(payload)),
                     payload, b"\xce"))


def bits(*flags: bool) -> bytes:
    value = 0
    for position, flag in enumerate(flags):
        if flag:
            value |= 1 << position
    return _u8.pack(value)


def connection_start(server_properties: dict, mechanisms: str, locales: str) -> bytes:
    return method(0, 10, 10, b"\x00\x09" + field_table(server_properties)
                  + _ls(mechanisms) + _ls(locales))


def connection_tune(channel_max: int, frame_max: int, heartbeat: int) -> bytes:
    return method(0, 10, 30, struct.pack(">HIH", channel_max, frame_max, heartbeat))


def connection_open_ok() -> bytes:
    return method(0, 10, 41, _ss(""))


def connection_close(code: int, text: str, class_id: int, method_id: int) -> bytes:
    return method(0, 10, 50, _u16.pack(code) + _reply_text(text)
                  + _method_ids.pack(class_id, method_id))


def connection_close_ok() -> bytes:
    return method(0, 10, 51)


def connection_blocked(reason: str) -> bytes:
    return method(0, 10, 60, _ss(reason))


def connection_unblocked() -> bytes:
    return method(0, 10, 61)


def channel_open_ok(channel: int) -> bytes:
    return method(channel, 20, 11, _ls(b""))


def channel_flow_ok(channel: int, active: bool) -> bytes:
    return method(channel, 20, 21, bits(active))


def channel_close(channel: int, code: int, text: str, class_id: int, method_id: int) -> bytes:
    return method(channel, 20, 40, _u16.pack(code) + _reply_text(text)
                  + _method_ids.pack(class_id, method_id))


def channel_close_ok(channel: int) -> bytes:
    return method(channel, 20, 41)


def exchange_declare_ok(channel: int) -> bytes:
    return method(channel, 40, 11)


def exchange_delete_ok(channel: int) -> bytes:
    return method(channel, 40, 21)


def exchange_bind_ok(channel: int) -> bytes:
    return method(channel, 40, 31)


def exchange_unbind_ok(channel: int) -> bytes:
    return method(channel, 40, 51)


def queue_declare_ok(channel: int, queue: str, message_count: int, consumer_count: int) -> bytes:
    return method(channel, 50, 11, _ss(queue) + struct.pack(">II", message_count, consumer_count))


def queue_bind_ok(channel: int) -> bytes:
    return method(channel, 50, 21)


def queue_purge_ok(channel: int, message_count: int) -> bytes:
    return method(channel, 50, 31, _u32.pack(message_count))


def queue_delete_ok(channel: int, message_count: int) -> bytes:
    return method(channel, 50, 41, _u32.pack(message_count))


def queue_unbind_ok(channel: int) -> bytes:
    return method(channel, 50, 51)


def basic_qos_ok(channel: int) -> bytes:
    return method(channel, 60, 11)


def basic_consume_ok(channel: int, consumer_tag: str) -> bytes:
    return method(channel, 60, 21, _ss(consumer_tag))


def basic_cancel(channel: int, consumer_tag: str) -> bytes:
    """The server's cancel notification: nowait set, as RabbitMQ sends it."""
    return method(channel, 60, 30, _ss(consumer_tag) + bits(True))


def basic_cancel_ok(channel: int, consumer_tag: str) -> bytes:
    return method(channel, 60, 31, _ss(consumer_tag))


def basic_recover_ok(channel: int) -> bytes:
    return method(channel, 60, 111)


def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return method(channel, 60, 80, _ack_args.pack(delivery_tag, 1 if multiple else 0))


def basic_nack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    # requeue bit is meaningless from server to client; RabbitMQ sends requeue=false
    return method(channel, 60, 120, _ack_args.pack(delivery_tag, 1 if multiple else 0))


def basic_get_empty(channel: int) -> bytes:
    return method(channel, 60, 72, _ss(""))


def confirm_select_ok(channel: int) -> bytes:
    return method(channel, 85, 11)


def tx_select_ok(channel: int) -> bytes:
    return method(channel, 90, 11)


def tx_commit_ok(channel: int) -> bytes:
    return method(channel, 90, 21)


def tx_rollback_ok(channel: int) -> bytes:
    return method(channel, 90, 31)


def content(channel: int, header: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """Header frame plus body frames split to fit frame_max."""
    parts = [frame(spec.FRAME_HEADER, channel, header)]
    chunk = frame_max - spec.FRAME_OVERHEAD
    if len(body) <= chunk:
        if body:
            parts.append(frame(spec.FRAME_BODY, channel, body))
    else:
        view = memoryview(body)
        for start in range(0, len(body), chunk):
            parts.append(frame(spec.FRAME_BODY, channel, bytes(view[start:start + chunk])))
    return parts


def basic_deliver(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
                  exchange: str, routing_key: str) -> bytes:
    return method(channel, 60, 60, _ss(consumer_tag) + _u64.pack(delivery_tag)
                  + bits(redelivered) + _ss(exchange) + _ss(routing_key))


_SHORT_STRINGS: dict[str, bytes] = {}  # consumer tags, exchanges, routing keys, encoded
_SHORT_STRINGS_MAX = 4096


def _ss_cached(value: str) -> bytes:
    encoded = _SHORT_STRINGS.get(value)
    if encoded is None:
        encoded = _ss(value)
        if len(_SHORT_STRINGS) >= _SHORT_STRINGS_MAX:
            _SHORT_STRINGS.clear()
        _SHORT_STRINGS[value] = encoded
    return encoded


_DELIVER_IDS = _method_ids.pack(60, 60)


def delivery(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool,
             exchange: str, routing_key: str, header: bytes, body: bytes,
             frame_max: int) -> bytes:
    """basic.deliver, its content header and body frames as one string of bytes
    (what `basic_deliver` and `content` make, joined): a consumer's every message,
    `deliveries` of this one. The short strings, the same for most deliveries, are
    encoded once."""
    cached = _SHORT_STRINGS.get  # (an encoded short string is never empty: never false)
    names = ((cached(exchange) or _ss_cached(exchange))
             + (cached(routing_key) or _ss_cached(routing_key)))
    parts: list = []
    deliveries(channel, consumer_tag, delivery_tag, ((redelivered, names, header, body),),
               frame_max, parts)
    return b"".join(parts)


_end_then_frame_header = struct.Struct(">BBHI")  # a frame's end octet, the next one's header
# basic.deliver's start, by the length of its ids and consumer tag (made when first
# asked for): frame type, channel, payload size, the ids and the tag, the delivery
# tag, the redelivered octet
_DELIVER_STARTS: dict[int, struct.Struct] = {}


def deliveries(channel: int, consumer_tag: str, first_tag: int, messages, frame_max: int,
               parts: list) -> None:
    """What `delivery` makes for each of `messages`, with the delivery tags
    `first_tag`, `first_tag + 1`, ..., appended to `parts` (to be joined: the same
    bytes): a consumer's run of messages in one pass. A message is (redelivered,
    names, content header payload, body), `names` the exchange and the routing key
    already encoded as two short strings; names, header and body may be any
    bytes-like (views into a buffer are appended, not copied)."""
    tag_string = _SHORT_STRINGS.get(consumer_tag) or _ss_cached(consumer_tag)
    ids_and_tag = _DELIVER_IDS + tag_string
    start = _DELIVER_STARTS.get(len(ids_and_tag))
    if start is None:
        start = _DELIVER_STARTS[len(ids_and_tag)] = struct.Struct(f">BHI{len(ids_and_tag)}sQB")
    method_start = start.pack  # one pack per message
    fixed_size = len(ids_and_tag) + 9
    end_then = _end_then_frame_header.pack
    method_type, header_type, body_type, end = (spec.FRAME_METHOD, spec.FRAME_HEADER,
                                                spec.FRAME_BODY, spec.FRAME_END)
    chunk = frame_max - spec.FRAME_OVERHEAD
    extend = parts.extend
    tag = first_tag
    for redelivered, names, header, body in messages:
        size = len(body)
        if 0 < size <= chunk:
            extend((method_start(method_type, channel, fixed_size + len(names), ids_and_tag,
                                 tag, redelivered),
                    names, end_then(end, header_type, channel, len(header)), header,
                    end_then(end, body_type, channel, size), body, b"\xce"))
        elif size:  # split over several frames: views of the body, not copies
            extend((method_start(method_type, channel, fixed_size + len(names), ids_and_tag,
                                 tag, redelivered),
                    names, end_then(end, header_type, channel, len(header)), header))
            view = memoryview(body)
            for at in range(0, size, chunk):
                piece = view[at:at + chunk]
                extend((end_then(end, body_type, channel, len(piece)), piece))
            parts.append(b"\xce")
        else:  # no body: no body frame
            extend((method_start(method_type, channel, fixed_size + len(names), ids_and_tag,
                                 tag, redelivered), names, b"\xce"))
            extend(content(channel, header, body, frame_max))
        tag += 1


def basic_get_ok(channel: int, delivery_tag: int, redelivered: bool, exchange: str,
                 routing_key: str, message_count: int) -> bytes:
    return method(channel, 60, 71, _u64.pack(delivery_tag) + bits(redelivered)
                  + _ss(exchange) + _ss(routing_key) + _u32.pack(message_count))


def basic_return(channel: int, code: int, text: str, exchange: str, routing_key: str) -> bytes:
    return method(channel, 60, 50, _u16.pack(code) + _ss(text) + _ss(exchange)
                  + _ss(routing_key))

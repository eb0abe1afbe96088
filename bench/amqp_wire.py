"""The few AMQP 0-9-1 frames the load generator sends, as bytes; no I/O.

Responsibilities
    Encode the handful of methods a publish-then-consume benchmark needs
    (connection/channel setup, queue.declare -- with x-arguments such as
    ``x-queue-type`` -- and queue.delete, confirm.select, basic.qos/consume/ack)
    and build, once, the block of pre-encoded
    basic.publish + content header + body frames that the publisher writes.

How it works
    Frames are packed with ``struct`` by hand, following the AMQP 0-9-1 spec
    (section 2.3.5 framing, 4.2.6 content framing) and RabbitMQ's errata on
    field tables. The publish block holds ``count`` consecutive messages; each
    body starts with an 8-byte big-endian sequence number that the publisher
    patches in place (``PublishBlock.stamp``) and the consumer reads back, so
    that exactly-once delivery can be checked without decoding anything else.

Invariants
    - A message is ``method frame + header frame + body frame(s)``; bodies
      longer than ``frame_max - 8`` are split over several body frames.
    - Every message of a block has the same length, so message ``i`` starts at
      ``i * message_length`` and its sequence number at a fixed offset in it.

Not here
    Reading frames (``bench.amqp_loadgen`` parses the few it expects inline,
    and hands anything else to pamqp only to name it in an error).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
FRAME_OVERHEAD = 8  # 7-byte frame header + frame-end octet
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

FRAME_HEADER_STRUCT = struct.Struct(">BHI")  # type, channel, payload size
METHOD_ID_STRUCT = struct.Struct(">HH")  # class id, method id
SEQUENCE_STRUCT = struct.Struct(">Q")

# (class id, method id) of every method the generator sends or expects.
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CONNECTION_BLOCKED = (10, 60)
CONNECTION_UNBLOCKED = (10, 61)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
QUEUE_DELETE = (50, 40)
QUEUE_DELETE_OK = (50, 41)
BASIC_QOS = (60, 10)
BASIC_QOS_OK = (60, 11)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_CANCEL = (60, 30)
BASIC_PUBLISH = (60, 40)
BASIC_RETURN = (60, 50)
BASIC_DELIVER = (60, 60)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)

BASIC_CLASS = 60
DELIVERY_MODE_FLAG = 1 << 12  # basic properties: delivery-mode present
PERSISTENT = 2


# -- field encoders ---------------------------------------------------------------


def shortstr(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"shortstr longer than 255 bytes: {text!r}")
    return bytes([len(raw)]) + raw


def longstr(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def table(fields: dict[str, object]) -> bytes:
    """A field table with the value types RabbitMQ reads: t, S, l, F (nested)."""
    encoded = bytearray()
    for name, value in fields.items():
        encoded += shortstr(name)
        if isinstance(value, bool):
            encoded += b"t" + bytes([value])
        elif isinstance(value, str):
            encoded += b"S" + longstr(value.encode())
        elif isinstance(value, int):
            encoded += b"l" + struct.pack(">q", value)
        elif isinstance(value, dict):
            encoded += b"F" + table(value)
        else:
            raise TypeError(f"field {name!r}: unsupported table value {value!r}")
    return longstr(bytes(encoded))


def bits(*flags: bool) -> bytes:
    return bytes([sum(1 << index for index, flag in enumerate(flags) if flag)])


def method_frame(channel: int, method: tuple[int, int], arguments: bytes = b"") -> bytes:
    payload = METHOD_ID_STRUCT.pack(*method) + arguments
    return FRAME_HEADER_STRUCT.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


# -- the methods the generator sends ----------------------------------------------------


def start_ok(user: str, password: str) -> bytes:
    client_properties = table(
        {
            "product": "quorumqueue bench load generator",
            "capabilities": {
                "publisher_confirms": True,
                "basic.nack": True,
                "connection.blocked": True,
                "authentication_failure_close": True,  # a 403 close instead of a bare TCP close
            },
        }
    )
    response = longstr(b"\0" + user.encode() + b"\0" + password.encode())
    return method_frame(0, CONNECTION_START_OK, client_properties + shortstr("PLAIN") + response + shortstr("en_US"))


def tune_ok(channel_max: int, frame_max: int) -> bytes:
    return method_frame(0, CONNECTION_TUNE_OK, struct.pack(">HIH", channel_max, frame_max, 0))  # heartbeat off


def connection_open(vhost: str) -> bytes:
    return method_frame(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + bits(False))


def connection_close() -> bytes:
    return method_frame(0, CONNECTION_CLOSE, struct.pack(">H", 200) + shortstr("bye") + struct.pack(">HH", 0, 0))


def channel_open(channel: int) -> bytes:
    return method_frame(channel, CHANNEL_OPEN, shortstr(""))


def channel_close(channel: int) -> bytes:
    return method_frame(channel, CHANNEL_CLOSE, struct.pack(">H", 200) + shortstr("bye") + struct.pack(">HH", 0, 0))


def queue_declare(
    channel: int,
    queue: str,
    *,
    durable: bool = False,
    passive: bool = False,
    arguments: dict[str, object] | None = None,
) -> bytes:
    """queue.declare; ``arguments`` is the x-arguments table, e.g. {"x-queue-type": "quorum"}."""
    # bits: passive, durable, exclusive, auto-delete, no-wait
    fields = struct.pack(">H", 0) + shortstr(queue) + bits(passive, durable, False, False, False)
    return method_frame(channel, QUEUE_DECLARE, fields + table(arguments or {}))


def queue_delete(channel: int, queue: str) -> bytes:
    return method_frame(channel, QUEUE_DELETE, struct.pack(">H", 0) + shortstr(queue) + bits(False, False, False))


def confirm_select(channel: int) -> bytes:
    return method_frame(channel, CONFIRM_SELECT, bits(False))


def basic_qos(channel: int, prefetch_count: int) -> bytes:
    return method_frame(channel, BASIC_QOS, struct.pack(">IH", 0, prefetch_count) + bits(False))


def basic_consume(channel: int, queue: str, consumer_tag: str) -> bytes:
    # bits: no-local, no-ack, exclusive, no-wait
    arguments = struct.pack(">H", 0) + shortstr(queue) + shortstr(consumer_tag) + bits(False, False, False, False)
    return method_frame(channel, BASIC_CONSUME, arguments + table({}))


_BASIC_ACK_FRAME = struct.Struct(">BHIHHQB")


def basic_ack(channel: int, delivery_tag: int, *, multiple: bool) -> bytes:
    return (
        _BASIC_ACK_FRAME.pack(FRAME_METHOD, channel, 13, *BASIC_ACK, delivery_tag, 1 if multiple else 0)
        + FRAME_END_BYTE
    )


# -- decoders for the replies the generator needs ------------------------------------------


def read_shortstr(payload: bytes, offset: int) -> tuple[str, int]:
    length = payload[offset]
    return payload[offset + 1 : offset + 1 + length].decode(errors="replace"), offset + 1 + length


def read_tune(arguments: bytes) -> tuple[int, int, int]:
    """connection.tune -> (channel_max, frame_max, heartbeat)."""
    return struct.unpack_from(">HIH", arguments)


def read_declare_ok(arguments: bytes) -> tuple[str, int, int]:
    """queue.declare-ok -> (queue, message_count, consumer_count)."""
    queue, offset = read_shortstr(arguments, 0)
    message_count, consumer_count = struct.unpack_from(">II", arguments, offset)
    return queue, message_count, consumer_count


def read_close(arguments: bytes) -> str:
    """connection.close / channel.close -> "CODE TEXT (in class.method)"."""
    (reply_code,) = struct.unpack_from(">H", arguments)
    reply_text, offset = read_shortstr(arguments, 2)
    class_id, method_id = struct.unpack_from(">HH", arguments, offset)
    return f"{reply_code} {reply_text} (in method {class_id}.{method_id})"


# -- the pre-encoded publish block ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishBlock:
    """Up to ``count`` persistent messages to ``queue`` via the default exchange.

    ``frames`` is encoded once; ``stamp`` overwrites the sequence numbers. The
    block holds ``min(count, max_bytes // message_length)`` messages (at least
    one), so big bodies do not turn 1,000 in flight into a huge buffer.
    """

    frames: bytearray
    message_length: int  # bytes per message, all frames included
    sequence_offsets: tuple[int, ...]  # where message i's sequence number sits

    @classmethod
    def build(
        cls, channel: int, queue: str, body_size: int, frame_max: int, count: int, max_bytes: int = 2 << 20
    ) -> PublishBlock:
        if body_size < SEQUENCE_STRUCT.size:
            raise ValueError(f"--size must be at least {SEQUENCE_STRUCT.size} bytes (the sequence number)")
        publish = method_frame(channel, BASIC_PUBLISH, struct.pack(">H", 0) + shortstr("") + shortstr(queue) + bits(False, False))
        properties = struct.pack(">HHQHB", BASIC_CLASS, 0, body_size, DELIVERY_MODE_FLAG, PERSISTENT)
        header = FRAME_HEADER_STRUCT.pack(FRAME_HEADER, channel, len(properties)) + properties + FRAME_END_BYTE
        body = bytes(range(256)) * (body_size // 256 + 1)
        body_frames = bytearray()
        chunk = frame_max - FRAME_OVERHEAD
        for start in range(0, body_size, chunk):
            piece = body[start : min(start + chunk, body_size)]
            body_frames += FRAME_HEADER_STRUCT.pack(FRAME_BODY, channel, len(piece)) + piece + FRAME_END_BYTE
        message = publish + header + bytes(body_frames)
        sequence_at = len(publish) + len(header) + 7  # first body byte
        count = max(1, min(count, max_bytes // len(message)))
        return cls(
            frames=bytearray(message * count),
            message_length=len(message),
            sequence_offsets=tuple(index * len(message) + sequence_at for index in range(count)),
        )

    @property
    def count(self) -> int:
        return len(self.sequence_offsets)

    def stamp(self, first_sequence: int, count: int) -> bytes:
        """Messages ``first_sequence .. first_sequence+count-1`` as one write."""
        pack_into, frames = SEQUENCE_STRUCT.pack_into, self.frames
        for index, offset in enumerate(self.sequence_offsets[:count]):
            pack_into(frames, offset, first_sequence + index)
        return bytes(memoryview(frames)[: count * self.message_length])

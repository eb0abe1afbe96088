"""The benchmark's hand-built AMQP frames, checked against pamqp; its parser, bytewise.

Pure: no broker, no socket. Frame layout is AMQP 0-9-1 section 2.3.5 (and 4.2.6
for content); the confirm arithmetic is RabbitMQ's publisher-confirms extension.
"""

import struct

import pytest
from pamqp import commands, frame, header

from bench import amqp_wire as wire
from bench.amqp_loadgen import CONSUME_CHANNEL, LoadError, LoadSettings, _Generator


def decode_all(data: bytes) -> list[tuple[int, object]]:
    decoded, offset = [], 0
    while offset < len(data):
        used, channel, value = frame.unmarshal(data[offset:])
        decoded.append((channel, value))
        offset += used
    return decoded


@pytest.mark.parametrize(
    ("encoded", "channel", "expected"),
    [
        (wire.start_ok("guest", "pw"), 0, commands.Connection.StartOk),
        (wire.tune_ok(2047, 131072), 0, commands.Connection.TuneOk),
        (wire.connection_open("/"), 0, commands.Connection.Open),
        (wire.channel_open(1), 1, commands.Channel.Open),
        (wire.queue_declare(1, "q", durable=True), 1, commands.Queue.Declare),
        (wire.confirm_select(1), 1, commands.Confirm.Select),
        (wire.basic_qos(2, 1000), 2, commands.Basic.Qos),
        (wire.basic_consume(2, "q", "tag"), 2, commands.Basic.Consume),
        (wire.basic_ack(2, 77, multiple=True), 2, commands.Basic.Ack),
        (wire.queue_delete(1, "q"), 1, commands.Queue.Delete),
        (wire.channel_close(2), 2, commands.Channel.Close),
        (wire.connection_close(), 0, commands.Connection.Close),
    ],
)
def test_each_sent_method_decodes_as_intended(encoded: bytes, channel: int, expected: type) -> None:
    [(decoded_channel, method)] = decode_all(encoded)
    assert (decoded_channel, type(method)) == (channel, expected)


def test_method_fields_that_matter() -> None:
    [(_, start_ok)] = decode_all(wire.start_ok("guest", "pw"))
    assert (start_ok.mechanism, start_ok.response) == ("PLAIN", "\0guest\0pw")
    assert start_ok.client_properties["capabilities"]["publisher_confirms"] is True
    [(_, tune_ok)] = decode_all(wire.tune_ok(2047, 131072))
    assert (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat) == (2047, 131072, 0)
    [(_, declare)] = decode_all(wire.queue_declare(1, "q", durable=True))
    assert (declare.queue, declare.durable, declare.passive, declare.auto_delete) == ("q", True, False, False)
    [(_, qos)] = decode_all(wire.basic_qos(2, 1000))
    assert (qos.prefetch_count, qos.global_) == (1000, False)
    [(_, consume)] = decode_all(wire.basic_consume(2, "q", "tag"))
    assert (consume.queue, consume.consumer_tag, consume.no_ack) == ("q", "tag", False)
    [(_, ack)] = decode_all(wire.basic_ack(2, 77, multiple=True))
    assert (ack.delivery_tag, ack.multiple) == (77, True)


@pytest.mark.parametrize("frame_max", [131072, 4096 + 8, 100])
def test_publish_block_is_persistent_messages_with_stamped_sequence_numbers(frame_max: int) -> None:
    block = wire.PublishBlock.build(1, "bench-q", 1024, frame_max, count=3)
    decoded = decode_all(block.stamp(40, 2))
    methods = [value for _, value in decoded if isinstance(value, commands.Basic.Publish)]
    headers = [value for _, value in decoded if isinstance(value, header.ContentHeader)]
    bodies = b"".join(value.value for _, value in decoded if hasattr(value, "value") and isinstance(value.value, bytes))
    assert [(m.exchange, m.routing_key, m.mandatory) for m in methods] == [("", "bench-q", False)] * 2
    assert [(h.body_size, h.properties.delivery_mode) for h in headers] == [(1024, 2)] * 2
    assert len(bodies) == 2048
    assert [struct.unpack_from(">Q", bodies, offset)[0] for offset in (0, 1024)] == [40, 41]
    assert all(channel == 1 for channel, _ in decoded)
    assert max(len(v.value) for _, v in decoded if hasattr(v, "value") and isinstance(v.value, bytes)) <= frame_max - 8


def test_publish_block_caps_its_size_for_big_bodies() -> None:
    block = wire.PublishBlock.build(1, "q", 200_000, 131072, count=1000, max_bytes=1 << 20)
    assert block.count == (1 << 20) // block.message_length == 5
    assert wire.PublishBlock.build(1, "q", 200_000, 131072, count=1000, max_bytes=10).count == 1


class RecordingTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def consumer(messages: int, prefetch: int = 4) -> tuple[_Generator, RecordingTransport]:
    generator = _Generator(LoadSettings("127.0.0.1", 0, messages=messages, prefetch=prefetch))
    transport = RecordingTransport()
    generator.transport = transport  # type: ignore[assignment]
    generator.consuming = True
    return generator, transport


def deliveries(sequences: list[int], *, redelivered: bool = False, size: int = 16) -> bytes:
    data = bytearray()
    for tag, sequence in enumerate(sequences, start=1):
        arguments = wire.shortstr("ctag") + struct.pack(">QB", tag, redelivered) + wire.shortstr("") + wire.shortstr("q")
        data += wire.method_frame(CONSUME_CHANNEL, wire.BASIC_DELIVER, arguments)
        properties = struct.pack(">HHQHB", 60, 0, size, wire.DELIVERY_MODE_FLAG, 2)
        data += struct.pack(">BHI", 2, CONSUME_CHANNEL, len(properties)) + properties + b"\xce"
        body = struct.pack(">Q", sequence) + bytes(size - 8)
        data += struct.pack(">BHI", 3, CONSUME_CHANNEL, size) + body + b"\xce"
    return bytes(data)


def test_consumer_parses_deliveries_fed_one_byte_at_a_time_and_acks_multiple() -> None:
    generator, transport = consumer(messages=5, prefetch=4)
    for byte in deliveries([3, 0, 4, 1, 2]):
        generator.data_received(bytes([byte]))
    assert generator.failure is None
    assert (generator.consumed, generator.never_delivered()) == (5, 0)
    acks = [value for _, value in decode_all(bytes(transport.written))]
    assert [(ack.delivery_tag, ack.multiple) for ack in acks] == [(2, True), (4, True), (5, True)]


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (deliveries([0, 1, 1]), "delivered twice"),
        (deliveries([7]), "never published"),
        (deliveries([0], redelivered=True), "redelivery"),
    ],
)
def test_consumer_fails_loudly_on_broken_exactly_once(data: bytes, complaint: str) -> None:
    generator, transport = consumer(messages=3)
    generator.data_received(data)
    assert isinstance(generator.failure, LoadError) and complaint in str(generator.failure)
    assert transport.closed


def confirms(*acks: tuple[int, bool]) -> bytes:
    return b"".join(wire.method_frame(1, wire.BASIC_ACK, struct.pack(">QB", tag, multiple)) for tag, multiple in acks)


def test_confirm_accounting_mixes_single_and_multiple_acks() -> None:
    generator = _Generator(LoadSettings("127.0.0.1", 0, messages=10, inflight=10))
    generator.transport = RecordingTransport()  # type: ignore[assignment]
    generator.published = 10
    generator.data_received(confirms((2, False), (4, False), (3, True), (5, False), (10, True)))
    assert (generator.failure, generator.confirmed) == (None, 10)


def test_a_confirm_for_an_unpublished_tag_is_an_error() -> None:
    generator = _Generator(LoadSettings("127.0.0.1", 0, messages=10))
    generator.transport = RecordingTransport()  # type: ignore[assignment]
    generator.published = 3
    generator.data_received(confirms((4, True)))
    assert isinstance(generator.failure, LoadError)

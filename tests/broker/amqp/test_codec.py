"""The wire codec against pamqp, RabbitMQ's own low-level codec, as the oracle.

Every server encoder is decoded with `pamqp.frame.unmarshal` and compared field by
field (AMQP 0-9-1 spec section 4.2.3 frame format, section 1 method definitions);
every hand-written hot-path decoder reads frames marshalled by pamqp. Argument values
come from Hypothesis, including unicode and empty short strings (spec 4.2.5.3:
short strings are at most 255 octets of UTF-8).
"""

from __future__ import annotations

import json
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from quorumqueue.broker.amqp import codec, spec
from quorumqueue.broker.amqp.errors import AMQPError
from quorumqueue.broker.field_values import (Byte, Float, Long, Short, Timestamp, UnsignedByte,
                                              UnsignedInt, UnsignedShort)
from tests.broker.node.harness import marshal, method, raw_frame

EXAMPLES = settings(max_examples=60, deadline=None)


def short_strings(min_size: int = 0) -> st.SearchStrategy[str]:
    """Unicode text that fits a short string (<= 255 octets of UTF-8), often empty."""
    return st.text(min_size=min_size, max_size=80).filter(
        lambda text: len(text.encode("utf-8")) <= 255)


def ascii_names() -> st.SearchStrategy[str]:
    return st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.:", max_size=40)


channels = st.integers(min_value=0, max_value=65535)
user_channels = st.integers(min_value=1, max_value=65535)
u16 = st.integers(min_value=0, max_value=2 ** 16 - 1)
u32 = st.integers(min_value=0, max_value=2 ** 32 - 1)
# pamqp reads and writes long-long fields as signed 64-bit
u64 = st.integers(min_value=0, max_value=2 ** 63 - 1)
reply_codes = st.sampled_from(sorted(spec.REPLY_NAMES))


def decoded(data: bytes, channel: int, cls: type, **fields):
    """Unmarshal one whole frame with pamqp and compare it field by field."""
    consumed, got_channel, value = pamqp_frame.unmarshal(data)
    assert consumed == len(data), "encoder wrote trailing bytes"
    assert got_channel == channel
    assert type(value) is cls, (type(value), cls)
    for attribute in cls.attributes():
        if attribute in fields:
            assert getattr(value, attribute) == fields[attribute], attribute
    assert set(fields) <= set(cls.attributes()), set(fields) - set(cls.attributes())
    return value


# ---------------------------------------------------------------- connection class (1.4.2)


@EXAMPLES
@given(product=short_strings(), cluster=short_strings(),
       mechanisms=st.sampled_from(["PLAIN AMQPLAIN", "PLAIN", ""]))
def test_connection_start_decodes_as_pamqp_connection_start(product, cluster, mechanisms):
    """spec 1.4.2.1 connection.start: version 0-9, a property table, mechanisms, locales."""
    properties = {"product": product, "cluster_name": cluster,
                  "capabilities": {"publisher_confirms": True, "basic.nack": True}}
    data = codec.connection_start(properties, mechanisms, "en_US")
    value = decoded(data, 0, commands.Connection.Start, version_major=0, version_minor=9,
                    mechanisms=mechanisms, locales="en_US")
    assert value.server_properties == properties


@EXAMPLES
@given(channel_max=u16, frame_max=u32, heartbeat=u16)
def test_connection_tune(channel_max, frame_max, heartbeat):
    """spec 1.4.2.5 connection.tune: channel-max short, frame-max long, heartbeat short."""
    data = codec.connection_tune(channel_max, frame_max, heartbeat)
    decoded(data, 0, commands.Connection.Tune, channel_max=channel_max, frame_max=frame_max,
            heartbeat=heartbeat)


def test_connection_open_ok_and_close_ok():
    """spec 1.4.2.8 open-ok (reserved known-hosts ""), 1.4.2.10 close-ok (no fields)."""
    decoded(codec.connection_open_ok(), 0, commands.Connection.OpenOk, known_hosts="")
    decoded(codec.connection_close_ok(), 0, commands.Connection.CloseOk)


@EXAMPLES
@given(code=reply_codes, text=short_strings(), class_id=u16, method_id=u16)
def test_connection_close(code, text, class_id, method_id):
    """spec 1.4.2.9 connection.close: reply-code, reply-text, failing class/method ids."""
    data = codec.connection_close(code, text, class_id, method_id)
    decoded(data, 0, commands.Connection.Close, reply_code=code, reply_text=text,
            class_id=class_id, method_id=method_id)


@EXAMPLES
@given(text=st.text(min_size=200, max_size=400))
def test_close_reply_text_is_cut_to_255_octets_on_a_character_boundary(text):
    """spec 4.2.5.3: a reply-text is a short string, so a long (unicode) detail must be
    cut to 255 octets without splitting a UTF-8 sequence (RabbitMQ truncates too)."""
    for data, cls in ((codec.connection_close(404, text, 50, 10), commands.Connection.Close),
                      (codec.channel_close(3, 404, text, 50, 10), commands.Channel.Close)):
        _consumed, _channel, value = pamqp_frame.unmarshal(data)
        assert type(value) is cls
        assert len(value.reply_text.encode("utf-8")) <= 255
        if len(text.encode("utf-8")) <= 255:
            assert value.reply_text == text
        else:  # a prefix, losing at most the 3 octets of one split character
            assert text.startswith(value.reply_text)
            assert 252 <= len(value.reply_text.encode("utf-8")) <= 255


@EXAMPLES
@given(reason=short_strings())
def test_connection_blocked_and_unblocked(reason):
    """RabbitMQ extension connection.blocked (10/60, reason) and unblocked (10/61)."""
    decoded(codec.connection_blocked(reason), 0, commands.Connection.Blocked, reason=reason)
    decoded(codec.connection_unblocked(), 0, commands.Connection.Unblocked)


def test_heartbeat_frame_is_pamqp_heartbeat():
    """spec 4.2.7: heartbeat frames are type 8 on channel 0 with an empty payload."""
    consumed, channel, value = pamqp_frame.unmarshal(codec.HEARTBEAT_FRAME)
    assert (consumed, channel, type(value)) == (8, 0, pamqp_heartbeat.Heartbeat)
    assert codec.HEARTBEAT_FRAME == pamqp_heartbeat.Heartbeat().marshal()


# ---------------------------------------------------------------- channel class (1.5.2)


@EXAMPLES
@given(channel=user_channels, active=st.booleans(), code=reply_codes, text=short_strings(),
       class_id=u16, method_id=u16)
def test_channel_methods(channel, active, code, text, class_id, method_id):
    """spec 1.5.2.2 open-ok (reserved longstr ""), 1.5.2.5 flow-ok, 1.5.2.6 close,
    1.5.2.7 close-ok, each on the channel it names."""
    decoded(codec.channel_open_ok(channel), channel, commands.Channel.OpenOk, channel_id="")
    decoded(codec.channel_flow_ok(channel, active), channel, commands.Channel.FlowOk,
            active=active)
    decoded(codec.channel_close(channel, code, text, class_id, method_id), channel,
            commands.Channel.Close, reply_code=code, reply_text=text, class_id=class_id,
            method_id=method_id)
    decoded(codec.channel_close_ok(channel), channel, commands.Channel.CloseOk)


# ---------------------------------------------------------------- exchange, queue (1.6, 1.7)


@pytest.mark.parametrize("encoder, cls", [
    (codec.exchange_declare_ok, commands.Exchange.DeclareOk),
    (codec.exchange_delete_ok, commands.Exchange.DeleteOk),
    (codec.exchange_bind_ok, commands.Exchange.BindOk),
    (codec.exchange_unbind_ok, commands.Exchange.UnbindOk),
    (codec.queue_bind_ok, commands.Queue.BindOk),
    (codec.queue_unbind_ok, commands.Queue.UnbindOk),
    (codec.basic_qos_ok, commands.Basic.QosOk),
    (codec.basic_recover_ok, commands.Basic.RecoverOk),
    (codec.confirm_select_ok, commands.Confirm.SelectOk),
    (codec.tx_select_ok, commands.Tx.SelectOk),
    (codec.tx_commit_ok, commands.Tx.CommitOk),
    (codec.tx_rollback_ok, commands.Tx.RollbackOk),
])
@pytest.mark.parametrize("channel", [1, 2047, 65535])
def test_field_less_ok_methods(encoder, cls, channel):
    """The -ok methods without arguments (exchange 1.6.2, queue 1.7.2, basic.qos-ok
    1.8.2.2, basic.recover-ok 1.8.2.11, confirm.select-ok, tx 1.9.2) are exactly the
    bytes pamqp marshals."""
    data = encoder(channel)
    decoded(data, channel, cls)
    assert data == marshal(cls(), channel)


@EXAMPLES
@given(channel=user_channels, queue=short_strings(), messages=u32, consumers=u32)
def test_queue_declare_ok(channel, queue, messages, consumers):
    """spec 1.7.2.2 queue.declare-ok: queue name, message-count, consumer-count."""
    data = codec.queue_declare_ok(channel, queue, messages, consumers)
    decoded(data, channel, commands.Queue.DeclareOk, queue=queue, message_count=messages,
            consumer_count=consumers)


@EXAMPLES
@given(channel=user_channels, count=u32)
def test_queue_purge_ok_and_delete_ok(channel, count):
    """spec 1.7.2.6 purge-ok and 1.7.2.10 delete-ok carry a message-count (long)."""
    decoded(codec.queue_purge_ok(channel, count), channel, commands.Queue.PurgeOk,
            message_count=count)
    decoded(codec.queue_delete_ok(channel, count), channel, commands.Queue.DeleteOk,
            message_count=count)


# ---------------------------------------------------------------- basic class (1.8.2)


@EXAMPLES
@given(channel=user_channels, tag=short_strings())
def test_consume_ok_cancel_and_cancel_ok(channel, tag):
    """spec 1.8.2.4 consume-ok, 1.8.2.5 cancel (server-sent: RabbitMQ's consumer cancel
    notification, sent with nowait=true), 1.8.2.6 cancel-ok."""
    decoded(codec.basic_consume_ok(channel, tag), channel, commands.Basic.ConsumeOk,
            consumer_tag=tag)
    decoded(codec.basic_cancel(channel, tag), channel, commands.Basic.Cancel,
            consumer_tag=tag, nowait=True)
    decoded(codec.basic_cancel_ok(channel, tag), channel, commands.Basic.CancelOk,
            consumer_tag=tag)


@EXAMPLES
@given(channel=user_channels, tag=short_strings(), delivery_tag=u64,
       redelivered=st.booleans(), exchange=short_strings(), routing_key=short_strings())
def test_basic_deliver(channel, tag, delivery_tag, redelivered, exchange, routing_key):
    """spec 1.8.2.8 basic.deliver."""
    data = codec.basic_deliver(channel, tag, delivery_tag, redelivered, exchange, routing_key)
    decoded(data, channel, commands.Basic.Deliver, consumer_tag=tag, delivery_tag=delivery_tag,
            redelivered=redelivered, exchange=exchange, routing_key=routing_key)


@EXAMPLES
@given(channel=user_channels, delivery_tag=u64, redelivered=st.booleans(),
       exchange=short_strings(), routing_key=short_strings(), count=u32)
def test_basic_get_ok_and_get_empty(channel, delivery_tag, redelivered, exchange,
                                    routing_key, count):
    """spec 1.8.2.10 get-ok and get-empty (reserved cluster-id "")."""
    data = codec.basic_get_ok(channel, delivery_tag, redelivered, exchange, routing_key, count)
    decoded(data, channel, commands.Basic.GetOk, delivery_tag=delivery_tag,
            redelivered=redelivered, exchange=exchange, routing_key=routing_key,
            message_count=count)
    decoded(codec.basic_get_empty(channel), channel, commands.Basic.GetEmpty, cluster_id="")


@EXAMPLES
@given(channel=user_channels, code=reply_codes, text=short_strings(),
       exchange=short_strings(), routing_key=short_strings())
def test_basic_return(channel, code, text, exchange, routing_key):
    """spec 1.8.2.7 basic.return."""
    data = codec.basic_return(channel, code, text, exchange, routing_key)
    decoded(data, channel, commands.Basic.Return, reply_code=code, reply_text=text,
            exchange=exchange, routing_key=routing_key)


@EXAMPLES
@given(channel=user_channels, delivery_tag=u64, multiple=st.booleans())
def test_server_ack_and_nack(channel, delivery_tag, multiple):
    """Publisher confirms (RabbitMQ extension): basic.ack 1.8.2.12 and basic.nack from
    the server; RabbitMQ always sends nack with requeue=false."""
    decoded(codec.basic_ack(channel, delivery_tag, multiple), channel, commands.Basic.Ack,
            delivery_tag=delivery_tag, multiple=multiple)
    decoded(codec.basic_nack(channel, delivery_tag, multiple), channel, commands.Basic.Nack,
            delivery_tag=delivery_tag, multiple=multiple, requeue=False)


# ---------------------------------------------------------------- content (4.2.6)


@settings(max_examples=40, deadline=None)
@given(channel=user_channels, body=st.binary(max_size=3000),
       frame_max=st.integers(min_value=9, max_value=1200))
def test_content_is_split_by_frame_max(channel, body, frame_max):
    """spec 4.2.6.2: the body is sent as frames of at most frame-max octets in total
    (payload frame_max - 8); an empty body has no body frame at all."""
    header = pamqp_header.ContentHeader(0, len(body),
                                        commands.Basic.Properties(content_type="x/y"))
    parts = codec.content(channel, header.marshal(), body, frame_max)
    consumed, got_channel, first = pamqp_frame.unmarshal(parts[0])
    assert (consumed, got_channel, type(first)) == (len(parts[0]), channel,
                                                    pamqp_header.ContentHeader)
    assert first.body_size == len(body)
    assert first.properties.content_type == "x/y"
    chunks = []
    for part in parts[1:]:
        assert len(part) <= frame_max
        consumed, got_channel, value = pamqp_frame.unmarshal(part)
        assert (consumed, got_channel) == (len(part), channel)
        assert type(value) is pamqp_body.ContentBody
        chunks.append(value.value)
    assert b"".join(chunks) == body
    assert len(chunks) == math.ceil(len(body) / (frame_max - spec.FRAME_OVERHEAD))


@settings(max_examples=40, deadline=None)
@given(channel=user_channels, tag=short_strings(), delivery_tag=u64, redelivered=st.booleans(),
       exchange=short_strings(), routing_key=short_strings(), body=st.binary(max_size=3000),
       frame_max=st.integers(min_value=9, max_value=1200))
def test_a_delivery_is_deliver_then_its_content(channel, tag, delivery_tag, redelivered,
                                                exchange, routing_key, body, frame_max):
    """`codec.delivery` (a consumer's message in one string of bytes) is exactly
    basic.deliver followed by the content frames, also when asked twice (its short
    strings are cached) and when the body is empty or split by frame_max."""
    header = pamqp_header.ContentHeader(0, len(body), commands.Basic.Properties()).marshal()
    expected = (codec.basic_deliver(channel, tag, delivery_tag, redelivered, exchange,
                                    routing_key)
                + b"".join(codec.content(channel, header, body, frame_max)))
    for _ in range(2):
        assert codec.delivery(channel, tag, delivery_tag, redelivered, exchange, routing_key,
                              header, body, frame_max) == expected


@settings(max_examples=40, deadline=None)
@given(channel=user_channels, tag=short_strings(), first_tag=st.integers(0, 2 ** 62),
       messages=st.lists(st.tuples(st.booleans(), short_strings(), short_strings(),
                                   st.binary(max_size=40), st.binary(max_size=3000)),
                         max_size=6),
       frame_max=st.integers(min_value=9, max_value=1200))
def test_a_run_of_deliveries_is_each_delivery_in_turn(channel, tag, first_tag, messages,
                                                      frame_max):
    """`codec.deliveries` (a consumer's run of messages, names already short strings,
    views taken as they are) makes exactly basic.deliver then the content frames for
    each, with consecutive delivery tags: also for empty bodies and bodies split by
    frame_max."""
    def names(exchange, routing_key):
        return memoryview(codec._ss(exchange) + codec._ss(routing_key))

    parts: list = []
    codec.deliveries(channel, tag, first_tag,
                     [(redelivered, names(exchange, routing_key), memoryview(header),
                       memoryview(body))
                      for redelivered, exchange, routing_key, header, body in messages],
                     frame_max, parts)
    assert b"".join(parts) == b"".join(
        codec.basic_deliver(channel, tag, first_tag + n, redelivered, exchange, routing_key)
        + b"".join(codec.content(channel, header, body, frame_max))
        for n, (redelivered, exchange, routing_key, header, body) in enumerate(messages))


# ---------------------------------------------------------------- hot-path decoders


def decode_one(data: bytes):
    reader = codec.FrameReader(131072)
    reader.feed(data)
    frames = list(reader.frames())
    assert len(frames) == 1
    frame_type, _channel, payload = frames[0]
    assert frame_type == spec.FRAME_METHOD
    return codec.decode_method(payload)


@settings(max_examples=80, deadline=None)
@given(exchange=short_strings(), routing_key=short_strings(), mandatory=st.booleans(),
       immediate=st.booleans(), channel=user_channels)
def test_publish_decoder_reads_pamqp_publish(exchange, routing_key, mandatory, immediate,
                                             channel):
    """spec 1.8.3.7 basic.publish: reserved short, exchange, routing-key, two bits."""
    data = marshal(method(commands.Basic.Publish, exchange=exchange, routing_key=routing_key,
                          mandatory=mandatory, immediate=immediate), channel)
    assert decode_one(data) == (60, 40, codec.Publish(exchange, routing_key, mandatory,
                                                      immediate))


@EXAMPLES
@given(delivery_tag=u64, multiple=st.booleans(), requeue=st.booleans())
def test_ack_nack_reject_decoders_read_pamqp_frames(delivery_tag, multiple, requeue):
    """spec 1.8.3.13 ack, 1.8.3.14 reject, and RabbitMQ's basic.nack (60/120)."""
    assert decode_one(marshal(commands.Basic.Ack(delivery_tag, multiple), 1)) == \
        (60, 80, codec.Ack(delivery_tag, multiple))
    assert decode_one(marshal(commands.Basic.Nack(delivery_tag, multiple, requeue), 1)) == \
        (60, 120, codec.Nack(delivery_tag, multiple, requeue))
    assert decode_one(marshal(commands.Basic.Reject(delivery_tag, requeue), 1)) == \
        (60, 90, codec.Reject(delivery_tag, requeue))


def test_long_tail_methods_are_decoded_by_pamqp():
    """Methods off the hot path come back as pamqp objects with their arguments."""
    declare = commands.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 3})
    class_id, method_id, args = decode_one(marshal(declare, 1))
    assert (class_id, method_id) == (50, 10)
    assert isinstance(args, commands.Queue.Declare)
    assert (args.queue, args.durable, args.arguments) == ("q", True, {"x-max-length": 3})


@pytest.mark.parametrize("payload", [
    b"\x00\x3c\x00\x28",                       # basic.publish without arguments
    b"\x00\x3c\x00\x28\x00\x00\x05ab",         # exchange name runs past the frame
    b"\x00\x3c\x00\x50\x00\x00\x00",           # basic.ack with a short delivery tag
    b"\x00\x3c\x00\x78",                       # basic.nack without arguments
    b"\x00\x3c\x00\x5a\x01",                   # basic.reject without arguments
    b"\x00\x32\x00\x0a\x00\x00\x09",           # queue.declare, name past the end
    b"\x00\x0a",                               # shorter than class and method ids
])
def test_undecodable_arguments_are_frame_errors(payload):
    """RabbitMQ answers arguments it cannot parse with 501 FRAME_ERROR; the decoder
    never leaks struct.error or IndexError."""
    with pytest.raises(AMQPError) as raised:
        codec.decode_method(payload)
    assert raised.value.code == spec.FRAME_ERROR


def test_unknown_method_is_a_connection_error():
    """An unknown class/method id cannot be handled on any channel: a hard error."""
    with pytest.raises(AMQPError) as raised:
        codec.decode_method(b"\x00\x3c\x03\xe7")
    assert raised.value.connection_level
    assert raised.value.code in (spec.COMMAND_INVALID, spec.NOT_IMPLEMENTED)


# ---------------------------------------------------------------- content header (4.2.6.1)

field_values = st.one_of(
    st.booleans(), st.integers(min_value=-2 ** 31, max_value=2 ** 31 - 1),
    st.text(max_size=20), st.none())
tables = st.dictionaries(st.text(min_size=1, max_size=12), field_values, max_size=4)
# any 64-bit count of seconds, past the year 9999 too (amqp/timestamps.py: pamqp alone
# reads 2**32 and above as milliseconds and ends at 9999)
timestamps = st.integers(min_value=0, max_value=2 ** 64 - 1).map(Timestamp)

property_values = st.fixed_dictionaries({}, optional={
    "content_type": short_strings(), "content_encoding": short_strings(), "headers": tables,
    "delivery_mode": st.sampled_from([1, 2]),
    "priority": st.integers(min_value=0, max_value=255),
    "correlation_id": short_strings(), "reply_to": short_strings(),
    "expiration": short_strings(), "message_id": short_strings(), "timestamp": timestamps,
    "message_type": short_strings(), "user_id": short_strings(), "app_id": short_strings(),
})


@settings(max_examples=100, deadline=None)
@given(values=property_values, body_size=u64)
def test_decode_properties_reads_pamqp_content_headers(values, body_size):
    """spec 4.2.6.1 content header: class-id, weight, body-size, property flags (most
    significant bit first) and the present properties in order. The broker reads
    delivery-mode and priority by hand and forwards the raw header unchanged."""
    header = pamqp_header.ContentHeader(0, body_size, commands.Basic.Properties(**values))
    payload = header.marshal()
    class_id, properties = codec.decode_properties(payload)
    assert class_id == 60
    assert properties.raw == payload
    assert properties.body_size == body_size
    assert properties.delivery_mode == values.get("delivery_mode", 0)
    assert properties.priority == values.get("priority", 0)
    assert properties.persistent == (values.get("delivery_mode") == 2)
    present = {key: value for key, value in values.items() if value != ""}  # pamqp omits ""
    expected_flags = 0
    for key in present:
        expected_flags |= commands.Basic.Properties.flags[key]
    assert properties.flags == expected_flags
    full = properties.decoded()
    for key, value in present.items():
        assert full[key] == value, key


def test_present_but_empty_short_strings_do_not_shift_later_properties():
    """A property flag may be set for an empty short string (one length octet 0);
    pamqp never writes one, other clients do. Delivery-mode and priority after it must
    still be read at the right offsets."""
    flags = (1 << 15) | (1 << 14) | (1 << 13) | (1 << 12) | (1 << 11)
    payload = (b"\x00\x3c\x00\x00" + (5).to_bytes(8, "big") + flags.to_bytes(2, "big")
               + b"\x00" + b"\x00" + b"\x00\x00\x00\x00" + b"\x02" + b"\x07")
    class_id, properties = codec.decode_properties(payload)
    assert (class_id, properties.body_size) == (60, 5)
    assert (properties.delivery_mode, properties.priority) == (2, 7)
    header = pamqp_header.ContentHeader()
    header.unmarshal(payload)
    assert (header.properties.content_type, header.properties.delivery_mode,
            header.properties.priority) == ("", 2, 7)
    assert properties.decoded()["priority"] == 7


@EXAMPLES
@given(values=property_values, body_size=st.integers(min_value=0, max_value=2 ** 20))
def test_encode_properties_round_trips_through_pamqp(values, body_size):
    """`encode_properties` (used to rewrite reply-to) writes what pamqp reads back."""
    payload = codec.encode_properties(body_size, values)
    header = pamqp_header.ContentHeader()
    header.unmarshal(payload)
    assert header.body_size == body_size
    for key, value in values.items():
        assert getattr(header.properties, key) == (None if value == "" else value), key


@pytest.mark.parametrize("payload", [
    b"",
    b"\x00\x3c\x00\x00",                                    # no body size, no flags
    b"\x00\x3c\x00\x00" + b"\x00" * 8 + b"\x80\x00",        # content-type flag, no value
    b"\x00\x3c\x00\x00" + b"\x00" * 8 + b"\x80\x00\x05ab",  # content-type past the end
    b"\x00\x3c\x00\x00" + b"\x00" * 8 + b"\x10\x00",        # delivery-mode flag, no value
    b"\x00\x3c\x00\x00" + b"\x00" * 8 + b"\x20\x00\x00\x00\x00\x09",  # headers past end
])
def test_truncated_content_headers_are_frame_errors(payload):
    """spec 4.2.6.1: a content header cut short is 501 FRAME_ERROR, never IndexError."""
    with pytest.raises(AMQPError) as raised:
        codec.decode_properties(payload)
    assert raised.value.code == spec.FRAME_ERROR


# ---------------------------------------------------------------- FrameReader (4.2.3)

client_frames = st.lists(st.one_of(
    st.builds(lambda c, e, r: marshal(method(commands.Basic.Publish, exchange=e,
                                             routing_key=r), c),
              user_channels, short_strings(), short_strings()),
    st.builds(lambda c, t, m: marshal(commands.Basic.Ack(t, m), c), user_channels, u64,
              st.booleans()),
    st.builds(lambda c, b: marshal(pamqp_body.ContentBody(b), c), user_channels,
              st.binary(min_size=1, max_size=300)),
    st.builds(lambda c, n: marshal(pamqp_header.ContentHeader(0, n), c), user_channels,
              u64),
    st.just(marshal(pamqp_heartbeat.Heartbeat(), 0)),
), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(frames=client_frames)
def test_frame_reader_fed_one_byte_at_a_time_yields_the_same_frames(frames):
    """Framing does not depend on how TCP segments the stream: feeding one byte at a
    time gives exactly the frames of feeding everything at once, and those are the
    frames pamqp sees."""
    stream = b"".join(frames)
    whole = codec.FrameReader(131072)
    whole.feed(stream)
    at_once = list(whole.frames())

    trickle = codec.FrameReader(131072)
    one_by_one = []
    for index in range(len(stream)):
        trickle.feed(stream[index:index + 1])
        one_by_one.extend(trickle.frames())
    assert one_by_one == at_once
    assert len(at_once) == len(frames)
    for (frame_type, channel, payload), data in zip(at_once, frames):
        assert data == raw_frame(frame_type, channel, payload)
        _consumed, pamqp_channel, _value = pamqp_frame.unmarshal(data)
        assert pamqp_channel == channel


def test_frame_reader_takes_the_protocol_header_first():
    """spec 4.2.2: the 8-octet protocol header precedes the first frame."""
    reader = codec.FrameReader(131072)
    reader.feed(spec.PROTOCOL_HEADER[:5])
    assert reader.take_protocol_header() is None
    reader.feed(spec.PROTOCOL_HEADER[5:] + codec.HEARTBEAT_FRAME)
    assert reader.take_protocol_header() == spec.PROTOCOL_HEADER
    assert list(reader.frames()) == [(spec.FRAME_HEARTBEAT, 0, b"")]


@pytest.mark.parametrize("end", [0x00, 0xCD, 0xCF, 0xFF])
def test_bad_frame_end_octet_is_frame_error(end):
    """spec 4.2.3: a frame whose end octet is not 0xCE is a 501 FRAME_ERROR."""
    reader = codec.FrameReader(131072)
    reader.feed(raw_frame(spec.FRAME_METHOD, 1, b"\x00\x3c\x00\x50" + b"\x00" * 9, end=end))
    with pytest.raises(AMQPError) as raised:
        list(reader.frames())
    assert raised.value.code == spec.FRAME_ERROR
    assert raised.value.reply_text.startswith("FRAME_ERROR - ")


@pytest.mark.parametrize("end, text", [
    (4, 'type 3, first 16 octets = <<"LLLLLLLLLLLLLLLL">>: {invalid_frame_end_marker,4}'),
    (44, 'type 3, first 16 octets = <<"LLLLLLLLLLLLLLLL">>: {invalid_frame_end_marker,\n'
         + " " * 51 + "44}"),
    (144, 'type 3, first 16 octets = <<"LLLLLLLLLLLLLLLL">>: {invalid_frame_end_marker,\n'
          + " " * 51 + "144}"),
])
def test_a_frame_error_reason_wraps_where_rabbitmq_s_does(end, text):
    """RabbitMQ 3.10.8's texts for a body frame of 'L's with a bad end octet, as the
    hostile-input fuzzer (tests/faults/hostile.py) recorded them: the reason tuple
    stays on the line up to column 78 and wraps from 79 on (Erlang's ~p)."""
    reader = codec.FrameReader(131072)
    reader.feed(raw_frame(spec.FRAME_BODY, 1, b"L" * 300, end=end))
    with pytest.raises(AMQPError) as raised:
        list(reader.frames())
    assert raised.value.detail == text


def test_frames_before_a_bad_end_octet_are_still_yielded():
    """spec 4.2.3: frames that arrived intact before a broken one are processed."""
    reader = codec.FrameReader(131072)
    good = marshal(commands.Basic.Ack(1, False), 1)
    reader.feed(good + raw_frame(spec.FRAME_BODY, 1, b"x", end=0))
    seen = []
    with pytest.raises(AMQPError):
        for item in reader.frames():
            seen.append(item)
    assert seen == [(spec.FRAME_METHOD, 1, good[7:-1])]


@pytest.mark.parametrize("frame_max", [8192, 131072])
def test_oversize_frame_is_frame_error_before_its_payload_arrives(frame_max):
    """spec 4.2.3 / RabbitMQ: a frame larger than the negotiated frame-max (header and
    end octet included) is 501 FRAME_ERROR, detected from the 7-byte header alone."""
    reader = codec.FrameReader(frame_max)
    reader.feed(raw_frame(spec.FRAME_BODY, 1, b"x" * (frame_max - 8)))
    assert len(list(reader.frames())) == 1  # exactly frame_max octets is fine
    reader.feed(b"\x03\x00\x01" + (frame_max - 7).to_bytes(4, "big"))
    with pytest.raises(AMQPError) as raised:
        list(reader.frames())
    assert raised.value.code == spec.FRAME_ERROR
    assert "frame_too_large" in raised.value.detail


def test_long_headers_are_added_without_touching_the_publishers_fields():
    from pamqp import commands as pc
    from pamqp.header import ContentHeader

    from quorumqueue.broker.amqp.codec import decode_properties, with_long_headers

    def header(**values):
        return ContentHeader(0, 5, pc.Basic.Properties(**values)).marshal()

    published = header(content_type="text/plain", message_id="m1", delivery_mode=2,
                       headers={"ratio": 0.1, "n": 7, "x-delivery-count": 3, "s": "x"})
    raw = with_long_headers(published, {"x-delivery-count": 4})
    values = decode_properties(raw)[1].decoded()
    assert values["headers"] == {"ratio": published_ratio(published), "n": 7, "s": "x",
                                 "x-delivery-count": 4}
    assert (values["content_type"], values["message_id"], values["delivery_mode"]) == (
        "text/plain", "m1", 2)
    assert b"\x10x-delivery-countl" + (4).to_bytes(8, "big") in raw  # a long, as RabbitMQ
    assert raw.count(b"ratio") == 1 and published[published.index(b"ratio"):][:11] in raw
    bare = with_long_headers(header(delivery_mode=2), {"x-lease-seq": 9})
    assert decode_properties(bare)[1].decoded()["headers"] == {"x-lease-seq": 9}
    assert decode_properties(bare)[1].delivery_mode == 2


def published_ratio(raw):
    from quorumqueue.broker.amqp.codec import decode_properties

    return decode_properties(raw)[1].decoded()["headers"]["ratio"]


# ------------------------------------------------- declare arguments keep their types

_RANGES = {Byte: (-2 ** 7, 2 ** 7 - 1), UnsignedByte: (0, 2 ** 8 - 1),
           Short: (-2 ** 15, 2 ** 15 - 1), UnsignedShort: (0, 2 ** 16 - 1),
           UnsignedInt: (0, 2 ** 32 - 1), Long: (-2 ** 63, 2 ** 63 - 1)}
typed_values = st.one_of(
    *(st.integers(low, high).map(kind) for kind, (low, high) in _RANGES.items()),
    st.floats(width=32, allow_nan=False).map(Float), st.text(max_size=5), st.booleans())


@settings(max_examples=50, deadline=None)
@given(arguments=st.dictionaries(st.text(min_size=1, max_size=8), typed_values, max_size=6),
       kind=st.sampled_from(["queue", "exchange"]))
def test_declare_arguments_decode_as_the_field_types_they_were_sent_as(arguments, kind):
    """What RabbitMQ names in its errors ('byte', 'short', 'float', ...): a declare's
    top-level arguments come back as field_values' typed classes, and are written back
    as the same octets (encode_table_value)."""
    declare = (commands.Queue.Declare(queue="q", arguments=arguments) if kind == "queue"
               else commands.Exchange.Declare(exchange="x", arguments=arguments))
    payload = struct.pack(">I", declare.index) + declare.marshal()
    _class_id, _method_id, decoded = codec.decode_method(payload)
    assert decoded.arguments == arguments
    assert ({key: type(value) for key, value in decoded.arguments.items()}
            == {key: type(value) for key, value in arguments.items()})
    assert codec.field_table(decoded.arguments) == codec.field_table(arguments)


def test_a_signedint_and_a_double_stay_plain():
    """'I' and 'd' are what a plain int or float is named from (signedint, double)."""
    table = b"\x01aI" + (7).to_bytes(4, "big") + b"\x01dd" + struct.pack(">d", 0.5)
    payload = (struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00"
               + len(table).to_bytes(4, "big") + table)
    _class_id, _method_id, decoded = codec.decode_method(payload)
    assert decoded.arguments == {"a": 7, "d": 0.5}
    assert (type(decoded.arguments["a"]), type(decoded.arguments["d"])) == (int, float)


def test_the_metadata_file_keeps_the_field_types():
    from quorumqueue.broker.storage.metadata_store import decode_arguments, encode_arguments

    arguments = {"b": Byte(10), "s": Short(1000), "i": UnsignedInt(7), "l": Long(3),
                 "f": Float(1.5), "plain": 12, "t": Timestamp(5), "nested": {"b": 1}}
    encoded = encode_arguments(arguments)
    assert encoded["b"] == {"$byte": 10} and encoded["f"] == {"$float": 1.5}
    back = decode_arguments(json.loads(json.dumps(encoded)))
    assert back == arguments
    assert {key: type(value) for key, value in back.items()} == {
        key: type(value) for key, value in arguments.items()}

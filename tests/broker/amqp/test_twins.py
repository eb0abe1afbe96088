"""broker/amqp's hand-inlined copies ("twins") agree with their originals."""
from __future__ import annotations

import re
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands, frame
from pamqp import header as pamqp_header

from quorumqueue.broker.amqp import codec
from quorumqueue.broker.amqp import connection as connection_module
from quorumqueue.broker.amqp.channel import ChannelMachine, ContentState

from .test_connection import Driver


PUBLISH = codec.Publish("", "q", False, False)


def _fields(channel: ChannelMachine) -> dict:
    return {name: getattr(channel, name) for name in ChannelMachine.__slots__}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.binary(min_size=1, max_size=20), min_size=1, max_size=6),
                min_size=1, max_size=5))
def test_a_messages_last_body_frame_leaves_the_channel_as_reset_does(messages):
    """ChannelMachine.body on a message's last frame leaves every field as `reset()`
    leaves them, after messages of one or many frames; the message comes out whole.
    (body calls reset(): its inline copy, a twin, was removed as within noise.)"""
    channel = ChannelMachine(1)
    for frames in messages:
        body = b"".join(frames)
        channel.begin(PUBLISH)
        channel.content = ContentState.AWAITING_BODY
        assert channel.header(codec.encode_properties(len(body), {}), 1 << 20) is None
        events = [channel.body(frame) for frame in frames]
        assert events[:-1] == [None] * (len(frames) - 1) and events[-1].body == body
        reset = ChannelMachine(1)
        reset.begin(PUBLISH)
        reset._parts, reset._received = [b"x"], 1
        reset.reset()
        assert _fields(channel) == _fields(reset)


# frames of an OPEN connection's channels 1 and 2, in any order: publishes, headers
# and bodies (some out of turn, one over max_message_size), other methods, a close
_frames = st.tuples(st.sampled_from(["publish", "header", "body", "qos", "ack", "close"]),
                    st.sampled_from([1, 2, 3]), st.sampled_from([0, 3, 7, 1001]))


# whole messages (basic.publish, header, bodies of up to 7 octets) among them
_steps = st.one_of(st.tuples(st.just("message"), st.sampled_from([1, 2]),
                             st.sampled_from([0, 3, 7, 20])), _frames)


def _raw_frames(kind: str, number: int, size: int) -> bytes:
    if kind != "message":
        return _raw_frame(kind, number, size)
    bodies = b"".join(_raw_frame("body", number, min(7, size - at)) for at in range(0, size, 7))
    return _raw_frame("publish", number, 0) + _raw_frame("header", number, size) + bodies


def _raw_frame(kind: str, number: int, size: int) -> bytes:
    value = {"publish": lambda: commands.Basic.Publish(exchange="", routing_key="q"),
             "header": lambda: pamqp_header.ContentHeader(0, size, commands.Basic.Properties()),
             "body": lambda: pamqp_body.ContentBody(b"b" * min(size, 7) or b"x"),
             "qos": lambda: commands.Basic.Qos(prefetch_count=size),
             "ack": lambda: commands.Basic.Ack(delivery_tag=size + 1),
             "close": lambda: commands.Channel.Close(200, "", 0, 0)}[kind]()
    return frame.marshal(value, number)


def _method_fields(method) -> dict:
    slots = getattr(type(method), "__slots__", None)
    if slots is not None and not hasattr(method, "__dict__"):
        return {name: getattr(method, name) for name in slots}
    return vars(method)


def _plain(events: list) -> list:
    """Events as comparable values (a decoded method's fields, not its identity)."""
    plain = []
    for event in events:
        method = getattr(event, "method", None)
        fields = None if method is None else (type(method).__name__, _method_fields(method))
        plain.append((re.sub(r" at 0x[0-9a-f]+", "", repr(event)), fields))
    return plain


@settings(max_examples=300, deadline=None)
@given(st.lists(_steps, max_size=30), st.booleans())
def test_the_receive_loops_dispatch_fast_path_does_what_channel_frame_does(frames, bytewise):
    """Connection.receive_data's DISPATCH fast path for an OPEN channel's frames (a
    twin of `_channel_frame`'s OPEN case) gives the same events, errors and bytes
    out as the general path, forced here by emptying the DISPATCH table."""
    data = b"".join(_raw_frames(*f) for f in frames)
    fast, slow = Driver(bytewise).open(1, 2), Driver(bytewise).open(1, 2)
    fast_events = fast.feed(data)
    saved = connection_module._DISPATCH
    connection_module._DISPATCH = defaultdict(dict)
    try:
        slow_events = slow.feed(data)
    finally:
        connection_module._DISPATCH = saved
    assert _plain(fast_events) == _plain(slow_events)
    assert fast.connection.data_to_send() == slow.connection.data_to_send()
    assert fast.connection.state == slow.connection.state
    for number in (1, 2):
        one, other = fast.connection.channels.get(number), slow.connection.channels.get(number)
        assert (one and (one.state, one.content)) == (other and (other.state, other.content))

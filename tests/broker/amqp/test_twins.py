"""broker/amqp's hand-inlined copies ("twins") agree with their originals."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.amqp import codec
from quorumqueue.broker.amqp.channel import ChannelMachine, ContentState


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
        channel.begin(object())
        channel.content = ContentState.AWAITING_BODY
        assert channel.header(codec.encode_properties(len(body), {}), 1 << 20) is None
        events = [channel.body(frame) for frame in frames]
        assert events[:-1] == [None] * (len(frames) - 1) and events[-1].body == body
        reset = ChannelMachine(1)
        reset.begin(object())
        reset._parts, reset._received = [b"x"], 1
        reset.reset()
        assert _fields(channel) == _fields(reset)

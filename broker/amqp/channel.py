"""One channel's protocol state: its lifecycle and the assembly of content frames.

Responsibilities: which frame a channel may receive in which state, as two
transition tables (spec 1.5.2 channel class, 4.2.6 content framing). And putting
basic.publish, its content header and its body frames together into one message.

How it works: the connection classifies every frame on a channel into a `Frame`
kind, and looks it up: `TABLE[state][kind]`. A channel that is OPEN first asks
`CONTENT`: is a content header or body due? Then `LIFECYCLE`:
- absent -> OPEN on channel.open;
- OPEN -> CLOSE_REQUESTED on channel.close, then absent once the node answers it
  with close-ok;
- CLOSING -> absent on close-ok.
A kind missing from a table is the protocol error RabbitMQ sends for it.
`lifecycle_error` and `content_error` build it. Their wording is rabbit_reader's
and rabbit_command_assembler's. The tables are nested dicts (state, then kind),
not keyed by pairs: no tuple is built per frame. For an OPEN channel the connection
looks frames up in DISPATCH. That is both tables folded once at import. It is keyed
on what a frame starts with: its type, or its method's class and method ids as one
number. A frame DISPATCH lacks takes the general path through the two tables. So
both paths make the same transitions.

Invariants:
- A channel in CLOSING (the server sent channel.close) acts only on channel.close,
  close-ok and open. Everything else is discarded (spec 1.5.2.5).
- A client's channel.close there is answered with close-ok. The channel stays
  CLOSING until the client's close-ok for the server's close. (Both sides closed at
  once: rabbit_channel's closing state.) So that close-ok is not taken for one on a
  free number. A channel.open before it is the 504 RabbitMQ sends.
- A channel in CLOSE_REQUESTED discards every frame. The client may send nothing on
  it before its close-ok, and the number is not free until then.
- A message's body frames add up to exactly the header's body size.
- A new method arrives only between messages.

Not here: the channel-max count and the connection's own states (connection.py),
what a method does (broker/node/handlers.py).
"""

from __future__ import annotations

import enum

from pamqp import commands as pamqp_commands

from . import spec
from .batch_publish import batch_body_limit, is_batch
from .codec import Publish
from .properties import Properties, decode_properties
from .errors import MAX_MESSAGE_SIZE, AMQPError, message_too_large  # noqa: F401 (tests import it here)
from .events import ContentReceived


class ChannelState(enum.StrEnum):
    OPEN = "open"          # channel.open answered: methods and content flow
    CLOSING = "closing"    # the server sent channel.close: waits for close-ok
    # the client sent channel.close: close-ok goes out once the node has done the
    # channel's earlier methods (Connection.channel_closed); what follows is discarded
    CLOSE_REQUESTED = "close requested"


class ContentState(enum.StrEnum):
    IDLE = "idle"                         # between messages: a method frame is due
    AWAITING_HEADER = "awaiting header"   # after basic.publish
    AWAITING_BODY = "awaiting body"       # after the header, until body_size octets


class Frame(enum.StrEnum):
    """What arrived on a channel, as the tables know it."""

    OPEN = "channel.open"
    CLOSE = "channel.close"
    CLOSE_OK = "channel.close-ok"
    PUBLISH = "basic.publish"              # the one content method a client sends
    CONNECTION_METHOD = "connection method"
    METHOD = "method"                      # any other method
    HEADER = "content header"
    BODY = "content body"


# decoded method class -> its kind; other methods are CONNECTION_METHOD (class 10)
# or METHOD
METHOD_KINDS = {pamqp_commands.Channel.Open: Frame.OPEN,
                pamqp_commands.Channel.Close: Frame.CLOSE,
                pamqp_commands.Channel.CloseOk: Frame.CLOSE_OK,
                Publish: Frame.PUBLISH}


_ALL = tuple(Frame)
_METHODS = (Frame.OPEN, Frame.CLOSE, Frame.CLOSE_OK, Frame.CONNECTION_METHOD, Frame.METHOD)

# state -> frame -> state after it (None: the channel number is free). A CLOSING
# channel discards what is not open, close or close-ok, a CLOSE_REQUESTED one
# everything, so every other kind has an entry there.
LIFECYCLE: dict[ChannelState | None, dict[Frame, ChannelState | None]] = {
    None: {Frame.OPEN: ChannelState.OPEN},
    ChannelState.OPEN: {Frame.CLOSE: ChannelState.CLOSE_REQUESTED,
                        Frame.METHOD: ChannelState.OPEN,
                        Frame.PUBLISH: ChannelState.OPEN,
                        Frame.HEADER: ChannelState.OPEN,
                        Frame.BODY: ChannelState.OPEN},
    # a close crossing the server's is answered with close-ok (the connection sends
    # it); the client's close-ok for the server's close, which follows, ends it; a
    # channel.open before that is 504 "second 'channel.open' seen", as in rabbit_channel
    ChannelState.CLOSING: {**{kind: ChannelState.CLOSING for kind in _ALL
                              if kind is not Frame.OPEN},
                           Frame.CLOSE_OK: None},
    ChannelState.CLOSE_REQUESTED: {kind: ChannelState.CLOSE_REQUESTED for kind in _ALL},
}

# content state -> frame -> content state after it, for an OPEN channel. The header
# and the last body frame may end the message (back to IDLE): `ChannelMachine` does it.
CONTENT: dict[ContentState, dict[Frame, ContentState]] = {
    ContentState.IDLE: {**{kind: ContentState.IDLE for kind in _METHODS},
                        Frame.PUBLISH: ContentState.AWAITING_HEADER},
    ContentState.AWAITING_HEADER: {Frame.HEADER: ContentState.AWAITING_BODY},
    ContentState.AWAITING_BODY: {Frame.BODY: ContentState.AWAITING_BODY},
}


def _frame_keys() -> dict[int, Frame]:
    """The kind of every frame an OPEN channel's dispatch can key on.
    Content frames key by their frame type (2, 3). Methods key by their index
    `class_id << 16 | method_id`: the first four octets of a method payload, and
    pamqp's INDEX_MAPPING keys. No index is below 10 << 16, so the two never
    collide."""
    keys: dict[int, Frame] = {spec.FRAME_HEADER: Frame.HEADER, spec.FRAME_BODY: Frame.BODY}
    for index, method_class in pamqp_commands.INDEX_MAPPING.items():
        keys[index] = (Frame.CONNECTION_METHOD if index >> 16 == spec.CONNECTION
                       else METHOD_KINDS.get(method_class, Frame.METHOD))
    publish_class, publish_method = spec.BASIC_PUBLISH
    keys[publish_class << 16 | publish_method] = Frame.PUBLISH  # decoded as codec.Publish
    return keys


# The two tables above folded, once, into what an OPEN channel does per frame: content
# state -> frame key (frame type or method index, see _frame_keys) -> (its kind, the
# content state after it), for every frame that keeps the channel OPEN. A key absent
# here (channel.close, a frame out of content order, an unknown method) takes the
# general path, which consults LIFECYCLE and CONTENT themselves and raises their
# errors; so both paths make the same transitions, and the per-frame path costs two
# dict lookups instead of classifying the frame and walking both tables.
DISPATCH: dict[ContentState, dict[int, tuple[Frame, ContentState]]] = {
    content: {key: (kind, after[kind]) for key, kind in _frame_keys().items()
              if kind in after and LIFECYCLE[ChannelState.OPEN].get(kind) is ChannelState.OPEN}
    for content, after in CONTENT.items()}


def lifecycle_error(state: ChannelState | None, kind: Frame, number: int, class_id: int,
                    method_id: int) -> AMQPError:
    """The error for a (state, frame) pair LIFECYCLE lacks (all are connection errors)."""
    if state is None:
        if kind is Frame.HEADER or kind is Frame.BODY:
            # rabbit_reader hands any frame on a new number to a fresh command
            # assembler, which wants a method first
            return content_error(ContentState.IDLE)
        return AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'", class_id, method_id)
    if kind is Frame.OPEN:
        return AMQPError(spec.CHANNEL_ERROR, "second 'channel.open' seen", class_id, method_id)
    if kind is Frame.CLOSE_OK:
        return AMQPError(spec.CHANNEL_ERROR, "unexpected channel.close-ok", class_id, method_id)
    # a connection-class method on a channel other than 0
    return AMQPError(spec.COMMAND_INVALID, f"connection method "
                     f"'{spec.method_name(class_id, method_id)}' on channel {number}",
                     class_id, method_id)


def content_error(content: ContentState) -> AMQPError:
    """505 for a frame out of the method -> header -> body order. It is worded as
    RabbitMQ's rabbit_command_assembler states what it was waiting for."""
    if content is ContentState.IDLE:
        return AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method "
                         "frame instead", connection_level=True)
    expected = ("content header for class 60, got non content header frame"
                if content is ContentState.AWAITING_HEADER
                else "content body, got non content body frame")
    return AMQPError(spec.UNEXPECTED_FRAME, f"expected {expected} instead",
                     *spec.BASIC_PUBLISH, connection_level=True)


_IDLE = ContentState.IDLE  # (a global: enum member reads are slow on Python 3.11)


class ChannelMachine:
    """The protocol state of one channel number (the node keeps its own Channel)."""

    __slots__ = ("number", "state", "content", "_publish", "_properties", "_parts",
                 "_received")

    def __init__(self, number: int) -> None:
        self.number = number
        self.state = ChannelState.OPEN
        self.content = ContentState.IDLE
        self._publish: Publish | None = None
        self._properties: Properties | None = None
        self._parts: list[bytes] = []
        self._received = 0

    def begin(self, publish: Publish) -> None:
        self._publish = publish

    def header(self, payload: bytes, max_message_size: int) -> ContentReceived | None:
        class_id, properties = decode_properties(payload)
        if class_id != spec.BASIC:
            raise AMQPError(spec.UNEXPECTED_FRAME, "expected content header for class 60, "
                            f"got one for class {class_id} instead", *spec.BASIC_PUBLISH,
                            connection_level=True)
        limit = max_message_size
        if self._publish is not None and self._publish.immediate and is_batch(properties):
            limit = batch_body_limit(max_message_size)  # each message: `split`
        if properties.body_size > limit:
            self.reset()
            raise message_too_large(properties.body_size, limit)
        self._properties = properties
        if properties.body_size == 0:
            return self._complete()
        return None

    def body(self, payload: bytes) -> ContentReceived | None:
        expected = self._properties.body_size
        received = self._received + len(payload)
        if received > expected:  # as RabbitMQ 4.x
            raise AMQPError(spec.FRAME_ERROR, "content body frame exceeds remaining "
                            "content size", *spec.BASIC_PUBLISH)
        if received < expected:
            self._parts.append(payload)
            self._received = received
            return None
        parts = self._parts
        if parts:
            parts.append(payload)
            payload = b"".join(parts)
        event = ContentReceived(self.number, self._publish, self._properties, payload)
        self.reset()
        return event

    def _complete(self) -> ContentReceived:  # an empty body
        event = ContentReceived(self.number, self._publish, self._properties, b"")
        self.reset()
        return event

    def reset(self) -> None:
        """Between messages again: a message begun is dropped."""
        self.content = _IDLE
        self._publish = self._properties = None
        if self._parts:
            self._parts = []
        self._received = 0

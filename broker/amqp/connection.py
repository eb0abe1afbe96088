"""One AMQP 0-9-1 client connection as a state machine: bytes in, events and bytes out.

Responsibilities:
- the protocol header;
- the connection handshake (start/start-ok, tune/tune-ok, open/open-ok);
- heartbeats and the close-ok timeout;
- channel lifecycles and content assembly (channel.py);
- protocol errors turned into channel.close or connection.close, with RabbitMQ's
  reply codes and texts.
No sockets and no clocks: time comes in as `now` arguments. The model is
python-hyper/h11.

How it works: `receive_data(data, now)` buffers bytes. `next_event()` reads frames
one at a time until one means something to the node, and returns it (events.py).
It returns None when it needs more bytes. The node acts on each event before it
asks for the next. So an error it reports with `fail(error, channel)` already holds
for the very next frame. `next_content(channel)` reads ahead only what cannot fail.
That is the next whole message on the same channel, already received and read
without error (a run of publishes); else nothing. `data_to_send()` returns what to
write. That is the connection's own frames and the frames the node appended to
`outbound`, in the one order they were produced.

States (ConnectionState); a frame a state has no transition for is a protocol error:

    AWAITING_HEADER -protocol header-> AWAITING_START_OK -start-ok-> AUTHENTICATING
      -accept_login()-> AWAITING_TUNE_OK -tune-ok-> AWAITING_OPEN -open-> OPENING
      -accept_open()-> OPEN
    OPEN -fail(connection error)-> CLOSING (connection.close sent; close-ok awaited
      for CLOSE_OK_TIMEOUT at most) -> CLOSED
    OPEN -client connection.close-> CLOSE_REQUESTED -close_accepted()-> CLOSED
      (close-ok sent once the node has done what the channels received before)
    any -client close during the handshake, close-ok, refused login, handshake
      error, framing error, missed heartbeats, lost socket-> CLOSED

Channels follow channel.py's LIFECYCLE and CONTENT tables. Each frame goes through
DISPATCH: the two folded into one lookup for an OPEN channel. `channel_max` bounds
how many channels are OPEN at once (530 NOT_ALLOWED, as rabbit_reader). It does not
bound their numbers. RabbitMQ 3.10 opens channel 65535 under channel_max 2047, and
so does this.

Invariants:
- After connection.close is sent, only close and close-ok are processed (spec
  1.4.2.9).
- Every OPEN channel gets ChannelClosed before ConnectionClosed. So does every
  channel whose close the node has not answered yet. ConnectionClosed is the last
  event.
- The node answers a client's channel.close (`channel_closed`). It does so after
  the channel's earlier methods, as rabbit_channel answers it in its turn.
- A handshake error sends connection.close and drops the connection, as RabbitMQ
  does.

Not here: SASL parsing, users, vhosts and what methods do (broker/node/session.py,
broker/node/handlers.py).
"""

from __future__ import annotations

import enum
from collections import deque

from pamqp import commands as pamqp_commands

from . import codec, spec
from .channel import (CONTENT, DISPATCH, LIFECYCLE, METHOD_KINDS, ChannelMachine, ChannelState,
                      ContentState, Frame, content_error, lifecycle_error)
from .errors import AMQPError
from .events import (ChannelClosed, ChannelCloseRequested, ChannelOpened, ConnectionClosed,
                     ConnectionCloseRequested, ContentReceived, Event, LoginRequested,
                     MethodReceived, VhostRequested)

MECHANISMS = "PLAIN AMQPLAIN"
LOCALES = "en_US"
CLOSE_OK_TIMEOUT = 5.0  # seconds a client has to answer connection.close
# seconds the socket of a connection refused before connection.tune-ok (a failed
# login, an unknown mechanism, a bad tune-ok) stays open, read no more, before it is
# closed: RabbitMQ's SILENT_CLOSE_DELAY, which makes password guessing slow
SILENT_CLOSE_DELAY = 3.0
# RabbitMQ's handshake_timeout (ms in rabbitmq.conf): seconds a connection has from
# its accept to connection.open; the default here, the node passes its setting
HANDSHAKE_TIMEOUT = 10.0
_EARLY = frozenset({"awaiting start-ok", "authenticating", "awaiting tune-ok"})


class ConnectionState(enum.StrEnum):
    AWAITING_HEADER = "awaiting protocol header"
    AWAITING_START_OK = "awaiting start-ok"
    AUTHENTICATING = "authenticating"      # LoginRequested: the node answers
    AWAITING_TUNE_OK = "awaiting tune-ok"
    AWAITING_OPEN = "awaiting open"
    OPENING = "opening"                    # VhostRequested: the node answers
    OPEN = "open"
    # the client sent connection.close: close-ok once the node has done what its
    # channels received before it (`close_accepted`); anything after it is discarded
    CLOSE_REQUESTED = "close requested"
    CLOSING = "closing"                    # the server sent connection.close
    CLOSED = "closed"


_Methods = pamqp_commands.Connection  # connection-class methods
# after these, nothing may leave but the closing frames, in order (`urgent_to_send`)
_ENDING = frozenset({ConnectionState.CLOSE_REQUESTED, ConnectionState.CLOSING,
                     ConnectionState.CLOSED})
# the states handshake_timeout ends (the client's turn); not AUTHENTICATING or OPENING,
# where the node owes the answer
_HANDSHAKING = frozenset({ConnectionState.AWAITING_HEADER, ConnectionState.AWAITING_START_OK,
                          ConnectionState.AWAITING_TUNE_OK, ConnectionState.AWAITING_OPEN})

# handshake state -> (the one method it accepts, the state after it). Anything else is
# 503 COMMAND_INVALID naming what was expected (RabbitMQ closes without a word), except
# connection.close; once tuned (AWAITING_OPEN), rabbit_reader's 504 "unexpected method
# in connection state opening", and any frame off channel 0 is 505.
HANDSHAKE: dict[ConnectionState, tuple[type, ConnectionState]] = {
    ConnectionState.AWAITING_START_OK: (_Methods.StartOk, ConnectionState.AUTHENTICATING),
    ConnectionState.AWAITING_TUNE_OK: (_Methods.TuneOk, ConnectionState.AWAITING_OPEN),
    ConnectionState.AWAITING_OPEN: (_Methods.Open, ConnectionState.OPENING),
}

_FRAME_TYPES = (spec.FRAME_METHOD, spec.FRAME_HEADER, spec.FRAME_BODY, spec.FRAME_HEARTBEAT)
_NO_TRANSITION = object()
# Enum members as module constants for the per-frame path: on Python 3.11 reading a
# member off its class costs ~10x a global (EnumType defines __getattr__).
_OPEN, _CLOSED = ConnectionState.OPEN, ConnectionState.CLOSED
_CHANNEL_OPEN, _CHANNEL_CLOSING = ChannelState.OPEN, ChannelState.CLOSING
_CHANNEL_CLOSE_REQUESTED = ChannelState.CLOSE_REQUESTED
_KIND_METHOD, _KIND_HEADER, _KIND_BODY = Frame.METHOD, Frame.HEADER, Frame.BODY
_KIND_PUBLISH, _KIND_CONNECTION_METHOD = Frame.PUBLISH, Frame.CONNECTION_METHOD
_METHOD, _HEADER, _BODY = spec.FRAME_METHOD, spec.FRAME_HEADER, spec.FRAME_BODY
_IDLE = ContentState.IDLE
_PUBLISH_INDEX = spec.BASIC_PUBLISH[0] << 16 | spec.BASIC_PUBLISH[1]
_DISPATCH = DISPATCH
_method_index = codec.METHOD_INDEX.unpack_from  # a method payload's class_id << 16 | method_id
decode_method, decode_publish = codec.decode_method, codec.decode_publish


class ChannelQuota:
    """The channels one user has open, against its `max-channels` user limit.
    A limit of -1 is none. The user's connections on this node share one quota.
    Each counts the channels it opens and those that end. `elsewhere` is what the
    user has open on the other nodes, as the node last learned it. (RabbitMQ's
    is_over_channel_limit, at channel.open, counts cluster-wide.)"""

    __slots__ = ("user", "limit", "open", "elsewhere")

    def __init__(self, user: str, limit: int = -1) -> None:
        self.user = user
        self.limit = limit
        self.open = 0       # OPEN channels of the user's connections on this node
        self.elsewhere = 0  # the user's open channels on other nodes (set by the node)

    def refusal(self) -> AMQPError | None:
        if 0 <= self.limit <= self.open + self.elsewhere:
            return AMQPError(spec.NOT_ALLOWED, "number of channels opened for user "
                             f"'{self.user}' has reached the maximum allowed user limit "
                             f"of ({self.limit})")
        return None


def _unexpected_method(state: str, class_id: int, method_id: int) -> AMQPError:
    """A method channel 0 has no use for, once the connection is tuned. It is
    rabbit_reader's 504, naming its own connection state. That is "opening" until
    open-ok, then "running"."""
    return AMQPError(spec.CHANNEL_ERROR, f"unexpected method in connection state {state}",
                     class_id, method_id)


def _ids(method_class: type) -> tuple[int, int]:
    return method_class.index >> 16, method_class.index & 0xFFFF


class Connection:
    """The server side of one connection.

    Input: `receive_data(data, now)`, `tick(now)`, `sent(now)`. The answers
    `accept_login`/`refuse_login` and `accept_open`. The node's `fail(error,
    channel)`, `server_close`, `connection_lost`, `block`/`unblock`.
    Output: `next_event()` and `data_to_send()`."""

    def __init__(self, server_properties: dict, *, frame_max: int, channel_max: int,
                 heartbeat: int, max_message_size: int, now: float,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT) -> None:
        self.state = ConnectionState.AWAITING_HEADER
        self.server_properties = server_properties
        # what the server offers in connection.tune; tune-ok may lower them
        self.server_limits = (channel_max, frame_max, heartbeat)
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = 0
        self.max_message_size = max_message_size
        # until tune-ok agrees a frame_max, a frame holds at most the minimum frame
        # size (spec 4.2.3; RabbitMQ's initial_frame_max): a larger start-ok is refused
        self.reader = codec.FrameReader(spec.FRAME_MIN_SIZE)
        self.outbound: list[bytes] = []  # frames to send, in order (the node appends too)
        # channel-0 frames that answer for no write of the node (the handshake's
        # start, tune and open-ok, heartbeats, connection.blocked and unblocked): sent
        # ahead of `outbound`, and by the shell on their own while that waits for an
        # fsync (`urgent_to_send`), so that a slow or full disk delays no handshake
        # and times out no heartbeat
        self.urgent: list[bytes] = []
        self._events: deque[Event] = deque()
        self.channels: dict[int, ChannelMachine] = {}  # OPEN and CLOSING channels
        self._open_channels = 0  # how many of them are OPEN (bounded by channel_max)
        # the user's channels on this node, once logged in (user limits: max-channels);
        # counts this connection's OPEN channels with the user's others
        self.quota: ChannelQuota | None = None
        self.client_properties: dict = {}
        self.capabilities: dict = {}
        self.mechanism = ""
        self.blocked = False  # connection.blocked is in force (RabbitMQ's extension)
        self.last_received = now
        self.last_sent = now
        self._now = now  # the latest time given: the close-ok timeout starts from it
        self.close_reason = ""
        self._close_deadline = 0.0
        # once CLOSED: seconds the shell keeps the socket open (reading nothing)
        # before closing it (SILENT_CLOSE_DELAY after an early refusal)
        self.linger = 0.0
        # until open-ok: a client still handshaking at this time is dropped (0: never)
        self._handshake_deadline = now + handshake_timeout if handshake_timeout else 0.0
        # once CLOSED by handshake_timeout: what rabbit_reader waited for ("handshake":
        # the protocol header, "frame_header": a frame); the socket closes at once
        self.handshake_timed_out = ""

    # ------------------------------------------------------------ bytes

    def write(self, data: bytes) -> None:
        self.outbound.append(data)

    def data_to_send(self) -> bytes:
        return b"".join(self.chunks_to_send())

    def chunks_to_send(self) -> list:
        """What `data_to_send` joins, not joined: for a transport that writes a list
        as it is (writelines), so a delivery's body is not copied on the way out.
        The caller may keep the buffers until the socket takes them, so each is
        bytes or a view of bytes; a view of anything else is copied here."""
        if self.urgent:
            self.outbound[:0] = self.urgent
            self.urgent.clear()
        if not self.outbound:
            return []
        chunks = self.outbound[:]
        self.outbound.clear()
        for position, chunk in enumerate(chunks):
            if type(chunk) is not bytes and not (type(chunk) is memoryview
                                                 and type(chunk.obj) is bytes):
                chunks[position] = bytes(chunk)
        return chunks

    def urgent_to_send(self) -> bytes:
        """The urgent frames alone. They are whole frames, so they may go out
        between any others. Nothing once the connection is closing."""
        if not self.urgent or self.state in _ENDING:
            return b""
        data = b"".join(self.urgent)
        self.urgent.clear()
        return data

    def receive_data(self, data: bytes, now: float) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        self.last_received = now
        self._now = max(self._now, now)
        self.reader.feed(data)

    def sent(self, now: float) -> None:
        """The shell wrote what `data_to_send` returned (heartbeats count from it)."""
        self.last_sent = now
        self._now = max(self._now, now)

    # ------------------------------------------------------------ events

    def next_event(self) -> Event | None:
        """The next event, or None until more bytes arrive (or after ConnectionClosed)."""
        events = self._events
        next_frame = self.reader.next_frame
        channels = self.channels
        while not events:
            state = self.state
            if state is not _OPEN:
                if state is _CLOSED:
                    return None
                if state is ConnectionState.AUTHENTICATING or state is ConnectionState.OPENING:
                    raise RuntimeError(f"next_event() while {state}: answer the last event "
                                       "first")
                if state is ConnectionState.AWAITING_HEADER:
                    if not self._protocol_header():
                        return None
                    continue
            try:
                found = next_frame()
            except AMQPError as error:  # framing error: the stream cannot be trusted
                if state in _EARLY:  # before tune-ok: rabbit_reader drops the socket
                    self.linger = SILENT_CLOSE_DELAY  # unanswered, after its delay
                    self._terminate(error.reply_text)
                    continue
                self.fail(error)
                if self.state is not ConnectionState.CLOSED:
                    # RabbitMQ (fatal_frame_error): the close is sent, then the socket dropped
                    self._terminate(error.reply_text)
                continue
            if found is None:
                return None
            frame_type, number, payload = found
            try:
                if number and state is _OPEN and 0 < frame_type < 4:
                    # an OPEN channel's frame: its DISPATCH entry, else the general path
                    # (twin of _channel_frame's OPEN case: keep in step)
                    channel = channels.get(number)
                    step = None
                    if channel is not None and channel.state is _CHANNEL_OPEN:
                        if frame_type != _METHOD:
                            step = _DISPATCH[channel.content].get(frame_type)
                        elif len(payload) >= 4:
                            key = _method_index(payload)[0]
                            step = _DISPATCH[channel.content].get(key)
                    if step is None:
                        event = self._channel_frame(frame_type, number, payload)
                    else:
                        kind = step[0]
                        if kind is _KIND_BODY:
                            channel.content = step[1]
                            event = channel.body(payload)
                        elif kind is _KIND_METHOD:
                            event = MethodReceived(number, decode_method(payload)[2],
                                                   key >> 16, key & 0xFFFF)
                        elif kind is _KIND_HEADER:
                            channel.content = step[1]
                            event = channel.header(payload, self.max_message_size)
                        else:  # basic.publish: decoded before the content state moves
                            channel.begin(decode_publish(payload))
                            channel.content = step[1]
                            continue
                else:
                    event = self._frame(frame_type, number, payload)
            except AMQPError as error:
                self.fail(error, number)
                continue
            if event is not None:
                return event
        return events.popleft()

    def next_content(self, number: int) -> ContentReceived | None:
        """The next event when it is a whole message on channel `number`. That is a
        basic.publish, its header and body frames, already received, read without
        error. A run of publishes the node takes together. Else None, and nothing is
        read. The next `next_event` reads those frames, errors included, in their
        order."""
        channel = self.channels.get(number)
        if (self._events or self.state is not _OPEN or channel is None
                or channel.state is not _CHANNEL_OPEN or channel.content is not _IDLE):
            return None
        reader = self.reader
        start = reader.position
        try:
            event = self._whole_content(channel)
        except AMQPError:
            event = None
        if event is None:
            reader.rewind(start)
            channel.reset()
        return event

    def _whole_content(self, channel: ChannelMachine) -> ContentReceived | None:
        """`next_content`'s reading: the frames of one message on `channel`. They
        come in the order CONTENT allows (method, header, bodies). None at the
        first other."""
        next_frame, number = self.reader.next_frame, channel.number
        found = next_frame()
        if (found is None or found[0] != _METHOD or found[1] != number
                or len(found[2]) < 4 or _method_index(found[2])[0] != _PUBLISH_INDEX):
            return None
        channel.begin(decode_publish(found[2]))
        found = next_frame()
        if found is None or found[0] != _HEADER or found[1] != number:
            return None
        event = channel.header(found[2], self.max_message_size)
        while event is None:
            found = next_frame()
            if found is None or found[0] != _BODY or found[1] != number:
                return None
            event = channel.body(found[2])
        return event

    def _protocol_header(self) -> bool:
        header = self.reader.take_protocol_header()
        if header is None:
            return False
        if header != spec.PROTOCOL_HEADER:  # spec 4.2.2: answer with ours, then close
            self.write(spec.PROTOCOL_HEADER)
            self._terminate(f"unsupported protocol header {header!r}")
            return True
        self.urgent.append(codec.connection_start(self.server_properties, MECHANISMS, LOCALES))
        self.state = ConnectionState.AWAITING_START_OK
        return True

    def _frame(self, frame_type: int, number: int, payload: bytes) -> Event | None:
        if self.state is ConnectionState.CLOSING:
            return self._frame_while_closing(frame_type, number, payload)
        if self.state is ConnectionState.CLOSE_REQUESTED:
            return None  # the client closed: it sends nothing more that counts
        if frame_type not in _FRAME_TYPES:
            raise codec.bad_frame(frame_type, payload, "unknown_frame")
        if frame_type == spec.FRAME_HEARTBEAT:
            if number != 0:
                raise AMQPError(spec.UNEXPECTED_FRAME, codec.frame_snippet(frame_type, payload))
            return None
        if frame_type != spec.FRAME_METHOD or (
                number != 0 and self.state is ConnectionState.AWAITING_OPEN):
            # (rabbit_reader, once tuned: any frame off channel 0 before open-ok)
            raise AMQPError(spec.UNEXPECTED_FRAME, codec.frame_snippet(frame_type, payload))
        class_id, method_id, method = codec.decode_method(payload)
        if number != 0:
            raise AMQPError(spec.COMMAND_INVALID, "expected connection method on channel 0 "
                            f"during handshake, got channel {number}", class_id, method_id)
        expected = HANDSHAKE.get(self.state)
        if expected is None:
            return self._connection_method(method, class_id, method_id)
        accepted, after = expected
        if type(method) is not accepted:
            if type(method) is _Methods.Close:
                self.write(codec.connection_close_ok())
                self._terminate("client closed during handshake")
                return None
            if self.state is ConnectionState.AWAITING_OPEN:  # tuned: as rabbit_reader
                raise _unexpected_method("opening", class_id, method_id)
            raise AMQPError(spec.COMMAND_INVALID,
                            f"expected '{spec.method_name(*_ids(accepted))}', got "
                            f"'{spec.method_name(class_id, method_id)}'", class_id, method_id)
        self.state = after
        if after is ConnectionState.AUTHENTICATING:
            return self._start_ok(method)
        if after is ConnectionState.AWAITING_OPEN:
            self._tune_ok(method)
            return None
        return VhostRequested(method.virtual_host or "/")

    def _frame_while_closing(self, frame_type: int, number: int, payload: bytes) -> None:
        if frame_type == spec.FRAME_METHOD and number == 0:
            class_id, method_id, _ = codec.decode_method(payload)
            if (class_id, method_id) in (spec.CONNECTION_CLOSE_OK, spec.CONNECTION_CLOSE):
                if (class_id, method_id) == spec.CONNECTION_CLOSE:
                    self.write(codec.connection_close_ok())
                self._terminate(self.close_reason or "closed")
        return None

    def _connection_method(self, method, class_id: int,
                           method_id: int) -> ConnectionCloseRequested | None:
        """A method on channel 0 of an OPEN connection."""
        kind = type(method)
        if kind is _Methods.Close:
            self.state = ConnectionState.CLOSE_REQUESTED
            return ConnectionCloseRequested()
        elif kind is _Methods.CloseOk:
            self._terminate("closed")
        elif kind is _Methods.UpdateSecret:
            self.write(codec.method(0, 10, 71))
        elif kind is not _Methods.Blocked and kind is not _Methods.Unblocked:
            # (clients may echo blocked/unblocked: nothing to do)
            raise _unexpected_method("running", class_id, method_id)
        return None

    def _channel_frame(self, frame_type: int, number: int, payload: bytes) -> Event | None:
        """A method, header or body frame on channel `number` of an OPEN connection."""
        # (the per-frame path: inlined table lookups, no helper calls)
        channel = self.channels.get(number)
        state = channel.state if channel is not None else None
        method = None
        if frame_type == _METHOD:
            class_id, method_id, method = codec.decode_method(payload)
            kind = METHOD_KINDS.get(type(method))
            if kind is None:
                kind = _KIND_CONNECTION_METHOD if class_id == spec.CONNECTION else _KIND_METHOD
        elif state is _CHANNEL_CLOSING or state is _CHANNEL_CLOSE_REQUESTED:
            return None  # content of a closing channel is discarded undecoded
        else:
            kind = _KIND_HEADER if frame_type == _HEADER else _KIND_BODY
            class_id = method_id = 0
        if state is _CHANNEL_OPEN:
            content = CONTENT[channel.content].get(kind)
            if content is None:
                raise content_error(channel.content)
            channel.content = content
        after = LIFECYCLE[state].get(kind, _NO_TRANSITION)
        if after is _NO_TRANSITION:
            raise lifecycle_error(state, kind, number, class_id, method_id)
        if state is _CHANNEL_OPEN:
            if kind is _KIND_METHOD:
                return MethodReceived(number, method, class_id, method_id)
            if kind is _KIND_BODY:
                return channel.body(payload)
            if kind is _KIND_HEADER:
                return channel.header(payload, self.max_message_size)
            if kind is _KIND_PUBLISH:
                channel.begin(method)
                return None
            # channel.close from the client: close-ok once the node has done what
            # came before it on the channel (`channel_closed`)
            channel.state = _CHANNEL_CLOSE_REQUESTED
            self._channel_ended()
            return ChannelCloseRequested(number)
        if state is None:  # channel.open
            if self.channel_max and self._open_channels >= self.channel_max:
                raise AMQPError(spec.NOT_ALLOWED, "number of channels opened "
                                f"({self._open_channels}) has reached the negotiated "
                                f"channel_max ({self.channel_max})")
            quota = self.quota
            if quota is not None:
                refusal = quota.refusal()
                if refusal is not None:
                    raise refusal
                quota.open += 1
            self.channels[number] = ChannelMachine(number)
            self._open_channels += 1
            self.write(codec.channel_open_ok(number))
            return ChannelOpened(number)
        if kind is Frame.CLOSE and state is _CHANNEL_CLOSING:  # closes crossed
            self.write(codec.channel_close_ok(number))
        elif after is None:  # the client's close-ok ends a closing channel
            del self.channels[number]
        return None

    # ------------------------------------------------------------ the handshake

    def _start_ok(self, start_ok) -> LoginRequested:
        self.client_properties = start_ok.client_properties or {}
        capabilities = self.client_properties.get("capabilities") or {}
        self.capabilities = capabilities if isinstance(capabilities, dict) else {}
        mechanism = start_ok.mechanism
        response = start_ok.response
        if isinstance(response, str):
            response = response.encode("utf-8", "surrogateescape")
        if mechanism not in MECHANISMS.split():  # RabbitMQ: not a login failure
            raise AMQPError(spec.COMMAND_INVALID,
                            f"unknown authentication mechanism '{mechanism}'", 10, 11)
        self.mechanism = mechanism
        return LoginRequested(mechanism, response)

    def accept_login(self) -> None:
        """The answer to LoginRequested: the user may log in; connection.tune follows."""
        self._expect(ConnectionState.AUTHENTICATING)
        self.urgent.append(codec.connection_tune(*self.server_limits))
        self.state = ConnectionState.AWAITING_TUNE_OK

    def refuse_login(self) -> None:
        """The answer to LoginRequested: wrong credentials. 403 for clients that
        advertise authentication_failure_close, a silent close for the others."""
        self._expect(ConnectionState.AUTHENTICATING)
        text = (f"ACCESS_REFUSED - Login was refused using authentication mechanism "
                f"{self.mechanism}. For details see the broker logfile.")
        if self.capabilities.get("authentication_failure_close"):
            self.write(codec.connection_close(spec.ACCESS_REFUSED, text, 10, 11))
        self.linger = SILENT_CLOSE_DELAY
        self._terminate(text)

    def refuse_response(self, reason: str) -> None:
        """The answer to LoginRequested: a response that cannot be read. That is a
        malformed PLAIN or AMQPLAIN response, or a foreign authorization identity.
        This is RabbitMQ's syntax_error in the starting state. No connection.close,
        even for clients that ask for one. The socket stays open, unread,
        SILENT_CLOSE_DELAY first."""
        self._expect(ConnectionState.AUTHENTICATING)
        self.linger = SILENT_CLOSE_DELAY
        self._terminate(f"SYNTAX_ERROR - {reason}")

    def _tune_ok(self, tune_ok) -> None:
        server_channel_max, server_frame_max, _heartbeat = self.server_limits
        frame_max = tune_ok.frame_max or server_frame_max
        channel_max = tune_ok.channel_max or server_channel_max
        if frame_max < spec.FRAME_MIN_SIZE:
            raise AMQPError(spec.NOT_ALLOWED, f"frame_max={frame_max} < "
                            f"{spec.FRAME_MIN_SIZE} min size", 10, 31)
        if frame_max > server_frame_max:
            raise AMQPError(spec.NOT_ALLOWED, f"frame_max={frame_max} > "
                            f"{server_frame_max} max size", 10, 31)
        if channel_max > server_channel_max:
            raise AMQPError(spec.NOT_ALLOWED, f"channel_max={channel_max} > "
                            f"{server_channel_max} max", 10, 31)
        self.frame_max = frame_max
        self.reader.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = tune_ok.heartbeat

    def accept_open(self) -> None:
        """The answer to VhostRequested: the vhost may be used; open-ok follows.
        (A refusal is `fail(error)`: during the handshake it closes the
        connection.)"""
        self._expect(ConnectionState.OPENING)
        self.urgent.append(codec.connection_open_ok())
        self.state = ConnectionState.OPEN

    # ------------------------------------------------------------ handover (workers)

    def mark(self) -> None:
        """Keep the input from here on, to be read again (`rewind_to_mark`), if its
        next event can be: no event is queued and no channel is inside a message.
        Else no mark."""
        rewindable = not self._events and all(
            machine.content is _IDLE for machine in self.channels.values())
        self.reader.mark = self.reader.position if rewindable else None

    def unmark(self) -> None:
        self.reader.mark = None

    def rewind_to_mark(self) -> bool:
        """Read again from the mark, every channel between messages as it was there;
        False if there is no mark."""
        mark = self.reader.mark
        if mark is None:
            return False
        self.reader.rewind(mark)
        self.reader.mark = None
        for machine in self.channels.values():
            machine.reset()
        return True

    def unread(self) -> bytes:
        """The bytes received and not read into frames yet (a handover takes them)."""
        return self.reader.unread()

    def resume_open(self, *, frame_max: int, channel_max: int, heartbeat: int,
                    client_properties: dict, capabilities: dict, mechanism: str,
                    channels: list[int], quota: ChannelQuota, unread: bytes) -> None:
        """A connection another worker of this node negotiated, adopted OPEN
        (node/handover.py): its tune values, the client's properties, its open
        channels (counted against `quota`), and the bytes it received and did not
        read, read next. Only before anything was received."""
        self._expect(ConnectionState.AWAITING_HEADER)
        self.frame_max = self.reader.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = heartbeat
        self.client_properties = client_properties
        self.capabilities = capabilities
        self.mechanism = mechanism
        self.quota = quota
        for number in channels:
            self.channels[number] = ChannelMachine(number)
        self._open_channels = len(channels)
        quota.open += len(channels)
        self._handshake_deadline = 0.0
        self.state = ConnectionState.OPEN
        self.reader.feed(unread)

    def handed_over(self) -> None:
        """The connection went to another worker (node/handover.py): it ends here
        without a frame or an event; its channels no longer count here."""
        if self.quota is not None:
            self.quota.open -= self._open_channels
        self.channels.clear()
        self._open_channels = 0
        self._events.clear()
        self.outbound.clear()
        self.urgent.clear()
        self.state = ConnectionState.CLOSED
        self.close_reason = "handed over to another worker"

    def _expect(self, state: ConnectionState) -> None:
        if self.state is not state:
            raise RuntimeError(f"connection is {self.state}, not {state}")

    # ------------------------------------------------------------ time

    def tick(self, now: float) -> None:
        """Heartbeats, the close-ok timeout and handshake_timeout.

        Heartbeats, spec 4.2.7: one goes out after half the interval without
        sending. None received for two intervals is a dead peer. The handshake
        timeout, as rabbit_reader's: a client not open by then is dropped without a
        word. That holds whatever step it stopped at."""
        state = self.state
        if state is ConnectionState.CLOSED:
            return
        self._now = max(self._now, now)
        if state in _HANDSHAKING and self._handshake_deadline and now >= self._handshake_deadline:
            self.handshake_timed_out = ("handshake" if state is ConnectionState.AWAITING_HEADER
                                        else "frame_header")
            self.outbound.clear()
            self.urgent.clear()
            self._terminate(f"{{handshake_timeout,{self.handshake_timed_out}}}")
            return
        if state is ConnectionState.CLOSING and now >= self._close_deadline:
            self._terminate("client did not answer connection.close")
            return
        if self.heartbeat and (state is ConnectionState.OPEN
                               or state is ConnectionState.CLOSING
                               or state is ConnectionState.CLOSE_REQUESTED):
            # RabbitMQ does not time out a connection it stopped reading from
            if now - self.last_received > 2 * self.heartbeat and not self.blocked:
                self._terminate(f"missed heartbeats from client, timeout: {self.heartbeat}s")
                return
            if now - self.last_sent >= self.heartbeat / 2 and not self.urgent:
                self.urgent.append(codec.HEARTBEAT_FRAME)

    # ------------------------------------------------------------ errors and closing

    def close_accepted(self) -> None:
        """The node has done what the channels received before the client's
        connection.close (ConnectionCloseRequested): close-ok, and the end."""
        if self.state is ConnectionState.CLOSE_REQUESTED:
            self.write(codec.connection_close_ok())
            self._terminate("client closed the connection")

    def channel_closed(self, number: int) -> None:
        """The node has ended channel `number` the client asked to close
        (ChannelCloseRequested). Close-ok goes out and the number is free again. This
        holds while the client's connection.close waits too: RabbitMQ's channel
        answers before its reader does. Nothing when the channel or the connection
        is gone."""
        machine = self.channels.get(number)
        if (machine is None or machine.state is not _CHANNEL_CLOSE_REQUESTED
                or (self.state is not _OPEN
                    and self.state is not ConnectionState.CLOSE_REQUESTED)):
            return
        del self.channels[number]
        self.write(codec.channel_close_ok(number))

    def fail(self, error: AMQPError, channel: int = 0) -> None:
        """Report `error` for `channel`.

        A soft error on an open channel of an open connection: channel.close. Else
        connection.close, and during the handshake the end of the connection.
        Nothing once connection.close is out. A channel whose close the client
        requested may fail too: a method it sent before the close failed. Then
        channel.close goes out, then the close-ok the client waits for. RabbitMQ's
        closing channel answers a client's close the same way. The client's close-ok
        ends it."""
        state = self.state
        if (state is ConnectionState.CLOSED or state is ConnectionState.CLOSING
                or state is ConnectionState.CLOSE_REQUESTED):
            # connection.close was sent: discard everything else (spec 1.4.2.9); or
            # received: the client is leaving, its channels end with the connection
            return
        machine = self.channels.get(channel)
        if (not error.connection_level and machine is not None
                and machine.state is _CHANNEL_CLOSE_REQUESTED and state is ConnectionState.OPEN):
            machine.state = ChannelState.CLOSING
            self.write(codec.channel_close(channel, error.code, error.reply_text,
                                           error.class_id, error.method_id))
            self.write(codec.channel_close_ok(channel))
            self._events.append(ChannelClosed(channel))
            return
        if (not error.connection_level and machine is not None
                and machine.state is ChannelState.OPEN and state is ConnectionState.OPEN):
            machine.state = ChannelState.CLOSING
            self._channel_ended()
            self.write(codec.channel_close(channel, error.code, error.reply_text,
                                           error.class_id, error.method_id))
            self._events.append(ChannelClosed(channel))
            return
        self.write(codec.connection_close(error.code, error.reply_text, error.class_id,
                                          error.method_id))
        if state in _EARLY:
            self.linger = SILENT_CLOSE_DELAY
        if state is not ConnectionState.OPEN:
            self._terminate(error.reply_text)
            return
        self._release_channels()
        self.state = ConnectionState.CLOSING
        self.close_reason = error.reply_text
        self._close_deadline = self._now + CLOSE_OK_TIMEOUT

    def server_close(self, code: int, detail: str, now: float) -> None:
        """The broker ends the connection (shutdown, a deleted user or vhost):
        connection.close when open, else at once."""
        self._now = max(self._now, now)
        if self.state is ConnectionState.CLOSED:
            return
        if self.state is not ConnectionState.OPEN:
            self._terminate(detail)
            return
        self.fail(AMQPError(code, detail, connection_level=True))

    def connection_lost(self) -> None:
        """The socket is gone: end without sending anything."""
        if self.state is not ConnectionState.CLOSED:
            self._terminate("connection lost")
        self.outbound.clear()
        self.urgent.clear()

    def _channel_ended(self) -> None:
        self._open_channels -= 1
        if self.quota is not None:
            self.quota.open -= 1

    def _release_channels(self) -> None:
        for number, machine in self.channels.items():
            if machine.state is _CHANNEL_OPEN or machine.state is _CHANNEL_CLOSE_REQUESTED:
                self._events.append(ChannelClosed(number))
        if self.quota is not None:
            self.quota.open -= self._open_channels
        self.channels.clear()
        self._open_channels = 0

    def _terminate(self, reason: str) -> None:
        self._release_channels()
        self.state = ConnectionState.CLOSED
        self.close_reason = self.close_reason or reason
        self._events.append(ConnectionClosed(self.close_reason))

    # ------------------------------------------------------------ connection.blocked

    def block(self, reason: str) -> None:
        """RabbitMQ's connection.blocked extension: the node stops reading from this
        client; clients that advertised the capability are told why."""
        self.blocked = True
        if self.capabilities.get("connection.blocked"):
            self.urgent.append(codec.connection_blocked(reason))

    def unblock(self) -> None:
        self.blocked = False
        if self.capabilities.get("connection.blocked") and self.state is ConnectionState.OPEN:
            self.urgent.append(codec.connection_unblocked())

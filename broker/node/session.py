"""One client connection as a sans-I/O state machine: bytes in, bytes out.

Responsibilities: the protocol header, the connection handshake (start/start-ok with
PLAIN or AMQPLAIN, tune/tune-ok, open/open-ok), heartbeats, channel lifecycles,
content assembly (method -> header -> body frames), and turning AMQPErrors into
channel.close or connection.close as AMQP prescribes. Channel methods are dispatched
to `handlers`.

States (a missing transition is a protocol error):
    awaiting_header -> awaiting_start_ok -> awaiting_tune_ok -> awaiting_open -> open
    any -> closing (server sent connection.close, waits for close-ok) -> closed
    framing error -> closed (connection.close is sent, but the stream is beyond repair)
Channels: absent -> open (channel.open) -> closing (server sent channel.close) ->
absent (close-ok). While a channel is closing, every frame on it but close/close-ok
is discarded, as the spec requires.

Time enters as `now` arguments (monotonic seconds); the server shell owns sockets.
Invariants: after connection.close is sent, only close/close-ok are processed; a
session is closed once `closed` is True and the shell has sent `data_to_send()`.

Long outputs (a lease range of thousands of messages) are streams: a producer the
session pulls from in `data_to_send`, about STREAM_CHUNK_BYTES a call, while the shell
finds the client keeping up (`streaming` says more is waiting). Everything written
before a stream goes out before it; a stream's own frames keep their order, and a
producer checks its channel is still open before each step.
"""

from __future__ import annotations

import platform
import time
from collections import deque
from collections.abc import Iterator

from .. import __version__
from ..amqp import codec, spec
from ..amqp.errors import AMQPError
from ..auth.users import SaslError, parse_sasl_response
from . import handlers
from .channel import Channel

CAPABILITIES = ("publisher_confirms", "exchange_exchange_bindings", "basic.nack",
                "consumer_cancel_notify", "connection.blocked", "consumer_priorities",
                "authentication_failure_close", "per_consumer_qos", "direct_reply_to")
MECHANISMS = "PLAIN AMQPLAIN"
CLOSE_OK_TIMEOUT = 5.0
# What one `data_to_send` pulls from streams at most (a little more: whole steps).
STREAM_CHUNK_BYTES = 256 * 1024


def server_properties(cluster_name: str) -> dict:
    return {
        "product": "quorumqueue",
        "version": __version__,
        "platform": f"Python {platform.python_version()}",
        "copyright": "quorumqueue authors",
        "information": "Licensed under Apache-2.0; speaks AMQP 0-9-1 like RabbitMQ",
        "cluster_name": cluster_name,
        "capabilities": {name: True for name in CAPABILITIES},
    }


_FRAME_TYPES = (spec.FRAME_METHOD, spec.FRAME_HEADER, spec.FRAME_BODY, spec.FRAME_HEARTBEAT)


def _unexpected_in_content(channel: Channel) -> AMQPError:
    """505 for a frame out of the method -> header -> body order, worded as RabbitMQ's
    rabbit_command_assembler states what it was waiting for."""
    if channel.content_method is None:
        return AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method "
                         "frame instead", connection_level=True)
    expected = ("content header for class 60, got non content header frame"
                if channel.content_properties is None
                else "content body, got non content body frame")
    return AMQPError(spec.UNEXPECTED_FRAME, f"expected {expected} instead",
                     *spec.BASIC_PUBLISH, connection_level=True)


class Session:
    def __init__(self, node, peer_host: str, now: float) -> None:
        settings = node.settings
        self.node = node
        self.settings = settings
        self.peer_host = peer_host
        self.connection_id = node.next_connection_id()
        self.state = "awaiting_header"
        self.reader = codec.FrameReader(settings.frame_max)
        self._out: list[bytes] = []
        self._streams: deque[Iterator[list[bytes]]] = deque()
        self.channels: dict[int, Channel] = {}
        self.closing_channels: set[int] = set()
        self.client_properties: dict = {}
        self.capabilities: dict = {}
        self.user = None
        self.vhost = None
        self.frame_max = settings.frame_max
        self.channel_max = settings.channel_max
        self.heartbeat = 0
        self.last_received = now
        self.last_sent = now
        self.closed = False
        self.close_reason = ""
        self._close_deadline = 0.0
        self.blocked = False       # we sent connection.blocked; shell stops reading
        self.has_published = False
        node.register(self)

    # ------------------------------------------------------------ I/O surface

    def write(self, data: bytes) -> None:
        self._out.append(data)
        self.node.dirty.add(self)

    def write_parts(self, parts: list[bytes]) -> None:
        self._out.extend(parts)
        self.node.dirty.add(self)

    def stream(self, producer: Iterator[list[bytes]]) -> None:
        """Send what `producer` yields (frames, a list per step) after everything
        written so far, pulled by `data_to_send` as the client takes it."""
        self._streams.append(producer)
        self.node.dirty.add(self)

    @property
    def streaming(self) -> bool:
        """A stream has more to send: call `data_to_send` again once the client has
        taken what was sent."""
        return bool(self._streams)

    def data_to_send(self, pull: bool = True) -> bytes:
        """The bytes to send now; with `pull`, up to about STREAM_CHUNK_BYTES more
        from the streams."""
        if pull and self._streams:
            self._pull(STREAM_CHUNK_BYTES)
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        return data

    def _pull(self, budget: int) -> None:
        taken = 0
        while self._streams and taken < budget:
            parts = next(self._streams[0], None)
            if parts is None:
                self._streams.popleft()
                continue
            self._out.extend(parts)
            taken += sum(map(len, parts))

    @property
    def paused(self) -> bool:
        """The shell should stop reading from this client (resource alarm)."""
        return self.blocked

    def receive_data(self, data: bytes, now: float) -> None:
        if self.closed:
            return
        self.last_received = now
        self.reader.feed(data)
        if self.state == "awaiting_header":
            header = self.reader.take_protocol_header()
            if header is None:
                return
            if header != spec.PROTOCOL_HEADER:
                self.write(spec.PROTOCOL_HEADER)
                self._terminate(f"unsupported protocol header {header!r}")
                return
            self.write(codec.connection_start(server_properties(self.settings.cluster_name),
                                              MECHANISMS, "en_US"))
            self.state = "awaiting_start_ok"
        try:
            for frame_type, channel, payload in self.reader.frames():
                if self.closed:
                    return
                try:
                    self._frame(frame_type, channel, payload, now)
                except AMQPError as error:
                    self._fail(error, channel, now)
        except AMQPError as error:  # framing error: the stream cannot be trusted
            self._fail(error, 0, now)
            if not self.closed:  # RabbitMQ (fatal_frame_error): send the close, then drop
                self._terminate(error.reply_text)
            return
        if self.has_published and self.node.alarms and not self.blocked and self.state == "open":
            self._block()

    def tick(self, now: float) -> None:
        """Heartbeats and close-ok timeouts."""
        if self.closed:
            return
        if self.state == "closing" and now >= self._close_deadline:
            self._terminate("client did not answer connection.close")
            return
        if self.heartbeat and self.state in ("open", "closing"):
            if now - self.last_received > 2 * self.heartbeat and not self.blocked:
                self._terminate(f"missed heartbeats from client, timeout: {self.heartbeat}s")
                return
            if now - self.last_sent >= self.heartbeat / 2:
                self.write(codec.HEARTBEAT_FRAME)

    def sent(self, now: float) -> None:
        self.last_sent = now

    def server_close(self, code: int, detail: str, now: float) -> None:
        """The broker closes the connection (e.g. shutdown): 320 CONNECTION_FORCED."""
        if self.closed:
            return
        if self.state != "open":
            self._terminate(detail)
            return
        self._fail(AMQPError(code, detail, connection_level=True), 0, now)

    def connection_lost(self) -> None:
        """The socket is gone: clean up without sending anything."""
        if not self.closed:
            self._terminate("connection lost")
        self._out.clear()
        self._streams.clear()

    # ------------------------------------------------------------ frames

    def _frame(self, frame_type: int, channel_number: int, payload: bytes, now: float) -> None:
        if self.state == "closing":
            if frame_type == spec.FRAME_METHOD and channel_number == 0:
                class_id, method_id, _ = codec.decode_method(payload)
                if (class_id, method_id) in (spec.CONNECTION_CLOSE_OK, spec.CONNECTION_CLOSE):
                    if (class_id, method_id) == spec.CONNECTION_CLOSE:
                        self.write(codec.connection_close_ok())
                    self._terminate(self.close_reason or "closed")
            return
        if frame_type not in _FRAME_TYPES:
            raise codec.bad_frame(frame_type, payload, "unknown_frame")
        if frame_type == spec.FRAME_HEARTBEAT:
            if channel_number != 0:
                raise AMQPError(spec.UNEXPECTED_FRAME, codec.frame_snippet(frame_type, payload))
            return
        if channel_number == 0 or self.state != "open":
            if frame_type != spec.FRAME_METHOD:
                raise AMQPError(spec.UNEXPECTED_FRAME, codec.frame_snippet(frame_type, payload))
            class_id, method_id, args = codec.decode_method(payload)
            if channel_number != 0:
                raise AMQPError(spec.COMMAND_INVALID, "expected connection method on "
                                f"channel 0 during handshake, got channel {channel_number}",
                                class_id, method_id)
            self._connection_method(class_id, method_id, args, now)
            return
        if channel_number in self.closing_channels:
            self._closing_channel_frame(frame_type, channel_number, payload)
            return
        channel = self.channels.get(channel_number)
        if frame_type == spec.FRAME_METHOD:
            class_id, method_id, args = codec.decode_method(payload)
            if channel is None:
                if (class_id, method_id) != spec.CHANNEL_OPEN:
                    raise AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'",
                                    class_id, method_id)
                if channel_number > self.channel_max:
                    raise AMQPError(spec.CHANNEL_ERROR, f"channel number {channel_number} "
                                    f"exceeds negotiated channel_max {self.channel_max}",
                                    class_id, method_id, connection_level=True)
                self.channels[channel_number] = Channel(self, channel_number)
                self.write(codec.channel_open_ok(channel_number))
                return
            if channel.content_method is not None:
                raise _unexpected_in_content(channel)
            try:
                handlers.dispatch(self, channel, class_id, method_id, args)
            except AMQPError as error:
                raise error.at(class_id, method_id)
            return
        if channel is None:
            raise AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'")
        if frame_type == spec.FRAME_HEADER:
            self._content_header(channel, payload)
        else:
            self._content_body(channel, payload)

    def _content_header(self, channel: Channel, payload: bytes) -> None:
        if channel.content_method is None or channel.content_properties is not None:
            raise _unexpected_in_content(channel)
        class_id, properties = codec.decode_properties(payload)
        if class_id != spec.BASIC:
            raise AMQPError(spec.UNEXPECTED_FRAME, "expected content header for class 60, "
                            f"got one for class {class_id} instead", *spec.BASIC_PUBLISH,
                            connection_level=True)
        if properties.body_size > self.settings.max_message_size:
            channel.content_method = None
            raise AMQPError(spec.PRECONDITION_FAILED,
                            f"message size {properties.body_size} is larger than configured "
                            f"max size {self.settings.max_message_size}", 60, 40)
        channel.content_properties = properties
        channel.content_parts = []
        channel.content_received = 0
        if properties.body_size == 0:
            self._content_complete(channel)

    def _content_body(self, channel: Channel, payload: bytes) -> None:
        if channel.content_properties is None:
            raise _unexpected_in_content(channel)
        expected = channel.content_properties.body_size
        if channel.content_received + len(payload) > expected:  # as RabbitMQ 4.x
            raise AMQPError(spec.FRAME_ERROR, "content body frame exceeds remaining "
                            "content size", *spec.BASIC_PUBLISH)
        channel.content_parts.append(payload)
        channel.content_received += len(payload)
        if channel.content_received == expected:
            self._content_complete(channel)

    def _content_complete(self, channel: Channel) -> None:
        publish, properties = channel.content_method, channel.content_properties
        parts = channel.content_parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        channel.content_method = channel.content_properties = None
        channel.content_parts = []
        self.has_published = True
        try:
            handlers.publish(self, channel, publish, properties, body)
        except AMQPError as error:  # routing and property checks fail basic.publish
            raise error.at(*spec.BASIC_PUBLISH)

    def _closing_channel_frame(self, frame_type: int, number: int, payload: bytes) -> None:
        if frame_type != spec.FRAME_METHOD:
            return
        class_id, method_id, _ = codec.decode_method(payload)
        if (class_id, method_id) == spec.CHANNEL_CLOSE_OK:
            self.closing_channels.discard(number)
        elif (class_id, method_id) == spec.CHANNEL_CLOSE:
            self.write(codec.channel_close_ok(number))
            self.closing_channels.discard(number)

    # ------------------------------------------------------------ connection methods

    def _connection_method(self, class_id: int, method_id: int, args, now: float) -> None:
        ids = (class_id, method_id)
        expected = {"awaiting_start_ok": spec.CONNECTION_START_OK,
                    "awaiting_tune_ok": spec.CONNECTION_TUNE_OK,
                    "awaiting_open": spec.CONNECTION_OPEN}.get(self.state)
        if expected is not None and ids != expected:
            if ids == spec.CONNECTION_CLOSE:
                self.write(codec.connection_close_ok())
                self._terminate("client closed during handshake")
                return
            raise AMQPError(spec.COMMAND_INVALID,
                            f"expected '{spec.method_name(*expected)}', got "
                            f"'{spec.method_name(class_id, method_id)}'", class_id, method_id)
        if ids == spec.CONNECTION_START_OK:
            self._start_ok(args)
        elif ids == spec.CONNECTION_TUNE_OK:
            self._tune_ok(args)
        elif ids == spec.CONNECTION_OPEN:
            self._open(args)
        elif ids == spec.CONNECTION_CLOSE:
            self.write(codec.connection_close_ok())
            self._terminate("client closed the connection")
        elif ids == spec.CONNECTION_CLOSE_OK:
            self._terminate("closed")
        elif ids == spec.CONNECTION_UPDATE_SECRET:
            self.write(codec.method(0, 10, 71))
        elif ids in (spec.CONNECTION_BLOCKED, spec.CONNECTION_UNBLOCKED):
            return  # clients may echo these; nothing to do
        else:
            raise AMQPError(spec.COMMAND_INVALID,
                            f"unexpected method '{spec.method_name(class_id, method_id)}' "
                            "on channel 0", class_id, method_id)

    def _start_ok(self, args) -> None:
        self.client_properties = args.client_properties or {}
        capabilities = self.client_properties.get("capabilities") or {}
        self.capabilities = capabilities if isinstance(capabilities, dict) else {}
        mechanism = args.mechanism
        response = args.response
        if isinstance(response, str):
            response = response.encode("utf-8", "surrogateescape")
        if mechanism not in MECHANISMS.split():  # RabbitMQ: not a login failure
            raise AMQPError(spec.COMMAND_INVALID,
                            f"unknown authentication mechanism '{mechanism}'", 10, 11)
        try:
            username, password = parse_sasl_response(mechanism, response)
            user = self.node.authenticate(username, password, self.peer_host)
        except SaslError:
            user = None
        if user is None:
            text = (f"ACCESS_REFUSED - Login was refused using authentication mechanism "
                    f"{mechanism}. For details see the broker logfile.")
            if self.capabilities.get("authentication_failure_close"):
                self.write(codec.connection_close(spec.ACCESS_REFUSED, text, 10, 11))
            self._terminate(text)
            return
        self.user = user
        self.write(codec.connection_tune(self.settings.channel_max, self.settings.frame_max,
                                         self.settings.heartbeat))
        self.state = "awaiting_tune_ok"

    def _tune_ok(self, args) -> None:
        frame_max = args.frame_max or self.settings.frame_max
        channel_max = args.channel_max or self.settings.channel_max
        if frame_max < spec.FRAME_MIN_SIZE:
            raise AMQPError(spec.NOT_ALLOWED, f"frame_max={frame_max} < "
                            f"{spec.FRAME_MIN_SIZE} min size", 10, 31)
        if frame_max > self.settings.frame_max:
            raise AMQPError(spec.NOT_ALLOWED, f"frame_max={frame_max} > "
                            f"{self.settings.frame_max} max size", 10, 31)
        if channel_max > self.settings.channel_max:
            raise AMQPError(spec.NOT_ALLOWED, f"channel_max={channel_max} > "
                            f"{self.settings.channel_max} max", 10, 31)
        self.frame_max = frame_max
        self.reader.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = args.heartbeat
        self.state = "awaiting_open"

    def _open(self, args) -> None:
        name = args.virtual_host or "/"
        vhost = self.node.vhost(name)
        if vhost is None:
            raise AMQPError(spec.NOT_ALLOWED, f"vhost {name} not found", 10, 40)
        if name not in self.user.vhosts:
            raise AMQPError(spec.NOT_ALLOWED, f"access to vhost '{name}' refused for user "
                            f"'{self.user.name}'", 10, 40)
        self.vhost = vhost
        self.write(codec.connection_open_ok())
        self.state = "open"
        if self.node.alarms and self.capabilities.get("connection.blocked"):
            pass  # blocked only once it publishes, as RabbitMQ does

    # ------------------------------------------------------------ errors and closing

    def close_channel(self, channel: Channel, error: AMQPError) -> None:
        self.channels.pop(channel.number, None)
        channel.state = "closing"
        channel.close()
        self.closing_channels.add(channel.number)
        self.write(codec.channel_close(channel.number, error.code, error.reply_text,
                                       error.class_id, error.method_id))

    def fail_later(self, error: AMQPError, channel: Channel) -> None:
        """A method's error known only once a log entry is applied (cluster metadata):
        closes the channel (or the connection) as if the method had failed at once."""
        self._fail(error, channel.number, time.monotonic())

    def _fail(self, error: AMQPError, channel_number: int, now: float) -> None:
        if self.closed or self.state == "closing":
            return  # connection.close was sent: discard everything else (spec 1.4.2.9)
        channel = self.channels.get(channel_number)
        if not error.connection_level and channel is not None and self.state == "open":
            self.close_channel(channel, error)
            return
        if self.state != "open":
            # handshake errors: RabbitMQ sends connection.close and drops the socket
            self.write(codec.connection_close(error.code, error.reply_text,
                                              error.class_id, error.method_id))
            self._terminate(error.reply_text)
            return
        self.write(codec.connection_close(error.code, error.reply_text, error.class_id,
                                          error.method_id))
        self._release_channels()
        self.state = "closing"
        self.close_reason = error.reply_text
        self._close_deadline = now + CLOSE_OK_TIMEOUT

    def _release_channels(self) -> None:
        for channel in list(self.channels.values()):
            channel.state = "closing"
            channel.close()
        self.channels.clear()

    def _terminate(self, reason: str) -> None:
        self._release_channels()
        self._streams.clear()
        self.closed = True
        self.state = "closed"
        self.close_reason = self.close_reason or reason
        self.node.unregister(self)

    # ------------------------------------------------------------ alarms

    def _block(self) -> None:
        self.blocked = True
        if self.capabilities.get("connection.blocked"):
            self.write(codec.connection_blocked(self.node.blocked_reason or "resource alarm"))

    def alarms_changed(self) -> None:
        if self.node.alarms:
            if self.has_published and not self.blocked and self.state == "open":
                self._block()
        elif self.blocked:
            self.blocked = False
            if self.capabilities.get("connection.blocked") and self.state == "open":
                self.write(codec.connection_unblocked())

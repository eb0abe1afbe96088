"""A blocking AMQP 0-9-1 probe client that records what a server says back.

Responsibilities
    Speak just enough AMQP 0-9-1 over a plain socket (frames marshalled by pamqp)
    to drive one scenario, and keep a JSON-able transcript of every reply, close,
    delivery, return and confirm the server sends, so that the transcripts of
    RabbitMQ and quorumqueue can be compared for equality.

How it works
    - `call()` sends a method; for a synchronous method it reads until the reply on
      that channel, a channel.close on it, a connection.close or end of stream,
      and records that outcome. Frames read meanwhile that are not the answer
      (deliveries, returns, confirms, closes of other channels) wait in `pending`.
    - `collect()` records pending asynchronous events until a count is reached
      (or a short timeout passes): deliveries carry their body and redelivered
      flag, publisher confirms are expanded to one event per sequence number, so
      the two brokers' different batching of `multiple` acks compares equal, and a
      run of confirms is recorded in sequence order: RabbitMQ may confirm an
      unroutable message before a routed one published earlier (seen under load).
    - `barrier()` is a cheap synchronous round trip on a channel (passive declare
      of amq.direct): channel errors caused by earlier asynchronous methods arrive
      before its answer, in both brokers.
    - A server channel.close is answered with close-ok, a connection.close with
      connection.close-ok, as a client library would; `open_channels` follows.
    - Integers in field tables go on the wire as pika, the Java and the .NET
      clients send them: signed 32-bit ('I'), or signed 64-bit ('l') when larger.
      pamqp's own choice, the smallest type (RabbitMQ then names it 'byte' or
      'short' in inequivalence texts), is `integer_encoding = "smallest"`.
    - Timestamps (field type 'T', the timestamp property) are read and written as
      the 64-bit integers on the wire, as the Go and Java clients hold them
      (`AMQPTimestamp`, recorded as {"timestamp": seconds}), not as pamqp's
      datetime, which ends at the year 9999 and takes values above 2**32 for
      milliseconds. A datetime given to pamqp is still written as its seconds.
    - Server-generated names (amq.gen-*, amq.ctag-*, direct reply-to names) are
      normalized in everything recorded.

Not here: what a scenario does or what counts as a deliberate difference (the test
module), reconnection, TLS, heartbeats sent by the probe.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import time
from typing import Any, Iterator
from urllib.parse import unquote, urlparse

from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE
CLIENT_CAPABILITIES = {"authentication_failure_close": True, "basic.nack": True,
                       "connection.blocked": True, "consumer_cancel_notify": True,
                       "publisher_confirms": True}
CONTENT_METHODS = ("Basic.Deliver", "Basic.GetOk", "Basic.Return")
_GENERATED = ((re.compile(r"amq\.gen-[A-Za-z0-9_\-]+"), "amq.gen-*"),
              (re.compile(r"amq\.ctag-[A-Za-z0-9_\-]+"), "amq.ctag-*"),
              (re.compile(r"amq\.rabbitmq\.reply-to\.[A-Za-z0-9_\-.=+/]+"),
               "amq.rabbitmq.reply-to.*"))


class AMQPTimestamp(int):
    """A timestamp field value or property: seconds since the epoch, as sent."""

    __slots__ = ()


def normalize(value: Any) -> Any:
    """JSON-able copy of `value` with server-generated names replaced by patterns."""
    if isinstance(value, AMQPTimestamp):
        return {"timestamp": int(value)}
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    if isinstance(value, str):
        for pattern, replacement in _GENERATED:
            value = pattern.sub(replacement, value)
        return value
    if isinstance(value, dict):
        return {str(key): normalize(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalize(item) for item in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def _integer_as_clients_send_it(value: int) -> bytes:
    if -2 ** 31 <= value < 2 ** 31:
        return b"I" + struct.pack(">i", value)
    return b"l" + struct.pack(">q", value)


@contextlib.contextmanager
def _client_integer_encoding() -> Iterator[None]:
    original = pamqp_encode.table_integer
    pamqp_encode.table_integer = _integer_as_clients_send_it
    try:
        yield
    finally:
        pamqp_encode.table_integer = original


_U64 = struct.Struct(">Q")


def _decode_timestamp(data: bytes) -> tuple[int, AMQPTimestamp]:
    if len(data) < 8:
        raise ValueError("Could not unpack timestamp value")
    return 8, AMQPTimestamp(_U64.unpack_from(data)[0])


@contextlib.contextmanager
def _timestamps_as_integers() -> Iterator[None]:
    """pamqp's codec with 'T' read and written as the 64-bit integer (restored after:
    the tables are pamqp's module state, which other code in this process may use)."""
    saved = (pamqp_decode.TABLE_MAPPING.get(b"T"), pamqp_decode.METHODS.get("timestamp"),
             pamqp_encode.METHODS.get("timestamp"), pamqp_encode.encode_table_value)
    table_value, timestamp = saved[3], saved[2]

    def encode_table_value(value):
        if isinstance(value, AMQPTimestamp):
            return b"T" + _U64.pack(value)
        return table_value(value)

    def encode_timestamp(value):
        if isinstance(value, int):
            return _U64.pack(value)
        return timestamp(value)

    pamqp_decode.TABLE_MAPPING[b"T"] = pamqp_decode.METHODS["timestamp"] = _decode_timestamp
    pamqp_encode.METHODS["timestamp"] = encode_timestamp
    pamqp_encode.encode_table_value = encode_table_value
    try:
        yield
    finally:
        (pamqp_decode.TABLE_MAPPING[b"T"], pamqp_decode.METHODS["timestamp"],
         pamqp_encode.METHODS["timestamp"], pamqp_encode.encode_table_value) = saved


def marshal(value, channel: int) -> bytes:
    """pamqp's frame marshalling, with client-style integer encoding in tables."""
    with _client_integer_encoding(), _timestamps_as_integers():
        return pamqp_frame.marshal(value, channel)


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    """A raw frame of any type, for framing-error scenarios."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([FRAME_END])


class Probe:
    """One connection. `transcript` may be shared with other probes of a scenario."""

    def __init__(self, uri: str, *, timeout: float = 2.0, label: str = "",
                 transcript: list | None = None) -> None:
        parsed = urlparse(uri)
        self.uri = uri
        self.username = unquote(parsed.username or "guest")
        self.password = unquote(parsed.password or "guest")
        self.vhost = unquote(parsed.path[1:]) if parsed.path[1:] else "/"
        self.timeout = timeout
        self.label = label
        self.transcript: list = [] if transcript is None else transcript
        self.sock = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()
        self.pending: list[dict] = []
        self.closed = False  # connection.close seen or stream ended
        self.open_channels: set[int] = set()
        self.integer_encoding = "client"  # or "smallest": pamqp's default
        self._confirmed: set[int] = set()  # publisher-confirm sequence numbers recorded

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def open(cls, uri: str, **options) -> "Probe":
        probe = cls(uri, **options)
        probe.handshake()
        return probe

    def another(self, label: str) -> "Probe":
        """A second connection to the same server, recording into the same transcript."""
        return Probe.open(self.uri, timeout=self.timeout, label=label,
                          transcript=self.transcript)

    def close(self) -> None:
        if not self.closed:
            try:
                self.send(0, commands.Connection.Close(200, "bye", 0, 0))
                self._read_until(lambda ch, event: event["method"] == "Connection.CloseOk",
                                 time.monotonic() + self.timeout)
            except OSError:
                pass
        self.closed = True
        self.sock.close()

    def __enter__(self) -> "Probe":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def handshake(self, *, frame_max: int = 131072, channel_max: int = 2047,
                  heartbeat: int = 0, record_failure: bool = True) -> dict:
        """Protocol header, start-ok (PLAIN), tune-ok, open. Returns the start, tune
        and open events; records only a failure (unless told not to)."""
        self.send_bytes(PROTOCOL_HEADER)
        start = self.next_event()
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "quorumqueue differential probe",
                               "capabilities": CLIENT_CAPABILITIES},
            mechanism="PLAIN", response=f"\0{self.username}\0{self.password}",
            locale="en_US"))
        tune = self.next_event()
        self.send(0, commands.Connection.TuneOk(channel_max, frame_max, heartbeat))
        opened = self.call(0, commands.Connection.Open(self.vhost), record=False)
        if record_failure and opened["method"] != "Connection.OpenOk":
            self.record({"handshake": opened})
        return {"start": start, "tune": tune, "open": opened}

    # ------------------------------------------------------------ sending

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, channel: int, method) -> None:
        if self.integer_encoding == "smallest":
            with _timestamps_as_integers():
                self.send_bytes(pamqp_frame.marshal(method, channel))
        else:
            self.send_bytes(marshal(method, channel))

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes | str,
                *, mandatory: bool = False, immediate: bool = False,
                properties: commands.Basic.Properties | None = None) -> None:
        self.send_bytes(self.publish_frames(channel, exchange, routing_key, body,
                                            mandatory=mandatory, immediate=immediate,
                                            properties=properties))

    @staticmethod
    def publish_frames(channel: int, exchange: str, routing_key: str, body: bytes | str,
                       *, mandatory: bool = False, immediate: bool = False,
                       properties: commands.Basic.Properties | None = None) -> bytes:
        """A basic.publish with its content header and body, as bytes (several sent
        in one write reach the server in one read)."""
        data = body.encode() if isinstance(body, str) else body
        return (marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                               mandatory=mandatory, immediate=immediate),
                        channel)
                + marshal(pamqp_header.ContentHeader(0, len(data), properties
                                                     or commands.Basic.Properties()), channel)
                + (marshal(pamqp_body.ContentBody(data), channel) if data else b""))

    # ------------------------------------------------------------ recording

    def record(self, entry: dict) -> dict:
        if self.label:
            entry = {"connection": self.label, **entry}
        self.transcript.append(normalize(entry))
        return entry

    def call(self, channel: int, method, *, record: bool = True) -> dict:
        """Send `method`; for a synchronous one, wait for and record its outcome."""
        if self.closed:
            outcome = {"method": "not sent: connection closed"}
        else:
            self.send(channel, method)
            if not method.synchronous:
                return {}
            wanted = set(method.valid_responses)

            def answers(ch: int, event: dict) -> bool:
                return ((ch == channel and (event["method"] in wanted
                                            or event["method"] == "Channel.Close"))
                        or event["method"] in ("Connection.Close", "end of stream"))
            outcome = self._read_until(answers, time.monotonic() + self.timeout)
            if outcome["method"] == "Channel.OpenOk":
                self.open_channels.add(channel)
            elif outcome["method"] == "Channel.CloseOk":
                self.open_channels.discard(channel)
        if record:
            self.record({"call": method.name, "channel": channel, "reply": outcome})
        return outcome

    def barrier(self, channel: int) -> dict:
        """A synchronous round trip on `channel`; records what came back."""
        return self.call(channel, commands.Exchange.Declare(exchange="amq.direct",
                                                           passive=True))

    def collect(self, count: int, timeout: float | None = None) -> list[dict]:
        """Record the next `count` asynchronous events (fewer if `timeout` passes)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.pending) < count and not self.closed:
            found = self._read_one(deadline)
            if found is None:
                break
            self._keep(*found)
        events, self.pending = self.pending[:count], self.pending[count:]
        if events and all(e["method"] in ("Basic.Ack", "Basic.Nack") for e in events):
            events.sort(key=lambda e: (e["channel"], e["delivery_tag"]))
        self.record({"events": events})
        return events

    # ------------------------------------------------------------ reading

    def next_event(self, timeout: float | None = None) -> dict:
        """The next frame as an event, or a timeout/end-of-stream marker."""
        found = self._read_one(time.monotonic() + (self.timeout if timeout is None
                                                   else timeout))
        return found[1] if found else {"method": "timeout"}

    def read_until_closed(self, timeout: float | None = None) -> bytes:
        """Everything the server sends until it closes the socket (raw bytes)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        data = bytes(self.buffer)
        self.buffer.clear()
        while time.monotonic() < deadline:
            chunk = self._recv(deadline)
            if chunk is None:  # the deadline: still open
                break
            if not chunk:
                return data
            data += chunk
        return data + b"<timeout: socket still open>"

    def _recv(self, deadline: float) -> bytes | None:
        """b"" at end of stream, None at the deadline."""
        self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            return self.sock.recv(65536)
        except socket.timeout:
            return None
        except OSError:  # reset by peer counts as end of stream
            return b""

    def _read_until(self, answers, deadline: float) -> dict:
        while True:
            found = self._read_one(deadline)
            if found is None:
                return {"method": "timeout"}
            if answers(*found) or found[1]["method"] == "end of stream":
                return found[1]
            self._keep(*found)

    def _keep(self, channel: int, event: dict) -> None:
        for expanded in self._expand_confirms(event):
            self.pending.append({"channel": channel, **expanded})

    def _read_one(self, deadline: float) -> tuple[int, dict] | None:
        """Read one event (a content method with its header and body is one event)
        and answer it if it is a close."""
        found = self._read_frame(deadline)
        if found is None:
            return None
        channel, value = found
        event = self._describe(value)
        if event["method"] in CONTENT_METHODS:
            self._read_content(channel, event, deadline)
        self._answer(channel, event)
        return channel, event

    def _read_content(self, channel: int, event: dict, deadline: float) -> None:
        found = self._read_frame(deadline)
        if found is None or not isinstance(found[1], pamqp_header.ContentHeader):
            event["content"] = "missing"
            return
        content_header = found[1]
        properties = {key: value for key, value in content_header.properties
                      if value not in (None, "", {})}
        if properties:
            event["properties"] = properties
        data = b""
        while len(data) < content_header.body_size:
            found = self._read_frame(deadline)
            if found is None or not isinstance(found[1], pamqp_body.ContentBody):
                event["content"] = "truncated"
                break
            data += found[1].value
        event["body"] = data

    def _expand_confirms(self, event: dict) -> list[dict]:
        """A publisher confirm becomes one event per sequence number it settles
        (`multiple` stands for every unconfirmed one up to its tag), so brokers that
        batch confirms differently compare equal."""
        if event["method"] not in ("Basic.Ack", "Basic.Nack"):
            return [event]
        tag = event["delivery_tag"]
        numbers = ([n for n in range(1, tag + 1) if n not in self._confirmed]
                   if event.get("multiple") else [tag])
        self._confirmed.update(numbers)
        return [{"method": event["method"], "delivery_tag": number} for number in numbers]

    def _answer(self, channel: int, event: dict) -> None:
        if event["method"] == "Channel.Close":
            self.open_channels.discard(channel)
            self._send_quietly(channel, commands.Channel.CloseOk())
        elif event["method"] == "Connection.Close":
            self._send_quietly(0, commands.Connection.CloseOk())
            self.closed = True
        elif event["method"] == "end of stream":
            self.closed = True

    def _send_quietly(self, channel: int, method) -> None:
        """A close-ok: the server may already have dropped the socket."""
        try:
            self.send(channel, method)
        except OSError:
            pass

    def _read_frame(self, deadline: float) -> tuple[int, Any] | None:
        while True:
            if len(self.buffer) >= 7:
                frame_type, channel, size = struct.unpack_from(">BHI", self.buffer)
                if len(self.buffer) >= size + 8:
                    data = bytes(self.buffer[:size + 8])
                    del self.buffer[:size + 8]
                    if frame_type == 8:
                        return channel, pamqp_heartbeat.Heartbeat()
                    with _timestamps_as_integers():
                        return channel, pamqp_frame.unmarshal(data)[2]
            chunk = self._recv(deadline)
            if chunk is None:
                return None
            if not chunk:
                ended = {"method": "end of stream"}
                if self.buffer:
                    ended["unparsed"] = bytes(self.buffer)
                    self.buffer.clear()
                return 0, ended
            self.buffer += chunk

    @staticmethod
    def _describe(value: Any) -> dict:
        if isinstance(value, dict):
            return value
        if isinstance(value, pamqp_heartbeat.Heartbeat):
            return {"method": "heartbeat"}
        if isinstance(value, (pamqp_header.ContentHeader, pamqp_body.ContentBody)):
            return {"method": f"unexpected {type(value).__name__}"}
        event = {"method": value.name, **dict(value)}
        if value.name == "Connection.Start":
            properties = dict(event.pop("server_properties"))
            event["capabilities"] = properties.pop("capabilities", {})
            event["server_properties"] = properties
        return event

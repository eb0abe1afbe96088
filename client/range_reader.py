"""Bulk lease reads on a connection of their own, without pika on the path of the bytes.

    with RangeReader(uri) as reader:
        for body in reader.read("orders", "query-1", 0, 20_000):   # "entries" bodies
            ...                                                    # lease_entries.decode

Responsibilities
    One AMQP 0-9-1 connection (plain or TLS) and one channel that reads lease ranges: a
    no-ack basic.consume with the lease arguments (docs/behaviour/leases.md, "Leases
    (wire form)"), then the delivery bodies as they arrive, until the broker's
    basic.cancel ends the range. A reader decodes thousands of messages per body; what
    pika would do per frame (4 KiB socket reads, an object per frame, a copy per append)
    is what this module avoids: frames are found with struct, and a body frame's
    payload is received from the socket straight into the delivery's body (the
    kernel's copy is the only one; the buffer holds only frame heads, methods and
    content headers, read HEAD_BYTES at a time between bodies). `read_groups` receives
    the deliveries back to back into buffers of GROUP_BYTES and decodes a run of them
    (GROUP_MESSAGES messages) at once (lease_entries.EntriesDecoder.decode_group), so
    that the connector builds one Arrow batch from several small deliveries.

How it works
    The handshake (PLAIN, the broker's frame_max, no heartbeats, the capability
    consumer_cancel_notify, which the broker needs to send the closing basic.cancel)
    and the rare methods are encoded and decoded with pamqp, the project's AMQP
    codec library; deliveries (basic.deliver, content header, body frames) are read
    by their frame headers only. A range that completes leaves the connection ready
    for the next; one left part-way closes it (its deliveries are still on the way).

Invariants
    - The broker's refusal (channel.close) raises pika's ChannelClosedByBroker with
      its reply code and text, as a pika read of the same range would, and a closed
      connection raises ConnectionClosedByBroker; a lost socket raises
      StreamLostError; a range with no byte for `timeout` seconds raises
      ManagementError ("... stalled ..."): the connector sorts them as before.
    - A refused login raises ManagementError naming the user and the URI, never a
      connection loss (retrying it cannot help).

Not here
    The formats (quorumqueue.broker.amqp.lease_records), decoding a body
    (lease_entries.py), lease control (lease_client.py).
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import uuid
from collections.abc import Iterator

import numpy as np
import pika.exceptions
from pamqp import commands, frame as pamqp_frame
from pamqp.header import ProtocolHeader

from ..broker.amqp.lease_records import ENTRIES_FORMAT, ENTRIES_HEAD
from .lease_entries import EntriesDecoder, EntryColumns
from .management import ManagementError, redact_uri
from .tls import ClientTls, connection_parameters

RECV_BYTES = 1 << 20
# read_groups receives deliveries back to back into buffers of GROUP_BYTES and decodes
# a run of them as one EntryColumns once it holds GROUP_MESSAGES messages (or the
# next does not fit): the broker's deliveries are about 1 MiB, so at 256 B a delivery
# (some 3,000 messages) is a group of its own, at 4 KB four (256 each) make one.
GROUP_BYTES = 4 << 20
GROUP_MESSAGES = 2048
# Between bodies a range read's socket is read this much at a time: a delivery's
# method and content header, so that its body's payload is received into the body.
HEAD_BYTES = 1024
_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">HH")
_BODY_SIZE = struct.Struct(">Q")
_FRAME_METHOD, _FRAME_HEADER, _FRAME_BODY, _FRAME_HEARTBEAT = 1, 2, 3, 8
_FRAME_END = 0xCE
_DELIVER, _CANCEL, _CONSUME_OK = (60, 60), (60, 30), (60, 21)
_CHANNEL_CLOSE, _CONNECTION_CLOSE = (20, 40), (10, 50)
CHANNEL = 1


class _Arena:
    """Delivery bodies allocated back to back in buffers of `size` octets (numpy, not
    zeroed: a body is written whole before it is read)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.buffer: np.ndarray | None = None
        self.used = 0

    def allocate(self, length: int) -> memoryview:
        if self.buffer is None or self.used + length > len(self.buffer):
            self.buffer, self.used = np.empty(max(self.size, length), np.uint8), 0
        at = self.used
        self.used += length
        return memoryview(self.buffer)[at:at + length]


class RangeReader:
    def __init__(self, uri: str, vhost: str | None = None, timeout: float = 30.0,
                 tls: ClientTls | None = None) -> None:
        parameters = connection_parameters(uri, tls)
        self.uri, self.timeout = uri, timeout
        self.vhost = vhost if vhost is not None else parameters.virtual_host
        self._buffer = bytearray()
        self._position = 0  # where the next frame begins in _buffer
        self._chunk = memoryview(bytearray(RECV_BYTES))
        self.usable = False
        self.reused = False   # handed out again by a pool of kept readers
        self.pool_key = None  # the pool's key for it
        try:
            sock = socket.create_connection((parameters.host, parameters.port), timeout)
        except OSError as error:
            raise ManagementError(f"cannot connect to {redact_uri(uri)}: {error!r}. Is the "
                                  "broker running?") from None
        if parameters.ssl_options is not None:
            options = parameters.ssl_options
            try:
                sock = options.context.wrap_socket(
                    sock, server_hostname=options.server_hostname or parameters.host)
            except (ssl.SSLError, OSError) as error:
                sock.close()
                raise ManagementError(f"{redact_uri(uri)}: {error}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._socket = sock
        try:
            self._handshake(parameters.credentials.username, parameters.credentials.password)
        except BaseException:
            self.close()
            raise
        self.usable = True

    # ------------------------------------------------------------------ handshake

    def _handshake(self, user: str, password: str) -> None:
        self._socket.sendall(pamqp_frame.marshal(ProtocolHeader(), 0))
        self._expect(commands.Connection.Start)
        self._send(0, commands.Connection.StartOk(
            client_properties={"product": "quorumqueue range reader",
                               "capabilities": {"consumer_cancel_notify": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}"))
        try:
            tune = self._expect(commands.Connection.Tune)
        except pika.exceptions.ConnectionClosedByBroker as refused:
            raise ManagementError(f"the broker refused the login of user '{user}' at "
                                  f"{redact_uri(self.uri)}: {refused.reply_code} "
                                  f"{refused.reply_text}") from None
        except pika.exceptions.StreamLostError:
            raise ManagementError(f"the broker refused the login of user '{user}' at "
                                  f"{redact_uri(self.uri)} (it closed the connection)") from None
        self.frame_max = tune.frame_max or 131072
        self._send(0, commands.Connection.TuneOk(tune.channel_max or 2047, self.frame_max, 0))
        self._send(0, commands.Connection.Open(self.vhost))
        self._expect(commands.Connection.OpenOk)
        self._send(CHANNEL, commands.Channel.Open())
        self._expect(commands.Channel.OpenOk)

    def _send(self, channel: int, method) -> None:
        self._socket.sendall(pamqp_frame.marshal(method, channel))

    def _expect(self, kind):
        """The next method frame, which must be `kind` (a close raises)."""
        while True:
            frame_type, channel, at, size = self._next_frame()
            if frame_type == _FRAME_HEARTBEAT:
                continue
            if frame_type != _FRAME_METHOD:
                raise pika.exceptions.StreamLostError(
                    f"expected {kind.__name__}, got a frame of type {frame_type}")
            method = self._method(frame_type, channel, at, size)
            if isinstance(method, kind):
                return method
            self._closed_by_broker(method)
            raise pika.exceptions.StreamLostError(
                f"expected {kind.__name__}, got {type(method).__name__}")

    def _closed_by_broker(self, method) -> None:
        if isinstance(method, commands.Connection.Close):
            self.usable = False
            raise pika.exceptions.ConnectionClosedByBroker(method.reply_code, method.reply_text)
        if isinstance(method, commands.Channel.Close):
            self._send(CHANNEL, commands.Channel.CloseOk())
            self.usable = False  # its channel is gone
            raise pika.exceptions.ChannelClosedByBroker(method.reply_code, method.reply_text)

    # ------------------------------------------------------------------ frames

    def _fill(self, limit: int = RECV_BYTES) -> None:
        """Reads what the socket has, at most `limit` octets, onto the buffer."""
        buffer = self._buffer
        if self._position:  # drop what was read (no view of the buffer is kept)
            del buffer[:self._position]
            self._position = 0
        received = self._recv_into(self._chunk[:limit])
        buffer += self._chunk[:received]

    def _fill_to(self, wanted: int) -> None:
        """Reads until `wanted` unread octets are buffered, and no more."""
        while len(self._buffer) - self._position < wanted:
            self._fill(wanted - (len(self._buffer) - self._position))

    def _recv_into(self, view: memoryview) -> int:
        try:
            received = self._socket.recv_into(view)
        except socket.timeout:
            raise TimeoutError from None
        except OSError as error:
            self.usable = False
            raise pika.exceptions.StreamLostError(f"Stream connection lost: {error!r}") from None
        if not received:
            self.usable = False
            raise pika.exceptions.StreamLostError("Stream connection lost: the broker closed it")
        return received

    def _next_frame(self, limit: int = RECV_BYTES) -> tuple[int, int, int, int]:
        """(type, channel, payload start, payload size) of the next frame, in
        self._buffer until the next call; the socket read `limit` octets at a time."""
        buffer = self._buffer
        while True:
            position = self._position
            if len(buffer) - position >= 7:
                frame_type, channel, size = _FRAME_HEAD.unpack_from(buffer, position)
                if len(buffer) - position >= size + 8:
                    if buffer[position + size + 7] != _FRAME_END:
                        self.usable = False
                        raise pika.exceptions.StreamLostError("a frame without its end octet")
                    self._position = position + size + 8
                    return frame_type, channel, position + 7, size
            self._fill(limit)

    def _method(self, frame_type: int, channel: int, at: int, size: int):
        """A method frame decoded by pamqp (the rare ones)."""
        raw = _FRAME_HEAD.pack(frame_type, channel, size) + self._buffer[at:at + size] + b"\xce"
        return pamqp_frame.unmarshal(raw)[2]

    # ------------------------------------------------------------------ reading

    def read(self, queue: str, lease: str, start: int, end: int,
             form: str = ENTRIES_FORMAT, allocate=bytearray) -> Iterator[bytearray]:
        """The delivery bodies of the range (start, end] in the given format, as they
        arrive, each received into `allocate(length)` (a writable buffer); settles
        nothing. Left part-way, the connection is closed."""
        if not self.usable:
            raise pika.exceptions.StreamLostError("this range reader's connection is closed")
        tag = f"range-{uuid.uuid4().hex[:12]}"
        self._send(CHANNEL, commands.Basic.Consume(
            queue=queue, consumer_tag=tag, no_ack=True,
            arguments={"x-lease": lease, "x-lease-start": start, "x-lease-end": end,
                       "x-lease-format": form}))
        what = f"reading lease '{lease}' ({start}, {end}]"
        complete = False
        try:
            for body in self._deliveries(what, allocate):
                yield body
            complete = True
        finally:
            if not complete:
                self.close()

    def _deliveries(self, what: str, allocate) -> Iterator[bytearray]:
        self._socket.settimeout(self.timeout)
        buffer = self._buffer
        body: bytearray | None = None
        filled = 0
        while True:
            try:
                if body is not None:
                    filled = self._body_frame(body, filled)
                    if filled == len(body):
                        yield body
                        body = None
                        continue
                    if filled >= 0:
                        continue
                    filled = ~filled  # the next frame is not a body frame
                frame_type, channel, at, size = self._next_frame(HEAD_BYTES)
            except TimeoutError:
                self.usable = False
                raise ManagementError(f"{what} stalled for {self.timeout}s") from None
            if frame_type == _FRAME_BODY:
                if body is None or filled + size > len(body):
                    raise pika.exceptions.StreamLostError("a body frame outside a delivery")
                with memoryview(buffer) as view:
                    body[filled:filled + size] = view[at:at + size]
                filled += size
                if filled == len(body):
                    yield body
                    body = None
            elif frame_type == _FRAME_HEADER:
                (length,) = _BODY_SIZE.unpack_from(buffer, at + 4)
                body, filled = allocate(length), 0
                if not length:
                    yield body
                    body = None
            elif frame_type == _FRAME_METHOD:
                method_id = _METHOD_ID.unpack_from(buffer, at)
                if method_id == _DELIVER or method_id == _CONSUME_OK:
                    continue
                if method_id == _CANCEL:
                    return  # the range is complete
                method = self._method(frame_type, channel, at, size)
                self._closed_by_broker(method)
                raise pika.exceptions.StreamLostError(
                    f"{what}: unexpected {type(method).__name__}")

    def _body_frame(self, body: bytearray, filled: int) -> int:
        """Reads the next frame into `body` from `filled` on, if it is a body frame, and
        returns the new fill; else ~filled (negative), the frame left unread. What of
        its payload is not buffered yet is received straight into `body`: the kernel's
        copy is the only one (the buffer is filled only up to the frame's payload, then
        up to its end octet and the next frame's head)."""
        self._fill_to(7)
        buffer, position = self._buffer, self._position
        frame_type, _channel, size = _FRAME_HEAD.unpack_from(buffer, position)
        if frame_type != _FRAME_BODY:
            return ~filled
        if filled + size > len(body):
            self.usable = False
            raise pika.exceptions.StreamLostError("a body frame outside a delivery")
        have = min(len(buffer) - position - 7, size)
        with memoryview(body) as into, memoryview(buffer) as view:
            into[filled:filled + have] = view[position + 7:position + 7 + have]
            self._position = position + 7 + have
            at, end = filled + have, filled + size
            while at < end:
                at += self._recv_into(into[at:end])
        self._fill_to(1)
        if buffer[self._position] != _FRAME_END:
            self.usable = False
            raise pika.exceptions.StreamLostError("a frame without its end octet")
        self._position += 1
        return end

    def read_columns(self, queue: str, lease: str, start: int,
                     end: int) -> Iterator[EntryColumns]:
        """The range (start, end], decoded column by column, a body at a time."""
        decoder = EntriesDecoder()
        for body in self.read(queue, lease, start, end):
            yield decoder.decode(body)

    def read_groups(self, queue: str, lease: str, start: int, end: int,
                    group_bytes: int = GROUP_BYTES,
                    group_messages: int = GROUP_MESSAGES) -> Iterator[EntryColumns]:
        """The range (start, end], decoded column by column: deliveries received back
        to back into buffers of `group_bytes` (or one delivery's size, if larger), a
        run of them one EntryColumns once it holds `group_messages` messages or the
        next delivery does not fit, so that a reader builds one Arrow batch of several
        small deliveries (its fixed cost per batch, and Spark's, paid once for them).
        A buffer is never written again where a group handed out lies."""
        decoder = EntriesDecoder()
        arena = _Arena(group_bytes)
        spans: list[tuple[int, int]] = []
        group, messages = None, 0
        for body in self.read(queue, lease, start, end, allocate=arena.allocate):
            if spans and arena.buffer is not group:
                yield decoder.decode_group(group, spans)
                spans, messages = [], 0
            group = arena.buffer
            spans.append((arena.used - len(body), len(body)))
            if len(body) >= ENTRIES_HEAD.size:
                messages += ENTRIES_HEAD.unpack_from(body)[1]
            if messages >= group_messages:
                yield decoder.decode_group(group, spans)
                spans, messages = [], 0
        if spans:
            yield decoder.decode_group(group, spans)

    def idle(self) -> bool:
        """Whether the connection is open with nothing unread: a reader kept between
        reads is reused only then (a broker that closed it, or restarted, has sent
        something or an end of file)."""
        if not self.usable or self._position < len(self._buffer):
            return False
        try:
            readable, _, _ = select.select([self._socket], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        self.usable = False
        if self._socket is not None:
            try:
                self._socket.close()
            except OSError:
                pass
            self._socket = None

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

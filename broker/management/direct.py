"""A direct AMQP 0-9-1 connection inside the node, for the HTTP API's changes.

Responsibilities: declare, delete, bind, unbind, purge, publish and get on behalf of
an HTTP user, with every check a client connection gets (permissions, argument
validation, equivalence, exclusivity, limits) and RabbitMQ's refusal texts. RabbitMQ's
management plugin does the same: its PUT/DELETE/POST handlers open a direct Erlang
client connection as the requesting user and send `queue.declare` and friends
(rabbit_mgmt_util:with_channel); an AMQP error that closes the channel becomes the
HTTP answer (404 for NOT_FOUND, 401 for ACCESS_REFUSED, 400 for the rest).

How it works: a node `Session` (node/session.py) like any client's, fed with client
frames that pamqp marshals; the server shell takes the session's output after each
group commit, exactly as for a socket, and hands it to `write`, which parses server
frames with pamqp and wakes the waiting coroutine. So nothing reaches the HTTP client
before the fsync that covers it (a declare answers once the metadata entry is
applied; a publish once its confirm leaves).

Invariants: one channel (number 1); one method in flight at a time; a channel or
connection close from the server fails the call waiting and every later one; the
session is detached from the shell once closed.

Not here: HTTP (views), what is read without changing anything (rows.py reads the
node directly).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
from dataclasses import dataclass
from typing import Any, Iterator

from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp.exceptions import UnmarshalingException

from ..amqp import spec
from ..node.session import Session

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
CHANNEL = 1
# how long one answer may take: beyond the metadata group's own timeout (30 s by
# default, after which a change is refused), so an answer lost for good still ends
# the HTTP request (500) instead of holding it forever
ANSWER_TIMEOUT = 120.0


class DirectError(Exception):
    """The server closed the channel or the connection: `code` and RabbitMQ's
    `NAME - detail` text."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text

    @property
    def detail(self) -> str:
        """The text without its `NAME - ` prefix (what RabbitMQ's HTTP API shows)."""
        name, separator, detail = self.text.partition(" - ")
        return detail if separator and name.isupper() else self.text


@dataclass(slots=True)
class Got:
    """One basic.get-ok with its message."""
    method: Any
    properties: commands.Basic.Properties
    body: bytes


def _long_integer(value: int) -> bytes:
    # RabbitMQ's management API sends every JSON integer as a signed 64-bit long
    # (rabbit_mgmt_util's args/1), not pamqp's smallest type
    return b"l" + struct.pack(">q", value)


@contextlib.contextmanager
def _management_integers() -> Iterator[None]:
    original = pamqp_encode.table_integer
    pamqp_encode.table_integer = _long_integer
    try:
        yield
    finally:
        pamqp_encode.table_integer = original


def marshal(value, channel: int) -> bytes:
    with _management_integers():
        return pamqp_frame.marshal(value, channel)


# pamqp checks names against a pattern of its own ([a-zA-Z0-9-_.:@#,/+ ]*) and a
# vhost against 127 characters, in every method's constructor and in `marshal`: a
# client's rule, not RabbitMQ's, whose names are any UTF-8 of up to 255 bytes (the
# queues guide, "Names"). A direct connection is a client the node checks as it
# checks any other, so its methods skip pamqp's checks (`method`); the one rule the
# wire itself has, 255 bytes in a short string, is checked here.
_NAME_FIELDS = ("queue", "exchange", "source", "destination", "routing_key", "virtual_host")


@functools.cache
def _unchecked(command: type) -> type:
    # no __slots__ of its own: pamqp's marshal walks self.__slots__, the command's
    return type(command.__name__, (command,), {"validate": lambda self: None,
                                               "__module__": __name__})


def method(command: type, **fields):
    """pamqp's `command(**fields)` without pamqp's own name checks (see above);
    DirectError 400 PRECONDITION_FAILED for a name longer than 255 bytes."""
    for key in _NAME_FIELDS:
        value = fields.get(key)
        if isinstance(value, str) and len(value.encode("utf-8")) > 255:
            raise DirectError(spec.PRECONDITION_FAILED,
                              f"PRECONDITION_FAILED - {key.replace('_', ' ')} '{value}' is "
                              f"{len(value.encode('utf-8'))} bytes of UTF-8; names hold "
                              "at most 255")
    return _unchecked(command)(**fields)


class _Transport:
    """What the server shell writes a session's output to (its `_Connection` for a
    socket): here, the direct connection's frame parser."""

    def __init__(self, owner: "DirectConnection") -> None:
        self._owner = owner

    def write(self, data: bytes) -> None:
        self._owner._received(data)

    def close(self) -> None:
        self._owner._lost()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class DirectConnection:
    """One direct connection for one HTTP request (`async with`)."""

    def __init__(self, shell, username: str, password: str, vhost: str,
                 peer_host: str) -> None:
        self.shell = shell
        self.username = username
        self.password = password
        self.vhost = vhost
        self.peer = f"{peer_host} (management)"
        self.transport = _Transport(self)
        self.write_paused = False
        self.session = Session(shell.node, peer_host, shell.pass_time(), peer=self.peer)
        self._buffer = b""
        self._frames: asyncio.Queue = asyncio.Queue()
        self._closed: DirectError | None = None
        self._confirms = 0

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> "DirectConnection":
        self.shell.attach_direct(self.session, self)
        try:
            await self._handshake()
        except BaseException:
            self.shell.detach_direct(self.session)
            raise
        return self

    async def __aexit__(self, *exc_info) -> None:
        try:
            if self._closed is None:
                self._send(commands.Connection.Close(200, "Goodbye", 0, 0), 0)
                await self._expect(commands.Connection.CloseOk, 0)
        except DirectError:
            pass
        finally:
            self.shell.detach_direct(self.session)

    async def _handshake(self) -> None:
        self._feed(PROTOCOL_HEADER)
        await self._expect(commands.Connection.Start, 0)
        response = f"\0{self.username}\0{self.password}"
        self._send(commands.Connection.StartOk(
            client_properties={"product": "quorumqueue management",
                               "capabilities": {"consumer_cancel_notify": True,
                                                "publisher_confirms": True,
                                                "authentication_failure_close": True}},
            mechanism="PLAIN", response=response, locale="en_US"), 0)
        tune = await self._expect(commands.Connection.Tune, 0)
        self._send(commands.Connection.TuneOk(tune.channel_max, tune.frame_max, 0), 0)
        self._send(method(commands.Connection.Open, virtual_host=self.vhost), 0)
        await self._expect(commands.Connection.OpenOk, 0)
        self._send(commands.Channel.Open(), CHANNEL)
        await self._expect(commands.Channel.OpenOk, CHANNEL)

    # ------------------------------------------------------------ calls

    async def call(self, method, reply: type):
        """Send a synchronous method on the channel; its reply, or DirectError."""
        self._send(method, CHANNEL)
        return await self._expect(reply, CHANNEL)

    def cast(self, method) -> None:
        """Send a method that has no reply (ack, reject, nack)."""
        self._send(method, CHANNEL)

    async def publish(self, exchange: str, routing_key: str,
                      properties: commands.Basic.Properties, body: bytes) -> bool:
        """Publish with mandatory and a publisher confirm, as RabbitMQ's publish
        endpoint does; True if routed to a queue, False if returned."""
        if not self._confirms:
            await self.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self._confirms += 1
        frame_max = self.session.frame_max - 8
        parts = [marshal(method(commands.Basic.Publish, exchange=exchange,
                                routing_key=routing_key, mandatory=True), CHANNEL),
                 marshal(pamqp_header.ContentHeader(0, len(body), properties), CHANNEL)]
        for start in range(0, len(body), frame_max):
            parts.append(marshal(pamqp_body.ContentBody(body[start:start + frame_max]),
                                 CHANNEL))
        self._feed(b"".join(parts))
        routed = True
        while True:
            value = await self._next(CHANNEL)
            if isinstance(value, commands.Basic.Return):
                routed = False
                await self._content()
            elif isinstance(value, commands.Basic.Ack):
                return routed
            elif isinstance(value, commands.Basic.Nack):
                raise DirectError(spec.PRECONDITION_FAILED, "rejected")

    async def get(self, queue: str) -> Got | None:
        """basic.get (no_ack false): the message, or None when the queue is empty."""
        self._send(method(commands.Basic.Get, queue=queue, no_ack=False), CHANNEL)
        while True:
            value = await self._next(CHANNEL)
            if isinstance(value, commands.Basic.GetEmpty):
                return None
            if isinstance(value, commands.Basic.GetOk):
                properties, body = await self._content()
                return Got(value, properties, body)

    # ------------------------------------------------------------ frames

    def _send(self, method, channel: int) -> None:
        self._feed(marshal(method, channel))

    def _feed(self, data: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        shell = self.shell
        self.session.receive_data(data, shell.pass_time())
        shell.node.dirty.add(self.session)
        shell.schedule_flush()

    async def _next(self, channel: int):
        while True:
            if self._closed is not None and self._frames.empty():
                raise self._closed
            number, value = await asyncio.wait_for(self._frames.get(), ANSWER_TIMEOUT)
            if value is None:
                continue  # the wake-up of a close
            if isinstance(value, commands.Connection.Close):
                self._closed = DirectError(value.reply_code, value.reply_text)
                with contextlib.suppress(DirectError):
                    self._feed(marshal(commands.Connection.CloseOk(), 0))
                raise self._closed
            if isinstance(value, commands.Channel.Close):
                self._closed = DirectError(value.reply_code, value.reply_text)
                with contextlib.suppress(DirectError):
                    self.session.receive_data(marshal(commands.Channel.CloseOk(), number),
                                              self.shell.pass_time())
                raise self._closed
            if number == channel:
                return value

    async def _expect(self, kind: type, channel: int):
        while True:
            value = await self._next(channel)
            if isinstance(value, kind):
                return value

    async def _content(self) -> tuple[commands.Basic.Properties, bytes]:
        header = await self._next(CHANNEL)
        assert isinstance(header, pamqp_header.ContentHeader), header
        chunks, size = [], 0
        while size < header.body_size:
            part = await self._next(CHANNEL)
            chunks.append(part.value)
            size += len(part.value)
        return header.properties, b"".join(chunks)

    def _received(self, data: bytes) -> None:
        self._buffer += data
        while self._buffer:
            try:
                used, number, value = pamqp_frame.unmarshal(self._buffer)
            except UnmarshalingException:
                return  # a partial frame: the rest comes with the next write
            self._buffer = self._buffer[used:]
            self._frames.put_nowait((number, value))

    def _lost(self) -> None:
        if self._closed is None:
            self._closed = DirectError(spec.CONNECTION_FORCED, "connection closed")
        self._frames.put_nowait((0, None))

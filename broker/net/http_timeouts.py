"""How long an HTTP connection of the management API or the Prometheus endpoint may
keep the node waiting: Cowboy 2.8's three timers, RabbitMQ's keys and defaults.

Responsibilities: close a connection whose client stops speaking, wherever it
stopped: before its first request's headers end, inside a request's body, between
two requests of a keep-alive connection, or while not reading its answer.

How it works (as cowboy_http 2.8, RabbitMQ 3.10.8's web server, checked live):
- `request_timeout` (management.tcp.request_timeout, 5000 ms): from the accept
  until the first request's headers are whole; bytes of a partial request do not
  extend it. Then closed: without a word if the request line is not whole yet, with
  `408 Request Timeout` if the client stopped inside its headers.
- `idle_timeout` (management.tcp.idle_timeout, 60000 ms): from the moment a
  request's headers are whole, restarted by each byte received while that request
  is served (its body). It goes on after the answer, so it also bounds the wait for
  the next request of a keep-alive connection (whose partial bytes do not extend
  it). A client that stops sending its body or stops reading a long answer is
  closed when it runs out. Then closed without a word.
- `inactivity_timeout` (management.tcp.inactivity_timeout, 300000 ms): nothing
  received and no request begun or answered for that long: closed.

`HttpTimer` is the pure core: one connection's state, fed the times by its shell,
`deadline()` says when and how it ends. `TimedServer` is the shell around aiohttp's
protocol factory (it passes bytes on unchanged), `middleware` tells it where each
request begins and ends.

Invariants: a connection always has a deadline (every timer is finite); the
deadline moves only when bytes arrive or a request begins or ends.

Not here: the answers themselves (management/, metrics/), the descriptor reserve
(server/sockets.py).
"""

from __future__ import annotations

import asyncio
import enum
import socket
import struct
from dataclasses import dataclass

REQUEST_TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\n"
                            b"content-length: 0\r\n\r\n")   # Cowboy's, byte for byte


@dataclass(frozen=True, slots=True)
class HttpTimeouts:
    """Seconds (the settings are milliseconds)."""
    request: float = 5.0
    idle: float = 60.0
    inactivity: float = 300.0


class Phase(enum.Enum):
    FIRST = "before the first request's headers end"
    SERVING = "a request is served"
    BETWEEN = "after an answer, before the next request's headers end"


class Ending(enum.Enum):
    SILENT = "closed without a word"
    REQUEST_TIMEOUT = "408 Request Timeout, then closed"


class HttpTimer:
    """One connection's timers; every method takes the current time."""

    __slots__ = ("timeouts", "phase", "accepted", "last_data", "last_activity",
                 "idle_off", "_line_done", "_line_has_content")

    def __init__(self, timeouts: HttpTimeouts, now: float) -> None:
        self.timeouts = timeouts
        self.phase = Phase.FIRST
        self.accepted = now        # request_timeout runs from here (first request)
        self.last_data = now       # idle_timeout runs from here (after the first)
        self.last_activity = now   # inactivity_timeout runs from here
        self.idle_off = False      # the request being served asked for no idle bound
        self._line_done = False    # the first request's line is whole (in its headers)
        self._line_has_content = False

    def receive_data(self, data: bytes, now: float) -> None:
        self.last_activity = now
        if self.phase is Phase.SERVING:
            self.last_data = now
        elif self.phase is Phase.FIRST and not self._line_done:
            # empty lines before the request line are skipped (RFC 7230 3.5)
            for byte in data:
                if byte == 0x0A:
                    if self._line_has_content:
                        self._line_done = True
                        return
                elif byte != 0x0D:
                    self._line_has_content = True

    def request_started(self, now: float, idle: bool = True) -> None:
        """Its headers are whole; `idle` False: no idle bound while it is served (a
        definitions import, which RabbitMQ serves so)."""
        self.phase = Phase.SERVING
        self.last_data = self.last_activity = now
        self.idle_off = not idle

    def request_finished(self, now: float) -> None:
        """Its answer is written."""
        self.phase = Phase.BETWEEN
        self.last_activity = now

    def deadline(self) -> tuple[float, Ending]:
        ends = [(self.last_activity + self.timeouts.inactivity, Ending.SILENT)]
        if self.phase is Phase.FIRST:
            ends.append((self.accepted + self.timeouts.request,
                         Ending.REQUEST_TIMEOUT if self._line_done else Ending.SILENT))
        elif not self.idle_off:
            ends.append((self.last_data + self.timeouts.idle, Ending.SILENT))
        return min(ends, key=lambda end: end[0])


# ---------------------------------------------------------------- the shell


class TimedServer:
    """aiohttp's protocol factory (web.Server) with a timer per connection; anything
    else (shutdown, connections) is the wrapped factory's."""

    def __init__(self, factory, timeouts: HttpTimeouts) -> None:
        self._factory = factory   # None until `wrap` (the middleware comes first)
        self.timeouts = timeouts
        self.timers: dict = {}   # transport -> _Timed, while connected

    def wrap(self, factory) -> None:
        self._factory = factory

    def __call__(self) -> "_Timed":
        return _Timed(self)

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_factory":
            raise AttributeError(name)
        return getattr(self._factory, name)

    def timer_for(self, transport) -> "_Timed | None":
        return self.timers.get(transport)


class _Timed(asyncio.Protocol):
    """One connection: bytes to aiohttp's handler, times to the timer, and the end."""

    def __init__(self, server: TimedServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self.timer = HttpTimer(server.timeouts, self._loop.time())
        self.inner = server._factory()
        self._transport: asyncio.Transport | None = None  # until connection_made
        self._handle: asyncio.TimerHandle | None = None
        self._scheduled = 0.0

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._server.timers[transport] = self
        self.inner.connection_made(transport)
        self._schedule()

    def data_received(self, data: bytes) -> None:
        self.timer.receive_data(data, self._loop.time())
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._server.timers.pop(self._transport, None)
        self.inner.connection_lost(exc)

    def started(self, idle: bool = True) -> None:
        self.timer.request_started(self._loop.time(), idle)
        self._schedule()

    def finished(self) -> None:
        self.timer.request_finished(self._loop.time())

    def _schedule(self) -> None:
        """A call at the deadline, or sooner: one that finds the deadline moved on
        calls again then (bytes arriving never touch the loop's timers)."""
        when, _ending = self.timer.deadline()
        if self._handle is not None and self._scheduled <= when:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._scheduled = when
        self._handle = self._loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self._handle = None
        when, ending = self.timer.deadline()
        if when > self._loop.time():
            self._schedule()
            return
        transport = self._transport  # set before the first `_schedule` (connection_made)
        if transport.is_closing():
            return
        if transport.get_write_buffer_size():
            # a client that does not read: its answer is dropped, the kernel's copy
            # too (a reset, not a FIN behind megabytes it would never take)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
            return
        if ending is Ending.REQUEST_TIMEOUT:
            transport.write(REQUEST_TIMEOUT_RESPONSE)
        transport.close()


def backstop(timeouts: HttpTimeouts) -> float:
    """aiohttp's own keep-alive timeout behind the timers: never the one that ends a
    connection (it runs from the accept and from each answer)."""
    return max(timeouts.request, timeouts.idle, timeouts.inactivity) + 1.0


def middleware(server: TimedServer, idle_exempt=lambda request: False):
    """An aiohttp middleware telling `server`'s timers where each request begins and
    ends (its answer written here, not after the handler returns);
    `idle_exempt(request)`: serve it without the idle bound."""
    from aiohttp import web

    @web.middleware
    async def timed(request, handler):
        connection = server.timer_for(request.transport)
        if connection is not None:
            connection.started(idle=not idle_exempt(request))
        try:
            response = await handler(request)
            if isinstance(response, web.StreamResponse):
                await response.prepare(request)
                await response.write_eof()
            return response
        finally:
            if connection is not None:
                connection.finished()

    return timed

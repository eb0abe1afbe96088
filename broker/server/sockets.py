"""The file-descriptor reserve: client sockets may take only part of the descriptors.

Responsibilities: count the sockets every listener accepted (AMQP, AMQP over TLS, the
management API, the Prometheus endpoint, the inter-node port) against one limit, and
refuse the ones over it; keep the rest of RLIMIT_NOFILE for the node's own work (WAL,
segments, snapshots, the message store, its dialled peers, files the alarms read).

How it works: the limit is RabbitMQ's `sockets_limit` (file_handle_cache): of the
soft RLIMIT_NOFILE, 100 are kept for others, and sockets may have 90 % of the rest,
less 2: 1,751 of 2,048; 943,626 of 1,048,576. A socket accepted over it is closed at
once (a reset), and the refusals are logged, one line at most every LOG_INTERVAL
seconds, counting the refusals since the previous line. `guard(factory, listener)`
wraps a listener's protocol factory (aiohttp's server too); the AMQP listener admits
through `admit` and `release` itself. Accepts that fail because the process has no
descriptor left at all (EMFILE from something else) are logged the same way
(`accept_error`) instead of asyncio's traceback per attempt.

The limit follows RLIMIT_NOFILE if it changes while the node runs (prlimit).

Invariants: `open` is the number of admitted sockets not yet lost; a refused socket
never reaches its protocol; every admitted socket is released exactly once.

Not here: handshake and request timeouts (amqp/connection.py, management/app.py,
metrics/http.py), which free what silent clients hold.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time

log = logging.getLogger("quorumqueue.broker")

RESERVED_FOR_OTHERS = 100   # file_handle_cache's ?RESERVED_FOR_OTHERS
LOG_INTERVAL = 10.0         # seconds between two lines about refused sockets


def sockets_limit(descriptors: int) -> int:
    """RabbitMQ's sockets_limit for a process allowed `descriptors` descriptors."""
    return max(1, int(max(2, descriptors - RESERVED_FOR_OTHERS) * 0.9 - 2))


def descriptor_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class SocketLimit:
    """The sockets the node's listeners hold, against `limit`."""

    def __init__(self, descriptors: int | None = None) -> None:
        # None: RLIMIT_NOFILE, read again at each accept (prlimit may change it)
        self._fixed = descriptors is not None
        self.descriptors = descriptors if descriptors is not None else descriptor_limit()
        self.limit = sockets_limit(self.descriptors)
        self.open = 0
        self.refused = 0            # since start
        self._unlogged = 0          # refusals not yet in a log line
        self._next_line = 0.0

    def admit(self, transport, listener: str) -> bool:
        """Count `transport`'s socket, or close it if the limit is reached."""
        if not self._fixed:
            descriptors = descriptor_limit()
            if descriptors != self.descriptors:
                self.descriptors, self.limit = descriptors, sockets_limit(descriptors)
        if self.open < self.limit:
            self.open += 1
            return True
        self.refused += 1
        peer = transport.get_extra_info("peername") or ("?", 0)
        transport.abort()
        self._refused_line(f"refused a TCP connection from {peer[0]}:{peer[1]} on the "
                           f"{listener} listener: {self.open} sockets are open, the "
                           f"node's limit (sockets_limit {self.limit} of "
                           f"{self.descriptors} file descriptors); the rest is kept "
                           "for the node's own files")
        return False

    def release(self) -> None:
        self.open -= 1

    def accept_error(self, listener: str, error: BaseException) -> None:
        """An accept that failed for want of descriptors (the process's or the
        system's): one line per LOG_INTERVAL, not a traceback per attempt."""
        self._refused_line(f"cannot accept a connection on the {listener} listener: "
                           f"{error} ({self.open} sockets open, sockets_limit "
                           f"{self.limit} of {self.descriptors} file descriptors)")

    def _refused_line(self, text: str) -> None:
        self._unlogged += 1
        now = time.monotonic()
        if now < self._next_line:
            return
        self._next_line = now + LOG_INTERVAL
        more = self._unlogged - 1
        self._unlogged = 0
        log.warning("%s%s", text, f" ({more} more since the last such line)" if more else "")

    def guard(self, factory, listener: str) -> "_GuardedFactory":
        return _GuardedFactory(factory, self, listener)

    def loop_exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """The loop's exception handler: asyncio's 'socket.accept() out of system
        resource' (EMFILE, ENFILE) becomes `accept_error`; the rest as by default."""
        error = context.get("exception")
        if isinstance(error, OSError) and "accept" in context.get("message", ""):
            self.accept_error("TCP", error)
            return
        loop.default_exception_handler(context)


class _GuardedFactory:
    """A protocol factory whose protocols are admitted by the limit first; anything
    else (aiohttp's Server.shutdown, .connections) is the wrapped factory's."""

    def __init__(self, factory, limit: SocketLimit, listener: str) -> None:
        self._factory = factory
        self._limit = limit
        self._listener = listener

    def __call__(self) -> "_Guarded":
        return _Guarded(self._factory, self._limit, self._listener)

    def __getattr__(self, name: str):
        return getattr(self._factory, name)


class _Guarded(asyncio.Protocol):
    """One accepted socket: handed to its listener's protocol once admitted."""

    __slots__ = ("_factory", "_limit", "_listener", "inner")

    def __init__(self, factory, limit: SocketLimit, listener: str) -> None:
        self._factory = factory
        self._limit = limit
        self._listener = listener
        self.inner = None   # the listener's protocol, once admitted

    def connection_made(self, transport) -> None:
        if self._limit.admit(transport, self._listener):
            self.inner = self._factory()
            self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc) -> None:
        if self.inner is not None:
            self._limit.release()
            self.inner.connection_lost(exc)

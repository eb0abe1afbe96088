"""Riding out a broker restart: retry a lost broker, with backoff, across every node of
`uri`, for option `reconnectTimeout`, then fail saying what to do.

Responsibilities
    `Reconnect` is the retry budget of one piece of work (the driver's connection,
    one executor's read of a partition, one sink task): `lost(error, node)` is called
    after each failed attempt; it logs that the connector is retrying, which node
    failed and why, then sleeps the next backoff, or raises `BrokerLost` once the
    budget since the first failure is spent. `recovered()` resets it after a success.
    `DriverConnection` is the lease-mode driver's one LeaseClient, re-opened through
    `Reconnect` (every address of `uri`, in order, at each attempt).

How it works
    The first retry is immediate (and made even with reconnectTimeout 0: a connection
    the broker dropped while the query idled is simply re-opened); then the pauses
    start at FIRST_BACKOFF_S and double up to MAX_BACKOFF_S, the last one cut to what
    is left of the budget. What counts as a lost broker
    (`is_connection_loss`): no address completed a handshake, the connection broke
    or was closed by the broker (a SIGTERMed broker sends 320 CONNECTION_FORCED), or
    a management RPC got no reply within the client's timeout (a cluster electing a
    new leader). A refusal (404, 406, 403: the broker's answer about the request) is
    not: it is raised at once.

Invariants
    - Only requests that are safe to repeat are retried: lease.settle is idempotent
      (settling up to a sequence already settled settles nothing), lease.info and a
      passive queue.declare read, a range read settles nothing, and the sink's
      publishes carry idempotency keys. A lease.grow whose reply was lost may have
      been applied: its messages are then in the lease, where the next latestOffset
      finds them (leases are in the queue's replicated log, so they survive restarts).
    - Messages never contain a password (addresses are shown redacted).

Not here
    Which operations a reader or the sink retries (lease_reader.py, consume_reader.py,
    publisher.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import pika.exceptions

from ..client.lease_client import LeaseClient
from ..client.management import ManagementError
from .connection import BrokerUnreachable, first_reachable
from .options import RECONNECT_TIMEOUT, BrokerAddress

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_BACKOFF_S = 0.25
MAX_BACKOFF_S = 5.0

CONNECTION_LOST = (BrokerUnreachable, pika.exceptions.AMQPConnectionError,
                   pika.exceptions.ConnectionClosed, pika.exceptions.StreamLostError,
                   pika.exceptions.ChannelWrongStateError, ConnectionError, OSError)


class BrokerLost(RuntimeError):
    """The broker stayed unreachable for longer than option reconnectTimeout."""


def is_connection_loss(error: BaseException) -> bool:
    if isinstance(error, ManagementError):
        return str(error).startswith(("no reply to ", "cannot connect to "))
    return isinstance(error, CONNECTION_LOST)


class Reconnect:
    """The retry budget of one piece of work; `what` names it in the log."""

    def __init__(self, timeout_ms: int, what: str,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.timeout_s = timeout_ms / 1000
        self.what = what
        self._sleep = sleep
        self._since: float | None = None   # monotonic time of the first failure
        self._backoff = FIRST_BACKOFF_S
        self.attempts = 0                  # failed attempts since the last success

    def lost(self, error: BaseException, node: str) -> None:
        """After a failed attempt: sleep before the next one, or raise BrokerLost."""
        pause = self.next_pause()
        if pause is None:
            raise BrokerLost(self.give_up_text(error, node)) from error
        left = self._since + self.timeout_s - time.monotonic()
        log.warning("%s: lost the broker at %s (%s); retrying every node of option 'uri' "
                    "in %.2fs (attempt %d, %.0fs left of option '%s')", self.what, node,
                    describe(error), pause, self.attempts, max(0.0, left), RECONNECT_TIMEOUT)
        if pause:
            self._sleep(pause)

    def next_pause(self) -> float | None:
        """The pause before the next attempt, or None once the budget is spent; counts
        the failed attempt. The first retry is at once and always allowed (a connection
        dropped while idle, missed heartbeats, is simply re-opened), then the pauses
        double from FIRST_BACKOFF_S to MAX_BACKOFF_S."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self.attempts += 1
        if self.attempts == 1:
            return 0.0
        left = self._since + self.timeout_s - now
        if left <= 0:
            return None
        pause = min(self._backoff, left)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        return pause

    def give_up_text(self, error: BaseException, node: str) -> str:
        return (f"{self.what}: the broker stayed unreachable for {self.timeout_s:g}s (option "
                f"'{RECONNECT_TIMEOUT}'); last, at {node}: {describe(error)}. Start the broker "
                "(or a node named in option 'uri') and restart the query from its "
                "checkpoint: lease mode then reads every message exactly once, the sink "
                f"publishes nothing twice. Raise '{RECONNECT_TIMEOUT}' to wait longer.")

    def recovered(self) -> None:
        if self._since is not None:
            log.warning("%s: the broker is back after %.1fs and %d failed attempt(s)",
                        self.what, time.monotonic() - self._since, self.attempts)
        self._since, self._backoff, self.attempts = None, FIRST_BACKOFF_S, 0


def describe(error: BaseException) -> str:
    if isinstance(error, (pika.exceptions.ConnectionClosed, pika.exceptions.ChannelClosed)):
        return f"{type(error).__name__}: {error.reply_code} {error.reply_text}"
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else repr(error)


class DriverConnection:
    """The lease-mode driver's LeaseClient, re-opened on loss within reconnectTimeout."""

    def __init__(self, addresses: Sequence[BrokerAddress], timeout_ms: int,
                 what: str = "quorumqueue source (driver)") -> None:
        self._addresses = addresses
        self._reconnect = Reconnect(timeout_ms, what)
        self._client: LeaseClient | None = None
        self.node: str = "no node yet"   # the address the client is connected to

    def call(self, operation: Callable[[LeaseClient], T]) -> T:
        """Run one request; a lost broker is retried (see the module header), a
        refusal closes the connection (its channel is gone) and is raised."""
        while True:
            try:
                if self._client is None:
                    self._client, self.node = first_reachable(self._addresses, _open)
                result = operation(self._client)
            except pika.exceptions.ChannelClosedByBroker:
                self.close()
                raise
            except Exception as error:  # noqa: BLE001 - sorted by is_connection_loss
                if not is_connection_loss(error):
                    raise
                self.close()
                node = self.node if not isinstance(error, BrokerUnreachable) else "every node"
                self._reconnect.lost(error, node)
                continue
            self._reconnect.recovered()
            return result

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - a broken connection cannot close cleanly
                pass


def _open(address: BrokerAddress) -> tuple[LeaseClient, str]:
    return LeaseClient(address.uri, vhost=address.vhost, tls=address.tls), address.redacted

"""Confirmed publishing with many messages in flight: one Spark task's messages.

Responsibilities
    `ConfirmedPublisher.run(messages)` publishes every message on one channel in
    confirm mode and returns only when the broker has confirmed them all; otherwise
    it raises `PublishError` saying what went wrong and what to do: which rows were
    nacked or returned (exchange, routing key, reply text), a confirm timeout, a lost
    connection or channel (with the broker's reply text, e.g. an unknown exchange).

How it works
    pika's BlockingConnection confirms one publish at a time (`basic_publish` waits
    for its basic.ack), which caps a task at one broker round trip, and for a quorum
    queue one log fsync, per message. pika's SelectConnection is the callback API
    over the same protocol code: `basic_publish` only buffers frames, basic.ack/nack
    and basic.return arrive as callbacks. So `run` drives a SelectConnection's ioloop:
    it fills a window of `MAX_IN_FLIGHT` unconfirmed messages from the iterator,
    refills it as confirms arrive (the broker acks many at once with multiple=true),
    and stops when the iterator is exhausted and nothing is unconfirmed. A timer
    checks that confirms keep coming. pika is already the connector's client;
    aio-pika would do the same on asyncio but is not a runtime dependency.

    A fill's messages are encoded into frames by `_encode` (the basic.publish frame
    of each (exchange, routing key) once, the content header from the properties'
    own `encode()`, the body cut at the negotiated frame size: the bytes pika's
    `basic_publish` sends) and handed to pika's transport in one write. pika's
    `basic_publish` builds three frame objects per message and its transport sends
    each frame with a `send()` of its own; that was two thirds of a sink task's
    client CPU (bench/README.md, `connector_sink.py`).

    Delivery tags are 1, 2, 3... in publish order on a fresh channel, so the
    unconfirmed messages are a dict keyed by tag, cleared from its lowest key up on
    a multiple ack. A basic.return carries no tag; `returned_row` (given by the
    caller) finds the row from the returned properties. The broker acks a returned
    message right after returning it, so a return is recorded as that row's failure.

Invariants
    - At most `MAX_IN_FLIGHT` messages are unconfirmed at any time.
    - `run` returns only once every published message was acked and none was
      returned. After the first failure nothing more is published; the run waits
      (at most `confirm_timeout_s`) for the confirms already due, so the error lists
      every failed row, then closes the connection and raises.
    - Exceptions from the message iterator (bad rows) close the connection and are
      re-raised unchanged. A nack or a return is not retried: Spark retries the task.
    - A lost connection (a broker restarted, a cluster node killed) is retried for
      `reconnect_timeout_s` (option reconnectTimeout; 0: the task fails): every
      address again, with backoff (reconnect.py), then the unconfirmed messages are
      published again in row order before the rest. Their idempotency keys make that
      exact with the bundled broker (a queue stores a publisher's seq at most once,
      and a repeat of a stored one is confirmed, not stored); other brokers may
      store them twice (the sink is at-least-once there anyway).

Not here
    Turning rows into messages and choosing idempotency keys (sink_rows.py, sink.py).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import pika
import pika.exceptions
import pika.frame
import pika.spec
from pika.adapters.select_connection import IOLoop

from .options import BrokerAddress
from .reconnect import Reconnect
from .reconnect import log as reconnect_log

MAX_IN_FLIGHT = 1000        # unconfirmed messages per task
SHOWN_ROWS = 5              # rows listed in an error message
CLOSE_GRACE_S = 5.0         # how long closing the connection may take
METHOD_FRAMES_KEPT = 1024   # encoded basic.publish frames kept, one per (exchange, key)

FRAME_HEADER, FRAME_BODY, FRAME_END = 2, 3, b"\xce"
_FRAME_START = struct.Struct(">BHI").pack          # type, channel, payload size
_PROPERTIES_START = struct.Struct(">HxxQ")         # class id, weight, body size
_HEADER_START = struct.Struct(">BHIHxxQ").pack     # a content header frame's first 19 bytes


class Outgoing(NamedTuple):
    """One message to publish; `row` numbers it within the task, from 0."""

    row: int
    exchange: str
    routing_key: str
    body: bytes
    properties: pika.BasicProperties


class PublishError(RuntimeError):
    """The broker did not confirm every message; the message says what and why."""


class _Failed(NamedTuple):
    row: int | None
    exchange: str
    routing_key: str
    reason: str     # "nack" or the return's reply text


class ConfirmedPublisher:
    def __init__(self, addresses: Sequence[BrokerAddress], mandatory: bool,
                 confirm_timeout_s: float,
                 returned_row: Callable[[pika.BasicProperties], int | None],
                 reconnect_timeout_s: float = 0.0) -> None:
        self._addresses = addresses
        # a lost connection is re-opened (every address, with backoff) for this long;
        # None: never (a test of the failing path, or the caller's choice)
        self._reconnect = (Reconnect(int(reconnect_timeout_s * 1000), "quorumqueue sink "
                                     "(executor task)") if reconnect_timeout_s > 0 else None)
        self._node = "no node yet"
        self._mandatory = mandatory
        self._timeout = confirm_timeout_s
        self._returned_row = returned_row
        self._ioloop: IOLoop | None = None
        self._connection: pika.SelectConnection | None = None
        self._channel = None
        self._messages: Iterator[Outgoing] = iter(())
        self._exhausted = False
        self._published = 0                          # messages taken from the iterator
        self._tag = 0                                # the channel's last delivery tag
        self._unconfirmed: dict[int, Outgoing] = {}  # delivery tag -> message
        self._method_frames: dict[tuple[str, str], bytes] = {}  # (exchange, key) -> frame
        self._body_max = 0                           # body bytes per frame, once connected
        self._lowest = 1                             # no unconfirmed tag below it
        self._resend: list[Outgoing] = []            # unconfirmed on a lost connection
        self._checking = False                       # the confirm-timeout timer runs
        self._gave_up = ""                           # why retrying stopped, for the error
        self._last_progress = 0.0
        self._failed: list[_Failed] = []
        self._fatal: str | None = None               # timeout, lost connection/channel
        self._error: BaseException | None = None     # raised by the iterator or a bug
        self._open_failures: list[str] = []
        self._done = False                           # no more failures to record
        self._finishing = False                      # closing the connection

    def run(self, messages: Iterator[Outgoing]) -> int:
        """Publish all of `messages`; the number published (all confirmed)."""
        self._messages = messages
        self._ioloop = IOLoop()
        try:
            self._connect(0)
            self._ioloop.start()
        finally:
            self._ioloop.close()
        if self._error is not None:
            raise self._error
        if self._fatal or self._failed:
            raise PublishError(self._describe_failure())
        return self._published

    # ------------------------------------------------------------ connection

    def _connect(self, index: int) -> None:
        address = self._addresses[index]
        self._node = address.redacted
        self._connection = pika.SelectConnection(
            address.parameters(), custom_ioloop=self._ioloop,
            on_open_callback=self._guard(self._on_open),
            on_open_error_callback=self._guard(
                lambda _connection, error: self._on_open_error(index, error)),
            on_close_callback=self._guard(self._on_close))

    def _on_open_error(self, index: int, error: BaseException) -> None:
        self._open_failures.append(f"{self._addresses[index].redacted}: {error!r}")
        if index + 1 < len(self._addresses):
            self._connect(index + 1)
            return
        failures, self._open_failures = "; ".join(self._open_failures), []
        if self._retry(f"cannot connect to any node: {failures}"):
            return
        self._fatal = f"cannot connect to the broker (option 'uri'): {failures}"
        if self._unconfirmed:
            self._fatal += (f", with {len(self._unconfirmed)} of {self._published} published "
                            "messages unconfirmed")
        self._fatal += self._gave_up
        self._ioloop.stop()

    def _on_open(self, connection) -> None:
        connection.channel(on_open_callback=self._guard(self._on_channel))

    def _on_channel(self, channel) -> None:
        self._channel = channel
        self._tag, self._lowest = 0, 1   # delivery tags start again on a new channel
        self._method_frames = {}         # frames carry the channel number
        self._body_max = self._connection._body_max_length   # pika's: frame_max - 8
        channel.add_on_close_callback(self._guard(self._on_channel_closed))
        channel.add_on_return_callback(self._guard(self._on_return))
        channel.confirm_delivery(ack_nack_callback=self._guard(self._on_confirm),
                                 callback=self._guard(self._on_confirm_mode))

    def _on_confirm_mode(self, _frame) -> None:
        if self._reconnect is not None:
            self._reconnect.recovered()
        self._last_progress = time.monotonic()
        if not self._checking:
            self._checking = True
            self._schedule_check()
        self._fill()

    def _on_channel_closed(self, _channel, reason: BaseException) -> None:
        # a lost connection closes the channel too: _on_close reports that
        if not self._done and isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            self._lost(f"the broker closed the channel: {_reason_text(reason)}")
        if self._connection is not None and self._connection.is_open:
            self._connection.close()

    def _on_close(self, _connection, reason: BaseException) -> None:
        if not self._done:
            if self._retry(f"the connection was lost: {_reason_text(reason)}"):
                return
            self._lost(f"the connection was lost: {_reason_text(reason)}")
        self._ioloop.stop()

    def _retry(self, why: str) -> bool:
        """Within option reconnectTimeout: connect again after a pause and publish what
        is unconfirmed again (its idempotency keys make a repeat a duplicate the bundled
        broker drops). False when the budget is spent or retrying is off."""
        if self._reconnect is None or self._failed:
            return False
        self._resend = sorted([*self._resend, *self._unconfirmed.values()],
                              key=lambda message: message.row)
        self._unconfirmed.clear()
        self._channel = None
        pause = self._reconnect.next_pause()
        if pause is None:
            self._unconfirmed = {n: m for n, m in enumerate(self._resend, 1)}  # to report
            self._resend = []
            self._gave_up = (f" (retried every node for {self._reconnect.timeout_s:g}s, "
                             "option 'reconnectTimeout': start the broker, then let Spark "
                             "retry the task or restart the query from its checkpoint)")
            return False
        reconnect_log.warning("%s: lost the broker at %s (%s); retrying every node of option 'uri' "
                    "in %.2fs (attempt %d), then publishing its %d unconfirmed messages "
                    "again", self._reconnect.what, self._node, why, pause,
                    self._reconnect.attempts, len(self._resend))
        self._ioloop.call_later(pause, self._guard(lambda: self._connect(0)))
        return True

    def _lost(self, what: str) -> None:
        self._done = True
        self._fatal = (f"{what}, with {len(self._unconfirmed)} of {self._published} "
                       f"published messages unconfirmed{self._gave_up}")

    # ------------------------------------------------------------ publishing

    def _fill(self) -> None:
        frames: list[bytes] = []     # this fill's messages, written to the socket at once
        sent = 0
        try:
            while ((self._resend or not self._exhausted) and not self._failed
                   and len(self._unconfirmed) < MAX_IN_FLIGHT):
                if self._resend:
                    message = self._resend.pop(0)
                else:
                    message = next(self._messages, None)
                    if message is None:
                        self._exhausted = True
                        break
                    self._published += 1
                try:
                    self._encode(message, frames)
                except (pika.exceptions.ShortStringTooLong,
                        pika.exceptions.UnsupportedAMQPFieldException) as error:
                    raise ValueError(f"row {message.row} of this task cannot be sent as an "
                                     f"AMQP message: {error!r} (exchange names, routing keys "
                                     "and string properties are at most 255 bytes)") from None
                self._tag += 1
                self._unconfirmed[self._tag] = message
                sent += 1
        finally:
            if sent:
                self._write(frames, sent)
        if (self._exhausted or self._failed) and not self._unconfirmed and not self._resend:
            self._finish()

    def _encode(self, message: Outgoing, frames: list[bytes]) -> None:
        """Append the basic.publish, content header and body frames of `message`: the
        bytes pika's `basic_publish` would send (tests/connector/test_sink.py holds them
        equal), without its three frame objects and three socket writes per message."""
        key = (message.exchange, message.routing_key)
        method = self._method_frames.get(key)
        if method is None:
            method = pika.frame.Method(self._channel.channel_number, pika.spec.Basic.Publish(
                exchange=message.exchange, routing_key=message.routing_key,
                mandatory=self._mandatory)).marshal()
            if len(self._method_frames) < METHOD_FRAMES_KEPT:
                self._method_frames[key] = method
        properties = message.properties.encode()
        body = message.body
        size = len(body)
        frames.append(method)
        frames.append(_HEADER_START(FRAME_HEADER, self._channel.channel_number,
                                    _PROPERTIES_START.size + sum(map(len, properties)),
                                    pika.spec.BasicProperties.INDEX, size))
        frames.extend(properties)
        frames.append(FRAME_END)
        if size <= self._body_max:
            if size:
                frames.append(_FRAME_START(FRAME_BODY, self._channel.channel_number, size))
                frames.append(body)
                frames.append(FRAME_END)
            return
        for start in range(0, size, self._body_max):
            chunk = body[start:start + self._body_max]
            frames.append(_FRAME_START(FRAME_BODY, self._channel.channel_number, len(chunk)))
            frames.append(chunk)
            frames.append(FRAME_END)

    def _write(self, frames: list[bytes], messages: int) -> None:
        """One write of a fill's frames. pika's own `basic_publish` passes each frame to
        its transport separately, which sends each with a syscall of its own: three per
        message, most of a confirmed publisher's client CPU (bench/README.md,
        `connector_sink.py`). The frames go through the method `basic_publish` ends in
        (`_output_marshaled_frames`: counts bytes and frames, hands them to the transport)."""
        if not self._channel.is_open:   # what basic_publish would refuse
            raise pika.exceptions.ChannelWrongStateError("the channel is not open")
        self._connection._output_marshaled_frames([b"".join(frames)])

    def _on_confirm(self, frame) -> None:
        method = frame.method
        nacked = isinstance(method, pika.spec.Basic.Nack)
        tags = (range(self._lowest, method.delivery_tag + 1) if method.multiple
                else (method.delivery_tag,))
        for tag in tags:
            message = self._unconfirmed.pop(tag, None)
            if message is not None and nacked:
                self._failed.append(_Failed(message.row, message.exchange,
                                            message.routing_key, "nack"))
        while self._lowest <= self._tag and self._lowest not in self._unconfirmed:
            self._lowest += 1
        self._last_progress = time.monotonic()
        self._fill()

    def _on_return(self, _channel, method, properties, _body) -> None:
        self._failed.append(_Failed(self._returned_row(properties), method.exchange,
                                    method.routing_key,
                                    f"{method.reply_code} {method.reply_text}"))

    def _schedule_check(self) -> None:
        self._ioloop.call_later(min(1.0, self._timeout / 4), self._guard(self._check))

    def _check(self) -> None:
        if self._done:
            return
        waited = time.monotonic() - self._last_progress
        if self._unconfirmed and waited > self._timeout:
            self._fatal = (f"no publisher confirm arrived for {waited:.0f}s (option "
                           f"'confirmTimeout' is {self._timeout:g}s) with "
                           f"{len(self._unconfirmed)} messages unconfirmed")
            self._finish()
            return
        self._schedule_check()

    def _finish(self) -> None:
        if self._finishing:
            return
        self._done = self._finishing = True
        if self._connection is not None and self._connection.is_open:
            self._connection.close()
            # a broker that stopped reading (alarm, hang) never answers close: do not wait
            self._ioloop.call_later(CLOSE_GRACE_S, self._ioloop.stop)
        else:
            self._ioloop.stop()

    def _guard(self, callback: Callable) -> Callable:
        """pika callbacks must not raise into the ioloop: keep the error, close, re-raise."""

        def guarded(*args):
            try:
                callback(*args)
            except BaseException as error:  # noqa: BLE001 - re-raised by run()
                if self._error is None:
                    self._error = error
                self._finish()

        return guarded

    # ------------------------------------------------------------ reporting

    def _describe_failure(self) -> str:
        parts = []
        nacked = [f for f in self._failed if f.reason == "nack"]
        returned = [f for f in self._failed if f.reason != "nack"]
        if nacked:
            parts.append(f"the broker nacked {len(nacked)} message(s) ({_rows(nacked)}); a "
                         "queue refused them (for example x-overflow reject-publish at its "
                         "length limit): make room in the queue or raise its limit")
        if returned:
            first = returned[0]
            parts.append(f"{len(returned)} mandatory message(s) could not be routed "
                         f"({_rows(returned)}; first: exchange '{first.exchange}', routing "
                         f"key '{first.routing_key}': {first.reason}): bind a queue for "
                         "that routing key, or fix option 'routingKey' or column "
                         "'routing_key'")
        if self._fatal:
            parts.append(self._fatal)
        return (f"quorumqueue sink: {'; '.join(parts)}. {self._published} message(s) of "
                "this task were published; Spark fails the task (and retries it, if "
                "allowed): the bundled broker drops messages an earlier attempt stored, "
                "other brokers may receive them twice")


def _rows(failed: list[_Failed]) -> str:
    rows = sorted({f.row for f in failed if f.row is not None})
    shown = ", ".join(str(row) for row in rows[:SHOWN_ROWS])
    more = f" and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
    return f"rows {shown}{more} of this task's partition" if rows else "rows unknown"


def _reason_text(reason: BaseException) -> str:
    if isinstance(reason, (pika.exceptions.ChannelClosed, pika.exceptions.ConnectionClosed)):
        return f"{reason.reply_code} {reason.reply_text}"
    return repr(reason)

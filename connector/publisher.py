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

    The iterator may also yield an `OutgoingRun`: consecutive rows sharing exchange,
    routing key and all properties but their seq (sink_rows.py, `BodyRun`), which
    encodes its frames for all its rows at once, column-wise; a fill then writes a
    slice of that buffer, with no Python work per message. A run that cannot be
    encoded at once (a body above the frame size) is published row by row.

    To the bundled broker (its `product` server property is "quorumqueue") a run
    that can (`OutgoingRun.batched`: sink_rows.py's `BatchedBodyRun`) goes as batch
    publishes: each unit is one basic.publish of many rows, which the broker cuts
    into their messages (docs/behaviour/idempotent-publishing.md, "Batch publish"),
    with one delivery tag; the window is then `MAX_IN_FLIGHT_BATCHED` rows. Any
    other broker gets every row as a message of its own.

    Delivery tags are 1, 2, 3... in publish order on a fresh channel, so the
    unconfirmed messages are spans of consecutive tags (`_Span`: a message, or rows
    of a run, or batch publishes of a run), oldest first: a multiple ack drops whole
    spans and trims one, a single ack or nack splits the span holding its tag. A basic.return carries no tag; `returned_row` (given by the
    caller) finds the row from the returned properties. The broker acks a returned
    message right after returning it, so a return is recorded as that row's failure.

Invariants
    - At most `MAX_IN_FLIGHT` rows are unconfirmed at any time (`MAX_IN_FLIGHT_BATCHED`
      plus one batch when they go as batch publishes).
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

import itertools
import struct
import time
from collections import deque
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
# unconfirmed rows per task when they go as batch publishes (the bundled broker): a few
# batches' worth, so the broker always has the next batch while it confirms one
MAX_IN_FLIGHT_BATCHED = 4000
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


class OutgoingRun:
    """Messages of rows `first_row`, `first_row + 1`, ... (`count` of them) to one
    exchange and routing key, which encode their frames together."""

    first_row: int
    count: int          # units: rows, or batch publishes (`is_batch`)
    exchange: str
    routing_key: str
    is_batch = False    # each unit is a batch publish of many rows (`row_range`)

    def frames(self, method: bytes, channel: int, body_max: int
               ) -> tuple[memoryview, Sequence[int]] | None:
        """The frames of every row (each row's: `method`, its content header, its
        body frame) in one buffer and the `count + 1` offsets where each row's
        frames start (and the last ends); None if a body exceeds `body_max`. Called
        for every slice sent: the run keeps what it encoded for the same arguments."""
        raise NotImplementedError

    def messages(self, start: int, stop: int) -> Iterator[Outgoing]:
        """The rows of units `start` to `stop` one by one."""
        raise NotImplementedError

    def row_range(self, start: int, stop: int) -> tuple[int, int]:
        """The rows (indices in the run) that units `start` to `stop` carry: the same
        numbers, unless a unit is a batch publish of many rows."""
        return start, stop

    def units_within(self, start: int, rows: int) -> int:
        """How many units from `start` carry at most `rows` rows (at least one)."""
        return max(1, min(rows, self.count - start))

    def batched(self) -> "OutgoingRun | None":
        """The same rows as batch publishes (one basic.publish of many rows each, the
        bundled broker's own form), or None when this run cannot be sent so."""
        return None


# the header of a batch publish holding its row count (sink_rows.py, the bundled broker's
# form: docs/behaviour/idempotent-publishing.md, "Batch publish")
BATCH_HEADER = "x-quorumqueue-batch"


class _Span(NamedTuple):
    """Unconfirmed tags `first_tag` .. `first_tag + stop - start - 1`: messages
    `start` to `stop` of a list, or units `start` to `stop` of a run (a row each, or
    a batch publish of many: `OutgoingRun.row_range`)."""

    first_tag: int
    source: list[Outgoing] | OutgoingRun
    start: int
    stop: int

    def first_row(self) -> int:
        source = self.source
        return (source[self.start].row if isinstance(source, list)
                else source.first_row + source.row_range(self.start, self.stop)[0])

    def rows(self) -> int:
        if isinstance(self.source, list):
            return self.stop - self.start
        first, last = self.source.row_range(self.start, self.stop)
        return last - first

    def failed(self, reason: str) -> Iterator[_Failed]:
        source = self.source
        if isinstance(source, list):
            return (_Failed(message.row, message.exchange, message.routing_key, reason)
                    for message in source[self.start:self.stop])
        return (_Failed(source.first_row + index, source.exchange, source.routing_key, reason)
                for index in range(*source.row_range(self.start, self.stop)))


class PublishError(RuntimeError):
    """The broker did not confirm every message; the message says what and why."""


class _Failed(NamedTuple):
    row: int | None
    exchange: str
    routing_key: str
    reason: str     # "nack", "nack in a batch" or the return's reply text


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
        self._messages: Iterator[Outgoing | OutgoingRun] = iter(())
        self._run: OutgoingRun | None = None         # taken from the iterator, not all sent
        self._run_next = 0                           # its first row not yet sent
        self._peeked: Outgoing | OutgoingRun | None = None  # taken from the iterator, not used yet
        self._exhausted = False
        self._published = 0                          # messages taken from the iterator
        self._tag = 0                                # the channel's last delivery tag
        self._unconfirmed: deque[_Span] = deque()    # by tag; spans never overlap
        self._in_flight = 0                          # rows in _unconfirmed
        self._batching = False                       # the broker takes batch publishes
        self._method_frames: dict[tuple[str, str], bytes] = {}  # (exchange, key) -> frame
        self._body_max = 0                           # body bytes per frame, once connected
        self._resend: list[_Span] = []               # unconfirmed on a lost connection
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
        if self._in_flight:
            self._fatal += (f", with {self._in_flight} of {self._published} published "
                            "messages unconfirmed")
        self._fatal += self._gave_up
        self._ioloop.stop()

    def _on_open(self, connection) -> None:
        connection.channel(on_open_callback=self._guard(self._on_channel))

    def _on_channel(self, channel) -> None:
        self._channel = channel
        self._tag = 0                    # delivery tags start again on a new channel
        self._method_frames = {}         # frames carry the channel number
        self._body_max = self._connection._body_max_length   # pika's: frame_max - 8
        product = (self._connection.server_properties or {}).get("product")
        self._batching = product in ("quorumqueue", b"quorumqueue")  # the bundled broker
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
        self._resend = sorted([*self._resend, *self._unconfirmed], key=_Span.first_row)
        self._unconfirmed.clear()
        self._channel = None
        pause = self._reconnect.next_pause()
        if pause is None:
            self._unconfirmed = deque(self._resend)  # to report
            self._in_flight = sum(span.rows() for span in self._resend)
            self._resend = []
            self._gave_up = (f" (retried every node for {self._reconnect.timeout_s:g}s, "
                             "option 'reconnectTimeout': start the broker, then let Spark "
                             "retry the task or restart the query from its checkpoint)")
            return False
        reconnect_log.warning("%s: lost the broker at %s (%s); retrying every node of option 'uri' "
                    "in %.2fs (attempt %d), then publishing its %d unconfirmed messages "
                    "again", self._reconnect.what, self._node, why, pause,
                    self._reconnect.attempts, self._in_flight)
        self._in_flight = 0
        self._ioloop.call_later(pause, self._guard(lambda: self._connect(0)))
        return True

    def _lost(self, what: str) -> None:
        self._done = True
        self._fatal = (f"{what}, with {self._in_flight} of {self._published} "
                       f"published messages unconfirmed{self._gave_up}")

    # ------------------------------------------------------------ publishing

    def _fill(self) -> None:
        frames: list = []     # this fill's messages, written to the socket at once
        sent = 0
        try:
            window = MAX_IN_FLIGHT_BATCHED if self._batching else MAX_IN_FLIGHT
            while not self._failed and self._in_flight < window:
                span = self._next_span(window - self._in_flight, frames)
                if span is None:
                    break
                rows = span.rows()
                self._unconfirmed.append(span)
                self._tag += span.stop - span.start
                self._in_flight += rows
                sent += rows
        finally:
            if sent:
                self._write(frames, sent)
        if ((self._exhausted or self._failed) and not self._in_flight
                and not self._resend):
            self._finish()

    def _next_span(self, room: int, frames: list) -> _Span | None:
        """Append the frames of the next messages to send (at most `room` rows, at
        least one unit: a row, or a batch publish): what a lost connection left
        unconfirmed first, then the rest of the current run, then the iterator's
        next. None when there is nothing left."""
        tag = self._tag + 1
        while self._resend:
            span = self._resend[0]
            if not isinstance(span.source, list) and (
                    (span.source.is_batch and not self._batching)
                    or self._frames(span.source) is None):
                # frames of another frame size, or batches for a broker that takes
                # none: send those rows one by one
                rows = list(span.source.messages(span.start, span.stop))
                self._resend[0] = _Span(0, rows, 0, len(rows))
                continue
            if isinstance(span.source, list):  # rows alone: MAX_IN_FLIGHT of them at most
                room = min(room, MAX_IN_FLIGHT - self._in_flight)
                if room < 1:
                    return None
            stop = min(span.stop, span.start + _units(span.source, span.start, room))
            if stop == span.stop:
                del self._resend[0]
            else:
                self._resend[0] = span._replace(start=stop)
            self._encode_span(span.source, span.start, stop, frames)
            return _Span(tag, span.source, span.start, stop)
        while self._run is None:
            source = self._peeked or next(self._messages, None)
            self._peeked = None
            if source is None:
                self._exhausted = True
                return None
            if isinstance(source, Outgoing):  # rows alone: MAX_IN_FLIGHT of them at most
                room = min(room, MAX_IN_FLIGHT - self._in_flight)
                if room < 1:
                    self._peeked = source
                    return None
                return self._next_messages(tag, source, room, frames)
            batched = source.batched() if self._batching else None
            if batched is not None:
                source = batched
            if self._frames(source) is not None:
                self._run, self._run_next = source, 0
            else:   # a body above the frame size: the run's rows one by one
                self._messages = itertools.chain(source.messages(0, source.count),
                                                 self._messages)
        run, start = self._run, self._run_next
        stop = min(run.count, start + _units(run, start, room))
        self._run_next = stop
        if stop == run.count:
            self._run = None
        first, last = run.row_range(start, stop)
        self._published += last - first
        self._encode_span(run, start, stop, frames)
        return _Span(tag, run, start, stop)

    def _next_messages(self, tag: int, first: Outgoing, room: int, frames: list) -> _Span:
        """`first` and the messages after it, up to `room` or a run: one span."""
        chunk = [first]
        self._encode(first, frames)
        try:
            while len(chunk) < room:
                message = next(self._messages, None)
                if message is None:
                    self._exhausted = True
                    break
                if not isinstance(message, Outgoing):
                    self._peeked = message
                    break
                self._encode(message, frames)
                chunk.append(message)
        finally:
            self._published += len(chunk)
        return _Span(tag, chunk, 0, len(chunk))

    def _encode_span(self, source: list[Outgoing] | OutgoingRun, start: int, stop: int,
                     frames: list) -> None:
        if isinstance(source, list):
            for message in source[start:stop]:
                self._encode(message, frames)
        else:
            buffer, offsets = self._frames(source)
            frames.append(buffer[offsets[start]:offsets[stop]])

    def _frames(self, run: OutgoingRun) -> tuple[memoryview, Sequence[int]] | None:
        return run.frames(self._method_frame(run.exchange, run.routing_key),
                          self._channel.channel_number, self._body_max)

    def _method_frame(self, exchange: str, routing_key: str) -> bytes:
        key = (exchange, routing_key)
        method = self._method_frames.get(key)
        if method is None:
            method = pika.frame.Method(self._channel.channel_number, pika.spec.Basic.Publish(
                exchange=exchange, routing_key=routing_key,
                mandatory=self._mandatory)).marshal()
            if len(self._method_frames) < METHOD_FRAMES_KEPT:
                self._method_frames[key] = method
        return method

    def _encode(self, message: Outgoing, frames: list[bytes]) -> None:
        """Append the basic.publish, content header and body frames of `message`: the
        bytes pika's `basic_publish` would send (tests/connector/test_sink.py holds them
        equal), without its three frame objects and three socket writes per message."""
        try:
            method = self._method_frame(message.exchange, message.routing_key)
            properties = message.properties.encode()
        except (pika.exceptions.ShortStringTooLong,
                pika.exceptions.UnsupportedAMQPFieldException) as error:
            raise ValueError(f"row {message.row} of this task cannot be sent as an AMQP "
                             f"message: {error!r} (exchange names, routing keys and string "
                             "properties are at most 255 bytes)") from None
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
        settled = (self._settle_through(method.delivery_tag) if method.multiple
                   else self._settle_one(method.delivery_tag))
        if isinstance(method, pika.spec.Basic.Nack):
            for span in settled:
                # a batch publish is nacked whole: its rows before the refused one are
                # stored (docs/behaviour/idempotent-publishing.md, "Batch publish")
                self._failed.extend(span.failed("nack in a batch" if getattr(
                    span.source, "is_batch", False) else "nack"))
        self._last_progress = time.monotonic()
        self._fill()

    def _settle_through(self, tag: int) -> list[_Span]:
        """Take every unconfirmed tag up to `tag` (a multiple ack or nack)."""
        settled = []
        spans = self._unconfirmed
        while spans and spans[0].first_tag <= tag:
            span = spans[0]
            last = span.first_tag + span.stop - span.start - 1
            if last <= tag:
                spans.popleft()
                settled.append(span)
            else:   # the span goes on past the tag: keep its rest
                split = span.start + tag - span.first_tag + 1
                settled.append(span._replace(stop=split))
                spans[0] = _Span(tag + 1, span.source, split, span.stop)
        self._in_flight -= sum(span.rows() for span in settled)
        return settled

    def _settle_one(self, tag: int) -> list[_Span]:
        """Take `tag` alone (a single ack or nack), splitting the span holding it."""
        spans = self._unconfirmed
        for at, span in enumerate(spans):
            if span.first_tag <= tag < span.first_tag + span.stop - span.start:
                index = span.start + tag - span.first_tag
                del spans[at]
                if index + 1 < span.stop:
                    spans.insert(at, _Span(tag + 1, span.source, index + 1, span.stop))
                if span.start < index:
                    spans.insert(at, span._replace(stop=index))
                settled = _Span(tag, span.source, index, index + 1)
                self._in_flight -= settled.rows()
                return [settled]
        return []

    def _on_return(self, _channel, method, properties, _body) -> None:
        """A returned message, or a returned batch publish (its header counts its
        rows, from the row its seq names): each row is named in the error."""
        row = self._returned_row(properties)
        count = (properties.headers or {}).get(BATCH_HEADER)
        rows = ([row + k for k in range(count)]
                if row is not None and isinstance(count, int) and count > 0 else [row])
        reason = f"{method.reply_code} {method.reply_text}"
        self._failed.extend(_Failed(each, method.exchange, method.routing_key, reason)
                            for each in rows)

    def _schedule_check(self) -> None:
        self._ioloop.call_later(min(1.0, self._timeout / 4), self._guard(self._check))

    def _check(self) -> None:
        if self._done:
            return
        waited = time.monotonic() - self._last_progress
        if self._in_flight and waited > self._timeout:
            self._fatal = (f"no publisher confirm arrived for {waited:.0f}s (option "
                           f"'confirmTimeout' is {self._timeout:g}s) with "
                           f"{self._in_flight} messages unconfirmed")
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
        nacked = [f for f in self._failed if f.reason.startswith("nack")]
        returned = [f for f in self._failed if not f.reason.startswith("nack")]
        if nacked:
            batched = any(f.reason == "nack in a batch" for f in nacked)
            refused = ("a queue refused them, or in a batch publish at least one of them "
                       "(the broker nacks a batch whole; its rows before the first refused "
                       "one are stored)" if batched else "a queue refused them")
            parts.append(f"the broker nacked {len(nacked)} message(s) ({_rows(nacked)}); "
                         f"{refused} (for example x-overflow reject-publish at its "
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


def _units(source: list[Outgoing] | OutgoingRun, start: int, rows: int) -> int:
    """How many units of `source` from `start` carry at most `rows` rows (at least 1)."""
    if isinstance(source, list):
        return max(1, rows)
    return source.units_within(start, rows)


def _rows(failed: list[_Failed]) -> str:
    rows = sorted({f.row for f in failed if f.row is not None})
    shown = ", ".join(str(row) for row in rows[:SHOWN_ROWS])
    more = f" and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
    return f"rows {shown}{more} of this task's partition" if rows else "rows unknown"


def _reason_text(reason: BaseException) -> str:
    if isinstance(reason, (pika.exceptions.ChannelClosed, pika.exceptions.ConnectionClosed)):
        return f"{reason.reply_code} {reason.reply_text}"
    return repr(reason)

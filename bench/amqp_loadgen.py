"""A minimal raw-asyncio AMQP 0-9-1 load generator: publish, then consume.

Responsibilities
    Drive one broker through the throughput benchmark's two phases on one
    connection and measure them: (1) publish ``messages`` persistent messages
    to a fresh durable queue -- classic, or quorum (``x-queue-type``) -- with
    publisher confirms, at most ``inflight`` unconfirmed; (2) consume them
    with manual acks, prefetch ``prefetch``, acking ``multiple=true`` every
    half prefetch. Then prove that every message was confirmed and consumed
    exactly once.

How it works
    One ``asyncio.Protocol``; no client library. Writes come from the
    pre-encoded ``PublishBlock`` (only 8-byte sequence numbers are patched);
    ``data_received`` walks the frames with ``struct.unpack_from`` and handles
    the hot ones inline -- basic.ack (confirms), basic.deliver, content
    header, body -- without building objects. Setup methods are simple
    request/reply steps (``call``). Anything unexpected fails the run, named
    via pamqp when it can decode it. Heartbeats are negotiated off.

    It is light on purpose: per message the publisher does one ``pack_into``
    and the consumer one ``unpack_from`` for the sequence number plus a few for
    frame headers; writes are ~1 MB batches. ``PhaseResult.generator_cpu_s``
    (``time.process_time``) shows how much of the run the generator itself
    used, i.e. that the broker, not the generator, set the pace.

Invariants
    - Publisher: ``published - confirmed <= inflight`` at all times.
    - Consumer: a delivery's sequence number is seen at most once, none is
      redelivered, and after the consumer channel is closed (acks processed
      first, AMQP 0-9-1 section 4.7) a passive declare finds the queue empty
      (a quorum queue within ``QUORUM_SETTLE_TIMEOUT_S``: its settles and the
      consumer's removal go through its log).
    - Any nack, return, cancel, channel or connection close is an error, and
      so is a request/reply step unanswered for ``REPLY_TIMEOUT_S``.

Not here
    Broker start/stop (``bench.brokers``), the command line and the report
    (``bench/amqp_throughput.py``). The steps (``connect``,
    ``declare_fresh_queue``, ``publish_all``, ``consume_all``,
    ``delete_and_close``) are public so that ``bench/quorum_memory.py`` can
    publish without consuming.
"""

from __future__ import annotations

import asyncio
import secrets
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench import amqp_wire as wire

PUBLISH_CHANNEL = 1  # also used for queue declare / delete (in confirm mode)
CONSUME_CHANNEL = 2
QUEUE_TYPES = ("classic", "quorum")
QUORUM_SETTLE_TIMEOUT_S = 10.0  # see _expect_empty
REPLY_TIMEOUT_S = 60.0  # a request/reply step (handshake, declare, ...) that hangs fails the run

_HEADER = wire.FRAME_HEADER_STRUCT.unpack_from
_METHOD_ID = wire.METHOD_ID_STRUCT.unpack_from
_SEQUENCE = wire.SEQUENCE_STRUCT.unpack_from
_TAG_AND_BITS = struct.Struct(">QB").unpack_from  # basic.ack / basic.deliver
_BODY_SIZE = struct.Struct(">Q").unpack_from


class LoadError(RuntimeError):
    """The broker misbehaved or the exactly-once check failed."""


@dataclass(frozen=True, slots=True)
class LoadSettings:
    host: str
    port: int
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    messages: int = 100_000
    size: int = 1024
    inflight: int = 1000
    prefetch: int = 1000
    queue_type: str = "classic"  # one of QUEUE_TYPES
    message_ttl: int | None = None  # x-message-ttl of the declared queue (ms), if any
    ssl: object | None = None  # an ssl.SSLContext: connect over TLS (tls_throughput.py)

    def __post_init__(self) -> None:
        if self.queue_type not in QUEUE_TYPES:
            raise ValueError(f"queue_type must be one of {', '.join(QUEUE_TYPES)}, not {self.queue_type!r}")


def declare_arguments(queue_type: str) -> dict[str, object]:
    """queue.declare's x-arguments for a queue type (quorum queues must be durable)."""
    if queue_type not in QUEUE_TYPES:
        raise ValueError(f"queue type must be one of {', '.join(QUEUE_TYPES)}, not {queue_type!r}")
    return {} if queue_type == "classic" else {"x-queue-type": queue_type}


@dataclass(frozen=True, slots=True)
class PhaseResult:
    messages: int
    wall_s: float
    generator_cpu_s: float  # time.process_time() of this process during the phase

    @property
    def rate(self) -> float:
        return self.messages / self.wall_s

    @property
    def generator_cpu_share(self) -> float:
        return self.generator_cpu_s / self.wall_s


@dataclass(frozen=True, slots=True)
class LoadResult:
    publish: PhaseResult
    consume: PhaseResult
    queue: str


Progress = Callable[[str, int, int, float], None]  # phase, done, total, seconds in phase


class _Generator(asyncio.Protocol):
    """Connection state plus the two hot loops; driven by ``run_load``."""

    def __init__(self, settings: LoadSettings) -> None:
        self.settings = settings
        self.transport: asyncio.Transport | None = None
        self.frame_max = 131072  # as tuned by ``connect``
        self.failure: BaseException | None = None
        self._pending = bytearray()  # bytes of an incomplete frame
        self._waiters: dict[int, tuple[tuple[int, int], asyncio.Future[bytes]]] = {}
        self._phase_done: asyncio.Future[None] | None = None
        self.phase_started = 0.0  # time.perf_counter() when the current phase began
        self.blocked = False
        # publisher
        self.block: wire.PublishBlock | None = None
        self.published = 0
        self.confirmed = 0
        self._confirmed_upto = 0  # every tag <= this is confirmed
        self._single_confirms: set[int] = set()  # confirmed tags > _confirmed_upto
        self._top_up_at = max(1, settings.inflight // 10)
        # consumer
        self.consuming = False
        self.consumed = 0
        self._seen = bytearray(settings.messages)
        self._body_left = 0  # bytes of the current message's body still due
        self._first_body_frame = False
        self._delivering_tag = 0  # tag of the message whose content is arriving
        self._last_tag = 0  # tag of the last message received in full
        self._acked_tag = 0
        self._ack_every = max(1, settings.prefetch // 2)

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(LoadError(f"connection lost: {exc or 'closed by the broker'}"), only_if_running=True)

    def data_received(self, data: bytes) -> None:  # noqa: C901 - the hot loop, kept inline
        pending = self._pending
        if pending:
            pending += data
            view: bytes | bytearray = pending
        else:
            view = data
        end = len(view)
        position = 0
        try:
            while end - position >= wire.FRAME_OVERHEAD:
                frame_type, channel, size = _HEADER(view, position)
                payload = position + 7
                frame_end = payload + size
                if frame_end >= end:
                    break
                if view[frame_end] != wire.FRAME_END:
                    raise LoadError(f"frame without frame-end octet (type {frame_type}, channel {channel})")
                position = frame_end + 1
                if frame_type == wire.FRAME_BODY:
                    if self._first_body_frame:
                        self._first_body_frame = False
                        (sequence,) = _SEQUENCE(view, payload)
                        if sequence >= len(self._seen) or self._seen[sequence]:
                            raise LoadError(f"message {sequence} delivered twice or never published")
                        self._seen[sequence] = 1
                    self._body_left -= size
                    if self._body_left == 0:
                        self.consumed += 1
                        self._last_tag = self._delivering_tag
                    continue
                if frame_type == wire.FRAME_HEADER:
                    (self._body_left,) = _BODY_SIZE(view, payload + 4)
                    self._first_body_frame = True
                    continue
                if frame_type == wire.FRAME_METHOD:
                    method = _METHOD_ID(view, payload)
                    if method == wire.BASIC_DELIVER:
                        tag_at = payload + 5 + view[payload + 4]  # skip consumer tag
                        tag, flags = _TAG_AND_BITS(view, tag_at)
                        if flags & 1:
                            raise LoadError(f"delivery {tag} is a redelivery")
                        self._delivering_tag = tag
                    elif method == wire.BASIC_ACK:
                        tag, flags = _TAG_AND_BITS(view, payload + 4)
                        self._on_confirm(tag, multiple=bool(flags & 1))
                    else:
                        self._on_method(channel, method, bytes(view[payload + 4 : frame_end]))
                    continue
                if frame_type != wire.FRAME_HEARTBEAT:
                    raise LoadError(f"unexpected frame type {frame_type} on channel {channel}")
        except LoadError as error:
            self._fail(error)
            return
        if pending:
            del pending[:position]
        elif position < end:
            pending += data[position:]
        if self.block is not None:
            self._publish_more()
        elif self.consuming:
            self._ack_consumed()

    # -- publisher ------------------------------------------------------------------------

    def start_publishing(self, block: wire.PublishBlock) -> asyncio.Future[None]:
        self.block = block
        self.phase_started = time.perf_counter()
        self._phase_done = asyncio.get_running_loop().create_future()
        self._publish_more()
        return self._phase_done

    def _publish_more(self) -> None:
        block = self.block
        assert block is not None and self.transport is not None
        remaining = self.settings.messages - self.published
        room = self.settings.inflight - (self.published - self.confirmed)
        batch = min(room, remaining)
        if batch <= 0 or (batch < self._top_up_at and batch < remaining):
            return
        while batch > 0:
            step = min(batch, block.count)
            self.transport.write(block.stamp(self.published, step))
            self.published += step
            batch -= step

    def _on_confirm(self, tag: int, *, multiple: bool) -> None:
        if tag > self.published or tag <= self._confirmed_upto:
            raise LoadError(f"confirm for delivery tag {tag}: not outstanding")
        if multiple:
            singles = {single for single in self._single_confirms if single <= tag} if self._single_confirms else set()
            self.confirmed += tag - self._confirmed_upto - len(singles)
            self._single_confirms -= singles
            self._confirmed_upto = tag
        elif tag not in self._single_confirms:
            self._single_confirms.add(tag)
            self.confirmed += 1
        if self.confirmed == self.settings.messages and self._phase_done and not self._phase_done.done():
            self.block = None
            self._phase_done.set_result(None)

    # -- consumer ---------------------------------------------------------------------------

    def start_consuming(self) -> asyncio.Future[None]:
        self.consuming = True
        self.phase_started = time.perf_counter()
        self._phase_done = asyncio.get_running_loop().create_future()
        return self._phase_done

    def _ack_consumed(self) -> None:
        assert self.transport is not None
        finished = self.consumed == self.settings.messages
        if self._last_tag - self._acked_tag >= self._ack_every or (finished and self._last_tag > self._acked_tag):
            self.transport.write(wire.basic_ack(CONSUME_CHANNEL, self._last_tag, multiple=True))
            self._acked_tag = self._last_tag
        if finished and self._phase_done and not self._phase_done.done():
            self.consuming = False
            self._phase_done.set_result(None)

    # -- everything else: request/reply steps -------------------------------------------------

    async def call(self, channel: int, frame: bytes | None, expect: tuple[int, int]) -> bytes:
        """Send ``frame`` (if any) and return the arguments of the ``expect`` reply."""
        assert self.transport is not None
        if self.failure:
            raise self.failure
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiters[channel] = (expect, reply)
        if frame:
            self.transport.write(frame)
        try:
            return await asyncio.wait_for(reply, REPLY_TIMEOUT_S)
        except TimeoutError:
            self._waiters.pop(channel, None)
            raise LoadError(
                f"no reply {expect[0]}.{expect[1]} on channel {channel} within {REPLY_TIMEOUT_S:.0f} s"
            ) from None

    def _on_method(self, channel: int, method: tuple[int, int], arguments: bytes) -> None:
        waiter = self._waiters.get(channel)
        if waiter and waiter[0] == method:
            del self._waiters[channel]
            if not waiter[1].done():
                waiter[1].set_result(arguments)
            return
        match method:
            case wire.CONNECTION_BLOCKED:
                self.blocked = True
                print("  broker blocked the connection (resource alarm)", file=sys.stderr)
            case wire.CONNECTION_UNBLOCKED:
                self.blocked = False
            case wire.CONNECTION_CLOSE:
                raise LoadError(f"broker closed the connection: {wire.read_close(arguments)}")
            case wire.CHANNEL_CLOSE:
                raise LoadError(f"broker closed channel {channel}: {wire.read_close(arguments)}")
            case _:
                raise LoadError(f"unexpected {_describe(method, arguments, channel)} on channel {channel}")

    def _fail(self, error: BaseException, *, only_if_running: bool = False) -> None:
        if self.failure is None and not (only_if_running and self._finished()):
            self.failure = error
        for _, reply in self._waiters.values():
            if not reply.done():
                reply.set_exception(error)
        self._waiters.clear()
        if self._phase_done and not self._phase_done.done():
            self._phase_done.set_exception(error)
        if self.transport and not only_if_running:
            self.transport.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def never_delivered(self) -> int:
        return self.settings.messages - sum(self._seen)

    def _finished(self) -> bool:
        return self._phase_done is not None and self._phase_done.done() and not self._waiters


def _describe(method: tuple[int, int], arguments: bytes, channel: int) -> str:
    """Name a method via pamqp (the rare path only)."""
    from pamqp import frame as pamqp_frame

    payload = wire.METHOD_ID_STRUCT.pack(*method) + arguments
    raw = struct.pack(">BHI", wire.FRAME_METHOD, channel, len(payload)) + payload + wire.FRAME_END_BYTE
    try:
        _, _, decoded = pamqp_frame.unmarshal(raw)
        return repr(decoded)
    except Exception:  # pamqp could not decode it either: show the ids
        return f"method {method[0]}.{method[1]}"


async def _progress_reporter(generator: _Generator, report: Progress, total: int) -> None:
    while True:
        await asyncio.sleep(1.0)
        elapsed = time.perf_counter() - generator.phase_started
        if generator.block is not None:
            report("publish", generator.confirmed, total, elapsed)
        elif generator.consuming:
            report("consume", generator.consumed, total, elapsed)


# -- the steps of a run (run_load composes them; bench/quorum_memory.py uses a few) --------


async def connect(settings: LoadSettings) -> _Generator:
    """A connection after the handshake, with the publish channel open."""
    loop = asyncio.get_running_loop()
    transport, generator = await loop.create_connection(
        lambda: _Generator(settings), settings.host, settings.port, ssl=settings.ssl,
        server_hostname=settings.host if settings.ssl is not None else None)
    try:
        start = generator.call(0, None, wire.CONNECTION_START)
        transport.write(wire.PROTOCOL_HEADER)
        await start
        tune = await generator.call(0, wire.start_ok(settings.user, settings.password), wire.CONNECTION_TUNE)
        channel_max, frame_max, _heartbeat = wire.read_tune(tune)
        generator.frame_max = min(frame_max or 131072, 131072)
        transport.write(wire.tune_ok(channel_max or 2047, generator.frame_max))
        await generator.call(0, wire.connection_open(settings.vhost), wire.CONNECTION_OPEN_OK)
        await generator.call(PUBLISH_CHANNEL, wire.channel_open(PUBLISH_CHANNEL), wire.CHANNEL_OPEN_OK)
    except BaseException:
        transport.close()
        raise
    return generator


async def declare_fresh_queue(generator: _Generator, prefix: str = "bench-throughput") -> str:
    """A new durable queue of ``settings.queue_type``, checked empty; confirms on."""
    queue = f"{prefix}-{secrets.token_hex(4)}"
    arguments = declare_arguments(generator.settings.queue_type)
    if generator.settings.message_ttl is not None:
        arguments["x-message-ttl"] = generator.settings.message_ttl
    declare = wire.queue_declare(PUBLISH_CHANNEL, queue, durable=True, arguments=arguments)
    declared = await generator.call(PUBLISH_CHANNEL, declare, wire.QUEUE_DECLARE_OK)
    if wire.read_declare_ok(declared) != (queue, 0, 0):
        raise LoadError(f"fresh queue {queue} is not fresh: {wire.read_declare_ok(declared)}")
    await generator.call(PUBLISH_CHANNEL, wire.confirm_select(PUBLISH_CHANNEL), wire.CONFIRM_SELECT_OK)
    return queue


async def queue_counts(generator: _Generator, queue: str) -> tuple[int, int]:
    """(messages ready, consumers) from a passive queue.declare."""
    declared = await generator.call(
        PUBLISH_CHANNEL, wire.queue_declare(PUBLISH_CHANNEL, queue, passive=True), wire.QUEUE_DECLARE_OK
    )
    _, messages, consumers = wire.read_declare_ok(declared)
    return messages, consumers


async def publish_all(generator: _Generator, queue: str) -> PhaseResult:
    """Phase 1: every message published and confirmed, then counted in the queue."""
    settings = generator.settings
    block = wire.PublishBlock.build(PUBLISH_CHANNEL, queue, settings.size, generator.frame_max, settings.inflight)
    publish = await _timed(lambda: generator.start_publishing(block), settings.messages)
    if generator.published != settings.messages or generator.confirmed != settings.messages:
        raise LoadError(f"published {generator.published}, confirmed {generator.confirmed}")
    ready, _ = await queue_counts(generator, queue)
    if ready != settings.messages:
        raise LoadError(f"after confirms the queue holds {ready} messages")
    return publish


async def consume_all(generator: _Generator, queue: str) -> PhaseResult:
    """Phase 2: every message delivered exactly once and acked; the queue ends empty."""
    settings = generator.settings
    await generator.call(CONSUME_CHANNEL, wire.channel_open(CONSUME_CHANNEL), wire.CHANNEL_OPEN_OK)
    await generator.call(CONSUME_CHANNEL, wire.basic_qos(CONSUME_CHANNEL, settings.prefetch), wire.BASIC_QOS_OK)
    consumer_tag = f"bench-{secrets.token_hex(4)}"

    async def consume() -> None:
        done = generator.start_consuming()
        await generator.call(CONSUME_CHANNEL, wire.basic_consume(CONSUME_CHANNEL, queue, consumer_tag), wire.BASIC_CONSUME_OK)
        await done

    result = await _timed(consume, settings.messages)
    missing = generator.never_delivered()
    if generator.consumed != settings.messages or missing:
        raise LoadError(f"consumed {generator.consumed} of {settings.messages}; {missing} never delivered")
    # Closing the channel makes the broker process our acks first; any
    # unacked message would be requeued and show up in the count.
    await generator.call(CONSUME_CHANNEL, wire.channel_close(CONSUME_CHANNEL), wire.CHANNEL_CLOSE_OK)
    await _expect_empty(generator, queue)
    return result


async def _expect_empty(generator: _Generator, queue: str) -> None:
    """A classic queue is empty as soon as the channel is closed. A quorum queue
    settles acks and removes the consumer through its log, and RabbitMQ answers a
    passive declare from the applied state, which may lag by a moment: poll."""
    patience = QUORUM_SETTLE_TIMEOUT_S if generator.settings.queue_type == "quorum" else 0.0
    deadline = time.monotonic() + patience
    while (counts := await queue_counts(generator, queue)) != (0, 0):
        if time.monotonic() >= deadline:
            raise LoadError(f"after acking everything the queue reports (messages, consumers) = {counts}")
        await asyncio.sleep(0.05)


async def delete_and_close(generator: _Generator, queue: str) -> None:
    await generator.call(PUBLISH_CHANNEL, wire.queue_delete(PUBLISH_CHANNEL, queue), wire.QUEUE_DELETE_OK)
    await generator.call(0, wire.connection_close(), wire.CONNECTION_CLOSE_OK)


def start_progress_reports(generator: _Generator, report: Progress | None) -> asyncio.Task[None] | None:
    if report is None:
        return None
    return asyncio.get_running_loop().create_task(_progress_reporter(generator, report, generator.settings.messages))


async def run_load(settings: LoadSettings, report: Progress | None = None) -> LoadResult:
    """Both phases against the broker at settings.host:port, checked."""
    generator = await connect(settings)
    reporter = start_progress_reports(generator, report)
    try:
        queue = await declare_fresh_queue(generator)
        publish = await publish_all(generator, queue)
        consume = await consume_all(generator, queue)
        await delete_and_close(generator, queue)
        return LoadResult(publish=publish, consume=consume, queue=queue)
    finally:
        if reporter:
            reporter.cancel()
        generator.close()


async def _timed(phase: Callable[[], Awaitable[object]], messages: int) -> PhaseResult:
    cpu, wall = time.process_time(), time.perf_counter()
    await phase()
    return PhaseResult(messages, time.perf_counter() - wall, time.process_time() - cpu)

"""Consume mode: the streaming reader for any AMQP 0-9-1 broker (RabbitMQ, or the bundled
broker when option `mode` is `consume`).

How Spark's micro-batch execution drives it, for batch N:

    latestOffset(end N-1, limit) -> end N    ack up to end N-1, number what arrived, cut N
    [Spark writes offset log N]
    commit(end N-1)                          ack up to end N-1 (cumulative, idempotent)
    partitions(end N-1, end N)               batch N's rows, inside the partitions
    read(partition)                          on executors: hand the rows over, no broker I/O
    [sink commit N, commit log N]

Responsibilities
    On the driver: consume every queue with manual acks (one channel and consumer per
    queue, basic.qos prefetch from `options.consume_limits`), number the deliveries,
    cut batches, ack them once Spark has committed them, and close the connection in
    `stop()` (whatever is unacked returns to the queue).

How it works
    An offset counts, per queue, the messages handed to Spark (`ConsumeOffset`). The
    driver's first call brings a count from the checkpoint; deliveries are numbered on
    from it (`Ledger`), and a batch is a range of those numbers. The deliveries live
    on the driver's channel only, so their rows travel to executors inside the
    InputPartitions, as Arrow record batches. The offset log is the journal: it fixes
    how many messages of each queue a logged batch holds, which is what a re-planned
    batch needs.
    Acks are cumulative per channel, for `start`, as soon as Spark asks for the batch
    after it: Spark calls latestOffset(start) only once the batch ending at `start` has
    its commit log written (MicroBatchExecution constructs the next batch after
    markMicroBatchEnd, or after finding that batch in the commit log on restart), and
    before it calls commit(start). Acking there, one call earlier than commit, is what
    lets the last batch of a Trigger.AvailableNow run be acked before the query stops.
    A daemon thread services the connection between triggers (heartbeats; deliveries
    flow in), holding the lock every driver call takes. A lost connection is replaced
    at the next call; its delivery tags are void (the broker requeued those messages),
    so numbering goes on from the last count handed to Spark.
    Option minMessagesPerTrigger holds a batch back while fewer messages are held
    and ready than it asks for, up to maxTriggerDelay (admission.py); options
    minPartitions and maxMessagesPerPartition cut a batch as in lease mode
    (offsets.partition_sizes). `reportLatestOffset` gives each queue's tail (messages
    received plus ready) and the query's lag (lag.py).

Invariants
    - Nothing is acked before the commit log of the batch holding it is durable.
    - Nothing is lost: what is not acked returns to the queue when its channel closes.
    - A batch never exceeds `ConsumeLimits.max_batch_messages` per queue, so prefetch
      exceeds two batches and the broker never stops delivering for want of acks.

At-least-once (documented in connector/README.md, "Consume mode")
    Batches handed to Spark but not acked when the driver stops, dies or loses its
    connection are delivered again and processed again. A batch re-planned after a
    restart has the same number of messages per queue, not necessarily the same
    messages. Deduplicate on `message_id`.

Not here
    Numbering one queue's deliveries (ledger.py), lease mode (lease_reader.py), batch
    reads (batch_reader.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pika
import pika.exceptions
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                              ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from ..client.delivery import Delivery
from . import offsets
from .admission import MinimumGate
from .connection import BrokerUnreachable, open_connection
from .reconnect import Reconnect
from .lag import QueueFigures, latest_report
from .ledger import Ledger
from .offsets import ConsumeOffset, Cut, OffsetError
from .options import ConsumeLimits, SourceOptions, consume_limits
from .schema import to_record_batch
from .worker_gc import freeze_once

log = logging.getLogger(__name__)

# A partition carries at most this many rows (unless maxMessagesPerPartition says
# otherwise), a queue's batch as few partitions as that allows.
PARTITION_MESSAGES = 5_000
CONSUME_CUT = Cut(per_queue=None, floor=1, cap=PARTITION_MESSAGES)
# How often the daemon thread services the connection between triggers.
KEEPALIVE_SECONDS = 1.0
# Waiting for deliveries the broker said were ready stops after this long without one
# once some arrived, or after FIRST_DELIVERY_SECONDS if none has (a consumer that has
# just started, on a busy broker, may take a few seconds to be served).
QUIET_SECONDS = 1.0
FIRST_DELIVERY_SECONDS = 5.0
# Before a batch is cut, deliveries keep being taken in until none has come for this
# long: a message the broker has pushed towards the consumer (in flight) no longer
# counts as ready, so the ready count alone would cut a batch short of it.
SETTLE_SECONDS = 0.1
# A batch re-planned after a restart waits this long without a delivery before it
# concludes the queue no longer has the batch's messages.
REPLAN_QUIET_SECONDS = 15.0

_CONNECTION_LOST = (pika.exceptions.AMQPConnectionError, pika.exceptions.ConnectionClosed,
                    pika.exceptions.StreamLostError, pika.exceptions.ChannelWrongStateError,
                    pika.exceptions.ChannelClosed)


class DataLossError(RuntimeError):
    """A logged batch cannot be re-planned: the queue no longer has enough messages."""


@dataclass(frozen=True)
class ConsumedRows(InputPartition):
    """One partition: rows start+1..end of `queue`, carried from the driver."""

    queue: str
    start: int
    end: int
    batch: object   # pyarrow.RecordBatch (pickled with the partition)

    @property
    def value(self):  # InputPartition's field, shown by Spark in plans
        return (self.queue, self.start, self.end)


class _Session:
    """The driver's connection: one consuming channel per queue, a control channel,
    and the daemon thread that services it between calls (I/O shell)."""

    def __init__(self, options: SourceOptions, prefetch: int) -> None:
        self.connection = open_connection(options)
        self.prefetch = prefetch
        self.lock = threading.RLock()
        self.channels: dict[str, pika.adapters.blocking_connection.BlockingChannel] = {}
        self._control = None
        self.failure: BaseException | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._keepalive, daemon=True,
                                        name="quorumqueue-consume-keepalive")
        self._thread.start()

    @property
    def alive(self) -> bool:
        return (self.failure is None and self.connection.is_open
                and all(channel.is_open for channel in self.channels.values()))

    def consume(self, queue: str, ledger: Ledger) -> None:
        channel = self.connection.channel()
        channel.basic_qos(prefetch_count=self.prefetch)

        def on_message(_channel, method, properties, body: bytes) -> None:
            ledger.add(method.delivery_tag, method, properties, body)

        try:
            channel.basic_consume(queue, on_message, auto_ack=False)
        except pika.exceptions.ChannelClosedByBroker as refusal:
            raise _queue_error(queue, refusal) from None
        self.channels[queue] = channel

    def ready(self, queue: str) -> int:
        """Ready messages in `queue` (passive queue.declare)."""
        if self._control is None or not self._control.is_open:
            self._control = self.connection.channel()
        try:
            return self._control.queue_declare(queue, passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker as refusal:
            self._control = None
            raise _queue_error(queue, refusal) from None

    def ack(self, queue: str, tag: int) -> None:
        self.channels[queue].basic_ack(tag, multiple=True)

    def pump(self, seconds: float) -> None:
        self.connection.process_data_events(time_limit=seconds)

    def close(self) -> None:
        self._stopping.set()
        with self.lock:
            try:
                if self.connection.is_open:
                    self.connection.close()
            except _CONNECTION_LOST:
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _keepalive(self) -> None:
        while not self._stopping.wait(KEEPALIVE_SECONDS):
            with self.lock:
                if self._stopping.is_set() or self.failure is not None:
                    return
                try:
                    self.connection.process_data_events(time_limit=0)
                except Exception as error:  # noqa: BLE001 - reported at the next call
                    self.failure = error
                    return


def _queue_error(queue: str, refusal: pika.exceptions.ChannelClosedByBroker) -> RuntimeError:
    return RuntimeError(f"cannot consume from queue '{queue}' (option 'queue'): "
                        f"{refusal.reply_code} {refusal.reply_text}; declare the queue, or "
                        "correct the name")


class ConsumeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.limits: ConsumeLimits = consume_limits(options)
        # driver-side state; none of it travels to executors (see __getstate__)
        self._session: _Session | None = None
        self._ledgers = {queue: Ledger() for queue in options.queues}
        self._handed: dict[str, int] = {}              # queue -> highest end handed out
        self._ready_at_start: dict[str, int] = {}      # AvailableNow, numbering not started
        self._targets: dict[str, int] = {}             # AvailableNow: last count to read
        self._turn = 0
        self._available_now = False
        self._gate = (None if options.min_messages_per_trigger is None else
                      MinimumGate(options.min_messages_per_trigger,
                                  options.max_trigger_delay_ms))
        self._batch_end: dict[str, int] | None = None  # the end latestOffset last returned

    def __getstate__(self) -> dict:
        return {"options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["options"])

    # ------------------------------------------------------------------ driver

    def initialOffset(self) -> dict:
        return ConsumeOffset.initial(self.options.queues).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if (self.options.max_messages_per_trigger is None
                and self.options.max_bytes_per_trigger is not None):
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadMaxRows(self.limits.max_batch_messages)

    def prepareForTriggerAvailableNow(self) -> None:
        # The run stops at what each queue has ready now (plus what is already held).
        self._available_now = True
        with self._driver() as session:
            for queue, ledger in self._ledgers.items():
                ready = session.ready(queue)
                if ledger.started:
                    self._targets[queue] = ledger.last + ready
                else:
                    self._ready_at_start[queue] = ready

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = ConsumeOffset.from_json(start)
        with self._driver() as session:
            for queue in self.options.queues:
                self._begin(session, queue, begin.position(queue))
                # Spark asks for the next batch only once the batch ending at `start`
                # is in its commit log: ack it now (see the module header).
                self._ack_through(session, queue, begin.position(queue))
            self._batch_end = dict(begin.positions)
            messages, total_bytes = self._budgets(limit)
            limits = {queue: offsets.batch_limit(begin.position(queue), messages,
                                                 self._targets.get(queue))
                      for queue in self.options.queues}
            if not self._admitted(session, begin, limit):
                return begin.to_json()
            self._collect(session, begin, limits)
            ends = self._cut(begin, messages, total_bytes, limits)
        self._batch_end.update(ends)
        for queue, end in ends.items():
            self._handed[queue] = max(self._handed.get(queue, 0), end)
        self._turn += 1
        return begin.advanced(ends).to_json()

    def reportLatestOffset(self) -> dict | None:
        """Each queue's tail (deliveries numbered so far plus what the queue has ready)
        in the offset's form, and the query's lag (lag.py); None before the first batch.
        The broker's unacked counts are not reported: AMQP 0-9-1 does not give them.
        Deliveries on their way to the driver (up to the prefetch) are neither received
        nor ready, so the tail is a lower bound until they arrive."""
        if self._batch_end is None:
            return None
        figures = {}
        with self._driver() as session:
            session.pump(0)
            for queue, ledger in self._ledgers.items():
                if not ledger.started:
                    continue
                ready = session.ready(queue)
                figures[queue] = QueueFigures(tail=ledger.last + ready, ready=ready,
                                              held=len(ledger.held), unacked=None)
        return latest_report({}, "delivered", figures, self._batch_end)

    def partitions(self, start: dict, end: dict) -> list[ConsumedRows]:
        first, last = ConsumeOffset.from_json(start), ConsumeOffset.from_json(end)
        counts = {queue: count - first.position(queue) for queue, count in last.positions}
        sizes = offsets.partition_sizes(counts, CONSUME_CUT, self.options.min_partitions,
                                        self.options.max_messages_per_partition)
        parts: list[ConsumedRows] = []
        with self._driver() as session:
            for queue, stop in last.positions:
                low = first.position(queue)
                if stop < low:
                    raise OffsetError(f"queue {queue!r}: batch end {stop} is below its "
                                      f"start {low}")
                if stop == low:
                    continue
                self._begin(session, queue, low)
                deliveries = self._deliveries(session, queue, low, stop)
                self._handed[queue] = max(self._handed.get(queue, 0), stop)
                parts += self._cut_partitions(queue, deliveries, sizes[queue])
        return parts

    def commit(self, end: dict) -> None:
        done = ConsumeOffset.from_json(end)
        with self._driver() as session:
            for queue, count in done.positions:
                if self._ledgers[queue].started:
                    self._ack_through(session, queue, count)

    def stop(self) -> None:
        """Close the connection: every unacked delivery returns to its queue."""
        if self._session is not None:
            self._session.close()
            self._session = None

    # ------------------------------------------------------------------ executors

    def read(self, partition: ConsumedRows) -> Iterator:
        freeze_once()
        if partition.batch.num_rows:
            yield partition.batch

    # ------------------------------------------------------------------ internals

    @contextmanager
    def _driver(self) -> Iterator[_Session]:
        """The live session, under its lock; a lost one is replaced first."""
        if self._session is not None and not self._alive(self._session):
            self._replace_lost_session()
        retry = Reconnect(self.options.reconnect_timeout_ms,
                          "quorumqueue source (driver, consume mode)")
        while self._session is None:
            try:
                self._session = _Session(self.options, self.limits.prefetch)
                for queue, ledger in self._ledgers.items():
                    if ledger.started:
                        self._session.consume(queue, ledger)
            except _CONNECTION_LOST + (BrokerUnreachable,) as error:
                if self._session is not None:
                    self._session.close()
                    self._session = None
                retry.lost(error, "every node")
        retry.recovered()
        with self._session.lock:
            yield self._session

    @staticmethod
    def _alive(session: _Session) -> bool:
        with session.lock:
            if not session.alive:
                return False
            try:
                session.pump(0)
            except _CONNECTION_LOST as error:
                session.failure = error
            return session.alive

    def _replace_lost_session(self) -> None:
        session, self._session = self._session, None
        assert session is not None
        log.warning("the consume-mode connection was lost (%r); reconnecting. The broker "
                    "requeued what this query had not acked.", session.failure)
        session.close()
        for queue, ledger in self._ledgers.items():
            again = ledger.forget(self._handed.get(queue, 0))
            if again:
                log.warning("%d messages of queue '%s' that Spark has already read will be "
                            "delivered again (at-least-once)", again, queue)

    def _begin(self, session: _Session, queue: str, start: int) -> None:
        """Numbering and consuming start at the first count Spark names; a count beyond
        what was received (a batch that could not be re-planned in full) moves it on."""
        ledger = self._ledgers[queue]
        if not ledger.started:
            ledger.start_at(start)
            if queue in self._ready_at_start:
                self._targets[queue] = start + self._ready_at_start.pop(queue)
            session.consume(queue, ledger)
        elif ledger.last < start:
            ledger.renumber_from(start)

    def _ack_through(self, session: _Session, queue: str, count: int) -> None:
        tag = self._ledgers[queue].through(count)
        if tag is not None:
            session.ack(queue, tag)

    def _budgets(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        """(messages, bytes) this batch may take in all; None: no limit."""
        match limit:
            case ReadAllAvailable():
                return None, None
            case ReadMaxRows(max_rows=rows):
                return min(rows, self.limits.max_batch_messages), \
                    self.options.max_bytes_per_trigger
            case ReadMaxBytes(max_bytes=size):
                return self.limits.max_batch_messages, size
            case ReadMinRows():   # not passed while maxMessagesPerTrigger is derived; safe
                return self.limits.max_batch_messages, self.options.max_bytes_per_trigger
            case _:
                raise TypeError(f"the quorumqueue source does not support read limit {limit!r}")

    def _admitted(self, session: _Session, begin: ConsumeOffset, limit: ReadLimit) -> bool:
        """Option minMessagesPerTrigger: whether this trigger may plan a batch (messages
        held beyond `start`, after taking in what has arrived, plus those ready)."""
        if self._gate is None or self._available_now or isinstance(limit, ReadAllAvailable):
            return True
        session.pump(0)
        available = sum(ledger.ahead(begin.position(queue)) + session.ready(queue)
                        for queue, ledger in self._ledgers.items())
        return self._gate.admit(available, time.monotonic() * 1000)

    def _collect(self, session: _Session, begin: ConsumeOffset,
                 limits: dict[str, int | None]) -> None:
        """Wait for deliveries the broker says are ready, up to what the batch can take
        and prefetch lets through; stop once none has come for QUIET_SECONDS."""
        session.pump(0)
        wanted: dict[str, int] = {}
        for queue, ledger in self._ledgers.items():
            start = begin.position(queue)
            have = ledger.ahead(start)
            room = self.limits.prefetch - len(ledger.held)
            cap = None if limits[queue] is None else limits[queue] - start
            if cap is not None and have >= cap or room <= 0:
                continue
            if queue in self._targets:
                # Trigger.AvailableNow: the run's messages were counted ready before
                # this channel consumed, so they are known to be there (or on their way)
                expected = room
            else:
                expected = min(session.ready(queue), room)
            if not expected and not ledger.arrived:
                # a consumer that has received nothing yet: the broker may already have
                # pushed the queue's messages towards it (in flight, so not counted as
                # ready); wait for a first one (up to FIRST_DELIVERY_SECONDS)
                expected = 1
            goal = have + expected if cap is None else min(cap, have + expected)
            if goal > have:
                wanted[queue] = goal
        self._wait_for(session, begin, wanted, QUIET_SECONDS)
        self._settle(session, begin, limits)

    def _settle(self, session: _Session, begin: ConsumeOffset,
                limits: dict[str, int | None]) -> None:
        """Take in what is already in flight, until SETTLE_SECONDS pass without a
        delivery or every queue's batch is full."""
        def open_queues() -> bool:
            return any((limits[q] is None or ledger.ahead(begin.position(q))
                        < limits[q] - begin.position(q))
                       and len(ledger.held) < self.limits.prefetch
                       for q, ledger in self._ledgers.items())

        while open_queues():
            before = sum(ledger.arrived for ledger in self._ledgers.values())
            session.pump(SETTLE_SECONDS)
            if sum(ledger.arrived for ledger in self._ledgers.values()) == before:
                return

    def _wait_for(self, session: _Session, begin: ConsumeOffset, wanted: dict[str, int],
                  quiet: float) -> None:
        def received() -> int:
            return sum(ledger.next_seq or 0 for ledger in self._ledgers.values())

        first_count = last_count = received()
        last_change = time.monotonic()
        while any(self._ledgers[q].ahead(begin.position(q)) < goal
                  for q, goal in wanted.items()):
            session.pump(0.05)
            if received() != last_count:
                last_count, last_change = received(), time.monotonic()
            elif time.monotonic() - last_change > (
                    quiet if last_count != first_count else max(quiet, FIRST_DELIVERY_SECONDS)):
                return

    def _cut(self, begin: ConsumeOffset, messages: int | None, total_bytes: int | None,
             limits: dict[str, int | None]) -> dict[str, int]:
        byte_share = (None if total_bytes is None
                      else max(1, total_bytes // len(self.options.queues)))
        ends: dict[str, int] = {}
        for queue in offsets.rotated(self.options.queues, self._turn):
            start = begin.position(queue)
            held = [d for d in self._ledgers[queue].held if d.seq > start]
            end = offsets.batch_end(start + len(held), limits[queue])
            if messages is not None:
                end = min(end, start + messages)
            if byte_share is not None:
                end = min(end, _bytes_end(held, start, byte_share))
            ends[queue] = end
            if messages is not None:
                messages -= end - start
        return ends

    def _deliveries(self, session: _Session, queue: str, start: int,
                    end: int) -> list[Delivery]:
        ledger = self._ledgers[queue]
        chosen = ledger.span(start, end)
        if chosen is not None:
            return chosen
        # A logged batch this process does not hold (a restarted driver, a reconnect):
        # the broker requeued the messages; take the next ones as the batch.
        ledger.renumber_from(start)
        begin = ConsumeOffset.of({queue: start})
        self._wait_for(session, begin, {queue: end - start}, REPLAN_QUIET_SECONDS)
        chosen = [delivery for delivery in ledger.held if start < delivery.seq <= end]
        if len(chosen) < end - start:
            what = (f"batch ({start}, {end}] of queue '{queue}', logged before a restart, "
                    f"can only be re-planned with {len(chosen)} of its {end - start} "
                    "messages: the queue no longer has them (consumed by another client, "
                    "purged, expired or dead-lettered)")
            if self.options.fail_on_data_loss:
                raise DataLossError(f"{what}. Set option 'failOnDataLoss' to false to go on "
                                    "with those that are there.")
            log.warning("going on with fewer messages: %s", what)
        return chosen

    def _cut_partitions(self, queue: str, deliveries: list[Delivery],
                        size: int) -> list[ConsumedRows]:
        parts = []
        for i in range(0, len(deliveries), size):
            chunk = deliveries[i:i + size]
            batch = to_record_batch(queue, chunk, self.options.include_headers)
            parts.append(ConsumedRows(queue, chunk[0].seq - 1, chunk[-1].seq, batch))
        return parts


def _bytes_end(held: list[Delivery], start: int, max_bytes: int) -> int:
    """Where a batch of `held` (numbered from start+1) stops: at the first delivery that
    reaches `max_bytes`, and after at least one."""
    total, end = 0, start
    for delivery in held:
        if end > start and total >= max_bytes:
            break
        total += len(delivery.body)
        end = delivery.seq
    return end

"""Lease mode: the streaming reader over the bundled broker's durable leases.

How Spark's micro-batch execution drives it, for batch N:

    latestOffset(end N-1, limit) -> end N    grow the query's lease (a Raft command)
    [Spark writes offset log N]
    commit(end N-1)                          settle the lease up to end N-1
    partitions(end N-1, end N)               (start, end] per queue, cut into ranges
    read(range)                              on executors: read the range, settle nothing
    [sink commit N, commit log N]

Responsibilities
    The driver side (`initialOffset`, `latestOffset`, `partitions`, `commit`) runs in
    one long-lived Python process per query and keeps a LeaseClient open; `read` runs
    on executors, statelessly, with a connection of its own per partition. Both retry
    a lost broker for option reconnectTimeout (reconnect.py): the driver repeats its
    request (settle is idempotent; a grow applied twice only fills the lease ahead),
    a read goes on after the last message it handed to Spark.

How it works
    One lease per query, named in the initial offset (`offsets.new_lease_name`) and
    carried in every checkpointed offset, one per queue under that name. A batch's
    range is fixed by the lease's sequences, so a batch replayed after a restart
    reads exactly the same messages. `latestOffset` takes the messages the lease
    already holds beyond `start` first (assigned before a crash, never batched), then
    grows the lease by what the read limit leaves; queues take turns at being served
    first. Under Trigger.AvailableNow the run's target is fixed at the start: what
    each lease held plus what each queue had ready. With option queuePattern the
    queues are those of the vhost whose names match, listed again at most once a
    second (QUEUE_REFRESH_SECONDS): a new queue joins the offset at position 0, a
    deleted one is no longer grown. With option minMessagesPerTrigger, a trigger that
    finds fewer messages (held beyond `start` plus ready) plans nothing until
    maxTriggerDelay has passed (admission.py). After each `latestOffset` Spark asks
    `reportLatestOffset`: the tail of every queue and the query's lag (lag.py).

Invariants
    - Nothing is settled before Spark commits a later batch's offsets, which it does
      only after the batch's sink commit and commit log (so a replay can read it).
    - A range that can no longer be read fails the query (failOnDataLoss=true) or is
      skipped with a warning (false); it never silently becomes fewer rows.
    - A lease created by this process is grown with a short timeout until Spark has
      checkpointed an offset naming it (first `partitions` or `commit`), so a driver
      that dies between the first grow and the first offset log cannot strand
      messages in a lease no checkpoint remembers.
    - `stop()` keeps the lease (what an exactly-once restart needs) unless option
      `releaseLeaseOnStop` is true; then it settles what Spark has committed for sure
      (up to the last `start` Spark asked latestOffset about: Spark asks only once the
      batch ending there is in its commit log), and releases the rest (back to the
      queue, delivery count + 1) only if no logged batch lies beyond that: a batch
      Spark logged may be in its commit log already without the reader knowing (the
      last batch of a run), and must never be read twice. It then stays in the lease
      until the next run settles it, or the lease's timeout gives it back.
    - The lease's idle timeout (option leaseTimeout, else the broker's lease_timeout)
      runs only while nobody grows, settles or reads it: `latestOffset` touches the
      lease (a grow by 0) at least every KEEPALIVE_SECONDS, or a quarter of the
      timeout, so a query that idles between messages keeps its lease; the broker
      counts each executor's range read (broker/node/leases.py `_Touch`), so a batch
      that takes longer than the timeout keeps it too.
    - A lease the broker has fenced (released by an operator, or by its timeout while
      the query was away) fails the query with LeaseFencedError, whose first line
      says which messages went back to the queue and what to do; never a batch read
      twice or lost without a word.

Not here
    Consume mode (consume_reader.py), batch reads (batch_reader.py).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from functools import wraps
from typing import TYPE_CHECKING, TypeVar

import pika.exceptions
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxBytes,
                                              ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from ..client.delivery import Delivery
from ..client.lease_client import LeaseClient
from ..client.lease_entries import EntryColumns
from ..client.management import ManagementError
from . import offsets
from .admission import MinimumGate
from .connection import BrokerUnreachable, first_reachable, open_lease_client
from .first_line import message_alone
from .lag import QueueFigures, latest_report
from .offsets import Cut, LeaseOffset, LeaseRange
from .options import MAX_GROW, QUEUE_PATTERN, OptionError, SourceOptions
from .reconnect import DriverConnection, Reconnect, is_connection_loss
from .schema import EntryBatches, to_record_batch
from .worker_gc import freeze_once

if TYPE_CHECKING:
    # Imported where a range is read (_executor_client): Spark starts the driver's
    # streaming source runner afresh for every query, and it never reads a range, so
    # it does not import the range reader and pamqp (20-40 ms of CPU a query).
    from ..client.range_reader import RangeReader

log = logging.getLogger(__name__)

# A batch is cut into TARGET_PARTITIONS partitions per queue, each of at least
# MIN_PARTITION_MESSAGES and at most PARTITION_MESSAGES sequences (or a multiple of
# TARGET_PARTITIONS of them, when the cap makes more: whole waves on 1, 2 or 4 cores;
# options
# minPartitions and maxMessagesPerPartition change that: offsets.partition_sizes): a
# function of the batch's (start, end] and the options alone, so a replayed batch
# gets the same partitions. A read is one "entries" consume of its whole range on a
# connection of its own (client/range_reader.py, kept for the worker's next
# partition); its deliveries are received back to back into buffers of 4 MiB and
# decoded column by column a run of at least 2,048 messages at a time
# (RangeReader.read_groups, client/lease_entries.py), each run one Arrow record batch
# (schema.py EntryBatches: the columns a run of messages shares are built once per read).
PARTITION_MESSAGES = 25_000
MIN_PARTITION_MESSAGES = 2_000
TARGET_PARTITIONS = 4
LEASE_CUT = Cut(per_queue=TARGET_PARTITIONS, floor=MIN_PARTITION_MESSAGES,
                cap=PARTITION_MESSAGES)
# With option queuePattern, the vhost's queues are listed at most this often.
QUEUE_REFRESH_SECONDS = 1.0
# While no batch is planned, reportLatestOffset asks the broker at most this often.
REPORT_REFRESH_SECONDS = 1.0
# The timeout of a lease this process created, until a checkpoint names it.
PROVISIONAL_LEASE_TIMEOUT_MS = 10 * 60 * 1000

T = TypeVar("T")

class DataLossError(RuntimeError):
    """Messages a checkpointed batch covers can no longer be read."""


class LeaseLostError(RuntimeError):
    """The broker's lease is behind the checkpoint: not the broker it was written with."""


class LeaseFencedError(RuntimeError):
    """The broker released the query's lease (an operator, or its idle timeout): its
    messages went back to the queue, so the checkpoint cannot go on exactly once."""


class MissingQueue(OptionError):
    """A queue named by option `queue` is not on the broker."""


_NO_QUEUE = re.compile(r"NOT_FOUND - no queue '((?:[^']|'(?! in vhost))*)' in vhost '([^']*)'")


def _queue_named(method):
    """`method`, a missing queue named by option `queue` raised as MissingQueue (its
    message the first line Spark shows), not as the broker's bare 404."""
    @wraps(method)
    def checked(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (ManagementError, pika.exceptions.ChannelClosedByBroker) as error:
            found = _NO_QUEUE.search(str(error))
            if found is None or self.options.queue_pattern is not None:
                raise
            message_alone()
            raise MissingQueue(
                f"option 'queue': no queue '{found.group(1)}' in vhost '{found.group(2)}' "
                f"at {self.options.addresses[0].redacted}: declare it first (lease mode "
                "reads quorum queues: x-queue-type quorum), or correct the name") from None
    return checked


# The broker's refusal of a fenced lease's grow or settle (broker/node/leases.py).
FENCED = "is fenced"
# latestOffset touches the lease at least this often (or a quarter of its timeout).
KEEPALIVE_SECONDS = 30.0


class LeaseStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        # driver-side state; none of it travels to executors (see __getstate__)
        self._driver = DriverConnection(options.addresses, options.reconnect_timeout_ms)
        self._initial: LeaseOffset | None = None      # generated by this process
        self._confirmed: set[str] = set()              # leases a checkpoint names
        self._held: dict[str, int] = {}                # queue -> lease end (last seen)
        self._settled: dict[str, int] = {}             # queue -> settled up to
        self._available_now = False
        self._ready_at_start: dict[str, int] | None = None
        self._targets: dict[str, int] | None = None
        self._turn = 0
        self._lease: str | None = None                 # the lease of the last offset seen
        self._durable: dict[str, int] = {}             # queue -> in Spark's commit log
        # the queues read: option queue, or those matching queuePattern when last listed
        self._queues: tuple[str, ...] = options.queues
        self._listed_at: float | None = None           # monotonic seconds; pattern only
        self._skipped: set[str] = set()                # matching classic queues, warned once
        self._gate = (None if options.min_messages_per_trigger is None else
                      MinimumGate(options.min_messages_per_trigger,
                                  options.max_trigger_delay_ms))
        self._batch_end: dict[str, int] = {}           # the end latestOffset last returned
        self._planned = False                          # ... and it was a batch
        # reportLatestOffset's broker figures and when they were taken (monotonic s)
        self._figures: tuple[float, dict[str, QueueFigures]] | None = None
        self._unacked_refused = False                  # queues.list needs an administrator
        self._timeout_seen: int | None = None          # the lease's timeout (ms), from info
        self._touched = 0.0                            # monotonic s of the last grow/settle

    def __getstate__(self) -> dict:
        return {"options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["options"])

    # ------------------------------------------------------------------ driver

    def initialOffset(self) -> dict:
        # Spark asks again before every batch until one is logged: keep one name.
        if self._initial is None:
            self._initial = LeaseOffset.initial(offsets.new_lease_name(), self._current_queues())
        return self._initial.to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        if self.options.min_messages_per_trigger is not None:
            return ReadMinRows(self.options.min_messages_per_trigger)
        return ReadAllAvailable()

    @_queue_named
    def prepareForTriggerAvailableNow(self) -> None:
        # The lease name is not known before the first latestOffset; the ready counts
        # are taken now, the lease ends then.
        self._available_now = True
        self._ready_at_start = {queue: self._call(lambda c, q=queue: _ready(c, q))
                                for queue in self._current_queues()}

    @_queue_named
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = LeaseOffset.from_json(start)
        lease = begin.lease
        self._lease = lease
        for queue, seq in begin.positions:
            # Spark asks for the next batch only once the one ending at `start` has its
            # commit log: settling up to here is safe (used by releaseLeaseOnStop).
            self._durable[queue] = max(self._durable.get(queue, 0), seq)
        queues = self._current_queues()
        if self._available_now and self._ready_at_start is not None:
            # a queue that appeared after the run started is not part of it
            queues = tuple(queue for queue in queues if queue in self._ready_at_start)
        for queue in queues:
            self._learn_end(queue, lease, begin.position(queue))
        queues = tuple(queue for queue in queues if queue in self._held)  # none gone
        self._keep_alive(queues, lease)
        if self._available_now and self._targets is None:
            assert self._ready_at_start is not None
            self._targets = {queue: self._held[queue] + self._ready_at_start[queue]
                             for queue in queues}
        self._batch_end, self._planned = dict(begin.positions), False
        if not queues or not self._admitted(begin, queues, limit):
            return begin.to_json()
        messages, total_bytes = self._budgets(limit)
        byte_share = (None if total_bytes is None
                      else max(1, total_bytes // len(queues)))
        ends: dict[str, int] = {}
        for queue in offsets.rotated(queues, self._turn):
            first = begin.position(queue)
            target = None if self._targets is None else self._targets[queue]
            limit_seq = offsets.batch_limit(first, messages, target)
            wanted = offsets.to_grow(self._held[queue], limit_seq, MAX_GROW)
            if wanted:
                try:
                    self._grow(queue, lease, wanted, byte_share or 0)
                except ManagementError as error:
                    if not self._gone(queue, error):
                        raise
                    continue
            ends[queue] = offsets.batch_end(self._held[queue], limit_seq)
            if messages is not None:
                messages -= ends[queue] - first
        self._turn += 1
        self._batch_end.update(ends)
        self._planned = begin.advanced(ends) != begin
        return begin.advanced(ends).to_json()

    def reportLatestOffset(self) -> dict | None:
        """The tail of every queue (the lease's end plus what the queue has ready) in the
        offset's form, and the query's lag (lag.py); None before the first batch.
        Spark asks after every latestOffset, every 10 ms while a query idles
        (spark.sql.streaming.pollingDelay): the broker is asked again after a trigger
        that planned a batch, otherwise at most every REPORT_REFRESH_SECONDS."""
        if self._lease is None:
            return None
        now = time.monotonic()
        if (not self._planned and self._figures is not None
                and now - self._figures[0] < REPORT_REFRESH_SECONDS):
            figures = self._figures[1]
        else:
            figures = self._broker_figures(self._lease)
            self._figures = (now, figures)
        return latest_report({"lease": self._lease}, "queues", figures, self._batch_end)

    def _broker_figures(self, lease: str) -> dict[str, QueueFigures]:
        """Each queue's figures from one lease.info, which carries the queue's ready
        (and, for an administrator, unacked) counts on a node with a replica of it;
        elsewhere a passive declare counts ready and queues.list unacked."""
        answers = {}
        for queue in self._queues:
            if queue not in self._held:
                continue
            try:
                info = self._call(lambda c, q=queue: c.info(q, lease))
                ready = info.get("ready")
                if ready is None:  # no replica on the node this driver talks to
                    ready = self._call(lambda c, q=queue: _ready(c, q))
            except (ManagementError, pika.exceptions.ChannelClosedByBroker) as error:
                # a figure for the progress is not worth failing the query over; a queue
                # that is really gone fails (or leaves) it at the next latestOffset
                log.warning("no latest offset for queue '%s': %r", queue, error)
                continue
            answers[queue] = info, ready
        listed = ({} if all("unacked" in info for info, _ready in answers.values())
                  else self._unacked_counts())
        return {queue: QueueFigures(tail=self._held[queue] + ready, ready=ready,
                                    held=max(0, info["end"] - info["first"] + 1),
                                    unacked=info.get("unacked", listed.get(queue)))
                for queue, (info, ready) in answers.items()}

    def partitions(self, start: dict, end: dict) -> list[LeaseRange]:
        first, last = LeaseOffset.from_json(start), LeaseOffset.from_json(end)
        self._confirm(last.lease)
        counts = {queue: seq - first.position(queue) for queue, seq in last.positions}
        sizes = offsets.partition_sizes(counts, LEASE_CUT, self.options.min_partitions,
                                        self.options.max_messages_per_partition)
        return offsets.ranges(first, last, sizes)

    def commit(self, end: dict) -> None:
        done = LeaseOffset.from_json(end)
        self._confirm(done.lease)
        for queue, seq in done.positions:
            if seq > self._settled.get(queue, 0):
                try:
                    self._call(lambda c, q=queue, s=seq: c.settle(q, done.lease, s))
                except ManagementError as error:
                    self._check_fenced(queue, done.lease, seq, error)
                    if not self._gone(queue, error):
                        raise
                    continue
                self._settled[queue] = seq
                self._touched = time.monotonic()

    def stop(self) -> None:
        try:
            if self.options.release_lease_on_stop and self._lease is not None:
                self._release_on_stop(self._lease)
        finally:
            self._driver.close()

    def _release_on_stop(self, lease: str) -> None:
        for queue in self._queues:
            durable = self._durable.get(queue, 0)
            try:
                if durable > self._settled.get(queue, 0):
                    self._call(lambda c, q=queue, s=durable: c.settle(q, lease, s))
                    self._settled[queue] = durable
                logged = self._batch_end.get(queue, 0)
                if logged > durable:
                    # Spark logged a batch up to `logged`, maybe committed it too (the
                    # last batch of a run): releasing it could have it read twice
                    log.info("lease '%s' on queue '%s' keeps sequences %d..%d (a batch "
                             "Spark logged, maybe committed) until the query restarts "
                             "from its checkpoint%s", lease, queue, durable + 1, logged,
                             self._lapse_hint())
                    continue
                released = self._call(lambda c, q=queue: c.release(q, lease, fence=False))
            except (ManagementError, pika.exceptions.AMQPError, OSError) as error:
                log.warning("could not release lease '%s' on queue '%s' (%r): its messages "
                            "stay in the lease until the query restarts%s", lease, queue,
                            error, self._lapse_hint())
                continue
            log.info("released lease '%s' on queue '%s': %d messages back in the queue",
                     lease, queue, released)

    def _lapse_hint(self) -> str:
        timeout = self._timeout_seen if self._timeout_seen is not None \
            else self.options.lease_timeout_ms
        return f" or the lease's timeout ({timeout} ms) lapses" if timeout else ""

    # ------------------------------------------------------------------ executors

    def read(self, partition: LeaseRange) -> Iterator:
        """The partition's messages; a lost broker is retried for option
        reconnectTimeout, the read going on after the last message handed to Spark (a
        range read settles nothing, so it can be read again)."""
        freeze_once()
        retry = Reconnect(self.options.reconnect_timeout_ms,
                          f"quorumqueue source (executor, queue '{partition.queue}', "
                          f"sequences {partition.start + 1}..{partition.end})")
        handed = partition.start   # the last sequence handed to Spark
        refused_by: list[str] = []  # nodes that refused the range since the last success
        replaying: list[str] = []   # nodes still applying their log (asked last, not trusted)
        while True:
            rest = LeaseRange(partition.queue, partition.lease, handed, partition.end)
            addresses = _untried_first(self.options.addresses, refused_by + replaying)
            # a refusal is believed once every node refused (a replica restarted and not
            # yet caught up refuses a lease it has not applied yet)
            trusted = len(set(refused_by)) >= len(self.options.addresses) - 1
            node = "every node"
            try:
                client, node = first_reachable(addresses, _executor_client)
            except BrokerUnreachable as error:
                retry.lost(error, node)
                continue
            complete = False
            try:
                for batch, last in self._read_range(client, rest, trusted):
                    yield batch
                    handed = last
                    refused_by.clear()
                    replaying.clear()
                retry.recovered()
                complete = True
                return
            except _NotYetApplied as waiting:  # a restarted replica: the others first,
                replaying.append(node)        # then it again, for reconnectTimeout
                retry.lost(waiting, node)
            except _Refused as refused:
                log.warning("%s: %s refused the range (%s); asking the next node of option "
                            "'uri'", retry.what, node, refused)
                refused_by.append(node)
            except Exception as error:  # noqa: BLE001 - sorted by is_connection_loss
                if not is_connection_loss(error):
                    raise
                if client.reused and handed == rest.start:
                    continue  # a kept connection the broker closed meanwhile: a new one
                retry.lost(error, node)
            finally:
                if complete:
                    _keep(client)  # for this worker's next partition
                else:
                    _close_quietly(client)

    def _read_range(self, client: RangeReader, partition: LeaseRange,
                    trusted: bool = True) -> Iterator[tuple[object, int]]:
        """(Arrow batch, its last sequence) for the messages of `partition`, a batch per
        group of deliveries of the "entries" read (RangeReader.read_groups); a refusal
        raises _Refused unless `trusted`."""
        if partition.start >= partition.end:
            return
        try:
            chunks = _contiguous(partition, client.read_groups(
                partition.queue, partition.lease, partition.start, partition.end))
            batches = EntryBatches(partition.queue, self.options.include_headers)
            for columns in chunks:
                yield batches.batch(columns), columns.last_seq
                partition = LeaseRange(partition.queue, partition.lease, columns.last_seq,
                                       partition.end)
        except pika.exceptions.ChannelClosedByBroker as refusal:
            if REPLAYING in str(refusal.reply_text):
                raise _NotYetApplied(f"{refusal.reply_code} {refusal.reply_text}") from None
            if FENCED in str(refusal.reply_text):
                self._raise_fenced(partition)
            if not trusted:
                raise _Refused(f"{refusal.reply_code} {refusal.reply_text}") from None
            # the broker checks the range before it sends any of it, but a message
            # can become unreadable while the range streams: go on after what was handed
            client.close()
            client = open_lease_client(self.options)
            try:
                messages = self._after_refusal(client, partition, partition.start,
                                               partition.end, refusal)
            finally:
                client.close()
            if messages:
                yield (to_record_batch(partition.queue, messages,
                                       self.options.include_headers), partition.end)

    def _raise_fenced(self, part: LeaseRange) -> None:
        """An executor's read refused for a fenced lease: LeaseFencedError, naming it."""
        try:
            with open_lease_client(self.options) as client:
                fence = client.info(part.queue, part.lease).get("fence") or {}
        except (ManagementError, pika.exceptions.AMQPError, OSError):
            fence = {}
        raise LeaseFencedError(fenced_text(part.lease, part.queue, part.end, fence,
                                           self.options.lease_timeout_ms)) from None

    def _after_refusal(self, client: LeaseClient, part: LeaseRange, low: int, high: int,
                       refusal: pika.exceptions.ChannelClosedByBroker) -> list[Delivery]:
        info = client.info(part.queue, part.lease) if refusal.reply_code == 406 else {}
        if info.get("fence"):  # given back while the range streamed
            raise LeaseFencedError(fenced_text(part.lease, part.queue, part.end, info["fence"],
                                               self.options.lease_timeout_ms))
        what = (f"messages {low + 1}..{high} of lease '{part.lease}' on queue "
                f"'{part.queue}' can no longer be read ({refusal.reply_code} "
                f"{refusal.reply_text})")
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"{what}. They were settled, or released back to the queue (an expired "
                "leaseTimeout, lease.release), or the queue was deleted. Set option "
                "'failOnDataLoss' to false to skip them.") from None
        log.warning("skipping what cannot be read: %s", what)
        if refusal.reply_code != 406:  # the queue is gone
            return []
        readable_low, readable_high = max(low, info["first"] - 1), min(high, info["end"])
        if readable_low >= readable_high:
            return []
        messages = client.read(part.queue, part.lease, readable_low, readable_high)
        _check_contiguous(part, readable_low, readable_high, [m.seq for m in messages])
        return messages

    # ------------------------------------------------------------------ internals

    def _current_queues(self) -> tuple[str, ...]:
        """The queues to read: option queue, or the quorum queues matching queuePattern
        (listed again after QUEUE_REFRESH_SECONDS)."""
        pattern = self.options.queue_pattern
        if pattern is None:
            return self._queues
        now = time.monotonic()
        if self._listed_at is not None and now - self._listed_at < QUEUE_REFRESH_SECONDS:
            return self._queues
        try:
            rows = self._call(lambda c: c.call("queues.list"))
        except ManagementError as error:
            raise RuntimeError(
                f"option '{QUEUE_PATTERN}': cannot list the queues of vhost "
                f"'{self.options.vhost}' ({error}); listing them (the management RPC's "
                "queues.list) needs a user tagged administrator, as rabbitmqctl does") from None
        queues, skipped = matching_queues(rows, pattern)
        for name in sorted(set(skipped) - self._skipped):
            log.warning("option '%s': queue '%s' matches but is not a quorum queue; lease "
                        "mode reads quorum queues only, so it is left out", QUEUE_PATTERN, name)
        self._skipped |= set(skipped)
        self._queues, self._listed_at = queues, now
        return queues

    def _gone(self, queue: str, error: ManagementError) -> bool:
        """Whether `error` says that `queue`, matched by queuePattern, was deleted (it
        then leaves the query; a named queue that is gone fails it)."""
        if self.options.queue_pattern is None or not str(error).startswith("NOT_FOUND"):
            return False
        log.warning("option '%s': queue '%s' is gone (%s); reading on without it",
                    QUEUE_PATTERN, queue, error)
        self._queues = tuple(q for q in self._queues if q != queue)
        self._held.pop(queue, None)
        return True

    def _admitted(self, begin: LeaseOffset, queues: tuple[str, ...], limit: ReadLimit) -> bool:
        """Option minMessagesPerTrigger: whether this trigger may plan a batch."""
        if self._gate is None or self._available_now or isinstance(limit, ReadAllAvailable):
            return True
        available = sum(max(0, self._held[q] - begin.position(q))
                        + self._call(lambda c, q=q: _ready(c, q)) for q in queues)
        return self._gate.admit(available, time.monotonic() * 1000)

    def _unacked_counts(self) -> dict[str, int]:
        """queue -> unacked messages (every consumer and lease), from queues.list; empty
        when the user is not an administrator (then never asked again)."""
        if self._unacked_refused:
            return {}
        try:
            rows = self._call(lambda c: c.call("queues.list"))
        except ManagementError as error:
            log.info("the broker's unacked counts are not reported (%s): queues.list needs "
                     "a user tagged administrator", error)
            self._unacked_refused = True
            return {}
        return {row["name"]: row["unacked"] for row in rows}

    def _budgets(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        """(messages, bytes) this batch may take; None: no limit."""
        match limit:
            case ReadAllAvailable():
                return None, None
            case ReadMaxRows(max_rows=rows):
                return rows, self.options.max_bytes_per_trigger
            case ReadMaxBytes(max_bytes=size):
                return self.options.max_messages_per_trigger, size
            case ReadMinRows():   # minMessagesPerTrigger alone: the gate applied it
                return self.options.max_messages_per_trigger, self.options.max_bytes_per_trigger
            case _:
                raise TypeError(f"the quorumqueue source does not support read limit {limit!r}")

    def _learn_end(self, queue: str, lease: str, start: int) -> None:
        if queue in self._held:
            return
        # grow by 0: creates the lease if new, sets its timeout, tells its end
        try:
            self._grow(queue, lease, 0, 0)
        except ManagementError as error:
            self._check_fenced(queue, lease, start, error)
            if self._gone(queue, error):
                return
            raise
        if self._held[queue] < start:
            raise LeaseLostError(
                f"lease '{lease}' on queue '{queue}' ends at sequence {self._held[queue]}, "
                f"but the checkpoint has already read up to {start}: the broker does not "
                "hold this query's lease (another broker or a wiped data directory?). "
                "Start the query with a new checkpoint location.")
        info = self._call(lambda c: c.info(queue, lease))
        first, self._timeout_seen = info["first"], info["timeout_ms"]
        if start < first - 1:
            # Only settled through commit(), which never passes a logged batch's start:
            # someone else settled these, or the lease expired and they went back.
            what = (f"messages {start + 1}..{first - 1} of lease '{lease}' on queue "
                    f"'{queue}', assigned to this query but not yet in a batch, are no longer "
                    "in the lease (an expired leaseTimeout, or lease.settle/lease.release "
                    "from outside the query)")
            if self.options.fail_on_data_loss:
                raise DataLossError(f"{what}. Set option 'failOnDataLoss' to false to go on "
                                    "without them.")
            log.warning("going on without them: %s", what)

    def _grow(self, queue: str, lease: str, count: int, max_bytes: int) -> None:
        timeout = self._timeout_ms(lease)
        try:
            _first, end = self._call(lambda c: c.grow(queue, lease, count, max_bytes, timeout))
        except ManagementError as error:
            if queue in self._held:  # fenced while the query runs: say so
                self._check_fenced(queue, lease, self._batch_end.get(queue, 0), error)
            raise
        self._held[queue] = end
        self._touched = time.monotonic()

    def _timeout_ms(self, lease: str) -> int | None:
        """The timeout to grow `lease` with: option leaseTimeout (None: the broker's
        lease_timeout), at most PROVISIONAL_LEASE_TIMEOUT_MS until a checkpoint names
        a lease this process created."""
        configured = self.options.lease_timeout_ms
        if self._initial is None or lease != self._initial.lease or lease in self._confirmed:
            return configured
        return min(configured or PROVISIONAL_LEASE_TIMEOUT_MS, PROVISIONAL_LEASE_TIMEOUT_MS)

    def _keep_alive(self, queues: tuple[str, ...], lease: str) -> None:
        """Touch the lease (a grow by 0) if it has not been grown or settled for
        KEEPALIVE_SECONDS or a quarter of its timeout, so that a query idling between
        messages never has its held batch given back."""
        timeout = self._timeout_seen
        if timeout == 0:
            return  # the lease never times out
        every = KEEPALIVE_SECONDS if not timeout else min(KEEPALIVE_SECONDS, timeout / 4000)
        if time.monotonic() - self._touched < every:
            return
        for queue in queues:
            self._grow(queue, lease, 0, 0)

    def _check_fenced(self, queue: str, lease: str, checkpoint: int,
                      error: ManagementError) -> None:
        """Raise LeaseFencedError if `error` is the broker refusing a fenced lease;
        `checkpoint`: where this query's last logged batch ends on `queue`."""
        if FENCED not in str(error):
            return
        try:
            fence = self._call(lambda c: c.info(queue, lease)).get("fence") or {}
        except ManagementError:
            fence = {}
        message_alone()  # the message is the first line the user sees
        raise LeaseFencedError(fenced_text(lease, queue, checkpoint, fence,
                                           self.options.lease_timeout_ms)) from None

    def _confirm(self, lease: str) -> None:
        """A checkpointed offset names `lease`: give it the configured timeout."""
        if lease in self._confirmed:
            return
        provisional = self._timeout_ms(lease) != self.options.lease_timeout_ms
        self._confirmed.add(lease)
        if provisional:
            for queue in self._queues:
                self._grow(queue, lease, 0, 0)
            if self._queues:  # the timeout it has now (the broker's, if not configured)
                self._timeout_seen = self._call(
                    lambda c: c.info(self._queues[0], lease))["timeout_ms"]

    def _call(self, operation: Callable[[LeaseClient], T]) -> T:
        """Run one request on the driver's connection; a lost broker is retried for
        option reconnectTimeout, across every node of `uri` (reconnect.py)."""
        return self._driver.call(operation)


class _Refused(Exception):
    """A node refused a lease range; another node of `uri` may not."""


# A replica still applying the log it had when its node restarted refuses a range
# with this text (the bundled broker, broker/node/leases.py REPLAYING): it cannot
# tell yet whether the lease holds the range. Every node of a cluster restarted at
# once says so until a new leader commits; the read retries it for option
# reconnectTimeout, as a lost broker, instead of counting it as a refusal.
REPLAYING = "still applying its log after a restart"


class _NotYetApplied(Exception):
    """A restarted replica cannot answer for the range yet (REPLAYING)."""


def fenced_text(lease: str, queue: str, checkpoint: int, fence: dict,
                configured_timeout_ms: int | None) -> str:
    """The first line of a fenced query's error: what went back, what to do."""
    first, end = fence.get("first"), fence.get("end")
    if fence.get("reason") == "timeout":
        how = (f"was given back to the queue after {fence.get('timeout_ms', 0) / 1000:g}s "
               "idle (option 'leaseTimeout'" + (")" if configured_timeout_ms is not None
                                                else ", else the broker's lease_timeout)"))
    else:
        how = "was released by an operator (queues release_lease, /api/leases, the web UI)"
    if first is None:
        which = "its messages"
    else:
        batched = min(end, checkpoint)
        which = f"its messages with offsets {first}..{end}"
        if batched >= first:
            which += (f" (offsets {first}..{batched} in this checkpoint's last batch or "
                      "two, which its sink may already hold)")
    return (f"quorumqueue source: lease '{lease}' on queue '{queue}' {how} while this "
            f"query was away: {which} went back to the queue, where another query or "
            "consumer may read them, so this checkpoint cannot go on exactly once. Start "
            "the query with a new checkpoint location: it reads the queue from its head, "
            "those messages included (de-duplicate them in the sink if it holds some). "
            "Nothing was lost. To keep a checkpoint across longer stops, set option "
            "'leaseTimeout' (or the broker's lease_timeout) above the longest stop.")


def _untried_first(addresses, refused_by: list[str]) -> list:
    """`addresses`, those that have not refused the range first (order kept)."""
    return ([a for a in addresses if a.redacted not in refused_by]
            + [a for a in addresses if a.redacted in refused_by])


# An executor's Python worker runs one partition after another: the connection of a
# range read to its end is kept for the next (per address), so a batch's tasks do not
# each pay an AMQP handshake; one the broker closed meanwhile is not reused.
_KEPT: dict[tuple, RangeReader] = {}


def _executor_client(address) -> tuple[RangeReader, str]:
    from ..client.range_reader import RangeReader

    key = (address.uri, address.vhost, address.tls)
    kept = _KEPT.pop(key, None)
    if kept is not None and kept.idle():
        kept.reused = True
        return kept, address.redacted
    if kept is not None:
        _close_quietly(kept)
    reader = RangeReader(address.uri, vhost=address.vhost, tls=address.tls)
    reader.pool_key = key
    return reader, address.redacted


def _keep(reader: RangeReader) -> None:
    if reader.idle():
        previous = _KEPT.pop(reader.pool_key, None)
        if previous is not None and previous is not reader:
            _close_quietly(previous)
        _KEPT[reader.pool_key] = reader
    else:
        _close_quietly(reader)


def _close_quietly(client: LeaseClient | RangeReader) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - a broken connection cannot close cleanly
        pass


def _ready(client: LeaseClient, queue: str) -> int:
    """Ready messages in `queue` (AMQP queue.declare, passive; no answer within the
    client's timeout is a lost broker to reconnect.py)."""
    return client.ready(queue)


def matching_queues(rows: list[dict], pattern) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(quorum queues, other queues) among queues.list `rows` whose whole name matches
    `pattern` (a compiled regular expression), by name."""
    matched = sorted((row["name"], row["type"]) for row in rows
                     if pattern.fullmatch(row["name"]))
    return (tuple(name for name, kind in matched if kind == "quorum"),
            tuple(name for name, kind in matched if kind != "quorum"))


def _contiguous(part: LeaseRange,
                chunks: Iterator[EntryColumns]) -> Iterator[EntryColumns]:
    """The chunks of a read of `part`, checked to be exactly its sequences, in order."""
    low = part.start
    for chunk in chunks:
        if chunk:
            high = low + len(chunk)
            if high > part.end:
                raise DataLossError(f"reading ({part.start}, {part.end}] of lease "
                                    f"'{part.lease}' on queue '{part.queue}' returned more "
                                    f"than {part.end - part.start} messages")
            if chunk.first_seq != low + 1:  # an entries chunk's sequences are consecutive
                raise DataLossError(f"reading ({low}, {high}] of lease '{part.lease}' on "
                                    f"queue '{part.queue}' returned sequences "
                                    f"{chunk.first_seq}..{chunk.last_seq}, not "
                                    f"{low + 1}..{high}")
            low = high
            yield chunk
    if low != part.end:
        raise DataLossError(f"reading ({part.start}, {part.end}] of lease '{part.lease}' on "
                            f"queue '{part.queue}' ended after sequence {low}")


def _check_contiguous(part: LeaseRange, low: int, high: int, seqs: list[int]) -> None:
    if seqs != list(range(low + 1, high + 1)):
        raise DataLossError(f"reading ({low}, {high}] of lease '{part.lease}' on queue "
                            f"'{part.queue}' returned sequences {_summary(seqs)}, not "
                            f"{low + 1}..{high}")


def _summary(seqs: list[int]) -> str:
    if not seqs:
        return "none"
    return f"{seqs[0]}..{seqs[-1]} ({len(seqs)} messages)"

"""The fault suite's two extra workloads and their checkers: single active consumer
and at-least-once dead lettering (issue 17's last two checkers).

**Single active consumer** (`SacWorkload`, checked by `sac_violations`): a quorum
queue with `x-single-active-consumer: true`, a confirmed publisher (one message at
a time, so the queue's order is the publish order), and three manual-ack consumers
(prefetch 10) that start on different nodes and reconnect like the main workload's
consumer. A *session* is one consumer's one connection; its consumer tag names it.
Each delivery is recorded with its receive time, session, node and redelivered
flag; each publish with its time; each session that failed with the time the client saw
its connection or channel fail (a session stopped at the end is no cause). What RabbitMQ's consumers guide ("Single Active Consumer")
promises, and what the leader's view means under faults: one consumer at a time is
handed messages; the queue hands over to the next one only when the active one is
gone from the leader's view (its channel or connection closed, or its node taken
for down: killed, paused or cut off). A consumer cut off may still receive, late,
what the leader sent it before it took it for gone (a partition that stalls bytes
releases them at the heal). So receive times cannot order the handovers; the queue
order can. The checker:

1. takes the *fresh* deliveries (redelivered=false) of confirmed ids delivered
   fresh exactly once (an unconfirmed id may have been enqueued late, out of
   publish order; a duplicate has a second queue position), sorted by publish
   sequence: this is the order the leader handed them out (FIFO, one active
   consumer). Each session must receive its own in that order (rule 1);
2. splits that sequence into runs of one session; each change of session is a
   *handover* from S to T, and it must have a cause the leader could see between
   S's last message of the run and T's first: a fault in force (from its strike to
   HANDOVER_GRACE seconds after its heal) at some moment from the publish of S's
   last message (S was active when it was handed out, after its publish) to T's
   first receipt (the leader handed over before handing it out), or S's session
   ended by then (the client notices a dead connection up to NOTICE seconds late).
   A handover with no cause is a second active consumer (rule 2).

It does not ask which node a fault struck (a fault anywhere excuses a handover in
its window), so it is sound and loose while faults are in force, and strict in the
calm between them and before the first.

**At-least-once dead lettering** (`DlxWorkload`, checked by `dlx_violations`): a
source quorum queue with `x-dead-letter-strategy: at-least-once`, `x-overflow:
reject-publish` and the default exchange routing its dead letters to a target
quorum queue; a confirmed publisher into the source; a consumer of the source that
rejects (requeue=false) every id whose sequence number is a multiple of
REJECT_EVERY and acks the others; a consumer of the target that acks everything.
The checker: every confirmed id of the rejected subset, and every id the source
consumer rejected, is in the target at least once (lossless; duplicates counted,
the guide allows them; a missing id the consumer never rejected is reported apart:
the source never handed it out, so dead lettering never had it); every other confirmed id was delivered from the source
(nothing confirmed lost there); nothing outside the rejected subset, and nothing
never published, is in the target.

Not here: the main workload (tests/support/history.py), running and tabling (run.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import pika

from tests.support.history import (
    ID_HEADER, AckingConsumer, ConfirmedPublisher, Delivery, History, _Client, _ids,
    declare_quorum_queue)

SAC_QUEUE = "fault-suite-sac"
DLX_SOURCE, DLX_TARGET = "fault-suite-dlx-src", "fault-suite-dlx-dst"
SAC_CONSUMERS = 3
HANDOVER_GRACE = 5.0   # s after a heal the leader may still act on the fault
NOTICE = 10.0          # s a client may take to notice its connection is dead
REJECT_EVERY = 3       # the source consumer rejects ids m-000003, m-000006, ...
# a dead letter a target refused (its leader down) is sent again after this (ms;
# RabbitMQ's default is 180 s, longer than a run's drain)
DLX_CONFIG = "dead_letter_worker_publisher_confirm_timeout = 1000\n"


def sequence(message_id: str) -> int | None:
    try:
        return int(message_id.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return None


class TimedHistory(History):
    """A History that also keeps the time each id was published."""

    def __init__(self) -> None:
        super().__init__()
        self.published_at: dict[str, float] = {}

    def record(self, kind: str, value) -> None:
        if kind == "published":
            with self.lock:
                self.published_at[value] = time.monotonic()
        super().record(kind, value)


# ---------------------------------------------------------------- single active consumer


@dataclass(frozen=True, slots=True)
class SacDelivery:
    time: float
    session: str
    id: str
    redelivered: bool
    node: str = ""


@dataclass
class SacHistory:
    """What the SAC checker needs (times are time.monotonic())."""

    published_at: dict[str, float] = field(default_factory=dict)
    confirmed: set[str] = field(default_factory=set)
    deliveries: list[SacDelivery] = field(default_factory=list)
    session_ends: dict[str, float] = field(default_factory=dict)  # failed, not stopped
    faults: list[tuple[float, float]] = field(default_factory=list)  # strike, heal


def sac_violations(history: SacHistory) -> tuple[list[str], dict[str, int]]:
    """The broken rules (module header) and counts: handovers, sessions, fresh."""
    fresh = Counter(d.id for d in history.deliveries if not d.redelivered)
    ordered = sorted(
        (d for d in history.deliveries
         if not d.redelivered and d.id in history.confirmed and fresh[d.id] == 1
         and sequence(d.id) is not None and d.id in history.published_at),
        key=lambda d: sequence(d.id))
    found = []
    by_session: dict[str, list[SacDelivery]] = {}
    for delivery in sorted(ordered, key=lambda d: d.time):
        by_session.setdefault(delivery.session, []).append(delivery)
    for session, got in sorted(by_session.items()):
        behind = [b.id for a, b in zip(got, got[1:]) if sequence(b.id) < sequence(a.id)]
        if behind:
            found.append(f"session {session} received out of queue order: {_ids(behind)}")
    handovers, unexplained = 0, []
    zero = min(history.published_at.values(), default=0.0)  # times shown from the 1st publish
    for before, after in zip(ordered, ordered[1:]):
        if before.session == after.session:
            continue
        handovers += 1
        low = history.published_at[before.id]
        high = after.time
        fault = any(start <= high and heal + HANDOVER_GRACE >= low
                    for start, heal in history.faults)
        ended = history.session_ends.get(before.session)
        gone = ended is not None and ended <= high + NOTICE
        if not (fault or gone):
            unexplained.append(f"{before.session}->{after.session} between {before.id} and "
                               f"{after.id} ({low - zero:.1f}-{high - zero:.1f}s)")
    if unexplained:
        shown = "; ".join(unexplained[:10])
        more = f" ... and {len(unexplained) - 10} more" if len(unexplained) > 10 else ""
        found.append(f"single active consumer handed over with no fault and no session "
                     f"end (two active): {len(unexplained)}: {shown}{more}")
    counts = {"handovers": handovers, "sessions": len({d.session for d in history.deliveries}),
              "fresh": len(ordered)}
    return found, counts


class SacConsumer(_Client):
    """A manual-ack consumer whose every connection is a session named by its
    consumer tag (`{name}-{connection number}`)."""

    role = "sac consumer"

    def __init__(self, uris, queue, history: History, name: str, into: list,
                 ends: dict, *, prefetch: int = 10, **options) -> None:
        super().__init__(uris, queue, history, **options)
        self.name, self.into, self.ends, self.prefetch = name, into, ends, prefetch
        self.role = f"sac consumer {name}"

    def _session(self, connection, uri) -> None:
        session = f"{self.name}-{self.connections}"
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self.prefetch)

            def on_message(channel, method, properties, body) -> None:
                message_id = (properties.headers or {}).get(ID_HEADER, body.decode(
                    errors="replace"))
                if isinstance(message_id, bytes):
                    message_id = message_id.decode(errors="replace")
                with self.history.lock:
                    self.into.append(SacDelivery(time.monotonic(), session, str(message_id),
                                                 bool(method.redelivered), uri))
                channel.basic_ack(method.delivery_tag)

            channel.basic_consume(self.queue, on_message, consumer_tag=session)
            while not self.stopping.is_set():
                connection.process_data_events(time_limit=0.1)
        except BaseException:
            with self.history.lock:  # a failure, not stop(): the queue may hand over
                self.ends[session] = time.monotonic()
            raise


class SacWorkload:
    """The SAC queue, its publisher and SAC_CONSUMERS consumers (module header)."""

    def __init__(self, uris, interval: float = 0.005) -> None:
        self.uris = uris
        self.history = TimedHistory()
        self.deliveries: list[SacDelivery] = []
        self.ends: dict[str, float] = {}
        self.publisher = ConfirmedPublisher(uris, SAC_QUEUE, self.history, prefix="s",
                                            interval=interval)
        self.consumers = [SacConsumer(uris, SAC_QUEUE, self.history, f"c{n}",
                                      self.deliveries, self.ends, start_at=n)
                          for n in range(SAC_CONSUMERS)]

    def start(self) -> "SacWorkload":
        declare_quorum_queue(self.uris, SAC_QUEUE, arguments={
            "x-queue-type": "quorum", "x-single-active-consumer": True})
        for consumer in self.consumers:
            consumer.start()
        self.publisher.start()
        return self

    def delivered_ids(self) -> set[str]:
        with self.history.lock:
            return {d.id for d in self.deliveries}

    def finish(self, faults: list[tuple[float, float]], drain_timeout: float,
               missing=lambda: None) -> SacHistory:
        """Stop publishing, wait until every confirmed id was delivered, stop;
        `faults` in time.monotonic(). `missing()` is called if some confirmed id was
        still not delivered when the wait ended, before the consumers stop (their
        connections closing change the queue's consumers)."""
        try:
            self.publisher.stop()
            with self.history.lock:
                confirmed = set(self.history.confirmed)
            _wait(lambda: confirmed - self.delivered_ids(), drain_timeout)
            if confirmed - self.delivered_ids():
                missing()
        finally:
            self.stop()
        with self.history.lock:
            return SacHistory(dict(self.history.published_at), set(self.history.confirmed),
                              list(self.deliveries), dict(self.ends), list(faults))

    def stop(self) -> None:
        errors = []
        for client in [self.publisher, *self.consumers]:
            try:
                client.stop()
            except RuntimeError as error:
                errors.append(error)
        if errors:
            raise errors[0]


def ids(some) -> str:
    """Ids for a finding: the count and the first few."""
    return _ids(some)


def sac_lost(history: SacHistory) -> set[str]:
    return history.confirmed - {d.id for d in history.deliveries}


# ---------------------------------------------------------------- dead lettering


def rejected_subset(message_id: str) -> bool:
    number = sequence(message_id)
    return number is not None and number % REJECT_EVERY == 0


class RejectingConsumer(AckingConsumer):
    """Rejects (requeue=false) the ids of `rejected_subset`, acks the others; records
    every delivery, and the rejected ids in `History.nacked`."""

    role = "dlx source consumer"

    def _session(self, connection, uri) -> None:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=self.prefetch)

        def on_message(channel, method, properties, body) -> None:
            message_id = (properties.headers or {}).get(ID_HEADER, body.decode(
                errors="replace"))
            if isinstance(message_id, bytes):
                message_id = message_id.decode(errors="replace")
            message_id = str(message_id)
            self.history.record("deliveries", Delivery(message_id, bool(method.redelivered),
                                                       uri))
            if rejected_subset(message_id):
                channel.basic_reject(method.delivery_tag, requeue=False)
                self.history.record("nacked", message_id)
            else:
                channel.basic_ack(method.delivery_tag)
                self.history.record("acked", message_id)

        channel.basic_consume(self.queue, on_message)
        while not self.stopping.is_set():
            connection.process_data_events(time_limit=0.1)


@dataclass
class DlxHistory:
    published: set[str]
    confirmed: set[str]
    source_delivered: set[str]
    rejected: set[str]                  # ids the source consumer sent basic.reject for
    target: list[str]                   # ids delivered from the target, in order


def dlx_violations(history: DlxHistory) -> tuple[list[str], dict[str, int]]:
    target = Counter(history.target)
    should_die = {i for i in history.confirmed if rejected_subset(i)} | history.rejected
    found = []
    lost = should_die - set(target)
    if lost & history.rejected:
        found.append(f"rejected but never in the dead-letter target (lost): "
                     f"{_ids(lost & history.rejected)}")
    if lost - history.rejected:  # the source never handed them out to be rejected
        found.append(f"confirmed, never rejected by the source consumer, never in the "
                     f"dead-letter target (lost before dead lettering): "
                     f"{_ids(lost - history.rejected)}")
    kept = {i for i in history.confirmed if not rejected_subset(i)}
    lost_source = kept - history.source_delivered
    if lost_source:
        found.append(f"confirmed but never delivered from the source (lost): "
                     f"{_ids(lost_source)}")
    stray = {i for i in target if not rejected_subset(i) or i not in history.published}
    if stray:
        found.append(f"in the dead-letter target but never rejected or never published: "
                     f"{_ids(stray)}")
    counts = {"rejected": len(should_die), "in_target": len(set(target) & should_die),
              "target_duplicates": sum(1 for n in target.values() if n > 1)}
    return found, counts


class DlxWorkload:
    """The source and target queues, the publisher and both consumers (module header)."""

    def __init__(self, uris, interval: float = 0.005) -> None:
        self.uris = uris
        self.history = History()          # the source: published, confirmed, deliveries
        self.target = History()           # the target's deliveries
        self.publisher = ConfirmedPublisher(uris, DLX_SOURCE, self.history, prefix="d",
                                            interval=interval)
        self.source_consumer = RejectingConsumer(uris, DLX_SOURCE, self.history, start_at=1)
        self.target_consumer = AckingConsumer(uris, DLX_TARGET, self.target, start_at=2)

    def start(self) -> "DlxWorkload":
        declare_quorum_queue(self.uris, DLX_TARGET)
        declare_quorum_queue(self.uris, DLX_SOURCE, arguments={
            "x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish", "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": DLX_TARGET})
        self.source_consumer.start()
        self.target_consumer.start()
        self.publisher.start()
        return self

    def snapshot(self) -> DlxHistory:
        with self.history.lock, self.target.lock:
            return DlxHistory(set(self.history.published), set(self.history.confirmed),
                              {d.id for d in self.history.deliveries},
                              set(self.history.nacked),
                              [d.id for d in self.target.deliveries])

    def finish(self, drain_timeout: float) -> DlxHistory:
        """Stop publishing, wait until nothing is missing, stop."""
        try:
            self.publisher.stop()

            def missing():
                h = self.snapshot()
                return dlx_violations(h)[0]
            _wait(missing, drain_timeout)
        finally:
            self.stop()
        return self.snapshot()

    def stop(self) -> None:
        errors = []
        for client in (self.publisher, self.source_consumer, self.target_consumer):
            try:
                client.stop()
            except RuntimeError as error:
                errors.append(error)
        if errors:
            raise errors[0]


def _wait(missing, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while missing() and time.monotonic() < deadline:
        time.sleep(0.1)


"""A fault-test workload (a confirmed publisher, a manual-ack consumer) and its checker.

The workload: `ConfirmedPublisher` publishes persistent messages one at a time with
publisher confirms, each carrying a unique id (the body, `message_id` and the header
`x-history-id`), and `AckingConsumer` consumes with manual acks. Each runs in a
thread of its own and, when its connection or channel fails, reconnects to the next
node of its list (a list, or a callable such as `LocalCluster.live_uris`) and
carries on. Both write into one `History`:

- published: every id handed to basic.publish, in order (an id is published once;
  after a failure the publisher moves on to a new id);
- confirmed (basic.ack), nacked (basic.nack, or returned as unroutable) and unknown
  (the connection failed before an answer: the broker may or may not hold it);
- deliveries: (id, redelivered flag, node uri) in arrival order, and acked: the ids
  whose basic.ack the consumer sent.

The checker (`violations`, `check`) is pure: given a History it states

1. every confirmed id was delivered at least once (nothing confirmed is lost);
2. every delivered id was published (nothing appears from nowhere);
3. no id that was not confirmed was delivered twice with redelivered=false (a
   message whose outcome the publisher never learned is stored at most once).
   With `strict_duplicates=True` this holds for confirmed ids too;

each violation naming the offending ids, and `Report` counts what happened.

Not here: the faults themselves (cluster.py), waiting for leaders.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pika
import pika.exceptions

ID_HEADER = "x-history-id"
SHOWN = 20  # ids listed per violation before "... and n more"

Uris = Sequence[str] | Callable[[], Sequence[str]]


@dataclass(frozen=True, slots=True)
class Delivery:
    id: str
    redelivered: bool
    node: str = ""  # the URI of the node that delivered it


@dataclass
class History:
    """What the clients saw; appended to from their threads under `lock`."""

    published: list[str] = field(default_factory=list)
    confirmed: list[str] = field(default_factory=list)
    nacked: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # reconnections and errors, timed
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, kind: str, value) -> None:
        with self.lock:
            getattr(self, kind).append(value)

    def note(self, who: str, what: str) -> None:
        self.record("events", f"{time.monotonic():.3f} {who}: {what}")

    def delivered_ids(self) -> set[str]:
        with self.lock:
            return {delivery.id for delivery in self.deliveries}

    def to_json(self) -> str:
        """For a failing test's artifacts: everything, as JSON."""
        with self.lock:
            return json.dumps({
                "published": self.published, "confirmed": self.confirmed,
                "nacked": self.nacked, "unknown": self.unknown,
                "deliveries": [[d.id, d.redelivered, d.node] for d in self.deliveries],
                "acked": self.acked, "events": self.events}, indent=1)


@dataclass(frozen=True, slots=True)
class Report:
    published: int
    confirmed: int
    nacked: int
    unknown: int
    deliveries: int  # every delivery, redeliveries included
    delivered: int  # distinct ids
    redelivered: int  # deliveries flagged redelivered
    duplicated_new: int  # ids delivered twice or more with redelivered=false
    acked: int

    def __str__(self) -> str:
        return (f"published {self.published}: confirmed {self.confirmed}, nacked "
                f"{self.nacked}, unknown {self.unknown}; delivered {self.delivered} ids in "
                f"{self.deliveries} deliveries ({self.redelivered} redelivered, "
                f"{self.duplicated_new} ids twice as new); acked {self.acked}")


def violations(history: History, strict_duplicates: bool = False) -> list[str]:
    """The checker's findings, one sentence per broken rule, naming the ids."""
    published = set(history.published)
    confirmed = set(history.confirmed)
    delivered = {d.id for d in history.deliveries}
    new_counts = Counter(d.id for d in history.deliveries if not d.redelivered)
    twice_new = {i for i, n in new_counts.items() if n > 1}
    found = []
    lost = confirmed - delivered
    if lost:
        found.append(f"confirmed but never delivered (lost): {_ids(lost)}")
    invented = delivered - published
    if invented:
        found.append(f"delivered but never published: {_ids(invented)}")
    duplicated = twice_new if strict_duplicates else twice_new - confirmed
    if duplicated:
        which = "" if strict_duplicates else "not confirmed, yet "
        found.append(f"{which}delivered twice or more with redelivered=false: "
                     f"{_ids(duplicated, new_counts)}")
    return found


def report(history: History) -> Report:
    new_counts = Counter(d.id for d in history.deliveries if not d.redelivered)
    return Report(
        published=len(history.published), confirmed=len(set(history.confirmed)),
        nacked=len(set(history.nacked)), unknown=len(set(history.unknown)),
        deliveries=len(history.deliveries),
        delivered=len({d.id for d in history.deliveries}),
        redelivered=sum(d.redelivered for d in history.deliveries),
        duplicated_new=sum(1 for n in new_counts.values() if n > 1),
        acked=len(set(history.acked)))


def check(history: History, strict_duplicates: bool = False) -> Report:
    """The Report, or AssertionError listing every violation and the counts."""
    with history.lock:
        found = violations(history, strict_duplicates)
        counts = report(history)
    if found:
        raise AssertionError("history check failed:\n- " + "\n- ".join(found)
                             + f"\n({counts})")
    return counts


def _ids(ids: Iterable[str], counts: Counter | None = None) -> str:
    ordered = sorted(ids)
    shown = [f"{i} (x{counts[i]})" if counts else i for i in ordered[:SHOWN]]
    more = f" ... and {len(ordered) - SHOWN} more" if len(ordered) > SHOWN else ""
    return f"{len(ordered)} ids: {', '.join(shown)}{more}"


# -- the clients ----------------------------------------------------------------------

FAILURES = (pika.exceptions.AMQPError, OSError)  # connection, channel and socket errors


def connection_parameters(uri: str) -> pika.URLParameters:
    """Parameters that notice a dead or paused node within seconds."""
    parameters = pika.URLParameters(uri)
    parameters.heartbeat = 2
    parameters.socket_timeout = 2
    parameters.stack_timeout = 5
    parameters.blocked_connection_timeout = 5
    parameters.connection_attempts = 1
    return parameters


class _Client:
    """A thread that runs `_session` on a connection to one node after another."""

    role = "client"

    def __init__(self, uris: Uris, queue: str, history: History, *, start_at: int = 0,
                 retry_pause: float = 0.2) -> None:
        self.uris, self.queue, self.history = uris, queue, history
        self.next_uri = start_at
        self.retry_pause = retry_pause
        self.stopping = threading.Event()
        self.connections = 0  # successful connections so far
        self.error: BaseException | None = None  # what ended the thread, if not stop()
        self._thread: threading.Thread | None = None

    def start(self) -> "_Client":
        self._thread = threading.Thread(target=self._run, name=f"history {self.role}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError(f"the {self.role} thread did not stop within {timeout}s")
            self._thread = None
        error, self.error = self.error, None  # raised once, by the first stop()
        if error is not None:
            raise RuntimeError(f"the {self.role} failed: {error!r}") from error

    def _candidates(self) -> list[str]:
        uris = list(self.uris() if callable(self.uris) else self.uris)
        if not uris:
            return []
        start = self.next_uri % len(uris)
        self.next_uri += 1
        return uris[start:] + uris[:start]

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                for uri in self._candidates() or [None]:
                    if self.stopping.is_set() or uri is None:
                        break
                    self._connect_and_serve(uri)
                self.stopping.wait(self.retry_pause)
        except BaseException as error:  # noqa: BLE001 - reported by stop()
            self.error = error

    def _connect_and_serve(self, uri: str) -> None:
        try:
            connection = pika.BlockingConnection(connection_parameters(uri))
        except FAILURES as error:
            self.history.note(self.role, f"cannot connect to {uri}: {error!r}")
            return
        except ValueError as error:
            # pika raises ValueError when the socket is reset between its TCP connect
            # and its stream setup (a node killed at that moment): a failed connect
            if "Expected connected socket" not in str(error):
                raise
            self.history.note(self.role, f"cannot connect to {uri}: {error!r}")
            return
        self.connections += 1
        self.history.note(self.role, f"connected to {uri}")
        try:
            self._session(connection, uri)
        except FAILURES as error:
            self.history.note(self.role, f"lost {uri}: {error!r}")
        finally:
            try:
                if connection.is_open:
                    connection.close()
            except FAILURES:
                pass

    def _session(self, connection: pika.BlockingConnection, uri: str) -> None:
        raise NotImplementedError


class ConfirmedPublisher(_Client):
    """Publishes ids `{prefix}-000001`... one at a time, each waiting for its confirm,
    until stop() or `count` messages; `interval` seconds between publishes."""

    role = "publisher"

    def __init__(self, uris: Uris, queue: str, history: History, *, prefix: str = "m",
                 count: int | None = None, interval: float = 0.0, **options) -> None:
        super().__init__(uris, queue, history, **options)
        self.prefix, self.count, self.interval = prefix, count, interval
        self.sent = 0

    def done(self) -> bool:
        return self.count is not None and self.sent >= self.count

    def _session(self, connection, uri) -> None:
        channel = connection.channel()
        channel.confirm_delivery()
        while not self.stopping.is_set() and not self.done():
            self.sent += 1
            message_id = f"{self.prefix}-{self.sent:06d}"
            self.history.record("published", message_id)
            try:
                channel.basic_publish("", self.queue, message_id.encode(),
                                      pika.BasicProperties(delivery_mode=2,
                                                           message_id=message_id,
                                                           headers={ID_HEADER: message_id}),
                                      mandatory=True)
            except (pika.exceptions.NackError, pika.exceptions.UnroutableError) as error:
                self.history.record("nacked", message_id)
                self.history.note(self.role, f"{message_id}: {type(error).__name__}")
            except BaseException:
                self.history.record("unknown", message_id)
                raise
            else:
                self.history.record("confirmed", message_id)
            if self.interval:
                self.stopping.wait(self.interval)
        if self.done():
            self.stopping.set()


class AckingConsumer(_Client):
    """Consumes with manual acks (prefetch `prefetch`), acking each delivery once
    recorded; `wait_for(ids)` blocks until all of them were delivered."""

    role = "consumer"

    def __init__(self, uris: Uris, queue: str, history: History, *, prefetch: int = 20,
                 **options) -> None:
        super().__init__(uris, queue, history, **options)
        self.prefetch = prefetch

    def _session(self, connection, uri) -> None:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=self.prefetch)

        def on_message(channel, method, properties, body) -> None:
            headers = properties.headers or {}
            message_id = headers.get(ID_HEADER)
            if isinstance(message_id, bytes):
                message_id = message_id.decode(errors="replace")
            if not isinstance(message_id, str):
                message_id = f"<no {ID_HEADER}: body {body[:40]!r}>"
            self.history.record("deliveries", Delivery(message_id,
                                                       bool(method.redelivered), uri))
            channel.basic_ack(method.delivery_tag)
            self.history.record("acked", message_id)

        channel.basic_consume(self.queue, on_message)
        while not self.stopping.is_set():
            connection.process_data_events(time_limit=0.1)

    def wait_for(self, ids: Iterable[str], timeout: float) -> set[str]:
        """Wait until every id was delivered; returns those still missing."""
        wanted = set(ids)
        deadline = time.monotonic() + timeout
        while True:
            missing = wanted - self.history.delivered_ids()
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.05)


def declare_quorum_queue(uris: Uris, queue: str, timeout: float = 10.0,
                         arguments: dict | None = None) -> None:
    """Declare a durable quorum queue (or one with `arguments`) through any node of
    `uris`, retrying while they refuse (no metadata leader yet) until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        for uri in list(uris() if callable(uris) else uris):
            try:
                connection = pika.BlockingConnection(connection_parameters(uri))
                try:
                    connection.channel().queue_declare(
                        queue, durable=True,
                        arguments=arguments or {"x-queue-type": "quorum"})
                    return
                finally:
                    if connection.is_open:
                        connection.close()
            except FAILURES:
                if time.monotonic() > deadline:
                    raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"no node to declare {queue!r} on within {timeout:g}s")
        time.sleep(0.2)


class Workload:
    """A publisher and a consumer on one queue, both following `uris`:

        with Workload(cluster.live_uris, "q") as workload:
            ...faults...
        check(workload.finish())      # stop publishing, drain, stop consuming
    """

    def __init__(self, uris: Uris, queue: str, *, interval: float = 0.0,
                 count: int | None = None, declare: bool = True, prefix: str = "m") -> None:
        self.uris, self.queue, self.declare = uris, queue, declare
        self.history = History()
        self.publisher = ConfirmedPublisher(uris, queue, self.history, interval=interval,
                                            count=count, prefix=prefix)
        self.consumer = AckingConsumer(uris, queue, self.history, start_at=1)

    def start(self) -> "Workload":
        if self.declare:
            declare_quorum_queue(self.uris, self.queue)
        self.consumer.start()
        self.publisher.start()
        return self

    def finish(self, drain_timeout: float = 30.0) -> History:
        """Stop publishing, wait (up to drain_timeout) until every confirmed message
        was delivered, stop consuming; the History is then complete."""
        try:
            self.publisher.stop()
            with self.history.lock:
                confirmed = list(self.history.confirmed)
            missing = self.consumer.wait_for(confirmed, drain_timeout)
            if missing:
                self.history.note("workload", f"{len(missing)} confirmed ids still not "
                                              f"delivered after {drain_timeout:g}s")
        finally:
            self.stop()
        return self.history

    def stop(self) -> None:
        """Stop both clients (idempotent); the first error of either is raised."""
        try:
            self.publisher.stop()
        finally:
            self.consumer.stop()

    def __enter__(self) -> "Workload":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

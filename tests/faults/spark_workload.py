"""The Spark connector as a fault-suite workload: a lease-mode stream into Delta.

What it runs, on a LocalCluster (tests/support/cluster.py) while a nemesis strikes:

- a confirmed publisher (tests/support/history.py's ConfirmedPublisher: one message
  at a time, each with a unique id as its body, `message_id` and `x-history-id`)
  that reconnects to another live node when its connection fails;
- a streaming query, `spark.readStream.format("quorumqueue")` in lease mode (the
  connector's exactly-once mode, connector/README.md "Lease mode") over every node
  of the cluster (option `uri`, tried in order), into a Delta table through Delta's
  own streaming sink (`writeStream.format("delta")`, idempotent per query id and
  batch id), with a checkpoint. It rides out the faults as a user's query would:
  the connector reconnects (option `reconnectTimeout`, here 120 s: a loaded 2-core
  machine can take long to elect), nobody restarts it.

When the nemesis is done, `finish` stops the publisher and waits (a generous bound)
until the running query has written every confirmed id (if it died instead, or did
not catch up in time, `query_failure` says so and run.py fails the run, after
checking the table all the same); then it stops the query and
starts it again from its checkpoint with Trigger.AvailableNow, which reads what the
queue still holds and stops (a restart must add nothing twice either). The Delta
table, read last, becomes the History's deliveries (one per row, none flagged
redelivered), so history.py's checker with `strict_duplicates=True` is the
exactly-once check: every confirmed id in the table, nothing that was never
published, no id in two rows (an unconfirmed id at most once too). `diagnose_rows`
tells apart, for duplicated ids, two copies in the queue (two lease offsets) from
one offset written twice (the sink).

Not here: the nemeses (nemesis.py), the run loop, table and plots (run.py).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.cluster import CONVERGE_TIMEOUT, LocalCluster
from tests.support.history import (ConfirmedPublisher, Delivery, History,
                                   declare_quorum_queue)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

QUEUE = "fault-suite-spark"
# the nemeses the Spark runs cycle through: the leader killed, isolated, paused
NEMESES = ("kill-leader", "isolate-leader", "pause-long")
MAX_PER_TRIGGER = 2000
RECONNECT_TIMEOUT = "120s"
CATCH_UP_TIMEOUT = 2 * CONVERGE_TIMEOUT  # the running query writing every confirmed id
POLL_TABLE_EVERY = 2.0
COLUMNS = ("message_id", "queue", "offset", "delivery_count", "redelivered")

_session_lock = threading.Lock()


def spark_session() -> "SparkSession":
    """The process's local Delta-enabled SparkSession (jobs/delta.py's settings): the
    one running already (a test run's), else a new one. Left running for the next
    Spark run; whoever made it stops it."""
    from pyspark.sql import SparkSession

    from quorumqueue.jobs.delta import local_spark_conf, use_this_interpreter

    with _session_lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        use_this_interpreter()
        builder = SparkSession.builder
        for key, value in local_spark_conf("quorumqueue-fault-suite").items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session


def _row_counter():
    """A StreamingQueryListener counting the rows the query's batches read (by query
    run and batch: a replayed batch counts again), for the plot's delivered curve."""
    from pyspark.sql.streaming import StreamingQueryListener

    class RowCounter(StreamingQueryListener):
        def __init__(self) -> None:
            self.rows: dict[tuple[str, int], int] = {}
            self.lock = threading.Lock()  # py4j's callback thread writes, the sampler reads

        def onQueryStarted(self, event) -> None:
            pass

        def onQueryProgress(self, event) -> None:
            progress = event.progress
            with self.lock:
                self.rows[(str(progress.runId), progress.batchId)] = progress.numInputRows

        def onQueryIdle(self, event) -> None:
            pass

        def onQueryTerminated(self, event) -> None:
            pass

        def total(self) -> int:
            with self.lock:
                return sum(self.rows.values())

    return RowCounter()


class SparkWorkload:
    """The confirmed publisher and the lease-mode query into Delta (module header).

    The interface run.py drives, as history.Workload's: `start()`, `history`,
    `delivered()` (for the sampler), `finish(drain_timeout)`, `stop()`; plus
    `started()`: the query has written a first batch."""

    def __init__(self, cluster: LocalCluster, queue: str = QUEUE, *,
                 interval: float = 0.002, spark: "SparkSession | None" = None) -> None:
        self.cluster, self.queue = cluster, queue
        self.spark = spark
        self.history = History()
        self.publisher = ConfirmedPublisher(cluster.live_uris, queue, self.history,
                                            interval=interval)
        self.workdir = Path(tempfile.mkdtemp(prefix="qq-faults-spark-"))
        self.table = self.workdir / "table"
        self.checkpoint = self.workdir / "checkpoint"
        self.query: StreamingQuery | None = None
        self.counter = None
        self.rows: list[tuple] = []  # the Delta table's COLUMNS, read by finish()
        # why the running query stopped before catching up ("" if it did not): the
        # connector must ride the faults out, so run.py fails such a run
        self.query_failure = ""

    # -- the interface run.py drives ------------------------------------------------

    def start(self) -> "SparkWorkload":
        declare_quorum_queue(self.cluster.live_uris, self.queue)
        self.spark = self.spark or spark_session()
        self.counter = _row_counter()
        self.spark.streams.addListener(self.counter)
        self.query = self._start_query(available_now=False)
        self.publisher.start()
        return self

    def delivered(self) -> int:
        return self.counter.total() if self.counter is not None else 0

    def started(self) -> bool:
        """The query has read a first batch (or died: then the run's wait ends too)."""
        if self.query is not None and not self.query.isActive:
            raise RuntimeError(f"the query stopped: {self.query.exception()}")
        return self.delivered() > 0

    def finish(self, drain_timeout: float = CATCH_UP_TIMEOUT) -> History:
        """Stop publishing; wait until the running query has written every confirmed
        id; restart it from its checkpoint with Trigger.AvailableNow; read the table
        into the History."""
        try:
            self.publisher.stop()
            with self.history.lock:
                confirmed = set(self.history.confirmed)
            self._catch_up(confirmed, drain_timeout)
            self._stop_query()
            began = time.monotonic()
            self.query = self._start_query(available_now=True)
            if not self.query.awaitTermination(drain_timeout):
                self.history.note("spark", f"Trigger.AvailableNow did not end within "
                                           f"{drain_timeout:g}s")
            elif self.query.exception() is not None:
                raise RuntimeError(f"the AvailableNow query failed: "
                                   f"{self.query.exception()}")
            else:
                self.history.note("spark", f"Trigger.AvailableNow restart ended after "
                                           f"{time.monotonic() - began:.1f}s")
            self.rows = self._table_rows()
            with self.history.lock:
                self.history.deliveries.extend(
                    Delivery(str(row[0]), False, f"delta {row[1]}@{row[2]}")
                    for row in self.rows)
        finally:
            self.stop()
        return self.history

    def stop(self) -> None:
        """Stop the publisher and the query (idempotent); the publisher's error, if
        any, is raised."""
        try:
            self.publisher.stop()
        finally:
            self._stop_query()
            if self.counter is not None and self.spark is not None:
                self.spark.streams.removeListener(self.counter)
                self.counter = None

    def cleanup(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- the query ------------------------------------------------------------------

    def _start_query(self, available_now: bool) -> "StreamingQuery":
        messages = (self.spark.readStream.format("quorumqueue")
                    .option("uri", ",".join(self.cluster.uris()))
                    .option("queue", self.queue).option("mode", "lease")
                    .option("maxMessagesPerTrigger", str(MAX_PER_TRIGGER))
                    .option("reconnectTimeout", RECONNECT_TIMEOUT)
                    .load())
        writer = (messages.select(*COLUMNS).writeStream.format("delta")
                  .queryName("fault_suite_spark").outputMode("append")
                  .option("checkpointLocation", str(self.checkpoint)))
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime="500 milliseconds")
        return writer.start(str(self.table))

    def _stop_query(self) -> None:
        query, self.query = self.query, None
        if query is not None and query.isActive:
            query.stop()

    def _catch_up(self, confirmed: set[str], timeout: float) -> None:
        began = time.monotonic()
        deadline = began + timeout
        while True:
            query = self.query
            if query is None or not query.isActive:
                self.query_failure = (f"the running query stopped before catching up: "
                                      f"{query.exception() if query else None}")
                self.history.note("spark", self.query_failure)
                return
            missing = confirmed - self._table_ids()
            if not missing:
                self.history.note("spark", f"the running query holds every confirmed id "
                                           f"{time.monotonic() - began:.1f}s after publishing "
                                           "stopped")
                return
            if time.monotonic() > deadline:
                self.query_failure = (f"{len(missing)} confirmed ids still not in the table "
                                      f"after {timeout:g}s of the running query")
                self.history.note("spark", self.query_failure + "; restarting it")
                return
            time.sleep(POLL_TABLE_EVERY)

    def _table_ids(self) -> set[str]:
        if not (self.table / "_delta_log").is_dir():
            return set()
        frame = self.spark.read.format("delta").load(str(self.table))
        return {row[0] for row in frame.select("message_id").collect()}

    def _table_rows(self) -> list[tuple]:
        if not (self.table / "_delta_log").is_dir():
            return []
        frame = self.spark.read.format("delta").load(str(self.table))
        return [tuple(row) for row in frame.select(*COLUMNS).collect()]


def diagnose_rows(rows: list[tuple]) -> list[str]:
    """For ids in more than one row: which lease offsets they came from (two offsets:
    the queue held two copies; one offset twice: the sink wrote a row twice)."""
    counts = Counter(row[0] for row in rows)
    twice = {message_id for message_id, n in counts.items() if n > 1}
    by_id: dict[str, list[tuple]] = {}
    for row in rows:
        if row[0] in twice:
            by_id.setdefault(row[0], []).append(row)
    lines = []
    for message_id in sorted(by_id)[:20]:
        copies = by_id[message_id]
        offsets = Counter((row[1], row[2]) for row in copies)
        kind = ("one offset written twice (sink)" if len(offsets) < len(copies)
                else "distinct offsets (the queue held copies)")
        lines.append(f"{message_id}: {len(copies)} rows, {kind}: "
                     + ", ".join(f"{q}@{o} delivery_count={d} redelivered={r}"
                                 for _m, q, o, d, r in copies))
    return lines

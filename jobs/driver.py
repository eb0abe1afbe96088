"""The orders query (quorum queue -> Delta), and a driver process that can be killed
at a chosen step of Spark's micro-batch commit protocol.

Responsibilities
    - `start_query`: `spark.readStream.format("quorumqueue")` (lease mode) through
      `orders.order_rows` into a Delta table, with a checkpoint.
    - `DeltaBatchWriter`: the foreachBatch sink. It appends each batch with Delta's
      idempotent-write options `txnAppId` (the query's id, from the checkpoint) and
      `txnVersion` (the batch id), so a batch Spark runs again after a crash that
      followed its Delta commit adds nothing twice.
    - `StopPoint` and `run_killed_driver`: run the query in a child process (its own
      session, so its JVM and Python workers die with it) and SIGKILL the whole
      process group once it reaches a stop point of batch N.

How it works
    Spark, for batch N: write offset log N, settle the source up to N-1, run the
    batch (the sink commit: the Delta commit), write commit log N. The stop points:

    - `before-batch`: offset log N written, the batch not run (the writer blocks
      before touching the batch and drops a marker file);
    - `after-sink-commit`: Delta commit N done, commit log N not written (the writer
      blocks after the Delta write);
    - `after-commit-log`: commit log N written, source not yet settled up to N (the
      parent waits for `commits/N`; the source settles N only when batch N+1 is
      planned, so this holds as long as no message beyond batch N is ready).

    The parent waits for the marker (or commits/N), then kills. Nothing is simulated:
    the child really is in that state when SIGKILL lands.

Invariants
    - A restarted query must be built exactly as the killed one was (same source
      options and sink), which `start_query` guarantees for the job and the tests.

Not here
    The job's narrative and its evidence (orders_to_delta.py); checkpoint reading
    (checkpoint.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import checkpoint as ckpt
from .orders import order_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

STOP_POINTS = ("before-batch", "after-sink-commit", "after-commit-log")


@dataclass(frozen=True, slots=True)
class StopPoint:
    step: str       # one of STOP_POINTS
    batch_id: int

    def __post_init__(self) -> None:
        if self.step not in STOP_POINTS:
            raise ValueError(f"unknown stop point {self.step!r}; one of {STOP_POINTS}")

    @classmethod
    def parse(cls, text: str) -> "StopPoint":
        step, _, batch = text.rpartition(":")
        return cls(step, int(batch))

    def __str__(self) -> str:
        return f"{self.step}:{self.batch_id}"


@dataclass(frozen=True, slots=True)
class QueryPaths:
    table: Path
    checkpoint: Path


class DeltaBatchWriter:
    """foreachBatch: append a batch to the Delta table once, however often it runs."""

    def __init__(self, paths: QueryPaths, stop: StopPoint | None = None,
                 marker: Path | None = None) -> None:
        self.paths, self.stop, self.marker = paths, stop, marker
        self._app_id: str | None = None

    def app_id(self) -> str:
        # The query's id: kept in the checkpoint across restarts, new with a new one.
        if self._app_id is None:
            metadata = json.loads((self.paths.checkpoint / "metadata").read_text())
            self._app_id = f"quorumqueue-orders-{metadata['id']}"
        return self._app_id

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self._maybe_stop("before-batch", batch_id)
        (batch.write.format("delta").mode("append")
         .option("txnAppId", self.app_id()).option("txnVersion", batch_id)
         .save(str(self.paths.table)))
        self._maybe_stop("after-sink-commit", batch_id)

    def _maybe_stop(self, step: str, batch_id: int) -> None:
        if self.stop != StopPoint(step, batch_id):
            return
        assert self.marker is not None
        self.marker.write_text(str(self.stop))
        threading.Event().wait()  # until the parent's SIGKILL


def start_query(spark: SparkSession, uri: str, queue: str, paths: QueryPaths,
                max_per_trigger: int, available_now: bool = False,
                writer: DeltaBatchWriter | None = None) -> StreamingQuery:
    messages = (spark.readStream.format("quorumqueue").option("uri", uri)
                .option("queue", queue).option("mode", "lease")
                .option("maxMessagesPerTrigger", str(max_per_trigger)).load())
    query = (order_rows(messages).writeStream.queryName("orders_to_delta")
             .foreachBatch(writer or DeltaBatchWriter(paths))
             .option("checkpointLocation", str(paths.checkpoint)))
    if available_now:
        return query.trigger(availableNow=True).start()
    return query.trigger(processingTime="200 milliseconds").start()


# ---------------------------------------------------------------- the killed driver

class DriverDied(RuntimeError):
    """The child driver exited before reaching its stop point."""


def run_killed_driver(uri: str, queue: str, paths: QueryPaths, max_per_trigger: int,
                      stop: StopPoint, workdir: Path, timeout: float = 600.0,
                      progress: Callable[[str], None] | None = None) -> None:
    """Run the query in a child driver until it reaches `stop`, then SIGKILL it (its
    JVM and Python workers too). Returns once every process of the child is gone.
    `progress` hears of each batch the child logs and commits."""
    marker = workdir / f"stopped-{stop.step}-{stop.batch_id}"
    marker.unlink(missing_ok=True)
    log_path = workdir / "driver.log"
    command = [sys.executable, "-m", "quorumqueue.jobs.driver", "--uri", uri,
               "--queue", queue, "--table", str(paths.table),
               "--checkpoint", str(paths.checkpoint), "--max-per-trigger", str(max_per_trigger),
               "--stop-at", str(stop), "--marker", str(marker)]
    with open(log_path, "ab") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_stop(child, stop, marker, paths.checkpoint, log_path, timeout,
                       progress or (lambda _text: None))
    finally:
        _kill_group(child)


def _reached(stop: StopPoint, marker: Path, checkpoint: Path) -> bool:
    if stop.step == "after-commit-log":
        return stop.batch_id in ckpt.committed_batches(checkpoint)
    return marker.exists()


def _wait_for_stop(child: subprocess.Popen, stop: StopPoint, marker: Path, checkpoint: Path,
                   log_path: Path, timeout: float, progress: Callable[[str], None]) -> None:
    deadline = time.monotonic() + timeout
    reported: set[str] = set()
    while not _reached(stop, marker, checkpoint):
        _report(checkpoint, reported, progress)
        if child.poll() is not None:
            raise DriverDied(f"the driver exited with {child.returncode} before {stop}; "
                             f"its log: {log_path}\n{_tail(log_path)}")
        if time.monotonic() > deadline:
            raise DriverDied(f"the driver did not reach {stop} within {timeout:.0f} s; "
                             f"its log: {log_path}\n{_tail(log_path)}")
        time.sleep(0.05)


def _report(checkpoint: Path, reported: set[str], progress: Callable[[str], None]) -> None:
    events = ([(n, 0, f"offset log {n} (batch {n} planned)")
               for n in ckpt.logged_batches(checkpoint)]
              + [(n, 1, f"commit log {n} (batch {n} done)")
                 for n in ckpt.committed_batches(checkpoint)])
    for _batch, _order, event in sorted(events):
        if event not in reported:
            reported.add(event)
            progress(event)


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()
    # the group's other members (the JVM, Python workers) are reaped by init; wait
    # until none is left so the restart does not race a dying JVM
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the orders query, stopping at a point")
    parser.add_argument("--uri", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--max-per-trigger", type=int, required=True)
    parser.add_argument("--stop-at", type=StopPoint.parse, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    arguments = parser.parse_args(argv)
    from .delta import local_spark

    spark = local_spark("orders-to-delta-driver")
    paths = QueryPaths(arguments.table, arguments.checkpoint)
    writer = DeltaBatchWriter(paths, arguments.stop_at, arguments.marker)
    query = start_query(spark, arguments.uri, arguments.queue, paths,
                        arguments.max_per_trigger, writer=writer)
    query.awaitTermination()
    raise SystemExit(f"the query ended before {arguments.stop_at}: {query.exception()}")


if __name__ == "__main__":
    main()

"""The main job (`make main`): orders from a quorum queue into a Delta table, exactly once,
across a driver killed mid-way.

    python -m quorumqueue.jobs.orders_to_delta [--orders 2000] [--per-batch 400]
        [--kill-at after-sink-commit:2] [--workdir DIR]

Phases, each printed as it happens:

1. start the bundled broker on a free 127.0.0.1 port (a fresh data directory), with a
   small write-ahead log and small segments (BROKER_STORAGE), so that a few thousand
   orders already go through segment files as a busy queue's would;
2. publish `--orders` shop orders (JSON, headers, AMQP properties) to a durable quorum
   queue with publisher confirms;
3. run `spark.readStream.format("quorumqueue")` (lease mode) into a Delta table with a
   checkpoint, in a driver process of its own, and SIGKILL that driver (JVM and Python
   workers) at `--kill-at`: by default after batch 2's Delta commit and before its
   commit log, the worst moment, with orders still waiting in the queue;
4. run the analytics jobs once over the broker's own log while it holds settled,
   unacked and ready orders (segment_compaction, memory_footprint: Delta tables under
   the working directory) and print their headline figures; at the end of the job
   every order is settled and the broker has deleted its segments, so there would be
   nothing left to look at;
5. restart the query from the checkpoint in this process (Trigger.AvailableNow): Spark
   runs batch 2 again, Delta skips it (txnAppId/txnVersion), then the rest;
6. settle the last batch: Spark settles batch N-1 when it plans N, so a query that
   stops leaves its last batch in its lease (unacked); the job settles it from the
   checkpoint's commit log, which leaves the queue at 0 ready / 0 unacked;
7. print the evidence: published, rows in Delta, distinct message ids, duplicates,
   missing, a few rows, the query's lastProgress, the Delta history (through Delta's
   Python API, `DeltaTable.forPath(...).history()`) and the queue.

Exits 1 if any order is missing or duplicated. Every process it starts is stopped;
the working directory is a temporary one unless `--workdir` is given: at the end the
broker's data and the checkpoint go, the Delta tables (the orders, the analytics) stay
there for the user to open, and the job prints where (`clean_up`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from ..client.management import call
from . import checkpoint as ckpt
from .delta import local_spark
from .driver import QueryPaths, StopPoint, run_killed_driver, start_query
from .embedded_broker import EmbeddedBroker
from .orders import publish_orders

QUEUE = "orders"
# RabbitMQ's raft.* keys (conf/broker.toml): the WAL rolls over into per-queue segment
# files past 8 KiB, and a segment closes after 64 entries. With the defaults (512 MiB
# and 4096) the job's orders would never leave the WAL, and step 7's analytics would
# find no segment file to look at.
BROKER_STORAGE = {"raft.wal_max_size_bytes": "8KiB", "raft.segment_max_entries": 64}


def say(text: str) -> None:
    print(f"[orders-to-delta] {text}", flush=True)


def stop_point(text: str) -> StopPoint:
    try:
        return StopPoint.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error} (as STEP:BATCH, e.g. "
                                         "after-sink-commit:2)") from None


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=2000)
    parser.add_argument("--per-batch", type=int, default=400, help="maxMessagesPerTrigger")
    parser.add_argument("--kill-at", type=stop_point,
                        default=StopPoint("after-sink-commit", 2),
                        help="before-batch:N, after-sink-commit:N or after-commit-log:N")
    parser.add_argument("--workdir", type=Path, help="keep broker data, table and checkpoint here")
    arguments = parser.parse_args(argv)
    if arguments.orders < 1 or arguments.per_batch < 1:
        parser.error("--orders and --per-batch must be at least 1")
    batches = -(-arguments.orders // arguments.per_batch)
    if not 0 <= arguments.kill_at.batch_id < batches - 1:
        parser.error(f"--kill-at: {arguments.orders} orders make batches 0..{batches - 1}; "
                     f"kill at a batch below {batches - 1} so that orders remain")
    if arguments.kill_at.step == "after-commit-log":
        parser.error("--kill-at after-commit-log needs a queue with nothing beyond the "
                     "batch (the restart tests do that); choose another step here")
    return arguments


def queue_counts(uri: str) -> tuple[int, int]:
    (row,) = [row for row in call(uri, "queues.list", vhost="/") if row["name"] == QUEUE]
    return row["ready"], row["unacked"]


def queue_state(uri: str) -> str:
    ready, unacked = queue_counts(uri)
    return f"{ready} ready, {unacked} unacked"


def publish(uri: str, count: int) -> None:
    began = time.monotonic()

    def progress(done: int) -> None:
        if done % 500 == 0 or done == count:
            say(f"  published and confirmed {done:,}/{count:,}")

    publish_orders(uri, QUEUE, range(count), progress)
    elapsed = time.monotonic() - began
    say(f"  {count:,} orders confirmed in {elapsed:.1f} s; queue: {queue_state(uri)}")


def first_run(uri: str, paths: QueryPaths, per_batch: int, stop: StopPoint,
              workdir: Path) -> dict[int, bool]:
    """Run the driver that gets killed; {batch Spark will replay: whether Delta already
    holds it} (logged, not committed)."""
    run_killed_driver(uri, QUEUE, paths, per_batch, stop, workdir,
                      progress=lambda text: say(f"  first driver: {text}"))
    logged, committed = ckpt.logged_batches(paths.checkpoint), ckpt.committed_batches(
        paths.checkpoint)
    delta_versions = len(list((paths.table / "_delta_log").glob("*.json")))
    say(f"  SIGKILLed the driver at {stop}: offset log {logged}, commit log {committed}, "
        f"{delta_versions} Delta commit(s); queue: {queue_state(uri)}")
    return replayed_batches(logged, committed, delta_versions)


def replayed_batches(logged: list[int], committed: list[int],
                     delta_versions: int) -> dict[int, bool]:
    """The batches a restart runs again (in the offset log, not in the commit log), each
    with whether Delta already holds it: batch b is Delta version b (one append a batch,
    from version 0), so it does if there are more than b versions."""
    return {batch: batch < delta_versions for batch in logged if batch not in committed}


def replay_note(batch: int, in_delta: bool) -> str:
    """What the restart's line for a replayed batch adds: the exactly-once moment."""
    if in_delta:
        return (f" <- batch {batch} again: the killed driver's last batch, replayed with the "
                "same offsets; Delta already had it (txnAppId/txnVersion) and skipped it, "
                "reading nothing")
    return (f" <- batch {batch} again: the killed driver's last batch, replayed with the "
            "same offsets; Delta writes it now, once (the killed driver had not)")


def restart(spark, uri: str, paths: QueryPaths, per_batch: int,
            replayed: dict[int, bool] | None = None):
    query = start_query(spark, uri, QUEUE, paths, per_batch, available_now=True)
    seen = -1
    while query.isActive:
        query.awaitTermination(1)
        for progress in query.recentProgress:
            # a replayed batch Delta skips reads nothing: shown too, it is the moment
            again = bool(replayed) and progress["batchId"] in replayed
            if progress["batchId"] > seen and (progress["numInputRows"] or again):
                seen = progress["batchId"]
                note = replay_note(seen, replayed[seen]) if again else ""
                say(f"  batch {seen}: {progress['numInputRows']} orders, "
                    f"{progress.get('processedRowsPerSecond', 0):,.0f} rows/s{note}")
    if query.exception() is not None:
        raise SystemExit(f"the restarted query failed: {query.exception()}")
    return query


def evidence(spark, uri: str, paths: QueryPaths, published: int, query) -> bool:
    from delta.tables import DeltaTable

    delta_table = DeltaTable.forPath(spark, str(paths.table))
    table = delta_table.toDF()
    rows = table.count()
    distinct = table.select("message_id").distinct().count()
    expected = spark.createDataFrame([(f"order-{n:07d}",) for n in range(published)],
                                     "message_id string")
    missing = expected.join(table, "message_id", "left_anti").count()
    say(f"published {published:,} | rows in Delta {rows:,} | distinct message_id "
        f"{distinct:,} | duplicates {rows - distinct:,} | missing {missing:,}")
    say("a few rows (in lease order: express orders, priority 8, are served first):")
    columns = ("lease_seq", "message_id", "customer", "sku", "quantity", "unit_price",
               "tenant", "region", "priority", "placed_at")
    for row in table.orderBy("lease_seq").select(*columns).limit(5).collect():
        say("  " + " ".join(f"{name}={row[name]}" for name in columns))
    history = delta_table.history().orderBy("version")
    say("Delta history: " + ", ".join(
        f"v{row.version} {row.operation} (+{row.operationMetrics.get('numOutputRows', '?')})"
        for row in history.select("version", "operation", "operationMetrics").collect()))
    progress = dict(query.lastProgress or {})
    say("the restarted query's lastProgress: " + json.dumps(
        {key: progress.get(key) for key in ("batchId", "numInputRows", "sources")}))
    ready, unacked = queue_counts(uri)
    say(f"queue '{QUEUE}': {ready} ready, {unacked} unacked")
    return rows == published == distinct and missing == 0 and (ready, unacked) == (0, 0)


def analytics(spark, data_dir: Path, out: Path) -> None:
    """Both analytics jobs once, on the live node's files; their headline lines."""
    from ..broker.raft.storage.config import StorageConfig
    from . import memory_footprint, segment_compaction

    storage = StorageConfig.from_mapping(BROKER_STORAGE)  # what the broker runs with
    for name, lines in (
            ("segment_compaction", segment_compaction.run(
                spark, str(data_dir), str(out), storage.segment_max_entries)),
            ("memory_footprint", memory_footprint.run(
                spark, str(data_dir), str(out), storage.wal_max_size_bytes))):
        say(f"  {name} (tables under {out / name}):")
        for line in lines[:4]:
            say(f"    {line.strip()}")


def clean_up(workdir: Path) -> Path:
    """Remove what only the run needed from a temporary `workdir` (the broker's data,
    the checkpoint, the drivers' files) and keep its Delta tables (orders_delta,
    analytics): the path of the orders table."""
    keep = {"orders_delta", "analytics"}
    for entry in workdir.iterdir():
        if entry.name in keep:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    return workdir / "orders_delta"


def main(argv: list[str] | None = None) -> None:
    arguments = parse_arguments(argv)
    workdir = arguments.workdir or Path(tempfile.mkdtemp(prefix="quorumqueue-main-"))
    paths = QueryPaths(workdir / "orders_delta", workdir / "checkpoint")
    say(f"1/7 starting the bundled broker (working directory {workdir})")
    try:
        with EmbeddedBroker(workdir / "broker", config=BROKER_STORAGE) as broker:
            say(f"  broker on 127.0.0.1:{broker.port}, with "
                + ", ".join(f"{key} = {value}" for key, value in BROKER_STORAGE.items()))
            say(f"2/7 publishing {arguments.orders:,} orders to quorum queue '{QUEUE}' "
                "with publisher confirms")
            publish(broker.uri, arguments.orders)
            say(f"3/7 streaming into Delta ({paths.table}), {arguments.per_batch} orders a "
                f"batch, in a driver process that gets killed at {arguments.kill_at}")
            replayed = first_run(broker.uri, paths, arguments.per_batch, arguments.kill_at,
                                 workdir)
            spark = local_spark("orders-to-delta")
            try:
                say("4/7 analytics over the broker's own log (quorumqueue jobs run ...), "
                    f"mid-way: queue {queue_state(broker.uri)}")
                analytics(spark, broker.data_dir, workdir / "analytics")
                say("5/7 restarting the query from its checkpoint (AvailableNow)")
                query = restart(spark, broker.uri, paths, arguments.per_batch, replayed)
                say(f"  done; queue: {queue_state(broker.uri)} (the last batch is still "
                    "in the query's lease: Spark settles batch N-1 when it plans N)")
                say("6/7 settling the last committed batch from the checkpoint")
                end = ckpt.settle_committed(paths.checkpoint, broker.uri)
                say(f"  settled lease {end.lease if end else '-'} up to "
                    f"{dict(end.positions) if end else {}}; queue: {queue_state(broker.uri)}")
                say("7/7 exactly-once evidence")
                ok = evidence(spark, broker.uri, paths, arguments.orders, query)
            finally:
                spark.stop()
    finally:
        if arguments.workdir is None:
            table = clean_up(workdir)
            say(f"the Delta table stays at {table}: spark.read.format(\"delta\").load("
                f"\"{table}\") (delta-spark in .venv); the analytics tables beside it")
    say("RESULT: " + ("every order is in Delta exactly once, and the queue is empty" if ok
                      else "MISMATCH: see the counts above"))
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""Job `memory_footprint`: what a node's quorum queues cost in memory, against the model
RabbitMQ documents (the quorum queues guide, "Resources that Quorum Queues Use").

The model: each queue keeps an in-memory index of its messages, at least 32 bytes
per message (more when a message was returned or has a TTL: at least 1 MB per 30,000
messages); on top, every queue of a node shares the WAL, whose entries stay in
memory tables until the WAL reaches `raft.wal_max_size_bytes` (default 512 MiB) and
rolls over — so allow the node at least 3 times that limit, 4 times under high
throughput.

Inputs (DataFrames; pure transforms, tested on hand-built rows):
    groups    one row per queue (log_state.frames): messages, returned, state_bytes
              (the broker's own figure for its per-message metadata, computed by the
              broker's code on the state restored from these files), memtable_bytes
Outputs:
    queues    per queue: messages, RabbitMQ's model (32 B each: an estimate, which a
              measured figure may sit below), the measured figure, bytes per message,
              and whether the queue stays within the model
    node      per node: memory-table bytes against the WAL limit, the node memory the
              guide implies (3x and 4x the limit), and the queues' metadata on top
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from .outputs import human_bytes as _size

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

MODEL_BYTES_PER_MESSAGE = 32        # RabbitMQ's documented estimate per message
TABLES = ("queues", "node")
# run()'s progress steps (`progress.advance(item)`, client/progress.py): each table
# computed, then the tables and the report written
STAGES = len(TABLES) + 1


def queues(groups: "DataFrame") -> "DataFrame":
    """Per queue: RabbitMQ's model beside the measured metadata."""
    per_message = F.when(F.col("messages") > 0,
                         F.round(F.col("state_bytes") / F.col("messages"), 1))
    return (groups.select("node", "group", "vhost", "queue", "messages", "returned",
                          "state_bytes", "memtable_bytes")
            .withColumn("model_bytes", F.col("messages") * MODEL_BYTES_PER_MESSAGE)
            .withColumn("bytes_per_message", per_message)
            .withColumn("within_model", F.col("state_bytes") <= F.col("model_bytes")))


def node(groups: "DataFrame", wal_max_size_bytes: int) -> "DataFrame":
    """Per node: memory tables against the WAL limit, and what the guide says to
    allocate (3x the limit, 4x under high throughput), plus the queues' metadata."""
    limit = F.lit(wal_max_size_bytes).cast("long")
    return (groups.groupBy("node").agg(
        F.count(F.lit(1)).alias("queues"),
        F.sum("messages").alias("messages"),
        F.sum("state_bytes").alias("state_bytes"),
        F.sum("memtable_bytes").alias("memtable_bytes"))
        .withColumn("wal_max_size_bytes", limit)
        .withColumn("memtable_share_of_limit", F.round(F.col("memtable_bytes") / limit, 4))
        .withColumn("recommended_min_bytes", limit * 3 + F.col("state_bytes"))
        .withColumn("recommended_high_throughput_bytes", limit * 4 + F.col("state_bytes")))


def report(queue_rows: list, node_rows: list) -> list[str]:
    lines = []
    for row in node_rows:
        lines.append(
            f"node {row['node']}: {row['queues']} quorum queues, {row['messages']:,} "
            f"messages; metadata {_size(row['state_bytes'])}; WAL memory tables "
            f"{_size(row['memtable_bytes'])} of the {_size(row['wal_max_size_bytes'])} "
            f"limit ({100 * row['memtable_share_of_limit']:.1f}%). Allocate at least "
            f"{_size(row['recommended_min_bytes'])} (3x the limit plus the metadata; under "
            f"high throughput 4x the limit plus the metadata: "
            f"{_size(row['recommended_high_throughput_bytes'])}).")
    for row in sorted(queue_rows, key=lambda r: -(r["state_bytes"] or 0)):
        per = row["bytes_per_message"]
        lines.append(
            f"  queue '{row['queue']}' (vhost '{row['vhost']}'): {row['messages']:,} "
            f"messages, metadata {_size(row['state_bytes'])}"
            + (f" = {per} B/message" if per is not None else "")
            + f" (RabbitMQ's model: {MODEL_BYTES_PER_MESSAGE} B/message, "
            + ("within it" if row["within_model"] else "above it")
            + (f", {row['returned']:,} returned" if row["returned"] else "") + ")")
    return lines or ["no quorum queues found."]


def run(spark, data_dir: str, out: str, wal_max_size_bytes: int, node_name: str | None = None,
        table_format: str = "delta", run_at=None,
        progress=None) -> list[str]:
    """Analyse one node's data directory; append `queues` and `node` under
    `out/memory_footprint/` with the run's timestamp, write the report, return it."""
    from . import outputs
    from .log_state import frames

    _live, groups = frames(spark, data_dir, node_name)
    results = {"queues": queues(groups), "node": node(groups, wal_max_size_bytes)}
    step = progress.advance if progress is not None else (lambda _item: None)
    collected = {}
    for name, frame in results.items():   # each one a Spark job: a progress step
        collected[name] = [row.asDict() for row in frame.collect()]
        step(f"{name} computed")
    lines = report(collected["queues"], collected["node"])
    outputs.publish("memory_footprint", out, results, lines, data_dir,
                    run_at or outputs.now(), table_format)
    step("tables and report written")
    return lines

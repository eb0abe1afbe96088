"""Job `segment_compaction`: how much of each quorum queue's log is settled messages kept
on disk, what frees it, and which segment size would suit the observed workload.

RabbitMQ's quorum queues guide ("Resources that Quorum Queues Use"; in the 4.2 edition
"Resource Use", "When Does Segment File Truncation Happen?") explains the problem: a segment file is deleted only once every
entry in it is below the release cursor, the lowest index the queue still needs, so one
old unacknowledged message pins every segment from its own on. RabbitMQ 4.3 adds
compaction around live entries; the broker implements both (FORMAT.md, "Compaction").

Inputs (DataFrames, so each transform is a pure function tested on hand-built rows):
    log       spark.read.format("quorumqueue.log"): physical rows, one per stored entry
    live      (node, group, raft_index): live raft indexes (log_state.py)
    cursors   (node, group, snapshot_index, release_cursor, frees_up_to, last_index)

Outputs:
    segments  one row per segment file: entries, live and settled entries and bytes, the
              live indexes that pin it, whether the release cursor frees it now, whether
              compaction would delete it (no live entry, wholly at or below the snapshot)
    what_if   per queue and candidate `raft.segment_max_entries`: files, bytes, and what
              the release cursor alone (RabbitMQ <= 4.2) or compaction (4.3) reclaims
    report    plain words per queue (recommend())

An entry is *needed* when it is live (its message is still in the queue) or above the
snapshot (the log replays it on restart); everything else is settled and reclaimable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.window import Window

from .outputs import human_bytes as _size

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CANDIDATE_SIZES = (128, 1024, 4096, 32768, 65535)
SLOT_BYTES = 40              # a segment index slot (FORMAT.md)
PINNED_LIVE_FRACTION = 0.1   # a segment kept for at most this share live (or for one) is "pinned"
PINNING_SHOWN = 10           # live indexes listed per pinned segment

KEY = ["node", "group"]


def stored_entries(log: "DataFrame") -> "DataFrame":
    """The ENTRY rows of segments and WAL files, one per (node, group, raft_index): the
    entries as stored (a shadowed duplicate counts once, its latest copy)."""
    entries = log.where(F.col("record_type") == "ENTRY")
    latest = Window.partitionBy(*KEY, "raft_index").orderBy(
        F.col("file_kind").desc(), F.col("file_number").desc())   # wal > segment
    return (entries.withColumn("_copy", F.row_number().over(latest))
            .where(F.col("_copy") == 1).drop("_copy"))


def classify(entries: "DataFrame", live: "DataFrame", cursors: "DataFrame") -> "DataFrame":
    """Each entry with `live` (its message is in the queue) and `needed` (live, or above
    the snapshot: replayed on restart)."""
    marked = live.select(*KEY, "raft_index").distinct().withColumn("live", F.lit(True))
    return (entries.join(marked, [*KEY, "raft_index"], "left")
            .join(cursors.select(*KEY, "snapshot_index", "frees_up_to"), KEY, "left")
            .withColumn("live", F.coalesce(F.col("live"), F.lit(False)))
            .withColumn("needed", F.col("live")
                        | (F.col("raft_index") > F.coalesce(F.col("snapshot_index"), F.lit(0)))))


def segments(log: "DataFrame", live: "DataFrame", cursors: "DataFrame") -> "DataFrame":
    """One row per segment file (see the module docstring)."""
    rows = classify(log.where((F.col("file_kind") == "segment")
                              & (F.col("record_type") == "ENTRY")), live, cursors)
    pinning = F.sort_array(F.collect_list(F.when(F.col("live"), F.col("raft_index"))))
    grouped = rows.groupBy(*KEY, "vhost", "queue", "file", "file_number").agg(
        F.min("raft_index").alias("first_index"),
        F.max("raft_index").alias("last_index"),
        F.count(F.lit(1)).alias("entries"),
        F.sum(F.col("live").cast("long")).alias("live_entries"),
        F.sum(F.col("needed").cast("long")).alias("needed_entries"),
        F.sum("disk_bytes").alias("bytes"),
        F.sum(F.when(F.col("live"), F.col("disk_bytes")).otherwise(0)).alias("live_bytes"),
        pinning.alias("_live_indexes"),
        F.first("snapshot_index", ignorenulls=True).alias("snapshot_index"),
        F.first("frees_up_to", ignorenulls=True).alias("frees_up_to"),
        F.max(F.col("compacted").cast("int")).cast("boolean").alias("compacted"))
    return (grouped
            .withColumn("settled_entries", F.col("entries") - F.col("live_entries"))
            .withColumn("settled_bytes", F.col("bytes") - F.col("live_bytes"))
            .withColumn("freed_by_release_cursor",
                        F.col("last_index") < F.coalesce(F.col("frees_up_to"), F.lit(0)))
            .withColumn("deleted_by_compaction",
                        ~F.col("freed_by_release_cursor") & (F.col("needed_entries") == 0))
            .withColumn("pinned",
                        ~F.col("freed_by_release_cursor") & (F.col("live_entries") > 0)
                        & (F.col("needed_entries") == F.col("live_entries"))
                        & (F.col("live_entries") <= F.greatest(
                            F.lit(1.0), F.col("entries") * PINNED_LIVE_FRACTION)))
            .withColumn("pinned_by", F.when(F.col("pinned"), F.slice(
                F.col("_live_indexes"), 1, PINNING_SHOWN)))
            .drop("_live_indexes", "needed_entries"))


def what_if(log: "DataFrame", live: "DataFrame", cursors: "DataFrame",
            sizes: tuple[int, ...] = CANDIDATE_SIZES) -> "DataFrame":
    """Per queue and candidate segment size N: the stored entries cut into segments of N
    indexes ([1, N], [N+1, 2N], ...), how many files and bytes that makes, and what is
    reclaimable: by the release cursor alone (the segment lies wholly below
    `frees_up_to`) and with compaction as well (no needed entry in it)."""
    entries = classify(stored_entries(log), live, cursors).withColumn(
        "entry_bytes", F.col("bytes") + SLOT_BYTES)
    spark = log.sparkSession
    candidates = spark.createDataFrame([(n,) for n in sizes], "segment_max_entries int")
    cut = (entries.crossJoin(F.broadcast(candidates))
           .withColumn("segment", F.floor((F.col("raft_index") - 1)
                                          / F.col("segment_max_entries"))))
    per_segment = cut.groupBy(*KEY, "vhost", "queue", "segment_max_entries", "segment").agg(
        F.sum("entry_bytes").alias("bytes"),
        F.max("needed").alias("needed"),
        F.first("frees_up_to", ignorenulls=True).alias("frees_up_to"))
    below_cursor = ((F.col("segment") + 1) * F.col("segment_max_entries")
                    < F.coalesce(F.col("frees_up_to"), F.lit(0)))
    reclaimed_42 = below_cursor
    reclaimed_43 = below_cursor | ~F.col("needed")
    return (per_segment.groupBy(*KEY, "vhost", "queue", "segment_max_entries").agg(
        F.count(F.lit(1)).alias("files"),
        F.sum("bytes").alias("bytes"),
        F.sum(reclaimed_42.cast("long")).alias("reclaimable_files"),
        F.sum(F.when(reclaimed_42, F.col("bytes")).otherwise(0)).alias("reclaimable_bytes"),
        F.sum(reclaimed_43.cast("long")).alias("reclaimable_files_with_compaction"),
        F.sum(F.when(reclaimed_43, F.col("bytes")).otherwise(0))
        .alias("reclaimable_bytes_with_compaction"))
        .orderBy(*KEY, "segment_max_entries"))


def recommend(segment_rows: list, what_if_rows: list, current: int) -> list[str]:
    """Plain-words findings per queue from collected `segments` and `what_if` rows
    (`current`: the node's raft.segment_max_entries)."""
    lines: list[str] = []
    queues = sorted({(r["vhost"], r["queue"]) for r in segment_rows}
                    | {(r["vhost"], r["queue"]) for r in what_if_rows})
    for vhost, queue in queues:
        mine = [r for r in segment_rows if (r["vhost"], r["queue"]) == (vhost, queue)]
        name = f"queue '{queue}' (vhost '{vhost}')"
        total = sum(r["bytes"] for r in mine)
        settled = sum(r["settled_bytes"] for r in mine)
        freed = [r for r in mine if r["freed_by_release_cursor"]]
        compactable = [r for r in mine if r["deleted_by_compaction"]]
        pinned = [r for r in mine if r["pinned"]]
        lines.append(f"{name}: {len(mine)} segment files, {_size(total)}, of which "
                     f"{_size(settled)} ({_share(settled, total)}) is settled messages.")
        if freed:
            lines.append(f"  the release cursor frees {len(freed)} of them "
                         f"({_size(sum(r['bytes'] for r in freed))}) at the next snapshot.")
        if pinned:
            indexes = sorted({i for r in pinned for i in (r["pinned_by"] or [])})[:PINNING_SHOWN]
            lines.append(f"  {len(pinned)} segment files "
                         f"({_size(sum(r['bytes'] for r in pinned))}) are kept only for a "
                         f"few live messages (raft indexes {', '.join(map(str, indexes))}): "
                         "consume or reject those messages, or set a delivery limit or "
                         "a message TTL, to let them go.")
        if compactable:
            lines.append(f"  compaction (RabbitMQ 4.3 behaviour) deletes "
                         f"{len(compactable)} more "
                         f"({_size(sum(r['bytes'] for r in compactable))}).")
        options = [r for r in what_if_rows if (r["vhost"], r["queue"]) == (vhost, queue)]
        if not mine:
            # entries still in the WAL never reach segments once settled: no what-if
            lines.append("  its log is all in the WAL so far (no segment files): "
                         "nothing on disk to reclaim yet. Entries reach segment files "
                         "when the WAL rolls over, at raft.wal_max_size_bytes (512 MiB by "
                         "default: tens of thousands of small messages fit), and settled "
                         "ones never do; to look at segments with less data, lower "
                         "raft.wal_max_size_bytes (make main uses 8 KiB).")
        elif options:
            best = max(options, key=lambda r: (r["reclaimable_bytes"], -r["files"]))
            now = next((r for r in options if r["segment_max_entries"] == current), None)
            if now is not None and best["reclaimable_bytes"] > now["reclaimable_bytes"]:
                lines.append(
                    f"  with raft.segment_max_entries = {best['segment_max_entries']} "
                    f"(now {current}) the release cursor alone would reclaim "
                    f"{_size(best['reclaimable_bytes'])} instead of "
                    f"{_size(now['reclaimable_bytes'])}, in {best['files']} files instead "
                    f"of {now['files']}.")
            elif now is None:
                # the current size is not among those tried: no comparison to make
                sizes = ", ".join(str(r["segment_max_entries"]) for r in
                                  sorted(options, key=lambda r: r["segment_max_entries"]))
                lines.append(
                    f"  raft.segment_max_entries = {current} is not among the sizes tried "
                    f"({sizes}); of those, {best['segment_max_entries']} would let the "
                    f"release cursor reclaim the most: {_size(best['reclaimable_bytes'])} "
                    f"in {best['files']} files.")
            else:
                lines.append(f"  raft.segment_max_entries = {current} suits this workload "
                             "(no candidate size reclaims more).")
    return lines or ["no quorum-queue segments found."]


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


# ------------------------------------------------------------------ running it

TABLES = ("segments", "what_if")
# run()'s progress steps (`progress.advance(item)`, client/progress.py): each table
# computed, then the tables and the report written
STAGES = len(TABLES) + 1


def run(spark, data_dir: str, out: str, segment_max_entries: int, node: str | None = None,
        table_format: str = "delta", run_at=None,
        progress=None) -> list[str]:
    """Analyse one node's data directory; append the `segments` and `what_if` tables
    under `out/segment_compaction/` with the run's timestamp, write the report next to
    them, and return the report's lines."""
    from . import outputs
    from .log_state import frames

    # the quorum queues' groups (a node's data directory also holds its metadata
    # group's log, which no queue owns)
    log = (spark.read.format("quorumqueue.log").options(**({"node": node} if node else {}))
           .load(data_dir).where(F.col("queue").isNotNull()).cache())
    live, groups = frames(spark, data_dir, node)
    results = {"segments": segments(log, live, groups), "what_if": what_if(log, live, groups)}
    step = progress.advance if progress is not None else (lambda _item: None)
    collected = {}
    for name, frame in results.items():   # each one a Spark job: a progress step
        collected[name] = [row.asDict() for row in frame.collect()]
        step(f"{name} computed")
    lines = recommend(collected["segments"], collected["what_if"], segment_max_entries)
    outputs.publish("segment_compaction", out, results, lines, data_dir,
                    run_at or outputs.now(), table_format)
    log.unpersist()
    step("tables and report written")
    return lines

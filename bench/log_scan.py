"""Scan rate of the log data source against Spark's binaryFile over the same files.

    python bench/log_scan.py [--size-mb 1024] [--body 1024] [--queues 4] [--runs 2]

Generates a broker data directory of about `--size-mb` MiB with the broker's own
storage code (LogStore: one WAL, per-queue segments, as a node writes them; entries
are fifo Enqueue commands of `--body`-byte messages), then reads it, in the same
Spark session, two ways, each `--runs` times (best run counts):

1. `spark.read.format("quorumqueue.log")`, aggregating a column of every row
   (sum of disk_bytes, count), so every file is parsed into rows;
2. `spark.read.format("binaryFile")` over the same files, summing the length of
   every file's content, so every byte is read (the I/O baseline, no parsing).

It prints both rates in MiB/s of log files and the ratio log / binaryFile (target
>= 0.5). Progress goes to stderr. The data directory is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from quorumqueue.broker.fifo.commands import encode_enqueue  # noqa: E402
from quorumqueue.broker.raft.storage import LogStore  # noqa: E402
from quorumqueue.broker.raft.storage.config import StorageConfig  # noqa: E402
from quorumqueue.broker.raft.types import COMMAND, LogEntry  # noqa: E402


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def generate(data_dir: str, size_mb: int, body: int, queues: int) -> int:
    """Write about size_mb MiB of log; returns the bytes on disk."""
    store = LogStore(data_dir, StorageConfig(wal_max_size_bytes=64 << 20, fsync=False))
    header = b"\x00\x3c\x00\x00" + (body).to_bytes(8, "big") + b"\x10\x00\x02"
    payload = b"x" * body
    groups = [f"%2F/bench-{n}/{n:012x}" for n in range(queues)]
    for group in groups:
        store.set_initial_members(group, ["n1"])
    target = size_mb << 20
    written, index, batch = 0, 1, 256
    while written < target:
        for group in groups:
            entries = [LogEntry(index + k, 1, COMMAND,
                                encode_enqueue("", 0, 0, "", "bench", header, payload))
                       for k in range(batch)]
            store.append(group, entries)
            written += sum(len(e.data) for e in entries)
        index += batch
        store.flush()
        if index % (batch * 64) == 1:
            progress(f"  generated {written >> 20} / {size_mb} MiB")
    store.roll_over()
    store.close()
    return sum(os.path.getsize(os.path.join(folder, name))
               for folder, _dirs, names in os.walk(data_dir) for name in names)


def timed(label: str, action, runs: int) -> float:
    best = float("inf")
    for run in range(1, runs + 1):
        started = time.perf_counter()
        result = action()
        elapsed = time.perf_counter() - started
        best = min(best, elapsed)
        progress(f"  {label} run {run}: {elapsed:.2f} s ({result})")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--body", type=int, default=1024, help="message body bytes")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from quorumqueue.jobs.cli import spark_session

    data_dir = tempfile.mkdtemp(prefix="qq-logscan-")
    try:
        progress(f"generating ~{args.size_mb} MiB of log ({args.body} B messages, "
                 f"{args.queues} queues) in {data_dir} ...")
        total = generate(data_dir, args.size_mb, args.body, args.queues)
        mib = total / (1 << 20)
        progress(f"  {mib:.0f} MiB on disk; starting Spark ...")
        spark = spark_session("parquet", "quorumqueue-bench-log-scan")
        log = spark.read.format("quorumqueue.log").load(data_dir)
        # every file by name: a directory listing would skip the segment folders
        # (Spark ignores names starting with "_", which group folders may)
        files = [os.path.join(folder, name) for folder, _dirs, names in os.walk(data_dir)
                 for name in names if not name.endswith(".json")]
        raw = spark.read.format("binaryFile").load(files)
        log_s = timed("quorumqueue.log", lambda: tuple(log.agg(
            F.sum("disk_bytes"), F.count(F.lit(1))).first()), args.runs)
        raw_s = timed("binaryFile", lambda: raw.agg(
            F.sum(F.length("content")), F.count(F.lit(1))).first(), args.runs)
        spark.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    print(f"{mib:,.0f} MiB of quorum log, {args.body} B messages, best of {args.runs}")
    print(f"{'reader':<18}{'seconds':>10}{'MiB/s':>10}")
    print(f"{'quorumqueue.log':<18}{log_s:>10.2f}{mib / log_s:>10.1f}")
    print(f"{'binaryFile':<18}{raw_s:>10.2f}{mib / raw_s:>10.1f}")
    ratio = raw_s / log_s
    verdict = "meets" if ratio >= 0.5 else "misses"
    print(f"quorumqueue.log / binaryFile scan rate: {ratio:.2f}x ({verdict} the >= 0.5x target)")


if __name__ == "__main__":
    main()

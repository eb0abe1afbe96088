"""Write throughput of the log store (not collected by pytest; run by hand):

    .venv/bin/python -m tests.broker.raft.storage.bench_throughput [DIR]

1 KiB entries across 10 groups. Each round appends `per_group` entries to every group
and calls flush() once (group commit: one fdatasync per round). Only the time spent
inside the store is counted (building the LogEntry values is the core's cost). Printed against two
baselines measured in the same run on the same disk:
- raw: os.write of the same number of bytes + one fdatasync per round (the ceiling);
- no group commit: a flush after every group's append (ten fdatasyncs per round).
Also the CPU-only cost (fsync off) and one run that includes WAL rollovers.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from quorumqueue.broker.raft.storage import LogStore, StorageConfig
from quorumqueue.broker.raft.types import LogEntry

GROUPS = [f"%2F/bench{n}" for n in range(10)]
DATA = os.urandom(1024)
SECONDS = 2.0


def run_store(directory: str, per_group: int, config: StorageConfig,
              group_commit: bool = True) -> tuple[float, float, float]:
    """(entries/s, fdatasyncs/s, MB/s of WAL written)."""
    shutil.rmtree(directory, ignore_errors=True)
    store = LogStore(directory, config)
    syncs = 0
    real = os.fdatasync

    def counting(fd):
        nonlocal syncs
        syncs += 1
        real(fd)

    os.fdatasync = counting
    try:
        entries = 0
        next_index = {g: 1 for g in GROUPS}
        elapsed = 0.0          # time inside the store only (the core builds the entries)
        while elapsed < SECONDS:
            batches = []
            for group in GROUPS:
                lo = next_index[group]
                batches.append((group, [LogEntry(i, 1, 0, DATA) for i in range(lo, lo + per_group)]))
                next_index[group] = lo + per_group
            start = time.perf_counter()
            for group, batch in batches:
                store.append(group, batch)
                if not group_commit:
                    store.flush()
            store.flush()
            elapsed += time.perf_counter() - start
            entries += per_group * len(GROUPS)
    finally:
        os.fdatasync = real
    written = sum(os.path.getsize(p) for p in store.wal_paths())
    store.close()
    return entries / elapsed, syncs / elapsed, written / elapsed / 1e6


def run_raw(directory: str, per_group: int) -> tuple[float, float]:
    """(entries/s, fdatasyncs/s) writing the same bytes per round without the store."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "raw.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    record = DATA + bytes(34)                     # ~ an ENTRY record's size
    batch = record * (per_group * len(GROUPS))
    rounds = 0
    start = time.perf_counter()
    while time.perf_counter() - start < SECONDS:
        os.write(fd, batch)
        os.fdatasync(fd)
        rounds += 1
    elapsed = time.perf_counter() - start
    os.close(fd)
    os.remove(path)
    return rounds * per_group * len(GROUPS) / elapsed, rounds / elapsed


def main() -> None:
    base = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="qq-bench-")
    directory = os.path.join(base, "store")
    print(f"disk: {base}; 10 groups, 1 KiB entries, {SECONDS:.0f} s per line")
    print(f"{'entries/group/flush':>20} {'store entries/s':>16} {'fsyncs/s':>9} "
          f"{'WAL MB/s':>9} {'raw entries/s':>14} {'store/raw':>9}")
    for per_group in (1, 10, 100):
        rate, syncs, mbps = run_store(directory, per_group, StorageConfig())
        raw_rate, _raw_syncs = run_raw(base, per_group)
        print(f"{per_group:>20} {rate:>16,.0f} {syncs:>9,.0f} {mbps:>9.1f} "
              f"{raw_rate:>14,.0f} {rate / raw_rate:>9.2f}")
    with_gc, _, _ = run_store(directory, 10, StorageConfig())
    without, syncs, _ = run_store(directory, 10, StorageConfig(), group_commit=False)
    print(f"group commit vs a flush per group (10 entries/group): {with_gc:,.0f} vs "
          f"{without:,.0f} entries/s ({with_gc / without:.1f}x; {syncs:,.0f} fsyncs/s without)")
    cpu, _, _ = run_store(directory, 100, StorageConfig(fsync=False))
    print(f"CPU only (fsync off, 100 entries/group/flush): {cpu:,.0f} entries/s")
    rolling, syncs, _ = run_store(directory, 100, StorageConfig(wal_max_size_bytes=32 << 20))
    print(f"with rollovers every 32 MiB (100 entries/group/flush): {rolling:,.0f} entries/s, "
          f"{syncs:,.0f} fsyncs/s (segment fsyncs included)")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

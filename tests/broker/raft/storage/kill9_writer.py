"""The process the kill -9 test kills: appends to ten groups and flushes in a loop,
printing `group index` for every index flush() reported durable (after it returned).
Every 40 flushes it snapshots each group and releases below it. Run as
`python -m tests.broker.raft.storage.kill9_writer DATA_DIR`."""

from __future__ import annotations

import random
import sys

from quorumqueue.broker.raft.storage import LogStore, StorageConfig
from quorumqueue.broker.raft.types import LogEntry, SnapshotMeta

from .support import payload

GROUPS = [f"%2F/kill{n}" for n in range(10)]


def main(directory: str) -> None:
    store = LogStore(directory, StorageConfig(wal_max_size_bytes=256 * 1024,
                                              segment_max_entries=64))
    rng = random.Random()
    out = sys.stdout
    for round_ in range(1_000_000):
        for group in GROUPS:
            lo = store.last_index(group) + 1
            count = rng.randint(1, 8)
            store.append(group, [LogEntry(i, 1, 0, payload(group, i, 1, 1024))
                                 for i in range(lo, lo + count)])
        for group, index in store.flush().items():
            out.write(f"{group} {index}\n")
        out.flush()
        if round_ % 40 == 39:
            for group in GROUPS:
                last = store.last_index(group)
                store.write_snapshot(group, SnapshotMeta(last, 1, ("n1",)), b"state")
                store.release(group, max(1, last - 50))


if __name__ == "__main__":
    main(sys.argv[1])

"""Helpers shared by the storage tests: deterministic entries, small configs, crash images.

A crash image is a copy of the data directory taken while the store is still open:
every write goes straight to the kernel (no user-space buffering), so the copy is
exactly what a kill -9 at that instant would leave behind.
"""

from __future__ import annotations

import os
import shutil

from quorumqueue.broker.raft.storage import LogStore, StorageConfig
from quorumqueue.broker.raft.types import COMMAND, LogEntry

G1 = "%2F/orders"
G2 = "vhost-ü/очередь"
G3 = "/a/b/../c"


def payload(group: str, index: int, term: int, size: int = 40) -> bytes:
    seed = f"{group}|{index}|{term}|".encode()
    return (seed * (size // len(seed) + 1))[:size]


def append_singly(store: LogStore, group: str, entries: list[LogEntry]) -> None:
    """Each entry an append of its own: one ENTRY record each (a run appended at once
    is an ENTRIES record, WAL version 3 on), as a version-1 or -2 file holds them."""
    for entry in entries:
        store.append(group, [entry])


def make_entries(group: str, lo: int, hi: int, term: int = 1, size: int = 40,
                 kind: int = COMMAND) -> list[LogEntry]:
    return [LogEntry(i, term, kind, payload(group, i, term, size)) for i in range(lo, hi)]


def config(**overrides) -> StorageConfig:
    values = dict(fsync=False, wal_max_size_bytes=1 << 30, segment_max_entries=8)
    values.update(overrides)
    return StorageConfig(**values)


def reopen(data_dir, cfg: StorageConfig | None = None) -> LogStore:
    return LogStore(str(data_dir), cfg or config())


def crash_image(data_dir, destination) -> str:
    """Copy the data directory as a kill -9 would leave it now."""
    shutil.copytree(str(data_dir), str(destination))
    return str(destination)


def wal_files(data_dir) -> list[str]:
    directory = os.path.join(str(data_dir), "quorum", "wal")
    return sorted(os.path.join(directory, n) for n in os.listdir(directory))


def log_of(store: LogStore, group: str) -> list:
    """(index, term, kind, data) of every stored entry from first_index() to last."""
    first, last = store.first_index(group), store.last_index(group)
    return [(e.index, e.term, e.kind, e.data) for e in store.entries(group, first, last + 1)]

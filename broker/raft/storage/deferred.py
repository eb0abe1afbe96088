"""File work a batch does after its fdatasync: snapshots written, segment files
deleted or compacted.

Responsibilities: the slow file operations of a store opened with `background=True`
(log_store.py), as jobs that the next sealed batch carries (`WalBatch.after`, like
rollover.py's `Steps`) and runs on the shell's writer thread after the batch's own
fdatasync, so the caller's event loop never waits for a snapshot's fsync or a segment
file's unlink. `done` then runs on the store's thread, from `synced()`.

How it works: `SnapshotWrite` writes `snapshot.dat.tmp`, fsyncs it, renames it over
`snapshot.dat` and fsyncs the directory (snapshots.py); a full disk is not an error
of the batch: the job notes it (`error`), removes its tmp file and the store tries
again with a later batch (the snapshot's bytes stay in memory, and reads of the
snapshot are answered from them). `Unlinks` deletes segment files the store no longer
reads and fsyncs their directory. `SegmentRewrite` writes a compaction's copy of a
segment (its live entries) to `<name>.tmp` and fsyncs it; `done` renames it over the
segment (the store reads the old file until then) and the next batch fsyncs the
directory; a full disk leaves the segment as it was.

Invariants: `run` may run again (a batch written again after a full disk): every job
is idempotent. A job touches only the files it names; the store keeps it from files
another group may reuse (a job of a deleted group is dropped before it is sealed: a
group re-created under the uid numbers its segments from 1 again).

Not here: what may be deleted or written when (log_store.py), the byte layouts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..types import LogEntry, SnapshotMeta
from . import segments, snapshots
from .errors import is_disk_full
from .layout import SNAPSHOT_FILE, TMP_SUFFIX, fsync_dir


@dataclass(slots=True, eq=False)
class SnapshotWrite:
    """One group's snapshot file, written whole (tmp, fsync, rename, fsync dir)."""
    uid: str
    directory: str
    meta: SnapshotMeta
    data: bytes
    durable_index: int                 # the snapshot on disk before this one (0: none)
    failpoint: Callable[[str], None] | None = None
    done: Callable[[], None] | None = None
    release: int = 0                   # the release cursor asked for with it, once written
    compact: Any = None                # the live indexes to compact with, once written
    error: OSError | None = None       # the last run found the disk full: not written
    warned: bool = False               # the store said so once

    def run(self, fsync: bool) -> None:
        try:
            tmp = snapshots.prepare_snapshot_file(self.directory, self.uid, self.meta,
                                                  self.data, fsync)
            snapshots.commit_snapshot_file(self.directory, tmp, self.failpoint, fsync)
        except OSError as error:
            if not is_disk_full(error):
                raise
            try:
                os.remove(os.path.join(self.directory, SNAPSHOT_FILE) + TMP_SUFFIX)
            except FileNotFoundError:
                pass
            self.error = error
            return
        self.error = None

    def close(self) -> None:
        pass


@dataclass(slots=True, eq=False)
class Unlinks:
    """Segment files of one group the store no longer reads: deleted, their
    directory fsynced."""
    uid: str
    directory: str
    paths: list[str]
    done: Callable[[], None] | None = None

    def run(self, fsync: bool) -> None:
        for path in self.paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass              # a retried batch removed it the first time
        try:
            fsync_dir(self.directory, fsync)
        except FileNotFoundError:
            pass                  # the group was deleted: its directory went with it

    def close(self) -> None:
        pass


@dataclass(slots=True, eq=False)
class SegmentRewrite:
    """A compaction's copy of one segment: its live entries in `<name>.tmp`, fsynced.
    The store renames it over the segment in `done`, if that segment is still the
    group's."""
    uid: str
    ref: segments.SegmentRef
    entries: list[LogEntry]
    count: int                               # the segment as it was when copied
    data_end: int
    done: Callable[[], None] | None = None
    new: segments.SegmentRef | None = None   # the copy's ref, once written
    error: OSError | None = None             # the disk was full: not written

    def run(self, fsync: bool) -> None:
        if self.new is not None:
            return                # a retried batch: written the first time
        try:
            self.new = segments.write_rewritten(self.ref, self.uid, self.entries, True,
                                                fsync)
        except OSError as error:
            if not is_disk_full(error):
                raise
            self.error = error    # write_rewritten removed its tmp file

    def close(self) -> None:
        pass

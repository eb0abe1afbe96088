"""What the store knows about one group, in memory: the pieces its log is made of.

A group's log is, from low to high index: entries kept in segment files (possibly
sparse below the snapshot, after compaction), then its memory table (entries in the
WAL not yet moved to segments). `shadow_from` records a conflict truncation that
reached into segments and has not been applied to the files yet: segment entries at
or above it are not part of the log (the next WAL rollover rewrites the files).

Invariants:
- segment entries < shadow_from (if set) all have index < mem.first (if mem is not empty),
  except while a rollover in slices runs (rollover.py): entries it wrote whose fsync is
  pending are in both, equal;
- mem is the tail of the log: when not empty, mem.last == last_index() (recovery can
  find entries stranded below a snapshot; the store moves them to segments at once);
- above the snapshot index the log is contiguous up to last_index();
- entries below `release_cursor` are dead; none of them is in mem;
- while `snapshot_write` is set (a store with background file work), `snapshot` is
  its meta and the file on disk is older (at `snapshot_write.durable_index`): the
  release cursor asked for since waits with it (`snapshot_write.release`), and
  compaction stays below the file on disk, so the log still holds what a restart
  from that file needs.

Not here: reading segment files (log_store.py), replay rules (recovery.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..types import HardState, SnapshotMeta
from .layout import group_dir_name
from .memtable import MemTable
from .segments import SegmentRef


@dataclass(slots=True, eq=False)
class GroupState:
    uid: str
    dir_name: str
    snapshot: SnapshotMeta | None = None
    hard_state: HardState = HardState()
    initial_members: tuple[str, ...] = ()
    release_cursor: int = 0                  # 0: nothing released
    segments: list[SegmentRef] = field(default_factory=list)   # by index, oldest first
    shadow_from: int | None = None
    mem: MemTable = field(default_factory=MemTable)
    next_segment_number: int = 1
    # the newest snapshot, not yet on disk (deferred.SnapshotWrite: its bytes)
    snapshot_write: Any = None

    @classmethod
    def new(cls, uid: str) -> GroupState:
        return cls(uid, group_dir_name(uid))

    @property
    def snapshot_index(self) -> int:
        return self.snapshot.index if self.snapshot is not None else 0

    @property
    def durable_snapshot_index(self) -> int:
        """The index of the snapshot on disk (0: none)."""
        if self.snapshot_write is not None:
            return self.snapshot_write.durable_index
        return self.snapshot_index

    def segments_last(self) -> int:
        """Index of the last segment entry that is part of the log (0: none)."""
        shadow = self.shadow_from
        for ref in reversed(self.segments):
            if shadow is None or ref.last < shadow:
                return ref.last
            if ref.first < shadow:
                return shadow - 1          # not compacted (compacted ones are below it)
        return 0

    def last_index(self) -> int:
        stored = self.mem.last if self.mem else self.segments_last()
        return max(stored, self.snapshot_index)

    def last_term_known(self) -> int | None:
        """The last entry's term if known without reading a file (None: it would
        take a read - only while a truncation into segments is pending)."""
        if self.mem:
            return self.mem.entries[-1].term
        last = self.last_index()
        if last == 0:
            return 0
        if self.snapshot is not None and last == self.snapshot.index:
            return self.snapshot.term
        if self.segments and self.segments[-1].last == last and self.shadow_from is None:
            return self.segments[-1].last_term
        return None

    def first_index(self) -> int:
        """Raft's first index: after the snapshot (entries kept below it are bodies
        for the state machine, possibly sparse, not part of Raft's log)."""
        return self.snapshot_index + 1

    def discard_from(self, index: int) -> None:
        """Entries with index >= `index` are no longer part of the log."""
        in_segments = index <= self.segments_last()   # also those in mem (a sliced rollover)
        if self.mem and index > self.mem.first:
            self.mem.truncate_from(index)
        else:
            self.mem.clear()
        if in_segments:
            self.shadow_from = index if self.shadow_from is None else min(self.shadow_from,
                                                                          index)

    def discard_all(self) -> None:
        self.mem.clear()
        if self.segments:
            self.shadow_from = 1

    def has_content(self) -> bool:
        return bool(self.mem or self.segments or self.snapshot is not None
                    or self.hard_state != HardState() or self.initial_members)

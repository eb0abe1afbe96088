"""A WAL rollover in slices: memory tables moved to segment files without a long stop.

Responsibilities: what `LogStore.synced()` does when the WAL is full, spread over the
batches that follow, so a shell's event loop never writes 512 MiB at once and never
waits for a segment's fdatasync. The rollover of `LogStore.roll_over()` moves it all
in one call; this one is the same steps, cut up.

How it works: `start` opens the new WAL file and writes the metadata carried into it
(the page cache); the next batch's sync (on the shell's writer thread) fdatasyncs it
and fsyncs the WAL directory (a `Steps` attached to the batch: `WalBatch.after`).
Once that batch is synced, each later `synced()` takes one slice: at most
`SLICE_BYTES` of entries (or `SLICE_ENTRIES`), from the memory tables in uid
order, counted into the groups' segment files with their blocks allocated; the
next batch's sync writes them (segments.PendingAppend: the page-cache copy, which
waits behind the WAL's own writes and fdatasyncs, is not the event loop's), then
fdatasyncs those files and fsyncs the directories created. A read of a segment
before then writes its pending appends first (segments.ReaderCache.get). When that batch is
synced the slice's entries leave the memory tables. After the last slice, the same
batch deletes the old WAL files and fsyncs the WAL directory.

Invariants (those of log_store.py, kept across the slices):
- no segment is written for the rollover before the new WAL file and its directory
  entry are durable (rule 2 of FORMAT.md);
- an entry leaves its memory table only once a completed batch fdatasynced the
  segment holding it; until then it is read from memory;
- the old WAL files are deleted only by a batch whose earlier steps fdatasynced every
  segment this rollover wrote, and only once every entry they hold reached one
  (entries each group had when the rollover started: `upto`); the ones truncated,
  released or replaced by a snapshot meanwhile need no segment;
- while a rollover runs, a group's segments may hold entries that are also in its
  memory table (written, fsync pending): equal to them, below `shadow_from`.

Not here: which batch runs when (the shell), the one-call rollover (log_store.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import is_disk_full
from .group_state import GroupState
from .layout import SEGMENT_SUFFIX, SEGMENTS_DIR, fsync_dir, numbered_name, sync_file
from .segments import PendingAppend, append_entries, create_segment

if TYPE_CHECKING:  # pragma: no cover
    from .log_store import LogStore
    from .wal import WalFile

SLICE_BYTES = 4 * 1024 * 1024     # entry data written per slice (a few ms of writes)
SLICE_ENTRIES = 8192              # and at most this many entries (slots to encode)


@dataclass(slots=True, eq=False)
class Steps:
    """File syncs a batch runs after its own fdatasync, in order, on any thread
    (`run`), then `done` on the store's thread once the batch is synced. `run` may
    run again (a batch retried after a full disk): every step is idempotent."""
    wal: WalFile | None = None                    # fdatasync this WAL file
    # write these segment appends, then fdatasync them
    appends: list[PendingAppend] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)  # fdatasync these segment files
    dirs: list[str] = field(default_factory=list)  # then fsync these directories
    remove: list[str] = field(default_factory=list)  # then delete these WAL files
    wal_dir: str = ""                             # and fsync it after removing
    done: Callable[[], None] | None = None

    def run(self, fsync: bool) -> None:
        if self.wal is not None:
            self.wal.sync(fsync)
        for append in self.appends:
            append.run()
        for append in self.appends:
            sync_file(append.fd, fsync)
        for fd in self.fds:
            sync_file(fd, fsync)
        for directory in dict.fromkeys(self.dirs):
            fsync_dir(directory, fsync)
        if self.remove:
            for path in self.remove:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass          # a retried batch removed it the first time
            fsync_dir(self.wal_dir, fsync)

    def close(self) -> None:
        for append in self.appends:
            append.forget()
            os.close(append.fd)
        for fd in self.fds:
            os.close(fd)
        self.appends, self.fds = [], []


class SlicedRollover:
    """One rollover in progress (LogStore._rolling)."""

    def __init__(self, store: LogStore, new: WalFile, old_wals: list[str],
                 wal_dir: str) -> None:
        self.store = store
        self.old_wals = old_wals
        self.wal_dir = wal_dir
        # uid: (its state when the rollover began, its last index then): the entries
        # the old WAL files hold that must reach segments before they are deleted
        self.upto: dict[str, tuple[GroupState, int]] = {
            uid: (state, state.mem.last) for uid, state in sorted(store._groups.items())
            if state.mem or state.shadow_from is not None}
        self.todo = list(self.upto)       # uids not yet wholly written, in order
        self.carried = False              # the new WAL file and its directory durable
        self.finishing = False            # the step deleting the old WAL files is out
        self.deleted: set[str] = set()    # uids deleted since the start (tombstones)
        store._steps.append(Steps(wal=new, dirs=[wal_dir], done=self._carried))

    def _carried(self) -> None:
        self.carried = True

    def slice(self, whole: bool = False) -> None:
        """Write the next slice (`whole`: everything left), its syncs queued for the
        next batch. Nothing before the new WAL file is durable. A full disk stops
        the slice where it is: the next call goes on from there."""
        if not self.carried or self.finishing:
            return
        budget = None if whole else SLICE_BYTES
        steps = Steps()
        moved: list[tuple[str, GroupState, int]] = []
        left = budget
        entries_left = SLICE_ENTRIES if budget is not None else None
        try:
            while self.todo and (left is None or (left > 0 and entries_left > 0)):
                uid = self.todo[0]
                written, size, count = self._write_group(uid, steps, left, entries_left)
                if written:
                    moved.append((uid, self.upto[uid][0], written))
                if left is not None:
                    left -= size
                    entries_left -= count
                if self._group_done(uid):
                    self.todo.pop(0)
        except OSError as error:
            if not is_disk_full(error) or budget is None:
                self._queue(steps, moved)
                raise
        if not self.todo:
            self.finishing = True
            steps.remove = list(self.old_wals)
            steps.wal_dir = self.wal_dir
        self._queue(steps, moved)

    def _queue(self, steps: Steps, moved: list) -> None:
        if moved or steps.appends or steps.fds or steps.dirs or steps.remove:
            steps.done = lambda: self._written(steps, moved)
            self.store._steps.append(steps)

    def _group_done(self, uid: str) -> bool:
        state, upto = self.upto[uid]
        current = self.store._groups.get(uid)
        if current is not state or not state.mem:
            return True                    # deleted, or nothing left in memory
        if state.shadow_from is not None:
            return False
        return _next_index(state) > min(upto, state.mem.last)

    def _write_group(self, uid: str, steps: Steps, left: int | None,
                     entries_left: int | None) -> tuple[int, int, int]:
        """Append the group's next entries (up to its `upto`) to its segments, unsynced:
        (last index written or 0, data bytes, entries)."""
        store = self.store
        state, upto = self.upto[uid]
        if store._groups.get(uid) is not state:
            return 0, 0, 0
        if state.shadow_from is not None:    # a truncation into segments: apply it first
            store._cut_segments(state, state.shadow_from)
            state.shadow_from = None
        if not state.mem:
            return 0, 0, 0
        first = _next_index(state)
        last = min(upto, state.mem.last)
        if entries_left is not None:  # a slice takes no more: copy no more of the table
            last = min(last, first + entries_left - 1)
        if first > last:
            return 0, 0, 0
        entries = state.mem.slice(first, last + 1)
        if left is not None:
            size = count = 0
            for entry in entries:
                if count and (size + len(entry.data) > left or count >= entries_left):
                    break
                size += len(entry.data)
                count += 1
            entries = entries[:count]
        config = store.config
        directory = os.path.join(store.root, SEGMENTS_DIR, state.dir_name)
        position = 0
        written = size = 0
        while position < len(entries):
            segments = state.segments
            if (segments and segments[-1].accepts_more(config.segment_max_size_bytes)
                    and segments[-1].last + 1 == entries[position].index):
                ref = segments[-1]
            else:
                if not os.path.isdir(directory):
                    os.makedirs(directory)
                    steps.dirs.append(os.path.dirname(directory))
                number = state.next_segment_number
                state.next_segment_number += 1
                ref = create_segment(os.path.join(directory,
                                                  numbered_name(number, SEGMENT_SUFFIX)),
                                     number, state.uid, config.segment_max_entries)
                segments.append(ref)
                steps.dirs.append(directory)
            store._readers.evict(ref.path)
            try:
                taken = append_entries(ref, entries, position, config.segment_max_size_bytes,
                                       fsync=False, later=steps.appends)
            except OSError:
                if ref.count == 0 and segments and segments[-1] is ref:
                    os.remove(segments.pop().path)
                raise
            size += sum(len(e.data) for e in entries[position:position + taken])
            position += taken
            written = entries[position - 1].index
        return written, size, position

    def _written(self, steps: Steps, moved: list[tuple[str, GroupState, int]]) -> None:
        """The batch holding `steps` is synced: the slice's entries leave memory (those
        still in a segment, not shadowed); the last slice ends the rollover."""
        steps.close()
        store = self.store
        for uid, state, index in moved:
            if store._groups.get(uid) is state and state.mem:
                state.mem.drop_below(min(index, state.segments_last()) + 1)
        if steps.remove:
            store._rollover_done(self)

    def finish_now(self) -> None:
        """The rest at once, synced here (a one-call rollover or a close needs it)."""
        fsync = self.store.config.fsync
        while True:
            steps, self.store._steps = self.store._steps, []
            for step in steps:
                step.run(fsync)
                if step.done is not None:
                    step.done()
            if self.store._rolling is not self:
                return
            self.slice(whole=True)


def _next_index(state: GroupState) -> int:
    """The group's first entry in memory not yet in a segment."""
    stored = state.segments_last()
    return max(state.mem.first, stored + 1)

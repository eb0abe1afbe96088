"""LogStore: the Raft log storage of one node, for every group on it.

Responsibilities: take what the Raft cores of all groups must persist (entries, hard
state, conflict truncations, snapshots), make it durable with as few fsyncs as
possible, answer reads, move entries out of memory into per-group segment files, and
delete or compact what the state machine says is dead.

How it works (after rabbitmq/ra):
- `append`, `set_hard_state`, `set_initial_members`, `truncate_from` and
  `delete_group` are pure: they encode WAL records into a pending batch and update the
  group's memory table, so reads see them at once. `flush()` writes the whole batch
  (in write() calls of at most `raft.wal_max_batch_size` records) and fdatasyncs
  once: one fsync commits every group's work (group commit). It returns each touched
  group's last index, now durable. `seal()`, `WalBatch.write()` (or
  `write_records()` and `sync()`) and `synced()` are the same in steps, so a shell can
  run the fdatasync on another thread while the pure writes go on (nothing else
  writes the WAL meanwhile).
- When the WAL file grows past `raft.wal_max_size_bytes` (not counting the records
  it started with), `flush()` rolls over: a new
  WAL file starts (carrying each group's hard state, initial members and release
  cursor), every memory table is appended to its group's segment files (fsynced), and
  only then are the old WAL files deleted and the memory released. Through `seal()`
  and `synced()` (the shell's path) the same steps run in slices (rollover.py): each
  `synced()` takes at most a slice of segment data, whose writes, the file syncs and
  the old WAL's deletion ride on the following batches (`WalBatch.after`), off the
  caller's thread; `flush()` and `roll_over()` still do it all in one call.
- Snapshots are written tmp -> fsync -> rename -> fsync(dir). A snapshot that does
  not match the log (a leader's, installed on a follower) replaces the whole log: a
  RESET record is flushed first, then the snapshot file is written.
- A store opened with `background=True` (the server's) does not write a local
  snapshot or delete a segment file in the call that asks for it: the next sealed
  batch carries the job (deferred.py) and its sync runs it after the fdatasync, on
  the shell's writer thread. Until a snapshot's file is on disk the snapshot is the
  group's for readers (read from memory), and the release cursor and compaction
  asked for with it (the RELEASE record, the memory and segment files they free)
  wait for that file: a restart from the snapshot on disk finds every entry its
  state holds live.
- `release(cursor)` deletes segment files wholly below the release cursor (the lowest
  index the state machine still needs); `compact(live)` rewrites mostly-dead segments
  below the snapshot to keep only live entries (RabbitMQ 4.3 / ra 3); in the
  background a rewrite's copy is written and fsynced by the next batch's sync
  (deferred.SegmentRewrite) and renamed over the segment in its `synced()`.
- Deleting a group: `delete_group` drops it from memory and queues a DELETE_GROUP
  record; once that record is fsynced (in `flush()`, or whatever else writes the
  batch) the group's segment and snapshot directories are removed; recovery removes
  them too if a crash came in between. The uid is then *tombstoned* until a rollover
  has deleted the WAL file holding the record: a snapshot of a group re-created under
  it rolls over first. So next to a DELETE_GROUP, a file of that uid either predates
  it or is a segment of an interrupted rollover, whose entries the WAL still holds
  after the record: recovery may remove them all and replay what follows the
  record (what precedes it is about the deleted group: skipped).

A full disk (errors.py `is_disk_full`: ENOSPC, EDQUOT) breaks nothing: `flush()` and
the WAL writes of a snapshot install cut the WAL back and leave their records
pending; a WalBatch the shell writes is rewound and written again (wal.py); a
snapshot is written to its tmp file before its RESET record, so an install that
finds no room changes nothing; a rollover that finds no room is postponed
(`rollover_postponed`) and tried again after each batch, what reached the segment
files so far out of the memory tables and the old WAL files kept (a crash meanwhile
is an interrupted rollover, which recovery accepts); segment appends allocate their
blocks first (layout.reserve), and rewrites leave the original until the rename.
Any other I/O error still breaks the store until it is reopened.

Invariants (the durability contract):
- an index `flush()` reported for a group is recovered after any crash, unless a later
  `truncate_from`, `install_snapshot`, `release`, `compact` or `delete_group`
  discarded it (and those discard only what Raft or the state machine declared dead,
  as of a snapshot that is on disk);
- a WAL file is deleted only after every entry it holds is in fsynced segment files,
  and its metadata was carried into a newer, fsynced WAL file;
- segment files change only by appending (during a rollover), by atomic rename of a
  rewritten copy, or by deletion;
- a deleted group never comes back: its files go only after its DELETE_GROUP is
  durable, and while that record exists a later group with its uid has nothing on
  disk that the WAL records after it do not also hold.

Not here: consensus (broker/raft/core.py) — this layer never decides what is committed;
byte layouts (FORMAT.md); the I/O scheduling of the shell that calls `flush()`.
"""

from __future__ import annotations

import logging
import os
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from ..types import HardState, LogEntry, SnapshotMeta
from .config import StorageConfig
from .errors import CorruptLogError, is_disk_full
from .group_log import GroupLog
from .group_state import GroupState
from .layout import (QUORUM_DIR, SEGMENT_SUFFIX, SEGMENTS_DIR, SNAPSHOT_FILE,
                     SNAPSHOTS_DIR, WAL_DIR, WAL_SUFFIX, check_uid, fsync_dir,
                     TMP_SUFFIX, group_dir_name, numbered_name, remove_group_dirs)
from .recovery import recover
from .deferred import SegmentRewrite, SnapshotWrite, Unlinks
from .rollover import SlicedRollover, Steps
from .segments import (ReaderCache, SegmentRef, append_entries, create_segment,
                       rewrite_segment)
from .snapshots import (commit_snapshot_file, prepare_snapshot_file, read_snapshot_file,
                        write_snapshot_file)
from .wal import (OWN_BUFFER_BYTES, WAL_VERSION, Record, WalBatch, WalFile,
                  encode_delete_group, encode_entries, encode_group, encode_hard_state,
                  encode_members, encode_release, encode_reset, encode_run, encode_truncate)

_U64 = 1 << 64
_index_of, _term_of, _kind_of, _data_of = map(attrgetter, ("index", "term", "kind", "data"))
_ONLY_BYTES = {bytes}


def _one_run(entries: Sequence[LogEntry], expected: int,
             last_term: int) -> tuple[int, int, list[bytes], list[int]] | None:
    """(term, kind, datas, lengths) of two entries or more that pass `append`'s checks
    as one run: indexes `expected` on, one int term (not below `last_term`), one int
    kind, data of type bytes, each under OWN_BUFFER_BYTES (one ENTRIES record per
    ENTRIES_MAX). Each check is a C pass over the run, no Python step per entry.
    None for anything else: `_check_entries` then says what is wrong, if anything."""
    count = len(entries)
    if count < 2:
        return None
    first = entries[0]
    term, kind = first.term, first.kind
    if (type(term) is not int or type(kind) is not int or not last_term <= term < _U64
            or not 0 <= kind <= 255
            or list(map(_index_of, entries)) != list(range(expected, expected + count))
            or list(map(_term_of, entries)).count(term) != count
            or list(map(_kind_of, entries)).count(kind) != count):
        return None
    datas = list(map(_data_of, entries))
    if set(map(type, datas)) != _ONLY_BYTES:
        return None
    lengths = list(map(len, datas))
    if max(lengths) >= OWN_BUFFER_BYTES:
        return None
    return term, kind, datas, lengths


def _check_entries(group: str, entries: Sequence[LogEntry], expected: int,
                   term: int) -> None:
    """`append`'s checks, entry by entry: indexes `expected` on, terms never below
    `term` nor the one before, bytes data, a kind in 0..255. Raises on the first
    entry that fails one."""
    for position, entry in enumerate(entries):
        if entry.index != expected + position:
            raise ValueError(f"{group}: append of entry {entry.index}, expected "
                             f"{expected + position} (last index {expected - 1})")
        if entry.term < term or entry.term >= _U64:
            raise ValueError(f"{group}: entry {entry.index} has term {entry.term} "
                             f"after term {term}")
        if not isinstance(entry.data, bytes) or not 0 <= entry.kind <= 255:
            raise ValueError(f"{group}: entry {entry.index} needs bytes data and a kind "
                             "in 0..255")
        term = entry.term

log = logging.getLogger("quorumqueue.broker")


@dataclass(frozen=True, slots=True)
class CompactionResult:
    deleted: tuple[str, ...] = ()      # segment files with no live entry
    rewritten: tuple[str, ...] = ()    # mostly dead: now hold only their live entries
    kept: tuple[str, ...] = ()         # below the snapshot but mostly live


@dataclass(slots=True)
class _Pending:
    records: list[Record] = field(default_factory=list)  # one item per WAL record
    touched: set[str] = field(default_factory=set)
    deleted: dict[str, list[str]] = field(default_factory=dict)   # uid: its segment paths


class LogStore:
    def __init__(self, data_dir: str, config: StorageConfig | None = None, *,
                 failpoint: Callable[[str], None] | None = None,
                 background: bool = False) -> None:
        """Open (creating if needed) DATA_DIR/quorum and recover every group.
        `failpoint(name)` is called at named steps of multi-file operations; tests
        raise from it to simulate a crash there. `background`: snapshot files and
        segment deletions are written by the next batch's sync (deferred.py), not
        by the call that asks for them (a shell that syncs off its event loop)."""
        self.config = config or StorageConfig()
        self.background = background
        self.root = os.path.join(data_dir, QUORUM_DIR)
        self._failpoint = failpoint
        self._readers = ReaderCache(self.config.segment_reader_cache)
        self._pending = _Pending()
        self._in_flight: WalBatch | None = None   # sealed, not yet reported synced
        self._broken: Exception | None = None
        self._roll_over_waiters: list[Callable[[], None]] = []  # roll_over_soon's
        # a rollover a full disk stopped: tried again after each batch until it is done
        self.rollover_postponed = False
        # the rollover under way in slices (rollover.py), and its file syncs waiting
        # for the next sealed batch (WalBatch.after)
        self._rolling: SlicedRollover | None = None
        self._steps: list[Steps] = []
        # segments whose compaction copy is being written (SegmentRewrite): id: ref
        self._rewriting: dict[int, SegmentRef] = {}
        recovered = recover(self.root, self.config.fsync, self._segment_term)
        self._groups: dict[str, GroupState] = recovered.groups
        self._wal: WalFile = recovered.wal
        # the WAL file's size once its carried records were written (`_wal_full`); a
        # recovered file's is not known, so all of it counts
        self._wal_carried = 0
        self._old_wals: list[str] = recovered.old_wal_paths
        # uids with a DELETE_GROUP in a WAL file still on disk: no snapshot may be
        # written for them until a rollover deleted those files ("Deleting a group")
        self._tombstones: set[str] = set(recovered.deleted)
        stranded = [s for s in self._groups.values() if s.mem and s.mem.last < s.snapshot_index]
        if recovered.stale_resets or stranded or self._wal.version < WAL_VERSION:
            # a RESET whose snapshot never landed must not be replayed later; entries
            # left below a snapshot must not sit under the new tail of the memory table;
            # an older-version WAL file is never appended to
            self.roll_over()

    # --- writes buffered until flush() (pure: no I/O) --------------------------------

    def append(self, group: str, entries: Sequence[LogEntry]) -> None:
        """Entries continue the group's log: entries[0].index == last_index() + 1,
        consecutive indexes, terms never decreasing."""
        if not entries:
            return
        state = self._writable(group)
        expected = state.last_index() + 1
        term = state.last_term_known() or 0     # no file read on the append path
        run = _one_run(entries, expected, term)
        if run is not None:  # a proposal run: checked and encoded in C passes
            term, kind, datas, lengths = run
            records = encode_run(self._gid(group), expected, term, kind, datas, lengths)
            data_bytes = sum(lengths)
        else:
            _check_entries(group, entries, expected, term)
            records, data_bytes = encode_entries(self._gid(group), entries), None
        self._pending.records.extend(records)
        state.mem.extend(entries, data_bytes)
        self._pending.touched.add(group)

    def set_hard_state(self, group: str, hard_state: HardState) -> None:
        if not 0 <= hard_state.term < _U64 or not isinstance(hard_state.voted_for,
                                                             (str, type(None))):
            raise ValueError(f"{group}: bad hard state {hard_state!r}")
        state = self._writable(group)
        self._pending.records.append(encode_hard_state(self._gid(group), hard_state))
        state.hard_state = hard_state
        self._pending.touched.add(group)

    def set_initial_members(self, group: str, members: Iterable[str]) -> None:
        """The membership a group starts with (what `members()` answers)."""
        members = tuple(members)
        if not all(isinstance(m, str) for m in members) or len(members) > 0xFFFF:
            raise ValueError(f"{group}: members must be strings, got {members!r}")
        state = self._writable(group)
        self._pending.records.append(encode_members(self._gid(group), members))
        state.initial_members = members
        self._pending.touched.add(group)

    def truncate_from(self, group: str, index: int) -> None:
        """Discard entries with index >= `index` (a follower's conflicting suffix).
        Refused at or below the snapshot index: that part is committed."""
        state = self._writable(group)
        last = state.last_index()
        if index <= state.snapshot_index or index > last + 1:
            raise ValueError(f"{group}: cannot truncate from {index} (snapshot at "
                             f"{state.snapshot_index}, last index {last})")
        if index == last + 1:
            return
        self._pending.records.append(encode_truncate(self._gid(group), index))
        state.discard_from(index)
        self._pending.touched.add(group)

    def delete_group(self, group: str) -> None:
        """Forget the whole group (a deleted quorum queue). At once, reads answer as for
        a uid never written to and the memory table is released; the next flush()
        makes that durable and removes the group's segment and snapshot directories.
        The uid may be written to again: it starts empty, from index 1. Deleting a uid
        again, or one never written, is harmless (it is recorded all the same)."""
        check_uid(group)
        self._check_usable()
        assert self._wal.version >= 2, "DELETE_GROUP in an older-version WAL file"
        state = self._groups.pop(group, None)
        self._drop_steps(lambda step: getattr(step, "uid", None) == group)
        self._pending.records.append(encode_delete_group(self._gid(group)))
        self._pending.touched.discard(group)
        if self._rolling is not None:
            self._rolling.deleted.add(group)   # its record is in the new WAL file
        paths = self._pending.deleted.setdefault(group, [])
        paths += [ref.path for ref in state.segments] if state is not None else []
        self._tombstones.add(group)

    # --- durability --------------------------------------------------------------------

    def flush(self) -> dict[str, int]:
        """Write everything pending with one fdatasync. Returns {group: last index} for
        every group written to since the previous flush; all of it is now durable.
        On a full disk it raises with nothing changed: the records wait, pending."""
        batch = self.seal()
        try:
            batch.write()
        except OSError as error:
            self._in_flight = None
            if not is_disk_full(error):
                self._broken = error
                raise
            batch.rewind()
            self._unseal(batch)
            raise
        return self._after_batch(batch, sliced=False)

    def _unseal(self, batch: WalBatch) -> None:
        """A sealed batch not written after all: its records go back in front of
        what is pending, as if it had never been sealed."""
        pending = self._pending
        pending.records[:0] = batch.records
        pending.touched.update(batch.durable)
        for uid, paths in batch.deleted.items():
            pending.deleted.setdefault(uid, [])[:0] = paths
        self._steps[:0] = batch.after

    def seal(self) -> WalBatch:
        """Take everything pending as one batch: `flush()` in steps, for a caller that
        fdatasyncs off its event loop — `seal()`, then `batch.write_records()` and
        `batch.sync()` (on any thread), then `synced(batch)` back here. Between seal and synced the pure writes
        (append, set_hard_state, delete_group...) and reads go on as usual; nothing
        else may write the WAL (a second seal, flush, snapshot install or rollover
        raises)."""
        self._idle()
        pending, self._pending = self._pending, _Pending()
        durable = {group: self._groups[group].last_index() for group in sorted(pending.touched)
                   if group in self._groups}
        batch = WalBatch(self._wal, pending.records, self.config.wal_max_batch_size,
                         self.config.fsync, durable, pending.deleted)
        batch.after, self._steps = self._steps, []
        self._in_flight = batch
        return batch

    def synced(self, batch: WalBatch) -> dict[str, int]:
        """`batch.write()` returned (or raised): what it made durable, {group: last
        index}; then the groups it deleted lose their files, and a full WAL rolls over
        in slices (rollover.py): one slice after each batch, its writes and file
        syncs in the next batch (`WalBatch.after`), so no call here writes entry data."""
        return self._after_batch(batch, sliced=True)

    @property
    def rolling_over(self) -> bool:
        """A rollover in slices is under way (the old WAL files are not deleted yet)."""
        return self._rolling is not None

    def _after_batch(self, batch: WalBatch, sliced: bool) -> dict[str, int]:
        assert batch is self._in_flight, "synced() of a batch this store did not seal last"
        self._in_flight = None
        if batch.error is not None:
            self._broken = batch.error
            self._check_usable()
        if batch.deleted:
            self._remove_deleted_groups(batch.deleted)
        for steps in batch.after:
            if steps.done is not None:
                steps.done()
        if self._roll_over_waiters or self.rollover_postponed or not sliced:
            if self._rolling is not None:
                self._rolling.finish_now()
            if self._wal_full() or self._roll_over_waiters or self.rollover_postponed:
                self._roll_over_now()
        elif self._rolling is not None:
            self._rolling.slice()
        elif self._wal_full():
            self._start_sliced()
        return batch.durable

    def _wal_full(self) -> bool:
        """The WAL file holds more than `raft.wal_max_size_bytes` past the records a
        new file starts with. Those carried records alone never count: with many
        groups and a small limit they can pass it, and a rollover that would move
        nothing then began again after every batch, a Sync each, for ever."""
        return self._wal.size - self._wal_carried > self.config.wal_max_size_bytes

    def _start_sliced(self) -> None:
        """A new WAL file with the carried metadata, written (synced by the next
        batch); the memory tables follow in slices. A full disk: tried again after
        the next batch."""
        wal_dir = os.path.join(self.root, WAL_DIR)
        number = self._wal.number + 1
        try:
            new = WalFile.create(os.path.join(wal_dir, numbered_name(number, WAL_SUFFIX)),
                                 number, fsync=False)
        except OSError as error:
            if not is_disk_full(error):
                raise
            return
        try:
            new.write(self._carried_records(new))
        except OSError as error:
            new.close()
            os.remove(new.path)
            if not is_disk_full(error):
                raise
            return
        old = [*self._old_wals, self._wal.path]
        self._wal.close()
        self._wal = new
        self._wal_carried = new.size
        self._old_wals = old
        self._rolling = SlicedRollover(self, new, old, wal_dir)

    def _rollover_done(self, rolling: SlicedRollover) -> None:
        """The sliced rollover's last batch deleted the old WAL files."""
        self._old_wals = [path for path in self._old_wals if path not in rolling.old_wals]
        self._tombstones = set(rolling.deleted)   # only the new WAL file's records
        self._rolling = None
        self._fail("rollover.sliced_done")

    def _roll_over_now(self) -> None:
        """The rollover a full WAL (or a waiter) asks for; on a full disk it is
        postponed to the next batch (`rollover_postponed`), the store as usable as
        before: the old WAL files still hold every entry not in fsynced segments."""
        try:
            self.roll_over()
        except OSError as error:
            if not is_disk_full(error):
                raise
            self.rollover_postponed = True
            return
        self.rollover_postponed = False
        waiters, self._roll_over_waiters = self._roll_over_waiters, []
        for done in waiters:
            done()

    @property
    def pending_records(self) -> int:
        """WAL records waiting for the next flush (or seal)."""
        return len(self._pending.records)

    def _idle(self) -> None:
        self._check_usable()
        if self._in_flight is not None:
            raise RuntimeError("the log store has a sealed batch not yet synced: only the "
                               "pure writes may run until synced()")

    def _write_pending(self) -> None:
        """Everything pending, written and fdatasynced now. On a full disk the WAL
        is cut back and the records stay pending (then it raises)."""
        self._idle()
        records = self._pending.records
        if not records:
            return
        batch = WalBatch(self._wal, records, self.config.wal_max_batch_size,
                         self.config.fsync, {}, {})
        try:
            batch.write()
        except OSError as error:
            if not is_disk_full(error):
                self._broken = error
                raise
            batch.rewind()
            raise
        self._pending.records = []
        if self._pending.deleted:
            self._remove_deleted_groups(self._pending.deleted)

    def _remove_deleted_groups(self, deleted: dict[str, list[str]]) -> None:
        """The DELETE_GROUP records are durable: remove those groups' directories. A
        failure leaves files behind that only recovery (which replays the record) may
        remove: a later rollover must not delete the record first, so the store breaks."""
        try:
            self._fail("delete.record_durable")
            for uid in sorted(deleted):
                for path in deleted[uid]:
                    self._readers.evict(path)
                remove_group_dirs(self.root, group_dir_name(uid), self.config.fsync,
                                  self._failpoint)
        except Exception as error:
            self._broken = error
            raise
        deleted.clear()

    def _run_steps_now(self) -> None:
        """The queued file work done here (a close): jobs, then the records their
        completion wrote (a release), until nothing is left; a snapshot the disk has
        no room for stays in the log, to be taken again after a restart."""
        for _attempt in range(3):
            steps, self._steps = self._steps, []
            if not steps:
                return
            for step in steps:
                step.run(self.config.fsync)
            for step in steps:
                if step.done is not None:
                    step.done()
            self._steps = [step for step in self._steps if not getattr(step, "error", None)]
            self._write_pending()

    def _check_usable(self) -> None:
        """After a failed write or fsync the kernel's view of the files is unknown (a
        failed fsync may have dropped dirty pages): only a restart, which recovers
        from what is really on disk, may continue."""
        if self._broken is not None:
            raise RuntimeError(f"the log store failed ({self._broken!r}); close it and "
                               "reopen the data directory") from self._broken

    def roll_over(self) -> None:
        """Start a new WAL file; move every memory table into segment files; delete the
        old WAL files; release the memory. (flush() calls this when the WAL is full.)"""
        self._write_pending()
        if self._rolling is not None:
            self._rolling.finish_now()
        try:
            self._roll_over()
        except Exception as error:
            if is_disk_full(error):
                # every step undid itself or left a state recovery also accepts (the
                # old WAL files kept, segments ending on whole entries): try again
                # later; entries moved so far are out of their memory tables
                raise
            self._broken = error      # half moved: only a restart knows what is on disk
            raise

    def roll_over_soon(self, done: Callable[[], None]) -> None:
        """Roll over now, or once the sealed batch in flight is synced (roll_over may
        not run between seal and synced); then call `done`. What `rabbitmq-queues
        reclaim_quorum_memory` asks for: the memory tables written to segment files."""
        if self._in_flight is None:
            self.roll_over()
            done()
        else:
            self._roll_over_waiters.append(done)

    def _roll_over(self) -> None:
        fsync = self.config.fsync
        wal_dir = os.path.join(self.root, WAL_DIR)
        number = self._wal.number + 1
        new = WalFile.create(os.path.join(wal_dir, numbered_name(number, WAL_SUFFIX)), number,
                             fsync)
        try:
            self._carry_into(new, wal_dir)
        except OSError:
            new.close()
            os.remove(new.path)     # the current WAL stays the one appended to
            raise
        self._fail("rollover.new_wal")
        old = [*self._old_wals, self._wal.path]
        self._wal.close()
        self._wal = new
        self._wal_carried = new.size
        self._old_wals = old          # until they are deleted below
        for uid in sorted(self._groups):
            state = self._groups[uid]
            if state.mem or state.shadow_from is not None:
                self._move_to_segments(state)
                self._fail("rollover.group")
        self._fail("rollover.segments")
        for path in old:
            os.remove(path)
            self._fail("rollover.wal_deleted")
        fsync_dir(wal_dir, fsync)
        self._old_wals = []
        self._tombstones.clear()            # no DELETE_GROUP is left in any WAL file

    def _carry_into(self, new: WalFile, wal_dir: str) -> None:
        """Each group's hard state, initial members and release cursor into the new
        WAL file, fsynced."""
        new.write(self._carried_records(new))
        new.sync(self.config.fsync)
        fsync_dir(wal_dir, self.config.fsync)

    def _carried_records(self, new: WalFile) -> list[bytes]:
        """The GROUP, HARD_STATE, MEMBERS and RELEASE records a new WAL file starts
        with (its gids assigned)."""
        carried: list[bytes] = []
        for uid, state in sorted(self._groups.items()):
            gid = len(new.gids) + 1
            records = []
            if state.hard_state != HardState():
                records.append(encode_hard_state(gid, state.hard_state))
            if state.initial_members:
                records.append(encode_members(gid, state.initial_members))
            if state.release_cursor:
                records.append(encode_release(gid, state.release_cursor))
            if records:
                new.gids[uid] = gid
                carried += [encode_group(gid, uid), *records]
        return carried

    def _move_to_segments(self, state: GroupState) -> None:
        """The group's memory table appended to its segment files (fsynced). On a full
        disk what reached the segments leaves the memory table and the rest stays for
        the next attempt; a segment created for it but left empty is removed."""
        fsync = self.config.fsync
        directory = os.path.join(self.root, SEGMENTS_DIR, state.dir_name)
        changed = False
        if state.shadow_from is not None:
            self._cut_segments(state, state.shadow_from)
            state.shadow_from = None
        entries = state.mem.entries
        position = 0
        try:
            while position < len(entries):
                segments = state.segments
                if (segments and segments[-1].accepts_more(self.config.segment_max_size_bytes)
                        and segments[-1].last + 1 == entries[position].index):
                    ref = segments[-1]
                else:
                    if not os.path.isdir(directory):
                        os.makedirs(directory)
                        fsync_dir(os.path.dirname(directory), fsync)
                    number = state.next_segment_number
                    state.next_segment_number += 1
                    ref = create_segment(os.path.join(directory,
                                                      numbered_name(number, SEGMENT_SUFFIX)),
                                         number, state.uid, self.config.segment_max_entries)
                    segments.append(ref)
                    changed = True
                self._readers.evict(ref.path)
                taken = append_entries(ref, entries, position,
                                       self.config.segment_max_size_bytes, fsync)
                assert taken > 0
                position += taken
        except OSError:
            if state.segments and state.segments[-1].count == 0:
                os.remove(state.segments.pop().path)
            if changed:
                fsync_dir(directory, fsync)
            if position:
                state.mem.drop_below(entries[position].index)
            raise
        if changed:
            fsync_dir(directory, fsync)
        state.mem.clear()

    def _cut_segments(self, state: GroupState, index: int) -> None:
        """Apply a conflict truncation to the files: segment entries >= index go. Each
        file changed is recorded at once, so a full disk part way leaves the refs
        true to the files and a second call finishes the rest."""
        for ref in list(state.segments):
            if ref.last < index:
                continue
            survivors = self._readers.get(ref).read(ref.first, index) if ref.first < index else []
            self._readers.evict(ref.path)
            new = rewrite_segment(ref, state.uid, survivors, ref.compacted, self.config.fsync)
            position = state.segments.index(ref)
            state.segments[position:position + 1] = [new] if new is not None else []

    # --- snapshots, release, compaction (immediate I/O) -------------------------------

    def write_snapshot(self, group: str, meta: SnapshotMeta, state: bytes) -> None:
        """Persist a snapshot of the group's state machine covering the log up to
        meta.index. If the log does not hold (meta.index, meta.term) - a leader's
        snapshot, installed on a follower - it replaces the whole log."""
        group_state = self._writable(group)
        self._check_snapshot(group_state, meta)
        self._end_tombstone(group)
        if self._term_at(group_state, meta.index) != meta.term:
            self.install_snapshot(group, meta, state)
            return
        if self.background:
            self._queue_snapshot(group_state, meta, state)
            return
        self._write_snapshot_file(group_state, meta, state)

    def _queue_snapshot(self, state: GroupState, meta: SnapshotMeta, data: bytes) -> None:
        """The snapshot is the group's at once (reads, `snapshot_meta`, and
        `read_snapshot` from these bytes); its file is written by the next batch's
        sync. Until it is on disk the release cursor waits (`release`)."""
        previous = state.snapshot_write
        durable = state.durable_snapshot_index
        job = SnapshotWrite(state.uid, os.path.join(self.root, SNAPSHOTS_DIR, state.dir_name),
                            meta, data, durable, self._failpoint)
        if previous is not None and any(step is previous for step in self._steps):
            self._drop_steps(lambda step: step is previous)   # not sealed yet: replaced
            job.release = previous.release
        job.done = lambda: self._snapshot_written(state, job)
        state.snapshot = meta
        state.snapshot_write = job
        self._steps.append(job)

    def _snapshot_written(self, state: GroupState, job: SnapshotWrite) -> None:
        """The batch carrying `job` is synced: the snapshot is on disk (or the disk
        was full: tried again with the next batch), and the release cursor may move
        up to it."""
        if self._groups.get(state.uid) is not state:
            return                          # deleted meanwhile
        if job.error is not None:
            if state.snapshot_write is job:
                if not job.warned:
                    job.warned = True
                    log.warning("quorum log of %s: no room on disk for the snapshot at %d "
                                "(%s); tried again with each write", state.uid,
                                job.meta.index, job.error)
                self._steps.append(job)
            return
        if state.snapshot_write is job:
            state.snapshot_write = None
        elif state.snapshot_write is not None:   # a newer one follows: this one is on disk
            newer = state.snapshot_write
            newer.durable_index = max(newer.durable_index, job.meta.index)
        if job.release > state.release_cursor:
            self._release_now(state, job.release)
        if job.compact is not None:
            self._compact(state, job.compact, job.meta.index)

    def _drop_steps(self, dropped: Callable[[object], bool]) -> None:
        """Forget jobs not sealed yet (a group deleted, a snapshot replaced)."""
        self._steps = [step for step in self._steps if not dropped(step)]

    def install_snapshot(self, group: str, meta: SnapshotMeta, state: bytes) -> None:
        """Replace the group's whole log by a snapshot (Raft §7, Ready.snapshot). The
        snapshot is written to its tmp file first (what a full disk refuses: then
        nothing changed), a RESET record is made durable (flushing whatever else is
        pending; those groups are reported by the next flush()), then the snapshot
        file is renamed into place, then the old segment files are deleted."""
        group_state = self._writable(group)
        self._check_snapshot(group_state, meta)
        self._end_tombstone(group)
        directory = os.path.join(self.root, SNAPSHOTS_DIR, group_state.dir_name)
        tmp = prepare_snapshot_file(directory, group, meta, state, self.config.fsync)
        reset = encode_reset(self._gid(group), meta.index, meta.term)
        self._pending.records.append(reset)
        try:
            self._write_pending()
        except OSError:
            self._pending.records.remove(reset)   # a full disk: as if never asked
            os.remove(tmp)
            raise
        self._pending.touched.add(group)
        self._fail("install.reset_durable")
        commit_snapshot_file(directory, tmp, self._failpoint, self.config.fsync)
        if group_state.snapshot_write is not None:   # older: it must not land after this
            queued = group_state.snapshot_write
            self._drop_steps(lambda step: step is queued)
            group_state.snapshot_write = None
        group_state.snapshot = meta
        group_state.mem.clear()
        group_state.shadow_from = None
        group_state.release_cursor = max(group_state.release_cursor, meta.index + 1)
        self._delete_segments(group_state, list(group_state.segments))

    def _end_tombstone(self, group: str) -> None:
        """Before a snapshot of a re-created group whose DELETE_GROUP is still in a WAL
        file: roll over, so recovery can never take it for the deleted group's."""
        if group in self._tombstones:
            self.roll_over()

    def _check_snapshot(self, state: GroupState, meta: SnapshotMeta) -> None:
        if meta.index < 1 or meta.term < 0 or meta.index < state.snapshot_index:
            raise ValueError(f"{state.uid}: snapshot at {meta.index} (term {meta.term}) is "
                             f"invalid or behind the current one at {state.snapshot_index}")
        if not all(isinstance(m, str) for m in meta.members):
            raise ValueError(f"{state.uid}: snapshot members must be strings")

    def _write_snapshot_file(self, state: GroupState, meta: SnapshotMeta, data: bytes) -> None:
        directory = os.path.join(self.root, SNAPSHOTS_DIR, state.dir_name)
        write_snapshot_file(directory, state.uid, meta, data, self.config.fsync, self._failpoint)
        state.snapshot = meta

    def read_snapshot(self, group: str) -> tuple[SnapshotMeta, bytes] | None:
        state = self._groups.get(group)
        if state is None or state.snapshot is None:
            return None
        if state.snapshot_write is not None:      # not on disk yet: its bytes are here
            return state.snapshot_write.meta, state.snapshot_write.data
        path = os.path.join(self.root, SNAPSHOTS_DIR, state.dir_name, SNAPSHOT_FILE)
        uid, meta, data = read_snapshot_file(path)
        if uid != group or meta != state.snapshot:
            raise CorruptLogError(path, None, f"holds {uid!r} at {meta.index}, expected "
                                  f"{group!r} at {state.snapshot.index}")
        return meta, data

    def release(self, group: str, release_cursor: int) -> list[str]:
        """Entries below `release_cursor` are dead (the state machine says so; it must be
        <= snapshot index + 1). Deletes the segment files wholly below it and drops such
        entries from memory; returns the deleted paths. The cursor never moves back."""
        state = self._writable(group)
        if state.snapshot is None or not 1 <= release_cursor <= state.snapshot_index + 1:
            raise ValueError(f"{group}: release cursor {release_cursor} must be within "
                             f"[1, snapshot index + 1 = {state.snapshot_index + 1}]")
        if release_cursor <= state.release_cursor:
            return []
        job = state.snapshot_write
        if job is not None:
            # the cursor is the pending snapshot's: it waits for that file (a restart
            # from the snapshot on disk needs what that snapshot's state holds live)
            job.release = max(job.release, release_cursor)
            return []
        return self._release_now(state, release_cursor)

    def _release_now(self, state: GroupState, release_cursor: int) -> list[str]:
        state.release_cursor = release_cursor
        self._pending.records.append(encode_release(self._gid(state.uid), release_cursor))
        state.mem.drop_below(release_cursor)
        return self._delete_segments(state, [r for r in state.segments if r.last < release_cursor])

    def _delete_segments(self, state: GroupState, refs: list[SegmentRef]) -> list[str]:
        """The files go (in the background: with the next batch's sync, the store no
        longer reading them from now on)."""
        if not refs:
            return []
        paths = [ref.path for ref in refs]
        for ref in refs:
            self._readers.evict(ref.path)
            if not self.background:
                os.remove(ref.path)
        gone = {id(ref) for ref in refs}
        state.segments = [ref for ref in state.segments if id(ref) not in gone]
        directory = os.path.dirname(refs[0].path)
        if self.background:
            self._steps.append(Unlinks(state.uid, directory, paths))
        else:
            fsync_dir(directory, self.config.fsync)
        return paths

    def compact(self, group: str, live_indexes: Iterable[int]) -> CompactionResult:
        """Compact the segments wholly at or below the snapshot index: a segment with no
        live entry is deleted; one whose live entries are under half of its entries or
        of its data bytes is rewritten with only those (tmp, fsync, rename). Reads of a
        compacted range then return only live entries; term_at(snapshot index) still
        answers from the snapshot. `live_indexes`: any iterable of ints, or an
        `array.array` already sorted ascending (used as is, no copy). In the background
        (while the snapshot's file is not on disk) it is done once the file is, with
        this live set (what that snapshot's state holds): nothing is done now."""
        state = self._writable(group)
        if state.snapshot is None:
            raise ValueError(f"{group}: compaction needs a snapshot")
        live = live_indexes if isinstance(live_indexes, array) else sorted(set(live_indexes))
        job = state.snapshot_write
        if job is not None:
            if job.compact is None:   # the first: taken with the snapshot, its live set
                job.compact = live
            return CompactionResult()
        return self._compact(state, live, state.snapshot_index)

    def _compact(self, state: GroupState, live, below: int) -> CompactionResult:
        """`compact` of the segments wholly at or below `below` (a snapshot on disk)."""
        deleted, rewritten, kept = [], [], []
        for position, ref in enumerate(list(state.segments)):
            if ref.last > below:
                break
            reader = self._readers.get(ref)
            slots = reader.slots
            a, b = bisect_left(live, ref.first), bisect_right(live, ref.last)
            keep = [i for i in live[a:b] if reader.term_at(i) is not None]
            if not keep:
                deleted += self._delete_segments(state, [ref])
                continue
            total_bytes = ref.data_end - ref.data_start
            live_bytes = sum(slots.lengths[bisect_left(slots.indexes, i)] for i in keep)
            if len(keep) * 2 >= ref.count and live_bytes * 2 >= total_bytes:
                kept.append(ref.path)
                continue
            if id(ref) in self._rewriting:
                continue              # its copy is being written: compacted again later
            wanted = set(keep)
            entries = [e for e in reader.read(ref.first, ref.last + 1) if e.index in wanted]
            if self.background:       # the copy written on the writer thread
                self._queue_rewrite(state, ref, entries)
                rewritten.append(ref.path)
                continue
            self._readers.evict(ref.path)
            self._fail("compact.before_rewrite")
            new = rewrite_segment(ref, state.uid, entries, True, self.config.fsync)
            assert new is not None
            state.segments[state.segments.index(ref)] = new
            rewritten.append(new.path)
        return CompactionResult(tuple(deleted), tuple(rewritten), tuple(kept))

    def _queue_rewrite(self, state: GroupState, ref: SegmentRef,
                       entries: list[LogEntry]) -> None:
        job = SegmentRewrite(state.uid, ref, entries, ref.count, ref.data_end)
        job.done = lambda: self._rewritten(state, job)
        self._rewriting[id(ref)] = ref
        self._steps.append(job)

    def _rewritten(self, state: GroupState, job: SegmentRewrite) -> None:
        """The batch carrying `job` is synced: its copy replaces the segment (a rename),
        unless the segment is no longer the group's (released, cut, the group
        deleted) or grew meanwhile (a rollover appended to it). The next batch fsyncs the directory: until then a crash may find
        the old file, which holds every live entry the copy does."""
        ref = job.ref
        self._rewriting.pop(id(ref), None)
        tmp = ref.path + TMP_SUFFIX
        current = (self._groups.get(state.uid) is state
                   and any(segment is ref for segment in state.segments)
                   and (ref.count, ref.data_end) == (job.count, job.data_end))
        if job.new is None or not current:
            if job.new is not None:
                try:
                    os.remove(tmp)
                except FileNotFoundError:
                    pass          # the group's directory went with it
            return
        self._readers.evict(ref.path)
        self._fail("compact.before_rewrite")
        os.replace(tmp, ref.path)
        position = next(i for i, segment in enumerate(state.segments) if segment is ref)
        state.segments[position] = job.new
        self._steps.append(Unlinks(state.uid, os.path.dirname(ref.path), []))

    # --- reads -------------------------------------------------------------------------

    def groups(self) -> list[str]:
        return sorted(uid for uid, state in self._groups.items() if state.has_content())

    def group_log(self, group: str) -> GroupLog:
        check_uid(group)
        return GroupLog(self, group)

    def first_index(self, group: str) -> int:
        return self._readable(group).first_index()

    def last_index(self, group: str) -> int:
        return self._readable(group).last_index()

    def term_at(self, group: str, index: int) -> int | None:
        return self._term_at(self._readable(group), index)

    def entries(self, group: str, lo: int, hi: int) -> list[LogEntry]:
        """The stored entries lo <= index < hi (1 <= lo <= hi <= last_index() + 1).
        Contiguous above the snapshot; below it only what release/compact kept."""
        state = self._readable(group)
        last = state.last_index()
        if lo < 1 or hi < lo or hi > last + 1:
            raise ValueError(f"{group}: entries [{lo}, {hi}) outside [1, {last + 1})")
        out: list[LogEntry] = []
        segment_hi = hi
        if state.mem:
            segment_hi = min(segment_hi, state.mem.first)
        if state.shadow_from is not None:
            segment_hi = min(segment_hi, state.shadow_from)
        if lo < segment_hi:
            refs = state.segments
            start = max(bisect_right(refs, lo, key=_first) - 1, 0)
            for ref in refs[start:]:
                if ref.first >= segment_hi:
                    break
                if ref.last >= lo:
                    out.extend(self._readers.get(ref).read(lo, segment_hi))
        out.extend(state.mem.slice(lo, hi))
        return out

    def entry(self, group: str, index: int) -> LogEntry | None:
        state = self._readable(group)
        if not 1 <= index <= state.last_index():
            return None
        found = self.entries(group, index, index + 1)
        return found[0] if found else None

    def snapshot_meta(self, group: str) -> SnapshotMeta | None:
        return self._readable(group).snapshot

    def hard_state(self, group: str) -> HardState:
        return self._readable(group).hard_state

    def members(self, group: str) -> tuple[str, ...]:
        return self._readable(group).initial_members

    def release_cursor(self, group: str) -> int:
        return self._readable(group).release_cursor

    def memtable_bytes(self, group: str) -> int:
        """Estimated heap bytes of the group's entries held in memory (see memtable.py)."""
        return self._readable(group).mem.nbytes

    def total_memtable_bytes(self) -> int:
        return sum(state.mem.nbytes for state in self._groups.values())

    def segment_below(self, group: str, index: int) -> bool:
        """Whether a segment file of `group` holds only entries below `index`
        (a release cursor there would delete it)."""
        for ref in self._readable(group).segments:  # oldest first
            if ref.count:
                return ref.last < index
        return False

    def segment_paths(self, group: str) -> list[str]:
        return [ref.path for ref in self._readable(group).segments]

    def wal_paths(self) -> list[str]:
        return [*self._old_wals, self._wal.path]

    def wal_size(self) -> int:
        return self._wal.size

    def close(self) -> None:
        """Flush what is pending (unless an I/O error broke the store), then close
        every file."""
        if self._broken is None:
            self._write_pending()
            if self._rolling is not None:
                self._rolling.finish_now()
            self._run_steps_now()
        for steps in self._steps:
            steps.close()
        self._wal.close()
        self._readers.close()

    # --- internals -------------------------------------------------------------------

    def _term_at(self, state: GroupState, index: int) -> int | None:
        if index == 0:
            return 0
        entry = state.mem.get(index)
        if entry is not None:
            return entry.term
        if state.snapshot is not None and index == state.snapshot.index:
            return state.snapshot.term
        if index > state.last_index() or (state.shadow_from is not None
                                          and index >= state.shadow_from):
            return None
        refs = state.segments
        position = bisect_right(refs, index, key=_first) - 1
        if position >= 0 and refs[position].last >= index:
            return self._segment_term(refs[position], index)
        return None

    def _segment_term(self, ref: SegmentRef, index: int) -> int | None:
        return self._readers.get(ref).term_at(index)

    def _readable(self, group: str) -> GroupState:
        state = self._groups.get(group)
        return state if state is not None else GroupState.new(group)

    def _writable(self, group: str) -> GroupState:
        self._check_usable()
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = GroupState.new(group)
        return state

    def _gid(self, group: str) -> int:
        gids = self._wal.gids
        gid = gids.get(group)
        if gid is None:
            gid = gids[group] = max(gids.values(), default=0) + 1
            self._pending.records.append(encode_group(gid, group))
        return gid

    def _fail(self, point: str) -> None:
        if self._failpoint is not None:
            self._failpoint(point)


def _first(ref: SegmentRef) -> int:
    return ref.first

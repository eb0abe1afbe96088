"""Recovery: rebuild every group's log from snapshots, segments and the WAL files.

Responsibilities: read what is on disk in a fixed order and decide, for each group,
which entries are its log; tolerate exactly the damage a crash can cause and refuse
everything else with the file and byte offset.

How it works:
1. snapshots/<group>/snapshot.dat: the latest snapshot of each group (checked whole);
2. segments/<group>/*.segment, oldest first: their indexes (not their data);
3. wal/*.wal, oldest first: all of them scanned, then replayed record by record into
   memory tables: ENTRY appends (when the memory table is empty, an entry at or
   below the segments' last index shadows the segment entries from there: they were
   written by an interrupted rollover of this very WAL, or are being replaced),
   TRUNCATE discards a suffix, RESET (a snapshot replaced the log) discards
   everything if the snapshot on disk covers it, RELEASE drops dead entries,
   HARD_STATE and MEMBERS set the group's metadata, DELETE_GROUP forgets the group
   (what its files and earlier records said; later records for it start a new, empty
   group). Records for a uid before its last DELETE_GROUP are skipped, not replayed:
   they cannot change the outcome, and the files they would be checked against may
   be gone (a RESET of a deleted group finds no snapshot, the deletion removed it,
   and would be taken for an install that never finished);
4. a group deleted in any WAL file: its segment and snapshot directories are removed
   (finishing a deletion a crash interrupted between the record and the unlinks);
5. per group: entries above the snapshot must be contiguous, else CorruptLogError.

Why a torn tail is safe where it is tolerated: the WAL is written strictly in order,
so a crash leaves at most one torn record, at the end of the newest file. Segments are
written only during a rollover, while the old WAL (holding the same entries) still
exists; a rollover deletes the old WAL only after fsyncing the segments. So a torn
segment tail is tolerated only when more than one WAL file exists (an interrupted
rollover), and the entries it lost are replayed from that WAL; step 5 proves it.

Why step 4 may remove every file of a deleted group: while a WAL file holding a
group's DELETE_GROUP exists, the store writes no snapshot for that uid, and segments
only in a rollover, from entries the WAL holds after the record until the rollover
deletes it (log_store.py, "Deleting a group"). So each file predates the record, or
its entries are replayed after it. The same reason makes skipping the records before
the last DELETE_GROUP right: no file the replay after it consults depends on them.

Invariants: recovery is idempotent (it may be interrupted and rerun); the only files
it changes are a torn WAL tail (truncated), torn segment tails (rewritten without the
torn part), leftover `.tmp` files (deleted) and deleted groups' directories (removed).

Not here: the write path (log_store.py), byte layouts (wal.py, segments.py,
snapshots.py, FORMAT.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias, assert_never

from ..types import LogEntry
from .errors import CorruptLogError
from .group_state import GroupState
from .layout import (SEGMENT_SUFFIX, SEGMENTS_DIR, SNAPSHOT_FILE, SNAPSHOTS_DIR,
                     WAL_DIR, WAL_SUFFIX, fsync_dir, group_dir_name, list_numbered,
                     numbered_name, remove_group_dirs, remove_tmp_files)
from .segments import (ParsedSegment, SegmentReader, SegmentRef, parse_segment,
                       rewrite_segment)
from .snapshots import read_snapshot_file
from .wal import (DeleteGroupRecord, EntryRecord, GroupRecord, HardStateRecord,
                  MembersRecord, ReleaseRecord, ResetRecord, TruncateRecord, WalFile,
                  WalScan, scan_wal)

TermLookup = Callable[[SegmentRef, int], "int | None"]
Position: TypeAlias = tuple[int, int]     # a WAL record: (file, oldest = 0; byte offset)


@dataclass(slots=True)
class Recovered:
    groups: dict[str, GroupState]
    wal: WalFile | None                       # None when read only
    old_wal_paths: list[str]                  # older WAL files still needed
    stale_resets: list[str] = field(default_factory=list)   # groups: roll over at once
    deleted: list[str] = field(default_factory=list)   # uids with a DELETE_GROUP in a WAL


def recover(root: str, fsync: bool, segment_term: TermLookup,
            readonly: bool = False) -> Recovered:
    """`readonly`: change no file and open no WAL for writing — for readers of a log
    that a live node may be writing (the analytics jobs): a torn tail of any group's
    newest segment is then left out rather than rewritten, and deleted groups' files
    are ignored rather than removed. The groups are what a recovery would find."""
    wal_dir = os.path.join(root, WAL_DIR)
    for directory in (root, wal_dir, os.path.join(root, SEGMENTS_DIR),
                      os.path.join(root, SNAPSHOTS_DIR)):
        if not readonly:
            os.makedirs(directory, exist_ok=True)
    wal_files = list_numbered(wal_dir, WAL_SUFFIX) if os.path.isdir(wal_dir) else []
    groups: dict[str, GroupState] = {}

    def group(uid: str) -> GroupState:
        state = groups.get(uid)
        if state is None:
            state = groups[uid] = GroupState.new(uid)
        return state

    deleted: set[str] = set()
    stale: set[str] = set()

    def forget(uid: str) -> None:
        groups.pop(uid, None)
        deleted.add(uid)

    _read_snapshots(os.path.join(root, SNAPSHOTS_DIR), group, readonly)
    _read_segments(os.path.join(root, SEGMENTS_DIR), group,
                   rollover_interrupted=len(wal_files) > 1, fsync=fsync, readonly=readonly)
    scans = [scan_wal(path, number, newest=position == len(wal_files) - 1)
             for position, (number, path) in enumerate(wal_files)]
    last_deletes = _last_deletes(scans)
    for position, scan in enumerate(scans):
        _replay(scan, position, last_deletes, group, forget, stale)
    if not readonly:
        for uid in sorted(deleted):
            remove_group_dirs(root, group_dir_name(uid), fsync)
    for state in groups.values():
        _check_group(state, root, segment_term)

    if readonly:
        return Recovered(groups, None, [scan.path for scan in scans[:-1]], sorted(stale),
                         sorted(deleted))
    if scans:
        wal = WalFile.reopen(scans[-1], fsync)
        old = [scan.path for scan in scans[:-1]]
    else:
        wal = WalFile.create(os.path.join(wal_dir, numbered_name(1, WAL_SUFFIX)), 1, fsync)
        fsync_dir(wal_dir, fsync)
        old = []
    return Recovered(groups, wal, old, sorted(stale), sorted(deleted))


def _read_snapshots(directory: str, group: Callable[[str], GroupState],
                    readonly: bool) -> None:
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        path = os.path.join(directory, name)
        if not os.path.isdir(path):
            continue
        if not readonly:
            remove_tmp_files(path)
        snapshot_path = os.path.join(path, SNAPSHOT_FILE)
        if not os.path.exists(snapshot_path):
            continue
        uid, meta, _state = read_snapshot_file(snapshot_path)
        if group_dir_name(uid) != name:
            raise CorruptLogError(snapshot_path, None, f"holds group {uid!r}, which belongs "
                                  f"in directory {group_dir_name(uid)!r}")
        group(uid).snapshot = meta


def _read_segments(directory: str, group: Callable[[str], GroupState],
                   rollover_interrupted: bool, fsync: bool, readonly: bool) -> None:
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        path = os.path.join(directory, name)
        if not os.path.isdir(path):
            continue
        if not readonly:
            remove_tmp_files(path)
        files = list_numbered(path, SEGMENT_SUFFIX)
        refs: list[SegmentRef] = []
        uid = None
        for position, (number, file_path) in enumerate(files):
            newest = position == len(files) - 1
            # read only, a live node may be appending to the newest segment right now
            tolerate = newest and (rollover_interrupted or readonly)
            parsed = parse_segment(file_path, number, tolerate_torn=tolerate)
            if parsed is None or parsed.ref.count == 0:
                if not tolerate and parsed is None:
                    raise CorruptLogError(file_path, 0, "unreadable segment header")
                if not readonly:
                    os.remove(file_path)             # created by the interrupted rollover
                    fsync_dir(path, fsync)
                continue
            if group_dir_name(parsed.uid) != name or (uid is not None and parsed.uid != uid):
                raise CorruptLogError(file_path, None, f"holds group {parsed.uid!r}, which "
                                      f"does not belong in directory {name!r}")
            uid = parsed.uid
            ref = (_without_torn_tail(parsed, fsync) if parsed.torn and not readonly
                   else parsed.ref)
            if refs and ref.first <= refs[-1].last:
                raise CorruptLogError(file_path, None, f"starts at index {ref.first}, not "
                                      f"after {refs[-1].path} (ends at {refs[-1].last})")
            refs.append(ref)
        if uid is None:
            continue
        state = group(uid)
        state.segments = refs
        state.next_segment_number = files[-1][0] + 1


def _without_torn_tail(parsed: ParsedSegment, fsync: bool) -> SegmentRef:
    """Rewrite a segment with only its intact entries, so appending cannot resurrect
    half-written index slots beyond them."""
    reader = SegmentReader(parsed.ref, parsed.slots)
    try:
        entries = reader.read(parsed.ref.first, parsed.ref.last + 1)
    finally:
        reader.close()
    ref = rewrite_segment(parsed.ref, parsed.uid, entries, parsed.ref.compacted, fsync)
    assert ref is not None
    return ref


def _last_deletes(scans: list[WalScan]) -> dict[str, Position]:
    """Where each uid's last DELETE_GROUP is. (A gid no GROUP record names is left
    for `_replay` to report.)"""
    found: dict[str, Position] = {}
    for position, scan in enumerate(scans):
        gids: dict[int, str] = {}
        for offset, record in scan.records:
            if isinstance(record, GroupRecord):
                gids[record.gid] = record.uid
            elif isinstance(record, DeleteGroupRecord) and record.gid in gids:
                found[gids[record.gid]] = (position, offset)
    return found


def _replay(scan: WalScan, position: int, last_deletes: dict[str, Position],
            group: Callable[[str], GroupState], forget: Callable[[str], None],
            stale: set[str]) -> None:
    """Replay one WAL file (the `position`-th oldest). Records for a uid before its
    last DELETE_GROUP are about groups that record forgets: they are checked (their
    gid is named) but not replayed."""
    gids: dict[int, str] = {}      # a gid names a uid, across a DELETE_GROUP of it too

    def uid_of(gid: int, offset: int) -> str:
        uid = gids.get(gid)
        if uid is None:
            raise CorruptLogError(scan.path, offset, f"record for group number {gid}, "
                                  "which no GROUP record before it names")
        return uid

    def state_of(gid: int, offset: int) -> GroupState:
        return group(uid_of(gid, offset))

    for offset, record in scan.records:
        if not isinstance(record, GroupRecord):
            deleted_at = last_deletes.get(uid_of(record.gid, offset))
            if deleted_at is not None and (position, offset) < deleted_at:
                continue           # forgotten at deleted_at, whatever it says
        match record:
            case EntryRecord(gid, entry):
                state = state_of(gid, offset)
                _replay_entry(state, entry, scan.path, offset)
            case GroupRecord(gid, uid):
                if gid in gids:
                    raise CorruptLogError(scan.path, offset, f"group number {gid} named twice")
                gids[gid] = uid
                group(uid)
            case HardStateRecord(gid, hard_state):
                state_of(gid, offset).hard_state = hard_state
            case TruncateRecord(gid, index):
                state_of(gid, offset).discard_from(index)
            case ResetRecord(gid, index, _term):
                state = state_of(gid, offset)
                if state.snapshot is not None and state.snapshot.index >= index:
                    state.discard_all()
                    state.release_cursor = max(state.release_cursor, index + 1)
                else:               # the install did not finish: its snapshot is missing
                    stale.add(state.uid)
            case ReleaseRecord(gid, cursor):
                state = state_of(gid, offset)
                state.release_cursor = max(state.release_cursor, cursor)
                state.mem.drop_below(cursor)
            case MembersRecord(gid, members):
                state_of(gid, offset).initial_members = members
            case DeleteGroupRecord(gid):
                forget(uid_of(gid, offset))
            case _:
                assert_never(record)


def _replay_entry(state: GroupState, entry: LogEntry, path: str, offset: int) -> None:
    mem = state.mem
    if mem:
        if entry.index != mem.last + 1:
            raise CorruptLogError(path, offset, f"group {state.uid!r}: entry {entry.index} "
                                  f"does not follow {mem.last}")
    else:
        state.discard_from(entry.index)
    mem.extend([entry])


def _check_group(state: GroupState, root: str, segment_term: TermLookup) -> None:
    """Apply the snapshot's authority, then prove the log above it is contiguous."""
    snapshot = state.snapshot
    if snapshot is not None:
        stored = _stored_term(state, snapshot.index, segment_term)
        if stored is not None and stored != snapshot.term:
            state.discard_all()          # entries conflicting with a committed snapshot
    if state.mem and state.release_cursor:
        state.mem.drop_below(state.release_cursor)
    expected = state.snapshot_index + 1
    shadow = state.shadow_from
    runs: list[tuple[int, int, str]] = []
    for ref in state.segments:
        if shadow is not None and ref.first >= shadow:
            break
        last = ref.last if shadow is None else min(ref.last, shadow - 1)
        if ref.compacted and last >= expected:
            raise CorruptLogError(ref.path, None, f"compacted segment reaches index {last}, "
                                  f"above the snapshot ({expected - 1})")
        runs.append((ref.first, last, ref.path))
    if state.mem:
        runs.append((state.mem.first, state.mem.last, os.path.join(root, WAL_DIR)))
    for first, last, where in runs:
        if last < expected:
            continue
        if first > expected:
            raise CorruptLogError(where, None, f"group {state.uid!r}: entries {expected} to "
                                  f"{first - 1} are missing (the log above the snapshot must "
                                  "be contiguous)")
        expected = last + 1


def _stored_term(state: GroupState, index: int, segment_term: TermLookup) -> int | None:
    entry = state.mem.get(index)
    if entry is not None:
        return entry.term
    if state.shadow_from is not None and index >= state.shadow_from:
        return None
    for ref in state.segments:
        if ref.first <= index <= ref.last:
            return segment_term(ref, index)
    return None

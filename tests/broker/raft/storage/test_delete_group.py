"""Deleting a group (a deleted quorum queue): `LogStore.delete_group`, the DELETE_GROUP
WAL record and its recovery (FORMAT.md "Durability and deletion rules", rule 7, and
"Replaying a group's WAL records"; log_store.py "Deleting a group").

Crashes are simulated with crash images taken at the store's failpoints: copies of the
data directory taken while the store is open (every write goes straight to the kernel).
"""

from __future__ import annotations

import itertools
import os
import struct
import zlib

import pytest

from quorumqueue.broker.raft.storage import CorruptLogError, LogStore
from quorumqueue.broker.raft.storage.layout import group_dir_name
from quorumqueue.broker.raft.storage.wal import (WAL_VERSION, DeleteGroupRecord, GroupRecord,
                                                  scan_wal)
from quorumqueue.broker.raft.types import HardState, SnapshotMeta

from .support import (G1, G2, G3, append_singly, config, crash_image, log_of, make_entries,
                      reopen, wal_files)

NEVER = "%2F/never-written"
SNAPSHOT = SnapshotMeta(6, 1, ("rabbit@a", "rabbit@b"))


def _populate(store: LogStore) -> None:
    """G1, G2, G3 with entries in segments and in memory, hard state, members; G1 and
    G2 also with a snapshot and a release cursor. Everything flushed."""
    for group in (G1, G2, G3):
        store.append(group, make_entries(group, 1, 11))
        store.set_hard_state(group, HardState(1, "rabbit@a"))
        store.set_initial_members(group, ("rabbit@a", "rabbit@b"))
    store.roll_over()                                    # 1..10 in segments
    for group in (G1, G2, G3):
        store.append(group, make_entries(group, 11, 15))
    for group in (G1, G2):
        store.write_snapshot(group, SNAPSHOT, b"machine state")
        store.release(group, 3)
    store.flush()


def _view(store: LogStore, group: str) -> dict:
    """Everything a reader can ask about a group."""
    return {"log": log_of(store, group), "hard_state": store.hard_state(group),
            "members": store.members(group), "snapshot": store.read_snapshot(group),
            "cursor": store.release_cursor(group), "segments": store.segment_paths(group)}


def _without_paths(view: dict) -> dict:
    return {key: value for key, value in view.items() if key != "segments"}


def _reads(store: LogStore, group: str) -> list:
    """Every read's answer, or the error it raises (the uid masked in its message)."""
    calls = [lambda: store.first_index(group), lambda: store.last_index(group),
             lambda: store.term_at(group, 0), lambda: store.term_at(group, 1),
             lambda: store.entries(group, 1, 1), lambda: store.entries(group, 1, 2),
             lambda: store.entry(group, 1), lambda: store.snapshot_meta(group),
             lambda: store.read_snapshot(group), lambda: store.hard_state(group),
             lambda: store.members(group), lambda: store.release_cursor(group),
             lambda: store.memtable_bytes(group), lambda: store.segment_paths(group),
             lambda: store.group_log(group).term_at(1)]
    out = []
    for call in calls:
        try:
            out.append(call())
        except Exception as error:       # noqa: BLE001 - compared, not swallowed
            out.append((type(error), str(error).replace(group, "<uid>")))
    return out


def _group_dirs(data_dir, group: str) -> list[str]:
    root = os.path.join(str(data_dir), "quorum")
    return [path for path in (os.path.join(root, kind, group_dir_name(group))
                              for kind in ("segments", "snapshots")) if os.path.exists(path)]


def _wal_records(data_dir, group: str) -> list[str]:
    """Type names of the records about `group` in every WAL file, in order."""
    names = []
    paths = wal_files(data_dir)
    for path in paths:
        number = int(os.path.basename(path).split(".")[0])
        gids: dict[int, str] = {}
        for _offset, record in scan_wal(path, number, newest=path == paths[-1]).records:
            if isinstance(record, GroupRecord):
                gids[record.gid] = record.uid
            if gids.get(record.gid) == group:
                names.append(type(record).__name__)
    return names


def test_delete_then_restart(tmp_path):
    """Rule 7: after delete_group and the next flush the group is gone - not listed,
    memory released, both directories removed, reads answer as for a uid never
    written - and a restart does not bring it back although its old records are
    still in the WAL file."""
    store = LogStore(str(tmp_path), config())
    _populate(store)
    others = {group: _view(store, group) for group in (G2, G3)}
    store.append(G1, make_entries(G1, 15, 18))           # pending, then deleted with it
    assert store.memtable_bytes(G1) > 0
    store.delete_group(G1)
    assert store.groups() == sorted([G2, G3])
    assert store.memtable_bytes(G1) == 0
    assert _reads(store, G1) == _reads(store, NEVER)
    assert len(_group_dirs(tmp_path, G1)) == 2           # removed only once durable
    assert store.flush() == {}                           # G1 is not reported
    assert _group_dirs(tmp_path, G1) == []
    assert _reads(store, G1) == _reads(store, NEVER)
    store.close()

    records = _wal_records(tmp_path, G1)
    assert "EntryRecord" in records and records[-1] == "DeleteGroupRecord"
    again = reopen(tmp_path)
    assert again.groups() == sorted([G2, G3])
    assert _reads(again, G1) == _reads(again, NEVER)
    assert {group: _view(again, group) for group in (G2, G3)} == others
    assert _group_dirs(tmp_path, G1) == []
    again.delete_group(G1)                               # again: harmless
    again.delete_group(NEVER)
    assert again.flush() == {} and again.groups() == sorted([G2, G3])
    assert reopen(tmp_path).groups() == sorted([G2, G3])


def test_delete_is_not_durable_before_flush(tmp_path):
    """Rule 1: like every pending write, a delete not flushed is lost in a crash; the
    group comes back whole, files included."""
    store = LogStore(str(tmp_path / "live"), config())
    _populate(store)
    before = _without_paths(_view(store, G1))
    store.delete_group(G1)
    image = crash_image(tmp_path / "live", tmp_path / "image")
    again = reopen(image)
    assert G1 in again.groups() and _without_paths(_view(again, G1)) == before
    assert len(_group_dirs(image, G1)) == 2


def test_delete_does_no_io(tmp_path, monkeypatch):
    """delete_group is pure, like append: it only adds to the pending batch."""
    store = LogStore(str(tmp_path), config())
    _populate(store)

    def no_io(*args, **kwargs):
        raise AssertionError("I/O in delete_group")

    for name in ("open", "read", "pread", "write", "pwrite", "fdatasync", "fsync",
                 "remove", "unlink", "rmdir", "listdir"):
        monkeypatch.setattr(os, name, no_io)
    store.delete_group(G1)
    monkeypatch.undo()
    store.flush()
    assert _group_dirs(tmp_path, G1) == []


@pytest.mark.parametrize("crash_at", ["delete.record_durable#1", "delete.files_removed#1",
                                      "delete.files_removed#2"])
def test_crash_between_the_record_and_the_unlinks(tmp_path, crash_at):
    """Rule 7: a crash after the DELETE_GROUP is durable but before (or while) the
    files are removed: recovery replays the record, removes what is left, and the
    group does not come back - on that restart or any later one."""
    images = []
    seen: dict[str, int] = {}

    def failpoint(name):
        seen[name] = seen.get(name, 0) + 1
        if f"{name}#{seen[name]}" == crash_at:          # the n-th call of that point
            images.append(crash_image(tmp_path / "live", tmp_path / "image"))

    store = LogStore(str(tmp_path / "live"), config(), failpoint=failpoint)
    _populate(store)
    others = {group: log_of(store, group) for group in (G2, G3)}
    store.delete_group(G1)
    store.flush()
    assert len(images) == 1
    image = images[0]
    left = _group_dirs(image, G1)
    assert len(left) == {"delete.record_durable#1": 2, "delete.files_removed#1": 2,
                         "delete.files_removed#2": 1}[crash_at]
    assert _wal_records(image, G1)[-1] == "DeleteGroupRecord"
    for _restart in range(2):
        again = reopen(image)
        assert G1 not in again.groups()
        assert _reads(again, G1) == _reads(again, NEVER)
        assert {group: log_of(again, group) for group in (G2, G3)} == others
        assert _group_dirs(image, G1) == []
        again.close()


def test_a_failed_removal_breaks_the_store_until_reopened(tmp_path):
    """If removing the files fails, the record must stay in the WAL until recovery has
    removed them: the store refuses to go on (a rollover would delete the record)."""
    def failpoint(name):
        if name == "delete.files_removed":
            raise OSError(5, "Input/output error")

    store = LogStore(str(tmp_path), config(), failpoint=failpoint)
    _populate(store)
    store.delete_group(G1)
    with pytest.raises(OSError):
        store.flush()
    with pytest.raises(RuntimeError, match="Input/output error"):
        store.roll_over()
    assert _group_dirs(tmp_path, G1)                     # left for recovery
    again = reopen(tmp_path)
    assert G1 not in again.groups() and _group_dirs(tmp_path, G1) == []


def _assert_fresh(store: LogStore, group: str, last: int) -> None:
    assert store.first_index(group) == 1 and store.last_index(group) == last
    assert log_of(store, group) == [(e.index, e.term, e.kind, e.data)
                                    for e in make_entries(group, 1, last + 1, term=7, size=9)]
    assert store.snapshot_meta(group) is None and store.read_snapshot(group) is None
    assert store.hard_state(group) == HardState() and store.members(group) == ()
    assert store.release_cursor(group) == 0


@pytest.mark.parametrize("flush_between", [False, True])
def test_recreate_the_same_uid(tmp_path, flush_between):
    """A uid may be written again after its delete (in the same batch or later): the
    group starts empty from index 1 - no snapshot, hard state term 0, no members -
    across restarts and rollovers, and its old data never shows."""
    store = LogStore(str(tmp_path), config())
    _populate(store)
    store.delete_group(G1)
    if flush_between:
        store.flush()
    with pytest.raises(ValueError, match="expected 1"):
        store.append(G1, make_entries(G1, 15, 16))
    store.append(G1, make_entries(G1, 1, 5, term=7, size=9))
    _assert_fresh(store, G1, 4)
    assert store.flush() == {G1: 4}
    _assert_fresh(reopen(tmp_path), G1, 4)
    store.roll_over()                   # the delete's WAL file goes; G1 to segments
    assert store.total_memtable_bytes() == 0
    assert [os.path.basename(p) for p in store.segment_paths(G1)] == ["00000001.segment"]
    _assert_fresh(store, G1, 4)
    _assert_fresh(reopen(tmp_path), G1, 4)
    store.append(G1, make_entries(G1, 5, 7, term=7, size=9))
    store.flush()
    _assert_fresh(reopen(tmp_path), G1, 6)
    store.write_snapshot(G1, SnapshotMeta(3, 7, ("rabbit@z",)), b"new")
    again = reopen(tmp_path)
    assert again.snapshot_meta(G1) == SnapshotMeta(3, 7, ("rabbit@z",))
    assert again.read_snapshot(G1)[1] == b"new" and again.last_index(G1) == 6


@pytest.mark.parametrize("crash_at", [None, "delete.record_durable#1",
                                      "delete.files_removed#1", "delete.files_removed#2"])
def test_a_snapshot_install_before_the_delete(tmp_path, crash_at):
    """Replay skips a uid's records before its last DELETE_GROUP (FORMAT.md, "Replaying
    a group's WAL records"). Among them, the RESET of an install that finished would
    be checked against a snapshot file the deletion removed, taken for an unfinished
    one, and the entries after it refused: "entry 21 does not follow 14" (found by
    test_model.py). Also on crash images from between the record and the unlinks, and
    with the uid deleted twice and re-created in the same WAL file."""
    images = []
    seen: dict[str, int] = {}

    def failpoint(name):
        seen[name] = seen.get(name, 0) + 1
        if f"{name}#{seen[name]}" == crash_at:
            images.append(crash_image(tmp_path / "live", tmp_path / "image"))

    store = LogStore(str(tmp_path / "live"), config(), failpoint=failpoint)
    _populate(store)                                     # G1: 11..14 in the WAL
    others = {group: _without_paths(_view(store, group)) for group in (G2, G3)}
    store.install_snapshot(G1, SnapshotMeta(20, 2, ("rabbit@b",)), b"leader state")
    store.append(G1, make_entries(G1, 21, 25, term=2))
    store.delete_group(G1)
    store.append(G1, make_entries(G1, 1, 3, term=5))
    store.delete_group(G1)
    store.append(G1, make_entries(G1, 1, 5, term=7, size=9))
    store.flush()
    assert [name for name in _wal_records(tmp_path / "live", G1)
            if name in ("ResetRecord", "DeleteGroupRecord")] == [
        "ResetRecord", "DeleteGroupRecord", "DeleteGroupRecord"]
    store.close()
    image = images[0] if crash_at else str(tmp_path / "live")
    if crash_at == "delete.files_removed#2":             # the snapshot file is gone...
        assert _group_dirs(image, G1) == [os.path.join(image, "quorum", "snapshots",
                                                       group_dir_name(G1))]
    for _restart in range(2):
        again = reopen(image)
        _assert_fresh(again, G1, 4)
        assert {group: _without_paths(_view(again, group))
                for group in (G2, G3)} == others
        assert again.groups() == sorted([G1, G2, G3])
        again.close()


def test_no_snapshot_of_a_recreated_group_while_the_delete_is_in_a_wal(tmp_path):
    """Rule 7, tombstone: a snapshot of a re-created group whose DELETE_GROUP is still in
    the WAL rolls the WAL over first. Otherwise a restart would take the new snapshot
    for the deleted group's and remove it."""
    store = LogStore(str(tmp_path), config())
    _populate(store)
    store.delete_group(G1)
    store.append(G1, make_entries(G1, 1, 9, term=7, size=9))
    store.flush()
    wal = store.wal_paths()
    store.write_snapshot(G1, SnapshotMeta(8, 7, ("rabbit@z",)), b"new")
    assert store.wal_paths() != wal and not os.path.exists(wal[0])
    assert "DeleteGroupRecord" not in _wal_records(tmp_path, G1)
    again = reopen(tmp_path)
    assert again.read_snapshot(G1) == (SnapshotMeta(8, 7, ("rabbit@z",)), b"new")
    assert [e.index for e in again.entries(G1, 1, 9)] == list(range(1, 9))
    again.write_snapshot(G1, SnapshotMeta(8, 7, ("rabbit@z",)), b"again")   # no tombstone
    assert again.wal_paths() == store.wal_paths()


def test_crash_in_a_rollover_after_delete_and_recreate(tmp_path):
    """Rule 7 and rule 4: a crash at any step of the rollover after a delete and
    re-create leaves the old WAL (DELETE_GROUP, then the new group's entries) next to
    segments of the new group; recovery removes them with the deleted group's files,
    replays the entries, and gets the same logs - repeatably."""
    images = []
    taken = itertools.count()

    def failpoint(name):
        if name.startswith("rollover."):
            images.append((name, crash_image(tmp_path / "live", tmp_path / f"img{next(taken)}")))

    store = LogStore(str(tmp_path / "live"), config(), failpoint=failpoint)
    _populate(store)
    images.clear()
    store.delete_group(G1)
    store.append(G1, make_entries(G1, 1, 6, term=7, size=9))
    store.set_hard_state(G1, HardState(7, "rabbit@z"))
    store.append(G3, make_entries(G3, 15, 20))
    store.flush()
    expected = {group: _without_paths(_view(store, group)) for group in (G1, G2, G3)}
    store.roll_over()
    assert store.segment_paths(G1) and store.total_memtable_bytes() == 0
    assert _wal_records(tmp_path / "live", G1) == ["GroupRecord", "HardStateRecord"]
    names = [name for name, _ in images]
    assert names[0] == "rollover.new_wal" and "rollover.wal_deleted" in names
    g1_written = [image for name, image in images if name == "rollover.group"][0]
    assert _group_dirs(g1_written, G1) and len(wal_files(g1_written)) == 2
    assert "DeleteGroupRecord" in _wal_records(g1_written, G1)

    def view(data_dir):
        again = reopen(data_dir)
        got = {group: _without_paths(_view(again, group)) for group in (G1, G2, G3)}
        again.close()
        return got

    for name, image in images:
        assert view(image) == expected, name
        assert view(image) == expected, name
    assert view(tmp_path / "live") == expected


def test_other_groups_keep_their_data(tmp_path):
    """Deleting one group touches nothing of the others: their entries, snapshots and
    metadata survive the delete, restarts and WAL rollovers (FORMAT.md rule 4)."""
    cfg = config(wal_max_size_bytes=4000, segment_max_entries=4)
    store = LogStore(str(tmp_path), cfg)
    _populate(store)
    store.delete_group(G2)
    store.flush()
    for round_ in range(6):
        for group in (G1, G3):
            lo = store.last_index(group) + 1
            store.append(group, make_entries(group, lo, lo + 7, size=60))
        store.flush()                                    # rolls over now and then
        if round_ % 2:
            store.close()
            store = reopen(tmp_path, cfg)
        assert G2 not in store.groups() and _group_dirs(tmp_path, G2) == []
    assert len({os.path.basename(p) for p in wal_files(tmp_path)}) == 1
    store.roll_over()      # before the view: it moves the memory tables into segments
    expected = {group: _view(store, group) for group in (G1, G3)}
    assert expected[G1]["snapshot"] == (SNAPSHOT, b"machine state")
    assert [e[0] for e in expected[G1]["log"]] == list(range(7, 57))
    assert [e[0] for e in expected[G3]["log"]] == list(range(1, 57))
    assert store.hard_state(G3) == HardState(1, "rabbit@a")
    store.close()
    again = reopen(tmp_path, cfg)
    assert {group: _view(again, group) for group in (G1, G3)} == expected
    assert again.groups() == sorted([G1, G3])


@pytest.mark.parametrize("flush_first", [False, True])
def test_rollover_after_delete(tmp_path, flush_first):
    """A rollover carries no record of a deleted group into the new WAL file; once it
    deleted the old file, nothing on disk names the group."""
    store = LogStore(str(tmp_path), config())
    _populate(store)
    store.delete_group(G1)
    if flush_first:
        store.flush()
    store.roll_over()                                    # writes the pending delete first
    assert _group_dirs(tmp_path, G1) == []
    assert len(wal_files(tmp_path)) == 1 and _wal_records(tmp_path, G1) == []
    assert _wal_records(tmp_path, G2)                    # carried: hard state, members...
    for root, dirs, names in os.walk(tmp_path):
        assert group_dir_name(G1) not in dirs
    again = reopen(tmp_path)
    assert again.groups() == sorted([G2, G3])
    assert _reads(again, G1) == _reads(again, NEVER)


# --- format versions (FORMAT.md "Versioning") --------------------------------------------

def _as_version_1(path: str) -> None:
    with open(path, "r+b") as handle:
        head = bytearray(handle.read(12))
        head[4:6] = struct.pack(">H", 1)
        handle.seek(0)
        handle.write(bytes(head) + zlib.crc32(bytes(head)).to_bytes(4, "big"))


def test_a_version_1_wal_is_read_and_never_appended_to(tmp_path):
    """A data directory written before DELETE_GROUP existed opens; the store starts a
    current-version file instead of appending to the version-1 one, so a delete can
    follow. (Single appends: ENTRY records, as a version-1 file holds.)"""
    store = LogStore(str(tmp_path), config())
    append_singly(store, G1, make_entries(G1, 1, 6))
    store.set_hard_state(G1, HardState(2, "rabbit@a"))
    append_singly(store, G2, make_entries(G2, 1, 3))
    store.close()
    (old,) = wal_files(tmp_path)
    _as_version_1(old)
    assert scan_wal(old, 1, newest=True).version == 1
    again = reopen(tmp_path)
    (new,) = wal_files(tmp_path)
    assert new != old and scan_wal(new, 2, newest=True).version == WAL_VERSION
    assert [e.index for e in again.entries(G1, 1, 6)] == [1, 2, 3, 4, 5]
    assert again.hard_state(G1) == HardState(2, "rabbit@a")
    again.delete_group(G2)
    again.flush()
    assert reopen(tmp_path).groups() == [G1]


def test_delete_group_in_a_version_1_wal_is_corruption(tmp_path):
    """Record type 8 does not exist in version 1: refused with the file and offset."""
    store = LogStore(str(tmp_path), config())
    append_singly(store, G1, make_entries(G1, 1, 3))
    store.delete_group(G1)
    store.close()
    (path,) = wal_files(tmp_path)
    offset = [o for o, r in scan_wal(path, 1, True).records if isinstance(r, DeleteGroupRecord)]
    assert [type(r) for _o, r in scan_wal(path, 1, True).records][-1] is DeleteGroupRecord
    _as_version_1(path)
    with pytest.raises(CorruptLogError) as error:
        reopen(tmp_path)
    assert error.value.path == path and error.value.offset == offset[0]
    assert "DELETE_GROUP" in str(error.value) and "version 1" in str(error.value)

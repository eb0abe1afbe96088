"""Recovery after kill -9 at any instant, and refusal of real corruption
(broker/raft/storage/recovery.py, FORMAT.md "Durability and deletion rules").

Crashes are simulated with crash images: copies of the data directory taken while the
store is open (every write goes straight to the kernel), or WAL files cut at a byte.
"""

from __future__ import annotations

import os
import shutil

import pytest

from quorumqueue.broker.raft.storage import CorruptLogError, LogStore
from quorumqueue.broker.raft.storage import wal
from quorumqueue.broker.raft.storage.wal import FILE_HEADER_SIZE, scan_wal
from quorumqueue.broker.raft.types import MEMBERSHIP, HardState, LogEntry, SnapshotMeta

from .support import (G1, G2, G3, append_singly, config, crash_image, log_of, make_entries,
                      reopen, wal_files)


def _state(store: LogStore) -> dict:
    return {g: (log_of(store, g), (store.hard_state(g), store.members(g))) for g in (G1, G2, G3)}


def _build_flushes(data_dir):
    """Several flushes of mixed work in one WAL file. Returns (path, [(end offset,
    state after that flush)])."""
    store = LogStore(str(data_dir), config())
    history = [(0, _state(store))]                      # empty: whatever the cut
    script = [
        lambda: store.append(G1, make_entries(G1, 1, 4, size=6)),
        lambda: (store.append(G2, make_entries(G2, 1, 3, size=5)),
                 store.set_hard_state(G2, HardState(1, "b"))),
        lambda: (store.append(G1, make_entries(G1, 4, 6, size=6)),
                 store.append(G3, make_entries(G3, 1, 2, size=0)),
                 store.set_initial_members(G3, ("rabbit@a", "rabbit@b"))),
        lambda: (store.truncate_from(G1, 3), store.append(G1, make_entries(G1, 3, 5, 2, size=6)),
                 store.set_hard_state(G1, HardState(2, None))),
        lambda: store.append(G2, make_entries(G2, 3, 6, size=5)),
        lambda: (store.truncate_from(G2, 2),),
    ]
    for step in script:
        step()
        store.flush()
        history.append((store.wal_size(), _state(store)))
    store.close()
    return wal_files(data_dir)[0], history


def test_kill_at_every_byte_of_the_wal_loses_nothing_flushed(tmp_path):
    """Cut the WAL at every byte: everything flushed before the cut is back (unless
    the next flush, partly written, truncated it), the torn tail is cut off at a
    record boundary, and the store can go on appending."""
    wal_path, history = _build_flushes(tmp_path / "source")
    data = open(wal_path, "rb").read()
    assert history[-1][0] == len(data)
    boundaries = {offset for offset, _record in scan_wal(wal_path, 1, True).records}
    image = tmp_path / "image"
    os.makedirs(image / "quorum" / "wal")
    for cut in range(len(data) + 1):
        with open(image / "quorum" / "wal" / "00000001.wal", "wb") as handle:
            handle.write(data[:cut])
        store = reopen(image)
        got = _state(store)
        done = max(n for n, (end, _s) in enumerate(history) if end <= cut)
        durable = history[done][1]
        if history[done][0] == cut:
            assert got == durable, cut
        else:
            following = history[done + 1][1]
            for group, (log, hard_state) in got.items():
                before, after = durable[group][0], following[group][0]
                assert hard_state in (durable[group][1], following[group][1])
                assert all(entry in before or entry in after for entry in log), (cut, group)
                kept = [e for e in before if e in after]          # not truncated by f+1
                assert all(entry in log for entry in kept), (cut, group, log)
                assert [e[0] for e in log] == list(range(1, len(log) + 1))
        size = os.path.getsize(image / "quorum" / "wal" / "00000001.wal")
        assert size == FILE_HEADER_SIZE and cut < FILE_HEADER_SIZE or size <= cut
        assert size in boundaries or size == len(data) or size == FILE_HEADER_SIZE
        if cut % 5 == 0:
            last = store.last_index(G3)
            store.append(G3, make_entries(G3, last + 1, last + 2, size=3))
            store.flush()
            store.close()
            assert reopen(image).last_index(G3) == last + 1
        else:
            store.close()


def _rollover_images(tmp_path, fail_at=None):
    """Run work that rolls the WAL over, taking a crash image at every failpoint."""
    images = []

    def failpoint(name):
        images.append((name, crash_image(tmp_path / "live", tmp_path / f"img{len(images)}")))

    store = LogStore(str(tmp_path / "live"), config(segment_max_entries=4), failpoint=failpoint)
    for group in (G1, G2, G3):
        store.append(group, make_entries(group, 1, 11))
    store.set_hard_state(G2, HardState(5, "c"))
    store.flush()
    store.roll_over()                                     # all to segments
    store.append(G1, make_entries(G1, 11, 14))
    store.truncate_from(G2, 7)                            # reaches into segments
    store.append(G2, make_entries(G2, 7, 9, term=2))
    store.append(G3, make_entries(G3, 11, 23))
    store.flush()
    expected = _state(store)
    store.roll_over()
    assert _state(store) == expected
    return images, expected


def test_kill_at_every_step_of_a_rollover(tmp_path):
    """A crash anywhere in a rollover (new WAL, each group's segments, WAL deletion)
    recovers the same log: segment writes are replayed idempotently from the WAL."""
    images, expected = _rollover_images(tmp_path)
    names = [name for name, _ in images]
    assert names.count("rollover.group") == 6 and "rollover.wal_deleted" in names
    for name, image in images[len(images) // 2:]:         # the second rollover
        assert _state(reopen(image)) == expected, name
        assert _state(reopen(image)) == expected, name    # recovery is repeatable


def test_torn_segment_tail_during_an_interrupted_rollover(tmp_path):
    """Cut the segment being written by an interrupted rollover at every byte: the
    WAL still holds those entries, so nothing is lost and the torn part is removed."""
    images, expected = _rollover_images(tmp_path)
    second = images[len(images) // 2:]
    name, image = [(n, i) for n, i in second if n == "rollover.group"][-1]   # G3 written
    directory = os.path.join(image, "quorum", "segments", "_2fa_2fb_2f.._2fc")
    names = sorted(os.listdir(directory))     # [1-4] [5-8] [9-12] [13-16] [17-20] [21-22]
    assert len(names) == 6

    def damaged(label, relative, damage, later=()):
        copy = tmp_path / label
        shutil.copytree(image, copy)
        with open(os.path.join(copy, relative), "r+b") as handle:
            damage(handle)
        for name in later:                    # not created yet at that instant
            os.remove(os.path.join(copy, os.path.dirname(relative), name))
        assert _state(reopen(copy)) == expected, label
        assert _state(reopen(copy)) == expected, label
        shutil.rmtree(copy)

    # the newest file was created by this rollover: any prefix of it may be on disk
    newest = os.path.relpath(os.path.join(directory, names[-1]), image)
    for cut in range(0, os.path.getsize(os.path.join(image, newest)) + 1, 3):
        damaged(f"cut{cut}", newest, lambda handle: handle.truncate(cut))
    # an appended file (and the files after it not created yet): its old entries are
    # intact, the new slots half written
    appended = os.path.relpath(os.path.join(directory, names[2]), image)
    slot2 = 14 + len(G3.encode()) + 4 + 2 * 40
    for keep in range(0, 80, 3):
        damaged(f"slot{keep}", appended,
                lambda handle: (handle.seek(slot2 + keep), handle.write(bytes(80 - keep))),
                later=names[3:])


def test_torn_tail_in_an_older_wal_is_corruption(tmp_path):
    """Only the newest WAL file may end in a torn record."""
    images, _expected = _rollover_images(tmp_path)
    name, image = [(n, i) for n, i in images if n == "rollover.new_wal"][-1]
    older = wal_files(image)[0]
    size = os.path.getsize(older)
    with open(older, "r+b") as handle:
        handle.truncate(size - 3)
    with pytest.raises(CorruptLogError) as error:
        reopen(image)
    assert older in str(error.value) and "not the newest" in str(error.value)


@pytest.mark.parametrize("run", [1, 4])
@pytest.mark.parametrize("where, damage, message", [
    ("payload", lambda b, o: b[o + 13 + 4], "payload checksum mismatch"),
    ("header", lambda b, o: b[o + 1], "record header checksum mismatch"),
])
def test_corrupt_record_in_the_middle_is_refused(tmp_path, where, damage, message, run):
    """A complete record failing its checksum, anywhere, stops recovery with the file
    and the record's byte offset: an ENTRY record (appends of one entry) or an ENTRIES
    record (appends of `run` entries, scanned as an entry each, the first at the
    record's offset)."""
    store = LogStore(str(tmp_path), config())
    entries = make_entries(G1, 1, 21)
    for start in range(0, 20, run):
        store.append(G1, entries[start:start + run])
    store.flush()
    store.close()
    path = wal_files(tmp_path)[0]
    records = scan_wal(path, 1, True).records
    offset = records[1 + 10 // run * run][0]      # after the GROUP record, a run's first
    data = bytearray(open(path, "rb").read())
    data[offset + (13 + 4 if where == "payload" else 1)] ^= 0x40
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptLogError) as error:
        reopen(tmp_path)
    assert error.value.path == path and error.value.offset == offset
    assert message in str(error.value) and f"byte offset {offset}" in str(error.value)


def test_bad_magic_and_unknown_version_are_refused(tmp_path):
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 3))
    store.close()
    path = wal_files(tmp_path)[0]
    data = open(path, "rb").read()
    open(path, "wb").write(b"XXXX" + data[4:])
    with pytest.raises(CorruptLogError, match="bad magic"):
        reopen(tmp_path)
    open(path, "wb").write(data[:4] + b"\x00\x09" + data[6:])
    with pytest.raises(CorruptLogError, match="unknown WAL format version 9"):
        reopen(tmp_path)


def test_zero_filled_tail_is_a_torn_write(tmp_path):
    """A crash that extended the file with zeros (no data yet) is a torn tail."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 5))
    store.flush()
    store.close()
    path = wal_files(tmp_path)[0]
    size = os.path.getsize(path)
    with open(path, "ab") as handle:
        handle.write(bytes(100))
    assert reopen(tmp_path).last_index(G1) == 4
    assert os.path.getsize(path) == size


def test_corrupt_segment_is_refused_with_file_and_offset(tmp_path):
    """An index slot of a segment failing its checksum outside an interrupted rollover
    is corruption; so is entry data failing its checksum when read."""
    store = LogStore(str(tmp_path), config(segment_max_entries=4))
    store.append(G1, make_entries(G1, 1, 13))
    store.roll_over()
    store.close()
    first, second = sorted(os.listdir(tmp_path / "quorum" / "segments" / "_252F_2forders"))[:2]
    path = str(tmp_path / "quorum" / "segments" / "_252F_2forders" / second)
    data = bytearray(open(path, "rb").read())
    header = 14 + len(G1) + 4
    data[header + 40 + 10] ^= 1                           # slot 1: term
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptLogError) as error:
        reopen(tmp_path, config(segment_max_entries=4))
    assert error.value.path == path and error.value.offset == header + 40
    data[header + 40 + 10] ^= 1
    data[-1] ^= 1                                         # the last entry's data
    open(path, "wb").write(bytes(data))
    store = reopen(tmp_path, config(segment_max_entries=4))
    with pytest.raises(CorruptLogError, match="data of entry 8 fails its checksum"):
        store.entries(G1, 1, 13)


def test_missing_segment_is_a_gap(tmp_path):
    """The log above the snapshot must be contiguous: a lost segment stops recovery."""
    store = LogStore(str(tmp_path), config(segment_max_entries=4))
    store.append(G1, make_entries(G1, 1, 13))
    store.roll_over()
    store.close()
    os.remove(store.segment_paths(G1)[1])
    with pytest.raises(CorruptLogError, match="entries 5 to 8 are missing"):
        reopen(tmp_path, config(segment_max_entries=4))


def test_leftover_tmp_files_are_removed(tmp_path):
    """A crash between writing a .tmp and renaming it leaves the old file in force."""
    images = []

    def failpoint(name):
        if name in ("snapshot.before_rename", "compact.before_rewrite"):
            images.append(crash_image(tmp_path / "live", tmp_path / f"img{len(images)}"))

    store = LogStore(str(tmp_path / "live"), config(segment_max_entries=4), failpoint=failpoint)
    store.append(G1, make_entries(G1, 1, 13))
    store.roll_over()
    store.write_snapshot(G1, SnapshotMeta(5, 1, ()), b"one")
    store.write_snapshot(G1, SnapshotMeta(8, 1, ()), b"two")
    store.compact(G1, {2})
    for position, image in enumerate(images):
        again = reopen(image, config(segment_max_entries=4))
        expected_meta = [None, SnapshotMeta(5, 1, ()), SnapshotMeta(8, 1, ())][position]
        assert again.snapshot_meta(G1) == expected_meta
        assert [e.index for e in again.entries(G1, 1, 13)] == list(range(1, 13))
        for root, _dirs, names in os.walk(image):
            assert not [n for n in names if n.endswith(".tmp")]


def test_interrupted_snapshot_install_keeps_the_old_log(tmp_path):
    """RESET is durable before the snapshot file: if the snapshot never landed, the
    RESET is ignored, the old log stays, and the stale RESET is neutralised (rolled
    away) so a later snapshot above it cannot make it discard the log."""
    images = []

    def failpoint(name):
        if name == "install.reset_durable":
            images.append(crash_image(tmp_path / "live", tmp_path / "img"))

    store = LogStore(str(tmp_path / "live"), config(), failpoint=failpoint)
    store.append(G1, make_entries(G1, 1, 11))
    store.flush()
    store.install_snapshot(G1, SnapshotMeta(100, 5, ()), b"leader")
    again = reopen(images[0])
    assert log_of(again, G1) == log_of(_fresh_log(tmp_path), G1)
    assert again.snapshot_meta(G1) is None
    again.append(G1, make_entries(G1, 11, 120))
    again.write_snapshot(G1, SnapshotMeta(110, 1, ()), b"local")
    again.flush()
    assert [e.index for e in reopen(images[0]).entries(G1, 1, 120)] == list(range(1, 120))


def _fresh_log(tmp_path):
    store = LogStore(str(tmp_path / "fresh"), config())
    store.append(G1, make_entries(G1, 1, 11))
    return store


def test_a_new_wal_torn_while_being_created_is_started_afresh(tmp_path):
    """A crash right after a rollover created its WAL file: a partial header, or a
    file of zeros, is an empty newest WAL (and the older one replays)."""
    images, expected = _rollover_images(tmp_path)
    name, image = [(n, i) for n, i in images if n == "rollover.new_wal"][-1]
    newest = wal_files(image)[-1]
    header = open(newest, "rb").read()[:FILE_HEADER_SIZE]
    for label, content in (("partial", header[:7]), ("zeros", bytes(64)), ("empty", b"")):
        copy = tmp_path / label
        shutil.copytree(image, copy)
        with open(os.path.join(copy, os.path.relpath(newest, image)), "wb") as handle:
            handle.write(content)
        assert _state(reopen(copy)) == expected, label
        assert _state(reopen(copy)) == expected, label


def _file_bytes(root) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(folder, name), root):
            open(os.path.join(folder, name), "rb").read()
            for folder, _dirs, names in os.walk(root) for name in names}


def test_read_only_recovery_changes_nothing_and_sees_what_recovery_sees(tmp_path):
    """The analytics jobs read a node's log with recover(readonly=True): at every
    instant of a rollover it leaves every byte as it was (no truncated WAL tail, no
    rewritten or removed segment) and finds the log a real recovery finds."""
    from quorumqueue.broker.raft.storage.recovery import recover

    images, _expected = _rollover_images(tmp_path)
    for name, image in images:
        before = _file_bytes(image)
        found = recover(os.path.join(image, "quorum"), False,
                        lambda ref, index: None, readonly=True)   # no snapshots here
        assert found.wal is None
        assert _file_bytes(image) == before, name
        recovered = reopen(image)
        lasts = {uid: state.last_index() for uid, state in found.groups.items()}
        assert lasts == {uid: recovered.last_index(uid) for uid in recovered.groups()}, name


def _record_types(path: str) -> list[int]:
    """The record type of every record of a WAL file, from the record headers."""
    data, offset, types = open(path, "rb").read(), FILE_HEADER_SIZE, []
    while offset < len(data):
        length, record_type, _crc = wal.RECORD_HEADER.unpack_from(data, offset)
        types.append(record_type)
        offset += wal.RECORD_HEADER_SIZE + length
    return types


def _as_version(path: str, version: int) -> None:
    with open(path, "r+b") as handle:
        head = bytearray(handle.read(12))
        head[4:6] = version.to_bytes(2, "big")
        handle.seek(0)
        handle.write(bytes(head) + wal._crc32(bytes(head)).to_bytes(4, "big"))


def test_entries_records_and_entry_records_recover_the_same_entries(tmp_path):
    """The same log written as one ENTRY record per entry (appends of one, and as a
    version-2 file, as the build before ENTRIES wrote it) and as ENTRIES records
    (appends of runs whose term and kind change inside, with big entries among them:
    ENTRY records for those) recovers entry for entry the same, after a restart and
    after a rollover into segments."""
    big = wal.OWN_BUFFER_BYTES
    entries = (make_entries(G1, 1, 30, term=1, size=50)
               + [LogEntry(30, 1, MEMBERSHIP, b"n1,n2,n3")]
               + make_entries(G1, 31, 34, term=1, size=big + 5)
               + make_entries(G1, 34, 40, term=2, size=7)
               + make_entries(G1, 40, 41, term=2, size=big)
               + make_entries(G1, 41, 2200, term=3, size=3))
    expected = [(e.index, e.term, e.kind, e.data) for e in entries]
    singly, runs = tmp_path / "singly", tmp_path / "runs"
    store = LogStore(str(singly), config())
    append_singly(store, G1, entries)
    store.flush()
    store.close()
    store = LogStore(str(runs), config())
    for start, end in ((0, 1), (1, 35), (35, 45), (45, 2199)):
        store.append(G1, entries[start:end])
    store.flush()
    store.close()
    (old,) = wal_files(singly)
    (new,) = wal_files(runs)
    assert set(_record_types(old)) == {wal.GROUP, wal.ENTRY}
    assert wal.ENTRIES in _record_types(new) and wal.ENTRY in _record_types(new)
    assert len(_record_types(new)) < len(entries) // 100
    _as_version(old, 2)              # ENTRY records only: what version 2 wrote
    for directory in (singly, runs):
        again = reopen(directory)
        assert log_of(again, G1) == expected
        again.roll_over()
        again.close()
        assert log_of(reopen(directory), G1) == expected

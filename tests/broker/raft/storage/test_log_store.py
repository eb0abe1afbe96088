"""LogStore behaviour: writes, group commit, rollover, segments, snapshots, release,
compaction and the GroupLog view (broker/raft/storage/log_store.py, FORMAT.md).

Each test names the invariant from the module headers it checks.
"""

from __future__ import annotations

import os

import pytest

from quorumqueue.broker.raft.log import RaftLog
from quorumqueue.broker.raft.storage import LogStore
from quorumqueue.broker.raft.types import HardState, LogEntry, SnapshotMeta

from .support import G1, G2, G3, config, log_of, make_entries, reopen


def test_round_trip_across_groups(tmp_path):
    """Entries, hard state and initial members of several groups survive close/open."""
    store = LogStore(str(tmp_path), config())
    for lo in range(1, 31, 10):                       # interleave the groups
        for group in (G1, G2, G3):
            store.append(group, make_entries(group, lo, lo + 10, term=lo // 10 + 1))
    store.set_hard_state(G1, HardState(3, "rabbit@a"))
    store.set_hard_state(G2, HardState(2, None))
    store.set_initial_members(G1, ("rabbit@a", "rabbit@b", "rabbit@c"))
    assert store.flush() == {G1: 30, G2: 30, G3: 30}
    store.close()

    again = reopen(tmp_path)
    assert again.groups() == sorted([G1, G2, G3])
    for group in (G1, G2, G3):
        assert log_of(again, group) == [(e.index, e.term, e.kind, e.data)
                                        for lo in range(1, 31, 10)
                                        for e in make_entries(group, lo, lo + 10, lo // 10 + 1)]
        assert again.first_index(group) == 1 and again.last_index(group) == 30
    assert again.hard_state(G1) == HardState(3, "rabbit@a")
    assert again.hard_state(G2) == HardState(2, None)
    assert again.hard_state(G3) == HardState()
    assert again.members(G1) == ("rabbit@a", "rabbit@b", "rabbit@c")
    assert again.term_at(G1, 0) == 0 and again.term_at(G1, 31) is None


def test_reads_see_pending_writes_and_flush_reports_touched_groups(tmp_path):
    """append/truncate are visible at once; flush() reports each touched group's last
    index, and only those."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 6))
    assert store.last_index(G1) == 5 and store.entries(G1, 2, 4)[0].index == 2
    assert store.flush() == {G1: 5}
    assert store.flush() == {}
    store.append(G2, make_entries(G2, 1, 3))
    store.truncate_from(G1, 4)
    assert store.flush() == {G1: 3, G2: 2}


def test_append_is_checked(tmp_path):
    """Indexes continue the log; terms never decrease; data is bytes."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 3, term=2))
    with pytest.raises(ValueError, match="expected 3"):
        store.append(G1, make_entries(G1, 4, 5))
    with pytest.raises(ValueError, match="term 1 after term 2"):
        store.append(G1, make_entries(G1, 3, 4, term=1))
    with pytest.raises(ValueError, match="bytes"):
        store.append(G1, [LogEntry(3, 2, 0, "text")])
    with pytest.raises(ValueError):
        store.entries(G1, 1, 5)                     # beyond last_index + 1
    assert store.last_index(G1) == 2


def test_group_commit_is_one_fdatasync_for_many_groups(tmp_path, monkeypatch):
    """flush(): every pending record, in writes of at most raft.wal_max_batch_size
    records, then exactly one fdatasync (group commit)."""
    store = LogStore(str(tmp_path), config(fsync=True, wal_max_batch_size=6))
    groups = [f"%2F/q{n}" for n in range(10)]
    for group in groups:
        store.append(group, make_entries(group, 1, 101, size=1024))
    syncs, writes = [], []
    real_sync, real_write = os.fdatasync, os.writev
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real_sync(fd))[1])
    monkeypatch.setattr(os, "writev", lambda fd, data: (writes.append(len(data)),
                                                        real_write(fd, data))[1])
    assert store.flush() == {group: 100 for group in groups}
    assert len(syncs) == 1
    # 10 GROUP records and each group's 100 entries as one ENTRIES record
    assert len(writes) == -(-(10 + 10) // 6)


def test_flush_in_three_steps_lets_pure_writes_go_on_while_a_batch_is_written(tmp_path):
    """seal(), WalBatch.write() (the server runs it on its writer thread), synced():
    what was sealed is what synced() reports durable; appends and deletes made in
    between wait for the next batch (a group's files go only once its own
    DELETE_GROUP record is durable); nothing else may write the WAL meanwhile."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 4))
    store.append(G2, make_entries(G2, 1, 3))
    store.flush()
    store.append(G1, make_entries(G1, 4, 6))
    batch = store.seal()
    store.append(G1, make_entries(G1, 6, 8))            # while batch is written
    store.delete_group(G2)
    assert store.last_index(G1) == 7 and store.pending_records > 0
    with pytest.raises(RuntimeError, match="sealed batch not yet synced"):
        store.flush()
    batch.write()
    assert batch.deleted == {}                           # G2's record is not in it
    assert store.synced(batch) == {G1: 5}
    assert store.flush() == {G1: 7}                      # the rest, G2's delete too
    store.close()

    again = reopen(tmp_path)
    assert again.last_index(G1) == 7 and again.groups() == [G1]
    again.close()


def test_rollover_moves_memory_tables_to_segments_and_releases_them(tmp_path):
    """When the WAL passes raft.wal_max_size_bytes: new WAL, entries to segments,
    old WAL deleted, memory released; reads are unchanged."""
    store = LogStore(str(tmp_path), config(wal_max_size_bytes=20_000))
    expected = {}
    rollovers = 0
    for _round in range(10):
        for group in (G1, G2):
            lo = store.last_index(group) + 1
            store.append(group, make_entries(group, lo, lo + 20, size=100))
        wal_before = store.wal_paths()
        assert store.memtable_bytes(G1) > 0
        store.flush()
        if store.wal_paths() != wal_before:              # this flush rolled over
            rollovers += 1
            assert not any(os.path.exists(p) for p in wal_before)
            assert store.total_memtable_bytes() == 0
        assert len(store.wal_paths()) == 1
    assert rollovers >= 2
    for group in (G1, G2):
        expected[group] = log_of(store, group)
        assert len(expected[group]) == 200
    assert store.segment_paths(G1) and store.segment_paths(G2)
    store.roll_over()
    assert store.total_memtable_bytes() == 0 and store.memtable_bytes(G1) == 0
    assert {g: log_of(store, g) for g in (G1, G2)} == expected
    store.close()
    again = reopen(tmp_path)
    assert {g: log_of(again, g) for g in (G1, G2)} == expected


def test_memtable_bytes_are_measured_per_group(tmp_path):
    """memtable_bytes: data plus a fixed per-entry overhead; the total is the sum."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 11, size=1000))
    store.append(G2, make_entries(G2, 1, 3, size=10))
    assert 10 * 1000 < store.memtable_bytes(G1) < 10 * 1000 + 10 * 400
    assert store.total_memtable_bytes() == store.memtable_bytes(G1) + store.memtable_bytes(G2)
    store.truncate_from(G1, 6)
    assert 5 * 1000 < store.memtable_bytes(G1) < 5 * 1000 + 5 * 400


def test_segment_max_entries_closes_segments(tmp_path):
    """A segment holds at most raft.segment_max_entries entries; the newest one is
    appended to by later rollovers until full."""
    store = LogStore(str(tmp_path), config(segment_max_entries=5))
    store.append(G1, make_entries(G1, 1, 24))
    store.roll_over()
    assert [_count(p) for p in store.segment_paths(G1)] == [5, 5, 5, 5, 3]
    store.append(G1, make_entries(G1, 24, 28))
    store.roll_over()
    assert [_count(p) for p in store.segment_paths(G1)] == [5, 5, 5, 5, 5, 2]
    assert log_of(store, G1) == log_of(reopen(tmp_path, config(segment_max_entries=5)), G1)


def test_segment_max_size_bytes_closes_segments(tmp_path):
    """A segment closes once its data reaches raft.segment_max_size_bytes (it may go
    over by the entry that crossed the limit)."""
    store = LogStore(str(tmp_path), config(segment_max_entries=100,
                                           segment_max_size_bytes=250))
    store.append(G1, make_entries(G1, 1, 8, size=100))
    store.roll_over()
    assert [_count(p) for p in store.segment_paths(G1)] == [3, 3, 1]


def test_truncate_from_in_memory_and_in_segments(tmp_path):
    """A conflicting suffix is discarded wherever it lives; the segment files are
    rewritten at the next rollover; restarts in between see the same log."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 21))
    store.roll_over()                                  # 1..20 in segments
    store.append(G1, make_entries(G1, 21, 26))         # 21..25 in memory
    store.truncate_from(G1, 23)                        # memory only
    store.truncate_from(G1, 12)                        # into the segments
    store.append(G1, make_entries(G1, 12, 16, term=2))
    expected = ([(e.index, e.term, e.kind, e.data) for e in make_entries(G1, 1, 12)]
                + [(e.index, e.term, e.kind, e.data) for e in make_entries(G1, 12, 16, 2)])
    assert log_of(store, G1) == expected
    assert store.term_at(G1, 16) is None and store.term_at(G1, 12) == 2
    store.flush()
    assert log_of(reopen(tmp_path), G1) == expected    # before the files were cut
    store.roll_over()
    assert log_of(store, G1) == expected
    assert log_of(reopen(tmp_path), G1) == expected
    assert max(_indexes(p)[-1] for p in store.segment_paths(G1)) == 15


def test_truncate_is_refused_at_or_below_the_snapshot(tmp_path):
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 11))
    store.write_snapshot(G1, SnapshotMeta(6, 1, ("a",)), b"state")
    with pytest.raises(ValueError, match="cannot truncate from 6"):
        store.truncate_from(G1, 6)
    store.truncate_from(G1, 7)
    assert store.last_index(G1) == 6


def test_snapshot_write_read_and_raft_view(tmp_path):
    """A snapshot is read back whole; first_index() moves past it; term_at answers at
    its index; it survives a restart."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 11, term=4))
    store.flush()
    meta = SnapshotMeta(7, 4, ("rabbit@a", "rabbit@b"))
    store.write_snapshot(G1, meta, b"\x00machine state\xff" * 100)
    assert store.read_snapshot(G1) == (meta, b"\x00machine state\xff" * 100)
    assert store.first_index(G1) == 8 and store.last_index(G1) == 10
    assert store.term_at(G1, 7) == 4
    again = reopen(tmp_path)
    assert again.snapshot_meta(G1) == meta
    assert again.read_snapshot(G1) == (meta, b"\x00machine state\xff" * 100)
    assert log_of(again, G1) == log_of(store, G1)
    assert again.read_snapshot(G2) is None
    with pytest.raises(ValueError, match="behind the current one at 7"):
        again.write_snapshot(G1, SnapshotMeta(5, 4, ()), b"")


def test_release_deletes_exactly_the_segments_wholly_below_the_cursor(tmp_path):
    """release(cursor): segment files whose last index < cursor go, nothing else."""
    store = LogStore(str(tmp_path), config(segment_max_entries=8))
    store.append(G1, make_entries(G1, 1, 33))
    store.roll_over()                                   # [1-8] [9-16] [17-24] [25-32]
    store.append(G1, make_entries(G1, 33, 36))          # memory: 33..35
    paths = store.segment_paths(G1)
    store.write_snapshot(G1, SnapshotMeta(34, 1, ()), b"s")
    with pytest.raises(ValueError):
        store.release(G1, 36)                           # above snapshot index + 1
    assert store.release(G1, 17) == paths[:2]
    assert store.release(G1, 24) == []                  # 17..24 still has 24 live
    assert store.release(G1, 20) == []                  # never moves back
    assert store.segment_paths(G1) == paths[2:]
    assert [e.index for e in store.entries(G1, 1, 36)] == list(range(17, 36))
    assert store.release(G1, 34) == paths[2:]
    assert [e.index for e in store.entries(G1, 1, 36)] == [34, 35]
    store.flush()
    again = reopen(tmp_path)
    assert [e.index for e in again.entries(G1, 1, 36)] == [34, 35]
    assert again.release_cursor(G1) == 34 and again.first_index(G1) == 35


def test_compaction_keeps_only_live_entries_of_mostly_dead_segments(tmp_path):
    """compact(live): below the snapshot, a segment with no live entry is deleted, one
    under half live is rewritten with only its live entries (COMPACTED), one at least
    half live is kept; reads return only what is stored; term_at(snapshot) works."""
    store = LogStore(str(tmp_path), config(segment_max_entries=8))
    store.append(G1, make_entries(G1, 1, 41, size=64))
    store.roll_over()                                   # 5 segments of 8
    paths = store.segment_paths(G1)
    store.write_snapshot(G1, SnapshotMeta(32, 1, ()), b"s")
    live = {3, 9, 10, 11, 12, 13, 26, 32, 35}
    result = store.compact(G1, live)
    assert result.deleted == (paths[2],)                # 17..24: nothing live
    assert result.rewritten == (paths[0], paths[3])     # 1/8 and 2/8 live
    assert result.kept == (paths[1],)                   # 5/8 live
    assert _indexes(paths[0]) == [3] and _indexes(paths[3]) == [26, 32]
    stored = [e.index for e in store.entries(G1, 1, 41)]
    assert stored == [3, 9, 10, 11, 12, 13, 14, 15, 16, 26, 32, *range(33, 41)]
    assert store.entry(G1, 5) is None and store.entry(G1, 26).data == make_entries(G1, 26, 27, size=64)[0].data
    assert store.term_at(G1, 5) is None and store.term_at(G1, 32) == 1
    assert store.first_index(G1) == 33
    again = reopen(tmp_path)
    assert [e.index for e in again.entries(G1, 1, 41)] == stored
    store.write_snapshot(G1, SnapshotMeta(40, 1, ()), b"s")
    assert store.compact(G1, [3]).deleted == (paths[1], paths[3], paths[4])


def test_install_snapshot_replaces_the_whole_log(tmp_path):
    """A leader's snapshot that the log does not hold replaces the log: reads show
    only the snapshot, appends continue after it, across restarts and rollovers."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 21))
    store.roll_over()
    store.append(G1, make_entries(G1, 21, 26))
    store.flush()
    store.write_snapshot(G1, SnapshotMeta(50, 3, ("b",)), b"leader state")   # term differs
    assert store.first_index(G1) == 51 and store.last_index(G1) == 50
    assert store.segment_paths(G1) == [] and store.term_at(G1, 50) == 3
    assert store.entries(G1, 1, 51) == []
    again = reopen(tmp_path)
    assert again.last_index(G1) == 50 and again.entries(G1, 1, 51) == []
    again.append(G1, make_entries(G1, 51, 55, term=3))
    again.flush()
    assert log_of(reopen(tmp_path), G1) == log_of(again, G1)
    again.roll_over()
    assert [e.index for e in reopen(tmp_path).entries(G1, 1, 55)] == [51, 52, 53, 54]


def test_group_log_serves_the_raft_core(tmp_path):
    """GroupLog implements broker.raft.log.LogReader: a RaftLog reads through it."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 10, term=2))
    store.set_hard_state(G1, HardState(2, "b"))
    store.set_initial_members(G1, ("a", "b", "c"))
    store.write_snapshot(G1, SnapshotMeta(4, 2, ("a", "b", "c")), b"")
    view = store.group_log(G1)
    assert (view.first_index(), view.last_index(), view.term_at(4), view.term_at(9)) == (5, 9, 2, 2)
    assert [e.index for e in view.entries(5, 10)] == [5, 6, 7, 8, 9]
    assert view.snapshot_meta().index == 4 and view.hard_state() == HardState(2, "b")
    assert view.members() == ("a", "b", "c")
    raft_log = RaftLog(view)
    assert raft_log.last_index() == 9 and raft_log.term_at(6) == 2
    assert [e.index for e in raft_log.entries(5, 8)] == [5, 6, 7]


def test_segment_reader_cache_is_bounded(tmp_path):
    store = LogStore(str(tmp_path), config(segment_max_entries=4, segment_reader_cache=2))
    store.append(G1, make_entries(G1, 1, 41))
    store.roll_over()
    assert len(store.entries(G1, 1, 41)) == 40
    assert len(store._readers) <= 2


# --- helpers: read segment files the way FORMAT.md describes ------------------------

def _slots(path):
    import struct
    with open(path, "rb") as handle:
        data = handle.read()
    _magic, _version, _flags, slot_count, uid_length = struct.unpack_from(">4sHHIH", data)
    base = 14 + uid_length + 4
    out = []
    for n in range(slot_count):
        index = struct.unpack_from(">Q", data, base + 40 * n)[0]
        if index == 0:
            break
        out.append(index)
    return out


def _count(path) -> int:
    return len(_slots(path))


def _indexes(path) -> list[int]:
    return _slots(path)


def test_an_io_error_breaks_the_store_until_reopened(tmp_path, monkeypatch):
    """After a failed write or fsync nothing more is accepted (the page cache may have
    dropped what failed); reopening recovers what is really on disk."""
    store = LogStore(str(tmp_path), config(fsync=True))
    store.append(G1, make_entries(G1, 1, 4))
    store.flush()
    store.append(G1, make_entries(G1, 4, 6))

    def failing(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(OSError):
        store.flush()
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="Input/output error"):
        store.append(G1, make_entries(G1, 6, 7))
    store.close()
    assert reopen(tmp_path).last_index(G1) >= 3


def test_entries_stranded_below_a_snapshot_do_not_join_later_segments(tmp_path):
    """A snapshot whose entries were not all durable (applied before the local flush)
    leaves durable entries below it; new entries after the snapshot start a segment of
    their own (a segment that is not compacted has consecutive indexes)."""
    store = LogStore(str(tmp_path), config(segment_max_entries=64))
    store.append(G1, make_entries(G1, 1, 6))
    store.flush()
    store.append(G1, make_entries(G1, 6, 11))          # never flushed
    store.write_snapshot(G1, SnapshotMeta(10, 1, ()), b"s")
    again = reopen(tmp_path, config(segment_max_entries=64))   # crash
    assert again.last_index(G1) == 10 and again.first_index(G1) == 11
    assert [e.index for e in again.entries(G1, 1, 11)] == [1, 2, 3, 4, 5]
    again.append(G1, make_entries(G1, 11, 14))
    again.roll_over()
    assert len(again.segment_paths(G1)) == 2
    final = reopen(tmp_path, config(segment_max_entries=64))
    assert [e.index for e in final.entries(G1, 1, 14)] == [1, 2, 3, 4, 5, 11, 12, 13]


def test_buffered_writes_do_no_io(tmp_path, monkeypatch):
    """append, set_hard_state, set_initial_members and truncate_from are pure: they
    touch no file, even when the log's tail lives in segments."""
    store = LogStore(str(tmp_path), config(segment_max_entries=4))
    store.append(G1, make_entries(G1, 1, 10))
    store.roll_over()
    store._readers.close()

    def no_io(*args, **kwargs):
        raise AssertionError("I/O on a buffered write")

    for name in ("open", "read", "pread", "write", "pwrite", "fdatasync", "fsync"):
        monkeypatch.setattr(os, name, no_io)
    store.append(G1, make_entries(G1, 10, 12, term=2))
    store.append(G2, make_entries(G2, 1, 3))
    store.set_hard_state(G1, HardState(2, "a"))
    store.set_initial_members(G2, ("a",))
    store.truncate_from(G1, 7)
    store.append(G1, make_entries(G1, 7, 8, term=3))
    monkeypatch.undo()
    assert store.flush() == {G1: 7, G2: 2}


def test_roll_over_soon_rolls_over_now_or_once_the_batch_in_flight_is_synced(tmp_path):
    """roll_over_soon (rabbitmq-queues reclaim_quorum_memory): idle, the WAL rolls over
    at once (memory tables to segments, memory released); with a sealed batch being
    written it waits for synced() (a rollover may not run in between), then calls back."""
    store = LogStore(str(tmp_path), config())
    store.append(G1, make_entries(G1, 1, 11, size=100))
    store.flush()
    done = []
    assert store.memtable_bytes(G1) > 0
    store.roll_over_soon(lambda: done.append(store.memtable_bytes(G1)))
    assert done == [0] and store.segment_paths(G1)
    store.append(G1, make_entries(G1, 11, 21, size=100))
    batch = store.seal()
    store.roll_over_soon(lambda: done.append(store.memtable_bytes(G1)))
    assert done == [0]                                    # waits for the batch
    batch.write()
    assert store.synced(batch) == {G1: 20}
    assert done == [0, 0]
    assert [e[0] for e in log_of(store, G1)] == list(range(1, 21))
    store.close()

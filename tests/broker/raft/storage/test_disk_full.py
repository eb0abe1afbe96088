"""A full disk changes nothing the store relies on (broker/raft/storage/errors.py
`is_disk_full`; log_store.py): a batch, a rollover, a snapshot install or a segment
append that finds no room raises ENOSPC with the files as a recovery accepts them and
the store still usable, and the same call succeeds once space returns. On a real
small tmpfs (tests/support/small_fs.py), so short writes and ENOSPC come from the
kernel; a failing fdatasync, which tmpfs never has, is injected."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from quorumqueue.broker.raft.storage import LogStore
from quorumqueue.broker.raft.types import SnapshotMeta
from tests.support.small_fs import SmallFileSystem, small_disk

from .support import G1, G2, config, log_of, make_entries, reopen, wal_files


@pytest.fixture
def disk(tmp_path):
    with small_disk(str(tmp_path / "disk"), 2 * 1024 * 1024) as small:
        yield small


def entries_of(store, group):
    return [index for index, *_rest in log_of(store, group)]


def leave_free(disk: SmallFileSystem, pages: int) -> None:
    """Fill the disk, then give back `pages` pages of 4 KiB."""
    disk.fill()
    filler = os.path.join(disk.path, "filler")
    os.truncate(filler, os.path.getsize(filler) - pages * 4096)


def test_a_batch_the_disk_has_no_room_for_raises_and_leaves_everything_pending(disk):
    """The WAL is cut back to where the batch began; the entries stay readable and
    pending; the next flush, with room, writes them once."""
    store = LogStore(disk.path, config())
    store.append(G1, make_entries(G1, 1, 11))
    assert store.flush() == {G1: 10}
    size = os.path.getsize(wal_files(disk.path)[-1])
    store.append(G1, make_entries(G1, 11, 200, size=1000))
    disk.fill()
    with pytest.raises(OSError) as raised:
        store.flush()
    assert raised.value.errno == errno.ENOSPC
    assert os.path.getsize(wal_files(disk.path)[-1]) == size
    assert store.last_index(G1) == 199 and store.pending_records > 0
    disk.free()
    assert store.flush() == {G1: 199}
    store.close()
    assert entries_of(reopen(disk.path), G1) == list(range(1, 200))


def test_a_failed_fdatasync_writes_the_batch_again_not_only_syncs_it(disk, monkeypatch):
    """A failed fdatasync may have dropped the pages it could not write: the batch is
    rewritten whole, and recovered once."""
    store = LogStore(disk.path, config(fsync=True))
    store.append(G1, make_entries(G1, 1, 6))
    real = os.fdatasync
    failures = []

    def fdatasync(fd):
        if not failures:
            failures.append(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with pytest.raises(OSError):
        store.flush()
    assert failures and store.flush() == {G1: 5}
    store.close()
    again = reopen(disk.path)
    assert entries_of(again, G1) == [1, 2, 3, 4, 5]


def test_a_rollover_the_disk_has_no_room_for_is_postponed_and_finished_later(disk):
    """With room for the new WAL and part of the segments only: the rollover stops
    part way, the store goes on (the old WAL keeps what is not in segments), a crash
    then recovers everything, and a later rollover finishes."""
    store = LogStore(disk.path, config(wal_max_size_bytes=1 << 30))
    store.append(G1, make_entries(G1, 1, 81))
    store.append(G2, make_entries(G2, 1, 81))
    store.flush()
    leave_free(disk, 4)        # the new WAL and a few one-page segments, not all 20
    with pytest.raises(OSError) as raised:
        store.roll_over()
    assert raised.value.errno == errno.ENOSPC
    segments = os.path.join(disk.path, "quorum", "segments")
    assert len(wal_files(disk.path)) == 2       # stopped between the new WAL and the end
    assert 0 < sum(len(names) for _root, _dirs, names in os.walk(segments)) < 20
    assert entries_of(store, G1) == list(range(1, 81))
    assert entries_of(store, G2) == list(range(1, 81))
    disk.free()
    store.append(G1, make_entries(G1, 81, 91))
    assert store.flush() == {G1: 90}
    crashed = os.path.join(disk.path, "..", "crash")
    shutil.copytree(disk.path, crashed, ignore=shutil.ignore_patterns("filler"))
    recovered = reopen(crashed)
    assert entries_of(recovered, G1) == list(range(1, 91))
    assert entries_of(recovered, G2) == list(range(1, 81))
    recovered.close()
    store.roll_over()
    assert len(wal_files(disk.path)) == 1
    store.close()
    again = reopen(disk.path)
    assert entries_of(again, G1) == list(range(1, 91))
    assert entries_of(again, G2) == list(range(1, 81))


def test_a_full_wal_rolls_over_after_the_batch_that_found_room(disk):
    """flush() rolls a full WAL over; with no room for the segments the rollover is
    postponed (`rollover_postponed`), the flush's entries are durable all the same,
    and the next flush with room does the rollover."""
    store = LogStore(disk.path, config(wal_max_size_bytes=4096))
    store.append(G1, make_entries(G1, 1, 40, size=200))
    leave_free(disk, 3)        # the batch, not the segments
    assert store.flush() == {G1: 39}
    assert store.rollover_postponed
    disk.free()
    store.append(G1, make_entries(G1, 40, 41))
    assert store.flush() == {G1: 40}
    assert not store.rollover_postponed and len(wal_files(disk.path)) == 1
    store.close()
    assert entries_of(reopen(disk.path), G1) == list(range(1, 41))


def test_a_snapshot_install_with_no_room_changes_nothing(disk):
    """A follower's install of its leader's snapshot: the snapshot file comes first,
    so a full disk refuses it before the RESET record: log, snapshot and files as
    before, no tmp file left; with room the same install succeeds."""
    store = LogStore(disk.path, config())
    store.append(G1, make_entries(G1, 1, 11))
    store.flush()
    meta = SnapshotMeta(50, 3, ("a", "b", "c"))
    state = b"s" * 300_000
    disk.fill()
    with pytest.raises(OSError):
        store.install_snapshot(G1, meta, state)
    assert store.snapshot_meta(G1) is None and store.last_index(G1) == 10
    snapshots = os.path.join(disk.path, "quorum", "snapshots")
    assert not any(name.endswith(".tmp") for _root, _dirs, names in os.walk(snapshots)
                   for name in names)
    disk.free()
    store.install_snapshot(G1, meta, state)
    store.flush()
    store.close()
    again = reopen(disk.path)
    assert again.snapshot_meta(G1) == meta and again.read_snapshot(G1)[1] == state

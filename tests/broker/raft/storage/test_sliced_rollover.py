"""The WAL rollover in slices (rollover.py): what a shell's seal/write/synced cycle
does when the WAL is full. Each synced() writes at most one slice of segment data,
the file syncs go with the next batch, and a crash at any point of it (a crash
image after every segment append and before every WAL deletion) recovers exactly
what the store held when its last batch was written: kill -9 loses nothing that
was written, so nothing confirmed. FORMAT.md, "Durability and deletion rules" 2-4."""

from __future__ import annotations

import os
import random

import pytest

from quorumqueue.broker.raft.storage import LogStore, rollover
from quorumqueue.broker.raft.storage.segments import parse_segment
from quorumqueue.broker.raft.types import HardState, LogEntry

from .support import config, crash_image, reopen

GROUPS = [f"%2F/slice{n}" for n in range(6)]
SLICE = 8 * 1024


def entries(group: str, lo: int, hi: int, generation: int) -> list[LogEntry]:
    return [LogEntry(i, 1, 0, f"{group}|{i}|{generation}|".encode().ljust(1024, b"."))
            for i in range(lo, hi)]


def segment_bytes(data_dir) -> int:
    total = 0
    for root, _dirs, files in os.walk(os.path.join(str(data_dir), "quorum", "segments")):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files)
    return total


def cycle(store: LogStore) -> dict[str, int]:
    """One batch as the server runs it: seal, write (the writer thread), synced."""
    batch = store.seal()
    batch.write()
    return store.synced(batch)


@pytest.fixture
def small_slices(monkeypatch):
    monkeypatch.setattr(rollover, "SLICE_BYTES", SLICE)


def test_a_full_wal_rolls_over_a_slice_per_batch(tmp_path, small_slices):
    """The batch that fills the WAL opens the new one; no segment is written until a
    batch made it durable; then each batch writes one slice (its data at most a
    slice plus one entry), frees memory only once synced, and the last one deletes
    the old WAL file. Reads are the same all along."""
    store = LogStore(str(tmp_path), config(wal_max_size_bytes=64 * 1024,
                                           segment_max_entries=16))
    for group in GROUPS:
        store.append(group, entries(group, 1, 21, 0))
    expected = {g: [e.data for e in entries(g, 1, 21, 0)] for g in GROUPS}
    cycle(store)
    assert store.rolling_over and len(store.wal_paths()) == 2
    assert segment_bytes(tmp_path) == 0                 # the new WAL is not durable yet
    cycles, grown = 0, []
    while store.rolling_over:
        before = segment_bytes(tmp_path)
        memory = store.total_memtable_bytes()
        cycle(store)
        grown.append(segment_bytes(tmp_path) - before)
        assert store.total_memtable_bytes() <= memory
        for group in GROUPS:
            assert [e.data for e in store.entries(group, 1, 21)] == expected[group]
        cycles += 1
        assert cycles < 100
    assert len(grown) >= (6 * 20 * 1024) // (SLICE + 1024)
    # a slice: its data, its slots, and the headers and slot regions of new segments
    assert max(grown) <= SLICE + 1024 + 3 * (16 * 40 + 64)
    assert store.total_memtable_bytes() == 0 and len(store.wal_paths()) == 1
    store.close()
    again = reopen(tmp_path)
    for group in GROUPS:
        assert [e.data for e in again.entries(group, 1, 21)] == expected[group]
    again.close()


def entries_in_segment_files(data_dir) -> int:
    """Entries the segment files hold, as recovery would read them now."""
    total = 0
    for root, _dirs, files in os.walk(os.path.join(str(data_dir), "quorum", "segments")):
        for name in files:
            parsed = parse_segment(os.path.join(root, name), 0, tolerate_torn=True)
            total += parsed.ref.count if parsed is not None else 0
    return total


def test_synced_leaves_a_slices_writes_to_the_next_batch(tmp_path, small_slices):
    """synced() (the shell's event loop) only counts a slice into the segments; the
    next batch's write (the shell's writer thread) writes it, before its fdatasync,
    and only then do its entries leave memory. Issue 31 (Build 3): the page-cache
    copy of a slice held the loop for hundreds of milliseconds while the writer
    thread wrote the WAL."""
    group = GROUPS[0]
    store = LogStore(str(tmp_path), config(wal_max_size_bytes=16 * 1024,
                                           segment_max_entries=64))
    store.append(group, entries(group, 1, 41, 0))
    expected = [e.data for e in entries(group, 1, 41, 0)]
    cycle(store)                                   # the WAL is full: the new one opens
    cycle(store)                                   # it is durable: the first slice
    assert store.rolling_over
    assert entries_in_segment_files(tmp_path) == 0
    batch = store.seal()
    batch.write()
    assert entries_in_segment_files(tmp_path) > 0
    store.synced(batch)
    while store.rolling_over:
        cycle(store)
    assert entries_in_segment_files(tmp_path) == 40
    assert [e.data for e in store.entries(group, 1, 41)] == expected
    store.close()
    again = reopen(tmp_path)
    assert [e.data for e in again.entries(group, 1, 41)] == expected
    again.close()


def test_a_segment_read_while_its_next_slice_waits_returns_every_entry(tmp_path, small_slices):
    """A read of entries already moved out of memory, from a segment whose next
    slice is counted but not yet written (its batch not run), writes that slice
    first and reads the file as the store counts it, then and after a restart."""
    group = GROUPS[0]
    store = LogStore(str(tmp_path), config(wal_max_size_bytes=16 * 1024,
                                           segment_max_entries=64))
    store.append(group, entries(group, 1, 41, 0))
    expected = [e.data for e in entries(group, 1, 41, 0)]
    cycle(store)
    cycle(store)                                   # slice 1 counted
    cycle(store)                                   # slice 1 written and synced, slice 2 counted
    assert store.rolling_over
    on_disk = entries_in_segment_files(tmp_path)
    assert 0 < on_disk < 40
    assert [e.data for e in store.entries(group, 1, 41)] == expected   # 1.. from the file
    assert entries_in_segment_files(tmp_path) > on_disk     # the read wrote slice 2 first
    while store.rolling_over:
        cycle(store)
    store.close()
    again = reopen(tmp_path)
    assert [e.data for e in again.entries(group, 1, 41)] == expected
    again.close()


def test_flush_still_rolls_over_in_one_call(tmp_path):
    """flush() (tests, tools, a node flushed synchronously) keeps the one-call rollover."""
    store = LogStore(str(tmp_path), config(wal_max_size_bytes=16 * 1024))
    for group in GROUPS:
        store.append(group, entries(group, 1, 5, 0))
    store.flush()
    assert not store.rolling_over and len(store.wal_paths()) == 1
    assert store.total_memtable_bytes() == 0
    store.close()


def test_crash_at_every_step_of_sliced_rollovers_recovers_what_was_written(
        tmp_path, monkeypatch):
    """Appends, conflict truncations (into entries a slice wrote, fsync pending),
    deletes and re-creates between batches, through several sliced rollovers; a crash
    image after every segment append and before and after every WAL deletion, and
    after every batch. Each image recovers each group's log as the store held it
    when its last batch was written."""
    monkeypatch.setattr(rollover, "SLICE_BYTES", 32 * 1024)
    rng = random.Random(31)
    data_dir = tmp_path / "data"
    store = LogStore(str(data_dir), config(wal_max_size_bytes=48 * 1024,
                                           segment_max_entries=8))
    model: dict[str, dict[int, bytes]] = {g: {} for g in GROUPS}
    written: dict[str, dict[int, bytes]] = {}    # the model as of the last write
    images: list[tuple[str, dict]] = []
    counter = iter(range(1_000_000))

    def image() -> None:
        path = crash_image(data_dir, tmp_path / f"image{next(counter)}")
        images.append((path, {g: dict(log) for g, log in written.items()}))

    real_append = rollover.append_entries
    real_remove = os.remove

    def append_then_image(*args, **kwargs):
        taken = real_append(*args, **kwargs)
        image()
        return taken

    def remove_with_images(path, *args, **kwargs):
        if path.endswith(".wal"):
            image()
        real_remove(path, *args, **kwargs)
        if path.endswith(".wal"):
            image()

    monkeypatch.setattr(rollover, "append_entries", append_then_image)
    monkeypatch.setattr(rollover.os, "remove", remove_with_images)
    generation = 0
    rollovers = truncations = 0
    for _round in range(90):
        generation += 1
        for group in GROUPS:
            log = model[group]
            last = max(log, default=0)
            if log and rng.random() < 0.12:             # a follower's conflicting suffix
                cut = rng.randint(min(log), last)
                store.truncate_from(group, cut)
                for index in [i for i in log if i >= cut]:
                    del log[index]
                last = cut - 1
                truncations += 1
            if rng.random() < 0.02:
                store.delete_group(group)
                log.clear()
                last = 0
            count = rng.randint(1, 6)
            new = entries(group, last + 1, last + 1 + count, generation)
            store.append(group, new)
            log.update((e.index, e.data) for e in new)
        was_newest = store.wal_paths()[-1]
        batch = store.seal()
        batch.write_records()
        written = {g: dict(log) for g, log in model.items()}
        batch.sync()
        store.synced(batch)
        rollovers += store.wal_paths()[-1] != was_newest
        for group, log in model.items():                 # reads unchanged meanwhile
            last = store.last_index(group)
            assert {e.index: e.data for e in store.entries(group, 1, last + 1)} == log
        image()
    while store.rolling_over:
        cycle(store)
        image()
    store.close()
    assert rollovers >= 3 and truncations >= 5 and len(images) > 100
    for path, expected in images:
        recovered = reopen(path)
        for group, log in expected.items():
            last = recovered.last_index(group)
            assert last == max(log, default=0), (path, group)
            got = {e.index: e.data for e in recovered.entries(group, 1, last + 1)}
            assert got == log, (path, group)
        recovered.close()


def test_records_a_new_wal_starts_with_do_not_fill_it(tmp_path, small_slices):
    """With many groups and a small `raft.wal_max_size_bytes`, the records a new WAL
    file carries (each group's hard state and members) can be larger than the limit
    themselves. A rollover then moves nothing, so it must not begin again: once the
    entries are in segments, batches with nothing new end the rollover and start no
    other (before, each batch began one more, a Sync each, and a node that was asked
    to stop waited for the last one for ever)."""
    groups = [f"%2F/carried{n}" for n in range(40)]
    store = LogStore(str(tmp_path), config(wal_max_size_bytes=2048))
    for group in groups:
        store.set_hard_state(group, HardState(7, "qq1@a-long-host-name.example"))
        store.set_initial_members(group, [f"qq{n}@a-long-host-name.example" for n in (1, 2, 3)])
        store.append(group, entries(group, 1, 3, 0))
    cycle(store)
    cycles = 0
    while store.rolling_over:
        cycle(store)
        cycles += 1
        assert cycles < 100
    carried = store.wal_size()
    assert carried > 2048           # the carried records alone pass the limit
    wal = store.wal_paths()
    for _ in range(5):              # batches with nothing in them, as an idle node's
        cycle(store)
        assert not store.rolling_over
    assert store.wal_paths() == wal
    store.append(groups[0], entries(groups[0], 3, 6, 0))   # 3 KiB past the carried
    cycle(store)
    assert store.rolling_over       # entries past the limit still roll it over
    while store.rolling_over:
        cycle(store)
    for group in groups:
        assert len(store.entries(group, 1, 3)) == 2
    assert len(store.entries(groups[0], 1, 6)) == 5
    store.close()

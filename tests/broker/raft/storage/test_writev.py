"""WAL records go to the file by writev (layout.writev_all, WalFile.write): the kernel
copies them on the writer thread without the GIL, and no joined copy is made, not
even of a big entry's data (its record is its head and its data). A short write (a
file system nearly full) is continued where it stopped, as write_all does."""

from __future__ import annotations

import os
import random

from quorumqueue.broker.raft.storage import LogStore, layout, wal
from quorumqueue.broker.raft.types import LogEntry

from .support import config, reopen


def test_short_writes_are_continued_and_the_file_holds_every_buffer_in_order(
        tmp_path, monkeypatch):
    real = os.writev
    rng = random.Random(7)

    def short(fd, buffers):
        data = b"".join(bytes(b) for b in buffers)
        return real(fd, [data[:rng.randint(1, len(data))]]) if data else 0

    monkeypatch.setattr(os, "writev", short)
    for trial in range(100):
        buffers = [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(0, 2500))]
        path = tmp_path / f"f{trial}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        try:
            assert layout.writev_all(fd, buffers) == sum(map(len, buffers))
        finally:
            os.close(fd)
        assert path.read_bytes() == b"".join(buffers)


def test_positioned_short_writes_are_continued_from_the_offset(tmp_path, monkeypatch):
    """layout.pwritev_all (a sliced rollover's segment data, segments.PendingAppend):
    the buffers land back to back from the offset, a short write continued."""
    real = os.pwritev
    rng = random.Random(11)

    def short(fd, buffers, offset):
        data = b"".join(bytes(b) for b in buffers)
        return real(fd, [data[:rng.randint(1, len(data))]], offset) if data else 0

    monkeypatch.setattr(os, "pwritev", short)
    for trial in range(100):
        buffers = [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(0, 2500))]
        start = rng.randint(0, 100)
        path = tmp_path / f"f{trial}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT)
        try:
            assert layout.pwritev_all(fd, buffers, start) == sum(map(len, buffers))
        finally:
            os.close(fd)
        assert path.read_bytes()[start:] == b"".join(buffers)


def test_big_entries_come_back_whole_through_batches_rollovers_and_a_restart(tmp_path):
    """An entry of wal.OWN_BUFFER_BYTES or more is written from its own buffer (its
    data is not copied into the record): it still counts as one pending record, is
    written whole across write() calls of raft.wal_max_batch_size records and
    sliced rollovers, and reads back byte for byte after a restart."""
    rng = random.Random(31)
    group = "%2F/big"
    store = LogStore(str(tmp_path), config(wal_max_size_bytes=256 * 1024,
                                           wal_max_batch_size=3, segment_max_entries=8))
    store.append(group, [LogEntry(1, 1, 0, b"first")])
    store.flush()
    expected = [b"first"]
    rollovers = 0
    for _round in range(12):
        sizes = [rng.choice((100, wal.OWN_BUFFER_BYTES - 1, wal.OWN_BUFFER_BYTES, 70_000))
                 for _ in range(rng.randint(1, 7))]
        first = len(expected) + 1
        new = [LogEntry(first + n, 1, 0, rng.randbytes(size)) for n, size in enumerate(sizes)]
        before = store.pending_records
        store.append(group, new)
        # one record per run of small entries and per big one (ENTRIES, ENTRY), and
        # a GROUP record first in a new WAL file
        runs = sum(1 for n, size in enumerate(sizes) if size >= wal.OWN_BUFFER_BYTES
                   or n == 0 or sizes[n - 1] >= wal.OWN_BUFFER_BYTES)
        assert store.pending_records - before - runs in (0, 1)
        expected += [entry.data for entry in new]
        batch = store.seal()
        batch.write()
        store.synced(batch)
        rollovers += store.rolling_over
        assert [e.data for e in store.entries(group, 1, len(expected) + 1)] == expected
    assert rollovers
    while store.rolling_over:
        batch = store.seal()
        batch.write()
        store.synced(batch)
    store.close()
    again = reopen(tmp_path)
    assert [e.data for e in again.entries(group, 1, len(expected) + 1)] == expected
    again.close()


def test_a_big_entrys_record_is_the_bytes_encode_entry_gives():
    """The (head, data) form writes the same bytes as the joined record."""
    entry = LogEntry(7, 3, 1, bytes(range(256)) * 100)
    (record,) = wal.encode_entries(5, [entry])
    assert type(record) is tuple and record[1] is entry.data
    assert wal.record_bytes(record) == wal.encode_entry(5, entry)
    scanned = wal._decode(wal.ENTRY, wal.record_bytes(record)[wal.RECORD_HEADER_SIZE:])
    assert scanned == wal.EntryRecord(5, entry)



def _decoded(records: list) -> list[LogEntry]:
    """The entries of encoded records, as a scan reads them."""
    data = b"".join(wal.record_bytes(record) for record in records)
    entries, offset = [], 0
    while offset < len(data):
        length, record_type, _crc = wal.RECORD_HEADER.unpack_from(data, offset)
        payload = data[offset + wal.RECORD_HEADER_SIZE:offset + wal.RECORD_HEADER_SIZE + length]
        if record_type == wal.ENTRIES:
            entries += [record.entry for _o, record in wal._decode_entries(payload, offset)]
        else:
            entries.append(wal._decode(record_type, payload).entry)
        offset += wal.RECORD_HEADER_SIZE + length
    return entries


def test_entries_records_keep_each_entrys_term_and_kind():
    """encode_entries makes one ENTRIES record of a run only where every entry has
    the run's term and kind: a term that comes back to the first one's (1, 2, 1: not
    a log, but the encoder is not told so) or another kind in the middle splits it."""
    terms = [LogEntry(1, 1, 0, b"a"), LogEntry(2, 2, 0, b"b"), LogEntry(3, 1, 0, b"c")]
    kinds = [LogEntry(4, 1, 0, b"d"), LogEntry(5, 1, 2, b"e"), LogEntry(6, 1, 0, b"f")]
    for entries in (terms, kinds, terms + kinds):
        assert _decoded(wal.encode_entries(7, entries)) == entries

"""Segment files: one group's log entries, moved out of the WAL, read back on demand.

Responsibilities: write entries to a group's segment files (appending to the newest
one until it is full), rewrite a segment keeping only some of its entries (conflict
truncation, compaction), parse a segment's index on open, and read entries and terms
back through a small cache of open readers.

How it works: a segment is a header (magic, version, flags, slot count, group uid), an
index of `slot_count` fixed 40-byte slots (raft index, term, data offset, length,
data crc32, kind, slot crc32) and the data, back to back in index order. Index slots
are preallocated (a sparse hole until used), so appending writes the data, then the
slots, then fdatasyncs. A rewrite goes to `<name>.tmp`, is fsynced and renamed over
the original, then the directory is fsynced. Byte layout: FORMAT.md, "Segment file".

Invariants:
- in a file, used slots form a prefix; their raft indexes strictly increase (and are
  consecutive unless the COMPACTED flag is set); data offsets are back to back;
- a COMPACTED segment never grows;
- a segment is written only while the WAL holding the same entries still exists, so a
  torn segment tail is tolerated only when an interrupted WAL rollover explains it.

Not here: which entries go where and when (log_store.py), file naming (layout.py).
"""

from __future__ import annotations

import os
import struct
import threading
from array import array
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass, field

from zlib_ng.zlib_ng import crc32

from ..types import LogEntry
from .errors import CorruptLogError
from .layout import TMP_SUFFIX, fsync_dir, pwrite_all, pwritev_all, reserve, sync_file

SEGMENT_MAGIC = b"QQSG"
SEGMENT_VERSION = 1
FLAG_COMPACTED = 0x0001

HEADER = struct.Struct(">4sHHIH")          # magic, version, flags, slot count, uid length
SLOT = struct.Struct(">QQQIIB3x")          # index, term, offset, length, data crc, kind
SLOT_WITH_CRC = struct.Struct(">QQQIIB3xI")
SLOT_SIZE = SLOT_WITH_CRC.size             # 40
_ZERO_SLOT = bytes(SLOT_SIZE)
_crc32 = crc32   # zlib's CRC-32, computed by zlib-ng (pyproject.toml says why)


def header_size(uid_length: int) -> int:
    return HEADER.size + uid_length + 4


@dataclass(slots=True)
class SegmentRef:
    """What the store keeps in memory about one segment file."""
    number: int
    path: str
    first: int               # raft index of the first used slot (0 while empty)
    last: int                # raft index of the last used slot (0 while empty)
    count: int               # used slots
    slot_count: int
    header_size: int
    data_end: int            # file offset just past the last entry's data
    compacted: bool
    last_term: int = 0       # term of the last used slot (0 while empty)
    # appends counted above but maybe not in the file yet (append_entries `later`):
    # whoever reads the file runs them first (ReaderCache.get)
    unwritten: list[PendingAppend] = field(default_factory=list)

    @property
    def data_start(self) -> int:
        return self.header_size + self.slot_count * SLOT_SIZE

    def accepts_more(self, max_size_bytes: int) -> bool:
        return (not self.compacted and self.count < self.slot_count
                and self.data_end - self.data_start < max_size_bytes)


def _encode_header(uid: str, slot_count: int, compacted: bool) -> bytes:
    raw = uid.encode("utf-8")
    head = HEADER.pack(SEGMENT_MAGIC, SEGMENT_VERSION,
                       FLAG_COMPACTED if compacted else 0, slot_count, len(raw)) + raw
    return head + _crc32(head).to_bytes(4, "big")


def _encode_slots(entries: list[LogEntry], offset: int) -> bytes:
    out = []
    for entry in entries:
        length = len(entry.data)
        body = SLOT.pack(entry.index, entry.term, offset, length, _crc32(entry.data),
                         entry.kind)
        out.append(body + _crc32(body).to_bytes(4, "big"))
        offset += length
    return b"".join(out)


@dataclass(slots=True, eq=False)
class PendingAppend:
    """An append's two writes (data, then index slots), made later on any thread:
    a sliced rollover's, so the shell's event loop neither waits for the page cache
    nor encodes the slots (a CRC of each entry's data). Its blocks are allocated
    already, so it finds no full disk. `run` writes once; a second call (the reader
    that got there first, or a retried batch after a failed one) does nothing."""
    ref: SegmentRef
    fd: int                  # open for writing, closed by whoever holds the append
    entries: list[LogEntry]  # their data written back to back (no join), then slots
    data_at: int
    slots_at: int
    written: bool = False

    def run(self) -> None:
        with _APPEND_LOCK:
            if self.written:
                return
            entries = self.entries
            pwritev_all(self.fd, [entry.data for entry in entries], self.data_at)
            pwrite_all(self.fd, _encode_slots(entries, self.data_at), self.slots_at)
            self.written = True
            self.entries = []

    def forget(self) -> None:
        """Written and synced: the segment no longer waits for it (the store's thread)."""
        if self in self.ref.unwritten:
            self.ref.unwritten.remove(self)


_APPEND_LOCK = threading.Lock()   # one PendingAppend runs at a time: loop or writer


# --- parsing -----------------------------------------------------------------------------

@dataclass(slots=True)
class SlotIndex:
    indexes: array
    terms: array
    offsets: array
    lengths: array
    crcs: array
    kinds: bytearray


@dataclass(slots=True)
class ParsedSegment:
    uid: str
    ref: SegmentRef
    slots: SlotIndex
    torn: bool               # used slots end in a torn write (only if tolerated)


def parse_segment(path: str, number: int, tolerate_torn: bool) -> ParsedSegment | None:
    """Check a segment's header and index. None: a file torn while being created
    (only when `tolerate_torn`). A torn index tail is cut off when `tolerate_torn`,
    otherwise it is corruption."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        head = handle.read(HEADER.size)
        if len(head) < HEADER.size:
            if tolerate_torn:
                return None
            raise CorruptLogError(path, 0, f"truncated segment header ({size} bytes)")
        magic, version, flags, slot_count, uid_length = HEADER.unpack(head)
        if magic != SEGMENT_MAGIC:
            if tolerate_torn and not head.strip(b"\0"):
                return None
            raise CorruptLogError(path, 0, f"bad magic {magic!r} (expected {SEGMENT_MAGIC!r})")
        if version != SEGMENT_VERSION:
            raise CorruptLogError(path, 4, f"unknown segment format version {version} "
                                           f"(this build reads {SEGMENT_VERSION})")
        rest = handle.read(uid_length + 4)
        if len(rest) < uid_length + 4 or _crc32(head + rest[:uid_length]) != \
                int.from_bytes(rest[uid_length:], "big"):
            if tolerate_torn:
                return None
            raise CorruptLogError(path, 0, "segment header checksum mismatch or truncated")
        uid = rest[:uid_length].decode("utf-8")
        hsize = header_size(uid_length)
        region = handle.read(slot_count * SLOT_SIZE)
    region = region + bytes(slot_count * SLOT_SIZE - len(region))
    compacted = bool(flags & FLAG_COMPACTED)
    data_start = hsize + slot_count * SLOT_SIZE
    slots = SlotIndex(array("Q"), array("Q"), array("Q"), array("L"), array("L"), bytearray())
    expected_offset = data_start
    previous_index = previous_term = 0
    torn = False
    for position, (index, term, offset, length, crc, kind, slot_crc) in \
            enumerate(SLOT_WITH_CRC.iter_unpack(region)):
        start = position * SLOT_SIZE
        if index == 0 and region[start:start + SLOT_SIZE] == _ZERO_SLOT:
            rest_of_index = region[start:]
            if rest_of_index.strip(b"\0"):
                if not tolerate_torn:
                    raise CorruptLogError(path, hsize + start,
                                          "index slot in use after an empty one")
                torn = True
            break
        problem = None
        if slot_crc != _crc32(region[start:start + SLOT_SIZE - 4]):
            problem = "index slot checksum mismatch"
        elif index <= previous_index or (previous_index and not compacted
                                         and index != previous_index + 1):
            problem = f"raft index {index} does not follow {previous_index}"
        elif term < previous_term:
            problem = f"term {term} decreases (previous {previous_term})"
        elif offset != expected_offset or offset + length > size:
            problem = f"entry data [{offset}, {offset + length}) outside the data region"
        if problem is not None:
            if not tolerate_torn:
                raise CorruptLogError(path, hsize + start, problem)
            torn = True
            break
        slots.indexes.append(index)
        slots.terms.append(term)
        slots.offsets.append(offset)
        slots.lengths.append(length)
        slots.crcs.append(crc)
        slots.kinds.append(kind)
        expected_offset = offset + length
        previous_index, previous_term = index, term
    count = len(slots.indexes)
    ref = SegmentRef(number, path, slots.indexes[0] if count else 0,
                     slots.indexes[-1] if count else 0, count, slot_count, hsize,
                     expected_offset, compacted, slots.terms[-1] if count else 0)
    return ParsedSegment(uid, ref, slots, torn)


# --- reading -----------------------------------------------------------------------------

class SegmentReader:
    def __init__(self, ref: SegmentRef, slots: SlotIndex) -> None:
        self.ref = ref
        self.slots = slots
        self._fd = -1
        self._fd = os.open(ref.path, os.O_RDONLY)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    __del__ = close

    def _position(self, index: int) -> int | None:
        indexes = self.slots.indexes
        if not indexes:
            return None
        position = index - indexes[0] if not self.ref.compacted else bisect_left(indexes, index)
        if 0 <= position < len(indexes) and indexes[position] == index:
            return position
        return None

    def term_at(self, index: int) -> int | None:
        position = self._position(index)
        return None if position is None else self.slots.terms[position]

    def read(self, lo: int, hi: int) -> list[LogEntry]:
        """The entries stored here with lo <= index < hi, data checked against its crc."""
        s = self.slots
        a, b = bisect_left(s.indexes, lo), bisect_left(s.indexes, hi)
        if a >= b:
            return []
        base = s.offsets[a]
        span = s.offsets[b - 1] + s.lengths[b - 1] - base
        blob = os.pread(self._fd, span, base) if span else b""
        if len(blob) != span:
            raise CorruptLogError(self.ref.path, base + len(blob), "segment data cut short")
        out = []
        for position in range(a, b):
            start = s.offsets[position] - base
            data = blob[start:start + s.lengths[position]]
            if _crc32(data) != s.crcs[position]:
                raise CorruptLogError(self.ref.path, s.offsets[position],
                                      f"data of entry {s.indexes[position]} fails its "
                                      "checksum")
            out.append(LogEntry(s.indexes[position], s.terms[position], s.kinds[position],
                                data))
        return out


class ReaderCache:
    """At most `capacity` open readers, least recently used evicted first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._readers: OrderedDict[str, SegmentReader] = OrderedDict()

    def get(self, ref: SegmentRef) -> SegmentReader:
        reader = self._readers.get(ref.path)
        if reader is not None and reader.ref is ref:
            self._readers.move_to_end(ref.path)
            return reader
        self.evict(ref.path)
        for append in list(ref.unwritten):   # a file read before its writer got there
            append.run()
        parsed = parse_segment(ref.path, ref.number, tolerate_torn=False)
        assert parsed is not None
        if parsed.ref.count != ref.count or parsed.ref.last != ref.last:
            raise CorruptLogError(ref.path, None, f"holds {parsed.ref.count} entries "
                                  f"(to {parsed.ref.last}), expected {ref.count} (to {ref.last})")
        reader = SegmentReader(ref, parsed.slots)
        self._readers[ref.path] = reader
        while len(self._readers) > self.capacity:
            _path, oldest = self._readers.popitem(last=False)
            oldest.close()
        return reader

    def evict(self, path: str) -> None:
        reader = self._readers.pop(path, None)
        if reader is not None:
            reader.close()

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __len__(self) -> int:
        return len(self._readers)


# --- writing -----------------------------------------------------------------------------

def create_segment(path: str, number: int, uid: str, slot_count: int) -> SegmentRef:
    """A new, empty segment (header only; the index is a hole until used). Made
    durable by the fdatasync of its first append plus an fsync of its directory."""
    header = _encode_header(uid, slot_count, compacted=False)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pwrite_all(fd, header, 0)
    except OSError:
        os.remove(path)         # a full disk: not there, as before the call
        raise
    finally:
        os.close(fd)
    ref = SegmentRef(number, path, 0, 0, 0, slot_count, len(header), 0, False)
    ref.data_end = ref.data_start
    return ref


def append_entries(ref: SegmentRef, entries: list[LogEntry], start: int,
                   max_size_bytes: int, fsync: bool,
                   later: list[PendingAppend] | None = None) -> int:
    """Append the longest run of entries[start:] that fits; returns how many. Data
    first, then the index slots, then one fdatasync. The blocks for both are
    allocated first (layout.reserve): on a full disk the call fails before writing
    anything, the index beyond the used slots stays zeros, and `ref` is unchanged.
    With `later`, only the blocks are allocated here and `ref` counts the entries:
    the writes become a PendingAppend added to `later` (and to `ref.unwritten`),
    whose holder runs it, fdatasyncs its fd and closes it."""
    stop = start
    data_size = ref.data_end - ref.data_start
    room = ref.slot_count - ref.count
    while stop < len(entries) and stop - start < room and data_size < max_size_bytes:
        data_size += len(entries[stop].data)
        stop += 1
    if stop == start:
        return 0
    batch = entries[start:stop]
    slots_at = ref.header_size + ref.count * SLOT_SIZE
    size = data_size - (ref.data_end - ref.data_start)
    fd = os.open(ref.path, os.O_WRONLY)
    kept = False                             # the fd is the PendingAppend's
    try:
        reserve(fd, slots_at, len(batch) * SLOT_SIZE)
        reserve(fd, ref.data_end, size)
        if not size and os.fstat(fd).st_size < ref.data_end:
            os.ftruncate(fd, ref.data_end)   # empty entries: the file still reaches them
        if later is not None:
            append = PendingAppend(ref, fd, batch, ref.data_end, slots_at)
            later.append(append)
            ref.unwritten.append(append)
            kept = True
        else:
            if size:
                pwritev_all(fd, [entry.data for entry in batch], ref.data_end)
            pwrite_all(fd, _encode_slots(batch, ref.data_end), slots_at)
            sync_file(fd, fsync)
    finally:
        if not kept:
            os.close(fd)
    if not ref.count:
        ref.first = batch[0].index
    ref.count += len(batch)
    ref.last = batch[-1].index
    ref.last_term = batch[-1].term
    ref.data_end += size
    return len(batch)


def rewrite_segment(ref: SegmentRef, uid: str, entries: list[LogEntry], compacted: bool,
                    fsync: bool) -> SegmentRef | None:
    """Replace the file with one holding only `entries` (tmp, fsync, rename, fsync the
    directory). No entries: the file is deleted. A compacted file has exactly as many
    slots as entries; otherwise the slot count is kept so it can still grow."""
    if not entries:
        os.remove(ref.path)
        fsync_dir(os.path.dirname(ref.path), fsync)
        return None
    new = write_rewritten(ref, uid, entries, compacted, fsync)
    os.replace(ref.path + TMP_SUFFIX, ref.path)
    fsync_dir(os.path.dirname(ref.path), fsync)
    return new


def write_rewritten(ref: SegmentRef, uid: str, entries: list[LogEntry], compacted: bool,
                    fsync: bool) -> SegmentRef:
    """`rewrite_segment`'s first half: `<name>.tmp` holding only `entries` (at least
    one), fsynced; the ref it will be once renamed over the segment."""
    slot_count = len(entries) if compacted else ref.slot_count
    header = _encode_header(uid, slot_count, compacted)
    data_start = len(header) + slot_count * SLOT_SIZE
    tmp = ref.path + TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pwrite_all(fd, header, 0)
        pwrite_all(fd, _encode_slots(entries, data_start), len(header))
        data = b"".join(entry.data for entry in entries)
        pwrite_all(fd, data, data_start)
        os.ftruncate(fd, data_start + len(data))
        sync_file(fd, fsync)
    except OSError:
        os.remove(tmp)          # a full disk: the original stays, the space comes back
        raise
    finally:
        os.close(fd)
    return SegmentRef(ref.number, ref.path, entries[0].index, entries[-1].index,
                      len(entries), slot_count, len(header), data_start + len(data), compacted,
                      entries[-1].term)

"""The write-ahead log: one per node, shared by every Raft group on it.

Responsibilities: encode the records groups append (pure: bytes out), write a batch of
them and make it durable with one fdatasync (group commit), and scan a WAL file back
into typed records on recovery, telling a torn tail from corruption.

How it works: a WAL file is a 16-byte header then records. Each record carries its own
header CRC and payload CRC, so a length can be trusted before the payload is read. A
group is named once per file by a GROUP record mapping a small number (gid) to its
uid; the other records carry the gid. A run of entries of one term and kind is one
ENTRIES record (version 3 on): one header, one CRC and one buffer for the run, built by
C calls alone (no Python step per entry); a single entry, or one of OWN_BUFFER_BYTES or
more, is an ENTRY record. The scan hands both back as one EntryRecord per entry.
Byte layout: FORMAT.md, "WAL file".

Invariants:
- a record is durable once the fdatasync that follows its write returned;
- records are written in the order they were encoded, and a write is a prefix of that
  order, so a crash leaves a prefix of the records plus at most one torn record;
- a torn record is accepted only at the end of the newest WAL file (a file is never
  appended to after a newer one exists); everything else that fails a check is
  corruption, reported with the file and byte offset;
- a file holds only record types its header's version defines: this build reads
  versions 1 to 3 and writes 3 (DELETE_GROUP is new in 2, ENTRIES in 3); it never
  appends to an older-version file (the store rolls over to a new file on open instead).

Not here: what the records mean for a group's log (log_store.py, recovery.py).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from collections.abc import Sequence
from typing import TypeAlias

from zlib_ng.zlib_ng import crc32

from ..types import HardState, LogEntry
from .errors import CorruptLogError
from .layout import sync_file, write_all, writev_all

WAL_MAGIC = b"QQWL"
WAL_VERSION = 3                            # what this build writes (FORMAT.md, "Versioning")
READABLE_VERSIONS = (1, 2, 3)              # 2 added DELETE_GROUP, 3 ENTRIES; nothing else

FILE_HEADER = struct.Struct(">4sHHI")      # magic, version, flags, file number
FILE_HEADER_SIZE = FILE_HEADER.size + 4    # + crc32 of the 12 bytes above
RECORD_HEADER = struct.Struct(">IBI")      # payload length, type, payload crc32
RECORD_HEADER_SIZE = RECORD_HEADER.size + 4  # + crc32 of the 9 bytes above

GROUP, ENTRY, HARD_STATE, TRUNCATE, RESET, RELEASE, MEMBERS = 1, 2, 3, 4, 5, 6, 7
DELETE_GROUP = 8                           # version 2 on
ENTRIES = 9                                # version 3 on
RECORD_NAMES = {GROUP: "GROUP", ENTRY: "ENTRY", HARD_STATE: "HARD_STATE",
                TRUNCATE: "TRUNCATE", RESET: "RESET", RELEASE: "RELEASE", MEMBERS: "MEMBERS",
                DELETE_GROUP: "DELETE_GROUP", ENTRIES: "ENTRIES"}
FIRST_VERSION = {DELETE_GROUP: 2, ENTRIES: 3}   # record types newer than version 1

_gid = struct.Struct(">I")
_entry = struct.Struct(">IQQB")            # gid, index, term, kind; then data
_entries = struct.Struct(">IQQBI")         # gid, first index, term, kind, count; then
                                           # count x (u32 length, data)
_hard_state = struct.Struct(">IQB")        # gid, term, has_vote; then voted_for
_gid_index = struct.Struct(">IQ")          # TRUNCATE (index), RELEASE (cursor)
_reset = struct.Struct(">IQQ")             # gid, snapshot index, snapshot term
_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")
_crc32 = crc32   # zlib's CRC-32, computed by zlib-ng (pyproject.toml says why)
# an ENTRY record with at least this much data is (its head, its data): the data is
# written as a buffer of its own (WalFile.write), not copied into a joined record
OWN_BUFFER_BYTES = 16 * 1024
# at most this many entries in one ENTRIES record (so at most 16 MiB of data)
ENTRIES_MAX = 1024
_data_of, _term_of, _kind_of = (attrgetter("data"), attrgetter("term"),
                                attrgetter("kind"))

# A record as the store keeps it until written: its bytes, or a big entry's head
# and data (still one item: batches count and retry records, not buffers)
Record: TypeAlias = bytes | tuple[bytes, bytes]


# --- encoding (pure) -------------------------------------------------------------------

def encode_file_header(number: int) -> bytes:
    head = FILE_HEADER.pack(WAL_MAGIC, WAL_VERSION, 0, number)
    return head + _crc32(head).to_bytes(4, "big")


def _record(record_type: int, payload: bytes, crc: int | None = None) -> bytes:
    head = RECORD_HEADER.pack(len(payload), record_type,
                              _crc32(payload) if crc is None else crc)
    return head + _crc32(head).to_bytes(4, "big") + payload


def encode_group(gid: int, uid: str) -> bytes:
    return _record(GROUP, _gid.pack(gid) + uid.encode("utf-8"))


def encode_entry(gid: int, entry: LogEntry) -> bytes:
    """One entry's ENTRY record (whatever its size)."""
    return record_bytes(_entry_records(gid, [entry])[0])


def record_bytes(record: Record) -> bytes:
    """A record's bytes, as written."""
    return record if type(record) is bytes else b"".join(record)


def encode_entries(gid: int, entries: Sequence[LogEntry]) -> list[Record]:
    """The records of consecutive entries (the hot path). Entries of one term and kind,
    each under OWN_BUFFER_BYTES, are ENTRIES records of up to ENTRIES_MAX (head, the
    entries' lengths and data joined): no Python step per entry. Otherwise, and for a
    single entry, one ENTRY record each (`_entry_records`)."""
    count = len(entries)
    if count < 2:
        return _entry_records(gid, entries)
    datas = list(map(_data_of, entries))
    lengths = list(map(len, datas))
    first = entries[0]
    if (list(map(_term_of, entries)).count(first.term) != count
            or max(lengths) >= OWN_BUFFER_BYTES or len(set(map(_kind_of, entries))) != 1):
        return _mixed_records(gid, entries, lengths)
    return encode_run(gid, first.index, first.term, first.kind, datas, lengths)


def encode_run(gid: int, index: int, term: int, kind: int, datas: list[bytes],
               lengths: list[int]) -> list[Record]:
    """ENTRIES records (or one ENTRY for a run of one) for entries index, index + 1, ...
    of one term and kind, each under OWN_BUFFER_BYTES: their data `datas`, of
    `lengths` bytes. For a caller that checked the run already (LogStore.append)."""
    if len(datas) == 1:
        return _entry_records(gid, [LogEntry(index, term, kind, datas[0])])
    out: list[Record] = []
    pack_fixed, pack_head, pack_u32, crc = _entries.pack, RECORD_HEADER.pack, _u32.pack, _crc32
    for start in range(0, len(datas), ENTRIES_MAX):
        part, sizes = datas[start:start + ENTRIES_MAX], lengths[start:start + ENTRIES_MAX]
        body = b"".join(chain.from_iterable(zip(map(pack_u32, sizes), part)))
        fixed = pack_fixed(gid, index + start, term, kind, len(part))
        head = pack_head(len(fixed) + len(body), ENTRIES, crc(body, crc(fixed)))
        out.append((head + pack_u32(crc(head)) + fixed, body))
    return out


def _mixed_records(gid: int, entries: Sequence[LogEntry], lengths: list[int]) -> list[Record]:
    """Entries whose terms or kinds change, or with big ones among them: each run of
    small entries of one term and kind as `encode_run`, each big one alone."""
    out: list[Record] = []
    start, count = 0, len(entries)
    while start < count:
        first = entries[start]
        if lengths[start] >= OWN_BUFFER_BYTES:
            out += _entry_records(gid, [first])
            start += 1
            continue
        end = start + 1
        while (end < count and lengths[end] < OWN_BUFFER_BYTES
               and entries[end].term == first.term and entries[end].kind == first.kind):
            end += 1
        out += encode_run(gid, first.index, first.term, first.kind,
                          [entry.data for entry in entries[start:end]], lengths[start:end])
        start = end
    return out


def _entry_records(gid: int, entries: Sequence[LogEntry]) -> list[Record]:
    """One ENTRY record per entry. An entry of OWN_BUFFER_BYTES or more is (head,
    data): its data is not copied."""
    pack_fixed, pack_head, pack_u32, crc, join = (_entry.pack, RECORD_HEADER.pack,
                                                 _u32.pack, _crc32, b"".join)
    fixed_size, big = _entry.size, OWN_BUFFER_BYTES
    out: list[Record] = []
    for entry in entries:
        data = entry.data
        fixed = pack_fixed(gid, entry.index, entry.term, entry.kind)
        head = pack_head(fixed_size + len(data), ENTRY, crc(data, crc(fixed)))
        if len(data) < big:
            out.append(join((head, pack_u32(crc(head)), fixed, data)))
        else:
            out.append((join((head, pack_u32(crc(head)), fixed)), data))
    return out


def encode_hard_state(gid: int, state: HardState) -> bytes:
    vote = b"" if state.voted_for is None else state.voted_for.encode("utf-8")
    return _record(HARD_STATE,
                   _hard_state.pack(gid, state.term, state.voted_for is not None) + vote)


def encode_truncate(gid: int, index: int) -> bytes:
    return _record(TRUNCATE, _gid_index.pack(gid, index))


def encode_reset(gid: int, index: int, term: int) -> bytes:
    return _record(RESET, _reset.pack(gid, index, term))


def encode_release(gid: int, cursor: int) -> bytes:
    return _record(RELEASE, _gid_index.pack(gid, cursor))


def encode_members(gid: int, members: tuple[str, ...]) -> bytes:
    parts = [_gid.pack(gid), _u16.pack(len(members))]
    for member in members:
        raw = member.encode("utf-8")
        parts += (_u16.pack(len(raw)), raw)
    return _record(MEMBERS, b"".join(parts))


def encode_delete_group(gid: int) -> bytes:
    return _record(DELETE_GROUP, _gid.pack(gid))


# --- decoded records (a closed vocabulary) -----------------------------------------------

@dataclass(frozen=True, slots=True)
class GroupRecord:
    gid: int
    uid: str


@dataclass(frozen=True, slots=True)
class EntryRecord:
    gid: int
    entry: LogEntry


@dataclass(frozen=True, slots=True)
class HardStateRecord:
    gid: int
    hard_state: HardState


@dataclass(frozen=True, slots=True)
class TruncateRecord:
    gid: int
    index: int          # entries with index >= this are discarded


@dataclass(frozen=True, slots=True)
class ResetRecord:
    gid: int
    index: int          # the whole log was replaced by a snapshot at (index, term)
    term: int


@dataclass(frozen=True, slots=True)
class ReleaseRecord:
    gid: int
    cursor: int         # entries with index < cursor are dead


@dataclass(frozen=True, slots=True)
class MembersRecord:
    gid: int
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeleteGroupRecord:
    gid: int            # the group is forgotten: files, log, metadata (FORMAT.md)


WalRecord: TypeAlias = (GroupRecord | EntryRecord | HardStateRecord | TruncateRecord
                        | ResetRecord | ReleaseRecord | MembersRecord | DeleteGroupRecord)


def _decode(record_type: int, payload: bytes) -> WalRecord:
    if record_type == ENTRY:
        gid, index, term, kind = _entry.unpack_from(payload)
        return EntryRecord(gid, LogEntry(index, term, kind, payload[_entry.size:]))
    if record_type == GROUP:
        return GroupRecord(_gid.unpack_from(payload)[0], payload[4:].decode("utf-8"))
    if record_type == HARD_STATE:
        gid, term, has_vote = _hard_state.unpack_from(payload)
        vote = payload[_hard_state.size:].decode("utf-8") if has_vote else None
        return HardStateRecord(gid, HardState(term, vote))
    if record_type == TRUNCATE:
        return TruncateRecord(*_gid_index.unpack_from(payload))
    if record_type == RESET:
        return ResetRecord(*_reset.unpack_from(payload))
    if record_type == RELEASE:
        return ReleaseRecord(*_gid_index.unpack_from(payload))
    if record_type == MEMBERS:
        gid, = _gid.unpack_from(payload)
        count, = _u16.unpack_from(payload, 4)
        offset, members = 6, []
        for _ in range(count):
            length, = _u16.unpack_from(payload, offset)
            members.append(payload[offset + 2:offset + 2 + length].decode("utf-8"))
            offset += 2 + length
        return MembersRecord(gid, tuple(members))
    if record_type == DELETE_GROUP:
        if len(payload) != _gid.size:
            raise ValueError(f"DELETE_GROUP payload of {len(payload)} bytes, expected 4")
        return DeleteGroupRecord(_gid.unpack(payload)[0])
    raise ValueError(f"unknown record type {record_type}")


def _decode_entries(payload: bytes, offset: int) -> list[tuple[int, EntryRecord]]:
    """An ENTRIES record's entries, each at the file offset of its length field (the
    first at the record's `offset`): one EntryRecord per entry, as ENTRY records give."""
    gid, index, term, kind, count = _entries.unpack_from(payload)
    if count < 1:
        raise ValueError("ENTRIES record of no entries")
    if index < 1 or index + count > 1 << 64:
        raise ValueError(f"ENTRIES record from index {index} of {count} entries")
    out: list[tuple[int, EntryRecord]] = []
    at, end, unpack_u32 = _entries.size, len(payload), _u32.unpack_from
    base = offset + RECORD_HEADER_SIZE
    for position in range(count):
        if at + 4 > end:
            raise ValueError(f"ENTRIES record ends inside entry {position + 1} of {count}")
        length, = unpack_u32(payload, at)
        if at + 4 + length > end:
            raise ValueError(f"ENTRIES record's entry {position + 1} of {count} "
                             f"({length} bytes) runs past its end")
        out.append((base + at if position else offset,
                    EntryRecord(gid, LogEntry(index + position, term, kind,
                                              payload[at + 4:at + 4 + length]))))
        at += 4 + length
    if at != end:
        raise ValueError(f"ENTRIES record has {end - at} bytes after its {count} entries")
    return out


# --- scanning (recovery) -----------------------------------------------------------------

@dataclass(slots=True)
class WalScan:
    number: int
    path: str
    version: int                           # from the file header (WAL_VERSION if none yet)
    # (byte offset, record), in file order; an ENTRIES record is one EntryRecord per
    # entry, at the offset of its length field (the first at the record's own)
    records: list[tuple[int, WalRecord]]
    valid_end: int                         # bytes up to here are whole records
    size: int                              # file size as found (> valid_end: torn tail)


def scan_wal(path: str, number: int, newest: bool) -> WalScan:
    """Read and check a whole WAL file. `newest`: a torn tail is tolerated (reported in
    `valid_end < size`, the caller truncates); in any older file it is corruption."""
    with open(path, "rb") as handle:
        data = handle.read()
    size = len(data)

    def corrupt(offset: int, detail: str) -> CorruptLogError:
        return CorruptLogError(path, offset, detail)

    if newest and (not data.strip(b"\0") or size < FILE_HEADER_SIZE
                   and encode_file_header(number).startswith(data)):
        return WalScan(number, path, WAL_VERSION, [], 0, size)   # crashed while creating it
    if size < FILE_HEADER_SIZE:
        raise corrupt(0, f"truncated WAL file header ({size} bytes)")
    magic, version, _flags, file_number = FILE_HEADER.unpack_from(data)
    if magic != WAL_MAGIC:
        raise corrupt(0, f"bad magic {magic!r} (expected {WAL_MAGIC!r})")
    if version not in READABLE_VERSIONS:
        raise corrupt(4, f"unknown WAL format version {version} (this build reads "
                         f"{', '.join(map(str, READABLE_VERSIONS))})")
    if int.from_bytes(data[12:16], "big") != _crc32(data[:12]):
        raise corrupt(0, "WAL file header checksum mismatch")
    if file_number != number:
        raise corrupt(8, f"file header says WAL {file_number}, the name says {number}")

    records: list[tuple[int, WalRecord]] = []
    offset = FILE_HEADER_SIZE
    view = memoryview(data)
    unpack_header = RECORD_HEADER.unpack_from
    while offset < size:
        remaining = size - offset
        torn = None
        if remaining < RECORD_HEADER_SIZE:
            torn = "truncated record header"
        else:
            length, record_type, payload_crc = unpack_header(data, offset)
            header_crc = int.from_bytes(data[offset + 9:offset + 13], "big")
            if header_crc != _crc32(view[offset:offset + 9]):
                if not data[offset:].strip(b"\0"):
                    torn = "zero-filled tail"
                else:
                    raise corrupt(offset, "record header checksum mismatch")
            elif RECORD_HEADER_SIZE + length > remaining:
                torn = (f"record of {length} bytes cut off after "
                        f"{remaining - RECORD_HEADER_SIZE}")
        if torn is not None:
            if newest:
                return WalScan(number, path, version, records, offset, size)
            raise corrupt(offset, f"{torn} in a WAL file that is not the newest")
        start = offset + RECORD_HEADER_SIZE
        payload = data[start:start + length]
        if _crc32(payload) != payload_crc:
            raise corrupt(offset, f"{RECORD_NAMES.get(record_type, 'record')} payload "
                                  "checksum mismatch")
        if FIRST_VERSION.get(record_type, 1) > version:
            raise corrupt(offset, f"record type {record_type} "
                                  f"({RECORD_NAMES[record_type]}) in a version {version} WAL file")
        try:
            if record_type == ENTRIES:
                records += _decode_entries(payload, offset)
            else:
                records.append((offset, _decode(record_type, payload)))
        except (ValueError, struct.error, UnicodeDecodeError) as error:
            raise corrupt(offset, f"undecodable record: {error}") from None
        offset = start + length
    return WalScan(number, path, version, records, offset, size)


# --- the open WAL file -------------------------------------------------------------------

class WalFile:
    """The WAL file being appended to: a raw fd (no user-space buffer to lose)."""

    def __init__(self, path: str, number: int, fd: int, size: int,
                 version: int = WAL_VERSION) -> None:
        self.path = path
        self.number = number
        self.size = size
        self.version = version           # < WAL_VERSION: read only, the store rolls over
        self.gids: dict[str, int] = {}   # groups named by a GROUP record in this file
        self._fd = fd

    @classmethod
    def create(cls, path: str, number: int, fsync: bool) -> WalFile:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        header = encode_file_header(number)
        try:
            write_all(fd, header)
            sync_file(fd, fsync)
        except OSError:
            os.close(fd)
            os.remove(path)     # not there yet, as before the call
            raise
        return cls(path, number, fd, len(header))

    @classmethod
    def reopen(cls, scan: WalScan, fsync: bool) -> WalFile:
        """Continue the newest file after recovery, cutting a torn tail off first."""
        fd = os.open(scan.path, os.O_WRONLY)
        end = scan.valid_end
        if end < FILE_HEADER_SIZE:      # torn while being created: start it afresh
            os.ftruncate(fd, 0)
            os.pwrite(fd, encode_file_header(scan.number), 0)
            end = FILE_HEADER_SIZE
            sync_file(fd, fsync)
        elif scan.size != end:
            os.ftruncate(fd, end)
            sync_file(fd, fsync)
        os.lseek(fd, end, os.SEEK_SET)
        wal = cls(scan.path, scan.number, fd, end, scan.version)
        for _offset, record in scan.records:
            if isinstance(record, GroupRecord):
                wal.gids[record.uid] = record.gid
        return wal

    def write(self, records: list[Record]) -> None:
        """The records at the end of the file, by writev: the kernel copies them
        (without the GIL), no joined copy is made."""
        buffers: list[bytes] = []
        for record in records:
            if type(record) is bytes:
                buffers.append(record)
            else:
                buffers += record
        self.size += writev_all(self._fd, buffers)

    def rewind(self, size: int) -> None:
        """Cut the file back to `size` bytes (a batch that failed part way: its
        records are written again from there). Needs no free space."""
        os.ftruncate(self._fd, size)
        os.lseek(self._fd, size, os.SEEK_SET)
        self.size = size

    def sync(self, enabled: bool) -> None:
        sync_file(self._fd, enabled)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    __del__ = close          # an abandoned store must not leak its descriptor


@dataclass(slots=True)
class WalBatch:
    """Records to write to a WAL file and fdatasync once (what `LogStore.seal()`
    took). `write_records()` and `sync()` touch nothing but the file, so the sync may
    run on another thread while the store takes the next batch's appends.

    A batch that failed for want of space (errors.is_disk_full) is written again
    whole: `rewind()` cuts the file back to where the batch began (`start`), then
    `write_records()` and `sync()` again. A failed fdatasync may have dropped the
    pages it could not write, so the records are rewritten, never only resynced."""
    wal: WalFile
    records: list[Record]
    step: int                           # records per write() call
    fsync: bool
    durable: dict[str, int]             # group: last index, durable once written
    deleted: dict[str, list[str]]       # groups whose DELETE_GROUP record is in here
    error: OSError | None = None
    start: int = -1                     # the file's size before the batch (-1: unknown)
    # a sliced rollover's file syncs, run after the fdatasync (rollover.py Steps)
    after: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.start < 0:
            self.start = self.wal.size

    def write(self) -> None:
        self.write_records()
        self.sync()

    def write_records(self) -> None:
        """Into the file (the page cache): on the writer thread (groups/driver.py
        `Round.make_durable`, from node/group_commit.py `Sync.run`)."""
        try:
            for start in range(0, len(self.records), self.step):
                self.wal.write(self.records[start:start + self.step])
        except OSError as error:
            self.error = error
            raise

    def sync(self) -> None:
        """The fdatasync: slow, done on the writer thread."""
        try:
            if self.records:
                self.wal.sync(self.fsync)
            for steps in self.after:
                steps.run(self.fsync)
        except OSError as error:
            self.error = error
            raise

    def rewind(self) -> None:
        """Undo a failed attempt: the file as it was before the batch, ready to write
        the batch again."""
        self.wal.rewind(self.start)
        self.error = None

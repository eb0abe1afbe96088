"""The broker's quorum log on disk, as rows: what `quorumqueue.log` (log_source.py) reads.

Responsibilities: find a node's WAL, segment and snapshot files in its data directory,
and turn one file into rows — one per WAL record, per segment entry, per snapshot —
with the columns of `SCHEMA`. Files are read as they are on disk (physical rows): which
entries are shadowed, truncated or live is the jobs' business (FORMAT.md's replay
rules), not this module's.

How it works: the files are parsed with the broker's own checked readers
(broker/raft/storage: `scan_wal`, `parse_segment`, `read_snapshot_file`), so a
checksum, a version and a torn tail mean here exactly what they mean to recovery.
For COMMAND entries the first bytes of the data name the fifo command (FORMAT.md,
"Quorum-queue entries"; a time envelope is looked through) and, for an Enqueue, the
message body's size.

Invariants:
- A torn tail — where a live broker may be writing: the newest WAL file, a segment's
  index — is never fatal: it becomes one TORN_TAIL row holding the skipped bytes.
- Anything else that fails a check (corruption, an unknown format version) raises
  `LogReadError` naming the file and byte offset, and what to do.
- A file that vanished between listing and reading (a WAL rollover, a compaction,
  a deleted queue) yields no rows: the broker removed it, its entries live on
  elsewhere or are gone for good.

Not here: Spark (log_source.py), the analyses (segment compaction, memory footprint).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote

from ..broker.queues.quorum import TIMED
from ..broker.raft.storage.errors import CorruptLogError
from ..broker.raft.storage.layout import (QUORUM_DIR, SEGMENT_SUFFIX, SEGMENTS_DIR,
                                          SNAPSHOT_FILE, SNAPSHOTS_DIR, WAL_DIR, WAL_SUFFIX,
                                          list_numbered)
from ..broker.raft.storage.segments import SLOT_SIZE, parse_segment
from ..broker.raft.storage.snapshots import read_snapshot_file
from ..broker.raft.storage.wal import (RECORD_HEADER_SIZE, DeleteGroupRecord, EntryRecord,
                                       GroupRecord, HardStateRecord, MembersRecord,
                                       ReleaseRecord, ResetRecord, TruncateRecord, scan_wal)
from ..broker.raft.types import COMMAND, MEMBERSHIP, NOOP

# (name, Spark SQL type): log_source.py builds the Spark and Arrow schemas from this.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("node", "string"),          # the node's name (option `node`, else the data dir's name)
    ("group", "string"),         # the Raft group's uid, authoritative (FORMAT.md)
    ("vhost", "string"),         # from the uid of a quorum queue's group, else null
    ("queue", "string"),
    ("file", "string"),          # path relative to the data directory
    ("file_kind", "string"),     # wal | segment | snapshot
    ("file_number", "long"),
    ("offset", "long"),          # byte offset of the record / slot / file start
    ("record_type", "string"),   # GROUP, ENTRY, ..., DELETE_GROUP; SNAPSHOT; TORN_TAIL
    ("raft_index", "long"),      # ENTRY: its index; TRUNCATE/RESET: index; RELEASE: cursor
    ("term", "long"),
    ("entry_kind", "string"),    # COMMAND | NOOP | MEMBERSHIP
    ("command", "string"),       # the fifo command of a COMMAND entry (ENQUEUE, SETTLE...)
    ("bytes", "long"),           # entry data / snapshot state / skipped torn bytes
    ("disk_bytes", "long"),      # what the row occupies on disk, headers and slot included
    ("body_bytes", "long"),      # ENQUEUE: the message body's size
    ("compacted", "boolean"),    # segment rows: the file's COMPACTED flag
)
COLUMN_NAMES = tuple(name for name, _type in COLUMNS)
Row = tuple

ENTRY_KINDS = {COMMAND: "COMMAND", NOOP: "NOOP", MEMBERSHIP: "MEMBERSHIP"}
COMMANDS = {1: "ENQUEUE", 2: "CHECKOUT", 3: "CANCEL", 4: "SETTLE", 5: "RETURN",
            6: "DISCARD", 7: "PURGE", 8: "DOWN", 9: "DEQUEUE", 10: "LEASE_GROW",
            11: "LEASE_SETTLE", 12: "LEASE_RELEASE", 13: "TICK"}
_ENQUEUE = 1
_ENVELOPE = 9                       # u8 0xFF + u64 leader time
_body_size = struct.Struct(">I")    # after the Enqueue's tag and priority octets


class LogReadError(RuntimeError):
    """A log file that cannot be read: corrupt, or a format version this build does not
    know. The message names the file and byte offset."""


@dataclass(frozen=True, slots=True)
class LogFile:
    """One file to read; picklable (it is a Spark input partition)."""
    data_dir: str
    node: str
    kind: str            # wal | segment | snapshot
    path: str            # relative to data_dir
    number: int
    newest: bool = False  # the newest WAL file when listed: a torn tail is expected


def list_files(data_dir: str, node: str | None = None) -> list[LogFile]:
    """Every WAL, segment and snapshot file of the node whose data directory this is
    (the broker's `--data-dir`, or its `quorum/` folder). Unfinished `.tmp` rewrites are
    left out. Raises LogReadError when there is no quorum log there."""
    data_dir = os.path.abspath(data_dir)
    if os.path.basename(data_dir) == QUORUM_DIR and not os.path.isdir(
            os.path.join(data_dir, QUORUM_DIR)):
        data_dir = os.path.dirname(data_dir)
    root = os.path.join(data_dir, QUORUM_DIR)
    if not os.path.isdir(os.path.join(root, WAL_DIR)):
        raise LogReadError(f"{data_dir} holds no quorum-queue log (no {QUORUM_DIR}/{WAL_DIR}/): "
                           "pass the broker's --data-dir (the folder holding metadata.json)")
    node = node or os.path.basename(data_dir)
    files: list[LogFile] = []
    wals = list_numbered(os.path.join(root, WAL_DIR), WAL_SUFFIX)
    for position, (number, path) in enumerate(wals):
        files.append(LogFile(data_dir, node, "wal", os.path.relpath(path, data_dir), number,
                             newest=position == len(wals) - 1))
    for kind, folder in (("segment", SEGMENTS_DIR), ("snapshot", SNAPSHOTS_DIR)):
        base = os.path.join(root, folder)
        for group_dir in sorted(_listdir(base)):
            directory = os.path.join(base, group_dir)
            if kind == "segment":
                for number, path in list_numbered(directory, SEGMENT_SUFFIX):
                    files.append(LogFile(data_dir, node, kind, os.path.relpath(path, data_dir),
                                         number))
            elif os.path.exists(os.path.join(directory, SNAPSHOT_FILE)):
                files.append(LogFile(data_dir, node, kind, os.path.relpath(
                    os.path.join(directory, SNAPSHOT_FILE), data_dir), 0))
    return files


def read_rows(file: LogFile) -> Iterator[Row]:
    """The rows of one file, in file order (see COLUMNS)."""
    path = os.path.join(file.data_dir, file.path)
    reader = {"wal": _wal_rows, "segment": _segment_rows, "snapshot": _snapshot_rows}[file.kind]
    try:
        yield from reader(file, path)
    except FileNotFoundError:
        return                  # removed by the broker after listing: nothing to read
    except CorruptLogError as error:
        raise LogReadError(f"{error}. The broker would refuse to start on this file too; "
                           "if the node is running, read a copy taken when it was stopped"
                           ) from None


@lru_cache(maxsize=4096)
def queue_of(uid: str) -> tuple[str | None, str | None]:
    """(vhost, queue name) of a quorum queue's group uid `<pct vhost>/<name>/<12 hex>`;
    (None, None) for any other group."""
    vhost, sep, rest = uid.partition("/")
    name, sep2, suffix = rest.rpartition("/")
    if not (sep and sep2 and len(suffix) == 12 and _is_hex(suffix)):
        return None, None
    return unquote(vhost), name


def command_of(data: bytes) -> tuple[str | None, int | None]:
    """(command name, body bytes for an Enqueue) of a COMMAND entry's data."""
    start = _ENVELOPE if data[:1] == bytes((TIMED,)) else 0
    if len(data) <= start:
        return None, None
    tag = data[start]
    body = None
    if tag == _ENQUEUE and len(data) >= start + 2 + _body_size.size:
        body = _body_size.unpack_from(data, start + 2)[0]
    return COMMANDS.get(tag, f"UNKNOWN_{tag}"), body


# ------------------------------------------------------------------ per kind


def _wal_rows(file: LogFile, path: str) -> Iterator[Row]:
    scan = scan_wal(path, file.number, newest=file.newest)
    uids: dict[int, str] = {}
    offsets = [offset for offset, _record in scan.records] + [scan.valid_end]
    for position, (offset, record) in enumerate(scan.records):
        disk = offsets[position + 1] - offset
        payload = disk - RECORD_HEADER_SIZE
        if isinstance(record, GroupRecord):
            uids[record.gid] = record.uid
        uid = uids.get(record.gid, "")
        index = term = entry_kind = command = body = None
        size = payload
        match record:
            case EntryRecord(entry=entry):
                index, term, size = entry.index, entry.term, len(entry.data)
                entry_kind = ENTRY_KINDS.get(entry.kind, str(entry.kind))
                if entry.kind == COMMAND:
                    command, body = command_of(entry.data)
            case TruncateRecord(index=index) | ReleaseRecord(cursor=index):
                pass
            case ResetRecord(index=index, term=term):
                pass
            case HardStateRecord(hard_state=state):
                term = state.term
            case GroupRecord() | MembersRecord() | DeleteGroupRecord():
                pass
        yield _row(file, uid, offset, type(record).__name__.removesuffix("Record"), index,
                   term, entry_kind, command, size, disk, body, None)
    if scan.size > scan.valid_end:
        yield _torn(file, "", scan.valid_end, scan.size - scan.valid_end)


def _segment_rows(file: LogFile, path: str) -> Iterator[Row]:
    parsed = parse_segment(path, file.number, tolerate_torn=True)
    if parsed is None:                 # torn while being created
        yield _torn(file, "", 0, os.path.getsize(path))
        return
    slots, ref = parsed.slots, parsed.ref
    with open(path, "rb") as handle:
        data = handle.read(ref.data_end) if ref.count else b""
    compacted = ref.compacted
    for k in range(ref.count):
        start, length, kind = slots.offsets[k], slots.lengths[k], slots.kinds[k]
        command = body = None
        if kind == COMMAND:
            command, body = command_of(data[start:start + min(length, 16)])
        yield _row(file, parsed.uid, ref.header_size + k * SLOT_SIZE, "ENTRY",
                   slots.indexes[k], slots.terms[k], ENTRY_KINDS.get(kind, str(kind)), command,
                   length, length + SLOT_SIZE, body, compacted)
    if parsed.torn:
        torn_at = ref.header_size + ref.count * SLOT_SIZE
        yield _torn(file, parsed.uid, torn_at, os.path.getsize(path) - ref.data_end)


def _snapshot_rows(file: LogFile, path: str) -> Iterator[Row]:
    uid, meta, state = read_snapshot_file(path)
    yield _row(file, uid, 0, "SNAPSHOT", meta.index, meta.term, None, None, len(state),
               os.path.getsize(path), None, None)


# ------------------------------------------------------------------ helpers


def _row(file: LogFile, uid: str, offset: int, record_type: str, index, term, entry_kind,
         command, size, disk, body, compacted) -> Row:
    vhost, queue = queue_of(uid) if uid else (None, None)
    return (file.node, uid or None, vhost, queue, file.path, file.kind, file.number, offset,
            _RECORD_TYPES.get(record_type, record_type), index, term, entry_kind, command,
            size, disk, body, compacted)


def _torn(file: LogFile, uid: str, offset: int, size: int) -> Row:
    return _row(file, uid, offset, "TORN_TAIL", None, None, None, None, size, size, None, None)


_RECORD_TYPES = {"Group": "GROUP", "Entry": "ENTRY", "HardState": "HARD_STATE",
                 "Truncate": "TRUNCATE", "Reset": "RESET", "Release": "RELEASE",
                 "Members": "MEMBERS", "DeleteGroup": "DELETE_GROUP"}


def _listdir(path: str) -> list[str]:
    try:
        return [name for name in os.listdir(path) if os.path.isdir(os.path.join(path, name))]
    except FileNotFoundError:
        return []


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)

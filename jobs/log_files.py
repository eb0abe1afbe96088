"""The broker's quorum log on disk, as rows: what `quorumqueue.log` (log_source.py) reads.

Responsibilities: find a node's WAL, segment and snapshot files in its data directory,
and turn one file into rows — one per WAL record (an ENTRIES record, WAL version 3:
one per entry, at the offset of its length field, the first at the record's, each
row's disk bytes its share of the record), per segment entry, per snapshot — with
the columns of `COLUMNS`: as tuples (`read_rows`) or as Arrow record batches
(`read_batches`, what Spark reads). Files are read as they are on disk (physical rows): which
entries are shadowed, truncated or live is the jobs' business (FORMAT.md's replay
rules), not this module's.

How it works: the files are parsed with the broker's own checked readers
(broker/raft/storage: `scan_wal`, `parse_segment`, `read_snapshot_file`), so a
checksum, a version and a torn tail mean here exactly what they mean to recovery.
For COMMAND entries the first bytes of the data name the fifo command (FORMAT.md,
"Quorum-queue entries"; a forwarded command's identity and a time envelope are
looked through) and, for an Enqueue, the
message body's size. `read_batches` builds a segment's rows column-wise instead
(nearly all of a log's bytes are segments): `scan_segment` (storage/scan.py) checks
the slots as `parse_segment` does, the commands come from the entries' first bytes
by numpy indexing, and Arrow gets whole arrays — no Python object per entry.
`read_rows` stays the reference: the tests hold both to the same rows, torn tails
and errors.

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

import numpy as np
import pyarrow as pa

from ..broker.fifo.envelope import TIMED, TIMED_HEAD
from ..broker.raft.forwarded import FORWARDED
from ..broker.raft.forwarded import HEAD_SIZE as _FORWARDED
from ..broker.raft.storage.errors import CorruptLogError
from ..broker.raft.storage.layout import (QUORUM_DIR, SEGMENT_SUFFIX, SEGMENTS_DIR,
                                          SNAPSHOT_FILE, SNAPSHOTS_DIR, WAL_DIR, WAL_SUFFIX,
                                          list_numbered)
from ..broker.raft.storage.scan import scan_segment
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
_ARROW_TYPES = {"string": pa.string(), "long": pa.int64(), "boolean": pa.bool_()}
ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in COLUMNS])
Row = tuple

ENTRY_KINDS = {COMMAND: "COMMAND", NOOP: "NOOP", MEMBERSHIP: "MEMBERSHIP"}
COMMANDS = {1: "ENQUEUE", 2: "CHECKOUT", 3: "CANCEL", 4: "SETTLE", 5: "RETURN",
            6: "DISCARD", 7: "PURGE", 8: "DOWN", 9: "DEQUEUE", 10: "LEASE_GROW",
            11: "LEASE_SETTLE", 12: "LEASE_RELEASE", 13: "TICK", 14: "UPDATE_CONFIG",
            15: "UPDATE_CONFIG", 16: "DLX_CHECKOUT", 17: "DLX_SETTLE", 18: "UPDATE_CONFIG",
            19: "NODE_DOWN", 20: "NODE_UP", 21: "ENQUEUE"}
_ENQUEUE = 1
_BCC_ENQUEUE = 21                  # an Enqueue keeping its BCC keys after the body
_ENVELOPE = TIMED_HEAD.size        # u8 0xFF + u64 leader time
_body_size = struct.Struct(">I")    # after the Enqueue's tag and priority octets
# what command_of looks at: an identity, a time envelope, a tag, a priority, a body size
HEAD_BYTES = _FORWARDED + _ENVELOPE + 2 + _body_size.size


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
    """The rows of one file, in file order (see COLUMNS). The reference reader: every
    file through the broker's own parsers, one tuple per row."""
    path = os.path.join(file.data_dir, file.path)
    reader = {"wal": _wal_rows, "segment": _segment_rows, "snapshot": _snapshot_rows}[file.kind]
    yield from _checked(reader(file, path))


def read_batches(file: LogFile, max_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    """The rows of `read_rows(file)`, in the same order, as Arrow record batches of at
    most `max_rows` rows (schema `ARROW_SCHEMA`). Segment entries are built column-wise
    from the slot index (broker/raft/storage/scan.py, which checks slots exactly as
    `parse_segment` does); WAL records and snapshots go through their rows."""
    path = os.path.join(file.data_dir, file.path)
    if file.kind == "segment":
        batches = _segment_batches(file, path)
    else:
        reader = {"wal": _wal_rows, "snapshot": _snapshot_rows}[file.kind]
        batches = _row_batches(reader(file, path), max_rows)
    for batch in _checked(batches):
        for start in range(0, batch.num_rows, max_rows):
            yield batch.slice(start, max_rows)


def _checked(items: Iterator) -> Iterator:
    try:
        yield from items
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
    """(command name, body bytes for an Enqueue) of a COMMAND entry's data (its first
    HEAD_BYTES are enough)."""
    start = _FORWARDED if data[:1] == bytes((FORWARDED,)) else 0
    if data[start:start + 1] == bytes((TIMED,)):
        start += _ENVELOPE
    if len(data) <= start:
        return None, None
    tag = data[start]
    body = None
    if tag in (_ENQUEUE, _BCC_ENQUEUE) and len(data) >= start + 2 + _body_size.size:
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
            command, body = command_of(data[start:start + min(length, HEAD_BYTES)])
        yield _row(file, parsed.uid, ref.header_size + k * SLOT_SIZE, "ENTRY",
                   slots.indexes[k], slots.terms[k], ENTRY_KINDS.get(kind, str(kind)), command,
                   length, length + SLOT_SIZE, body, compacted)
    if parsed.torn:
        torn_at = ref.header_size + ref.count * SLOT_SIZE
        yield _torn(file, parsed.uid, torn_at, os.path.getsize(path) - ref.data_end)


def _segment_batches(file: LogFile, path: str) -> Iterator[pa.RecordBatch]:
    """_segment_rows, column-wise: one batch of the used slots, then the torn row."""
    scan = scan_segment(path)
    if scan is None:                   # torn while being created
        yield from _row_batches([_torn(file, "", 0, os.path.getsize(path))])
        return
    count, uid = scan.count, scan.uid
    if count:
        if int(scan.indexes[-1]) >= 1 << 63 or int(scan.terms.max()) >= 1 << 63:
            raise LogReadError(f"{path}: a raft index or term above 2^63 - 1 does not fit "
                               "the long columns raft_index and term")
        vhost, queue = queue_of(uid)
        lengths = scan.lengths.astype(np.int64)
        commands, bodies = _commands_of(scan.content, scan.offsets, lengths,
                                        scan.kinds == COMMAND)
        columns = {
            "node": _repeat(file.node, count), "group": _repeat(uid or None, count),
            "vhost": _repeat(vhost, count), "queue": _repeat(queue, count),
            "file": _repeat(file.path, count), "file_kind": _repeat(file.kind, count),
            "file_number": _repeat(file.number, count, pa.int64()),
            "offset": pa.array(scan.header_size + SLOT_SIZE * np.arange(count, dtype=np.int64)),
            "record_type": _repeat("ENTRY", count),
            "raft_index": pa.array(scan.indexes.astype(np.int64)),
            "term": pa.array(scan.terms.astype(np.int64)),
            "entry_kind": _names(scan.kinds, lambda kind: ENTRY_KINDS.get(kind, str(kind))),
            "command": commands, "bytes": pa.array(lengths),
            "disk_bytes": pa.array(lengths + SLOT_SIZE), "body_bytes": bodies,
            "compacted": _repeat(scan.compacted, count, pa.bool_()),
        }
        yield pa.RecordBatch.from_arrays([columns[name] for name in COLUMN_NAMES],
                                         schema=ARROW_SCHEMA)
    if scan.torn:
        yield from _row_batches([_torn(file, uid, scan.header_size + count * SLOT_SIZE,
                                       len(scan.content) - scan.data_end)])


def _commands_of(content: bytes, offsets: np.ndarray, lengths: np.ndarray,
                 is_command: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """command_of for every entry at once: (command names, Enqueue body sizes), null
    where command_of answers None. `offsets`/`lengths` locate each entry's data in
    `content`; only the first HEAD_BYTES of an entry are looked at, as by command_of."""
    buf = np.frombuffer(content, dtype=np.uint8)
    starts = offsets.astype(np.int64)
    nonempty = is_command & (lengths > 0)
    forwarded = np.zeros(len(starts), dtype=bool)
    forwarded[nonempty] = buf[starts[nonempty]] == FORWARDED
    skip = np.where(forwarded, _FORWARDED, 0)
    enveloped = is_command & (lengths > skip)
    timed = np.zeros(len(starts), dtype=bool)
    timed[enveloped] = buf[(starts + skip)[enveloped]] == TIMED
    skip = skip + np.where(timed, _ENVELOPE, 0)
    tagged = is_command & (lengths > skip)
    tags = np.zeros(len(starts), dtype=np.int64)
    tags[tagged] = buf[(starts + skip)[tagged]]
    enqueue = (tagged & ((tags == _ENQUEUE) | (tags == _BCC_ENQUEUE))
               & (lengths >= skip + 2 + _body_size.size))
    bodies = np.zeros(len(starts), dtype=np.int64)
    at = (starts + skip + 2)[enqueue]
    for k in range(_body_size.size):        # big-endian u32 after tag and priority
        bodies[enqueue] = (bodies[enqueue] << 8) | buf[at + k]
    names = _names(tags, lambda tag: COMMANDS.get(tag, f"UNKNOWN_{tag}"), tagged)
    return names, pa.array(bodies, mask=~enqueue)


def _names(codes: np.ndarray, name_of, valid: np.ndarray | None = None) -> pa.Array:
    """A string column: name_of(code) per row (null where not `valid`), each distinct
    code named once."""
    distinct, positions = np.unique(codes, return_inverse=True)
    if len(distinct) == 1 and (valid is None or valid.all()):
        return _repeat(name_of(int(distinct[0])), len(codes))
    dictionary = pa.array([name_of(int(code)) for code in distinct], type=pa.string())
    mask = None if valid is None else ~valid
    return dictionary.take(pa.array(positions.astype(np.int32), mask=mask))


def _repeat(value, count: int, kind: pa.DataType = pa.string()) -> pa.Array:
    """`count` times `value` (None: nulls). A string is laid out directly in Arrow's
    buffers: offsets 0, n, 2n, ... over the value repeated (pa.repeat is ~60 ns a row)."""
    if value is None or kind != pa.string():
        return pa.repeat(pa.scalar(value, type=kind), count)
    raw = value.encode("utf-8")
    offsets = np.arange(count + 1, dtype=np.int64) * len(raw)
    if offsets[-1] < 1 << 31:
        return pa.Array.from_buffers(pa.string(), count, [
            None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(raw * count)])
    return pa.repeat(pa.scalar(value, type=kind), count)


def _row_batches(rows, max_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= max_rows:
            yield _batch_of(chunk)
            chunk = []
    if chunk:
        yield _batch_of(chunk)


def _batch_of(rows: list[Row]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(column, type=ARROW_SCHEMA.field(k).type)
         for k, column in enumerate(zip(*rows))], schema=ARROW_SCHEMA)


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

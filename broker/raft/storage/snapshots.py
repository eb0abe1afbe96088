"""Snapshot files: the latest state-machine snapshot of each group.

Responsibilities: write a snapshot atomically and read it back, checked.

How it works: `snapshot.dat` holds a header (magic, version, the group uid, the
SnapshotMeta: index, term, members), the state's length and crc32, a crc32 over all of
that, then the state bytes. It is written to `snapshot.dat.tmp`, fsynced, renamed over
`snapshot.dat`, and the directory is fsynced: a crash leaves the old snapshot or the
new one, never a mix. Byte layout: FORMAT.md, "Snapshot file".

Invariants: a snapshot file that exists is complete; once `write_snapshot_file`
returned, the snapshot survives a crash.

Not here: what the state bytes mean (the state machine), what a snapshot allows to
delete (log_store.py).
"""

from __future__ import annotations

import os
import struct

from zlib_ng.zlib_ng import crc32

from ..types import SnapshotMeta
from .errors import CorruptLogError
from .layout import SNAPSHOT_FILE, TMP_SUFFIX, fsync_dir, sync_file, write_all

SNAPSHOT_MAGIC = b"QQSN"
SNAPSHOT_VERSION = 1

_prefix = struct.Struct(">4sHHI")      # magic, version, flags, meta length
_meta_fixed = struct.Struct(">QQH")    # index, term, member count
_state_info = struct.Struct(">QI")     # state length, state crc32
_u16 = struct.Struct(">H")
_crc32 = crc32   # zlib's CRC-32, computed by zlib-ng (pyproject.toml says why)


def encode_snapshot(uid: str, meta: SnapshotMeta, state: bytes) -> bytes:
    raw_uid = uid.encode("utf-8")
    parts = [_u16.pack(len(raw_uid)), raw_uid, _meta_fixed.pack(meta.index, meta.term,
                                                                len(meta.members))]
    for member in meta.members:
        raw = member.encode("utf-8")
        parts += (_u16.pack(len(raw)), raw)
    meta_block = b"".join(parts)
    head = (_prefix.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, 0, len(meta_block)) + meta_block
            + _state_info.pack(len(state), _crc32(state)))
    return head + _crc32(head).to_bytes(4, "big") + state


def decode_snapshot(path: str, data: bytes, with_state: bool = True
                    ) -> tuple[str, SnapshotMeta, bytes]:
    def corrupt(offset: int, detail: str) -> CorruptLogError:
        return CorruptLogError(path, offset, detail)

    if len(data) < _prefix.size:
        raise corrupt(0, f"truncated snapshot header ({len(data)} bytes)")
    magic, version, _flags, meta_length = _prefix.unpack_from(data)
    if magic != SNAPSHOT_MAGIC:
        raise corrupt(0, f"bad magic {magic!r} (expected {SNAPSHOT_MAGIC!r})")
    if version != SNAPSHOT_VERSION:
        raise corrupt(4, f"unknown snapshot format version {version} (this build reads "
                         f"{SNAPSHOT_VERSION})")
    head_end = _prefix.size + meta_length + _state_info.size
    if len(data) < head_end + 4:
        raise corrupt(0, "truncated snapshot header")
    if _crc32(data[:head_end]) != int.from_bytes(data[head_end:head_end + 4], "big"):
        raise corrupt(0, "snapshot header checksum mismatch")
    offset = _prefix.size
    uid_length, = _u16.unpack_from(data, offset)
    uid = data[offset + 2:offset + 2 + uid_length].decode("utf-8")
    offset += 2 + uid_length
    index, term, count = _meta_fixed.unpack_from(data, offset)
    offset += _meta_fixed.size
    members = []
    for _ in range(count):
        length, = _u16.unpack_from(data, offset)
        members.append(data[offset + 2:offset + 2 + length].decode("utf-8"))
        offset += 2 + length
    state_length, state_crc = _state_info.unpack_from(data, _prefix.size + meta_length)
    state = b""
    if with_state:
        state = data[head_end + 4:]
        if len(state) != state_length:
            raise corrupt(head_end + 4, f"state is {len(state)} bytes, header says "
                                        f"{state_length}")
        if _crc32(state) != state_crc:
            raise corrupt(head_end + 4, "snapshot state checksum mismatch")
    return uid, SnapshotMeta(index, term, tuple(members)), state


def write_snapshot_file(directory: str, uid: str, meta: SnapshotMeta, state: bytes,
                        fsync: bool, failpoint=None) -> str:
    tmp = prepare_snapshot_file(directory, uid, meta, state, fsync)
    return commit_snapshot_file(directory, tmp, failpoint, fsync)


def prepare_snapshot_file(directory: str, uid: str, meta: SnapshotMeta, state: bytes,
                          fsync: bool) -> str:
    """The snapshot, whole and fsynced, in `snapshot.dat.tmp` of `directory` (created
    if needed); returns that path, for `commit_snapshot_file`. On any error (a full
    disk) the tmp file is removed again before the error is raised."""
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    if created:
        fsync_dir(os.path.dirname(directory), fsync)
    tmp = os.path.join(directory, SNAPSHOT_FILE) + TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, encode_snapshot(uid, meta, state))
        sync_file(fd, fsync)
    except OSError:
        os.remove(tmp)
        raise
    finally:
        os.close(fd)
    return tmp


def commit_snapshot_file(directory: str, tmp: str, failpoint=None, fsync: bool = True) -> str:
    """Rename a prepared snapshot over `snapshot.dat` and make that durable."""
    if failpoint is not None:
        failpoint("snapshot.before_rename")
    path = os.path.join(directory, SNAPSHOT_FILE)
    os.replace(tmp, path)
    fsync_dir(directory, fsync)
    return path


def read_snapshot_file(path: str, with_state: bool = True
                       ) -> tuple[str, SnapshotMeta, bytes]:
    with open(path, "rb") as handle:
        data = handle.read()
    return decode_snapshot(path, data, with_state)

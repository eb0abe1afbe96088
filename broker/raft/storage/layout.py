"""Where the log storage keeps its files, and how a group uid becomes a directory name.

    DATA_DIR/quorum/wal/00000001.wal                       one WAL per node
    DATA_DIR/quorum/segments/<group-dir>/00000001.segment  per group, oldest first
    DATA_DIR/quorum/snapshots/<group-dir>/snapshot.dat     per group, the latest one

File numbers are decimal, zero-padded to at least 8 digits; order is numeric. Files
ending in `.tmp` are unfinished rewrites and are deleted on open. A deleted group's two
directories are removed whole (`remove_group_dirs`).

Invariant: `group_dir_name` is a pure function of the uid, so it is stable across
versions; the uid itself is recorded inside every file (readers should trust that, not
the directory name, which is lossy for uids longer than 200 bytes once encoded).
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable

QUORUM_DIR = "quorum"
WAL_DIR = "wal"
SEGMENTS_DIR = "segments"
SNAPSHOTS_DIR = "snapshots"
WAL_SUFFIX = ".wal"
SEGMENT_SUFFIX = ".segment"
SNAPSHOT_FILE = "snapshot.dat"
TMP_SUFFIX = ".tmp"

_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.")
_MAX_DIR_NAME = 200


def check_uid(uid: str) -> bytes:
    if not isinstance(uid, str) or not uid:
        raise ValueError(f"a group uid must be a non-empty string, got {uid!r}")
    raw = uid.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ValueError(f"group uid longer than 65535 bytes: {uid[:40]!r}...")
    return raw


def group_dir_name(uid: str) -> str:
    """Bytes of the UTF-8 uid in [A-Za-z0-9-.] are kept (a leading '.' is not); every
    other byte becomes '_' + two lowercase hex digits. "%2F/orders" -> "_252F_2forders".
    Longer than 200 characters: the first 160, '~', then 32 hex digits of sha256(uid)."""
    raw = check_uid(uid)
    name = "".join(chr(b) if b in _SAFE and not (i == 0 and b == 0x2E) else f"_{b:02x}"
                   for i, b in enumerate(raw))
    if len(name) > _MAX_DIR_NAME:
        name = name[:160] + "~" + hashlib.sha256(raw).hexdigest()[:32]
    return name


def numbered_name(number: int, suffix: str) -> str:
    return f"{number:08d}{suffix}"


def list_numbered(directory: str, suffix: str) -> list[tuple[int, str]]:
    """(number, path) of files named <digits><suffix>, in numeric order."""
    found = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        stem = name[:-len(suffix)]
        if name.endswith(suffix) and stem.isdigit():
            found.append((int(stem), os.path.join(directory, name)))
    found.sort()
    return found


def remove_tmp_files(directory: str) -> None:
    for name in os.listdir(directory):
        if name.endswith(TMP_SUFFIX):
            os.remove(os.path.join(directory, name))


def remove_group_dirs(root: str, dir_name: str, fsync: bool,
                      failpoint: Callable[[str], None] | None = None) -> None:
    """Remove a deleted group's segments/<dir> and snapshots/<dir>, files and all, each
    removal made durable (the directory fsynced after its files are gone, the parent
    after the directory is). Idempotent: a crash part-way leaves a subset, and running
    it again removes the rest."""
    for kind in (SEGMENTS_DIR, SNAPSHOTS_DIR):
        parent = os.path.join(root, kind)
        directory = os.path.join(parent, dir_name)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            continue
        for name in sorted(names):
            os.remove(os.path.join(directory, name))
        fsync_dir(directory, fsync)
        if failpoint is not None:
            failpoint("delete.files_removed")
        os.rmdir(directory)
        fsync_dir(parent, fsync)


def fsync_dir(path: str, enabled: bool = True) -> None:
    """Make creations, renames and deletions in `path` durable."""
    if not enabled:
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_file(fd: int, enabled: bool = True) -> None:
    if enabled:
        os.fdatasync(fd)


def write_all(fd: int, data: bytes) -> None:
    """All of `data` at the descriptor's position: a short write (a file system
    nearly full) is continued, and the call that finds no room raises ENOSPC."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


def writev_all(fd: int, buffers: list[bytes]) -> int:
    """All of `buffers`, in order, at the descriptor's position (as `write_all`);
    returns the bytes written. At most IOV_MAX buffers per call; a short write is
    continued from where it stopped."""
    total = position = offset = 0      # buffers[position][offset:] is next
    count = len(buffers)
    while position < count:
        batch = buffers[position:position + _IOV_MAX]
        if offset:
            batch[0] = memoryview(buffers[position])[offset:]
        written = os.writev(fd, batch)
        total += written
        if written == sum(map(len, batch)):  # the usual case: all of them
            position, offset = position + len(batch), 0
            continue
        while position < count and written >= len(buffers[position]) - offset:
            written -= len(buffers[position]) - offset
            position, offset = position + 1, 0
        offset += written
    return total


def pwritev_all(fd: int, buffers: list[bytes], offset: int) -> int:
    """All of `buffers`, in order, from `offset` (as `writev_all`, positioned: no
    joined copy is made); returns the bytes written."""
    total = position = skip = 0        # buffers[position][skip:] is next
    count = len(buffers)
    while position < count:
        batch = buffers[position:position + _IOV_MAX]
        if skip:
            batch[0] = memoryview(buffers[position])[skip:]
        written = os.pwritev(fd, batch, offset + total)
        total += written
        if written == sum(map(len, batch)):  # the usual case: all of them
            position, skip = position + len(batch), 0
            continue
        while position < count and written >= len(buffers[position]) - skip:
            written -= len(buffers[position]) - skip
            position, skip = position + 1, 0
        skip += written
    return total


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """All of `data` at `offset` (as `write_all`)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def reserve(fd: int, offset: int, length: int) -> None:
    """Allocate the blocks of [offset, offset + length) before writing there, so that a
    full disk fails here, with nothing written (the range reads as zeros), rather
    than half way through a write. Extends the file if the range ends past it."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise       # a file system that cannot allocate ahead: the write tells


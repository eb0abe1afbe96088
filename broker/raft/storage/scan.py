"""Segment files read column-wise, for readers that scan whole files (the Spark jobs).

Responsibilities: check a segment's header and index exactly as `parse_segment(...,
tolerate_torn=True)` does (segments.py), and return the used slots as numpy columns
together with the file's bytes, so a scan of a million entries costs a few array
operations instead of a Python loop per slot.

How it works: the file is read with one `read()` (one open file: a rename of a
rewrite cannot mix two versions). The index is viewed as a structured big-endian
numpy array (FORMAT.md, "Segment file": 40-byte slots). Every slot is checked at once
against the slot before it — slot CRC, raft index order, terms, back-to-back data
offsets within the file — and the first all-zero slot or failing slot ends the used
prefix. That is the same prefix the reference loop accepts: each slot before the first
failure was accepted, so "the previous accepted slot" is simply the previous slot.
Slot CRCs are computed in bulk with the linearity of CRC-32 (below).

Invariants:
- read only: nothing here writes, renames or truncates; the broker's recovery keeps
  using `parse_segment`, which this module must agree with (tests compare the two on
  files LogStore wrote, torn and corrupted);
- a torn tail (a failing slot, or used slots after an empty one) ends the columns and
  sets `torn`; a bad magic or an unknown format version raises `CorruptLogError`.

Not here: the reference parser and the write paths (segments.py), what the entries
mean (jobs/log_files.py). numpy is imported here only: the broker never loads this.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

import numpy as np

from .errors import CorruptLogError
from .segments import (FLAG_COMPACTED, HEADER, SEGMENT_MAGIC, SEGMENT_VERSION, SLOT_SIZE,
                       header_size)

# FORMAT.md, "Segment file", index slot: big-endian fields, 40 bytes.
SLOT_DTYPE = np.dtype([("index", ">u8"), ("term", ">u8"), ("offset", ">u8"),
                       ("length", ">u4"), ("crc", ">u4"), ("kind", "u1"),
                       ("reserved", "V3"), ("slot_crc", ">u4")])
assert SLOT_DTYPE.itemsize == SLOT_SIZE
_CHECKED = SLOT_SIZE - 4          # the slot CRC covers bytes 0..35


@dataclass(frozen=True, slots=True)
class SegmentColumns:
    """A segment's used slots as columns (row k = slot k), and the file they index."""
    uid: str
    compacted: bool
    header_size: int              # slot k starts at header_size + 40 k
    data_end: int                 # just past the last used slot's data
    indexes: np.ndarray           # uint64, strictly increasing
    terms: np.ndarray             # uint64, never decreasing
    offsets: np.ndarray           # uint64, absolute offsets of the entry data, back to back
    lengths: np.ndarray           # uint32
    data_crcs: np.ndarray         # uint32, as stored (not checked here, as in parse_segment)
    kinds: np.ndarray             # uint8
    torn: bool                    # the used slots end in a torn write
    content: bytes                # the whole file as read; len() is its size

    @property
    def count(self) -> int:
        return len(self.indexes)


def scan_segment(path: str) -> SegmentColumns | None:
    """A segment's header and used slots, checked. None: torn while being created (the
    cases where `parse_segment(..., tolerate_torn=True)` returns None)."""
    with open(path, "rb") as handle:
        content = handle.read()
    size = len(content)
    if size < HEADER.size:
        return None
    magic, version, flags, slot_count, uid_length = HEADER.unpack_from(content)
    if magic != SEGMENT_MAGIC:
        if not content[:HEADER.size].strip(b"\0"):
            return None
        raise CorruptLogError(path, 0, f"bad magic {magic!r} (expected {SEGMENT_MAGIC!r})")
    if version != SEGMENT_VERSION:
        raise CorruptLogError(path, 4, f"unknown segment format version {version} "
                                       f"(this build reads {SEGMENT_VERSION})")
    hsize = header_size(uid_length)
    if size < hsize or zlib.crc32(content[:hsize - 4]) != int.from_bytes(
            content[hsize - 4:hsize], "big"):
        return None
    uid = content[HEADER.size:hsize - 4].decode("utf-8")
    region = content[hsize:hsize + slot_count * SLOT_SIZE]
    region += bytes(slot_count * SLOT_SIZE - len(region))     # a hole reads as zeros
    data_start = hsize + slot_count * SLOT_SIZE
    compacted = bool(flags & FLAG_COMPACTED)
    slots = np.frombuffer(region, dtype=SLOT_DTYPE)
    count, torn = _used_prefix(slots, region, data_start, size, compacted)
    used = slots[:count]
    offsets = used["offset"].astype(np.uint64)
    lengths = used["length"].astype(np.uint32)
    data_end = int(offsets[-1]) + int(lengths[-1]) if count else data_start
    return SegmentColumns(uid, compacted, hsize, data_end, used["index"].astype(np.uint64),
                          used["term"].astype(np.uint64), offsets, lengths,
                          used["crc"].astype(np.uint32), used["kind"].copy(), torn, content)


def _used_prefix(slots: np.ndarray, region: bytes, data_start: int, size: int,
                 compacted: bool) -> tuple[int, bool]:
    """(used slots, torn): the slots parse_segment's loop accepts, and whether it stops
    at a torn write rather than at the end of the used prefix."""
    if not len(slots):
        return 0, False
    index, term = slots["index"].astype(np.uint64), slots["term"].astype(np.uint64)
    offset, length = slots["offset"].astype(np.uint64), slots["length"].astype(np.uint64)
    raw = np.frombuffer(region, dtype=np.uint8).reshape(-1, SLOT_SIZE)
    empty = ~raw.any(axis=1)
    previous_index = np.concatenate(([0], index[:-1])).astype(np.uint64)
    previous_term = np.concatenate(([0], term[:-1])).astype(np.uint64)
    expected = np.concatenate(([data_start], offset[:-1] + length[:-1])).astype(np.uint64)
    bad = slot_crcs(raw) != slots["slot_crc"]
    bad |= index <= previous_index
    if not compacted:
        bad[1:] |= index[1:] != previous_index[1:] + 1
    bad |= term < previous_term
    # offset == expected bounds offset by a previous slot's end (<= size), so the sum
    # below cannot wrap around where it decides anything
    bad |= (offset != expected) | (offset + length > size)
    stops = np.flatnonzero(empty | bad)
    if not len(stops):
        return len(slots), False
    stop = int(stops[0])
    if bad[stop] and not empty[stop]:
        return stop, True
    return stop, bool(raw[stop:].any())       # used slots after an empty one: torn


# --- CRC-32 of every slot at once ------------------------------------------------------
# CRC-32 is affine over GF(2): for messages of one length n,
#     crc(m) = crc(zeros(n)) ^ XOR over positions i of (crc(m_i at i, zeros elsewhere)
#                                                       ^ crc(zeros(n))).
# So a slot's CRC is a constant XOR one table lookup per pair of bytes. The tables
# are built once with zlib (the reference) and the result is checked against it in
# the tests.

def _pair_tables(length: int) -> tuple[int, np.ndarray]:
    zero_crc = zlib.crc32(bytes(length))
    pairs = length // 2
    tables = np.empty((pairs, 1 << 16), dtype=np.uint32)
    # byte tables first (256 zlib calls per position), then pairs by XOR
    single = np.empty((length, 256), dtype=np.uint32)
    message = bytearray(length)
    for position in range(length):
        for value in range(256):
            message[position] = value
            single[position, value] = zlib.crc32(message) ^ zero_crc
        message[position] = 0
    for pair in range(pairs):
        high, low = single[2 * pair], single[2 * pair + 1]
        tables[pair] = (high[:, None] ^ low[None, :]).reshape(-1)
    return zero_crc, tables


_ZERO_CRC, _TABLES = None, None


def slot_crcs(raw: np.ndarray) -> np.ndarray:
    """zlib.crc32 of bytes 0..35 of each row of `raw` (uint8, n x 40), as uint32."""
    global _ZERO_CRC, _TABLES
    if _TABLES is None:
        _ZERO_CRC, _TABLES = _pair_tables(_CHECKED)
    words = np.ascontiguousarray(raw[:, :_CHECKED]).view(">u2").astype(np.intp)
    crc = np.full(len(raw), _ZERO_CRC, dtype=np.uint32)
    for pair in range(_CHECKED // 2):
        crc ^= _TABLES[pair][words[:, pair]]
    return crc

"""scan.py agrees with the reference parser: `scan_segment` accepts exactly the slots
that `parse_segment(..., tolerate_torn=True)` accepts (FORMAT.md, "Segment file"; and
"Torn tail versus corruption"), on segments LogStore wrote — full, partly used with a
hole of unused slots, compacted — as written, torn and corrupted; and the bulk slot
CRCs equal zlib's.
"""

from __future__ import annotations

import glob
import os
import shutil
import struct
import tempfile
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumqueue.broker.raft.storage import LogStore
from quorumqueue.broker.raft.storage.errors import CorruptLogError
from quorumqueue.broker.raft.storage.scan import scan_segment, slot_crcs
from quorumqueue.broker.raft.storage.segments import HEADER, SLOT, SLOT_SIZE, parse_segment
from quorumqueue.broker.raft.types import COMMAND, MEMBERSHIP, NOOP, LogEntry, SnapshotMeta

from .conftest import scratch_dir
from .support import G1, G2, config, make_entries


def reference(path: str):
    """What parse_segment says, in comparable form."""
    try:
        parsed = parse_segment(path, 1, tolerate_torn=True)
    except CorruptLogError as error:
        return ("corrupt", error.offset, error.detail)
    if parsed is None:
        return None
    s, ref = parsed.slots, parsed.ref
    return (parsed.uid, ref.compacted, ref.header_size, ref.data_end, list(s.indexes),
            list(s.terms), list(s.offsets), list(s.lengths), list(s.crcs), list(s.kinds),
            parsed.torn)


def scanned(path: str):
    """What scan_segment says, in the same form."""
    try:
        scan = scan_segment(path)
    except CorruptLogError as error:
        return ("corrupt", error.offset, error.detail)
    if scan is None:
        return None
    return (scan.uid, scan.compacted, scan.header_size, scan.data_end,
            *(column.tolist() for column in (scan.indexes, scan.terms, scan.offsets,
                                             scan.lengths, scan.data_crcs, scan.kinds)),
            scan.torn)


def write_segments(directory: str) -> dict[str, str]:
    """Segments as a node writes them: G1 with 8-slot segments, two compacted below a
    snapshot, the newest partly used; G2 with varied kinds, terms and sizes (some
    empty entries)."""
    store = LogStore(directory, config(segment_max_entries=8))
    store.append(G1, make_entries(G1, 1, 41, size=64))
    store.roll_over()
    store.write_snapshot(G1, SnapshotMeta(32, 1, ()), b"s")
    store.compact(G1, {2, 3, 7, 26, 27, 32})     # two compacted, each >= 2 entries
    store.append(G1, make_entries(G1, 41, 44, term=2, size=100))
    kinds = (COMMAND, NOOP, MEMBERSHIP)
    store.append(G2, [LogEntry(i, 1 + i // 5, kinds[i % 3], bytes([i]) * (i * 7 % 23))
                      for i in range(1, 14)])
    store.roll_over()
    store.close()
    paths = sorted(glob.glob(os.path.join(directory, "quorum", "segments", "*", "*")))
    named = {}
    for path in paths:
        parsed = parse_segment(path, 1, tolerate_torn=False)
        key = ("compacted" if parsed.ref.compacted
               else "partial" if parsed.ref.count < parsed.ref.slot_count else "full")
        named.setdefault(f"{parsed.uid[:3]}-{key}", path)
    return named


@pytest.fixture(scope="module")
def segments():
    directory = scratch_dir()
    try:
        yield {name: open(path, "rb").read() for name, path in
               write_segments(directory).items()}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def layout(content: bytes) -> tuple[int, int]:
    """(H, S): where the index starts and how many slots it has."""
    _magic, _version, _flags, slot_count, uid_length = HEADER.unpack_from(content)
    return HEADER.size + uid_length + 4, slot_count


def used(content: bytes) -> int:
    hsize, slot_count = layout(content)
    return next((k for k in range(slot_count)
                 if not content[hsize + k * SLOT_SIZE:hsize + (k + 1) * SLOT_SIZE].strip(b"\0")),
                slot_count)


def slot(content: bytes, k: int) -> tuple:
    hsize, _ = layout(content)
    return SLOT.unpack_from(content, hsize + k * SLOT_SIZE)


def with_slot(content: bytes, k: int, **fields) -> bytes:
    """content with slot k rewritten (a valid slot CRC) from slot k-1's successor."""
    hsize, _ = layout(content)
    index, term, offset, length, crc, kind = slot(content, k - 1)
    values = dict(index=index + 1, term=term, offset=offset + length, length=length,
                  crc=crc, kind=kind)
    values.update(fields)
    body = SLOT.pack(values["index"], values["term"], values["offset"], values["length"],
                     values["crc"], values["kind"])
    at = hsize + k * SLOT_SIZE
    return content[:at] + body + zlib.crc32(body).to_bytes(4, "big") + content[at + SLOT_SIZE:]


def patch(content: bytes, at: int, new: bytes) -> bytes:
    return content[:at] + new + content[at + len(new):]


def at_slot(content: bytes, k: int, within: int = 0) -> int:
    return layout(content)[0] + k * SLOT_SIZE + within


DAMAGE = {
    "as written": lambda c: c,
    "last slot's CRC zeroed": lambda c: patch(c, at_slot(c, used(c) - 1, 36), bytes(4)),
    "a middle slot half written": lambda c: patch(c, at_slot(c, used(c) // 2, 20), bytes(20)),
    "a bit of a middle term flipped": lambda c: patch(
        c, at_slot(c, used(c) // 2, 15), bytes([c[at_slot(c, used(c) // 2, 15)] ^ 1])),
    "index not consecutive": lambda c: with_slot(c, used(c) - 1,
                                                 index=slot(c, used(c) - 2)[0] + 2),
    "index repeated": lambda c: with_slot(c, used(c) - 1, index=slot(c, used(c) - 2)[0]),
    "term decreases": lambda c: with_slot(c, used(c) - 1, term=0),
    "data not back to back": lambda c: with_slot(c, used(c) - 1,
                                                 offset=slot(c, used(c) - 1)[2] + 1),
    "data past the end of the file": lambda c: with_slot(c, used(c) - 1, length=1 << 30),
    "a used slot after an empty one": lambda c: (
        patch(c, at_slot(c, used(c) + 1), b"\x01") if used(c) + 1 < layout(c)[1] else
        patch(c, at_slot(c, used(c) - 2), bytes(SLOT_SIZE))),
    "index zero with a valid CRC": lambda c: with_slot(c, 1, index=0) if used(c) > 1 else c,
    "cut inside the index": lambda c: c[:at_slot(c, max(used(c) - 2, 0), 7)],
    "cut inside the last entry's data": lambda c: c[:-1],
    "cut inside the header": lambda c: c[:10],
    "header zeroed": lambda c: bytes(14) + c[14:],
    "header checksum broken": lambda c: patch(c, 12, b"\xff\xff"),
    "bad magic": lambda c: b"QQXX" + c[4:],
    "unknown version": lambda c: patch(c, 4, struct.pack(">H", 99)),
    "empty file": lambda c: b"",
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_scan_accepts_exactly_what_the_reference_parser_accepts(segments, damage, tmp_path):
    for name, content in segments.items():
        path = tmp_path / f"{name}.segment"
        path.write_bytes(DAMAGE[damage](content))
        expected = reference(str(path))
        assert scanned(str(path)) == expected, name
        if damage == "as written":
            assert expected[-1] is False and len(expected[4]) > 0, name


def test_the_damage_table_reaches_every_outcome(segments, tmp_path):
    """The table above is not vacuous: it yields whole, torn, None and corrupt."""
    outcomes = set()
    for damage in DAMAGE.values():
        for content in segments.values():
            path = tmp_path / "s.segment"
            path.write_bytes(damage(content))
            result = reference(str(path))
            outcomes.add("none" if result is None else result[0] if result[0] == "corrupt"
                         else "torn" if result[-1] else "whole")
    assert outcomes == {"none", "corrupt", "torn", "whole"}
    assert {name.split("-")[1] for name in segments} == {"full", "partial", "compacted"}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_flipped_bytes_or_cut_give_the_same_answer(segments, data):
    name = data.draw(st.sampled_from(sorted(segments)))
    content = bytearray(segments[name])
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(content) - 1))
        content[at] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(content)))
    with tempfile.NamedTemporaryFile(suffix=".segment") as handle:
        handle.write(bytes(content[:cut] if data.draw(st.booleans()) else content))
        handle.flush()
        assert scanned(handle.name) == reference(handle.name)


def test_bulk_slot_crcs_equal_zlib():
    rows = np.random.default_rng(7).integers(0, 256, size=(500, SLOT_SIZE), dtype=np.uint8)
    rows[:3] = 0
    rows[3] = 255
    expected = [zlib.crc32(row[:36].tobytes()) for row in rows]
    assert slot_crcs(rows).tolist() == expected
    assert slot_crcs(rows[:0]).tolist() == []

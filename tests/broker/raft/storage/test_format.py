"""FORMAT.md is exact: an independent reader written from FORMAT.md alone (struct and
zlib, nothing imported from the store) reconstructs every group's log, hard state
and snapshot from the files, and the worked examples in FORMAT.md are byte-exact.

This is the reader the Spark analytics jobs need; if these tests fail, either the
code or FORMAT.md is wrong.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from pathlib import Path

from quorumqueue.broker.raft.storage import LogStore
from quorumqueue.broker.raft.storage.layout import group_dir_name
from quorumqueue.broker.raft.types import HardState, LogEntry, SnapshotMeta

from .support import G1, G2, G3, append_singly, config, crash_image, make_entries

FORMAT_MD = Path(__file__).parents[4] / "broker" / "raft" / "storage" / "FORMAT.md"


# --- the independent reader (FORMAT.md: WAL versions 1 to 3, segment and snapshot 1) ---

def crc(data: bytes) -> int:
    return zlib.crc32(data)


def read_wal(path: str) -> list[tuple]:
    data = open(path, "rb").read()
    magic, version, flags, number, header_crc = struct.unpack_from(">4sHHII", data)
    assert magic == b"QQWL" and version in (1, 2, 3) and flags == 0
    assert header_crc == crc(data[:12])
    assert number == int(os.path.basename(path).split(".")[0])
    offset, records, uids = 16, [], {}
    while offset < len(data):
        length, kind, payload_crc, record_crc = struct.unpack_from(">IBII", data, offset)
        assert record_crc == crc(data[offset:offset + 9])
        payload = data[offset + 13:offset + 13 + length]
        assert len(payload) == length and crc(payload) == payload_crc
        gid = struct.unpack_from(">I", payload)[0]
        if kind == 1:
            uids[gid] = payload[4:].decode()
            records.append(("GROUP", uids[gid]))
        elif kind == 2:
            _, index, term, entry_kind = struct.unpack_from(">IQQB", payload)
            records.append(("ENTRY", uids[gid], (index, term, entry_kind, payload[21:])))
        elif kind == 3:
            _, term, has_vote = struct.unpack_from(">IQB", payload)
            records.append(("HARD_STATE", uids[gid],
                            (term, payload[13:].decode() if has_vote else None)))
        elif kind in (4, 6):
            records.append(({4: "TRUNCATE", 6: "RELEASE"}[kind], uids[gid],
                            struct.unpack_from(">Q", payload, 4)[0]))
        elif kind == 5:
            records.append(("RESET", uids[gid], struct.unpack_from(">QQ", payload, 4)))
        elif kind == 7:
            count, at, members = struct.unpack_from(">H", payload, 4)[0], 6, []
            for _ in range(count):
                size = struct.unpack_from(">H", payload, at)[0]
                members.append(payload[at + 2:at + 2 + size].decode())
                at += 2 + size
            records.append(("MEMBERS", uids[gid], tuple(members)))
        elif kind == 8 and version >= 2:
            assert length == 4
            records.append(("DELETE_GROUP", uids[gid]))
        elif kind == 9 and version >= 3:
            _, index, term, entry_kind, count = struct.unpack_from(">IQQBI", payload)
            at = 25
            for k in range(count):
                size = struct.unpack_from(">I", payload, at)[0]
                records.append(("ENTRY", uids[gid],
                                (index + k, term, entry_kind, payload[at + 4:at + 4 + size])))
                at += 4 + size
            assert count >= 1 and at == length
        else:
            raise AssertionError(f"unknown record type {kind}")
        offset += 13 + length
    return records


def read_segment(path: str) -> tuple[str, int, list[tuple]]:
    data = open(path, "rb").read()
    magic, version, flags, slots, uid_length = struct.unpack_from(">4sHHIH", data)
    assert (magic, version) == (b"QQSG", 1)
    uid = data[14:14 + uid_length].decode()
    assert struct.unpack_from(">I", data, 14 + uid_length)[0] == crc(data[:14 + uid_length])
    base = 18 + uid_length
    expected_offset = base + 40 * slots
    entries = []
    for k in range(slots):
        slot = data[base + 40 * k:base + 40 * k + 40]
        if slot == bytes(40):
            break
        index, term, offset, length, data_crc, kind = struct.unpack(">QQQIIB3x", slot[:36])
        assert struct.unpack(">I", slot[36:])[0] == crc(slot[:36])
        assert offset == expected_offset
        body = data[offset:offset + length]
        assert crc(body) == data_crc
        entries.append((index, term, kind, body))
        expected_offset = offset + length
    indexes = [e[0] for e in entries]
    assert indexes == sorted(set(indexes))
    if not flags & 1:
        assert indexes == list(range(indexes[0], indexes[0] + len(indexes)))
    return uid, flags, entries


def read_snapshot(path: str) -> tuple[str, tuple, bytes]:
    data = open(path, "rb").read()
    magic, version, flags, meta_length = struct.unpack_from(">4sHHI", data)
    assert (magic, version, flags) == (b"QQSN", 1, 0)
    uid_length = struct.unpack_from(">H", data, 12)[0]
    uid = data[14:14 + uid_length].decode()
    at = 14 + uid_length
    index, term, count = struct.unpack_from(">QQH", data, at)
    at += 18
    members = []
    for _ in range(count):
        size = struct.unpack_from(">H", data, at)[0]
        members.append(data[at + 2:at + 2 + size].decode())
        at += 2 + size
    assert at == 12 + meta_length
    state_length, state_crc, header_crc = struct.unpack_from(">QII", data, 12 + meta_length)
    assert header_crc == crc(data[:24 + meta_length])
    state = data[28 + meta_length:]
    assert len(state) == state_length and crc(state) == state_crc
    return uid, (index, term, tuple(members)), state


def reconstruct(data_dir: str) -> dict:
    """Every group's log, hard state, members and snapshot, per FORMAT.md."""
    root = os.path.join(data_dir, "quorum")
    groups: dict[str, dict] = {}

    def group(uid):
        return groups.setdefault(uid, {"segments": {}, "mem": [], "shadow": None,
                                       "hard_state": (0, None), "members": (),
                                       "snapshot": None})

    def numbered(directory, suffix):
        names = [n for n in os.listdir(directory) if n.endswith(suffix)]
        return [os.path.join(directory, n) for n in sorted(names, key=lambda n: int(n.split(".")[0]))]

    for name in os.listdir(os.path.join(root, "snapshots")):
        uid, meta, _state = read_snapshot(os.path.join(root, "snapshots", name, "snapshot.dat"))
        group(uid)["snapshot"] = meta
    for name in os.listdir(os.path.join(root, "segments")):
        for path in numbered(os.path.join(root, "segments", name), ".segment"):
            uid, _flags, entries = read_segment(path)
            for index, term, kind, body in entries:
                group(uid)["segments"][index] = (index, term, kind, body)

    def shadow(g, index):
        if g["shadow"] is None or index < g["shadow"]:
            g["shadow"] = index

    records = [record for path in numbered(os.path.join(root, "wal"), ".wal")
               for record in read_wal(path)]
    last_delete = {record[1]: position for position, record in enumerate(records)
                   if record[0] == "DELETE_GROUP"}
    for position, record in enumerate(records):
        kind, uid = record[0], record[1]
        if position < last_delete.get(uid, -1):
            continue                           # about a group the last delete forgets
        if kind == "DELETE_GROUP":             # its files: all forgotten
            groups.pop(uid, None)
            continue
        g = group(uid)
        if kind == "ENTRY":
            entry = record[2]
            if g["mem"]:
                assert entry[0] == g["mem"][-1][0] + 1
            else:
                shadow(g, entry[0])
            g["mem"].append(entry)
        elif kind == "TRUNCATE":
            index = record[2]
            if g["mem"] and index > g["mem"][0][0]:
                g["mem"] = [e for e in g["mem"] if e[0] < index]
            else:
                g["mem"] = []
                shadow(g, index)
        elif kind == "RESET":
            if g["snapshot"] is not None and g["snapshot"][0] >= record[2][0]:
                g["mem"] = []
                shadow(g, 1)
        elif kind == "RELEASE":
            g["mem"] = [e for e in g["mem"] if e[0] >= record[2]]
        elif kind == "HARD_STATE":
            g["hard_state"] = record[2]
        elif kind == "MEMBERS":
            g["members"] = record[2]
    out = {}
    for uid, g in groups.items():
        log = {i: e for i, e in g["segments"].items() if g["shadow"] is None or i < g["shadow"]}
        log.update({e[0]: e for e in g["mem"]})
        out[uid] = {"log": [log[i] for i in sorted(log)], "hard_state": g["hard_state"],
                    "members": g["members"], "snapshot": g["snapshot"]}
    return out


# --- the tests -------------------------------------------------------------------------

def _store_view(store: LogStore) -> dict:
    out = {}
    for uid in store.groups():
        meta = store.snapshot_meta(uid)
        last = store.last_index(uid)
        out[uid] = {"log": [(e.index, e.term, e.kind, e.data) for e in store.entries(uid, 1, last + 1)],
                    "hard_state": (store.hard_state(uid).term, store.hard_state(uid).voted_for),
                    "members": store.members(uid),
                    "snapshot": None if meta is None else (meta.index, meta.term, meta.members)}
    return out


def test_an_independent_reader_reconstructs_every_group(tmp_path):
    """Rollover, a truncation into segments not yet applied to the files, a release,
    a compaction, a snapshot install and hard states: the files say what the store says.
    Runs appended at once are ENTRIES records, G3's last entries ENTRY records."""
    store = LogStore(str(tmp_path), config(segment_max_entries=6, wal_max_size_bytes=3500))
    for lo in range(1, 40, 13):
        for group in (G1, G2, G3):
            store.append(group, make_entries(group, lo, lo + 13, term=1 + lo // 13, size=30))
            store.set_hard_state(group, HardState(1 + lo // 13, "rabbit@n1"))
        store.flush()
    store.set_initial_members(G1, ("rabbit@n1", "rabbit@n2", "rabbit@n3"))
    store.write_snapshot(G1, SnapshotMeta(30, 3, ("rabbit@n1", "rabbit@n2", "rabbit@n3")),
                         b"fifo state")
    store.release(G1, 10)
    store.compact(G1, {14, 15, 22, 29})
    store.truncate_from(G2, 20)
    store.append(G2, make_entries(G2, 20, 24, term=9))
    store.install_snapshot(G3, SnapshotMeta(100, 9, ("rabbit@n2",)), b"from the leader")
    append_singly(store, G3, make_entries(G3, 101, 104, term=9))
    store.flush()
    files = reconstruct(str(tmp_path))
    assert files == _store_view(store)
    assert [e[0] for e in files[G1]["log"]] == [14, 15, 22, 29, *range(31, 40)]
    store.roll_over()
    assert reconstruct(str(tmp_path)) == _store_view(store)
    store.close()


def test_directory_names_follow_the_documented_encoding():
    assert group_dir_name("%2F/orders") == "_252F_2forders"
    assert group_dir_name("vhost-ü/q") == "vhost-_c3_bc_2fq"
    assert group_dir_name(".hidden") == "_2ehidden"
    long = group_dir_name("q" * 300)
    assert len(long) == 193 and long[160] == "~"


def _example(title: str) -> bytes:
    """The hex bytes of a worked example in FORMAT.md's code block after `title`."""
    text = FORMAT_MD.read_text()
    block = text[text.index(title):].split("```")[1]
    out = bytearray()
    for line in block.splitlines():
        for token in line.split():
            if not re.fullmatch(r"[0-9a-f]{2}", token):
                break
            out.append(int(token, 16))
    return bytes(out)


def test_wal_worked_example_in_format_md_is_exact(tmp_path):
    store = LogStore(str(tmp_path), config())
    store.append("%2F/q", [LogEntry(1, 1, 0, b"hi")])
    store.append("%2F/q", [LogEntry(2, 1, 0, b"hi"), LogEntry(3, 1, 0, b"yo!")])
    store.set_hard_state("%2F/q", HardState(1, "n1"))
    store.delete_group("%2F/q")
    store.close()
    wal = open(os.path.join(tmp_path, "quorum", "wal", "00000001.wal"), "rb").read()
    assert wal == _example("Worked example — file 1")


def test_segment_worked_example_in_format_md_is_exact(tmp_path):
    store = LogStore(str(tmp_path), config(segment_max_entries=4))
    store.append("%2F/q", [LogEntry(1, 1, 0, b"hi")])
    store.roll_over()
    data = open(store.segment_paths("%2F/q")[0], "rb").read()
    text = FORMAT_MD.read_text()
    example = text[text.index("Worked example — group `%2F/q`"):]
    header = bytes.fromhex(example.split("header\n`")[1].split("`")[0].replace(" ", ""))
    assert data[:23] == header
    assert data[23:63].hex().endswith("0000000000b7" "00000002" "d8932aac" "00" "000000" "7ac55b46")
    assert data[63:183] == bytes(120) and data[183:] == b"hi"


def test_an_independent_reader_forgets_deleted_groups(tmp_path):
    """DELETE_GROUP: what the files and the earlier records said about the group is
    forgotten, later records start the uid afresh. Also on crash images where the
    deleted group's files are still there, or where an interrupted rollover wrote the
    re-created group's segments next to the WAL holding the delete (FORMAT.md rule 7)."""
    images, armed = [], []

    def failpoint(name):
        if armed and name in ("delete.record_durable", "rollover.group"):
            images.append(crash_image(tmp_path / "live", tmp_path / f"img{len(images)}"))

    store = LogStore(str(tmp_path / "live"), config(segment_max_entries=6), failpoint=failpoint)
    for group in (G1, G2, G3):
        store.append(group, make_entries(group, 1, 21))
        store.set_hard_state(group, HardState(2, "rabbit@n1"))
    store.roll_over()
    store.write_snapshot(G1, SnapshotMeta(10, 1, ("rabbit@n1",)), b"fifo state")
    store.release(G1, 5)
    armed.append(True)
    store.delete_group(G1)
    store.delete_group(G2)
    store.append(G2, make_entries(G2, 1, 8, term=3))
    store.set_hard_state(G2, HardState(3, "rabbit@n2"))
    store.flush()
    assert reconstruct(str(tmp_path / "live")) == _store_view(store)
    assert sorted(reconstruct(str(tmp_path / "live"))) == sorted([G2, G3])
    store.roll_over()
    assert reconstruct(str(tmp_path / "live")) == _store_view(store)
    assert len(images) == 2                  # the delete's files, then G2's segments
    for image in images:
        files = reconstruct(image)           # before the broker tidies the image up
        assert files == _store_view(LogStore(image, config(segment_max_entries=6)))
        assert files[G2]["hard_state"] == (3, "rabbit@n2") and len(files[G2]["log"]) == 7


def test_an_independent_reader_skips_records_before_the_last_delete(tmp_path):
    """"Replaying a group's WAL records": a uid's records before its last DELETE_GROUP
    are skipped. Replayed, the RESET among them finds no snapshot file (the deletion
    removed it) and the entries after it do not follow the memory table."""
    store = LogStore(str(tmp_path), config())
    for group in (G1, G2):
        store.append(group, make_entries(group, 1, 5))
    store.install_snapshot(G1, SnapshotMeta(9, 2, ("rabbit@n2",)), b"from the leader")
    store.append(G1, make_entries(G1, 10, 12, term=2))
    store.delete_group(G1)
    store.append(G1, make_entries(G1, 1, 3, term=4))
    store.close()
    files = reconstruct(str(tmp_path))
    assert files == _store_view(LogStore(str(tmp_path), config()))
    assert [e[0] for e in files[G1]["log"]] == [1, 2] and files[G1]["snapshot"] is None

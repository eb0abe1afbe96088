"""`read_batches` (what the Spark source reads) holds exactly the rows of the reference
reader `read_rows`, on logs LogStore wrote without a broker: every shape of entry data
`command_of` looks at (FORMAT.md, "Quorum-queue entries": a forwarded command's
identity, time envelope, Enqueue body size (tags 1 and 21), unknown tags, empty data), entries in segments and in the WAL, torn files; and
that every fifo command tag has its name. The broker-written log is compared in
test_log_source.py.
"""

from __future__ import annotations

import os

import pytest

from quorumqueue.broker.fifo.commands import UpdateConfig, decode, encode, encode_enqueue
from quorumqueue.broker.raft.forwarded import Identity, wrap
from quorumqueue.broker.raft.storage import LogStore, StorageConfig
from quorumqueue.broker.raft.types import COMMAND, MEMBERSHIP, NOOP, LogEntry
from quorumqueue.jobs.log_files import (ARROW_SCHEMA, COLUMN_NAMES, COMMANDS, LogReadError,
                                        list_files, read_batches, read_rows)

GROUP = "%2F/orders/0123456789ab"
ENQUEUE = encode_enqueue("", 0, 0, "", "orders", b"\x00\x3c", b"hello world")
# tag 21: the message's BCC keys after the body (its body size is still 11)
BCC_ENQUEUE = encode_enqueue("", 0, 0, "", "orders", b"\x00\x3c", b"hello world",
                             blind_keys=("secret", "other"))
TIME = b"\xff" + (1_700_000_000_000).to_bytes(8, "big")
FORWARDED = wrap(Identity(0xFEED, 3, True), b"")   # the 18-byte identity alone
DATA = [                                   # (kind, data, expected command, body bytes)
    (COMMAND, ENQUEUE, "ENQUEUE", 11),
    (COMMAND, TIME + ENQUEUE, "ENQUEUE", 11),
    (COMMAND, b"", None, None),
    (COMMAND, b"\xff", None, None),        # an envelope cut short: no tag
    (COMMAND, TIME, None, None),
    (COMMAND, TIME + b"\x0d", "TICK", None),
    (COMMAND, b"\x01\x00\x00\x00\x05", "ENQUEUE", None),   # too short for the body size
    (COMMAND, b"\x01\x00\x00\x00\x00\x07", "ENQUEUE", 7),
    (COMMAND, b"\x04" + bytes(30), "SETTLE", None),
    (COMMAND, encode(UpdateConfig(5, 1000, None, "reject-publish")), "UPDATE_CONFIG", None),
    (COMMAND, b"\xc8rest", "UNKNOWN_200", None),
    (COMMAND, FORWARDED + ENQUEUE, "ENQUEUE", 11),
    (COMMAND, TIME + BCC_ENQUEUE, "ENQUEUE", 11),
    (COMMAND, FORWARDED + TIME + BCC_ENQUEUE, "ENQUEUE", 11),
    (COMMAND, FORWARDED + TIME + b"\x0d", "TICK", None),
    (COMMAND, FORWARDED + encode(UpdateConfig(5, 1000, None, "reject-publish")),
     "UPDATE_CONFIG", None),
    (COMMAND, FORWARDED, None, None),                     # an identity and nothing else
    (COMMAND, FORWARDED[:7], None, None),                 # an identity cut short
    (NOOP, b"", None, None),
    (MEMBERSHIP, b"\x01\x00\x00\x00\x09", None, None),   # not a command: not decoded
    (7, b"\x01", None, None),                             # a kind this build has no name for
]


def batch_rows(file) -> list[tuple]:
    """read_batches(file) as the tuples read_rows yields, checking the schema."""
    rows = []
    for batch in read_batches(file, max_rows=5):
        assert batch.schema.equals(ARROW_SCHEMA) and 0 < batch.num_rows <= 5
        rows += [tuple(row[name] for name in COLUMN_NAMES) for row in batch.to_pylist()]
    return rows


def outcome(read, file):
    try:
        return read(file)
    except LogReadError as error:
        return ("error", str(error))


def assert_same_rows(data_dir: str) -> list[tuple]:
    rows = []
    for file in list_files(data_dir):
        expected = outcome(lambda f: list(read_rows(f)), file)
        assert outcome(batch_rows, file) == expected, file.path
        rows += expected if isinstance(expected, list) else []
    return rows


def write_log(data_dir: str, copies: int = 3) -> None:
    """DATA `copies` times (segments of 8 slots), then once more left in the WAL."""
    store = LogStore(data_dir, StorageConfig(segment_max_entries=8, fsync=False))
    store.set_initial_members(GROUP, ["n1"])
    entries = [LogEntry(1 + k, 1 + k // 20, kind, data) for k, (kind, data, _c, _b) in
               enumerate(DATA * copies)]
    store.append(GROUP, entries)
    store.roll_over()
    store.append(GROUP, [LogEntry(len(entries) + 1 + k, 9, kind, data)
                         for k, (kind, data, _c, _b) in enumerate(DATA)])
    store.flush()
    store.close()


@pytest.fixture
def data_dir(tmp_path) -> str:
    write_log(str(tmp_path / "n1"))
    return str(tmp_path / "n1")


def test_every_entry_shape_gives_the_reference_row(data_dir):
    rows = [dict(zip(COLUMN_NAMES, row)) for row in assert_same_rows(data_dir)]
    entries = [row for row in rows if row["record_type"] == "ENTRY"]
    for kind in ("segment", "wal"):
        found = [(row["command"], row["body_bytes"]) for row in entries
                 if row["file_kind"] == kind][-len(DATA):]
        assert found == [(command, body) for _k, _d, command, body in DATA], kind
    assert {row["entry_kind"] for row in entries} == {"COMMAND", "NOOP", "MEMBERSHIP", "7"}
    segment_rows = [row for row in entries if row["file_kind"] == "segment"]
    assert {(row["vhost"], row["queue"], row["compacted"]) for row in segment_rows} == {
        ("/", "orders", False)}


def test_every_fifo_command_tag_has_a_name():
    """COMMANDS names exactly the tags the broker's decoder knows (FORMAT.md's table):
    a new fifo command needs a name here, or its entries read as UNKNOWN_<tag>."""
    def known(tag: int) -> bool:
        try:
            decode(bytes([tag]) + bytes(64))
        except ValueError as error:
            return "unknown fifo command tag" not in str(error)
        return True

    assert set(COMMANDS) == {tag for tag in range(256) if known(tag)}


def segment_paths(data_dir: str) -> list[str]:
    return [os.path.join(data_dir, f.path) for f in list_files(data_dir)
            if f.kind == "segment"]


@pytest.mark.parametrize("damage", [
    "slot torn", "used slot after an empty one", "created but empty", "header torn",
    "unknown version", "data cut short"])
def test_a_damaged_segment_gives_the_reference_rows_or_error(data_dir, damage):
    path = segment_paths(data_dir)[1]
    with open(path, "r+b") as handle:
        content = handle.read()
        header = 18 + len(GROUP)
        match damage:
            case "slot torn":
                handle.seek(header + 3 * 40 + 36)
                handle.write(bytes(4))
            case "used slot after an empty one":
                handle.seek(header + 5 * 40)
                handle.write(bytes(40))
            case "created but empty":
                handle.truncate(0)
            case "header torn":
                handle.truncate(9)
            case "unknown version":
                handle.seek(4)
                handle.write(b"\x00\x63")
            case "data cut short":
                handle.truncate(len(content) - 1)
    rows = assert_same_rows(data_dir)
    torn = [row for row in rows if row[COLUMN_NAMES.index("record_type")] == "TORN_TAIL"]
    assert len(torn) == (0 if damage == "unknown version" else 1)


def test_a_term_too_large_for_a_long_is_named(tmp_path):
    store = LogStore(str(tmp_path / "n1"), StorageConfig(fsync=False))
    store.append(GROUP, [LogEntry(1 + k, 1 << 63, COMMAND, ENQUEUE) for k in range(2)])
    store.roll_over()
    store.close()
    segment = [f for f in list_files(str(tmp_path / "n1")) if f.kind == "segment"][0]
    with pytest.raises(LogReadError, match="2\\^63"):
        list(read_batches(segment))

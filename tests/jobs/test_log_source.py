"""The log data source: a real broker's quorum log read back as rows, through the pure
reader and through `spark.read.format("quorumqueue.log")`; torn tails counted, never
fatal; corruption and unknown versions named.

One broker run per module writes a data directory (a small WAL and small segments, so
entries sit in both); each test works on its own copy.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
from collections import Counter

import pika
import pytest

from quorumqueue.broker.raft.storage.wal import RECORD_HEADER, RECORD_HEADER_SIZE
from quorumqueue.jobs.log_files import (COLUMN_NAMES, LogReadError, list_files, queue_of,
                                        read_rows)
from tests.support.broker import BrokerProcess

CONFIG = "[raft]\nwal_max_size_bytes = 65536\nsegment_max_entries = 64\n"
BODIES = [b"m%03d:" % n + b"x" * (100 + n) for n in range(300)]   # each a distinct size
SETTLED = 250
LATE = [b"late%d" % n for n in range(10)]    # after the acks: still in the WAL


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> str:
    """A stopped node's data directory: 300 messages published to quorum queue
    `orders` (vhost /), the first 250 fetched and acked, then 10 more published."""
    with BrokerProcess(extra_config=CONFIG) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("orders", durable=True, arguments={"x-queue-type": "quorum"})
        for body in BODIES:
            channel.basic_publish("", "orders", body, pika.BasicProperties(delivery_mode=2))
        for _ in range(SETTLED):
            method, _properties, _body = channel.basic_get("orders")
            channel.basic_ack(method.delivery_tag)
        for body in LATE:
            channel.basic_publish("", "orders", body, pika.BasicProperties(delivery_mode=2))
        connection.close()
        broker.stop()
        copy = tmp_path_factory.mktemp("node") / "n1"
        shutil.copytree(broker.data_dir, copy)
    return str(copy)


@pytest.fixture
def data_dir(written, tmp_path) -> str:
    copy = tmp_path / "n1"
    shutil.copytree(written, copy)
    return str(copy)


def rows_of(data_dir: str) -> list[dict]:
    return [dict(zip(COLUMN_NAMES, row)) for file in list_files(data_dir)
            for row in read_rows(file)]


def newest_wal(data_dir: str) -> str:
    return [os.path.join(data_dir, f.path) for f in list_files(data_dir) if f.newest][0]


def test_every_published_message_is_one_enqueue_row_with_its_body_size(data_dir):
    rows = rows_of(data_dir)
    enqueues = [row for row in rows if row["command"] == "ENQUEUE"]
    assert sorted(row["body_bytes"] for row in enqueues) == sorted(map(len, BODIES + LATE))
    assert {(row["vhost"], row["queue"], row["node"]) for row in enqueues} == {
        ("/", "orders", "n1")}
    # every group's entries (the queue's, and the node's metadata group's: a node is a
    # cluster of one) are read once each
    indexes = [(row["group"], row["raft_index"]) for row in rows
               if row["record_type"] == "ENTRY"]
    assert len(indexes) == len(set(indexes)), "an entry was read twice"
    assert {group for group, _index in indexes} >= {enqueues[0]["group"]}
    kinds = Counter(row["file_kind"] for row in enqueues)
    assert kinds["segment"] > 0 and kinds["wal"] > 0, kinds     # both were read
    settles = [row for row in rows if row["command"] == "SETTLE"]
    assert len(settles) == SETTLED           # one basic.ack each


def test_disk_bytes_add_up_to_the_files(data_dir):
    rows = rows_of(data_dir)
    by_file = Counter()
    for row in rows:
        by_file[row["file"]] += row["disk_bytes"]
    for file in list_files(data_dir):
        size = os.path.getsize(os.path.join(data_dir, file.path))
        if file.kind == "wal":          # every byte but the 16-byte file header
            assert by_file[file.path] == size - 16
        elif file.kind == "segment":    # never more than the file; a full one, nearly all
            assert 0 < by_file[file.path] <= size


def test_a_torn_tail_of_the_newest_wal_is_one_row_not_an_error(data_dir):
    path = newest_wal(data_dir)
    before = rows_of(data_dir)
    size = os.path.getsize(path)
    last = [r for r in before if r["file_kind"] == "wal"][-1]
    cut = last["offset"] + last["disk_bytes"] // 2       # the crash mid-record
    os.truncate(path, cut)
    after = rows_of(data_dir)
    torn = [row for row in after if row["record_type"] == "TORN_TAIL"]
    assert len(torn) == 1 and torn[0]["offset"] == last["offset"]
    assert torn[0]["bytes"] == cut - last["offset"]
    assert len(after) == len(before)        # the last record became the torn-tail row
    assert size > cut


def test_a_corrupt_record_is_named_with_its_file_and_offset(data_dir):
    path = newest_wal(data_dir)
    record = [r for r in rows_of(data_dir) if r["command"] == "ENQUEUE"
              and r["file_kind"] == "wal"][0]
    changed = record["offset"] + RECORD_HEADER_SIZE + 30   # inside the payload
    with open(path, "r+b") as handle:
        handle.seek(changed)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(LogReadError) as caught:
        rows_of(data_dir)
    message = str(caught.value)
    assert os.path.basename(path) in message and "checksum" in message
    # the record named holds the byte changed: the entry's own record, or the ENTRIES
    # record (WAL version 3) of the run it was appended in, whose rows are its entries
    # at the offsets of their length fields (which entries share a record depends on
    # how the broker's appends were batched)
    named = int(re.search(r"at byte offset (\d+)", message).group(1))
    with open(path, "rb") as handle:
        handle.seek(named)
        length, _, _ = RECORD_HEADER.unpack(handle.read(RECORD_HEADER.size))
    assert named <= record["offset"] < changed < named + RECORD_HEADER_SIZE + length


def test_an_unknown_segment_version_is_refused(data_dir):
    segment = [f for f in list_files(data_dir) if f.kind == "segment"][0]
    with open(os.path.join(data_dir, segment.path), "r+b") as handle:
        handle.seek(4)
        handle.write(struct.pack(">H", 99))
    with pytest.raises(LogReadError, match="unknown segment format version 99"):
        rows_of(data_dir)


def test_a_torn_segment_index_is_counted(data_dir):
    segment = [f for f in list_files(data_dir) if f.kind == "segment"][-1]
    path = os.path.join(data_dir, segment.path)
    rows = [row for row in rows_of(data_dir) if row["file"] == segment.path]
    last_slot = rows[-1]["offset"]
    with open(path, "r+b") as handle:                  # a slot half written
        handle.seek(last_slot + 20)
        handle.write(b"\x00" * 4)
    after = [row for row in rows_of(data_dir) if row["file"] == segment.path]
    assert [row["record_type"] for row in after][-1] == "TORN_TAIL"
    assert len(after) == len(rows)          # the broken slot's entry became the torn row


def test_a_file_removed_after_listing_yields_nothing(data_dir):
    files = list_files(data_dir)
    segment = [f for f in files if f.kind == "segment"][0]
    os.remove(os.path.join(data_dir, segment.path))
    assert list(read_rows(segment)) == []


def test_a_directory_without_a_log_is_refused_with_what_to_pass(tmp_path):
    with pytest.raises(LogReadError, match="--data-dir"):
        list_files(str(tmp_path))


@pytest.mark.parametrize("uid, expected", [
    ("%2F/orders/051dfa854592", ("/", "orders")),
    ("prod%2Feu/a/b/0123456789ab", ("prod/eu", "a/b")),
    ("%2F/orders", (None, None)),
    ("metadata", (None, None)),
])
def test_queue_of_a_group_uid(uid, expected):
    assert queue_of(uid) == expected


def test_spark_reads_the_same_rows_in_parallel(spark, data_dir):
    from chispa import assert_df_equality

    from quorumqueue.jobs.log_source import SCHEMA_DDL

    frame = spark.read.format("quorumqueue.log").option("node", "rabbit-1").load(data_dir)
    assert frame.rdd.getNumPartitions() == 2      # small files: one partition per core
    expected = spark.createDataFrame(
        [tuple(row.values())[:0] + ("rabbit-1",) + tuple(row.values())[1:]
         for row in rows_of(data_dir)], SCHEMA_DDL)
    assert_df_equality(frame, expected, ignore_row_order=True)


def test_spark_names_a_bad_option(spark, data_dir, tmp_path):
    with pytest.raises(Exception, match="unknown option.*'nod'"):
        spark.read.format("quorumqueue.log").option("nod", "x").load(data_dir)
    with pytest.raises(Exception, match="option 'path': no such directory"):
        spark.read.format("quorumqueue.log").load(str(tmp_path / "nope"))


def test_files_are_packed_into_balanced_partitions(data_dir):
    from quorumqueue.jobs import log_source

    files = list_files(data_dir)
    assert [len(group) for group in log_source.pack(files[:1], 2)] == [1]
    groups = log_source.pack(files, 2)
    assert len(groups) == 2 and sorted(f.path for g in groups for f in g) == sorted(
        f.path for f in files)
    original = log_source.PARTITION_BYTES
    try:
        log_source.PARTITION_BYTES = 1           # every file its own partition
        assert len(log_source.pack(files, 2)) == len(files)
    finally:
        log_source.PARTITION_BYTES = original


@pytest.mark.parametrize("damage", ["none", "torn wal", "torn segment slot",
                                    "middle slot flipped", "segment version"])
def test_the_batches_spark_reads_hold_the_reference_rows(data_dir, damage):
    """read_batches (segments column-wise) against read_rows (the broker's parsers),
    file by file, on the broker's own log as written and damaged."""
    from tests.jobs.test_log_files import assert_same_rows

    segments = [os.path.join(data_dir, f.path) for f in list_files(data_dir)
                if f.kind == "segment"]
    if damage == "torn wal":
        path = newest_wal(data_dir)
        os.truncate(path, os.path.getsize(path) - 7)
    elif damage != "none":
        with open(segments[-1] if damage == "torn segment slot" else segments[0],
                  "r+b") as handle:
            header = 18 + struct.unpack(">H", handle.read(14)[12:])[0]
            at = {"torn segment slot": header + 40 * 2 + 20, "middle slot flipped":
                  header + 40 * 10 + 9, "segment version": 4}[damage]
            handle.seek(at)
            handle.write(b"\x63")
    rows = assert_same_rows(data_dir)
    assert len(rows) > 300 or damage == "segment version"


def test_a_partition_reads_its_files_in_order_with_small_batches_combined(data_dir):
    from quorumqueue.jobs.log_source import BATCH_ROWS, FilePartition, LogReader

    files = list_files(data_dir)
    batches = list(LogReader([data_dir], None).read(FilePartition(tuple(files))))
    rows = [tuple(row.values()) for batch in batches for row in batch.to_pylist()]
    assert rows == [row for file in files for row in read_rows(file)]
    assert len(batches) < len(files) / 4, "small files' batches were not combined"
    assert all(batch.num_rows < BATCH_ROWS for batch in batches)


def test_partitions_come_in_whole_waves_of_cores(data_dir, monkeypatch):
    from quorumqueue.jobs import log_source

    files = list_files(data_dir)
    total = sum(os.path.getsize(os.path.join(data_dir, f.path)) for f in files)
    monkeypatch.setattr(log_source, "PARTITION_BYTES", total // 3 + 1)   # 3 would do
    assert len(files) >= 6 and len(log_source.pack(files, 2)) == 4
    assert len(log_source.pack(files, 3)) == 3

"""segment_compaction end to end on a real broker's data directory: 3,000 messages
through a quorum queue with 64-entry segments and a small WAL (so entries reach
segment files), all acknowledged but two far apart,
which stay in the queue. The job must name exactly the segments those two pin, with
their raft indexes, and append its tables and a report.
"""

from __future__ import annotations

import datetime
import os

import pika
import pytest

from quorumqueue.jobs import segment_compaction
from quorumqueue.jobs.log_files import COLUMN_NAMES, list_files, read_rows
from tests.support.broker import BrokerProcess

CONFIG = "[raft]\nwal_max_size_bytes = 131072\nsegment_max_entries = 64\n"
MESSAGES = 3000
KEPT = {400: 777, 2200: 999}          # message number -> a body size no other has


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    with BrokerProcess(extra_config=CONFIG) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("events", durable=True, arguments={"x-queue-type": "quorum"})
        for number in range(MESSAGES):
            channel.basic_publish("", "events", b"e" * KEPT.get(number, 50),
                                  pika.BasicProperties(delivery_mode=2))
        for _ in range(MESSAGES):
            method, _properties, body = channel.basic_get("events")
            if len(body) not in KEPT.values():
                channel.basic_ack(method.delivery_tag)
        connection.close()                 # the two unacked go back to the queue
        broker.stop()
        yield broker.data_dir


def test_the_job_names_exactly_the_pinned_segments(spark, data_dir, tmp_path):
    rows = [dict(zip(COLUMN_NAMES, row)) for f in list_files(data_dir) for row in read_rows(f)]
    # the queue's log: the data directory also holds the node's metadata group's log,
    # which the job leaves out (it is no queue's)
    rows = [r for r in rows if r["queue"] is not None]
    snapshot = max(r["raft_index"] for r in rows if r["record_type"] == "SNAPSHOT")
    kept = sorted(r["raft_index"] for r in rows
                  if r["command"] == "ENQUEUE" and r["body_bytes"] in KEPT.values())
    assert len(kept) == 2 and kept[1] <= snapshot, "the workload did not come out as planned"
    assert all(r["file_kind"] == "segment" for r in rows if r["raft_index"] in kept
               and r["record_type"] == "ENTRY"), "the kept messages should be in segments"
    segments = {}
    for r in rows:
        if r["file_kind"] == "segment" and r["record_type"] == "ENTRY":
            segments.setdefault(r["file"], []).append(r)
    pinned_files = {file for file, entries in segments.items()
                    if any(e["raft_index"] in kept for e in entries)}
    freed_bytes = sum(e["disk_bytes"] for entries in segments.values()
                      if max(e["raft_index"] for e in entries) < kept[0] for e in entries)

    lines = segment_compaction.run(spark, data_dir, str(tmp_path), segment_max_entries=64,
                                   table_format="parquet")

    table = spark.read.parquet(str(tmp_path / "segment_compaction" / "segments"))
    found = {row["file"]: row for row in table.collect()}
    assert set(found) == set(segments)
    assert {file for file, row in found.items() if row["pinned"]} == pinned_files
    assert sorted(i for row in found.values() if row["pinned"] for i in row["pinned_by"]) == kept
    assert sum(row["bytes"] for row in found.values()
               if row["freed_by_release_cursor"]) == freed_bytes
    assert sum(row["live_entries"] for row in found.values()) == 2
    assert any(f"raft indexes {kept[0]}, {kept[1]}" in line for line in lines), lines
    what_if = spark.read.parquet(str(tmp_path / "segment_compaction" / "what_if"))
    assert sorted(r["segment_max_entries"] for r in what_if.collect()) == [
        128, 1024, 4096, 32768, 65535]
    reports = os.listdir(tmp_path / "segment_compaction" / "reports")
    assert len(reports) == 1

    later = datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    segment_compaction.run(spark, data_dir, str(tmp_path), segment_max_entries=64,
                           table_format="parquet", run_at=later)   # appends its rows
    again = spark.read.parquet(str(tmp_path / "segment_compaction" / "segments"))
    assert again.select("run_at").distinct().count() == 2      # one stamp per run
    assert again.count() == 2 * len(segments)
    assert len(os.listdir(tmp_path / "segment_compaction" / "reports")) == 2

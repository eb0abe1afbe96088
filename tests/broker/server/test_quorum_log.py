"""The quorum-queue log on disk, as an operator sees it: segments are released once
their messages are consumed, and one long-lived message does not pin every segment
written after it (compaction around live entries, RabbitMQ 4.3)."""

from __future__ import annotations

import os

import pika
import pytest

from quorumqueue.client.lease_client import LeaseClient
from tests.support.broker import BrokerProcess

from .pika_support import connect

pytestmark = pytest.mark.timeout(120)

CONFIG = """
[raft]
wal_max_size_bytes = 32768
segment_max_entries = 64
"""


def segment_files(data_dir: str) -> list[str]:
    root = os.path.join(data_dir, "quorum", "segments")
    return [os.path.join(d, f) for d, _dirs, files in os.walk(root) for f in files
            if f.endswith(".segment")]


def push_through(channel, queue: str, count: int) -> None:
    """Publish `count` messages and consume them all with acks (a channel without
    confirms: waiting for each publish's confirm made the 9,000 round trips most of
    this file's time, and every message must come back here anyway)."""
    for number in range(count):
        channel.basic_publish("", queue, b"x" * 100 + str(number).encode(),
                              pika.BasicProperties(delivery_mode=2))
    consumed = 0
    for method, _properties, _body in channel.consume(queue, inactivity_timeout=5):
        assert method is not None, f"only {consumed} of {count} came back"
        consumed += 1
        if consumed % 50 == 0 or consumed == count:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if consumed == count:
            break
    channel.cancel()


def test_one_pinned_message_does_not_keep_every_later_segment():
    with BrokerProcess(extra_config=CONFIG) as broker:
        connection = connect(broker)
        channel = connection.channel()
        channel.queue_declare("pinned", durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        channel.basic_publish("", "pinned", b"the long-lived one",
                              pika.BasicProperties(delivery_mode=2, message_id="keep"))
        with LeaseClient(broker.uri) as leases:
            assert leases.grow("pinned", "holder", max_messages=1) == (1, 1)
        flowing = connection.channel()
        for _ in range(12):
            push_through(flowing, "pinned", 500)
        files = segment_files(broker.data_dir)
        # 6000 messages are ~6100 log entries (one per publish, the acks go 50 at a
        # time), ~95 segments of 64 if nothing were compacted (65-66 files are left
        # here, 2026-12-07); the live message and the not-yet-snapshotted tail keep some
        assert 0 < len(files) < 80, f"{len(files)} segment files"
        connection.close()
        broker.restart(kill=True)
        with LeaseClient(broker.uri) as leases:
            (message,) = leases.read("pinned", "holder", 0, 1)
            assert (message.body, message.properties.message_id) == (b"the long-lived one",
                                                                     "keep")
            assert leases.settle("pinned", "holder", 1) == 1
        connection = connect(broker)
        channel = connection.channel()
        for _ in range(6):
            push_through(channel, "pinned", 500)  # the cursor moves past index 1 now
        assert len(segment_files(broker.data_dir)) < 20
        connection.close()

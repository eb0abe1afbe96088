"""A full disk is an alarm, not an exit (issue 30; the alarms guide: "Nodes will
temporarily block publishing connections ... Connections that only consume are not
blocked"): a node whose data directory's file system has no byte left raises the disk
alarm, blocks its publishers with connection.blocked, goes on serving consumers and
acks (from its disk reserve), writes again once space returns, and loses nothing it
confirmed. A real small file system (a tmpfs, tests/support/small_fs.py) holds the
data directory; the log is kept outside it."""

from __future__ import annotations

import json
import os
import time
import urllib.request

import pika
import pytest

from tests.support.broker import BrokerProcess
from tests.support.history import ID_HEADER, Workload, check
from tests.support import waiting
from tests.support.small_fs import small_disk

pytestmark = pytest.mark.timeout(300)

# the free-space check alone would block publishers before the disk is full: a limit
# of one byte leaves the full disk to the writes; a small WAL rolls over into segment
# files while the disk is full; a reserve of 4 MiB carries the acks meanwhile
CONFIG = ("disk_free_limit.absolute = 1\n"
          'storage.disk_reserve = "4MiB"\n'
          'raft.wal_max_size_bytes = "1MiB"\n')
BEFORE = 300


@pytest.fixture
def disk(tmp_path):
    with small_disk(str(tmp_path / "disk"), 48 * 1024 * 1024) as mounted:
        yield mounted


def wait_until(what: str, condition, timeout: float = 60.0, log=lambda: "") -> None:
    waiting.wait_until(condition, what, timeout, interval=0.1, log=log)


def publish_confirmed(uri: str, queue: str, ids: list[str]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for message_id in ids:
            channel.basic_publish("", queue, message_id.encode() + b"." * 1000,
                                  pika.BasicProperties(delivery_mode=2,
                                                       headers={ID_HEADER: message_id}))
    finally:
        connection.close()


def node_row(broker) -> dict:
    request = urllib.request.Request(f"{broker.management_url}/api/nodes")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)[0]


def test_a_full_disk_blocks_publishers_while_consumers_go_on_and_loses_nothing(
        disk, tmp_path):
    broker = BrokerProcess(data_dir=os.path.join(disk.path, "node"),
                           extra_config=CONFIG, log_path=str(tmp_path / "broker.log"))
    with broker:
        setup = pika.BlockingConnection(pika.URLParameters(broker.uri))
        setup.channel().queue_declare("qq", durable=True,
                                      arguments={"x-queue-type": "quorum"})
        setup.channel().queue_declare("cq", durable=True)
        setup.close()
        before = [f"before-{n:04d}" for n in range(BEFORE)]
        publish_confirmed(broker.uri, "qq", before)
        publish_confirmed(broker.uri, "cq", before)

        disk.fill()
        assert disk.free_bytes() == 0
        blocked = []
        publisher = pika.BlockingConnection(pika.URLParameters(broker.uri))
        publisher.add_on_connection_blocked_callback(
            lambda _connection, frame: blocked.append(frame.method.reason))
        publisher.channel().basic_publish("", "cq", b"x" * 100_000,
                                          pika.BasicProperties(delivery_mode=2))
        wait_until("connection.blocked", lambda: publisher.process_data_events(0.1)
                   or blocked, log=broker.log)
        assert blocked == ["low on disk space"]
        assert "is full ([Errno 28] No space left on device): disk alarm set" in broker.log()
        assert node_row(broker)["disk_free_alarm"] is True

        workload = Workload([broker.uri], "qq", declare=False, prefix="during")
        workload.history.published += before
        workload.history.confirmed += before
        with workload:
            # the consumer is not blocked: every message from before is delivered and
            # acked while the disk stays full
            assert workload.consumer.wait_for(before, timeout=90) == set(), broker.log()
            consumer = pika.BlockingConnection(pika.URLParameters(broker.uri))
            channel = consumer.channel()
            got = []
            while len(got) < BEFORE:
                method, properties, _body = channel.basic_get("cq")
                if method is None:
                    time.sleep(0.05)
                    continue
                got.append(properties.headers[ID_HEADER])
                channel.basic_ack(method.delivery_tag)
            consumer.close()
            assert got == before
            # the blocked publisher gives up on its connection (pika's
            # blocked_connection_timeout, 5 s) and comes back, blocked again
            wait_until("the publisher reconnected", lambda: workload.publisher.connections >= 2,
                       log=broker.log)
            assert broker.process.poll() is None
            assert "disk resource limit alarm cleared" not in broker.log()

            disk.free()
            wait_until("the disk alarm cleared",
                       lambda: "disk resource limit alarm cleared" in broker.log(),
                       log=broker.log)
            wait_until("publishes confirmed again",
                       lambda: len(workload.history.confirmed) > BEFORE + 20,
                       log=broker.log)
            history = workload.finish(drain_timeout=90)
        print(check(history))
        publisher.process_data_events(1.0)
        assert "CRITICAL" not in broker.log() and broker.process.poll() is None
        publisher.close()
    # what it wrote on the full disk recovers: the node starts on the same directory
    with broker:
        probe = pika.BlockingConnection(pika.URLParameters(broker.uri))
        declared = probe.channel().queue_declare("cq", durable=True, passive=True)
        assert declared.method.message_count == 1   # the 100 kB publish, taken then blocked
        probe.close()


def test_a_disk_kept_full_holds_the_writes_until_space_returns_and_the_node_stays_up(
        disk, tmp_path):
    """No reserve, and a disk kept full (whatever the node frees is taken at once):
    nothing can be written, so the node holds what it accepted and tries again every
    half second (server.py `_stall`), answering nobody for it meanwhile; once space
    returns it writes, confirms and delivers, and nothing confirmed is lost."""
    broker = BrokerProcess(data_dir=os.path.join(disk.path, "node"),
                           extra_config=CONFIG.replace('"4MiB"', "0"),
                           log_path=str(tmp_path / "broker.log"))
    with broker:
        workload = Workload([broker.uri], "qq", prefix="m").start()
        try:
            wait_until("confirms", lambda: len(workload.history.confirmed) > 50,
                       log=broker.log)
            disk.fill(keep_full=True)
            wait_until("the disk alarm", lambda: "disk alarm set" in broker.log(),
                       log=broker.log)
            stalled_at = len(workload.history.confirmed)
            time.sleep(5)      # the fault held: ten attempts to write, none succeeds
            assert len(workload.history.confirmed) == stalled_at   # nothing written
            assert broker.process.poll() is None
            disk.free()
            wait_until("confirms again",
                       lambda: len(workload.history.confirmed) > stalled_at + 20,
                       timeout=90, log=broker.log)
        finally:
            history = workload.finish(drain_timeout=90)
        print(check(history))
        assert "writes to" in broker.log() and "succeed again" in broker.log()
        assert "CRITICAL" not in broker.log() and broker.process.poll() is None

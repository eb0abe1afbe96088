"""Resource alarms on a running node, as a pika client sees them (the alarms guide:
"Nodes will temporarily block publishing connections ... Connections that only consume
are not blocked"; the disk alarms guide's disk_free_limit.relative). The set and clear
transitions themselves, and the unblocking, are tested on the session core
(tests/broker/node/test_session.py, "connection.blocked")."""

from __future__ import annotations

import time

import pika
import pytest

from tests.support.broker import BrokerProcess

from .pika_support import get_bodies, publish_bodies

pytestmark = pytest.mark.timeout(120)

# free disk space can never be 10^6 times the machine's memory: the alarm holds from start
ALWAYS_LOW_ON_DISK = "disk_free_limit.relative = 1000000.0\n"


def test_a_disk_alarm_blocks_publishers_only_and_consumers_keep_consuming(tmp_path):
    data_dir = str(tmp_path / "node")
    with BrokerProcess(data_dir=data_dir) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
        channel = connection.channel()
        channel.queue_declare("alarmed", durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        publish_bodies(channel, "alarmed", [b"1", b"2", b"3"])
        connection.close()
    with BrokerProcess(data_dir=data_dir, extra_config=ALWAYS_LOW_ON_DISK) as broker:
        deadline = time.monotonic() + 20
        while "disk resource limit alarm set on node" not in broker.log():
            assert time.monotonic() < deadline, broker.log()
            time.sleep(0.1)
        assert "Free disk space is insufficient. Free bytes:" in broker.log()
        consumer = pika.BlockingConnection(pika.URLParameters(broker.uri))
        publisher = pika.BlockingConnection(pika.URLParameters(broker.uri))
        blocked = []
        publisher.add_on_connection_blocked_callback(
            lambda _connection, frame: blocked.append(frame.method.reason))
        try:
            channel = consumer.channel()
            assert get_bodies(channel, "alarmed") == [b"1", b"2", b"3"]  # not blocked
            publishing = publisher.channel()
            publishing.basic_publish("", "alarmed", b"4")
            deadline = time.monotonic() + 10
            while not blocked:
                assert time.monotonic() < deadline, "no connection.blocked"
                publisher.process_data_events(time_limit=0.1)
            assert blocked == ["low on disk space"]
            # as RabbitMQ's reader: the publish that showed the connection publishes is
            # taken, then the connection is read no more
            publishing.basic_publish("", "alarmed", b"5")  # sent, but not read
            publisher.process_data_events(time_limit=1.0)
            assert get_bodies(channel, "alarmed") == [b"4"]  # the consumer still works
            publisher.process_data_events(time_limit=1.0)
            assert get_bodies(channel, "alarmed") == []
        finally:
            consumer.close()

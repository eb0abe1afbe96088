"""Lease ranges read from a replica that restarted and has not applied its old log yet.

Every node of a cluster killed at once and restarted: none applies the entries its
log held (a lease's grows among them) before a new leader commits, so for a while
every node would answer a range read "no lease", which a reader takes as the range
gone (the Spark connector's DataLossError, found by the fault suite's Spark workload
under kill-all). Such a replica answers instead that it is still applying its log
(broker/node/leases.py, REPLAYING), and a range it can read again once a leader
commits reads back as before; the connector's range read waits through that answer
(connector/lease_reader.py) and then reads the range. A node restarted alone out of
three stays in that state (no majority, no leader), which makes it testable without
a race.
"""

from __future__ import annotations

import pickle
import threading

import pika
import pytest

from quorumqueue.broker.node.leases import REPLAYING
from quorumqueue.client.lease_client import LeaseClient
from quorumqueue.client.management import call
from quorumqueue.connector.lease_reader import LeaseStreamReader
from quorumqueue.connector.offsets import LeaseRange
from quorumqueue.connector.options import parse_source_options
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(300)

QUEUE = "leased"


def leader(cluster) -> str | None:
    for uri in cluster.live_uris():
        for row in call(uri, "cluster.status", timeout=5)["queues"]:
            if row["name"] == QUEUE and row["leader"] in cluster.names:
                return row["leader"]
    return None


def read_ids(uri: str) -> list[str]:
    with LeaseClient(uri) as client:
        return [m.properties.message_id for m in client.read(QUEUE, "spark", 0, 5)]


def leased_cluster(cluster) -> list[str]:
    """A quorum queue of 5 messages, all in lease 'spark'; their ids as read."""
    wait_for("a metadata leader", lambda: all(
        call(uri, "cluster.status", timeout=5)["metadata_leader"]
        for uri in cluster.uris()))
    with pika.BlockingConnection(pika.URLParameters(cluster.uri(0))) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        for n in range(5):
            channel.basic_publish("", QUEUE, b"x", pika.BasicProperties(
                delivery_mode=2, message_id=f"m-{n}"))
    wait_for("the queue's leader", lambda: leader(cluster))
    with LeaseClient(cluster.uri(0)) as client:
        assert client.grow(QUEUE, "spark", max_messages=5) == (1, 5)
    return read_ids(cluster.uri(0))


def test_a_restarted_replica_says_it_is_still_applying_rather_than_no_lease():
    with LocalCluster(3, proxied=False) as cluster:
        before = leased_cluster(cluster)
        for name in cluster.names:
            cluster.kill(name)
        cluster.restart(cluster.names[0])  # alone: no majority, no leader, no commit
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refusal:
            read_ids(cluster.uri(0))
        assert refusal.value.reply_code == 406
        assert refusal.value.reply_text == (
            f"PRECONDITION_FAILED - lease 'spark' on queue '{QUEUE}' in vhost '/': "
            f"{REPLAYING}")
        cluster.restart(cluster.names[1])  # a majority: a leader commits, both apply
        assert wait_for("the range read back", lambda: read_ids(cluster.uri(0))) == before
        assert before == [f"m-{n}" for n in range(5)]


def test_the_connector_reads_a_range_through_every_node_restarting_at_once():
    with LocalCluster(3, proxied=False) as cluster:
        before = leased_cluster(cluster)
        reader = LeaseStreamReader(parse_source_options(
            {"uri": ",".join(cluster.uris()), "queue": QUEUE, "reconnectTimeout": "120s"}))
        for name in cluster.names:
            cluster.kill(name)
        cluster.restart(cluster.names[0])
        rows, failure = [], []

        def read() -> None:  # an executor's read of the partition
            try:
                for batch in pickle.loads(pickle.dumps(reader)).read(
                        LeaseRange(QUEUE, "spark", 0, 5)):
                    rows.extend(batch.column("message_id").to_pylist())
            except Exception as error:  # noqa: BLE001 - asserted below
                failure.append(error)

        reading = threading.Thread(target=read, daemon=True)
        reading.start()
        reading.join(3)  # the only live node can only say it is still applying
        assert reading.is_alive() and not failure and not rows
        cluster.restart(cluster.names[1])
        reading.join(120)
        assert not failure, failure
        assert rows == before

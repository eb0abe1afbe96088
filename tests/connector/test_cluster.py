"""The source and sink against a 3-node bundled cluster (broker/cluster/README.md):
option `uri` lists several nodes, the query talks to a follower of the queue, and
every message still arrives once, through leases the leader assigns."""

from __future__ import annotations

import time

import pika
import pytest

from quorumqueue.client.management import call
from tests.support.cluster import LocalCluster

from .queues import unique

pytestmark = pytest.mark.timeout(240)


def wait_for(what: str, predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:  # noqa: BLE001 - a node may still be starting
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def leader_of(uri: str, queue: str) -> str | None:
    for row in call(uri, "cluster.status")["queues"]:
        if row["name"] == queue:
            return row["leader"]
    return None


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False) as running:
        wait_for("a metadata leader on every node", lambda: all(
            call(uri, "cluster.status")["metadata_leader"] for uri in running.uris()))
        yield running


def test_a_query_through_a_follower_reads_every_message_once_and_writes_them_back(
        spark, cluster, tmp_path):
    queue, copy = unique("orders"), unique("copy")
    with pika.BlockingConnection(pika.URLParameters(cluster.uri(0))) as connection:
        channel = connection.channel()
        for name in (queue, copy):
            channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        for n in range(300):
            channel.basic_publish("", queue, b"order-%d" % n,
                                  pika.BasicProperties(delivery_mode=2, message_id=f"id-{n}"))
    wait_for("a leader", lambda: leader_of(cluster.uri(0), queue))
    leader = leader_of(cluster.uri(0), queue)
    follower = next(name for name in cluster.names if name != leader)
    # the follower first, then the others: the connector uses the first it reaches
    uri = ",".join(cluster.uris([follower] + [n for n in cluster.names if n != follower]))
    query = (spark.readStream.format("quorumqueue").option("uri", uri).option("queue", queue)
             .option("maxMessagesPerTrigger", "120").load()
             .writeStream.format("memory").queryName("from_cluster")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    rows = spark.sql("select message_id, body from from_cluster").collect()
    assert sorted(row.message_id for row in rows) == sorted(f"id-{n}" for n in range(300))
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [
        120, 120, 60]
    (spark.sql("select body from from_cluster").write.format("quorumqueue").mode("append")
     .option("uri", cluster.uri(follower)).option("routingKey", copy).save())
    # confirmed by a majority: every node counts them once applied
    wait_for("the copies on every node", lambda: all(
        row["ready"] == 300 for uri in cluster.uris()
        for row in call(uri, "queues.list", vhost="/") if row["name"] == copy))

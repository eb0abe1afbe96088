"""Message TTL, dead lettering and queue TTL on a 3-node cluster (the quorum queues
guide, "Dead Lettering" and "Queue and Per-Message TTL"): expiry and drops are
replicated through the queue's log, and only the leader publishes the dead-lettered
copy (at most once), so the target gets each message once, not once per member; an
expired queue (x-expires) is deleted on every node. Classic queues on a 2-node
cluster: their host expires and dead-letters, whichever node the client uses.
"""

from __future__ import annotations

import time

import pika
import pytest

from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import connect, status
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(400)  # the waits inside have their own bounds

QUORUM = {"x-queue-type": "quorum"}
MESSAGES = 20


def rows(uri: str) -> dict[str, dict]:
    return {q["name"]: q for q in call(uri, "queues.list", vhost="/")}


def test_dead_letters_arrive_once_and_an_expired_queue_goes_from_every_node():
    with LocalCluster(3) as cluster:
        uris = cluster.uris()
        wait_for("a metadata leader on every node", lambda: all(
            status(uri)["metadata_leader"] for uri in uris))
        with connect(uris[0]) as connection:
            channel = connection.channel()
            channel.queue_declare("dl-dst", durable=True, arguments=QUORUM)
            channel.queue_declare("dl-src", durable=True, arguments={
                **QUORUM, "x-message-ttl": 300, "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "dl-dst"})
            channel.queue_declare("dl-expires", durable=True,
                                  arguments={**QUORUM, "x-expires": 1500})
            channel.confirm_delivery()
            for number in range(MESSAGES):
                channel.basic_publish("", "dl-src", b"%d" % number,
                                      pika.BasicProperties(delivery_mode=2))
        wait_for(f"{MESSAGES} dead-lettered messages in dl-dst, on every node", lambda: all(
            rows(uri).get("dl-dst", {}).get("ready") == MESSAGES
            and rows(uri).get("dl-src", {}).get("ready") == 0 for uri in uris))
        wait_for("dl-expires deleted on every node", lambda: all(
            "dl-expires" not in rows(uri) for uri in uris))
        time.sleep(2.0)  # a member that also published would have added copies by now
        assert [rows(uri)["dl-dst"]["ready"] for uri in uris] == [MESSAGES] * 3
        with connect(uris[2]) as connection:
            channel = connection.channel()
            bodies = []
            while (got := channel.basic_get("dl-dst", auto_ack=True))[0] is not None:
                bodies.append(got[2])
                assert got[1].headers["x-death"][0]["reason"] == "expired"
        assert sorted(bodies) == sorted(b"%d" % n for n in range(MESSAGES))


def test_classic_queue_ttls_and_dead_letters_work_from_another_node():
    """A classic queue lives on its host (node 0 here); a client of node 1 uses it
    through the host: its message TTL and rejections dead-letter on the host into a
    queue of the host, each message once; its declares renew the queue's x-expires
    as a local declare does, and once left alone the queue is deleted on every node."""
    with LocalCluster(2) as cluster:
        uris = cluster.uris()
        wait_for("a metadata leader on every node", lambda: all(
            status(uri)["metadata_leader"] for uri in uris))
        with connect(uris[0]) as connection:
            channel = connection.channel()
            channel.queue_declare("cq-dst", durable=True)
            channel.queue_declare("cq-src", durable=True, arguments={
                "x-message-ttl": 300, "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "cq-dst"})
            channel.queue_declare("cq-rej", durable=True, arguments={
                "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "cq-dst"})
        with connect(uris[1]) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for number in range(MESSAGES):
                channel.basic_publish("", "cq-src", b"%d" % number,
                                      pika.BasicProperties(delivery_mode=2))
            channel.basic_publish("", "cq-rej", b"rejected", pika.BasicProperties(delivery_mode=2))
            method, _properties, body = channel.basic_get("cq-rej")
            assert body == b"rejected"
            channel.basic_reject(method.delivery_tag, requeue=False)
            wait_for(f"{MESSAGES + 1} dead-lettered messages in cq-dst", lambda: rows(
                uris[1]).get("cq-dst", {}).get("ready") == MESSAGES + 1)
            with connect(uris[0]) as on_host:
                on_host.channel().queue_declare("cq-expires", durable=True,
                                                arguments={"x-expires": 1500})
            host = rows(uris[0])["cq-expires"]["leader"]
            for _ in range(8):  # 4 s of redeclares from node 1: more than two periods
                channel.queue_declare("cq-expires", durable=True, arguments={"x-expires": 1500})
                connection.sleep(0.5)
            assert rows(uris[1])["cq-expires"]["leader"] == host  # the same queue
        wait_for("cq-expires deleted on every node", lambda: all(
            "cq-expires" not in rows(uri) for uri in uris))
        with connect(uris[1]) as connection:
            channel = connection.channel()
            reasons = []
            while (got := channel.basic_get("cq-dst", auto_ack=True))[0] is not None:
                reasons.append(got[1].headers["x-death"][0]["reason"])
        assert sorted(reasons) == ["expired"] * MESSAGES + ["rejected"]
        assert rows(uris[0])["cq-src"]["ready"] == rows(uris[0])["cq-rej"]["ready"] == 0

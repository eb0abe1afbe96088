"""Message TTL, dead lettering and queue TTL on a 3-node cluster (the quorum queues
guide, "Dead Lettering" and "Queue and Per-Message TTL"): expiry and drops are
replicated through the queue's log, and only the leader publishes the dead-lettered
copy (at most once), so the target gets each message once, not once per member; an
expired queue (x-expires) is deleted on every node.
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

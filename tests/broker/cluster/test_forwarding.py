"""A command forwarded to a leader that crashes between appending it and answering is
applied once (broker/cluster/README.md, "Commands go to the leader").

The crash window, made deterministic with the proxies between nodes: what the queue's
leader sends the publishing follower is held (its Raft entries and its "accepted"
answer), so the leader appends the follower's forwarded publish and commits it with
the third node, and the follower never learns that it did. The leader is then
killed. The third node, holding the entry, becomes leader; the follower sends the
publish again, and the new leader appends it a second time. Both entries are
committed: every member must apply the command once, and the follower's publisher
gets its confirm.
"""

from __future__ import annotations

import threading

import pika
import pytest

from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import connect, drain, leader_of
from tests.support.cluster import (CONVERGE_TIMEOUT, LocalCluster, quorum_queue_with_followers,
                                   wait_for)

pytestmark = pytest.mark.timeout(400)  # the waits inside have their own bounds

QUEUE = "forwarded-once"


def ready(uri: str) -> int | None:
    rows = [q for q in call(uri, "queues.list", vhost="/") if q["name"] == QUEUE]
    return rows[0]["ready"] if rows else None


def publish_confirmed(uri: str, body: bytes, outcome: list) -> None:
    """Publish with confirms (in a thread of its own); `outcome` gets "ack" or the error."""
    try:
        with connect(uri) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
            outcome.append("ack")
    except Exception as error:  # noqa: BLE001 - reported by the test
        outcome.append(error)


def test_a_publish_whose_leader_died_before_answering_is_stored_once():
    with LocalCluster(3) as cluster:
        leader, (follower, third) = quorum_queue_with_followers(cluster, QUEUE)
        # from now on nothing the leader sends reaches the follower
        cluster.proxy(leader, follower).cut("stall", "forward")
        outcome: list = []
        publisher = threading.Thread(target=publish_confirmed, daemon=True,
                                     args=(cluster.uri(follower), b"once", outcome))
        publisher.start()
        wait_for("the leader to apply the forwarded publish (committed with the third node)",
                 lambda: ready(cluster.uri(leader)) == 1)
        assert not outcome, "the follower learned of the append before the leader died"
        cluster.kill(leader)
        publisher.join(CONVERGE_TIMEOUT)
        assert outcome == ["ack"]
        assert leader_of(cluster.uri(follower), QUEUE) == third
        # the confirm comes from the follower's apply of the second append: both applied
        assert ready(cluster.uri(follower)) == 1
        wait_for("the third node to count the same", lambda: ready(cluster.uri(third)) == 1)
        assert drain(cluster.uri(third), QUEUE, 1) == [b"once"]
        for name in (follower, third):
            assert "Traceback" not in cluster.log(name, tail=100_000), name

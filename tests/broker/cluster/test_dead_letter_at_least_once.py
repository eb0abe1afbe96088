"""At-least-once dead lettering across a leader kill on a 3-node cluster (the quorum
queues guide, "Dead Lettering": the dead-letter consumer "is co-located on the quorum
queue leader node", the source queue keeps each dead letter until the target
confirmed it, and retries may duplicate but never lose).

The source queue's leader is killed with SIGKILL while its dead-letter worker holds
dead letters it could not deliver yet (the target refuses them: it is full, with
reject-publish). A new leader's worker takes over what was not settled, and once the
target is drained every message has arrived there (duplicates allowed), none is left
in the source.
"""

from __future__ import annotations

import pika
import pytest

from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import connect, leader_of, status
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(600)  # the waits inside have their own bounds

MESSAGES = 120
TARGET_LIMIT = 30
BOUND = 90.0


def row(uri: str, name: str) -> dict | None:
    return next((q for q in call(uri, "queues.list", vhost="/") if q["name"] == name), None)


def test_a_killed_source_leader_loses_no_dead_letter():
    # a small prefetch: the worker holds few at a time, so many are in the source
    # (and a retry every second, not RabbitMQ's default 180 s)
    with LocalCluster(3, extra_config="dead_letter_worker_consumer_prefetch = 4\n"
                      "dead_letter_worker_publisher_confirm_timeout = 1000\n") as cluster:
        uris = cluster.uris()
        wait_for("a metadata leader on every node", lambda: all(
            status(uri)["metadata_leader"] for uri in uris), timeout=BOUND)
        with connect(uris[0]) as connection:
            channel = connection.channel()
            channel.queue_declare("alo-dst", durable=True, arguments={
                "x-queue-type": "quorum", "x-max-length": TARGET_LIMIT,
                "x-overflow": "reject-publish"})
            channel.queue_declare("alo-src", durable=True, arguments={
                "x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish", "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": "alo-dst"})
            channel.confirm_delivery()
            for number in range(MESSAGES):
                channel.basic_publish("", "alo-src", b"%d" % number,
                                      pika.BasicProperties(delivery_mode=2))
            # every message rejected by a client: dead-lettered at least once
            channel.basic_qos(prefetch_count=MESSAGES)
            tags = []
            for method, _properties, _body in channel.consume("alo-src",
                                                              inactivity_timeout=BOUND):
                assert method is not None, "the source queue stopped delivering"
                tags.append(method.delivery_tag)
                if len(tags) == MESSAGES:
                    break
            channel.basic_nack(tags[-1], multiple=True, requeue=False)
            channel.cancel()

            # a queue with one replica: the other nodes' queues list asks it for its
            # counts, held dead letters included
            channel.queue_declare("alo-one", durable=True, arguments={
                "x-queue-type": "quorum", "x-quorum-initial-group-size": 1,
                "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
                "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "alo-nowhere"})
            channel.basic_publish("", "alo-one", b"one")
            method = wait_for("a message in alo-one",
                              lambda: channel.basic_get("alo-one")[0], timeout=BOUND)
            channel.basic_nack(method.delivery_tag, requeue=False)
        one = wait_for("alo-one's replica", lambda: (
            (record := row(uris[0], "alo-one")) and record["members"] and record),
            timeout=BOUND)
        elsewhere = next(uri for name, uri in zip(cluster.names, uris)
                         if name not in one["members"])
        wait_for("alo-one's held dead letter counted on a node without a replica",
                 lambda: row(elsewhere, "alo-one")["messages_dlx"] == 1, timeout=BOUND)
        assert row(elsewhere, "alo-one")["message_bytes_dlx"] == 3

        leader = wait_for("the source queue's leader", lambda: leader_of(uris[0], "alo-src"),
                          timeout=BOUND)
        others = [name for name in cluster.names if name != leader]
        watch = cluster.uri(others[0])
        # the target is full and refuses the rest: the source holds them (its worker
        # retries), and reports them
        # (a dead letter the target confirmed may still be held until its settle is
        # applied: the sum may exceed MESSAGES by those)
        wait_for("the source holding what the full target refuses", lambda: (
            (src := row(watch, "alo-src")) and (dst := row(watch, "alo-dst"))
            and src["ready"] == 0 and src["unacked"] == 0 and dst["ready"] >= TARGET_LIMIT
            and src["messages_dlx"] >= MESSAGES - dst["ready"] > 0), timeout=BOUND)

        cluster.kill(leader)  # SIGKILL
        wait_for("a new leader of the source queue", lambda: leader_of(
            watch, "alo-src") not in (None, leader), timeout=BOUND)

        # drain the target: the new leader's worker delivers what is left
        bodies: list[bytes] = []
        with connect(watch) as connection:
            channel = connection.channel()

            def drained_all() -> bool:
                while (got := channel.basic_get("alo-dst", auto_ack=True))[0] is not None:
                    bodies.append(got[2])
                source = row(watch, "alo-src")
                return (set(bodies) == {b"%d" % n for n in range(MESSAGES)}
                        and source["messages_dlx"] == 0)

            wait_for("every dead letter in the target, none left in the source",
                     drained_all, timeout=BOUND, interval=0.2)
        assert sorted(set(bodies)) == sorted(b"%d" % n for n in range(MESSAGES))
        assert len(bodies) >= MESSAGES  # duplicates allowed, loss not
        assert row(watch, "alo-src")["message_bytes_dlx"] == 0

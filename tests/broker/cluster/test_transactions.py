"""AMQP transactions on a quorum queue in a 3-node cluster: tx.commit-ok promises what a
publisher confirm promises (the quorum queues guide, "Data Safety": a message is
confirmed once a majority of the queue's members has it), so with two of the three
members paused it does not come back, and once they run again it does.

On a single node the same holds for a durable classic queue: commit-ok leaves only
after the fsync of the batch holding the publishes (the server sends no output before
the Sync that covers it; tests/broker/server/test_group_commit.py)."""

from __future__ import annotations

import threading

import pika
import pytest

from tests.broker.cluster.test_cluster import connect, drain, leader_of, status
from tests.support.cluster import CONVERGE_TIMEOUT, LocalCluster, wait_for

pytestmark = pytest.mark.timeout(300)  # the waits inside have their own bounds

UNANSWERED = 3.0  # how long commit-ok must stay away while the majority is paused


def test_tx_commit_waits_for_the_queues_majority():
    with LocalCluster(3, proxied=False) as cluster:
        one, two, three = cluster.names
        uri = cluster.uri(one)
        wait_for("a metadata leader", lambda: status(uri)["metadata_leader"])
        with connect(uri) as setup:
            channel = setup.channel()
            channel.queue_declare("tx-q", durable=True, arguments={"x-queue-type": "quorum"})
            channel.confirm_delivery()  # a confirmed publish: the group is up
            channel.basic_publish("", "tx-q", b"before", pika.BasicProperties(delivery_mode=2))
        wait_for("a leader of tx-q", lambda: leader_of(uri, "tx-q"))

        connection = connect(uri)
        channel = connection.channel()
        channel.tx_select()
        channel.basic_publish("", "tx-q", b"in-tx", pika.BasicProperties(delivery_mode=2))
        outcome: dict = {}

        def commit() -> None:
            try:
                channel.tx_commit()
                outcome["ok"] = True
            except Exception as error:  # noqa: BLE001 - reported by the assertion below
                outcome["error"] = error

        cluster.pause(two)
        cluster.pause(three)
        committer = threading.Thread(target=commit, daemon=True)
        try:
            committer.start()
            committer.join(UNANSWERED)
            assert committer.is_alive() and not outcome, (
                f"tx.commit answered with 2 of 3 members paused: {outcome}")
        finally:
            cluster.resume(two)
            cluster.resume(three)
        committer.join(CONVERGE_TIMEOUT)
        assert outcome == {"ok": True}, outcome
        connection.close()
        assert drain(uri, "tx-q", 2) == [b"before", b"in-tx"]

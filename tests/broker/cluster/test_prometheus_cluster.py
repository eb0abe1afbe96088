"""Prometheus metrics of a 3-node cluster (broker/metrics/README.md): a quorum queue's
counts come from its leader only, so summing the nodes' /metrics/per-object (what a
dashboard does) counts each message once, while every member reports its own Raft
state; each node says who it is in rabbitmq_identity_info. `quorumqueue cluster start`
gives each node a Prometheus port of its own (AMQP port + 10020; free ports here).
"""

from __future__ import annotations

import pika
import pytest

from tests.broker.cluster.test_cluster import connect, status
from tests.support.cluster import LocalCluster, wait_for
from tests.support.prometheus import scrape, value

pytestmark = pytest.mark.timeout(400)  # the waits inside have their own bounds

MESSAGES = 6


def per_object(cluster) -> dict[str, dict]:
    return {plan.name: scrape(plan.prometheus_port, "/metrics/per-object")
            for plan in cluster.plans}


def reporting(samples: dict, name: str, queue: str) -> list[float]:
    return [v for labels, v, _t in samples.get(name, ()) if labels.get("queue") == queue]


def test_a_quorum_queue_is_counted_once_and_raft_reported_by_every_member():
    with LocalCluster(3, proxied=False) as cluster:
        uris = cluster.uris()
        wait_for("a metadata leader on every node", lambda: all(
            status(uri)["metadata_leader"] for uri in uris))
        with connect(uris[1]) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("metrics-qq", durable=True,
                                  arguments={"x-queue-type": "quorum"})
            for number in range(MESSAGES):
                channel.basic_publish("", "metrics-qq", b"%d" % number,
                                      pika.BasicProperties(delivery_mode=2))

        def converged() -> bool:
            scrapes = per_object(cluster)
            ready = [reporting(s, "rabbitmq_queue_messages_ready", "metrics-qq")
                     for s in scrapes.values()]
            commits = [reporting(s, "rabbitmq_raft_log_commit_index", "metrics-qq")
                       for s in scrapes.values()]
            return (sorted(len(r) for r in ready) == [0, 0, 1]
                    and sum(sum(r) for r in ready) == MESSAGES
                    and all(len(c) == 1 and c[0] >= MESSAGES for c in commits))

        wait_for("the leader alone reporting the queue's count, every member its Raft "
                 "state", converged)
        scrapes = per_object(cluster)
        [leader] = [name for name, s in scrapes.items()
                    if reporting(s, "rabbitmq_queue_messages_ready", "metrics-qq")]
        terms = {value(s, "rabbitmq_raft_term_total", vhost="/", queue="metrics-qq")
                 for s in scrapes.values()}
        assert len(terms) == 1  # one term, agreed by the members
        assert {name: s["rabbitmq_identity_info"][0][0]["rabbitmq_node"]
                for name, s in scrapes.items()} == {name: name for name in cluster.names}
        [row] = [q for q in status(uris[0])["queues"] if q["name"] == "metrics-qq"]
        assert leader == row["leader"]  # the node `cluster status` names

"""Message statistics are the cluster's, as RabbitMQ's management plugin shows them:
each node counts what its own clients do with a queue (publishes, deliveries, gets,
acks), and `/api/queues` and `/api/overview` on any node show every node's counts
summed, the same figures on every node, with rates of the summed counts
(management/rates.py). A node that stops answering counts with what it last told."""

from __future__ import annotations

import pika
import pytest

from tests.support.cluster import LocalCluster

from .support import call, wait_for, wait_until_serving

INTERVAL_MS = 2000   # collect_statistics_interval: a rate stays visible for 2 s
QUEUE_COUNTS = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "deliver_get",
                "redeliver", "ack")


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False,
                      extra_config=f"collect_statistics_interval = {INTERVAL_MS}\n") as nodes:
        for name in nodes.names:
            wait_until_serving(nodes.management_url(name))
        yield nodes


def _row(cluster, node, name):
    status, body, _ = call(cluster.management_url(node), "GET", f"/api/queues/%2F/{name}")
    return body if status == 200 else None


def _counts(stats: dict) -> dict:
    return {key: value for key, value in stats.items() if not key.endswith("_details")}


def _declare(cluster, name: str, queue_type: str) -> None:
    first = cluster.management_url(cluster.names[0])
    assert call(first, "PUT", f"/api/queues/%2F/{name}",
                {"durable": True, "arguments": {"x-queue-type": queue_type}})[0] == 201
    # every node lists it with rates (its sampler has two samples): a later publish
    # shows as a rate
    for node in cluster.names:
        wait_for(lambda node=node: (lambda row: row is not None and "publish_details" in
                                    row["message_stats"])(_row(cluster, node, name)),
                 f"the queue's message rates on {node}")


def _consume(cluster, node, name: str, count: int) -> None:
    """A consumer on `node` takes `count` messages, is cancelled, and acks them."""
    connection = pika.BlockingConnection(pika.URLParameters(cluster.uri(node)))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=count)
        taken = []
        channel.basic_consume(name, lambda ch, method, properties, body: taken.append(method))
        wait_for(lambda: connection.process_data_events(time_limit=0.2) or len(taken) >= count,
                 f"{count} deliveries on {node}")
        channel.basic_cancel(channel.consumer_tags[0])
        for method in taken:
            channel.basic_ack(method.delivery_tag)
        assert len(taken) == count
    finally:
        connection.close()


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_every_node_shows_the_clusters_message_stats(cluster, queue_type):
    """Publish through the first node, consume and ack through the second, basic.get
    through the third: /api/queues on every node shows all of it, and the third
    node, whose clients published nothing, shows a publish rate."""
    one, two, three = cluster.names
    name = f"summed-{queue_type}"
    _declare(cluster, name, queue_type)
    before = {node: _counts(call(cluster.management_url(node), "GET", "/api/overview")[1][
        "message_stats"]) for node in cluster.names}

    connection = pika.BlockingConnection(pika.URLParameters(cluster.uri(one)))
    channel = connection.channel()
    channel.confirm_delivery()
    for n in range(10):
        channel.basic_publish("", name, b"%d" % n)
    published = [10]

    def publish_rate_seen() -> bool:
        # a rate shows for one sampling interval: on a slow machine the poll may miss
        # it, so each miss publishes one more message (counted) for the next interval
        if _row(cluster, three, name)["message_stats"]["publish_details"]["rate"] > 0:
            return True
        channel.basic_publish("", name, b"more")
        published[0] += 1
        return False

    wait_for(publish_rate_seen, "a publish rate on the node that published nothing")
    connection.close()

    _consume(cluster, two, name, 4)
    connection = pika.BlockingConnection(pika.URLParameters(cluster.uri(three)))
    channel = connection.channel()
    for _ in range(3):
        method, _properties, _body = channel.basic_get(name, auto_ack=False)
        assert method is not None
        channel.basic_ack(method.delivery_tag)
    connection.close()

    expected = {"publish": published[0], "deliver": 4, "deliver_no_ack": 0, "get": 3,
                "get_no_ack": 0, "deliver_get": 7, "redeliver": 0, "ack": 7}
    left = published[0] - 7
    for node in cluster.names:
        wait_for(lambda node=node: (lambda row: row is not None and row["messages"] == left and
                                    _counts(row["message_stats"]) == expected)(
            _row(cluster, node, name)), f"the cluster's counts on {node}")
        listed = {row["name"]: row for row in call(cluster.management_url(node), "GET",
                                                   "/api/queues")[1]}
        assert _counts(listed[name]["message_stats"]) == expected
    rated = _row(cluster, three, name)["message_stats"]
    assert {f"{key}_details" for key in QUEUE_COUNTS} <= set(rated)

    # the overview's message_stats are summed too: each node moved by the same amounts
    def moved(node):
        after = _counts(call(cluster.management_url(node), "GET", "/api/overview")[1][
            "message_stats"])
        return {key: after[key] - before[node][key]
                for key in ("publish", "deliver", "get", "deliver_get", "ack")}

    for node in cluster.names:
        wait_for(lambda node=node: moved(node) == {"publish": published[0], "deliver": 4,
                                                   "get": 3, "deliver_get": 7, "ack": 7},
                 f"the overview's totals on {node}")
    totals = [_counts(call(url, "GET", "/api/overview")[1]["message_stats"])
              for url in cluster.management_urls()]
    assert totals[0] == totals[1] == totals[2]


def test_an_unreachable_node_counts_with_what_it_last_told(cluster):
    """A node that stops answering (paused) is left in the totals with its last
    counts: its clients' deliveries and acks do not vanish from the other nodes'
    figures while it is cut off."""
    one, two, _three = cluster.names
    name = "summed-paused"
    _declare(cluster, name, "quorum")
    first = cluster.management_url(one)
    for _ in range(5):
        assert call(first, "POST", "/api/exchanges/%2F/amq.default/publish",
                    {"properties": {}, "routing_key": name, "payload": "m",
                     "payload_encoding": "string"})[1] == {"routed": True}
    _consume(cluster, two, name, 2)
    wait_for(lambda: (lambda stats: stats["deliver"] == 2 and stats["ack"] == 2)(
        _row(cluster, one, name)["message_stats"]), "the second node's deliveries on the first")
    cluster.pause(two)
    try:
        wait_for(lambda: not {row["name"]: row for row in call(first, "GET", "/api/nodes")[1]}[
            two]["running"], "the first node to see the second one gone")
        stats = _counts(_row(cluster, one, name)["message_stats"])
        assert stats["publish"] == 5 and stats["deliver"] == 2 and stats["ack"] == 2
    finally:
        cluster.resume(two)
    wait_for(lambda: all(row["running"] for row in call(first, "GET", "/api/nodes")[1]),
             "the second node back")

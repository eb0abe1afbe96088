"""Every node of a cluster answers the management API with the same queues: a quorum
queue declared through one node's HTTP API is listed by every node with the same
leader, members, online members and counts (the queue-type interface's stats ask the
member that serves the queue when a node holds no replica)."""

from __future__ import annotations

import pytest

from tests.support.cluster import LocalCluster

from .support import call, wait_for, wait_until_serving


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False) as nodes:
        for name in nodes.names:
            wait_until_serving(nodes.management_url(name))
        yield nodes


def test_every_node_lists_the_same_quorum_queue(cluster):
    first = cluster.management_url(cluster.names[0])
    assert call(first, "PUT", "/api/queues/%2F/everywhere",
                {"durable": True, "arguments": {"x-queue-type": "quorum"}})[0] == 201
    for _ in range(4):
        assert call(first, "POST", "/api/exchanges/%2F/amq.default/publish",
                    {"properties": {}, "routing_key": "everywhere", "payload": "m",
                     "payload_encoding": "string"})[1] == {"routed": True}

    def row(name):
        status, body, _ = call(cluster.management_url(name), "GET",
                               "/api/queues/%2F/everywhere")
        if status != 200:
            return None
        return {key: body[key] for key in ("type", "leader", "members", "online",
                                            "messages", "messages_ready")}

    expected = wait_for(lambda: (lambda r: r if r and r["messages"] == 4 and
                                 len(r["online"]) == 3 else None)(row(cluster.names[0])),
                        "the queue on the first node")
    assert expected["type"] == "quorum"
    assert sorted(expected["members"]) == sorted(cluster.names)
    for name in cluster.names[1:]:
        wait_for(lambda name=name: row(name) == expected, f"the same row on {name}")
    nodes = call(first, "GET", "/api/nodes")[1]
    assert sorted(node["name"] for node in nodes) == sorted(cluster.names)
    assert all(node["running"] for node in nodes)
    assert call(first, "GET", "/api/health/checks/node-is-quorum-critical")[:2] == (
        200, {"status": "ok"})

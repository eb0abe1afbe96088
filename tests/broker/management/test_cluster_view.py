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


def test_the_leader_shows_each_members_raft_progress(cluster):
    """/api/queues/V/NAME/raft (quorumqueue's own, like rabbitmq-queues quorum_status):
    the leader's node reports its term and indexes and each follower's match index,
    which reaches the commit index once the followers have the entries."""
    first = cluster.management_url(cluster.names[0])
    assert call(first, "PUT", "/api/queues/%2F/raft-status",
                {"durable": True, "arguments": {"x-queue-type": "quorum"}})[0] == 201
    for _ in range(3):
        assert call(first, "POST", "/api/exchanges/%2F/amq.default/publish",
                    {"properties": {}, "routing_key": "raft-status", "payload": "m",
                     "payload_encoding": "string"})[1] == {"routed": True}

    def from_leader():
        status, row, _ = call(first, "GET", "/api/queues/%2F/raft-status")
        if status != 200 or not row.get("leader"):
            return None
        status, body, _ = call(cluster.management_url(row["leader"]), "GET",
                               "/api/queues/%2F/raft-status/raft")
        if status != 200:
            return None
        members = {member["node"]: member for member in body["members"]}
        leader = members[body["leader"]]
        followers = [member for name, member in members.items() if name != body["leader"]]
        caught_up = leader.get("raft_state") == "leader" and all(
            member.get("match_index") == leader["commit_index"] for member in followers)
        return (body, leader, followers) if caught_up else None

    body, leader, followers = wait_for(from_leader, "every follower caught up")
    assert sorted(member["node"] for member in body["members"]) == sorted(cluster.names)
    assert leader["term"] >= 1 and leader["commit_index"] >= 3
    assert leader["last_applied"] <= leader["commit_index"] <= leader["last_log_index"]
    assert all(member["raft_state"] == "follower" and member["online"]
               and member["replication"] in ("probe", "replicate", "snapshot")
               for member in followers)
    # a follower's node reports its own role, term and indexes
    other = followers[0]["node"]
    mine = {member["node"]: member for member in call(
        cluster.management_url(other), "GET", "/api/queues/%2F/raft-status/raft")[1][
        "members"]}[other]
    assert mine["raft_state"] == "follower" and mine["term"] == leader["term"]

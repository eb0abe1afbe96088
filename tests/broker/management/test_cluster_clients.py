"""Connections, channels and consumers are the cluster's, as RabbitMQ's management
plugin lists them: `/api/connections`, `/api/channels` and `/api/consumers` on any
node list every node's clients, each row naming the node that holds it, and every
node's overview counts them all (management/clients.py)."""

from __future__ import annotations

from urllib.parse import quote

import pika
import pytest

from tests.support.cluster import LocalCluster

from .support import call, wait_for, wait_until_serving


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False) as nodes:
        for name in nodes.names:
            wait_until_serving(nodes.management_url(name))
        yield nodes


@pytest.fixture
def clients(cluster):
    """A connection on each node, with a channel consuming from `clients-q`."""
    first = cluster.management_url(cluster.names[0])
    assert call(first, "PUT", "/api/queues/%2F/clients-q",
                {"durable": True, "arguments": {"x-queue-type": "quorum"}})[0] in (201, 204)
    for node in cluster.names:
        wait_for(lambda node=node: call(cluster.management_url(node), "GET",
                                        "/api/queues/%2F/clients-q")[0] == 200,
                 f"the queue known on {node}")
    opened = {}
    for node in cluster.names:
        connection = pika.BlockingConnection(pika.URLParameters(cluster.uri(node)))
        channel = connection.channel()
        channel.basic_consume("clients-q", lambda *args: None, consumer_tag=f"tag-{node}")
        opened[node] = connection
    yield opened
    for connection in opened.values():
        if connection.is_open:
            connection.close()


def _get(cluster, node, path):
    status, body, _ = call(cluster.management_url(node), "GET", path)
    assert status == 200, (path, status, body)
    return body


def _local_name(connection) -> str:
    """The management name of a pika connection: "peer -> local" as the broker sees it."""
    sock = connection._impl._transport._sock
    here, there = sock.getsockname(), sock.getpeername()
    return f"{here[0]}:{here[1]} -> {there[0]}:{there[1]}"


def test_every_node_lists_every_nodes_clients(cluster, clients):
    names = {node: _local_name(connection) for node, connection in clients.items()}
    for asked in cluster.names:
        def listed(asked=asked):
            rows = _get(cluster, asked, "/api/connections")
            return {row["name"]: row["node"] for row in rows}
        wait_for(lambda asked=asked: all(listed(asked).get(names[node]) == node
                                         for node in cluster.names),
                 f"every node's connection listed on {asked}")
        channels = {row["connection_details"]["name"]: row
                    for row in _get(cluster, asked, "/api/channels")}
        consumers = {row["consumer_tag"]: row for row in _get(cluster, asked, "/api/consumers")}
        for node in cluster.names:
            assert channels[names[node]]["node"] == node
            assert channels[names[node]]["consumer_count"] == 1
            consumer = consumers[f"tag-{node}"]
            assert consumer["channel_details"]["node"] == node
            assert consumer["channel_details"]["connection_name"] == names[node]
            assert consumer["queue"] == {"name": "clients-q", "vhost": "/"}
            # one connection, by name, and its channels, on any node
            one = _get(cluster, asked, f"/api/connections/{quote(names[node], safe='')}")
            assert one["node"] == node and one["channels"] == 1
            assert [row["node"] for row in _get(
                cluster, asked,
                f"/api/connections/{quote(names[node], safe='')}/channels")] == [node]
        in_vhost = {row["name"] for row in _get(cluster, asked, "/api/vhosts/%2F/connections")}
        assert set(names.values()) <= in_vhost
        assert set(names.values()) <= {row["connection_details"]["name"] for row in
                                       _get(cluster, asked, "/api/vhosts/%2F/channels")}
        assert {f"tag-{node}" for node in cluster.names} <= {
            row["consumer_tag"] for row in _get(cluster, asked, "/api/consumers/%2F")}

    totals = [_get(cluster, node, "/api/overview")["object_totals"] for node in cluster.names]
    assert all(total == totals[0] for total in totals)
    assert totals[0]["connections"] >= 3 and totals[0]["channels"] >= 3
    assert totals[0]["consumers"] >= 3


def test_a_connection_on_another_node_is_closed_by_that_node(cluster, clients):
    one, _two, three = cluster.names
    name = _local_name(clients[three])
    wait_for(lambda: any(row["name"] == name
                         for row in _get(cluster, one, "/api/connections")),
             "the third node's connection listed on the first")
    status, _body, _ = call(cluster.management_url(one), "DELETE",
                            f"/api/connections/{quote(name, safe='')}")
    assert status == 204
    closed = []

    def gone() -> bool:
        try:
            clients[three].process_data_events(time_limit=0.2)
        except pika.exceptions.ConnectionClosedByBroker as error:
            closed.append(error)
        return bool(closed) or not clients[three].is_open

    wait_for(gone, "the third node's connection closed")
    assert closed, "closed by the broker"
    assert closed[0].reply_code == 320
    assert closed[0].reply_text == "CONNECTION_FORCED - Closed via management plugin"
    # listed until the client's close-ok (or its socket's end) reaches the third node
    wait_for(lambda: all(row["name"] != name for row in _get(cluster, one, "/api/connections")),
             "the closed connection no longer listed")
    assert call(cluster.management_url(one), "DELETE",
                f"/api/connections/{quote(name, safe='')}")[0] == 404


def test_an_unreachable_node_contributes_nothing(cluster, clients):
    """A node that stops answering (paused): the others list their own clients and
    each other's, without the paused node's, and count them alike."""
    one, two, three = cluster.names
    names = {node: _local_name(connection) for node, connection in clients.items()}
    first = cluster.management_url(one)
    wait_for(lambda: {names[node] for node in cluster.names} <= {
        row["name"] for row in _get(cluster, one, "/api/connections")},
        "every node's connection listed on the first")
    cluster.pause(two)
    try:
        wait_for(lambda: not {row["name"]: row for row in call(first, "GET", "/api/nodes")[1]}[
            two]["running"], "the first node to see the second one gone")
        listed = {row["name"]: row["node"] for row in _get(cluster, one, "/api/connections")}
        assert listed.get(names[one]) == one and listed.get(names[three]) == three
        assert names[two] not in listed
        assert f"tag-{two}" not in {row["consumer_tag"]
                                    for row in _get(cluster, one, "/api/consumers")}
        assert call(first, "GET", f"/api/connections/{quote(names[two], safe='')}")[0] == 404
        totals = _get(cluster, one, "/api/overview")["object_totals"]
        assert totals["connections"] == len(listed)
    finally:
        cluster.resume(two)
    wait_for(lambda: all(row["running"] for row in call(first, "GET", "/api/nodes")[1]),
             "the second node back")
    wait_for(lambda: {row["name"]: row["node"] for row in _get(
        cluster, one, "/api/connections")}.get(names[two]) == two,
        "the second node's connection listed again")

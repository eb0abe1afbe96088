"""Removing a node from a real 3-node cluster for good, as `rabbitmqctl
forget_cluster_node` does (broker/cluster/README.md, "Removing a node"): refused for
a running node, for the node the command talks to and for a stranger; once node 3 is
stopped and forgotten through node 1, nodes 1 and 2 no longer list it, the metadata
group and every quorum queue have two members and keep confirming publishes, and a
restart of node 1 does not bring node 3 back although its configuration names it."""

from __future__ import annotations

import signal

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from quorumqueue.client.management import ManagementError, call
from tests.broker.cluster.test_cluster import connect, status, wait_for
from tests.support.cluster import LocalCluster

pytestmark = pytest.mark.timeout(240)


def raft_members(uri: str, name: str) -> list[str]:
    return next(sorted(row["members"]) for row in call(uri, "queues.list", vhost="/")
                if row["name"] == name)


def publish_confirmed(uri: str, queue: str, count: int) -> None:
    with connect(uri) as connection:
        channel = connection.channel()
        channel.confirm_delivery()  # basic_publish raises if one is not confirmed
        for n in range(count):
            channel.basic_publish("", queue, b"%d" % n, pika.BasicProperties(delivery_mode=2),
                                  mandatory=True)


def test_forget_a_stopped_node_for_good():
    with LocalCluster(3, proxied=False) as cluster:
        one, two, three = cluster.names
        uri_one, uri_two, _ = cluster.uris()
        wait_for("every node reachable with a metadata leader", lambda: all(
            status(uri)["metadata_leader"] and all(n["reachable"] for n in status(uri)["nodes"])
            for uri in cluster.uris()), timeout=60)
        for queue in ("orders", "audit"):
            with connect(uri_one) as connection:
                connection.channel().queue_declare(queue, durable=True,
                                                   arguments={"x-queue-type": "quorum"})
            wait_for(f"{queue} on three members", lambda: raft_members(uri_one, queue)
                     == sorted(cluster.names))
        publish_confirmed(uri_one, "orders", 5)

        runner = CliRunner()
        refused = runner.invoke(main, ["ctl", "forget_cluster_node", "--base-uri", cluster.management_url(one), three])
        assert refused.exit_code == 1
        assert (f"PRECONDITION_FAILED - node {three} is running (reachable from {one}): stop "
                "it before forgetting it") in refused.output
        with pytest.raises(ManagementError, match=f"cannot forget {one}: it is the node this "
                                                  "command talks to"):
            call(uri_one, "cluster.forget_node", node=one)
        with pytest.raises(ManagementError, match="NOT_FOUND - node qq9@localhost is not a "
                                                  "member of this cluster"):
            call(uri_one, "cluster.forget_node", node="qq9@localhost")
        assert [n["name"] for n in status(uri_two)["nodes"]] == sorted(cluster.names)

        cluster.kill(three, signal.SIGTERM)
        wait_for("node 3 unreachable from node 1", lambda: not next(
            n["reachable"] for n in status(uri_one)["nodes"] if n["name"] == three))
        forgotten = runner.invoke(main, ["ctl", "forget_cluster_node", "--base-uri", cluster.management_url(one), three])
        assert forgotten.exit_code == 0, forgotten.output
        assert f"Removing node {three} from the cluster" in forgotten.output

        for uri in (uri_one, uri_two):
            assert [n["name"] for n in status(uri)["nodes"]] == [one, two]
            wait_for("the metadata group without node 3", lambda: status(uri)[
                "metadata_members"] == [one, two])
            for queue in ("orders", "audit"):
                row = next(q for q in status(uri)["queues"] if q["name"] == queue)
                assert sorted(row["members"]) == [one, two]
                wait_for(f"{queue}'s Raft group without node 3",
                         lambda: raft_members(uri, queue) == [one, two])
        publish_confirmed(uri_two, "orders", 5)
        publish_confirmed(uri_one, "audit", 3)
        with connect(uri_two) as connection:
            channel = connection.channel()
            assert channel.queue_declare("orders", passive=True).method.message_count == 10
            channel.queue_declare("after", durable=True, arguments={"x-queue-type": "quorum"})
        wait_for("a new queue placed on the two nodes left",
                 lambda: raft_members(uri_one, "after") == [one, two])

        # forgotten for good: a restart reads the node list from cluster_nodes.json
        cluster.restart(one)
        wait_for("node 1 back with a metadata leader", lambda: status(uri_one)[
            "metadata_leader"], timeout=60)
        assert [n["name"] for n in status(uri_one)["nodes"]] == [one, two]
        publish_confirmed(uri_one, "orders", 1)

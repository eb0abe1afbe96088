"""Operator policies and imported definitions in a real 3-node cluster: both go
through the metadata group (one path, like policies), so what was set or imported
through one node holds on every node: a quorum queue imported through node 1 gets
members and a leader, node 3 lists it with the operator policy that caps it, and the
cap holds for a publisher on node 2."""

from __future__ import annotations

import json

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import status, wait_for
from tests.support.cluster import LocalCluster

pytestmark = pytest.mark.timeout(300)


def ctl(url: str, *arguments: str) -> str:
    result = CliRunner().invoke(main, ["ctl", *arguments, "--base-uri", url])
    assert result.exit_code == 0, result.output
    return result.output


def test_definitions_imported_and_operator_policies_set_through_one_node_hold_on_all(
        tmp_path):
    with LocalCluster(3, proxied=False) as cluster:
        uris = cluster.uris()
        urls = cluster.management_urls()  # the command line's
        wait_for("every node reachable with a metadata leader", lambda: all(
            status(uri)["metadata_leader"] and all(n["reachable"] for n in status(uri)["nodes"])
            for uri in uris), timeout=60)
        path = tmp_path / "defs.json"
        path.write_text(json.dumps({
            "vhosts": [{"name": "shop"}],
            "permissions": [{"user": "guest", "vhost": "shop", "configure": ".*",
                             "write": ".*", "read": ".*"}],
            "queues": [{"vhost": "shop", "name": "orders", "type": "quorum", "durable": True,
                        "auto_delete": False, "arguments": {"x-queue-type": "quorum"}}],
            "parameters": [{"vhost": "shop", "component": "operator_policy", "name": "cap",
                            "value": {"pattern": "^orders$", "apply-to": "quorum_queues",
                                      "priority": 0, "definition": {"max-length": 3}}}]}))
        ctl(urls[0], "import_definitions", str(path))
        for uri in uris:
            wait_for("the queue and its operator policy on every node", lambda uri=uri: [
                (row["name"], row["operator_policy"], row["effective_policy_definition"])
                for row in call(uri, "queues.list", vhost="shop")] == [
                ("orders", "cap", {"max-length": 3})], timeout=60)
        row = call(uris[2], "queues.list", vhost="shop")[0]
        assert row["type"] == "quorum" and len(row["members"]) == 3
        connection = pika.BlockingConnection(pika.URLParameters(
            uris[1].replace("/%2F", "/shop")))
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(6):
            channel.basic_publish("", "orders", b"%d" % n, pika.BasicProperties(delivery_mode=2))
        wait_for("drop-head down to the operator policy's 3", lambda: channel.queue_declare(
            "orders", passive=True).method.message_count == 3, timeout=60)
        connection.close()
        ctl(urls[2], "clear_operator_policy", "-p", "shop", "cap")
        for uri in uris:
            wait_for("the operator policy gone everywhere", lambda uri=uri: call(
                uri, "operator_policies.list", vhost="shop") == [], timeout=60)
        exported = [json.loads(ctl(url, "export_definitions", "-")) for url in urls]
        assert all(document["queues"] == exported[0]["queues"] for document in exported)

"""Vhost and user limits in a real 3-node cluster: set through one node, they are
definitions of the metadata group, so every node enforces them (broker/README.md,
"Users, vhosts, permissions and policies"). Connections and channels are counted per
node (the documented difference from RabbitMQ, which counts them cluster-wide)."""

from __future__ import annotations

import pika
import pytest
from click.testing import CliRunner
from pika import exceptions as pe

from quorumqueue.broker.cli import main
from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import status, wait_for
from tests.support.cluster import LocalCluster

pytestmark = pytest.mark.timeout(240)


def ctl(uri: str, *arguments: str) -> None:
    result = CliRunner().invoke(main, ["ctl", *arguments, "--uri", uri])
    assert result.exit_code == 0, result.output


def test_limits_set_through_one_node_hold_on_every_node():
    with LocalCluster(3, proxied=False) as cluster:
        uris = cluster.uris()
        wait_for("every node reachable with a metadata leader", lambda: all(
            status(uri)["metadata_leader"] and all(n["reachable"] for n in status(uri)["nodes"])
            for uri in uris), timeout=60)
        ctl(uris[0], "add_vhost", "shop")
        ctl(uris[0], "set_permissions", "-p", "shop", "guest", ".*", ".*", ".*")
        ctl(uris[0], "set_vhost_limits", "-p", "shop", '{"max-connections": 1, "max-queues": 1}')
        for uri in uris:  # answered once applied on the proposing node; the others follow
            wait_for("the limits on every node", lambda uri=uri: call(
                uri, "vhosts.list_limits", vhost="shop") == [
                {"vhost": "shop", "limits": {"max-connections": 1, "max-queues": 1}}])
        shop = [uri.replace("/%2F", "/shop") for uri in uris]
        held = [pika.BlockingConnection(pika.URLParameters(uri)) for uri in shop]
        try:
            for uri in shop:  # one connection per node: the next one on each is refused
                with pytest.raises(pe.ProbableAccessDeniedError) as refused:
                    pika.BlockingConnection(pika.URLParameters(uri))
                assert "connection limit (1) is reached" in str(refused.value)
            held[0].channel().queue_declare("orders", durable=True,
                                            arguments={"x-queue-type": "quorum"})
            wait_for("the queue known on node 3", lambda: any(
                row["name"] == "orders" for row in call(uris[2], "queues.list", vhost="shop")))
            with pytest.raises(pe.ChannelClosedByBroker) as refused:
                held[2].channel().queue_declare("more", durable=True,
                                                arguments={"x-queue-type": "quorum"})
            assert refused.value.reply_text == ("PRECONDITION_FAILED - cannot declare queue "
                                                "'more': queue limit in vhost 'shop' (1) is "
                                                "reached")
        finally:
            for connection in held:
                connection.close()

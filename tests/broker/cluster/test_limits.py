"""Vhost and user limits in a real 3-node cluster: set through one node, they are
definitions of the metadata group, so every node enforces them (docs/behaviour/access-and-policies.md). Connections and channels are counted
cluster-wide, as RabbitMQ counts them (rabbit_connection_tracking,
rabbit_channel_tracking): each node's counts reach the others within a tick
(broker/cluster/tracking.py), so a refusal is waited for, as the differential tests
wait for RabbitMQ's; during a partition each side counts what it can reach."""

from __future__ import annotations

import pika
import pytest
from click.testing import CliRunner
from pika import exceptions as pe

from quorumqueue.cli.main import main
from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import status, wait_for
from tests.support.cluster import LocalCluster

pytestmark = pytest.mark.timeout(240)


def ctl(url: str, *arguments: str) -> None:
    result = CliRunner().invoke(main, ["ctl", *arguments, "--base-uri", url])
    assert result.exit_code == 0, result.output


def reachable_with_a_leader(cluster) -> list[str]:
    uris = cluster.uris()
    wait_for("every node reachable with a metadata leader", lambda: all(
        status(uri)["metadata_leader"] and all(n["reachable"] for n in status(uri)["nodes"])
        for uri in uris), timeout=60)
    return uris


def connect(uri: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(uri))


def refused(uri: str) -> str | None:
    """The refusal of a new connection to `uri` (str of pika's error, with RabbitMQ's
    reply text), or None if it was let in (then it is closed again)."""
    try:
        connect(uri).close()
    except pe.ProbableAccessDeniedError as error:
        return str(error)
    return None


def test_vhost_limits_count_every_node_s_connections_and_queues():
    with LocalCluster(3, proxied=True) as cluster:
        uris = reachable_with_a_leader(cluster)
        admin = cluster.management_urls()[0]  # the command line talks to its HTTP API
        ctl(admin, "add_vhost", "shop")
        ctl(admin, "set_permissions", "-p", "shop", "guest", ".*", ".*", ".*")
        ctl(admin, "set_vhost_limits", "-p", "shop", '{"max-connections": 2, "max-queues": 1}')
        for uri in uris:  # answered once applied on the proposing node; the others follow
            wait_for("the limits on every node", lambda uri=uri: call(
                uri, "vhosts.list_limits", vhost="shop") == [
                {"vhost": "shop", "limits": {"max-connections": 2, "max-queues": 1}}])
        shop = [uri.replace("/%2F", "/shop") for uri in uris]
        held = [connect(shop[0]), connect(shop[1])]   # on two different nodes
        try:
            # the third, on the third node, is refused with RabbitMQ's text, once node 3
            # has the others' counts (within a tick; waited for, not assumed)
            text = wait_for("node 3 refusing a third connection", lambda: refused(shop[2]))
            assert ("NOT_ALLOWED - access to vhost 'shop' refused for user 'guest': "
                    "connection limit (2) is reached") in text
            assert "connection limit (2) is reached" in refused(shop[0])  # and on node 1
            held.pop(0).close()
            held.append(wait_for("node 3 letting one in again", lambda: _opened(shop[2])))
            # max-queues counts queue records, which every node has: a classic queue
            # declared on node 2 fills the vhost for node 3 too
            held[0].channel().queue_declare("orders", durable=True,
                                            arguments={"x-queue-type": "classic"})
            wait_for("the queue known on node 3", lambda: any(
                row["name"] == "orders" for row in call(uris[2], "queues.list", vhost="shop")))
            with pytest.raises(pe.ChannelClosedByBroker) as closed:
                held[1].channel().queue_declare("more", durable=True,
                                                arguments={"x-queue-type": "quorum"})
            assert closed.value.reply_text == ("PRECONDITION_FAILED - cannot declare queue "
                                               "'more': queue limit in vhost 'shop' (1) is "
                                               "reached")
            # a partition: node 3 cut off counts only its own connection, as RabbitMQ
            # counts only the nodes it reaches (eventually consistent limits)
            cluster.isolate(2)
            held.append(wait_for("isolated node 3 letting a second one in",
                                 lambda: _opened(shop[2]), timeout=60))
            cluster.heal()
            # healed: node 1 counts three again (one on node 2, two on node 3)
            text = wait_for("node 1 refusing again after the heal", lambda: refused(shop[0]),
                            timeout=60)
            assert "connection limit (2) is reached" in text
        finally:
            for connection in held:
                if connection.is_open:
                    connection.close()


def _opened(uri: str) -> pika.BlockingConnection | None:
    try:
        return connect(uri)
    except pe.ProbableAccessDeniedError:
        return None


def test_user_limits_count_every_node_s_connections_and_channels():
    with LocalCluster(3, proxied=False) as cluster:
        uris = reachable_with_a_leader(cluster)
        admin = cluster.management_urls()[0]  # the command line talks to its HTTP API
        ctl(admin, "add_user", "alice", "alice")
        ctl(admin, "set_permissions", "-p", "/", "alice", ".*", ".*", ".*")
        ctl(admin, "set_user_limits", "alice", '{"max-connections": 2, "max-channels": 2}')
        for uri in uris:
            wait_for("the limits on every node", lambda uri=uri: call(
                uri, "users.list_limits", name="alice") == [
                {"user": "alice", "limits": {"max-connections": 2, "max-channels": 2}}])
        alice = [uri.replace("guest:guest", "alice:alice") for uri in uris]
        held = [connect(alice[0]), connect(alice[1])]
        try:
            text = wait_for("node 3 refusing alice a third connection",
                            lambda: refused(alice[2]))
            assert ("NOT_ALLOWED - connection refused for user 'alice': user connection "
                    "limit (2) is reached") in text
            # two channels, one on each node: the third, on node 2, closes its connection
            held[0].channel()
            held[1].channel()
            wait_for("node 2 refusing a third channel", lambda: _channel_refused(held[1]))
            assert held[1].is_closed
        finally:
            for connection in held:
                if connection.is_open:
                    connection.close()


def _channel_refused(connection: pika.BlockingConnection) -> bool:
    try:
        channel = connection.channel()
    except pe.ConnectionClosedByBroker as error:
        assert error.reply_text == ("NOT_ALLOWED - number of channels opened for user "
                                    "'alice' has reached the maximum allowed user limit "
                                    "of (2)")
        return True
    channel.close()
    return False

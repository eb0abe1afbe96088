"""Classic queues on a 3-node cluster of real processes (queues/remote.py,
cluster/classic_link.py), used as a RabbitMQ user would: a classic queue lives on the
node that declared it, its record and bindings are on every node, and a client on any
node publishes to it (confirms from its host), consumes, gets, rejects, purges and
deletes it; every node lists it with the host's counts. An exclusive queue is its
connection's alone, on every node (405). No-ack consumers elsewhere flow through a
credit window; a killed consumer node's unacked messages return to the host. When the
host is killed, publishes through another node are nacked and consume, get and purge
answer RabbitMQ's 404; a non-durable queue
does not survive its host's restart, a durable one keeps its persistent messages.
The snapshot path (a follower restoring a snapshot with a classic queue) is in
test_metadata_snapshots.py.
"""

from __future__ import annotations

import signal

import pika
import pytest

from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import connect, status
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(300)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def row(uri: str, name: str) -> dict | None:
    for line in call(uri, "queues.list", vhost="/"):
        if line["name"] == name:
            return line
    return None


def counts_everywhere(cluster, name: str, ready: int, unacked: int) -> None:
    """Every node lists the queue with these counts, the first node as its host."""
    for uri in cluster.uris():
        wait_for(f"{name} listed on {uri} with ready={ready} unacked={unacked}", lambda: (
            (line := row(uri, name)) is not None and line["type"] == "classic"
            and (line["ready"], line["unacked"], line["leader"])
            == (ready, unacked, cluster.names[0])))


def gone_everywhere(cluster, name: str) -> None:
    for uri in cluster.uris():
        wait_for(f"{name} gone from {uri}'s list", lambda: row(uri, name) is None)


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False) as running:
        wait_for("every node reachable from every other", lambda: all(
            all(n["reachable"] for n in status(uri)["nodes"]) and status(uri)[
                "metadata_leader"] for uri in running.uris()))
        yield running


def test_a_queue_declared_on_node_one_is_used_from_node_three(cluster):
    one, _two, three = cluster.uris()
    with connect(one) as connection:
        assert connection.channel().queue_declare("cq-orders", durable=True).method.queue \
            == "cq-orders"
    counts_everywhere(cluster, "cq-orders", 0, 0)
    with connect(three) as connection:
        channel = connection.channel()
        channel.confirm_delivery()  # a nack would raise NackError
        for n in range(10):
            channel.basic_publish("", "cq-orders", f"m{n}".encode(), PERSISTENT)
        assert channel.queue_declare("cq-orders", passive=True).method.message_count == 10
        counts_everywhere(cluster, "cq-orders", 10, 0)

        method, _properties, body = channel.basic_get("cq-orders")
        assert (body, method.message_count, method.redelivered) == (b"m0", 9, False)
        counts_everywhere(cluster, "cq-orders", 9, 1)
        channel.basic_reject(method.delivery_tag, requeue=True)
        counts_everywhere(cluster, "cq-orders", 10, 0)

        channel.basic_qos(prefetch_count=3)
        received = []
        for method, _properties, body in channel.consume("cq-orders", inactivity_timeout=30):
            assert method is not None, f"deliveries stopped after {received}"
            received.append((body, method.redelivered))
            if len(received) == 4:  # 3 acked, and the prefetch's 3 out: m3, m4, m5
                counts_everywhere(cluster, "cq-orders", 4, 3)
            channel.basic_ack(method.delivery_tag)
            if len(received) == 10:
                break
        channel.cancel()
        assert received == [(b"m0", True)] + [(f"m{n}".encode(), False) for n in range(1, 10)]
        counts_everywhere(cluster, "cq-orders", 0, 0)

        for n in range(5):
            channel.basic_publish("", "cq-orders", b"later", PERSISTENT)
        assert channel.queue_purge("cq-orders").method.message_count == 5
        counts_everywhere(cluster, "cq-orders", 0, 0)
        channel.basic_publish("", "cq-orders", b"left", PERSISTENT)
        assert channel.queue_delete("cq-orders").method.message_count == 1
    gone_everywhere(cluster, "cq-orders")


def test_a_publish_through_another_node_keeps_its_bcc_keys_for_dead_lettering(cluster):
    """The forwarded publish ("cq.pub") carries the message's BCC keys to the host (the
    BCC header itself is removed at publish): the copy it dead-letters reaches the
    queue bound for the BCC key, as in RabbitMQ (the dead letter exchanges guide,
    "Routing Dead-Lettered Messages"; compared live in
    tests/differential/test_bcc_dead_letter_against_rabbitmq.py)."""
    one, _two, three = cluster.uris()
    with connect(one) as connection:
        channel = connection.channel()
        channel.exchange_declare("cq-bcc-dlx", "direct")
        for key in ("rk", "cc", "bcc"):
            channel.queue_declare(f"cq-bcc-to-{key}")
            channel.queue_bind(f"cq-bcc-to-{key}", "cq-bcc-dlx", key)
        channel.queue_declare("cq-bcc-src", arguments={"x-dead-letter-exchange": "cq-bcc-dlx"})
        channel.queue_bind("cq-bcc-src", "amq.direct", "rk")
    counts_everywhere(cluster, "cq-bcc-src", 0, 0)
    with connect(three) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("amq.direct", "rk", b"selected", pika.BasicProperties(
            headers={"CC": ["cc"], "BCC": ["bcc"]}))
        method, properties, _body = channel.basic_get("cq-bcc-src")
        assert "BCC" not in properties.headers
        channel.basic_reject(method.delivery_tag, requeue=False)
    for key in ("rk", "cc", "bcc"):
        counts_everywhere(cluster, f"cq-bcc-to-{key}", 1, 0)


def test_unacked_deliveries_return_when_the_consuming_channel_closes(cluster):
    one, two, _three = cluster.uris()
    with connect(one) as connection:
        channel = connection.channel()
        channel.queue_declare("cq-returns", durable=True)
        channel.confirm_delivery()
        for n in range(4):
            channel.basic_publish("", "cq-returns", f"r{n}".encode(), PERSISTENT)
    with connect(two) as connection:
        channel = connection.channel()
        taken = []
        for method, _properties, body in channel.consume("cq-returns", inactivity_timeout=30):
            assert method is not None
            taken.append(body)
            if len(taken) == 4:
                break
        counts_everywhere(cluster, "cq-returns", 0, 4)
        channel.close()  # nothing acked: the host takes them back
    counts_everywhere(cluster, "cq-returns", 4, 0)
    with connect(two) as connection:
        method, _properties, body = connection.channel().basic_get("cq-returns", auto_ack=True)
        assert (body, method.redelivered) == (b"r0", True)
        connection.channel().queue_delete("cq-returns")


def test_a_binding_made_on_node_two_routes_publishes_made_on_node_three(cluster):
    one, two, three = cluster.uris()
    with connect(one) as connection:
        connection.channel().queue_declare("cq-bound", durable=True)
    with connect(two) as connection:
        channel = connection.channel()
        wait_for("cq-bound known on node 2", lambda: row(two, "cq-bound"))
        channel.exchange_declare("cq-x", "direct", durable=True)
        channel.queue_bind("cq-bound", "cq-x", "red")
    with connect(three) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("cq-x", "red", b"routed", PERSISTENT, mandatory=True)
        channel.basic_publish("cq-x", "blue", b"unrouted", PERSISTENT)
    with connect(one) as connection:
        channel = connection.channel()
        method, _properties, body = channel.basic_get("cq-bound", auto_ack=True)
        assert (body, method.routing_key, method.message_count) == (b"routed", "red", 0)
        channel.queue_delete("cq-bound")
        channel.exchange_delete("cq-x")


def test_an_exclusive_queue_of_a_connection_on_node_one_is_locked_on_node_three(cluster):
    one, _two, three = cluster.uris()
    owner = connect(one)
    owner.channel().queue_declare("cq-mine", exclusive=True)
    wait_for("cq-mine known on node 3", lambda: row(three, "cq-mine"))
    locked = ("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'cq-mine' "
              "in vhost '/'. It could be originally declared on another connection or the "
              "exclusive property value does not match that of the original declaration.")
    with connect(three) as connection:
        for attempt in (lambda c: c.queue_declare("cq-mine", passive=True),
                        lambda c: c.basic_consume("cq-mine", lambda *a: None),
                        lambda c: c.queue_delete("cq-mine"),
                        lambda c: c.queue_bind("cq-mine", "amq.direct", "k")):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                attempt(connection.channel())
            assert (refused.value.reply_code, refused.value.reply_text) == (405, locked)
    owner.close()  # the owner's connection goes: so does the queue, on every node
    gone_everywhere(cluster, "cq-mine")


def test_an_auto_delete_queue_goes_when_its_last_consumer_on_another_node_does(cluster):
    one, _two, three = cluster.uris()
    with connect(one) as connection:
        connection.channel().queue_declare("cq-auto", auto_delete=True)
    wait_for("cq-auto known on node 3", lambda: row(three, "cq-auto"))
    with connect(three) as connection:
        channel = connection.channel()
        tag = channel.basic_consume("cq-auto", lambda *a: None)
        counts_everywhere(cluster, "cq-auto", 0, 0)
        wait_for("the host counts the remote consumer",
                 lambda: row(one, "cq-auto")["consumers"] == 1)
        channel.basic_cancel(tag)
    gone_everywhere(cluster, "cq-auto")


def test_a_no_ack_consumer_on_another_node_gets_more_than_one_credit_window(cluster):
    """No-ack deliveries flow in a credit window (quorum.NO_ACK_CREDIT, 2000) that the
    consuming node replenishes as it writes them: 3000 messages all arrive, in order."""
    one, _two, three = cluster.uris()
    count = 3000
    with connect(one) as connection:
        channel = connection.channel()
        channel.queue_declare("cq-flow", durable=False)
        for n in range(count):
            channel.basic_publish("", "cq-flow", str(n).encode())
    counts_everywhere(cluster, "cq-flow", count, 0)
    with connect(three) as connection:
        channel = connection.channel()
        received = []
        for method, _properties, body in channel.consume("cq-flow", auto_ack=True,
                                                         inactivity_timeout=30):
            assert method is not None, f"deliveries stopped after {len(received)}"
            received.append(int(body))
            if len(received) == count:
                break
        channel.cancel()
        assert received == list(range(count))
        channel.queue_delete("cq-flow")


def test_a_killed_consumer_node_gives_its_unacked_messages_back(cluster):
    """The host returns the unacked deliveries of a node that went silent, as
    RabbitMQ does for a consumer whose node is gone."""
    one, two, _three = cluster.uris()
    with connect(one) as connection:
        channel = connection.channel()
        channel.queue_declare("cq-orphans", durable=True)
        channel.confirm_delivery()
        for n in range(3):
            channel.basic_publish("", "cq-orphans", f"o{n}".encode(), PERSISTENT)
    consumer = connect(two)
    channel = consumer.channel()
    taken = 0
    for method, _properties, _body in channel.consume("cq-orphans", inactivity_timeout=30):
        assert method is not None
        taken += 1
        if taken == 3:
            break
    counts_everywhere(cluster, "cq-orphans", 0, 3)
    cluster.kill(1, signal.SIGKILL)
    wait_for("the host has the messages back", lambda: (
        (line := row(one, "cq-orphans")) is not None
        and (line["ready"], line["unacked"]) == (3, 0)))
    try:
        consumer.close()  # its node is gone
    except pika.exceptions.AMQPError:
        pass
    cluster.restart(1)
    counts_everywhere(cluster, "cq-orphans", 3, 0)
    with connect(two) as connection:
        method, _properties, body = connection.channel().basic_get("cq-orphans",
                                                                   auto_ack=True)
        assert (body, method.redelivered) == (b"o0", True)
        connection.channel().queue_delete("cq-orphans")


def test_a_killed_host_nacks_publishes_and_refuses_consumers_then_comes_back(cluster):
    one, _two, three = cluster.uris()
    with connect(one) as connection:
        channel = connection.channel()
        channel.queue_declare("cq-durable", durable=True)
        channel.queue_declare("cq-transient", durable=False)
        channel.confirm_delivery()
        channel.basic_publish("", "cq-durable", b"kept", PERSISTENT)
    for uri in cluster.uris():
        wait_for("both queues listed on " + uri, lambda: row(uri, "cq-durable")
                 and row(uri, "cq-transient"))

    cluster.kill(0, signal.SIGKILL)
    with connect(three) as connection:
        channel = connection.channel()
        channel.confirm_delivery()

        def nacked() -> bool:
            try:
                channel.basic_publish("", "cq-durable", b"lost", PERSISTENT)
            except pika.exceptions.NackError:
                return True
            return False
        wait_for("a publish to the dead host's queue nacked", nacked)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            connection.channel().basic_consume("cq-durable", lambda *a: None)
        assert (refused.value.reply_code, refused.value.reply_text) == (
            404, f"NOT_FOUND - home node '{cluster.names[0]}' of durable queue 'cq-durable' "
                 "in vhost '/' is down or inaccessible")
        for attempt in (lambda c: c.basic_get("cq-durable"),
                        lambda c: c.queue_purge("cq-durable")):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                attempt(connection.channel())
            assert refused.value.reply_code == 404

    cluster.restart(0)
    # RabbitMQ drops a non-durable queue with its node; the durable one keeps its
    # persistent message
    gone_everywhere(cluster, "cq-transient")
    counts_everywhere(cluster, "cq-durable", 1, 0)
    with connect(three) as connection:
        channel = connection.channel()
        method, _properties, body = channel.basic_get("cq-durable", auto_ack=True)
        assert body == b"kept"
        channel.queue_delete("cq-durable")

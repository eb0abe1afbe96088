"""A classic queue whose home node is down, against a cluster of RabbitMQ 3.10.8 nodes
(the classic queue mirroring guide, "Non-mirrored Queue Behavior in a Cluster": "A
durable queue will become unavailable until the node comes back. All operations on a
durable queue with unavailable leader node will fail", with not_found "home node ...
of durable queue ... is down or inaccessible"; "A non-durable one will be deleted").

On both: a durable and a transient classic queue declared through one node, a
persistent message confirmed into the durable one, that node stopped; then, through
another node: queue.declare (and passive), bind, unbind, basic.get, basic.consume,
queue.purge, queue.delete, publishes with confirms (mandatory and not), and a passive
declare of the transient queue. Each answer (the reply code and text, the home
node's name masked; or the publish's outcome) must be RabbitMQ's. RabbitMQ runs 2
nodes (its classic queues need no majority), quorumqueue 3 (its metadata group does).
"""

from __future__ import annotations

import signal

import pika
import pytest

from tests.support.cluster import LocalCluster, wait_for
from tests.support.rabbitmq import RabbitMQNode
from tests.support.rabbitmq_cluster import RabbitMQCluster

pytestmark = pytest.mark.timeout(600)

DURABLE, TRANSIENT = "hd-durable", "hd-transient"
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def answer(connection: pika.BlockingConnection, action) -> object:
    """What a client sees of `action(channel)` on a new channel: "ok", the broker's
    (code, text), or the publish outcome's exception name."""
    channel = connection.channel()
    try:
        action(channel)
    except pika.exceptions.ChannelClosedByBroker as error:
        return error.reply_code, error.reply_text
    except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as error:
        return type(error).__name__
    if channel.is_open:
        channel.close()
    return "ok"


def publish(mandatory: bool):
    def action(channel) -> None:
        channel.confirm_delivery()
        channel.basic_publish("", DURABLE, b"while down", PERSISTENT, mandatory=mandatory)
    return action


OPERATIONS = {
    "queue.declare": lambda c: c.queue_declare(DURABLE, durable=True),
    "queue.declare passive": lambda c: c.queue_declare(DURABLE, passive=True),
    "queue.bind": lambda c: c.queue_bind(DURABLE, "amq.direct", "hd-key"),
    "queue.unbind": lambda c: c.queue_unbind(DURABLE, "amq.direct", "hd-key"),
    "basic.get": lambda c: c.basic_get(DURABLE),
    "basic.consume": lambda c: c.basic_consume(DURABLE, lambda *_: None),
    "queue.purge": lambda c: c.queue_purge(DURABLE),
    "basic.publish mandatory": publish(True),
    "basic.publish": publish(False),
    "queue.delete": lambda c: c.queue_delete(DURABLE),
    "queue.declare passive after delete": lambda c: c.queue_declare(DURABLE, passive=True),
    "transient queue.declare passive": lambda c: c.queue_declare(TRANSIENT, passive=True),
}


# operation -> why quorumqueue answers otherwise, on purpose
DELIBERATE_DIFFERENCES = {
    "basic.publish mandatory":
        "RabbitMQ 3.10.8 drops a message whose only queue's home node is down and "
        "confirms it (returned first, as unroutable, when mandatory); quorumqueue nacks "
        "it: a publisher with confirms learns it was not stored and may publish again",
    "basic.publish": "the same, without mandatory: RabbitMQ acks, quorumqueue nacks",
}


def prepare(uri: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        channel.queue_declare(DURABLE, durable=True)
        channel.queue_declare(TRANSIENT, durable=False)
        channel.confirm_delivery()
        channel.basic_publish("", DURABLE, b"kept", PERSISTENT)
    finally:
        connection.close()


def observe(uri: str, home: str) -> dict:
    """Every operation's answer through `uri`, once the home node is seen down (a
    basic.get refused), the home node's name masked."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        wait_for("the home node seen down", lambda: answer(
            connection, OPERATIONS["basic.get"]) != "ok")
        found = {}
        for name, action in OPERATIONS.items():
            seen = answer(connection, action)
            if isinstance(seen, tuple):
                seen = (seen[0], seen[1].replace(home, "<home>"))
            found[name] = seen
        return found
    finally:
        connection.close()


def test_every_operation_on_a_classic_queue_whose_home_node_is_down_fails_as_rabbitmqs():
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with RabbitMQCluster(2) as rabbits:
        survivor, home = rabbits.nodes
        prepare(home.uri)
        home_name = home.node_name
        rabbits.stop_node(1)
        theirs = observe(survivor.uri, home_name)
    assert theirs["basic.get"] == (404, "NOT_FOUND - home node '<home>' of durable queue "
                                        f"'{DURABLE}' in vhost '/' is down or inaccessible")
    with LocalCluster(3) as cluster:
        wait_for("every node up", lambda: len(cluster.live_nodes()) == 3)
        prepare(cluster.uri(1))
        cluster.kill(1, signal.SIGTERM)
        ours = observe(cluster.uri(0), cluster.names[1])
    for name, reason in DELIBERATE_DIFFERENCES.items():
        assert ours[name] != theirs[name], f"{name} is now as RabbitMQ's: {reason}"
        ours[name] = theirs[name] = f"<deliberately different: {reason}>"
    assert ours == theirs

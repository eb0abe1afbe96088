"""A node is a cluster of one: every definition takes the metadata group's path.

Exchanges, bindings and quorum queues, users, vhosts, permissions and policies are
commands to the node's metadata group (a one-member Raft group when the node is
alone), answered once applied; the methods a client sends on the same channel after
a definition it did not wait for (nowait) act after it, in order, as on RabbitMQ,
whose channel process handles one method at a time.
"""

from __future__ import annotations

import json

from pamqp import commands

from tests.broker.node.harness import Client, Delivery, content_frames, marshal, method, \
    name, new_node, properties


def client_of(node) -> Client:
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    return client


def metadata_entries(node) -> int:
    return node.cluster.meta.raft.log.last_index()


def test_a_lone_node_declares_exchanges_and_quorum_queues_through_its_metadata_group():
    node = new_node()
    client = client_of(node)
    before = metadata_entries(node)
    client.call(1, method(commands.Exchange.Declare, exchange="orders", exchange_type="topic",
                          durable=True), "Exchange.DeclareOk")
    client.declare_queue(1, "orders.q", durable=True, arguments={"x-queue-type": "quorum"})
    client.call(1, method(commands.Queue.Bind, queue="orders.q", exchange="orders",
                          routing_key="#"), "Queue.BindOk")
    assert metadata_entries(node) >= before + 3
    assert node.cluster.meta.raft.members == (node.settings.node_name,)
    assert node.cluster.meta.is_leader


def test_methods_after_a_nowait_declare_act_after_it_in_order():
    """Declare an exchange and a queue and bind them with nowait, publish through the
    exchange and get the message, all in one burst of bytes: each method sees what
    the ones before it made, although the declarations go through the metadata log."""
    node = new_node()
    client = client_of(node)
    burst = b"".join(marshal(value, 1) for value in (
        method(commands.Exchange.Declare, exchange="events", exchange_type="direct",
               nowait=True),
        method(commands.Queue.Declare, queue="events.q", durable=True, nowait=True,
               arguments={"x-queue-type": "quorum"}),
        method(commands.Queue.Bind, queue="events.q", exchange="events", routing_key="k",
               nowait=True),
    ))
    burst += marshal(method(commands.Basic.Publish, exchange="events", routing_key="k"), 1)
    burst += content_frames(1, b"first", properties(delivery_mode=2))
    burst += marshal(method(commands.Basic.Get, queue="events.q", no_ack=True), 1)
    client.send_bytes(burst)
    replies = []
    for _ in range(20):  # each round applies what the previous one proposed
        replies += client.read_deliveries()
        if replies:
            break
    assert [name(r.method) if isinstance(r, Delivery) else name(r[1]) for r in replies] \
        == ["Basic.GetOk"], replies
    assert replies[0].body == b"first"


def test_definitions_go_through_the_metadata_group_on_a_lone_node():
    node = new_node()
    client = client_of(node)
    before = metadata_entries(node)
    client.call(1, method(commands.Basic.Consume, queue="amq.rabbitmq.reply-to", no_ack=True),
                "Basic.ConsumeOk")
    client.publish(1, "", "amq.quorumqueue.management",
                   json.dumps({"op": "vhosts.add", "name": "shop"}).encode(),
                   properties(reply_to="amq.rabbitmq.reply-to", correlation_id="1"))
    [reply] = client.read_deliveries()
    assert json.loads(reply.body) == {"ok": True, "result": {}}
    assert "shop" in node.vhosts
    assert metadata_entries(node) == before + 1

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


def _replies(client: Client, until: str) -> list[str]:
    names: list[str] = []
    for _ in range(20):  # each round applies what the previous one proposed
        names += [name(r.method) if isinstance(r, Delivery) else name(r[1])
                  for r in client.read_deliveries()]
        if until in names:
            break
    return names


def test_a_channel_close_after_a_nowait_declare_acts_after_the_methods_before_it():
    """The client declares and binds with nowait, publishes and closes the channel in
    one burst (a pipelining client, or pika's publish-then-close): the publishes land
    and close-ok comes last, as RabbitMQ's channel process answers the close in its
    turn. (Answering the close at once dropped the methods held behind the declare.)"""
    node = new_node()
    client = client_of(node)
    burst = b"".join(marshal(value, 1) for value in (
        method(commands.Queue.Declare, queue="closing.q", durable=True, nowait=True),
        method(commands.Queue.Bind, queue="closing.q", exchange="amq.direct",
               routing_key="k", nowait=True),
        method(commands.Confirm.Select)))
    for body in (b"one", b"two"):
        burst += marshal(method(commands.Basic.Publish, exchange="amq.direct",
                                routing_key="k"), 1)
        burst += content_frames(1, body, properties(delivery_mode=2))
    burst += marshal(commands.Channel.Close(200, "bye", 0, 0), 1)
    client.send_bytes(burst)
    names = _replies(client, "Channel.CloseOk")
    assert names[0] == "Confirm.SelectOk" and names[-1] == "Channel.CloseOk", names
    assert set(names[1:-1]) <= {"Basic.Ack"}, names
    assert node.vhosts["/"].queues["closing.q"].ready_count == 2
    client.open_channel(1)  # the number is free again once close-ok went out
    assert [client.get(1, "closing.q").body, client.get(1, "closing.q").body] \
        == [b"one", b"two"]


def test_a_method_failing_before_a_requested_close_closes_the_channel_with_its_error():
    """A held method that fails after the client already sent channel.close: RabbitMQ's
    channel sends channel.close with the error, then answers the client's close with
    close-ok (a closing channel's answer); the client's close-ok frees the number."""
    node = new_node()
    client = client_of(node)
    client.send_bytes(b"".join(marshal(value, 1) for value in (
        method(commands.Queue.Declare, queue="held.q", durable=True, nowait=True),
        method(commands.Queue.Bind, queue="held.q", exchange="no-such-exchange",
               routing_key="k", nowait=True),
        commands.Channel.Close(200, "bye", 0, 0))))
    replies = []
    for _ in range(20):
        replies += client.read_methods()
        if replies:
            break
    assert [(name(value), getattr(value, "reply_code", None)) for _c, value in replies] \
        == [("Channel.Close", 404), ("Channel.CloseOk", None)], replies
    assert "no exchange 'no-such-exchange'" in replies[0][1].reply_text
    client.send(1, commands.Channel.CloseOk())
    client.open_channel(1)
    assert "held.q" in node.vhosts["/"].queues


def test_a_connection_close_after_a_nowait_declare_acts_after_the_methods_before_it():
    """The same burst ending in channel 1's close and connection.close, with a second
    channel whose held bind fails: the publishes land, channel 1's close-ok comes in
    its turn, the failed channel just stops, and connection.close-ok comes once both
    channels are done, as RabbitMQ's reader closes a connection after its channels
    handled what they were sent."""
    node = new_node()
    client = client_of(node)
    client.open_channel(2)
    burst = b"".join(marshal(value, 1) for value in (
        method(commands.Queue.Declare, queue="leaving.q", durable=True, nowait=True),
        method(commands.Queue.Bind, queue="leaving.q", exchange="amq.direct",
               routing_key="k", nowait=True)))
    burst += b"".join(marshal(value, 2) for value in (
        method(commands.Queue.Declare, queue="other.q", durable=True, nowait=True),
        method(commands.Queue.Bind, queue="other.q", exchange="no-such-exchange",
               routing_key="k", nowait=True)))
    for body in (b"one", b"two"):
        burst += marshal(method(commands.Basic.Publish, exchange="amq.direct",
                                routing_key="k"), 1)
        burst += content_frames(1, body, properties(delivery_mode=2))
    burst += marshal(commands.Channel.Close(200, "bye", 0, 0), 1)
    burst += marshal(commands.Connection.Close(200, "bye", 0, 0), 0)
    client.send_bytes(burst)
    names = _replies(client, "Connection.CloseOk")
    assert names == ["Channel.CloseOk", "Connection.CloseOk"], names
    assert client.session.closed
    assert node.vhosts["/"].queues["leaving.q"].ready_count == 2


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


def test_a_classic_queue_is_declared_bound_and_deleted_through_the_metadata_group():
    """Classic queues are recorded in the metadata like quorum queues (RabbitMQ 4
    keeps every queue's record in Khepri): declare, bind and delete are log entries;
    an exclusive queue's record names its owner's connection, and the owner's close
    deletes it through the log too."""
    node = new_node()
    client = client_of(node)
    before = metadata_entries(node)
    client.declare_queue(1, "plain", durable=True)
    client.call(1, method(commands.Queue.Bind, queue="plain", exchange="amq.direct",
                          routing_key="k"), "Queue.BindOk")
    client.call(1, method(commands.Queue.Delete, queue="plain"), "Queue.DeleteOk")
    assert metadata_entries(node) == before + 3
    owned = client.declare_queue(1, "", exclusive=True).queue
    queue = node.vhosts["/"].queues[owned]
    assert (queue.host, queue.exclusive_owner) == (node.settings.node_name,
                                                  client.session.identity)
    assert metadata_entries(node) == before + 4
    other = client_of(node)
    other.send(1, method(commands.Queue.Declare, queue=owned, passive=True))
    [(_channel, refused)] = other.read_methods()
    assert (name(refused), refused.reply_code) == ("Channel.Close", 405)
    client.session.connection_lost()
    node.flush()
    assert owned not in node.vhosts["/"].queues
    assert metadata_entries(node) == before + 5


def test_a_restarted_lone_node_deletes_its_non_durable_and_exclusive_classic_queues(tmp_path):
    """As RabbitMQ after a restart: durable queues come back with their persistent
    messages; non-durable and exclusive ones are gone, deleted through the log after
    it was replayed (so a later replay agrees)."""
    from quorumqueue.broker.config import Settings
    from quorumqueue.broker.raft.storage import LogStore
    from quorumqueue.broker.raft.storage.config import StorageConfig
    from quorumqueue.broker.storage.message_store import MessageStore
    from quorumqueue.broker.storage.metadata_store import MetadataStore

    def start():
        data = str(tmp_path)
        node = new_node(Settings(data_dir=data), message_store=MessageStore(
            data + "/msgstore", segment_bytes=1 << 20, fsync=False),
            metadata_store=MetadataStore(data),
            log_store=LogStore(data, StorageConfig(fsync=False)))
        node.recover()
        node.cluster.meta.recover()
        node.flush()
        return node

    node = start()
    client = client_of(node)
    client.declare_queue(1, "kept", durable=True)
    client.declare_queue(1, "transient", durable=False)
    client.declare_queue(1, "mine", durable=True, exclusive=True)
    client.publish(1, "", "kept", b"stored", properties(delivery_mode=2))
    client.read()
    node.store.close()
    node = start()
    for _ in range(5):  # the deletions proposed after the replay are applied
        node.flush()
    queues = node.vhosts["/"].queues
    assert sorted(queues) == ["kept"]
    assert queues["kept"].ready_count == 1

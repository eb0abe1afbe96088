"""RabbitMQ behaviours real clients depend on, driven through `Session` by the harness
(each also checked against RabbitMQ 3.10.8 in tests/differential/):

- queue.delete if-empty refuses only a queue with ready messages (unacked ones do not
  count), through AMQP and the management RPC; quorum queues refuse the flag itself;
- when a consumer's own channel deletes its queue, queue.delete-ok comes before the
  server's basic.cancel;
- basic.consume from a quorum queue after basic.qos global=true closes the connection
  with 540 (rabbit_quorum_queue:consume, not_implemented: a hard error);
- a field table nested thousands deep is a 501 connection error, never a traceback;
  deep headers a message only carries are delivered as published;
- an unknown x-queue-leader-locator or x-dead-letter-strategy is refused with 406 and
  rabbit_amqqueue's reason (invalid_queue_locator_arg, invalid_dlx_strategy).
"""

from __future__ import annotations

import json
import struct

import pytest
from pamqp import commands

from quorumqueue.broker.amqp.connection import ConnectionState
from quorumqueue.broker.config import Settings
from quorumqueue.broker.node.node import Node
from quorumqueue.broker.raft.storage.config import StorageConfig
from quorumqueue.broker.raft.storage.log_store import LogStore
from tests.broker.node.harness import (Client, Delivery, method, new_node, properties,
                                       raw_frame)


def opened(node=None, *channels: int) -> Client:
    client = Client(node or new_node())
    client.handshake()
    for number in channels or (1,):
        client.open_channel(number)
    return client


def with_unacked_only(client: Client, queue: str) -> None:
    client.declare_queue(1, queue)
    client.publish(1, "", queue, b"taken")
    assert client.get(1, queue, no_ack=False).body == b"taken"


def test_if_empty_ignores_unacked_messages():
    """RabbitMQ (rabbit_amqqueue:check_if_empty counts ready messages): a queue whose
    only message is delivered and unacked is empty; delete-ok counts 0."""
    client = opened()
    with_unacked_only(client, "q")
    ok = client.call(1, commands.Queue.Delete(queue="q", if_empty=True), "Queue.DeleteOk")
    assert ok.message_count == 0
    assert "q" not in client.node.vhosts["/"].queues


def test_if_empty_refuses_ready_messages():
    client = opened()
    client.declare_queue(1, "q")
    client.publish(1, "", "q", b"ready")
    client.send(1, commands.Queue.Delete(queue="q", if_empty=True))
    close = client.expect_one("Channel.Close", channel=1)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        406, "PRECONDITION_FAILED - queue 'q' in vhost '/' not empty", 50, 40)


def test_the_management_rpc_if_empty_ignores_unacked_messages_too():
    client = opened(None, 1, 2)
    with_unacked_only(client, "q")
    client.call(2, method(commands.Basic.Consume, queue="amq.rabbitmq.reply-to", no_ack=True),
                "Basic.ConsumeOk")
    request = {"op": "queues.delete", "vhost": "/", "name": "q", "if_empty": True}
    client.publish(2, "", "amq.quorumqueue.management", json.dumps(request).encode(),
                   properties(reply_to="amq.rabbitmq.reply-to", correlation_id="1"))
    [reply] = [r for r in client.read_deliveries() if isinstance(r, Delivery)]
    assert json.loads(reply.body) == {"ok": True, "result": {"deleted": 0}}


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_delete_ok_comes_before_the_cancel_of_the_channels_own_consumer(tmp_path, queue_type):
    """RabbitMQ: the deleting channel gets queue.delete-ok, then basic.cancel for its
    consumer (consumer_cancel_notify); other channels' consumers get theirs too. A
    quorum queue's deletion goes through the metadata log: the same order."""
    client = opened(quorum_node(tmp_path), 1, 2)
    client.declare_queue(1, "q", durable=True, arguments={"x-queue-type": queue_type})
    for number, tag in ((1, "own"), (2, "other")):
        client.call(number, commands.Basic.Consume(queue="q", consumer_tag=tag),
                    "Basic.ConsumeOk")
    client.send(1, commands.Queue.Delete(queue="q"))
    sent = [(channel, value.name, getattr(value, "consumer_tag", None))
            for channel, value in client.read()]
    own = [frame for frame in sent if frame[0] == 1]
    assert own == [(1, "Queue.DeleteOk", None), (1, "Basic.Cancel", "own")]
    assert (2, "Basic.Cancel", "other") in sent


def quorum_node(tmp_path) -> Node:
    return new_node(log_store=LogStore(str(tmp_path), StorageConfig(fsync=False)))


def test_quorum_consume_after_global_qos_closes_the_connection(tmp_path):
    """rabbit_quorum_queue:consume refuses a channel with global QoS (not_implemented,
    540, a hard error): RabbitMQ 3.10 and 4.x close the connection, whatever the 4.2
    guide's "Global QoS" calls it."""
    client = opened(quorum_node(tmp_path))
    client.declare_queue(1, "qq", durable=True, arguments={"x-queue-type": "quorum"})
    client.call(1, commands.Basic.Qos(prefetch_count=3, global_=True), "Basic.QosOk")
    client.send(1, commands.Basic.Consume(queue="qq", consumer_tag="g"))
    close = client.expect_one("Connection.Close", channel=0)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        540, "NOT_IMPLEMENTED - queue 'qq' in vhost '/' does not support global qos", 60, 20)
    assert client.session.state is ConnectionState.CLOSING


@pytest.mark.parametrize("flag", ["if_empty", "if_unused"])
def test_quorum_queues_still_refuse_the_delete_flags(tmp_path, flag):
    client = opened(quorum_node(tmp_path))
    client.declare_queue(1, "qq", durable=True, arguments={"x-queue-type": "quorum"})
    client.send(1, commands.Queue.Delete(queue="qq", **{flag: True}))
    close = client.expect_one("Connection.Close", channel=0)
    assert close.reply_code == 540
    assert f"with {flag.replace('_', '-')} flag set are not supported" in close.reply_text


# ---------------------------------------------------------------- nested field tables


def nested_table(depth: int) -> bytes:
    """A field table (with its length) holding {"a": {"a": ... {}}} `depth` deep."""
    table = struct.pack(">I", 0)
    for _ in range(depth):
        table = struct.pack(">I", len(table) + 3) + b"\x01aF" + table
    return table


def deep_publish(channel: int, exchange: str, routing_key: str, depth: int) -> bytes:
    headers = b"\x01hF" + nested_table(depth)
    header = (struct.pack(">HHQH", 60, 0, 2, 1 << 13) + struct.pack(">I", len(headers))
              + headers)
    publish = (struct.pack(">HHH", 60, 40, 0) + bytes([len(exchange)]) + exchange.encode()
               + bytes([len(routing_key)]) + routing_key.encode() + b"\x00")
    return (raw_frame(1, channel, publish) + raw_frame(2, channel, header)
            + raw_frame(3, channel, b"hi")), header


@pytest.mark.parametrize("depth", [101, 5000])
def test_a_deeply_nested_declare_argument_is_a_connection_frame_error(depth):
    client = opened()
    client.send_bytes(raw_frame(1, 1, struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00"
                                + nested_table(depth)))
    close = client.expect_one("Connection.Close", channel=0)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        501, "FRAME_ERROR - cannot decode queue.declare arguments: field table nested "
        "deeper than 100 levels", 50, 10)
    assert "q" not in client.node.vhosts["/"].queues


def test_a_table_within_the_limit_is_accepted():
    client = opened()
    client.send_bytes(raw_frame(1, 1, struct.pack(">HHH", 50, 10, 0) + b"\x01q\x00"
                                + nested_table(99)))  # 100 levels with the arguments
    assert client.read_names() == ["Queue.DeclareOk"]


def test_deep_headers_are_delivered_as_published():
    """RabbitMQ accepts the message: headers nobody reads are passed on byte for byte."""
    client = opened()
    client.declare_queue(1, "q")
    frames, header = deep_publish(1, "", "q", 5000)
    client.send_bytes(frames)
    client.send(1, method(commands.Basic.Get, queue="q", no_ack=True))
    data = client.read_raw()
    assert header in data and data.endswith(raw_frame(3, 1, b"hi"))


def test_deep_headers_a_headers_exchange_must_read_are_a_frame_error():
    client = opened()
    client.call(1, method(commands.Exchange.Declare, exchange="h", exchange_type="headers"),
                "Exchange.DeclareOk")
    frames, _header = deep_publish(1, "h", "", 5000)
    client.send_bytes(frames)
    close = client.expect_one("Connection.Close", channel=0)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        501, "FRAME_ERROR - cannot decode content header: field table nested deeper "
        "than 100 levels", 60, 40)


def _deep_start_ok(depth: int) -> bytes:
    response = b"\x00guest\x00guest"
    return raw_frame(1, 0, struct.pack(">HH", 10, 11) + nested_table(depth) + b"\x05PLAIN"
                     + struct.pack(">I", len(response)) + response + b"\x05en_US")


def test_deep_client_properties_end_the_handshake_with_a_frame_error():
    """1,000 levels (7 KB: within the minimum frame size a start-ok may fill)."""
    client = Client(new_node())
    client.send_bytes(b"AMQP\x00\x00\x09\x01")
    client.expect_one("Connection.Start")
    client.send_bytes(_deep_start_ok(1000))
    close = client.expect_one("Connection.Close", channel=0)
    assert (close.reply_code, close.class_id, close.method_id) == (501, 10, 11)
    assert client.session.closed


def test_a_start_ok_larger_than_the_minimum_frame_ends_the_handshake_unanswered():
    """5,000 levels (35 KB): over frame_min before tune-ok, the socket is closed
    without a connection.close, as rabbit_reader closes it (spec 4.2.3)."""
    client = Client(new_node())
    client.send_bytes(b"AMQP\x00\x00\x09\x01")
    client.expect_one("Connection.Start")
    client.send_bytes(_deep_start_ok(5000))
    assert client.read() == []
    assert client.session.closed


@pytest.mark.parametrize("arguments, text", [
    ({"x-queue-type": "quorum", "x-queue-leader-locator": "bogus"},
     "invalid arg 'x-queue-leader-locator' for queue 'q' in vhost '/': "
     "invalid_queue_locator_arg"),
    # classic queues take a leader locator since RabbitMQ 4.0 (3.10.8 refuses the
    # argument itself: "of queue type rabbit_classic_queue"); 4.2 wins
    ({"x-queue-leader-locator": "bogus"},
     "invalid arg 'x-queue-leader-locator' for queue 'q' in vhost '/': "
     "invalid_queue_locator_arg"),
    # the harness's pamqp sends 5 and 7 as bytes, and RabbitMQ names the wire type
    ({"x-queue-type": "quorum", "x-queue-leader-locator": 5},
     "invalid arg 'x-queue-leader-locator' for queue 'q' in vhost '/': "
     "{unacceptable_type,byte}"),
    ({"x-queue-type": "quorum", "x-dead-letter-strategy": "bogus"},
     "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': invalid_dlx_strategy"),
    ({"x-queue-type": "quorum", "x-dead-letter-strategy": 7},
     "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': "
     "{unacceptable_type,byte}"),
])
def test_an_unknown_leader_locator_or_dead_letter_strategy_is_refused(tmp_path, arguments,
                                                                       text):
    client = opened(quorum_node(tmp_path))
    client.send(1, commands.Queue.Declare(queue="q", durable=True, arguments=arguments))
    close = client.expect_one("Channel.Close", channel=1)
    assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - " + text)
    assert "q" not in client.node.vhosts["/"].queues


@pytest.mark.parametrize("locator", ["client-local", "balanced", "random", "least-leaders",
                                     "min-masters"])
def test_every_leader_locator_rabbitmq_4_knows_is_accepted(tmp_path, locator):
    client = opened(quorum_node(tmp_path))
    client.call(1, commands.Queue.Declare(queue="q", durable=True, arguments={
        "x-queue-type": "quorum", "x-queue-leader-locator": locator,
        "x-dead-letter-strategy": "at-least-once"}), "Queue.DeclareOk")


@pytest.mark.parametrize("relaxed", [False, True])
def test_relaxed_checks_on_redeclaration_ignore_only_the_queue_type(tmp_path, relaxed):
    """The 4.2 quorum queues guide, "Options to Relax Property Equivalence Checks": with
    quorum_queue.property_equivalence.relaxed_checks_on_redeclaration, a redeclaration's
    x-queue-type is not compared; every other property still is."""
    settings = Settings(quorum_relaxed_checks_on_redeclaration=relaxed)
    node = new_node(settings, log_store=LogStore(str(tmp_path), StorageConfig(fsync=False)))
    client = opened(node)
    client.call(1, commands.Queue.Declare(queue="q", durable=True, arguments={
        "x-queue-type": "quorum"}), "Queue.DeclareOk")
    client.send(1, commands.Queue.Declare(queue="q", durable=True, arguments={
        "x-queue-type": "classic"}))
    if relaxed:
        assert client.expect_one("Queue.DeclareOk", channel=1).queue == "q"
        assert client.node.vhosts["/"].queues["q"].type_name == "quorum"
    else:
        close = client.expect_one("Channel.Close", channel=1)
        assert (close.reply_code, close.reply_text) == (
            406, "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q' in "
                 "vhost '/': received 'classic' but current is 'quorum'")
        client.open_channel(2)
    channel = 1 if relaxed else 2
    client.send(channel, commands.Queue.Declare(queue="q", durable=False, arguments={
        "x-queue-type": "classic"}))
    close = client.expect_one("Channel.Close", channel=channel)
    assert (close.reply_code, close.reply_text) == (
        406, "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': "
             "received 'false' but current is 'true'")

"""Channel semantics through the session: publisher confirms and transactions.

Publisher confirms are RabbitMQ's extension (confirm.select; basic.ack / basic.nack
from the server): every publish gets the next sequence number, confirms go out in
sequence order, a run of acks may be coalesced into one `multiple` ack, and a
message a queue refused (x-overflow reject-publish) is nacked. A persistent message
in a durable queue is confirmed only after the store batch holding it is synced.

Transactions (spec 1.9 tx class): publishes and acks are buffered until tx.commit;
tx.rollback drops the publishes and makes the acked deliveries unacked again.
"""

from __future__ import annotations

import pytest
from pamqp import commands

from quorumqueue.broker.config import Settings
from quorumqueue.broker.node.node import Node
from quorumqueue.broker.storage.message_store import MessageStore
from tests.broker.node.harness import Client, Delivery, name, new_node, properties

PERSISTENT = properties(delivery_mode=2)


@pytest.fixture
def stored_node(tmp_path) -> Node:
    store = MessageStore(str(tmp_path / "msgstore"), segment_bytes=1 << 20, fsync=False)
    node = new_node(Settings(), message_store=store)
    node.recover()
    return node


def confirming(node: Node, byte_at_a_time: bool = False) -> Client:
    client = Client(node, byte_at_a_time=byte_at_a_time)
    client.handshake()
    client.open_channel(1)
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    return client


def confirms(client: Client, flush: bool = True) -> list[tuple]:
    out = []
    for channel, value in client.read(flush):
        assert channel == 1
        if name(value) == "Basic.Ack":
            out.append(("ack", value.delivery_tag, value.multiple))
        elif name(value) == "Basic.Nack":
            assert value.requeue is False
            out.append(("nack", value.delivery_tag, value.multiple))
        else:
            out.append((name(value),))
    return out


# ---------------------------------------------------------------- publisher confirms


def test_transient_publishes_are_confirmed_at_once_in_order():
    """RabbitMQ confirms: a transient message is confirmed once enqueued, in order."""
    client = confirming(new_node())
    client.declare_queue(1, "q")
    for body in (b"1", b"2"):
        client.publish(1, "", "q", body)
    assert confirms(client) == [("ack", 1, True), ("ack", 2, True)]


def test_unroutable_publishes_are_acked():
    """RabbitMQ confirms a message no queue took as soon as routing is done."""
    client = confirming(new_node())
    client.publish(1, "amq.direct", "nowhere", b"lost")
    assert confirms(client) == [("ack", 1, True)]


@pytest.mark.parametrize("byte_at_a_time", [False, True], ids=["whole", "bytewise"])
def test_persistent_confirms_wait_for_the_sync_and_are_coalesced(stored_node, byte_at_a_time):
    """Confirms of persistent messages in durable queues go out only after the fsync
    (group commit); one `multiple` ack covers the whole synced run."""
    client = confirming(stored_node, byte_at_a_time)
    client.declare_queue(1, "durable", durable=True)
    for index in range(3):
        client.publish(1, "", "durable", b"m%d" % index, PERSISTENT)
    assert confirms(client, flush=False) == []
    assert confirms(client, flush=True) == [("ack", 3, True)]


def test_a_transient_publish_behind_persistent_ones_waits_for_them(stored_node):
    """Confirms never overtake each other: sequence order is kept."""
    client = confirming(stored_node)
    client.declare_queue(1, "durable", durable=True)
    client.declare_queue(1, "transient")
    client.publish(1, "", "durable", b"a", PERSISTENT)
    client.publish(1, "", "transient", b"b")
    assert confirms(client, flush=False) == []
    assert confirms(client) == [("ack", 2, True)]


def test_reject_publish_overflow_is_nacked_among_coalesced_acks(stored_node):
    """x-overflow=reject-publish: a message the full queue refused is nacked in its
    place in the sequence; the acks before and after it are coalesced."""
    client = Client(stored_node)
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "open", durable=True)
    client.declare_queue(1, "full", durable=True,
                         arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    client.publish(1, "", "full", b"filler", PERSISTENT)
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    for queue in ("open", "open", "full", "open", "open", "full", "full", "open"):
        client.publish(1, "", queue, b"m", PERSISTENT)
    assert confirms(client) == [("ack", 2, True), ("nack", 3, False), ("ack", 5, True),
                                ("nack", 6, False), ("nack", 7, False), ("ack", 8, True)]
    assert client.declare_queue(1, "full", passive=True).message_count == 1
    assert client.declare_queue(1, "open", passive=True).message_count == 5


def test_reject_publish_without_a_store_is_nacked_in_order():
    """RabbitMQ x-overflow=reject-publish: refused publishes are nacked, in sequence."""
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "full", arguments={"x-max-length": 1,
                                               "x-overflow": "reject-publish"})
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    for _ in range(3):
        client.publish(1, "", "full", b"m")
    assert confirms(client) == [("ack", 1, True), ("nack", 2, False), ("nack", 3, False)]


def test_confirm_select_on_a_transactional_channel_is_refused():
    """RabbitMQ: a channel cannot be both transactional and in confirm mode (406)."""
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    close = client.call(1, commands.Confirm.Select(), "Channel.Close")
    assert (close.reply_code, close.class_id, close.method_id) == (406, 85, 10)


def test_mandatory_unroutable_is_returned_then_acked():
    """RabbitMQ sends basic.return before the confirm of an unroutable mandatory
    message."""
    client = confirming(new_node())
    client.publish(1, "amq.direct", "nowhere", b"back", mandatory=True)
    frames = client.read_deliveries()
    assert name(frames[0].method) == "Basic.Return"
    assert (frames[0].method.reply_code, frames[0].body) == (312, b"back")
    assert name(frames[1][1]) == "Basic.Ack" and frames[1][1].delivery_tag == 1


# ---------------------------------------------------------------- transactions


def transactional(node: Node | None = None) -> Client:
    client = Client(node or new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "q")
    return client


def fill(client: Client, count: int) -> None:
    for index in range(count):
        client.publish(1, "", "q", b"m%d" % index)


def method_names(frames: list) -> list[str]:
    return [name(f.method) if isinstance(f, Delivery) else name(f[1]) for f in frames]


def message_count(client: Client) -> int:
    return client.declare_queue(1, "q", passive=True).message_count


def test_rollback_makes_acked_deliveries_unacked_again():
    """spec 1.9.2.5 tx.rollback abandons the acks of the transaction: the deliveries
    are unacked again (RabbitMQ puts them back on the channel's unacked list)."""
    client = transactional()
    fill(client, 3)
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    tags = [client.get(1, "q", no_ack=False).method.delivery_tag for _ in range(3)]
    assert tags == [1, 2, 3]
    client.send(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    assert client.read() == []
    client.call(1, commands.Tx.Rollback(), "Tx.RollbackOk")
    # tag 2 is unacked again: acking it (and committing) is fine, not a 406
    client.send(1, commands.Basic.Ack(delivery_tag=2))
    client.call(1, commands.Tx.Commit(), "Tx.CommitOk")
    # tags 1 and 3 are still unacked: basic.recover returns exactly those
    client.call(1, commands.Basic.Recover(requeue=True), "Basic.RecoverOk")
    assert message_count(client) == 2
    bodies = sorted(client.get(1, "q").body for _ in range(2))
    assert bodies == [b"m0", b"m2"]


def test_rollback_keeps_unacked_deliveries_in_tag_order():
    """spec 1.9.2.5: after tx.rollback, multiple=true acks cover the restored tags."""
    client = transactional()
    fill(client, 3)
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    for _ in range(3):
        client.get(1, "q", no_ack=False)
    client.send(1, commands.Basic.Ack(delivery_tag=3))
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    client.call(1, commands.Tx.Rollback(), "Tx.RollbackOk")
    client.send(1, commands.Basic.Ack(delivery_tag=2, multiple=True))  # acks 1 and 2
    client.call(1, commands.Tx.Commit(), "Tx.CommitOk")
    client.call(1, commands.Basic.Recover(requeue=True), "Basic.RecoverOk")
    assert [client.get(1, "q").body for _ in range(1)] == [b"m2"]


def test_commit_applies_the_acks():
    """spec 1.9.2.3 tx.commit: the buffered acks take effect; acking again is 406."""
    client = transactional()
    fill(client, 2)
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    client.get(1, "q", no_ack=False)
    client.get(1, "q", no_ack=False)
    client.send(1, commands.Basic.Ack(delivery_tag=2, multiple=True))
    client.call(1, commands.Tx.Commit(), "Tx.CommitOk")
    close = client.call(1, commands.Basic.Ack(delivery_tag=1), "Channel.Close")
    assert close.reply_code == 406  # already acked and committed
    client.open_channel(2)
    assert client.declare_queue(2, "q", passive=True).message_count == 0


def test_rollback_drops_publishes_and_commit_applies_them():
    """spec 1.9.2.3/1.9.2.5: publishes are enqueued at commit, dropped at rollback."""
    client = transactional()
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    client.publish(1, "", "q", b"dropped")
    assert message_count(client) == 0
    client.call(1, commands.Tx.Rollback(), "Tx.RollbackOk")
    assert message_count(client) == 0
    client.publish(1, "", "q", b"kept")
    client.call(1, commands.Tx.Commit(), "Tx.CommitOk")
    assert client.get(1, "q").body == b"kept"


def test_nack_with_requeue_in_a_transaction_requeues_on_commit():
    """RabbitMQ: a nack in a transaction requeues (redelivered) at tx.commit."""
    client = transactional()
    fill(client, 1)
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    client.get(1, "q", no_ack=False)
    client.send(1, commands.Basic.Nack(delivery_tag=1, requeue=True))
    assert message_count(client) == 0
    client.call(1, commands.Tx.Commit(), "Tx.CommitOk")
    delivery = client.get(1, "q")
    assert delivery.body == b"m0" and delivery.method.redelivered


def test_closing_a_channel_returns_acks_of_an_open_transaction():
    """spec 1.9: an uncommitted transaction is abandoned at channel close."""
    client = transactional()
    fill(client, 1)
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    client.get(1, "q", no_ack=False)
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    client.call(1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0,
                                          method_id=0), "Channel.CloseOk")
    client.open_channel(1)
    assert message_count(client) == 1


def test_acks_in_a_transaction_do_not_free_prefetch_until_commit():
    """RabbitMQ (rabbit_channel): acks inside a transaction reach the queue and the
    limiter only at tx.commit, so a prefetch-limited consumer gets its next message
    after the commit, and a rollback never leaves more unacked than the prefetch."""
    client = transactional()
    fill(client, 3)
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    client.call(1, commands.Basic.Qos(prefetch_count=1), "Basic.QosOk")
    client.send(1, commands.Basic.Consume(queue="q", consumer_tag="c"))
    assert method_names(client.read_deliveries()) == ["Basic.ConsumeOk", "Basic.Deliver"]
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    assert client.read() == []  # the ack is not applied yet: no new delivery
    client.call(1, commands.Tx.Rollback(), "Tx.RollbackOk")
    client.send(1, commands.Basic.Ack(delivery_tag=1))
    client.send(1, commands.Tx.Commit())
    frames = client.read_deliveries()
    assert sorted(method_names(frames)) == ["Basic.Deliver", "Tx.CommitOk"]


def test_tx_commit_outside_a_transaction_is_precondition_failed():
    """RabbitMQ: tx.commit / tx.rollback on a non-transactional channel is 406."""
    client = transactional()
    for value, ids in ((commands.Tx.Commit(), (90, 20)), (commands.Tx.Rollback(), (90, 30))):
        close = client.call(1, value, "Channel.Close")
        assert (close.reply_code, close.class_id, close.method_id) == (406, *ids)
        client.send(1, commands.Channel.CloseOk())
        client.open_channel(1)


def test_publish_to_a_missing_exchange_in_a_transaction_fails_at_publish():
    """RabbitMQ checks the exchange at publish time even in a transaction (404)."""
    client = transactional()
    client.call(1, commands.Tx.Select(), "Tx.SelectOk")
    client.publish(1, "nope", "k", b"m")
    close = client.expect_one("Channel.Close")
    assert (close.reply_code, close.class_id, close.method_id) == (404, 60, 40)


def test_unicode_queue_names_work_end_to_end():
    """spec 4.2.5.3: short strings are UTF-8; a queue named in Cyrillic can be
    declared, published to through the default exchange, and read."""
    client = transactional()
    client.declare_queue(1, "очередь")
    client.publish(1, "", "очередь", b"m")
    assert client.get(1, "очередь").body == b"m"

"""The classic queue type returns actions; the channel carries them out.

Issue 29, Build 1 (RabbitMQ's rabbit_queue_type returns `{State, Actions}`): a
classic queue given no channel at all answers basic.get with a `GetOk` or `GetEmpty`,
purge with a `PurgeOk`, declare with a `DeclareOk`, and hands messages to consumers
as `Deliver` actions, within their prefetch (`consumer.charge()`). Through a session
an AMQP client sees the same frames as before: consume-ok before the deliveries,
get-ok's message count, redelivered flags, purge-ok's count (spec 1.8.3.11 basic.get,
1.7.2.6 queue.purge-ok, 1.8.3.9 basic.deliver).
"""

from __future__ import annotations

import ast
import pathlib

from pamqp import commands

from quorumqueue.broker.amqp.codec import Properties
from quorumqueue.broker.queues import classic
from quorumqueue.broker.queues.actions import DeclareOk, Deliver, GetEmpty, GetOk, PurgeOk
from quorumqueue.broker.queues.classic import ClassicQueue
from quorumqueue.broker.queues.message import Message
from tests.broker.node.harness import Client, Delivery, method, name, new_node

ASKER = object()  # who asked: the queue hands it back untouched, never calls it


class Taker:
    """A consumer as the queue sees it, with no channel: a prefetch and a count."""

    def __init__(self, tag: str, prefetch: int = 0, no_ack: bool = False) -> None:
        self.tag, self.prefetch, self.no_ack = tag, prefetch, no_ack
        self.priority, self.exclusive = 0, False
        self.charged = 0

    def has_capacity(self) -> bool:
        return self.no_ack or not self.prefetch or self.charged < self.prefetch

    def charge(self) -> None:
        if not self.no_ack:
            self.charged += 1


def message(body: bytes) -> Message:
    return Message("ex", "rk", Properties(b"\x00\x00", len(body)), body)


def new_queue() -> ClassicQueue:
    return ClassicQueue("/", "q", False, None, False, {})


def test_basic_get_returns_get_ok_with_the_message_and_the_count_left_no_channel_given():
    queue = new_queue()
    assert queue.publish(message(b"one"), None, None) == []
    queue.publish(message(b"two"), None, None)
    [answer] = queue.basic_get(ASKER, no_ack=False)
    assert type(answer) is GetOk and answer.to is ASKER and answer.queue is queue
    assert (answer.body, answer.exchange, answer.routing_key) == (b"one", "ex", "rk")
    assert (answer.remaining, answer.redelivered, answer.no_ack) == (1, False, False)
    assert queue.unacked_count == 1 and queue.ready_count == 1
    assert queue.basic_get(ASKER, no_ack=True)[0].body == b"two"
    assert queue.basic_get(ASKER, no_ack=True) == [GetEmpty(ASKER)]


def test_a_requeued_get_comes_back_redelivered():
    queue = new_queue()
    queue.publish(message(b"m"), None, None)
    [answer] = queue.basic_get(ASKER, no_ack=False)
    assert queue.settle(None, [answer.token], True) == []  # no consumer: nothing to do
    [again] = queue.basic_get(ASKER, no_ack=True)
    assert again.body == b"m" and again.redelivered


def test_purge_and_declare_answer_with_their_counts():
    queue = new_queue()
    for body in (b"a", b"b", b"c"):
        queue.publish(message(body), None, None)
    queue.basic_get(ASKER, no_ack=False)  # unacked: survives the purge
    assert queue.declare_ok(ASKER) == [DeclareOk(ASKER, ready=2, consumers=0)]
    assert queue.purge(ASKER) == [PurgeOk(ASKER, 2)]
    assert queue.declare_ok(ASKER) == [DeclareOk(ASKER, ready=0, consumers=0)]


def test_deliveries_are_actions_within_each_consumers_prefetch_round_robin():
    queue = new_queue()
    first, second = Taker("first", prefetch=2), Taker("second", prefetch=1)
    assert queue.consume(None, first) == []  # nothing ready
    assert queue.consume(None, second) == []
    delivered = [queue.publish(message(b"%d" % n), None, None) for n in range(4)]
    assert [[(d.consumer.tag, d.body) for d in actions] for actions in delivered] == [
        [("first", b"0")], [("second", b"1")], [("first", b"2")], []]
    assert all(type(d) is Deliver and d.queue is queue for [d] in delivered[:3])
    assert queue.ready_count == 1 and queue.unacked_count == 3
    token = delivered[1][0].token
    second.charged -= 1  # what the channel does on an ack, before the queue hears of it
    assert queue.settle(None, [token], None) == []
    [refill] = queue.capacity_freed()
    assert (refill.consumer, refill.body, refill.redelivered) == (second, b"3", False)


def test_requeued_deliveries_go_out_again_marked_redelivered():
    queue = new_queue()
    taker = Taker("c", prefetch=1)
    queue.consume(None, taker)
    [delivery] = queue.publish(message(b"m"), None, None)
    taker.charged -= 1
    [again] = queue.settle(None, [delivery.token], True)
    assert again.body == b"m" and again.redelivered and again.consumer is taker


def test_the_classic_queue_type_calls_no_channel():
    """No attribute of anything named `channel` is called in queues/classic.py, and
    it imports nothing of node/ (also a contract in .importlinter)."""
    tree = ast.parse(pathlib.Path(classic.__file__).read_text())
    called = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    on_channel = [ast.unparse(func) for func in called if isinstance(func, ast.Attribute)
                  and "channel" in ast.unparse(func.value).split(".")]
    assert on_channel == []
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [module for module in imported if "node" in module.split(".")]


# ---------------------------------------------------------------- through a session


def test_a_client_sees_consume_ok_then_deliveries_within_prefetch_then_the_refill():
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "q")
    for body in (b"1", b"2", b"3"):
        client.publish(1, "", "q", body)
    client.call(1, commands.Basic.Qos(prefetch_count=2), "Basic.QosOk")
    client.send(1, method(commands.Basic.Consume, queue="q", consumer_tag="c"))
    replies = client.read_deliveries()
    assert name(replies[0][1]) == "Basic.ConsumeOk"
    assert [(r.method.delivery_tag, r.body, r.method.redelivered) for r in replies[1:]] == [
        (1, b"1", False), (2, b"2", False)]
    client.send(1, method(commands.Basic.Nack, delivery_tag=1, requeue=True))
    [again] = client.read_deliveries()  # the requeued head goes out first, redelivered
    assert (again.method.delivery_tag, again.body, again.method.redelivered) == (3, b"1", True)
    client.send(1, method(commands.Basic.Ack, delivery_tag=2))
    [third] = client.read_deliveries()
    assert (third.method.delivery_tag, third.body) == (4, b"3")


def test_a_client_sees_get_ok_get_empty_purge_ok_and_declare_ok_counts():
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "q")
    for body in (b"a", b"b", b"c"):
        client.publish(1, "", "q", body)
    got = client.get(1, "q", no_ack=False)
    assert isinstance(got, Delivery) and got.body == b"a"
    assert (got.method.message_count, got.method.redelivered) == (2, False)
    assert client.declare_queue(1, "q", passive=True).message_count == 2
    assert client.call(1, method(commands.Queue.Purge, queue="q"),
                       "Queue.PurgeOk").message_count == 2
    assert client.get(1, "q") is None  # get-empty
    client.send(1, method(commands.Basic.Recover, requeue=True))
    assert client.read_names() == ["Basic.RecoverOk"]
    again = client.get(1, "q")
    assert again.body == b"a" and again.method.redelivered

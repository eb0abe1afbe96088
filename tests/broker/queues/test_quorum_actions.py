"""The quorum queue type returns actions; carry_out makes them channel calls.

Issue 29, Build 1 (RabbitMQ's rabbit_queue_type returns `{State, Actions}`, and
rabbit_quorum_queue's `handle_event` returns the actions of what its Ra log
applied): a quorum queue's commands return lists of actions, and its driver
(queues/quorum/groups.py) hands what the applied entries give, a Deliver effect's
`DeliverBatch`, to `carry_out`; a publisher confirm's answer is data (the channel put
in the set its Confirm was given), which the node sends after the round.
Answers the log gives later (basic.get, declare-ok, purge-ok) wait as data and are
the queue's handle_event's (answers.py). So a channel with no methods at all serves: a call on it would fail.
Through a session an AMQP client sees the same frames as before: deliveries in the
machine's order with their tags, get-ok's message count, purge-ok's count,
declare-ok's counts, publisher confirms (spec 1.8.3.9 basic.deliver, 1.8.3.11
basic.get, 1.7.2.6 queue.purge-ok; RabbitMQ's confirms guide).
"""

from __future__ import annotations

import ast
import pathlib

from pamqp import commands

from quorumqueue.broker.amqp.channel import ChannelState
from quorumqueue.broker.amqp.codec import Properties
from quorumqueue.broker.fifo.commands import Dequeue
from quorumqueue.broker.queues import quorum
from quorumqueue.broker.queues.actions import DeclareOk, DeliverBatch, GetEmpty, GetOk, PurgeOk
from quorumqueue.broker.queues.base import Confirm
from quorumqueue.broker.queues.message import Message
from quorumqueue.broker.queues.quorum import groups as quorum_groups
from quorumqueue.broker.queues.quorum.queue import QuorumToken
from tests.broker.node.harness import Client, Delivery, method, name, new_node

QUORUM = {"x-queue-type": "quorum"}
# what a node's channels offer a queue type (node/channel.py), and how the node sends
# their confirms (which no queue calls: a confirm's answer is data, queues/base.py)
CHANNEL_METHODS = {"deliver_batch", "get_ok", "get_empty", "release_answered_confirms",
                   "release_confirms"}


class Asker:
    """A channel as the quorum type sees it: who it is to the fifo machine and
    whether it is open. It has no methods: were the queue to call one, the test
    would fail with an AttributeError."""

    global_prefetch = 0

    def __init__(self, identity: str) -> None:
        self.quorum_identity = identity
        self.state = ChannelState.OPEN

    @property
    def is_open(self) -> bool:
        return self.state is ChannelState.OPEN


class Taker:
    """A consumer as the quorum type sees it: its tag, prefetch and channel."""

    def __init__(self, channel: Asker, tag: str, prefetch: int = 0,
                 no_ack: bool = False) -> None:
        self.channel, self.tag, self.prefetch, self.no_ack = channel, tag, prefetch, no_ack
        self.priority, self.exclusive = 0, False


def message(body: bytes) -> Message:
    return Message("", "q", Properties(b"\x00\x00", len(body)), body)


def quorum_queue():
    """A node, and its quorum queue "q" (declared by a client)."""
    node = new_node()
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "q", durable=True, arguments=QUORUM)
    return node, node.vhosts["/"].queues["q"]


def carried_out_by_the_driver(monkeypatch) -> list:
    """What the quorum driver hands to `carry_out`, kept instead of carried out."""
    handed: list = []
    monkeypatch.setattr(quorum_groups, "carry_out", handed.extend)
    return handed


def test_a_deliver_effect_is_a_deliver_batch_in_the_machines_order(monkeypatch):
    node, queue = quorum_queue()
    handed = carried_out_by_the_driver(monkeypatch)
    channel = Asker(f"{node.boot_id}.90.1")
    taker = Taker(channel, "c", prefetch=2)
    assert queue.consume(channel, taker) == []
    assert [queue.publish(message(b"%d" % n), None, None) for n in range(3)] == [[], [], []]
    node.flush()
    batches = [action for action in handed if type(action) is DeliverBatch]
    assert [(b.consumer, b.queue) for b in batches] == [(taker, queue)] * len(batches)
    messages = [m for b in batches for m in b.messages]
    assert [bytes(body) for _redelivered, _names, _header, body in messages] == [b"0", b"1"]
    tokens = [t for b in batches for t in b.tokens]
    assert all(type(t) is QuorumToken and t.key == f"{channel.quorum_identity}/c"
               for t in tokens)
    assert len(tokens) == 2 and queue.ready_count == 1 and queue.unacked_count == 2


def test_a_closed_channels_deliveries_go_back_and_nothing_is_carried_out(monkeypatch):
    node, queue = quorum_queue()
    handed = carried_out_by_the_driver(monkeypatch)
    channel = Asker(f"{node.boot_id}.90.1")
    queue.consume(channel, Taker(channel, "c", prefetch=1))
    node.flush()
    channel.state = ChannelState.CLOSING
    queue.publish(message(b"m"), None, None)
    node.flush()
    assert [a for a in handed if type(a) is DeliverBatch] == []
    # returned each time (a Return through the log), until the delivery limit (20 by
    # default, RabbitMQ 4's) dropped it; none of them was written
    assert queue.ready_count + queue.unacked_count == 0
    assert queue.state.config.delivery_limit == 20


def test_basic_get_answers_later_with_get_ok_or_get_empty_as_data():
    node, queue = quorum_queue()
    asker = Asker(f"{node.boot_id}.90.1")
    assert queue.got(asker, "k/", False, None) == [GetEmpty(asker)]
    queue.publish(message(b"a"), None, None)
    queue.publish(message(b"b"), None, None)
    node.flush()
    answers: list = []
    queue.propose(Dequeue(f"{asker.quorum_identity}/", True, asker.quorum_identity), 0,
                  lambda reply: answers.extend(queue.got(asker, "k/", True, reply)))
    node.flush()
    [got] = answers
    assert type(got) is GetOk and got.to is asker and got.queue is queue
    assert (bytes(got.body), got.remaining, got.no_ack, got.redelivered) == (b"a", 1, True,
                                                                            False)
    asker.state = ChannelState.CLOSING
    assert queue.got(asker, "k/", True, None) == []  # gone: nothing to answer


class Caller:
    """Who asked for declare-ok's counts or a purge (queues/base.py Asker): it keeps
    what carry_out hands it."""

    def __init__(self) -> None:
        self.answers: list = []

    def declare_ok(self, ready: int, consumers: int) -> None:
        self.answers.append(("declare-ok", ready, consumers))

    def purge_ok(self, count: int) -> None:
        self.answers.append(("purge-ok", count))


def test_declare_ok_is_returned_when_nothing_waits_and_purge_ok_once_applied():
    node, queue = quorum_queue()
    caller = Caller()
    assert queue.declare_ok(caller) == [DeclareOk(caller, ready=0, consumers=0)]
    queue.publish(message(b"a"), None, None)
    assert queue.declare_ok(caller) == []
    node.flush()
    assert caller.answers == [("declare-ok", 1, 0)]
    assert queue.purge(caller) == []
    node.flush()
    assert caller.answers[1:] == [("purge-ok", 1)]
    assert queue.declare_ok(caller) == [DeclareOk(caller, 0, 0)]


def test_a_quorum_reply_answers_the_publishers_confirm_as_data(monkeypatch):
    """The reply puts the channel in the set its Confirm holds, calls nothing on it
    (an `Asker` has no methods), and the driver hands no action for it."""
    node, queue = quorum_queue()
    handed = carried_out_by_the_driver(monkeypatch)
    channel, answered = Asker(f"{node.boot_id}.90.1"), set()
    confirm = Confirm(channel, 1, answered)
    assert queue.publish(message(b"m"), channel, confirm) == []
    assert confirm.outstanding == 1
    node.flush()
    assert confirm.outstanding == 0 and confirm.ok and answered == {channel}
    assert handed == []


def test_the_quorum_queue_type_calls_no_channel():
    """No attribute of anything named `channel` is called in queues/quorum/, nor any
    method a node's channel offers a queue type; nor in queues/base.py, whose
    `Confirm` every queue type answers. It imports nothing of node/ (also a
    contract in .importlinter)."""
    quorum_dir = pathlib.Path(quorum.__file__).parent
    for path in [*sorted(quorum_dir.glob("*.py")), quorum_dir.parent / "base.py"]:
        tree = ast.parse(path.read_text())
        called = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
        on_channel = [ast.unparse(func) for func in called if isinstance(func, ast.Attribute)
                      and ("channel" in ast.unparse(func.value).split(".")
                           or func.attr in CHANNEL_METHODS)]
        assert on_channel == [], path.name
        imported = [node.module or "" for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom)]
        assert not [module for module in imported if "node" in module.split(".")], path.name


# ---------------------------------------------------------------- through a session


def test_a_client_sees_confirms_deliveries_get_ok_purge_ok_and_declare_ok_counts():
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "q", durable=True, arguments=QUORUM)
    client.call(1, commands.Confirm.Select(), "Confirm.SelectOk")
    for body in (b"1", b"2", b"3", b"4"):
        client.publish(1, "", "q", body)
    acks = client.read_methods()
    assert [name(ack) for _c, ack in acks][-1] == "Basic.Ack"
    assert max(ack.delivery_tag for _c, ack in acks) == 4
    got = client.get(1, "q", no_ack=False)
    assert isinstance(got, Delivery) and got.body == b"1"
    assert (got.method.delivery_tag, got.method.message_count) == (1, 3)
    assert client.declare_queue(1, "q", passive=True).message_count == 3
    client.open_channel(2)
    client.call(2, commands.Basic.Qos(prefetch_count=2), "Basic.QosOk")
    client.send(2, method(commands.Basic.Consume, queue="q", consumer_tag="c"))
    replies = client.read_deliveries()
    assert name(replies[0][1]) == "Basic.ConsumeOk"
    assert [(r.method.delivery_tag, r.body) for r in replies[1:]] == [(1, b"2"), (2, b"3")]
    client.send(2, method(commands.Basic.Nack, delivery_tag=1, requeue=True))
    [again] = client.read_deliveries()  # returned first: redelivered, counted
    assert (again.method.delivery_tag, again.body, again.method.redelivered) == (3, b"2", True)
    assert again.header.properties.headers == {"x-delivery-count": 1}
    client.send(2, method(commands.Basic.Cancel, consumer_tag="c"))
    assert client.read_names() == ["Basic.CancelOk"]
    client.send(2, commands.Channel.Close(reply_code=200, reply_text="ok",
                                          class_id=0, method_id=0))
    assert client.read_names() == ["Channel.CloseOk"]
    assert client.call(1, method(commands.Queue.Purge, queue="q"),
                       "Queue.PurgeOk").message_count == 3
    assert client.get(1, "q") is None  # get-empty


def test_the_quorum_type_reaches_its_node_only_through_its_host():
    """queues/quorum/ reads no `node` attribute (before: `groups.cluster.node` for the
    node's boot id, sessions, settings, clock and dead letters): the node is the
    QuorumHost (host.py) that QuorumGroups is built with."""
    import inspect

    for path in sorted(pathlib.Path(quorum.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        read = [ast.unparse(node) for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and node.attr == "node"]
        assert read == [], path.name
    assert "host" in inspect.signature(quorum_groups.QuorumGroups).parameters


def _declared(protocol: str) -> tuple[set[str], set[str]]:
    """(attributes, methods) host.py's `protocol` class declares."""
    tree = ast.parse((pathlib.Path(quorum.__file__).parent / "host.py").read_text())
    (found,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == protocol]
    return ({item.target.id for item in found.body if isinstance(item, ast.AnnAssign)},
            {item.name for item in found.body if isinstance(item, ast.FunctionDef)})


def test_the_quorum_type_asks_its_host_only_named_methods_and_its_run():
    """QuorumHost has one attribute, the node's run (boot_id); a dead letter goes to
    the node as a method call (route_dead_letter for the at-least-once worker, which
    publishes with confirms and waits for a classic target's fsync through
    after_sync; dead_letter_copy for at most once), where the worker read the node's
    vhosts, policies, synced batch and awaiting set. Everything queues/quorum/ reads of
    its host (`.host.X`) is declared there."""
    attributes, methods = _declared("QuorumHost")
    assert attributes == {"boot_id"}
    assert {"route_dead_letter", "after_sync"} <= methods
    read = {}
    for path in sorted(pathlib.Path(quorum.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "host":
                read.setdefault(node.attr, []).append(f"{path.name}:{node.lineno}")
    assert set(read) <= attributes | methods, read


def test_the_node_is_its_quorum_groups_host():
    node, _queue = quorum_queue()
    assert node.quorum.host is node
    assert node.quorum.cluster is node.cluster and node.cluster.groups is node.quorum
    assert not node.has_open_channel(f"{node.boot_id}.90.1")
    assert [session for session in node.sessions if session.channels]  # the declaring client's
    [channel] = [c for s in node.sessions for c in s.channels.values()]
    assert node.has_open_channel(channel.quorum_identity)


def test_what_the_log_answers_later_waits_as_data_and_handle_event_makes_the_actions():
    """A basic.get, a purge and a declare-ok behind unapplied entries leave data in the
    log's waiters (answers.py: who asked, nothing callable over a channel); the queue's
    handle_event turns an event and the machine's reply into the actions, as
    rabbit_quorum_queue:handle_event does, and applying the entries carries them out."""
    from quorumqueue.broker.queues.quorum.answers import (Answer, DeclareAsked, GetAsked,
                                                          PurgeAsked)

    class Getter(Asker):
        got: list = []

        def get_ok(self, queue, token, no_ack, redelivered, exchange, routing_key,
                   remaining, header, body) -> None:
            self.got.append((bytes(body), remaining))

    node, queue = quorum_queue()
    asker, caller = Getter(f"{node.boot_id}.90.1"), Caller()
    key = f"{asker.quorum_identity}/"
    queue.publish(message(b"a"), None, None)
    queue.basic_get(asker, True)
    queue.purge(caller)
    queue.declare_ok(caller)
    waiting = [waiter for index in sorted(queue.waiters)
               for _term, _data, waiter in queue.waiters[index]]
    assert all(type(waiter) is Answer and waiter.queue is queue for waiter in waiting)
    assert [waiter.event for waiter in waiting] == [
        GetAsked(asker, key, True), PurgeAsked(caller), DeclareAsked(caller)]
    assert queue.handle_event(PurgeAsked(caller), 3) == [PurgeOk(caller, 3)]
    assert queue.handle_event(DeclareAsked(caller), None) == [DeclareOk(caller, 0, 0)]
    assert queue.handle_event(GetAsked(asker, key, True), None) == [GetEmpty(asker)]
    assert caller.answers == []  # handle_event returned them; it called no one
    node.flush()
    assert asker.got == [(b"a", 0)]
    assert caller.answers == [("purge-ok", 0), ("declare-ok", 0, 0)]


def test_no_command_of_the_quorum_queue_waits_with_a_closure():
    """What queue.py proposes waits with data or a named method, never a lambda over
    the caller (before: basic.get's, purge's and declare-ok's)."""
    from quorumqueue.broker.queues.quorum import queue as queue_module

    tree = ast.parse(pathlib.Path(queue_module.__file__).read_text())
    closures = [ast.unparse(call) for call in ast.walk(tree) if isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("propose", "propose_data", "after_applied")
                and any(isinstance(argument, ast.Lambda) for argument in call.args)]
    assert closures == []

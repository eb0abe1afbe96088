"""A queue's declare-ok and purge-ok go to who asked, named in the action.

Issue 29, Build 1 (RabbitMQ's rabbit_queue_type returns `{State, Actions}`): no
queue type takes a callback for its answers. `declare_ok(to)` and `purge(to)` name
who asked (queues/base.py `Asker`: a method handler, the management API, another
node's request); the queue puts it in the `DeclareOk`, `PurgeOk` or `Refused` it
returns (or its log or its host answers later) and never calls it;
`actions.carry_out` does. Through a session the client sees the same frames:
queue.declare-ok's counts, queue.purge-ok's count, nothing for a purge with
no-wait (spec 1.7.2.2, 1.7.2.6).
"""

from __future__ import annotations

import inspect

from pamqp import commands

from quorumqueue.broker.amqp.errors import not_found
from quorumqueue.broker.cluster.classic_link import ClassicLink
from quorumqueue.broker.queues import actions
from quorumqueue.broker.queues.actions import DeclareOk, PurgeOk, Refused, carry_out
from quorumqueue.broker.queues.classic import ClassicQueue
from quorumqueue.broker.queues.quorum.queue import QuorumQueue
from quorumqueue.broker.queues.remote import RemoteClassicQueue
from tests.broker.node.harness import Client, Delivery, method, name, new_node
from tests.broker.queues.test_classic_actions import message


class Caller:
    """Who asked (queues/base.py Asker): it keeps what carry_out hands it."""

    def __init__(self) -> None:
        self.answers: list = []

    def declare_ok(self, ready: int, consumers: int) -> None:
        self.answers.append(("declare-ok", ready, consumers))

    def purge_ok(self, count: int) -> None:
        self.answers.append(("purge-ok", count))

    def refused(self, error) -> None:
        self.answers.append(("refused", error.code))


def test_declare_ok_and_purge_ok_name_who_asked_and_carry_out_answers_it():
    queue = ClassicQueue("/", "q", False, None, False, {})
    queue.publish(message(b"a"), None, None)
    queue.publish(message(b"b"), None, None)
    caller = Caller()
    declared = queue.declare_ok(caller)
    purged = queue.purge(caller)
    assert declared == [DeclareOk(caller, 2, 0)] and purged == [PurgeOk(caller, 2)]
    assert caller.answers == []  # the queue returned them; it called no one
    carry_out(declared + purged)
    assert caller.answers == [("declare-ok", 2, 0), ("purge-ok", 2)]


def test_no_queue_type_takes_a_callback_for_its_answers():
    """declare_ok and purge take who asked, and carry_out takes the actions alone."""
    for queue_type in (ClassicQueue, QuorumQueue, RemoteClassicQueue):
        for operation in (queue_type.declare_ok, queue_type.purge):
            parameters = list(inspect.signature(operation).parameters)
            assert parameters == ["self", "to"], (queue_type.__name__, operation.__name__)
    assert list(inspect.signature(actions.carry_out).parameters) == ["actions"]


class Cluster:
    """What a ClassicLink asks of its cluster, for one host that goes away."""

    name = "here"
    now = 0.0

    def __init__(self) -> None:
        self._next_request = 0
        self.boots: dict = {}
        self.up = True
        self.posted: list = []

    def reachable(self, host: str) -> bool:
        return self.up

    def _post(self, peer: str, rpc) -> None:
        self.posted.append((peer, rpc.kind))


def test_a_purge_whose_host_went_away_is_refused_to_who_asked():
    cluster = Cluster()
    link = ClassicLink(cluster)
    queue = RemoteClassicQueue("/", "q", False, None, False, {}, "uid", "there", link)
    caller = Caller()
    assert queue.purge(caller) == []
    assert cluster.posted == [("there", "cq.purge")] and caller.answers == []
    cluster.up = False
    link.tick(None)
    assert caller.answers == [("refused", not_found("queue", "q", "/").code)]


def test_refused_is_carried_out_to_who_asked():
    caller = Caller()
    carry_out([Refused(caller, not_found("queue", "q", "/"))])
    assert caller.answers == [("refused", 404)]


# ---------------------------------------------------------------- through a session


def test_a_client_gets_declare_ok_and_purge_ok_counts_and_nothing_for_no_wait():
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    for arguments in ({}, {"x-queue-type": "quorum"}):
        name = f"q-{len(arguments)}"
        client.declare_queue(1, name, durable=True, arguments=arguments)
        for body in (b"1", b"2", b"3"):
            client.publish(1, "", name, body)
        declared = client.call(1, method(commands.Queue.Declare, queue=name, passive=True),
                               "Queue.DeclareOk")
        assert (declared.message_count, declared.consumer_count) == (3, 0)
        client.send(1, method(commands.Queue.Purge, queue=name, nowait=True))
        assert client.read_methods() == []
        client.publish(1, "", name, b"4")
        purged = client.call(1, method(commands.Queue.Purge, queue=name), "Queue.PurgeOk")
        assert purged.message_count == 1


# ---------------------------------------------------------------- every command returns actions

COMMANDS = ("publish", "consume", "cancel", "basic_get", "settle", "channel_closed",
            "capacity_freed", "purge", "declare_ok")


def test_every_queue_command_returns_a_list_of_actions():
    """The interface and each type: a command's result is a list (of actions), never
    None, so a caller carries out whatever any type returns."""
    from quorumqueue.broker.queues.base import Queue

    for queue_type in (Queue, ClassicQueue, QuorumQueue, RemoteClassicQueue):
        for command in COMMANDS:
            returned = inspect.signature(getattr(queue_type, command)).return_annotation
            assert str(returned).startswith("list"), (queue_type.__name__, command, returned)
    assert Queue.capacity_freed(None) == []


class Open:
    """A channel that is open, as a classic queue sees it at basic.cancel."""

    is_open = True


def test_cancelling_the_single_active_consumer_hands_the_ready_messages_to_the_next():
    """x-single-active-consumer: when the active consumer goes, the next one takes
    over at once with what is ready, as rabbit_amqqueue_process runs the queue after a
    basic.cancel (RabbitMQ's consumers guide, "Single Active Consumer")."""
    from tests.broker.queues.test_classic_actions import Taker

    queue = ClassicQueue("/", "q", False, None, False, {}, single_active_consumer=True)
    first, second = Taker("first", prefetch=1), Taker("second", prefetch=5)
    queue.consume(Open(), first)
    queue.consume(Open(), second)
    [to_first] = queue.publish(message(b"1"), None, None)
    assert to_first.consumer is first
    assert queue.publish(message(b"2"), None, None) == []  # the active one is full
    assert queue.publish(message(b"3"), None, None) == []
    handed = queue.cancel(Open(), first)
    assert [(a.consumer, a.body) for a in handed] == [(second, b"2"), (second, b"3")]
    assert queue.ready_count == 0


def test_a_closing_channels_consumers_leave_what_they_held_to_go_out_first():
    """A channel closing: its consumer's cancel delivers nothing; `channel_closed`
    returns what it held, and the successor gets the messages in queue order."""
    from tests.broker.queues.test_classic_actions import Taker

    class Closing:
        is_open = False

    queue = ClassicQueue("/", "q", False, None, False, {}, single_active_consumer=True)
    first, second = Taker("first", prefetch=1), Taker("second", prefetch=5)
    queue.consume(Open(), first)
    queue.consume(Open(), second)
    [held] = queue.publish(message(b"1"), None, None)
    queue.publish(message(b"2"), None, None)
    channel = Closing()
    assert queue.cancel(channel, first) == []
    handed = queue.channel_closed(channel, [held.token])
    assert [(a.consumer, a.body, a.redelivered) for a in handed] == [
        (second, b"1", True), (second, b"2", False)]


def test_a_client_sees_the_next_single_active_consumer_take_over_at_basic_cancel():
    client = Client(new_node())
    client.handshake()
    client.open_channel(1)
    client.open_channel(2)
    client.declare_queue(1, "sac", arguments={"x-single-active-consumer": True})
    client.call(1, method(commands.Basic.Qos, prefetch_count=1), "Basic.QosOk")
    client.call(1, method(commands.Basic.Consume, queue="sac", consumer_tag="a"),
                "Basic.ConsumeOk")
    client.call(2, method(commands.Basic.Consume, queue="sac", consumer_tag="b"),
                "Basic.ConsumeOk")
    for body in (b"1", b"2"):
        client.publish(1, "", "sac", body)
    assert [(d.channel, d.body) for d in client.read_deliveries()] == [(1, b"1")]
    client.send(1, method(commands.Basic.Cancel, consumer_tag="a"))
    frames = client.read_deliveries()
    assert [name(f[1]) for f in frames if not isinstance(f, Delivery)] == ["Basic.CancelOk"]
    assert [(f.channel, f.body) for f in frames if isinstance(f, Delivery)] == [(2, b"2")]


# ---------------------------------------------------------------- the classic link's failures


class Getter:
    """A channel as the link sees it at basic.get: open, named, and told of a
    refusal. It has no session: were the link to reach one, the test would fail."""

    is_open = True
    quorum_identity = "here.1.1"

    def __init__(self) -> None:
        self.refusals: list = []

    def refused(self, error) -> None:
        self.refusals.append((error.code, error.class_id, error.method_id))


def test_a_basic_get_whose_host_went_away_is_a_refused_action_to_its_channel():
    cluster = Cluster()
    link = ClassicLink(cluster)
    queue = RemoteClassicQueue("/", "q", True, None, False, {}, "uid", "there", link)
    channel = Getter()
    assert queue.basic_get(channel, True) == []
    cluster.up = False
    link.tick(None)
    assert channel.refusals == [(404, 60, 70)]  # basic.get's class and method


def test_the_classic_link_calls_nothing_on_a_channel_or_a_session():
    """cluster/classic_link.py hands what it answers to carry_out as actions; it
    reads a channel's identity and state, and calls none of its methods."""
    import ast
    import pathlib

    from quorumqueue.broker.cluster import classic_link

    tree = ast.parse(pathlib.Path(classic_link.__file__).read_text())
    called = [ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)
              and isinstance(node.func, ast.Attribute)]
    assert [call for call in called
            if {"channel", "session"} & set(call.split(".")[:-1])] == []

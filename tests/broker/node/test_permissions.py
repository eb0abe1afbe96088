"""User permissions on AMQP methods, driven purely through `Session` by the harness.

RabbitMQ's access-control guide (https://www.rabbitmq.com/docs/access-control, "How
Permissions Work", the AMQP 0-9-1 table) says which method needs configure, write or
read permission on which resource; rabbit_channel (3.10) checks each at a fixed
point among the method's other checks. A refusal closes the channel with 403
ACCESS_REFUSED "access to <kind> '<name>' in vhost '<vhost>' refused for user
'<user>'" and the refused method's class and method ids, and changes nothing.

The world: guest (full rights) declares exchanges and queues whose name prefixes say
what bob may do with them — cfg- configure, w- write, r- read, all- everything,
other- nothing — plus messages and bindings; bob then sends one method. eve has
permissions in "/" that grant nothing ("" patterns), so she may open it and nothing
else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
from pamqp import commands

from quorumqueue.broker.auth.users import Permissions, User, UserStore, hash_password
from quorumqueue.broker.config import Settings
from quorumqueue.broker.node.node import Node
from quorumqueue.broker.raft.storage.config import StorageConfig
from quorumqueue.broker.raft.storage.log_store import LogStore
from tests.broker.node.harness import (Client, new_node, Delivery, content_frames, marshal, method,
                                       name, properties)

BOB = Permissions(configure=r"^(cfg|all)-|^amq\.gen-", write=r"^(w|all)-|^amq\.default$",
                  read=r"^(r|all)-")
EVE = Permissions(configure="", write="", read="")


def refusal(resource: str, user: str = "bob") -> str:
    return f"ACCESS_REFUSED - access to {resource} in vhost '/' refused for user '{user}'"


def users() -> UserStore:
    store = UserStore.with_default_user()
    for user_name, rights in (("bob", BOB), ("eve", EVE)):
        store.users[user_name] = User(user_name, hash_password(user_name), (), {"/": rights})
    return store


def world(node: Node) -> Node:
    """Exchanges, queues (one message each), bindings, declared by guest."""
    guest = Client(node)
    guest.handshake()
    guest.open_channel(1)
    for exchange in ("cfg-x", "w-x", "r-x", "all-x", "other-x"):
        guest.call(1, method(commands.Exchange.Declare, exchange=exchange,
                             exchange_type="direct"), "Exchange.DeclareOk")
    for queue in ("cfg-q", "w-q", "r-q", "all-q", "other-q"):
        guest.declare_queue(1, queue)
        guest.publish(1, "", queue, queue.encode())
    for source, queue in (("r-x", "other-q"), ("w-x", "other-q"), ("r-x", "w-q")):
        guest.call(1, method(commands.Queue.Bind, queue=queue, exchange=source,
                             routing_key="k"), "Queue.BindOk")
    guest.call(1, method(commands.Exchange.Bind, destination="w-x", source="r-x",
                         routing_key="k"), "Exchange.BindOk")
    return node


def state(node: Node) -> tuple:
    """Everything a method could change: exchanges, bindings, queues and their counts."""
    vhost = node.vhosts["/"]
    exchanges = sorted((x.name, x.type, x.durable, repr(x.arguments))
                       for x in vhost.exchanges.values())
    bindings = sorted((b.source, b.destination.kind, b.destination.name, b.routing_key)
                      for b in vhost.bindings())
    queues = sorted((q.name, q.ready_count, q.unacked_count, q.consumer_count)
                    for q in vhost.queues.values())
    return exchanges, bindings, queues


def connect(node: Node, user: str) -> Client:
    client = Client(node)
    client.handshake(username=user, password=user)
    client.open_channel(1)
    return client


@dataclass(frozen=True)
class Publish:
    """basic.publish with a one-byte body (the method and its content)."""
    exchange: str
    routing_key: str = "k"
    index = commands.Basic.Publish.index

    def frames(self) -> bytes:
        return (marshal(method(commands.Basic.Publish, exchange=self.exchange,
                               routing_key=self.routing_key), 1)
                + content_frames(1, b"m"))


def send(client: Client, request) -> None:
    if isinstance(request, Publish):
        client.send_bytes(request.frames())
    else:
        client.send(1, request)


def outcome(client: Client) -> tuple:
    """The first thing the session answered: a method's name, or a close's fields."""
    frames = client.read()
    assert frames, "no reply"
    reply = frames[0][1]
    if name(reply) in ("Channel.Close", "Connection.Close"):
        return (name(reply), reply.reply_code, reply.reply_text, reply.class_id,
                reply.method_id)
    return (name(reply),)


def closed(request, code: int, text: str) -> tuple:
    return ("Channel.Close", code, text, request.index >> 16, request.index & 0xFFFF)


def case(case_id: str, request, ok: str = "", refused: str = "", error: tuple = (),
         user: str = "bob"):
    """`request` sent by `user` gets reply `ok`, a refusal naming resource `refused`,
    or a close with `error` = (code, text) that shows the permission check passed (or
    was rightly not reached)."""
    if refused:
        expected = closed(request, 403, refusal(refused, user))
    elif error:
        expected = closed(request, *error)
    else:
        expected = (ok,)
    return pytest.param(user, request, expected, id=case_id)


def declare_exchange(exchange: str, **fields):
    return method(commands.Exchange.Declare, exchange=exchange, exchange_type="direct",
                  **fields)


def declare_queue(queue: str, **fields):
    return method(commands.Queue.Declare, queue=queue, **fields)


def bind_queue(queue: str, exchange: str, unbind: bool = False):
    kind = commands.Queue.Unbind if unbind else commands.Queue.Bind
    return method(kind, queue=queue, exchange=exchange, routing_key="k")


def bind_exchange(destination: str, source: str, unbind: bool = False):
    kind = commands.Exchange.Unbind if unbind else commands.Exchange.Bind
    return method(kind, destination=destination, source=source, routing_key="k")


DEFAULT_REFUSED = "ACCESS_REFUSED - operation not permitted on the default exchange"

CASES = [
    # exchange.declare: configure on the exchange, unless passive
    case("exchange.declare", declare_exchange("cfg-new"), ok="Exchange.DeclareOk"),
    case("exchange.declare-refused", declare_exchange("w-new"), refused="exchange 'w-new'"),
    case("exchange.declare-existing-refused", declare_exchange("other-x"),
         refused="exchange 'other-x'"),
    case("exchange.declare-passive", declare_exchange("other-x", passive=True),
         ok="Exchange.DeclareOk"),
    case("exchange.declare-passive-nothing", declare_exchange("other-x", passive=True),
         ok="Exchange.DeclareOk", user="eve"),
    case("exchange.declare-reserved-before", declare_exchange("amq.new"),
         refused="exchange 'amq.new'"),  # configure first, then the amq. prefix
    case("exchange.declare-default-first", declare_exchange(""),
         error=(403, DEFAULT_REFUSED), user="eve"),
    # ... with an alternate exchange: also read on the new exchange, write on the AE
    case("exchange.declare-ae", declare_exchange("all-new", arguments={
        "alternate-exchange": "w-x"}), ok="Exchange.DeclareOk"),
    case("exchange.declare-ae-write-refused", declare_exchange("all-new", arguments={
        "alternate-exchange": "r-x"}), refused="exchange 'r-x'"),
    case("exchange.declare-ae-read-refused", declare_exchange("cfg-new", arguments={
        "alternate-exchange": "w-x"}), refused="exchange 'cfg-new'"),
    case("exchange.declare-ae-existing", declare_exchange("cfg-x", arguments={
        "alternate-exchange": "r-x"}),  # no AE checks for an existing exchange
         error=(406, "PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for "
                     "exchange 'cfg-x' in vhost '/': received the value 'r-x' of type "
                     "'longstr' but current is none")),
    # exchange.delete: configure, checked before the exchange is looked up
    case("exchange.delete", method(commands.Exchange.Delete, exchange="cfg-x"),
         ok="Exchange.DeleteOk"),
    case("exchange.delete-refused", method(commands.Exchange.Delete, exchange="other-x"),
         refused="exchange 'other-x'"),
    case("exchange.delete-missing-refused", method(commands.Exchange.Delete,
                                                   exchange="w-none"),
         refused="exchange 'w-none'"),
    case("exchange.delete-system-first", method(commands.Exchange.Delete,
                                                exchange="amq.direct"),
         error=(403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost "
                     "'/' not allowed"), user="eve"),
    # queue.declare: configure on the queue, unless passive; server-named too
    case("queue.declare", declare_queue("cfg-new"), ok="Queue.DeclareOk"),
    case("queue.declare-refused", declare_queue("w-new"), refused="queue 'w-new'"),
    case("queue.declare-existing-refused", declare_queue("other-q"),
         refused="queue 'other-q'"),
    case("queue.declare-server-named", declare_queue(""), ok="Queue.DeclareOk"),
    case("queue.declare-passive", declare_queue("other-q", passive=True),
         ok="Queue.DeclareOk", user="eve"),
    case("queue.declare-reserved-first", declare_queue("amq.new"),
         error=(403, "ACCESS_REFUSED - queue name 'amq.new' contains reserved prefix "
                     "'amq.*'"), user="eve"),
    # ... with a dead-letter exchange: read on the new queue, write on the DLX, before
    # the arguments are validated
    case("queue.declare-dlx-write-refused", declare_queue("all-new", arguments={
        "x-dead-letter-exchange": "r-x"}), refused="exchange 'r-x'"),
    case("queue.declare-dlx-read-refused", declare_queue("cfg-new", arguments={
        "x-dead-letter-exchange": "w-x"}), refused="queue 'cfg-new'"),
    case("queue.declare-dlx-permitted", declare_queue("all-new", arguments={
        "x-dead-letter-exchange": "w-x"}), ok="Queue.DeclareOk"),
    # queue.delete: configure, before the queue is looked up
    case("queue.delete", method(commands.Queue.Delete, queue="cfg-q"), ok="Queue.DeleteOk"),
    case("queue.delete-refused", method(commands.Queue.Delete, queue="r-q"),
         refused="queue 'r-q'"),
    case("queue.delete-missing-refused", method(commands.Queue.Delete, queue="w-none"),
         refused="queue 'w-none'"),
    case("queue.delete-shortcut-first", method(commands.Queue.Delete, queue=""),
         error=(404, "NOT_FOUND - no previously declared queue")),
    # queue.purge: read on the queue
    case("queue.purge", method(commands.Queue.Purge, queue="r-q"), ok="Queue.PurgeOk"),
    case("queue.purge-refused", method(commands.Queue.Purge, queue="cfg-q"),
         refused="queue 'cfg-q'"),
    case("queue.purge-missing-refused", method(commands.Queue.Purge, queue="w-none"),
         refused="queue 'w-none'"),
    # exchange.bind / unbind: write on the destination, read on the source
    case("exchange.bind", bind_exchange("w-x", "r-x"), ok="Exchange.BindOk"),
    case("exchange.bind-write-refused", bind_exchange("r-x", "r-x"),
         refused="exchange 'r-x'"),
    case("exchange.bind-read-refused", bind_exchange("w-x", "w-x"),
         refused="exchange 'w-x'"),
    case("exchange.bind-missing-refused", bind_exchange("w-x", "nope-x"),
         refused="exchange 'nope-x'"),
    case("exchange.bind-default-destination", bind_exchange("", "r-x"),
         refused="exchange 'amq.default'", user="eve"),  # write first, then "" itself
    case("exchange.bind-default-after-write", bind_exchange("", "r-x"),
         error=(403, DEFAULT_REFUSED)),
    case("exchange.bind-default-source", bind_exchange("w-x", ""),
         error=(403, DEFAULT_REFUSED)),
    case("exchange.unbind", bind_exchange("w-x", "r-x", unbind=True),
         ok="Exchange.UnbindOk"),
    case("exchange.unbind-not-bound", bind_exchange("all-x", "r-x", unbind=True),
         ok="Exchange.UnbindOk"),
    case("exchange.unbind-refused", bind_exchange("other-x", "r-x", unbind=True),
         refused="exchange 'other-x'"),
    case("exchange.unbind-read-refused", bind_exchange("w-x", "other-x", unbind=True),
         refused="exchange 'other-x'"),
    # queue.bind / unbind: write on the queue, read on the exchange
    case("queue.bind", bind_queue("w-q", "r-x"), ok="Queue.BindOk"),
    case("queue.bind-write-refused", bind_queue("r-q", "r-x"), refused="queue 'r-q'"),
    case("queue.bind-read-refused", bind_queue("w-q", "w-x"), refused="exchange 'w-x'"),
    case("queue.bind-missing-queue-refused", bind_queue("nope-q", "r-x"),
         refused="queue 'nope-q'"),
    case("queue.unbind", bind_queue("w-q", "r-x", unbind=True), ok="Queue.UnbindOk"),
    case("queue.unbind-write-refused", bind_queue("other-q", "r-x", unbind=True),
         refused="queue 'other-q'"),
    case("queue.unbind-read-refused", bind_queue("w-q", "other-x", unbind=True),
         refused="exchange 'other-x'"),
    # basic.publish: write on the exchange, the default one checked as amq.default,
    # before the exchange is looked up
    case("basic.publish-refused", Publish("r-x"), refused="exchange 'r-x'"),
    case("basic.publish-missing-refused", Publish("nope-x"), refused="exchange 'nope-x'"),
    case("basic.publish-default-refused", Publish("", "other-q"),
         refused="exchange 'amq.default'", user="eve"),
    case("basic.publish-missing-permitted", Publish("w-none"),
         error=(404, "NOT_FOUND - no exchange 'w-none' in vhost '/'")),
    # basic.get: read on the queue, before it is looked up
    case("basic.get", method(commands.Basic.Get, queue="r-q"), ok="Basic.GetOk"),
    case("basic.get-refused", method(commands.Basic.Get, queue="w-q"),
         refused="queue 'w-q'"),
    case("basic.get-missing-refused", method(commands.Basic.Get, queue="w-none"),
         refused="queue 'w-none'"),
    case("basic.get-missing-permitted", method(commands.Basic.Get, queue="r-none"),
         error=(404, "NOT_FOUND - no queue 'r-none' in vhost '/'")),
    # basic.consume: read on the queue; lease reads are consumes
    case("basic.consume", method(commands.Basic.Consume, queue="r-q"),
         ok="Basic.ConsumeOk"),
    case("basic.consume-refused", method(commands.Basic.Consume, queue="w-q"),
         refused="queue 'w-q'"),
    case("basic.consume-other-refused", method(commands.Basic.Consume, queue="other-q"),
         refused="queue 'other-q'"),
    case("basic.consume-lease-refused", method(
        commands.Basic.Consume, queue="other-q", no_ack=True,
        arguments={"x-lease": "L", "x-lease-start": 0, "x-lease-end": 1}),
         refused="queue 'other-q'"),
    case("basic.consume-lease-permitted", method(
        commands.Basic.Consume, queue="r-q", no_ack=True,
        arguments={"x-lease": "L", "x-lease-start": 0, "x-lease-end": 1}),
         error=(406, "PRECONDITION_FAILED - invalid arg 'x-lease' for queue 'r-q' in vhost "
                     "'/': leases need a quorum queue")),
    case("basic.consume-reply-to", method(commands.Basic.Consume,
                                          queue="amq.rabbitmq.reply-to", no_ack=True),
         ok="Basic.ConsumeOk", user="eve"),  # direct reply-to needs no permission
]


@pytest.mark.parametrize("user, request_, expected", CASES)
def test_each_method_checks_rabbitmqs_permission(user, request_, expected):
    """The access-control table, method by method: a refusal is a channel error 403
    naming the resource (the default exchange as amq.default) with the method's ids,
    checked where RabbitMQ checks it, and it changes nothing."""
    node = world(new_node(Settings(), users()))
    client = connect(node, user)
    before = state(node)
    send(client, request_)
    assert outcome(client) == expected
    if expected[0] == "Channel.Close":
        assert 1 not in client.session.channels  # the channel is closed
        assert state(node) == before


def test_publish_allowed_by_write_permission_is_routed():
    """basic.publish needs write on the exchange only: bob's message reaches a queue
    he may not read or configure; eve's refused one reaches none and closes her
    channel (60, 40)."""
    node = world(new_node(Settings(), users()))
    bob = connect(node, "bob")
    send(bob, Publish("w-x"))
    send(bob, Publish("", "other-q"))
    assert bob.read() == []
    assert node.vhosts["/"].queues["other-q"].ready_count == 3
    eve = connect(node, "eve")
    send(eve, Publish("", "other-q"))
    assert outcome(eve) == closed(Publish(""), 403, refusal("exchange 'amq.default'", "eve"))
    assert node.vhosts["/"].queues["other-q"].ready_count == 3


def test_server_named_queue_is_checked_under_its_generated_name():
    """queue.declare with no name: RabbitMQ generates amq.gen-... and checks configure
    on that name; a refusal names it and no queue is created."""
    node = world(new_node(Settings(), users()))
    eve = connect(node, "eve")
    before = state(node)
    eve.send(1, declare_queue(""))
    close = eve.expect_one("Channel.Close")
    assert (close.reply_code, close.class_id, close.method_id) == (403, 50, 10)
    assert re.fullmatch(refusal(r"queue 'amq\.gen-[\w-]+'", "eve"), close.reply_text), \
        close.reply_text
    assert state(node) == before


def test_transactional_publish_is_refused_at_publish_not_at_commit():
    """rabbit_channel checks write permission when basic.publish arrives, in a
    transaction too: the refusal closes the channel and nothing is buffered."""
    node = world(new_node(Settings(), users()))
    bob = connect(node, "bob")
    bob.call(1, method(commands.Tx.Select), "Tx.SelectOk")
    before = state(node)
    send(bob, Publish("r-x"))
    assert outcome(bob) == closed(Publish("r-x"), 403, refusal("exchange 'r-x'"))
    assert state(node) == before


def test_changed_permissions_apply_to_open_channels():
    """A channel remembers the checks that passed (as RabbitMQ's permission cache), but
    only under the rights they passed under: new rights are checked again."""
    node = world(new_node(Settings(), users()))
    bob = connect(node, "bob")
    send(bob, Publish("w-x"))
    assert bob.read() == []
    node.users.users["bob"].permissions["/"] = Permissions(BOB.configure, "^$", BOB.read)
    send(bob, Publish("w-x"))
    assert outcome(bob) == closed(Publish("w-x"), 403, refusal("exchange 'w-x'"))


def test_the_permission_cache_keeps_only_recent_checks():
    """Many resources on one channel: every check still answers from the rights."""
    node = world(new_node(Settings(), users()))
    bob = connect(node, "bob")
    for number in range(30):
        bob.call(1, declare_queue(f"cfg-{number}"), "Queue.DeclareOk")
    assert len(bob.session.channels[1].permitted) <= 12
    bob.send(1, declare_queue("w-30"))
    assert outcome(bob) == closed(declare_queue("w-30"), 403, refusal("queue 'w-30'"))


# ---------------------------------------------------------------- leases


def quorum_node(tmp_path) -> Node:
    settings = Settings()
    return new_node(settings, users(),
                    log_store=LogStore(str(tmp_path), StorageConfig(fsync=False)))


def management(client: Client, request: dict) -> dict:
    """One management RPC (docs/behaviour/management-rpc.md) on channel 1, answered on direct reply-to."""
    client.publish(1, "", "amq.quorumqueue.management", json.dumps(request).encode(),
                   properties(reply_to="amq.rabbitmq.reply-to", correlation_id="1"))
    replies = [r for r in client.read_deliveries() if isinstance(r, Delivery)]
    assert len(replies) == 1, replies
    return json.loads(replies[0].body)


def rpc_client(node: Node, user: str) -> Client:
    client = connect(node, user)
    client.call(1, method(commands.Basic.Consume, queue="amq.rabbitmq.reply-to",
                          no_ack=True), "Basic.ConsumeOk")
    return client


def test_leases_need_read_permission_on_the_queue(tmp_path):
    """A lease is a reader's state: lease.grow (and settle, release, info) and range
    reads (basic.consume with x-lease) need read on the queue, refused before the
    queue is looked up; with it, bob reads the range guest's messages are in."""
    node = quorum_node(tmp_path)
    guest = rpc_client(node, "guest")
    for queue in ("r-qq", "other-qq"):
        guest.declare_queue(1, queue, durable=True, arguments={"x-queue-type": "quorum"})
        guest.publish(1, "", queue, b"m")
    assert guest.read() == []
    bob = rpc_client(node, "bob")
    grow = {"op": "lease.grow", "vhost": "/", "lease": "L", "max_messages": 1}
    for op in ("lease.grow", "lease.settle", "lease.release", "lease.info"):
        request = dict(grow, op=op, queue="other-qq", up_to=1)
        assert management(bob, request) == {"ok": False,
                                            "error": refusal("queue 'other-qq'")}, op
    assert management(bob, {"op": "lease.grow", "vhost": "/", "queue": "w-none",
                            "lease": "L", "max_messages": 1}) == {
        "ok": False, "error": refusal("queue 'w-none'")}
    assert management(guest, dict(grow, queue="other-qq")) == {
        "ok": True, "result": {"first": 1, "end": 1}}
    assert management(bob, dict(grow, queue="r-qq")) == {
        "ok": True, "result": {"first": 1, "end": 1}}

    lease_read = dict(no_ack=True, arguments={"x-lease": "L", "x-lease-start": 0,
                                              "x-lease-end": 1})
    bob.open_channel(2)
    bob.send(2, method(commands.Basic.Consume, queue="r-qq", consumer_tag="t", **lease_read))
    replies = bob.read_deliveries()
    assert [name(r.method if isinstance(r, Delivery) else r[1]) for r in replies] == [
        "Basic.ConsumeOk", "Basic.Deliver", "Basic.Cancel"]
    assert replies[1].body == b"m"
    bob.send(2, method(commands.Basic.Consume, queue="other-qq", consumer_tag="u",
                       **lease_read))
    assert outcome(bob) == ("Channel.Close", 403, refusal("queue 'other-qq'"), 60, 20)


def test_management_requests_need_no_write_on_the_default_exchange(tmp_path):
    """The management RPC is published to "", but its operations check their own
    rights (docs/behaviour/access-and-policies.md): ada, tagged
    administrator with no permission anywhere in "/" (eve's ""-patterns), lists queues
    and is refused a lease operation for want of read on its queue; eve, with the
    same permissions and no tag, is refused as not an administrator, not for write on
    amq.default. Any other publish to "" still needs write on amq.default."""
    node = quorum_node(tmp_path)
    node.users.users["ada"] = User("ada", hash_password("ada"), ("administrator",),
                                   {"/": EVE})
    guest = rpc_client(node, "guest")
    guest.declare_queue(1, "r-qq", durable=True, arguments={"x-queue-type": "quorum"})
    ada, eve = rpc_client(node, "ada"), rpc_client(node, "eve")

    listed = management(ada, {"op": "queues.list", "vhost": "/"})
    assert listed["ok"] is True and [row["name"] for row in listed["result"]] == ["r-qq"]
    assert management(ada, {"op": "lease.info", "vhost": "/", "queue": "r-qq",
                            "lease": "L"}) == {"ok": False,
                                               "error": refusal("queue 'r-qq'", "ada")}
    assert management(eve, {"op": "queues.list", "vhost": "/"}) == {
        "ok": False, "error": "ACCESS_REFUSED - user 'eve' is not an administrator"}

    ada.publish(1, "", "r-qq", b"m")
    assert outcome(ada) == ("Channel.Close", 403, refusal("exchange 'amq.default'", "ada"),
                            60, 40)
"""Channel-method handlers: one function per AMQP method a client may send.

Each handler validates its arguments the way RabbitMQ does. It changes node state
and writes the reply (unless nowait). `dispatch` finds the handler by the decoded
method's class (`HANDLERS`). A method no handler takes (one only a server sends) is
503 COMMAND_INVALID. Channel open/close and content assembly are the protocol's
(broker/amqp/). Whole messages arrive at `publish`, a run at a time: what one read
carried on one channel.

Permissions: RabbitMQ's table (https://www.rabbitmq.com/docs/access-control).
Each is checked (`Channel.check_access`, 403) where rabbit_channel checks it. So it
comes before any state changes, and before any proposal to the metadata group.
- configure: exchange and queue declare (not passive) and delete.
- write: publish, on the exchange ("" as amq.default). A management request is
  not checked here: its operation checks its own rights. Also a binding's
  destination, and a new exchange's alternate or queue's dead-letter exchange
  (with read on the new one).
- read: get, consume (lease reads too), purge, a binding's source exchange.

Not here: connection-level methods, framing and channel lifecycles (broker/amqp/),
routing (vhost), delivery (node, channel).
"""

from __future__ import annotations

import base64
import os
from typing import Callable

from pamqp import commands as methods

from ..amqp import codec, spec
from ..amqp.batch_publish import is_batch, split as split_batch
from ..amqp.channel import ChannelState
from ..amqp.errors import AMQPError, access_refused, not_found, precondition
from ..amqp.properties import (FLAG_EXPIRATION, expiration_error, may_select_keys,
                               without_headers)
from ..queues import registry
from ..queues.actions import carry_out
from ..queues.types import (check_int_argument, check_server_named, field_type,
                            validate_declaration)
from ..routing.exchanges import EXCHANGE, EXCHANGE_TYPES, QUEUE, Destination
from . import leases, limits, management
from ..groups import metadata as meta
from .channel import Channel, Consumer
from .ordering import hold, replicate as _replicate, resume as _resume  # noqa: F401 - hold: session
from .node import REPLY_TO
from .vhost import DEFAULT_EXCHANGE_REFUSED, check_arguments_equivalent

RESOURCE_LOCKED_DETAIL = ("cannot obtain exclusive access to locked queue '{name}' in vhost "
                          "'{vhost}'. It could be originally declared on another connection "
                          "or the exclusive property value does not match that of the "
                          "original declaration.")

# properties flag bits the publish path looks at
_FLAG_REPLY_TO = 1 << 9
_FLAG_USER_ID = 1 << 4


def _generated_name(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")


def _text(value) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _queue_name(session, channel: Channel, name: str) -> str:
    """queue "" means the channel's last declared queue, as in RabbitMQ."""
    if name == "":
        if not channel.last_queue_name:
            raise AMQPError(spec.NOT_FOUND, "no previously declared queue")
        return channel.last_queue_name
    return name


def _check_exclusive(session, queue) -> None:
    """405 unless the queue is not exclusive, or this connection owns it. Owners
    are connection identities, so every node can tell (node/session.py
    `identity`)."""
    owner = queue.exclusive_owner
    if owner is not None and owner != session.identity:
        raise AMQPError(spec.RESOURCE_LOCKED,
                        RESOURCE_LOCKED_DETAIL.format(name=queue.name, vhost=queue.vhost))


def _lookup_queue(session, channel: Channel, name: str):
    """The queue a basic.get, basic.consume or queue.purge reads. The user's read
    permission is checked before the lookup, as in RabbitMQ."""
    name = _queue_name(session, channel, name)
    channel.check_access("read", QUEUE, name)
    queue = session.vhost.queue(name)
    _check_exclusive(session, queue)
    return queue


# ---------------------------------------------------------------- channel


def channel_flow(session, channel: Channel, args) -> None:
    if not args.active:
        raise AMQPError(spec.NOT_IMPLEMENTED, "active=false", 20, 20)
    channel.send(codec.channel_flow_ok(channel.number, True))


# ---------------------------------------------------------------- exchange


def exchange_declare(session, channel: Channel, args) -> None:
    vhost = session.vhost
    arguments = dict(args.arguments or {})
    checked = not args.passive and bool(args.exchange) and args.exchange_type in EXCHANGE_TYPES
    if checked:  # after RabbitMQ's type and default exchange checks
        channel.check_access("configure", EXCHANGE, args.exchange)
    alternate = arguments.get("alternate-exchange")
    if alternate is not None and not isinstance(alternate, (str, bytes)):
        raise precondition(f"invalid arg 'alternate-exchange' for exchange '{args.exchange}' "
                           f"in vhost '{vhost.name}': {{unacceptable_type,"
                           f"{type(alternate).__name__}}}")
    if (checked and alternate is not None and args.exchange not in vhost.exchanges
            and not args.exchange.startswith("amq.")):
        channel.check_access("read", EXCHANGE, args.exchange)
        channel.check_access("write", EXCHANGE, _text(alternate))
    if not args.passive and args.exchange not in vhost.exchanges:  # new: the metadata path
        vhost.check_new_exchange(args.exchange, args.exchange_type)
        _replicate(session, channel, spec.EXCHANGE_DECLARE, meta.encode(
            "exchange.declare", vhost=vhost.name, name=args.exchange,
            type=args.exchange_type, durable=bool(args.durable),
            auto_delete=bool(args.auto_delete), internal=bool(args.internal),
            arguments=arguments),
            None if args.nowait else lambda _: channel.send(
                codec.exchange_declare_ok(channel.number)))
        return
    exchange, created = vhost.declare_exchange(args.exchange, args.exchange_type,
                                               args.passive, args.durable, args.auto_delete,
                                               args.internal, arguments)
    if created and exchange.durable:
        session.node.metadata_dirty = True
    if not args.nowait:
        channel.send(codec.exchange_declare_ok(channel.number))


def exchange_delete(session, channel: Channel, args) -> None:
    vhost = session.vhost
    if args.exchange and not args.exchange.startswith("amq."):  # those are refused first
        channel.check_access("configure", EXCHANGE, args.exchange)
    if args.exchange in vhost.exchanges:
        vhost.check_delete_exchange(args.exchange, args.if_unused)
        _replicate(session, channel, spec.EXCHANGE_DELETE, meta.encode(
            "exchange.delete", vhost=vhost.name, name=args.exchange,
            if_unused=bool(args.if_unused)),
            None if args.nowait else lambda _: channel.send(
                codec.exchange_delete_ok(channel.number)))
        return
    exchange = session.vhost.delete_exchange(args.exchange, args.if_unused)
    if exchange is not None and exchange.durable:
        session.node.metadata_dirty = True
    if not args.nowait:
        channel.send(codec.exchange_delete_ok(channel.number))


def _bind(session, channel: Channel, source: str, destination: Destination,
          routing_key: str, arguments: dict, unbind: bool, method: tuple[int, int],
          ok: Callable[[], bytes] | None) -> None:
    """Bind or unbind; `ok()` builds the answer (None: nowait). Bindings go
    through the metadata group: every queue type is recorded there. First come the
    checks this node can make at once: permissions, exclusivity, what exists."""
    vhost = session.vhost
    channel.check_access("write", destination.kind, destination.name)
    if source == "" or (destination.kind == EXCHANGE and destination.name == ""):
        raise access_refused(DEFAULT_EXCHANGE_REFUSED)
    channel.check_access("read", EXCHANGE, source)
    target = vhost.queues.get(destination.name) if destination.kind == QUEUE else None
    # RabbitMQ checks exclusivity only for a binding that will change: unbinding what
    # is not bound is unbind-ok, even on another connection's exclusive queue
    if target is not None and (
            not unbind or vhost.has_binding(source, destination, routing_key, arguments)):
        _check_exclusive(session, target)
    vhost.check_binding(source, destination, unbind, arguments)
    if target is not None:  # its home node down: every operation fails (queues/base.py)
        target.check_available()
    _replicate(session, channel, method, meta.encode(
        "unbind" if unbind else "bind", vhost=vhost.name, source=source,
        kind=destination.kind, destination=destination.name, routing_key=routing_key,
        arguments=dict(arguments)),
        None if ok is None else lambda _: channel.send(ok()))


def exchange_bind(session, channel: Channel, args) -> None:
    _bind(session, channel, args.source, Destination(EXCHANGE, args.destination),
          args.routing_key, args.arguments or {}, False, spec.EXCHANGE_BIND,
          None if args.nowait else lambda: codec.exchange_bind_ok(channel.number))


def exchange_unbind(session, channel: Channel, args) -> None:
    _bind(session, channel, args.source, Destination(EXCHANGE, args.destination),
          args.routing_key, args.arguments or {}, True, spec.EXCHANGE_UNBIND,
          None if args.nowait else lambda: codec.exchange_unbind_ok(channel.number))


# ---------------------------------------------------------------- queue


def queue_declare(session, channel: Channel, args) -> None:
    node, vhost = session.node, session.vhost
    name = args.queue
    arguments = dict(args.arguments or {})
    if name == REPLY_TO or (args.passive and name.startswith(REPLY_TO + ".")):
        # RabbitMQ answers for the pseudo queue (declared or not) and for a live
        # generated reply name with one consumer and no messages
        if name != REPLY_TO and not node.has_reply_to(name):
            raise not_found("queue", name, vhost.name)
        if not args.nowait:
            channel.send(codec.queue_declare_ok(channel.number, name, 0, 1))
        return
    if args.passive:  # no "last declared queue" shortcut here, as in RabbitMQ
        queue = vhost.queue(name)
        _check_exclusive(session, queue)
        queue.check_available()
        channel.last_queue_name = queue.name
        if not args.nowait:
            _send_declare_ok(channel, queue)
        return
    if name == "":
        check_server_named(arguments)
        name = _generated_name("amq.gen-")
    elif name.startswith("amq."):
        raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
    channel.check_access("configure", QUEUE, name)
    existing = vhost.queues.get(name)
    if existing is not None:
        _check_exclusive(session, existing)
        existing.check_available()
        where = f"queue '{name}' in vhost '{vhost.name}'"
        if bool(args.exclusive) != (existing.exclusive_owner is not None):
            raise AMQPError(spec.RESOURCE_LOCKED,
                            RESOURCE_LOCKED_DETAIL.format(name=name, vhost=vhost.name))
        for field_name, received, current in (("durable", args.durable, existing.durable),
                                              ("auto_delete", args.auto_delete,
                                               existing.auto_delete)):
            if bool(received) != current:
                raise precondition(f"inequivalent arg '{field_name}' for {where}: received "
                                   f"'{str(bool(received)).lower()}' but current is "
                                   f"'{str(current).lower()}'")
        received, current = existing.equivalence_arguments(arguments)
        keys = existing.EQUIVALENCE_KEYS
        if node.settings.quorum_relaxed_checks_on_redeclaration:  # the 4.2 guide's option
            keys = tuple(key for key in keys if key != "x-queue-type")
        check_arguments_equivalent(received, current, where, keys)
        queue = existing
    else:
        dead_letter = arguments.get("x-dead-letter-exchange")
        if isinstance(dead_letter, (str, bytes)):  # as RabbitMQ: before the arguments
            channel.check_access("read", QUEUE, name)
            channel.check_access("write", EXCHANGE, _text(dead_letter))
        queue_spec = validate_declaration(name, vhost.name, bool(args.durable),
                                          bool(args.exclusive), bool(args.auto_delete), arguments)
        limits.check_queue(vhost, name)  # the vhost's max-queues (node/limits.py)
        _declare_replicated(session, channel, args, name, queue_spec)  # every type
        return
    channel.last_queue_name = queue.name
    if not args.nowait:
        _send_declare_ok(channel, queue)


def _declare_replicated(session, channel: Channel, args, name: str, queue_spec) -> None:
    """A new queue recorded in the metadata. Its type places it: a quorum queue's
    members and intended leader, a classic queue's host. It is declared through the
    metadata group with its flags. An exclusive queue's owner is this connection's
    identity. Declare-ok goes once this node applied it and the queue can answer."""
    node, vhost = session.node, session.vhost
    arguments = dict(queue_spec.arguments)
    queue_type = registry.type_of(queue_spec.type)
    record = queue_type.place(
        vhost.name, name, arguments, node.policy_for(vhost.name, queue_spec.type, name),
        node.settings, node.cluster, exclusive=queue_spec.exclusive)
    record.update(queue_type.recorded_flags(
        queue_spec.durable, queue_spec.auto_delete,
        session.identity if queue_spec.exclusive else None))

    def declared(_reply) -> None:
        queue = vhost.queues.get(name)
        if queue is None or channel.state != ChannelState.OPEN:
            return  # deleted meanwhile; the client learns it at its next use
        channel.last_queue_name = name
        if not args.nowait:
            queue.when_led(lambda: _send_declare_ok(channel, queue))

    _replicate(session, channel, spec.QUEUE_DECLARE, meta.encode(
        "queue.declare", vhost=vhost.name, name=name, type=queue_spec.type,
        arguments=arguments, **record),
        declared)


def _send_declare_ok(channel: Channel, queue) -> None:
    """declare-ok with the queue's counts, once the queue knows them (queues/base.py)."""
    carry_out(queue.declare_ok(_DeclareAsker(channel, queue.name)))


class _DeclareAsker:
    """A queue.declare waiting for the queue's counts (queues/base.py Asker)."""

    __slots__ = ("channel", "name")

    def __init__(self, channel: Channel, name: str) -> None:
        self.channel, self.name = channel, name

    def declare_ok(self, ready: int, consumers: int) -> None:
        channel = self.channel
        if channel.is_open:
            channel.send(codec.queue_declare_ok(channel.number, self.name, ready, consumers))


def queue_bind(session, channel: Channel, args) -> None:
    name = _queue_name(session, channel, args.queue)
    routing_key = args.routing_key if (args.routing_key or args.queue) else name
    _bind(session, channel, args.exchange, Destination(QUEUE, name), routing_key,
          args.arguments or {}, False, spec.QUEUE_BIND,
          None if args.nowait else lambda: codec.queue_bind_ok(channel.number))


def queue_unbind(session, channel: Channel, args) -> None:
    name = _queue_name(session, channel, args.queue)
    _bind(session, channel, args.exchange, Destination(QUEUE, name), args.routing_key,
          args.arguments or {}, True, spec.QUEUE_UNBIND,
          lambda: codec.queue_unbind_ok(channel.number))


def queue_purge(session, channel: Channel, args) -> None:
    queue = _lookup_queue(session, channel, args.queue)
    session.node.purge_queue(queue, _PurgeAsker(session, channel, bool(args.nowait)))


class _PurgeAsker:
    """A queue.purge waiting for its count (queues/base.py Asker)."""

    __slots__ = ("session", "channel", "nowait")

    def __init__(self, session, channel: Channel, nowait: bool) -> None:
        self.session, self.channel, self.nowait = session, channel, nowait

    def purge_ok(self, count: int) -> None:
        channel = self.channel
        if channel.state == ChannelState.OPEN and not self.nowait:
            channel.send(codec.queue_purge_ok(channel.number, count))

    def refused(self, error: AMQPError) -> None:
        """The queue's host could not be asked."""
        if self.channel.state == ChannelState.OPEN:
            self.session.fail_later(error.at(*spec.QUEUE_PURGE), self.channel)


def queue_delete(session, channel: Channel, args) -> None:
    vhost = session.vhost
    name = _queue_name(session, channel, args.queue)
    channel.check_access("configure", QUEUE, name)
    queue = vhost.queues.get(name)
    if queue is None:
        if not args.nowait:  # deleting what does not exist succeeds, as in RabbitMQ
            channel.send(codec.queue_delete_ok(channel.number, 0))
        return
    _check_exclusive(session, queue)
    queue.check_available(deleting=True)
    waiting = [True]

    def refreshed() -> None:
        if waiting:  # at once (a queue this node holds): errors reach the caller
            waiting.clear()
            _delete_replicated(session, channel, args, queue)
            return
        if channel.state != ChannelState.OPEN:
            return
        if queue.deleted:  # deleted meanwhile, through another channel or node
            if not args.nowait:
                channel.send(codec.queue_delete_ok(channel.number, 0))
            _resume(session, channel)
            return
        try:
            _delete_replicated(session, channel, args, queue)
        except AMQPError as error:
            channel.held = None
            session.fail_later(error.at(*spec.QUEUE_DELETE), channel)

    # the counts the checks and the answer need (a queue held elsewhere asks its
    # host); meanwhile the channel's next methods wait
    queue.refresh(refreshed)
    if waiting:
        waiting.clear()
        if channel.held is None:
            channel.held = []


def _delete_replicated(session, channel: Channel, args, queue) -> None:
    """queue.delete through the metadata log, after RabbitMQ's if-unused/if-empty
    checks; delete-ok once this node applied it."""
    vhost, name = session.vhost, queue.name
    queue.check_delete(bool(args.if_unused), bool(args.if_empty))
    # the basic.cancel of this channel's own consumers waits for the delete-ok
    channel.deleting = (vhost.name, name, [])

    def deleted(count) -> None:
        _where, _name, cancels = channel.deleting or (None, None, [])
        channel.deleting = None
        if not args.nowait:
            channel.send(codec.queue_delete_ok(channel.number, count or 0))
        for frame in cancels:
            channel.send(frame)

    _replicate(session, channel, spec.QUEUE_DELETE, meta.encode(
        "queue.delete", vhost=vhost.name, name=name, group=queue.group), deleted)


# ---------------------------------------------------------------- basic


def basic_qos(session, channel: Channel, args) -> None:
    if args.prefetch_size:
        raise AMQPError(spec.NOT_IMPLEMENTED, f"prefetch_size!=0 ({args.prefetch_size})", 60, 10)
    if args.global_:
        channel.global_prefetch = args.prefetch_count
        channel._refill(list(channel.consumers.values()))
    else:
        channel.consumer_prefetch = args.prefetch_count
    channel.send(codec.basic_qos_ok(channel.number))


def basic_consume(session, channel: Channel, args) -> None:
    tag = args.consumer_tag or _generated_name("amq.ctag-")
    if tag in channel.consumers or tag in channel.lease_ranges:
        raise AMQPError(spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20)
    arguments = dict(args.arguments or {})
    if args.queue == REPLY_TO:
        _consume_reply_to(session, channel, args, tag)
        return
    queue = _lookup_queue(session, channel, args.queue)
    where = f"queue '{queue.name}' in vhost '{queue.vhost}'"
    if "x-lease" in arguments:
        leases.consume_lease_range(session, channel, queue, args, tag, arguments)
        return
    priority = arguments.get("x-priority", 0)
    check_int_argument("x-priority", priority, where)
    exclusive = queue.check_consume(channel, bool(args.exclusive))
    if queue.exclusive_consumer is not None or (exclusive and queue.consumers):
        raise access_refused(f"{where} in exclusive use")
    consumer = Consumer(channel, queue, tag, bool(args.no_ack), exclusive, priority,
                        channel.consumer_prefetch, arguments)
    channel.add_consumer(consumer)
    channel.queues_used[id(queue)] = queue
    if not args.nowait:
        channel.send(codec.basic_consume_ok(channel.number, tag))
    carry_out(queue.consume(channel, consumer))


def _consume_reply_to(session, channel: Channel, args, tag: str) -> None:
    if not args.no_ack:
        raise precondition("reply consumer cannot acknowledge")
    if channel.reply_to_consumer is not None:
        raise precondition("reply consumer already set")
    consumer = Consumer(channel, None, tag, True, False, 0, 0, {})
    consumer.reply_to = True
    channel.add_consumer(consumer)
    channel.reply_to_consumer = consumer
    session.node.register_reply_to(channel)
    if not args.nowait:
        channel.send(codec.basic_consume_ok(channel.number, tag))


def basic_cancel(session, channel: Channel, args) -> None:
    channel.cancel(args.consumer_tag)  # an unknown tag is fine, as in RabbitMQ
    if not args.nowait:
        channel.send(codec.basic_cancel_ok(channel.number, args.consumer_tag))


def publish(session, channel: Channel, messages: list) -> tuple[int, AMQPError] | None:
    """Complete messages arrived on `channel`, in order.

    Each is an amqp.events.ContentReceived: method, header, body. A run is what one
    read carried, usually one. Each is checked as rabbit_channel checks a
    basic.publish. An exchange's write permission and existence are checked once
    per run of it. Each takes its confirm number. The run goes to the node (or the
    transaction) in one call. A management request goes on its own: it may change
    what the checks found. On the first message that fails, those before it are
    published. Then (its position, its error) is returned. None when all were.
    A batch publish (immediate=true, amqp/batch_publish.py) goes on as one message
    whose body is its `Batch`: one confirm number for all its messages."""
    vhost = session.vhost
    permitted = found = None  # the exchange whose permission, whose existence was checked
    taken: list[tuple] = []   # checked, from messages[first] on, not yet published
    first = 0
    failed = None
    for position, message in enumerate(messages):
        publish, properties = message.method, message.properties
        name = publish.exchange
        request = not name and publish.routing_key == management.ROUTING_KEY
        body = message.body
        try:
            if publish.immediate:
                # refused once the content is in, as rabbit_channel does; but a batch
                # publish (quorumqueue's own, amqp/batch_publish.py) says immediate too
                if not is_batch(properties) or request:
                    raise AMQPError(spec.NOT_IMPLEMENTED, "immediate=true", 60, 40)
            if name != permitted and not request:
                channel.check_access("write", EXCHANGE, name)
                permitted = name
            if name != found:  # before a confirm number is taken: 404 (retried once)
                if vhost.exchange(name).internal:
                    raise AMQPError(spec.ACCESS_REFUSED, f"cannot publish to internal "
                                    f"exchange '{name}' in vhost '{vhost.name}'", 60, 40)
                found = name
            if properties.flags & (_FLAG_REPLY_TO | _FLAG_USER_ID | FLAG_EXPIRATION):
                properties = _checked_properties(session, channel, properties)
            if may_select_keys(properties):
                properties = _selected_keys(properties)
            if publish.immediate:  # a batch: its messages, checked (406 if malformed)
                body = split_batch(properties, body, session.settings.max_message_size)
        except AMQPError as error:
            failed = (position, error)
            break
        confirm_seq = channel.next_confirm() if channel.confirm_mode else 0
        taken.append((publish, properties, body, confirm_seq))
        if request:
            stopped = _publish_taken(session, channel, taken, first)
            if stopped is not None:
                return stopped
            taken, first, permitted, found = [], position + 1, None, None
    return _publish_taken(session, channel, taken, first) or failed


def _publish_taken(session, channel: Channel, taken: list[tuple],
                   first: int) -> tuple[int, AMQPError] | None:
    """The checked messages to the node (or the transaction). Returns the node's
    failure at the position of `messages` (`taken` starts at `first`)."""
    if not taken:
        return None
    if channel.tx_mode:
        channel.tx_publishes.extend(taken)
        return None
    failed = session.node.publish(channel, taken)
    return None if failed is None else (first + failed[0], failed[1])


def _checked_properties(session, channel: Channel, properties):
    """A message's user_id, reply_to and per-message TTL (expiration), as
    rabbit_channel checks them. The user_id is the user's own; any, for a user
    tagged impersonator. reply_to may be direct reply-to: this channel's name for
    it."""
    if properties.flags & (_FLAG_REPLY_TO | _FLAG_USER_ID):
        properties = _checked_names(session, channel, properties)
    if properties.flags & FLAG_EXPIRATION:
        invalid = expiration_error(properties)
        if invalid is not None:
            raise AMQPError(spec.PRECONDITION_FAILED, f"invalid expiration "
                            f"'{properties.decoded()['expiration']}': {invalid}", 60, 40)
    return properties


def _selected_keys(properties):
    """Sender-selected distribution (RabbitMQ's CC and BCC headers). Their string
    entries are routing keys besides the routing key (`selected_keys`). Other
    entries are ignored. BCC is removed before the message goes on; its keys go on
    beside it (`blind_keys`: a queue keeps them for dead lettering). A CC or BCC
    that is not an array is refused, as rabbit_basic refuses it."""
    headers = properties.decoded().get("headers") or {}
    keys: dict[str, list[str]] = {"CC": [], "BCC": []}
    for name in ("CC", "BCC"):
        if name in headers:
            routes = headers[name]
            if not isinstance(routes, list):
                raise AMQPError(spec.PRECONDITION_FAILED, "invalid message: "
                                f'{{unacceptable_type_in_header,"{name}",'
                                f"{field_type(routes)}}}", 60, 40)
            keys[name] = [_text(key) for key in routes if isinstance(key, (str, bytes))]
    if "BCC" in headers:
        _, properties = codec.decode_properties(without_headers(properties.raw, ("BCC",)))
        properties.blind_keys = tuple(keys["BCC"])
    properties.selected_keys = tuple(keys["CC"] + keys["BCC"])
    return properties


def _checked_names(session, channel: Channel, properties):
    values = properties.decoded()
    user_id = values.get("user_id")
    if (user_id is not None and _text(user_id) != session.user.name
            and "impersonator" not in session.user.tags):
        raise precondition(f"user_id property set to '{_text(user_id)}' but authenticated "
                           f"user was '{session.user.name}'")
    if _text(values.get("reply_to") or "") == REPLY_TO:
        if channel.reply_to_consumer is None:
            raise precondition("fast reply consumer does not exist")
        name = session.node.reply_to_name(channel)
        values = dict(values, reply_to=name)
        raw = codec.encode_properties(properties.body_size, values)
        _, properties = codec.decode_properties(raw)
    return properties


def basic_get(session, channel: Channel, args) -> None:
    queue = _lookup_queue(session, channel, args.queue)
    channel.queues_used[id(queue)] = queue
    carry_out(queue.basic_get(channel, bool(args.no_ack)))


def basic_ack(session, channel: Channel, args: codec.Ack) -> None:
    channel.settle(args.delivery_tag, args.multiple, None, spec.BASIC_ACK)


def basic_nack(session, channel: Channel, args: codec.Nack) -> None:
    channel.settle(args.delivery_tag, args.multiple, args.requeue, spec.BASIC_NACK)


def basic_reject(session, channel: Channel, args: codec.Reject) -> None:
    channel.settle(args.delivery_tag, False, args.requeue, spec.BASIC_REJECT)


def basic_recover(session, channel: Channel, args) -> None:
    channel.recover(args.requeue)
    channel.send(codec.basic_recover_ok(channel.number))


def basic_recover_async(session, channel: Channel, args) -> None:
    channel.recover(args.requeue)


# ---------------------------------------------------------------- confirm, tx


def confirm_select(session, channel: Channel, args) -> None:
    if channel.tx_mode:
        raise precondition("cannot switch from tx to confirm mode")
    channel.confirm_mode = True
    if not args.nowait:
        channel.send(codec.confirm_select_ok(channel.number))


def tx_select(session, channel: Channel, args) -> None:
    if channel.confirm_mode:
        raise precondition("cannot switch from confirm to tx mode")
    channel.tx_mode = True
    channel.send(codec.tx_select_ok(channel.number))


def tx_commit(session, channel: Channel, args) -> None:
    if not channel.tx_mode:
        raise precondition("channel is not transactional")
    channel.commit()  # commit-ok once the publishes are safe (Channel.commit)


def tx_rollback(session, channel: Channel, args) -> None:
    if not channel.tx_mode:
        raise precondition("channel is not transactional")
    channel.rollback()
    channel.send(codec.tx_rollback_ok(channel.number))


HANDLERS: dict[type, Callable] = {
    methods.Channel.Flow: channel_flow,
    methods.Exchange.Declare: exchange_declare,
    methods.Exchange.Delete: exchange_delete,
    methods.Exchange.Bind: exchange_bind,
    methods.Exchange.Unbind: exchange_unbind,
    methods.Queue.Declare: queue_declare,
    methods.Queue.Bind: queue_bind,
    methods.Queue.Purge: queue_purge,
    methods.Queue.Delete: queue_delete,
    methods.Queue.Unbind: queue_unbind,
    methods.Basic.Qos: basic_qos,
    methods.Basic.Consume: basic_consume,
    methods.Basic.Cancel: basic_cancel,
    methods.Basic.Get: basic_get,
    codec.Ack: basic_ack,
    codec.Reject: basic_reject,
    methods.Basic.RecoverAsync: basic_recover_async,
    methods.Basic.Recover: basic_recover,
    codec.Nack: basic_nack,
    methods.Confirm.Select: confirm_select,
    methods.Tx.Select: tx_select,
    methods.Tx.Commit: tx_commit,
    methods.Tx.Rollback: tx_rollback,
}


# the name fields rabbit_channel strips line feeds and carriage returns from
# (strip_cr_lf: declaring "q\n" declares "q"); basic.get, consume, purge and publish
# take their names as they are
STRIPPED_NAMES = {
    methods.Exchange.Declare: ("exchange",),
    methods.Exchange.Delete: ("exchange",),
    methods.Exchange.Bind: ("destination", "source"),
    methods.Exchange.Unbind: ("destination", "source"),
    methods.Queue.Declare: ("queue",),
    methods.Queue.Delete: ("queue",),
    methods.Queue.Bind: ("queue", "exchange"),
    methods.Queue.Unbind: ("queue", "exchange"),
}


def _strip_cr_lf(method, fields: tuple[str, ...]) -> None:
    for name in fields:
        value = getattr(method, name)
        if "\n" in value or "\r" in value:
            setattr(method, name, value.replace("\n", "").replace("\r", ""))


def dispatch(session, channel: Channel, method) -> None:
    """Run the handler of `method`: a decoded method, of codec's hot-path classes
    or pamqp's. The caller attaches the method's ids to errors."""
    handler = HANDLERS.get(type(method))
    stripped = STRIPPED_NAMES.get(type(method))
    if stripped is not None:
        _strip_cr_lf(method, stripped)
    if handler is None:  # only a server sends it (the protocol took the rest)
        raise AMQPError(spec.COMMAND_INVALID, f"method "
                        f"'{spec.method_name(method.index >> 16, method.index & 0xFFFF)}' "
                        "is not valid from a client")
    handler(session, channel, method)

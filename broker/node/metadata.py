"""What each metadata command does to a node (the commands: groups/metadata.py).

Every node applies the same commands in the same order. So every node routes the
same way, and knows every queue in the metadata. For a quorum queue that is its
group uid and members. For a classic queue, its uid and host: the host holds it,
the others reach it through queues/remote.py.

`apply(node, command)` returns the command's result: a message count for
queue.delete, None otherwise. It returns `("error", reply_code, reply_text)` when
the command cannot be applied: another node declared the same name differently
first. The proposing node raises that as the channel error RabbitMQ would have
sent.

Application is idempotent where a retry can repeat a command. That is declaring
what exists with the same definition, deleting what is gone, binding twice.

Not here: the group and its log (groups/metadata.py), checks made before proposing
(handlers.py, definitions.py), snapshots (metadata_snapshot.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..amqp.errors import AMQPError, precondition
from ..amqp.spec import RESOURCE_LOCKED
from ..queues.actions import carry_out
from ..queues.mirroring import forget_leader, ha_settings
from ..routing.exchanges import EXCHANGE, QUEUE, Destination
from . import membership
from .definitions import COMMANDS as DEFINITION_COMMANDS, apply_command

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

log = logging.getLogger("quorumqueue.broker")


def apply(node: "Node", command: dict):
    try:
        return APPLY[command["op"]](node, command)
    except AMQPError as error:
        return ("error", error.code, error.detail)


def _vhost(node: "Node", name: str):
    vhost = node.vhosts.get(name)
    if vhost is None:
        from .vhost import VHost

        vhost = node.vhosts[name] = VHost(name)
    return vhost


def _exchange_declare(node: "Node", c: dict):
    """Exchanges and bindings do not mark the metadata file to be saved.
    The metadata log holds the command, durable before it is applied. A restart
    applies the log after the last snapshot on top of the file. A snapshot saves
    the file (groups/metadata.py). Only queue records must be in the file before the
    replay. A restart drops the messages and groups of queues the file does not
    name."""
    exchange, created = _vhost(node, c["vhost"]).declare_exchange(
        c["name"], c["type"], False, c["durable"], c["auto_delete"], c["internal"],
        c["arguments"])
    if created:  # a policy set before the exchange applies to it (its alternate-exchange)
        node.apply_exchange_policy(c["vhost"], exchange)
    return None


def _exchange_delete(node: "Node", c: dict):
    _vhost(node, c["vhost"]).delete_exchange(c["name"], c["if_unused"])  # (the log has it)
    return None


def _queue_declare(node: "Node", c: dict):
    from .vhost import check_arguments_equivalent
    from ..queues.types import validate_declaration

    vhost = _vhost(node, c["vhost"])
    durable = c.get("durable", True)  # quorum records carry no flags: durable
    owner = c.get("exclusive_owner")
    existing = vhost.queues.get(c["name"])
    if existing is not None:  # declared meanwhile through another node: the same?
        where = f"queue '{c['name']}' in vhost '{vhost.name}'"
        declared = c.get("type", "quorum")  # records before types were written: quorum
        if existing.type_name != declared:
            raise precondition(f"inequivalent arg 'x-queue-type' for {where}: received "
                               f"'{declared}' but current is '{existing.type_name}'")
        if existing.group != c["group"] and existing.exclusive_owner != owner:
            from .handlers import RESOURCE_LOCKED_DETAIL

            raise AMQPError(RESOURCE_LOCKED, RESOURCE_LOCKED_DETAIL.format(name=c["name"],
                                                               vhost=vhost.name))
        if existing.durable != durable:
            raise precondition(f"inequivalent arg 'durable' for {where}: received "
                               f"'{str(durable).lower()}' but current is "
                               f"'{str(existing.durable).lower()}'")
        check_arguments_equivalent(*existing.equivalence_arguments(c["arguments"]), where,
                                   existing.EQUIVALENCE_KEYS)
        return None
    spec = validate_declaration(c["name"], vhost.name, durable, owner is not None,
                                c.get("auto_delete", False), c["arguments"], recorded=True)
    node.create_recorded_queue(vhost, c["name"], spec, c)
    return None


def _queue_delete(node: "Node", c: dict):
    vhost = node.vhosts.get(c["vhost"])
    queue = vhost.queues.get(c["name"]) if vhost is not None else None
    if queue is None or queue.group != c["group"]:
        return 0  # gone already (a retry, or deleted through another node first)
    return node.delete_queue(vhost, queue)


def _queue_members(node: "Node", c: dict):
    """The members asked for (membership.py makes the Raft groups follow)."""
    vhost = node.vhosts.get(c["vhost"])
    queue = vhost.queues.get(c["name"]) if vhost is not None else None
    if queue is None or queue.group != c["group"]:
        return None
    queue.members = tuple(c["members"])
    node.queue_changed(vhost.name, queue.name)
    membership.named(node, queue)
    return None


def _queue_record(node: "Node", c: dict):
    """A queue record's fields changed: a mirrored classic queue's leader, mirrors
    and synchronised mirrors (queues/mirroring.py). Not if the record no longer has
    the leader the proposer saw (`expect_host`: two promotions, one wins)."""
    vhost = node.vhosts.get(c["vhost"])
    queue = vhost.queues.get(c["name"]) if vhost is not None else None
    if queue is None or queue.group != c["group"]:
        return None
    if queue.metadata_record().get("host") != c["expect_host"]:
        return None
    record_changed(node, vhost, queue, c["record"])
    return None


def record_changed(node: "Node", vhost, queue, record: dict) -> None:
    """A queue's metadata record changed (`queue.record`): a mirrored classic
    queue's mirrors, or its leader. The queue takes it in place. Or, served by
    another node now, it is built anew from it and takes over from the old one
    (queues/base.py). This node's consumers follow it. Not those that asked to be
    told of a failover (x-cancel-on-ha-failover). They get basic.cancel, as the
    mirroring guide's "Leader Failures and Consumer Cancellation" says."""
    from ..queues import registry
    from ..queues.types import validate_declaration
    from .channel import Consumer

    before = queue.metadata_record()
    full = {**before, **record}
    node.queue_changed(vhost.name, queue.name)
    if full.get("host") == node.name:
        # the guide's "How to Check if a Queue is Mirrored?": "When a new queue mirror
        # is added, the event is logged" (by the leader's node, in RabbitMQ's words)
        kept = set(before.get("mirrors") or ())   # (a promotion keeps the others)
        for mirror in full.get("mirrors") or ():
            if mirror not in kept:
                log.info("Mirrored queue '%s' in vhost '%s': Adding mirror on node %s",
                         queue.name, vhost.name, mirror)
    if queue.record_changed(full):
        queue.policy_changed(node.policy_for(vhost.name, queue.type_name, queue.name))
        return
    queue_spec = validate_declaration(queue.name, vhost.name, queue.durable,
                                      queue.exclusive_owner is not None,
                                      queue.auto_delete, queue.arguments, recorded=True)
    fresh = registry.create_recorded(node, vhost.name, queue.name, queue_spec,
                                     {**full, "promoted": True})
    consumers = [c for c in queue.consumers if isinstance(c, Consumer)]
    for consumer in list(queue.consumers):
        queue.remove_consumer(consumer)
    vhost.queues[queue.name] = fresh
    if fresh.TICKS:
        node.ticked_queues[fresh] = None
    queue.deleted = True
    queue.replaced()
    node.cluster.classic.hosted_deleted(queue)
    fresh.policy_changed(node.policy_for(vhost.name, fresh.type_name, fresh.name))
    fresh.take_over(queue)
    for consumer in consumers:
        channel = consumer.channel
        if _truthy(consumer.arguments.get("x-cancel-on-ha-failover")):
            node.cancel_consumer(queue, consumer)
        elif channel.consumers.get(consumer.tag) is consumer:
            consumer.queue = fresh
            channel.queues_used[id(fresh)] = fresh
            carry_out(fresh.consume(channel, consumer))


def _truthy(value) -> bool:
    return value is True or value in (1, "true", b"true")


def _bind(node: "Node", c: dict):
    vhost = _vhost(node, c["vhost"])
    destination = Destination(QUEUE if c["kind"] == QUEUE else EXCHANGE, c["destination"])
    if c["op"] == "unbind":
        vhost.unbind(c["source"], destination, c["routing_key"], c["arguments"])
    else:
        vhost.bind(c["source"], destination, c["routing_key"], c["arguments"])
    return None  # the file is not marked: the log has it (`_exchange_declare`)


def _add_node(node: "Node", c: dict):
    node.cluster.add_node(c["name"], tuple(c["address"]))
    return None


def _forget_node(node: "Node", c: dict):
    """The node leaves the cluster's list and every quorum queue's members.
    Their leaders then remove it from their Raft groups (membership.reconcile). A
    queue whose only member it was keeps it: it can only be deleted. A mirrored
    classic queue it led gets one of its mirrors as leader, on every node alike
    (mirroring.forget_leader). That is the guide's "Loss of a Leader While All
    Mirrors are Stopped". Under ha-promote-on-failure when-synced, only a
    synchronised one."""
    name = c["name"]
    node.cluster.forget_node(name)
    for vhost in node.vhosts.values():
        for queue in list(vhost.queues.values()):
            if queue.REPLICATED and name in queue.members and len(queue.members) > 1:
                queue.members = tuple(m for m in queue.members if m != name)
                node.queue_changed(vhost.name, queue.name)
            elif queue.mirrors is not None:
                settings = ha_settings(node.policy_for(vhost.name, "classic", queue.name))
                rule = settings.promote_on_failure if settings is not None else "always"
                record = forget_leader(queue.metadata_record(), name, rule)
                if record is None and rule == "when-synced" \
                        and queue.metadata_record().get("host") == name:
                    log.warning("mirrored queue '%s' in vhost '%s': its leader's node %s "
                                "is forgotten and no mirror was synchronised "
                                "(ha-promote-on-failure when-synced): the queue stays "
                                "unavailable until deleted", queue.name, vhost.name, name)
                if record is not None:
                    log.warning("mirrored queue '%s' in vhost '%s': its leader's node %s "
                                "is forgotten: the mirror on %s leads it with its copy",
                                queue.name, vhost.name, name, record["host"])
                    record_changed(node, vhost, queue, record)
    return None


def _definition(node: "Node", c: dict):
    apply_command(node, c)  # users, vhosts, permissions, policies: node/definitions.py
    return None


APPLY = {
    "cluster.add_node": _add_node,
    "cluster.forget_node": _forget_node,
    "exchange.declare": _exchange_declare,
    "exchange.delete": _exchange_delete,
    "queue.declare": _queue_declare,
    "queue.delete": _queue_delete,
    "queue.members": _queue_members,
    "queue.record": _queue_record,
    "bind": _bind,
    "unbind": _bind,
    "barrier": lambda node, c: None,  # changes nothing: node/ordering.py `after_barrier`
    **{op: _definition for op in DEFINITION_COMMANDS},
}

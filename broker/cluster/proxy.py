"""Proxying for nodes that hold no replica of a quorum queue.

Responsibilities: what the leader sends such a node and what that node does with it.
The node's commands reach the leader as forwarded proposals asking for the reply
(cluster.py); the leader answers after its apply with the reply encoded here (plain
values as they are, a basic.get's message read from its log), and hands that node's
consumers their deliveries with the bodies. The receiving node writes them to its
channels, settles what no-ack consumers took, and returns what arrives for a consumer
that is gone. Its counts (a passive queue.declare) come from a member too: an Rpc
"stat" that member answers once it applied everything it had appended, so the
publishes this node forwarded before are counted; asked of the leader, or of another
member whose link is up, and asked again of another when the link to the one asked
closes (a killed node); all zeros if no member answers within STAT_TIMEOUT (a queue
without a reachable majority), as RabbitMQ answers then.
The counts are a dict: ready, unacked, consumers, bytes (message bodies in the queue).

Not here: forwarding and retries (cluster.py), the queue record (queues/quorum/queue.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..amqp.channel import ChannelState
from ..fifo.commands import Delivery, Return, Settle
from ..queues.actions import carry_out
from ..queues.quorum.queue import MessageGone
from .wire import Rpc

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Cluster

STAT_TIMEOUT = 5.0  # seconds a node with no replica waits for a member's counts


def encode_reply(cluster: "Cluster", member, reply):
    """A machine reply for a node with no replica: plain values as they are; a
    basic.get's (Delivery, remaining) with the message read from this log."""
    if isinstance(reply, tuple) and len(reply) == 2 and isinstance(reply[0], Delivery):
        delivery, remaining = reply
        try:
            exchange, routing_key, header, body = cluster.groups.read_message(
                member, delivery.raft_index)
        except MessageGone:
            if delivery.msg_id:  # checked out: live, never released
                raise
            return None  # a no-ack get applied twice, its message settled and released

        return {"get": [delivery.msg_id, delivery.delivery_count, exchange, routing_key,
                        header, body, remaining]
                + ([True] if delivery.returned else [])}  # returned uncounted: redelivered
    if reply is None or isinstance(reply, (bool, int, str)):
        return reply
    return None


def on_reply(cluster: "Cluster", sender: str, body: dict) -> None:
    pending = cluster.pending.pop(body["r"], None)
    if pending is None or pending.waiter is None:
        return
    value = body.get("v")
    if isinstance(value, dict) and "get" in value:
        msg_id, count, exchange, routing_key, header, message, remaining, *returned = \
            value["get"]
        value = (Delivery(msg_id, 0, count, bool(returned)), remaining,
                 (exchange, routing_key, header, message))
    pending.waiter(value)


def deliver_remote(cluster: "Cluster", queue, owner: str, key: str, deliveries) -> None:
    """The leader hands the deliveries of a consumer on a node with no replica to
    that node, with the messages read from this log."""
    items = []
    for delivery in deliveries:
        exchange, routing_key, header, body = cluster.groups.read_message(
            queue, delivery.raft_index)
        items.append([delivery.msg_id, delivery.delivery_count, exchange, routing_key,
                      header, body] + ([True] if delivery.returned else []))
    cluster._post(owner, Rpc("deliver", {"g": queue.group, "k": key, "m": items}))


def _record(cluster: "Cluster", group: str):
    for queue in cluster.node.all_queues():
        if getattr(queue, "group", None) == group:
            return queue
    return None


def on_deliver(cluster: "Cluster", sender: str, body: dict) -> None:
    record = _record(cluster, body["g"])
    if record is None or record.deleted:
        return
    record.leader_hint = sender
    key = body["k"]
    consumer = record.by_key.get(key)
    if consumer is None and cluster.is_stale_identity(key):
        return  # an earlier run's consumer: removed with what it holds (stale_downs)
    if consumer is None:  # its Cancel or Down lost, or on its way
        record.remove_unknown_consumer(key, tuple(item[0] for item in body["m"]),
                                       cluster.node.has_open_channel(key.partition("/")[0]))
        return
    if consumer.channel.state != ChannelState.OPEN:
        record.propose(Return(key, tuple(item[0] for item in body["m"])), 0)  # node clock
        return
    settled = []
    for msg_id, count, exchange, routing_key, header, message, *returned in body["m"]:
        carry_out(record.deliver(consumer, key, Delivery(msg_id, 0, count, bool(returned)),
                                 exchange, routing_key, header, message))
        if consumer.no_ack:
            settled.append(msg_id)
    if settled:
        record.propose(Settle(key, tuple(settled)), 0)  # at the node clock


def tell_downed(cluster: "Cluster", queue, connection: str) -> None:
    """The leader applied a Down for `connection`: its consumers' messages went back
    to the queue. A node with a replica sees the Down in its own log; a node with none
    hears it from the leader and, if the connection's channels are alive (the node was
    only cut off), checks its consumers out again."""
    owner = connection.partition(":")[0]
    if owner != cluster.name and owner in cluster.addresses and owner not in queue.members:
        cluster._post(owner, Rpc("downed", {"g": queue.group, "c": connection}))


def on_downed(cluster: "Cluster", sender: str, body: dict) -> None:
    record = _record(cluster, body["g"])
    if record is not None and not record.deleted and record.raft is None:
        record.leader_hint = sender
        record.check_out_again(body["c"])


# sac: the single active consumer's tag (None: none); declared: declare-ok's consumer
# count (None from a node that does not send it: then "consumers"); messages_dlx,
# message_bytes_dlx: the dead letters held by at-least-once dead lettering
NO_COUNTS = {"ready": 0, "unacked": 0, "consumers": 0, "bytes": 0, "sac": None,
             "declared": None, "messages_dlx": 0, "message_bytes_dlx": 0}


def counts(cluster: "Cluster", record, callback: Callable[[dict], None]) -> None:
    """The counts of a quorum queue with no replica here (a dict: ready, unacked,
    consumers, bytes, and the dead letters held by at-least-once dead lettering:
    messages_dlx, message_bytes_dlx; 0 from a node that does not send them), from a member (its leader if known), passed to `callback`."""
    cluster._next_request += 1
    request = cluster._next_request
    target = _live_member(cluster, record)
    if target is None:
        callback(dict(NO_COUNTS))
        return
    cluster.stats[request] = (callback, cluster.now + STAT_TIMEOUT, target, record)
    cluster._post(target, Rpc("stat", {"g": record.group, "r": request}))


def _live_member(cluster: "Cluster", record) -> str | None:
    """Whom to ask: the leader if known and its link is up, else a member whose link
    is (Cluster.seen_up: a killed node's link is lost at once, while `reachable`
    holds it up for REACHABLE_WITHIN); None when no member is."""
    hint = record.leader_hint
    if hint in cluster.addresses and hint != cluster.name and cluster.seen_up(hint):
        return hint
    members = [m for m in record.members if m != cluster.name and cluster.seen_up(m)]
    return cluster._random.choice(members) if members else None


def link_lost(cluster: "Cluster", node: str) -> None:
    """The link to `node` closed: the counts asked of it are asked of another live
    member now (or are all zeros at once when none is), not after STAT_TIMEOUT."""
    for request, (callback, _deadline, asked, record) in list(cluster.stats.items()):
        if asked == node:
            del cluster.stats[request]
            counts(cluster, record, callback)


def on_stat(cluster: "Cluster", sender: str, body: dict) -> None:
    member = cluster.groups.queues.get(body["g"])
    request = body["r"]
    if member is None or member.raft is None or member.deleted:
        cluster._post(sender, Rpc("stat_reply", {"r": request}))
        return

    def answer(_reply=None) -> None:
        cluster._post(sender, Rpc("stat_reply", {
            "r": request, "ready": member.ready_count, "unacked": member.unacked_count,
            "consumers": member.consumer_count, "bytes": member.message_bytes,
            "sac": member.single_active_consumer_tag,
            "declared": member.declare_ok_consumer_count,
            "messages_dlx": member.state.dlx.count,
            "message_bytes_dlx": member.state.dlx.bytes}))

    if member.has_unapplied():
        member.after_applied(answer)
    else:
        answer()


def on_stat_reply(cluster: "Cluster", sender: str, body: dict) -> None:
    waiting = cluster.stats.pop(body["r"], None)
    if waiting is not None:
        waiting[0]({key: body.get(key, default) for key, default in NO_COUNTS.items()})


def expire_stats(cluster: "Cluster") -> None:
    now = cluster.now
    for request, (callback, deadline, _asked, _record) in list(cluster.stats.items()):
        if now >= deadline:
            del cluster.stats[request]
            callback(dict(NO_COUNTS))

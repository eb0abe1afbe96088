"""Classic queues across the cluster: both sides of queues/remote.py's ClassicLink.

Responsibilities: a classic queue lives on its host node (its record, with the host,
is in the metadata on every node); a client on any other node uses it through a
RemoteClassicQueue whose operations this module carries to the host as Rpc messages
over the inter-node transport, and answers there, as RabbitMQ's channels talk to a
classic queue's process on its home node. Nothing here runs for a queue this node
holds: a local classic queue pays no RPC cost.

How it works (kinds, body fields: q = the queue's uid, v/n = vhost and name):
- publish "cq.pub" {r (0: no confirm), e, k, h (content header), b, and bcc (the
  message's BCC keys) when it has some}: the host
  enqueues it; with r, it answers "cq.pub_ok" {r, ok} once it holds the message:
  after its message store's fsync for a persistent message in a durable queue
  (a pseudo channel in `Node.awaiting_sync`), ok false if it refused it
  (reject-publish, no such queue). The forwarding node acks the publisher only
  on ok, and nacks every publish whose host is unreachable or restarted before it
  answered: never an ack for what the host does not hold. The transport per peer
  is ordered, so a channel's publishes reach the queue in order.
- consume "cq.consume" {c (consumer key: channel identity/tag), ch, p, pr, x, na, w}:
  the host keeps a proxy consumer, served by the queue like a local one; its
  deliveries "cq.deliver" {c, m: [[seq, redelivered, exchange, key, header, body]]}
  carry the bodies. Manual acks with a prefetch: the proxy holds up to the prefetch
  unacked; no-ack or prefetch 0: a credit window (quorum.NO_ACK_CREDIT) that the
  consuming node replenishes as it writes ("cq.credit" {c, n}). "cq.cancel" {c}.
- settle "cq.settle" {ch, s: [seq...], rq: None|True|False} (ack, requeue, drop);
  "cq.closed" {ch}: the channel is gone, the host requeues what it held.
- "cq.get" {r, ch, na} -> "cq.got" {r, m: [seq, redelivered, e, k, h, b, remaining]
  or None}; "cq.purge" {r} -> "cq.purged" {r, count}; "cq.stat" {r, u} -> "cq.counts"
  {r, ready, unacked, consumers, bytes, sac, syncing: a mirrored queue's sync
  progress or None} (u: for a queue.declare, which renews the
  queue's x-expires as a local declare does).
- A request the host cannot place yet (its queue.declare not applied there) waits up
  to EARLY_FOR seconds, in order, before it is answered as for a queue that is gone.
- Failures: the host returns the unacked messages of a node that went silent
  (cluster.NODE_DOWN_AFTER) or restarted (boot id in its pings), as a quorum
  queue's leader does for its consumers (consumer_nodes.py); a node whose host went
  silent or restarted fails what it waits for (nacks, 404 for get and purge, counts of zero
  after STAT_TIMEOUT) and cancels its consumers of that host's queues (basic.cancel,
  as RabbitMQ cancels consumers of a queue whose node is down).

Invariants: a confirm is an ack only when the host answered ok; every request is
answered or failed exactly once; the host's held entries of a channel identity are
exactly its unacked deliveries and gets from a remote channel.

Not here: the queue itself (queues/classic.py), the remote queue type
(queues/remote.py), the transport (server/cluster_transport.py).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from ..amqp.channel import ChannelState
from ..amqp.codec import decode_properties
from ..groups.metadata import encode as encode_meta
from ..queues.actions import Deliver, GetEmpty, GetOk, PurgeOk, Refused, carry_out
from ..queues.base import Confirm
from ..queues.classic import ClassicQueue
from ..queues.message import Message
from ..queues.quorum.queue import NO_ACK_CREDIT
from ..queues.remote import NO_COUNTS
from .proxy import STAT_TIMEOUT
from .wire import Rpc

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Cluster

log = logging.getLogger("quorumqueue.cluster")

EARLY_FOR = 5.0  # seconds a request waits for its queue's declaration to reach the host


class _Request:
    __slots__ = ("host", "boot", "deadline", "answer", "fail")

    def __init__(self, host: str, boot: str | None, deadline: float | None,
                 answer: Callable[[Any], None], fail: Callable[[], None]) -> None:
        self.host, self.boot, self.deadline = host, boot, deadline
        self.answer, self.fail = answer, fail


class _Proxy:
    """Host side: a consumer on another node, served by the queue like a local one
    (it is its own `channel` for the queue's Deliver actions)."""

    __slots__ = ("link", "key", "identity", "owner", "no_ack", "exclusive", "priority",
                 "prefetch", "window", "credit", "unacked", "channel")

    def __init__(self, link: "ClassicLink", owner: str, body: dict) -> None:
        self.link, self.owner = link, owner
        self.key, self.identity = body["c"], body["ch"]
        self.no_ack, self.exclusive = bool(body["na"]), bool(body["x"])
        self.priority, self.prefetch = body["pr"], body["p"]
        self.window = bool(body["w"])
        self.credit = NO_ACK_CREDIT
        self.unacked = 0
        self.channel = self

    def has_capacity(self) -> bool:
        return self.credit > 0 if self.window else self.unacked < self.prefetch

    def charge(self) -> None:
        """The queue decided a delivery to it: counted now (its Deliver follows)."""
        if self.window:
            self.credit -= 1
        if not self.no_ack:
            self.unacked += 1

    def deliver(self, consumer, queue: ClassicQueue, entry, redelivered: bool, exchange: str,
                routing_key: str, header: bytes, body: bytes, charged: bool = True) -> None:
        """A classic queue's Deliver action (always charged: only they come here)."""
        if not self.no_ack:
            self.link.held.setdefault((queue.group, self.identity), {})[entry.seq] = (entry, self)
        self.link.post(self.owner, Rpc("cq.deliver", {
            "q": queue.group, "c": self.key,
            "m": [[entry.seq, redelivered, exchange, routing_key, header, body]]}))


class _GetReply:
    """Host side: the channel a remote basic.get is answered through."""

    def __init__(self, link: "ClassicLink", sender: str, request: int, identity: str) -> None:
        self.link, self.sender, self.request, self.identity = link, sender, request, identity

    def get_ok(self, queue, entry, no_ack, redelivered, exchange, routing_key, remaining,
               header, body) -> None:
        if not no_ack:
            self.link.held.setdefault((queue.group, self.identity), {})[entry.seq] = (entry, None)
        self.link.post(self.sender, Rpc("cq.got", {"r": self.request, "m": [
            entry.seq, redelivered, exchange, routing_key, header, body, remaining]}))

    def get_empty(self) -> None:
        self.link.post(self.sender, Rpc("cq.got", {"r": self.request, "m": None}))


class _PurgeReply:
    """Host side: who asked a purge of another node (queues/base.py Asker): the
    count goes back as "cq.purged"."""

    def __init__(self, link: "ClassicLink", sender: str, request: int) -> None:
        self.link, self.sender, self.request = link, sender, request

    def purge_ok(self, count: int) -> None:
        self.link.post(self.sender, Rpc("cq.purged", {"r": self.request, "count": count}))


class _SyncedReplies:
    """Host side: publish answers that wait for the message store's fsync
    (Node.synced calls `release_confirms`, as for a channel)."""

    def __init__(self) -> None:
        # (answer, batch id), in batch order
        self.waiting: deque[tuple[Callable[[bool], None], int]] = deque()

    def release_confirms(self, synced_batch_id: int) -> bool:
        while self.waiting and self.waiting[0][1] <= synced_batch_id:
            answer, _batch = self.waiting.popleft()
            answer(True)
        return not self.waiting


class _ForwardedConfirm(Confirm):
    """Host side: a forwarded publish's confirm, no channel's. Its holds (a mirrored
    queue's mirrors) answer later: the link answers the publisher once the last one
    did (`ClassicLink._answer_publish`)."""

    __slots__ = ("link", "answer")

    def __init__(self, link: "ClassicLink", answer: Callable[[bool], None]) -> None:
        super().__init__(None, 0, None)
        self.link, self.answer = link, answer

    def _answer(self, accepted: bool) -> None:
        self.outstanding -= 1
        if not accepted:
            self.ok = False
        if not self.outstanding:
            self.link._answer_publish(self.answer, self)


class ClassicLink:
    def __init__(self, cluster: "Cluster") -> None:
        self.cluster = cluster
        # forwarding side
        self.pending: dict[int, _Request] = {}
        # (queue uid, consumer key) -> (queue, consumer, the host's boot when it began)
        self.consumers: dict[tuple[str, str], tuple[Any, Any, str | None]] = {}
        # host side
        self.proxies: dict[tuple[str, str], _Proxy] = {}   # (uid, consumer key)
        self.held: dict[tuple[str, str], dict[int, tuple[Any, _Proxy | None]]] = {}
        self.synced = _SyncedReplies()
        # requests for queues whose declaration this host has not applied yet, per uid
        self.early: dict[str, deque[tuple[float, str, str, dict]]] = {}
        # non-durable queues of a node gone silent whose deletion this node proposed
        self.deleting: set[str] = set()

    @property
    def node(self):
        return self.cluster.node

    def post(self, peer: str, rpc: Rpc) -> None:
        self.cluster._post(peer, rpc)

    def _to_host(self, queue, kind: str, body: dict) -> None:
        """A request to the queue's host, stamped with the host's boot id as last
        heard: a frame still queued for a host that restarted meanwhile is refused
        there (what it was for is gone, and its sender has failed it)."""
        self.post(queue.host, Rpc(kind, {"q": queue.group, "v": queue.vhost, "n": queue.name,
                                         "hb": self.cluster.boots.get(queue.host), **body}))

    # ================================================= the forwarding node's side

    def reachable(self, host: str) -> bool:
        return self.cluster.reachable(host)

    def _request(self, queue, kind: str, body: dict, answer, fail,
                 deadline: float | None = None) -> None:
        cluster = self.cluster
        cluster._next_request += 1
        request = cluster._next_request
        self.pending[request] = _Request(queue.host, cluster.boots.get(queue.host),
                                         deadline, answer, fail)
        self._to_host(queue, kind, {"r": request, **body})

    def _answered(self, body: dict) -> _Request | None:
        return self.pending.pop(body["r"], None)

    def publish(self, queue, message, answer, publish_id: str | None = None) -> None:
        """Forward a publish to the queue's host. A mirrored queue's publish with a
        confirm carries an id, and when its leader cannot answer it waits for the
        promoted mirror and goes there (mirror_link.py `park`), as the mirroring
        guide's "Mirrored Queue Implementation and Semantics", 6, promises."""
        mirrored = answer is not None and bool(getattr(queue, "mirrors", None))
        if mirrored and publish_id is None:
            self.cluster._next_request += 1
            publish_id = f"{self.cluster.name}:{self.cluster._next_request}"

        def fail() -> None:
            if mirrored:
                self.cluster.mirrors.park(queue, message, answer, publish_id)
            elif answer is not None:
                answer(False)

        if not self.reachable(queue.host):
            fail()
            return
        fields = {"e": message.exchange, "k": message.routing_key,
                  "h": message.properties.raw, "b": message.body}
        if message.properties.blind_keys:  # its BCC keys, for a dead-lettered copy
            fields["bcc"] = list(message.properties.blind_keys)
        if publish_id is not None:
            fields["pid"] = publish_id
        if answer is None:
            self._to_host(queue, "cq.pub", {"r": 0, **fields})
        else:
            self._request(queue, "cq.pub", fields, answer, fail)

    def consume(self, queue, channel, consumer) -> None:
        key = f"{channel.quorum_identity}/{consumer.tag}"
        self.consumers[(queue.group, key)] = (queue, consumer,
                                              self.cluster.boots.get(queue.host))
        self._to_host(queue, "cq.consume", {
            "c": key, "ch": channel.quorum_identity, "p": consumer.prefetch, "pr": consumer.priority,
            "x": consumer.exclusive, "na": consumer.no_ack,
            "w": consumer.no_ack or not consumer.prefetch})

    def cancel(self, queue, channel, consumer) -> None:
        key = f"{channel.quorum_identity}/{consumer.tag}"
        if self.consumers.pop((queue.group, key), None) is not None:
            self._to_host(queue, "cq.cancel", {"c": key})

    def get(self, queue, channel, no_ack: bool) -> None:
        def answer(item) -> None:
            if item is None:
                carry_out([GetEmpty(channel)] if channel.is_open else None)
                return
            seq, redelivered, exchange, routing_key, header, body, remaining = item
            if not channel.is_open:
                if not no_ack:  # the channel is gone: the host takes it back
                    self._settle(queue, channel.quorum_identity, [seq], True)
                return
            carry_out([GetOk(channel, queue, seq, no_ack, redelivered, exchange,
                             routing_key, remaining, header, body)])

        def fail() -> None:
            if channel.is_open:
                carry_out([Refused(channel, queue._host_down().at(60, 70))])

        self._request(queue, "cq.get", {"ch": channel.quorum_identity, "na": no_ack},
                      answer, fail)

    def settle(self, queue, channel, seqs: list[int], requeue) -> None:
        self._settle(queue, channel.quorum_identity, seqs, requeue)

    def _settle(self, queue, identity: str, seqs: list[int], requeue) -> None:
        self._to_host(queue, "cq.settle", {"ch": identity, "s": seqs, "rq": requeue})

    def channel_closed(self, queue, channel) -> None:
        self._to_host(queue, "cq.closed", {"ch": channel.quorum_identity})

    def purge(self, queue, to) -> None:
        self._request(queue, "cq.purge", {}, lambda count: carry_out([PurgeOk(to, count)]),
                      lambda: carry_out([Refused(to, queue._host_down())]))

    def counts(self, queue, done: Callable[[dict], None], use: bool = False) -> None:
        def answer(counts: dict) -> None:
            queue.counts = counts
            done(counts)

        if not self.reachable(queue.host):
            answer(dict(NO_COUNTS))
            return
        self._request(queue, "cq.stat", {"u": use}, answer,
                      lambda: answer(dict(NO_COUNTS)), self.cluster.now + STAT_TIMEOUT)

    @property
    def node_name(self) -> str:
        return self.cluster.name

    def forget(self, queue) -> None:
        for key in [k for k in self.consumers if k[0] == queue.group]:
            del self.consumers[key]

    def _on_deliver(self, sender: str, body: dict) -> None:
        uid, key = body["q"], body["c"]
        known = self.consumers.get((uid, key))
        consumer = None if known is None else known[1]
        if consumer is None or consumer.channel.state != ChannelState.OPEN:
            identity = key.rpartition("/")[0]
            self.post(sender, Rpc("cq.settle", {"q": uid, "ch": identity, "rq": True,
                                                "s": [item[0] for item in body["m"]]}))
            return
        queue = known[0]
        delivered = []
        for seq, redelivered, exchange, routing_key, header, message in body["m"]:
            consumer.charge()  # (as a local queue counts what it decides)
            delivered.append(Deliver(consumer, queue, seq, redelivered, exchange,
                                     routing_key, header, message))
        carry_out(delivered)
        if consumer.no_ack or not consumer.prefetch:  # written: more credit
            self.post(sender, Rpc("cq.credit", {"q": uid, "c": key, "n": len(body["m"])}))

    def _on_pub_ok(self, sender: str, body: dict) -> None:
        request = self._answered(body)
        if request is not None:
            request.answer(bool(body["ok"]))

    def _on_got(self, sender: str, body: dict) -> None:
        request = self._answered(body)
        if request is not None:
            request.answer(body["m"])

    def _on_purged(self, sender: str, body: dict) -> None:
        request = self._answered(body)
        if request is not None:
            request.answer(body["count"])

    def _on_counts(self, sender: str, body: dict) -> None:
        request = self._answered(body)
        if request is not None:
            request.answer({key: body.get(key, default) for key, default in NO_COUNTS.items()})

    def tick(self, silent: set[str] | None) -> None:
        """Fail what waits for a host that is unreachable or restarted (and counts
        past STAT_TIMEOUT); with `silent` (nodes not heard from for NODE_DOWN_AFTER):
        cancel the consumers of their queues here, and as a host return the
        unacked messages of their consumers."""
        cluster = self.cluster
        now = self.cluster.now
        for number, request in list(self.pending.items()):
            boot = cluster.boots.get(request.host)
            if (not cluster.reachable(request.host)
                    or (request.boot is not None and boot != request.boot)
                    or (request.deadline is not None and now >= request.deadline)):
                del self.pending[number]
                request.fail()
        self._serve_early(now)
        if silent is None:
            return
        if silent:
            self._delete_transient(silent)
        for (uid, key), (queue, consumer, boot) in list(self.consumers.items()):
            current = cluster.boots.get(queue.host)
            if queue.host in silent and queue.mirrors:
                continue  # a mirror takes over: node/metadata.py record_changed moves it
            if queue.host in silent or (boot is not None and current != boot):
                log.warning("classic queue '%s': its host %s is down or restarted: "
                            "cancelling consumer %s", queue.name, queue.host, consumer.tag)
                del self.consumers[(uid, key)]
                self.node.cancel_consumer(queue, consumer)
        for uid, identity in {k for k in self.held} | {(u, p.identity) for (u, _k), p
                                                        in self.proxies.items()}:
            owner = identity.partition(":")[0]
            boot = cluster.boots.get(owner)
            if owner == cluster.name:
                continue
            if owner in silent or owner in cluster.forgotten or (
                    boot is not None and not identity.startswith(boot + ".")):
                queue = self._queue_by_uid(uid)
                log.warning("classic queue '%s': node %s is down or restarted: returning "
                            "the messages of %s", getattr(queue, "name", uid), owner,
                            identity)
                self._close(uid, identity, queue)

    def _delete_transient(self, silent: set[str]) -> None:
        """A non-durable classic queue whose home node went down is deleted (the
        mirroring guide, "Non-mirrored Queue Behavior in a Cluster": "A non-durable
        one will be deleted"), as RabbitMQ deletes it on nodedown: the metadata
        group's leader asks, once for each; its node drops it too when it comes back
        and applies the deletion. A mirrored one has a mirror to take over."""
        if not self.cluster.meta.is_leader:
            return
        for queue in list(self.node.all_queues()):
            host = getattr(queue, "host", None)
            if (host not in silent or queue.durable or queue.mirrors
                    or queue.group in self.deleting):
                continue
            self.deleting.add(queue.group)
            log.info("classic queue '%s' in vhost '%s': its home node %s is down and "
                     "it is not durable: deleting it", queue.name, queue.vhost, host)
            meta.propose_data(
                encode_meta("queue.delete", vhost=queue.vhost, name=queue.name,
                            group=queue.group),
                lambda _reply, group=queue.group: self.deleting.discard(group))

    # ================================================= the host's side

    def _queue_by_uid(self, uid: str, body: dict | None = None):
        if body is not None and "v" in body:
            queue = self.node.queue(body["v"], body["n"])
            return queue if isinstance(queue, ClassicQueue) and queue.group == uid else None
        for queue in self.node.all_queues():
            if isinstance(queue, ClassicQueue) and queue.group == uid:
                return queue
        return None

    def on_request(self, sender: str, kind: str, body: dict) -> None:
        """A request for a queue this node holds; one whose queue is not (yet) known
        here waits, behind the earlier ones for that queue, for its declaration to be
        applied (up to EARLY_FOR)."""
        boot = body.get("hb")
        if boot is not None and boot != self.node.boot_id:  # meant for an earlier run
            if kind == "cq.pub" and body["r"]:
                self.post(sender, Rpc("cq.pub_ok", {"r": body["r"], "ok": False}))
            return
        uid = body["q"]
        queue = None if uid in self.early else self._queue_by_uid(uid, body)
        if queue is None:
            self.early.setdefault(uid, deque()).append(
                (self.cluster.now + EARLY_FOR, sender, kind, body))
            self._serve_early(self.cluster.now)
            return
        _HOST_RPCS[kind](self, sender, queue, body)

    def _serve_early(self, now: float) -> None:
        for uid, waiting in list(self.early.items()):
            while waiting:
                deadline, sender, kind, body = waiting[0]
                queue = self._queue_by_uid(uid, body)
                if queue is None and now < deadline:
                    break
                waiting.popleft()
                _HOST_RPCS[kind](self, sender, queue, body)
            if not waiting:
                del self.early[uid]

    def _host_publish(self, sender: str, queue, body: dict) -> None:
        request = body["r"]
        if queue is None or queue.deleted:
            if request:
                self.post(sender, Rpc("cq.pub_ok", {"r": request, "ok": False}))
            return
        _class_id, properties = decode_properties(body["h"])
        properties.blind_keys = tuple(body.get("bcc", ()))
        message = Message(body["e"], body["k"], properties, body["b"])
        self.publish_here(queue, message, body.get("pid"), lambda ok: self.post(
            sender, Rpc("cq.pub_ok", {"r": request, "ok": ok})) if request else None)

    def publish_here(self, queue, message, publish_id: str | None,
                     answer: Callable[[bool], None]) -> None:
        """Enqueue a forwarded publish on the queue this node holds; `answer(ok)` once
        it holds it (after its store's fsync; a mirrored queue's mirrors all have it).
        A publish id the (mirrored) queue took already is answered, not enqueued again."""
        mirroring = getattr(queue, "mirroring", None)
        if publish_id is not None and mirroring is not None and publish_id in mirroring.seen:
            answer(True)
            return
        # a mirrored queue's confirm waits for every mirror (Confirm.hold): answered then
        confirm = _ForwardedConfirm(self, answer)
        if mirroring is not None:
            mirroring.publish_id = publish_id
        try:
            carry_out(queue.publish(message, None, confirm))
        finally:
            if mirroring is not None:
                mirroring.publish_id = None
        if not confirm.outstanding:
            self._answer_publish(answer, confirm)

    def _answer_publish(self, answer: Callable[[bool], None], confirm: Confirm) -> None:
        if not confirm.ok or not self.node.after_sync(confirm.batch_id, self.synced):
            answer(confirm.ok)
            return
        self.synced.waiting.append((answer, confirm.batch_id))

    def _host_consume(self, sender: str, queue, body: dict) -> None:
        if queue is None or queue.deleted:
            return
        proxy = self.proxies[(queue.group, body["c"])] = _Proxy(self, sender, body)
        carry_out(queue.consume(proxy, proxy))

    def _host_cancel(self, sender: str, queue, body: dict) -> None:
        proxy = self.proxies.pop((body["q"], body["c"]), None)
        if proxy is not None and queue is not None:
            carry_out(queue.cancel(None, proxy))
            self.node.consumer_removed(queue)

    def _host_credit(self, sender: str, queue, body: dict) -> None:
        proxy = self.proxies.get((body["q"], body["c"]))
        if proxy is not None and queue is not None and not queue.deleted:
            proxy.credit += body["n"]
            carry_out(queue.deliver())

    def _host_settle(self, sender: str, queue, body: dict) -> None:
        held = self.held.get((body["q"], body["ch"]), {})
        entries = []
        for seq in body["s"]:
            item = held.pop(seq, None)
            if item is not None:
                entries.append(item[0])
                if item[1] is not None:
                    item[1].unacked -= 1
        if queue is None or not entries:
            return
        carry_out(queue.settle(None, entries, body["rq"]))
        carry_out(queue.capacity_freed())

    def _host_closed(self, sender: str, queue, body: dict) -> None:
        self._close(body["q"], body["ch"], queue)

    def _close(self, uid: str, identity: str, queue) -> None:
        """A remote channel is gone: its proxies go, what it held is requeued."""
        removed = False
        for key in [k for k, p in self.proxies.items() if k[0] == uid and p.identity == identity]:
            proxy = self.proxies.pop(key)
            if queue is not None:
                queue.remove_consumer(proxy)  # a closing channel's: delivers nothing
                removed = True
        held = self.held.pop((uid, identity), {})
        if queue is None:
            return
        if held or removed:  # what it held comes back, the others take what is ready
            carry_out(queue.channel_closed(None, [entry for entry, _proxy in held.values()]))
        if removed:
            self.node.consumer_removed(queue)

    def _host_get(self, sender: str, queue, body: dict) -> None:
        reply = _GetReply(self, sender, body["r"], body["ch"])
        if queue is None or queue.deleted:
            reply.get_empty()
            return
        carry_out(queue.basic_get(reply, bool(body["na"])))

    def _host_purge(self, sender: str, queue, body: dict) -> None:
        asker = _PurgeReply(self, sender, body["r"])
        if queue is None or queue.deleted:
            asker.purge_ok(0)
        else:
            carry_out(queue.purge(asker))

    def _host_stat(self, sender: str, queue, body: dict) -> None:
        if queue is not None and body.get("u"):  # a declare on another node
            queue.touch()
            queue.expire_heads(queue.now_ms)
        counts = dict(NO_COUNTS) if queue is None else {
            "ready": queue.ready_count, "unacked": queue.unacked_count,
            "consumers": queue.consumer_count, "bytes": queue.message_bytes,
            "sac": queue.single_active_consumer_tag, "syncing": queue.sync_progress}
        self.post(sender, Rpc("cq.counts", {"r": body["r"], **counts}))

    def hosted_deleted(self, queue) -> None:
        """A queue this node held was deleted: forget its remote consumers and gets."""
        for key in [k for k in self.proxies if k[0] == queue.group]:
            del self.proxies[key]
        for key in [k for k in self.held if k[0] == queue.group]:
            del self.held[key]


_HOST_RPCS = {
    "cq.pub": ClassicLink._host_publish,
    "cq.consume": ClassicLink._host_consume,
    "cq.cancel": ClassicLink._host_cancel,
    "cq.credit": ClassicLink._host_credit,
    "cq.settle": ClassicLink._host_settle,
    "cq.closed": ClassicLink._host_closed,
    "cq.get": ClassicLink._host_get,
    "cq.purge": ClassicLink._host_purge,
    "cq.stat": ClassicLink._host_stat,
}

_REPLIES = {
    "cq.deliver": ClassicLink._on_deliver,
    "cq.pub_ok": ClassicLink._on_pub_ok,
    "cq.got": ClassicLink._on_got,
    "cq.purged": ClassicLink._on_purged,
    "cq.counts": ClassicLink._on_counts,
}


def handlers() -> dict[str, Callable[["Cluster", str, dict], None]]:
    """The Rpc kinds of this module, for the cluster's dispatch table."""
    table: dict[str, Callable] = {}
    for kind in _HOST_RPCS:
        table[kind] = lambda cluster, sender, body, kind=kind: cluster.classic.on_request(
            sender, kind, body)
    for kind, method in _REPLIES.items():
        table[kind] = lambda cluster, sender, body, method=method: method(
            cluster.classic, sender, body)
    return table

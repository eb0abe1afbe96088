"""The broker node: vhosts, users, sessions, the publish and delivery pipeline.

Responsibilities: what crosses channels and connections — routing a published
message into queues, handing ready messages to consumers, settling and requeueing,
deleting queues (with consumer-cancel notifications), exclusive and auto-delete
lifecycles, direct reply-to, resource alarms (connection.blocked), and what must be
made durable (metadata, persistent messages).

How it works: the node is synchronous and does no I/O itself. Sessions call into it;
it writes frames into sessions' buffers and records in the stores' pending batches.
The server shell then calls `flush()` (one write + fsync for everything pending:
group commit) and afterwards sends every session's buffered bytes. Confirms that
wait on a store batch are released by `synced()`.

Invariants: a publisher confirm for a persistent message in a durable queue is sent
only after the store batch holding it is fsynced; metadata is saved before the
declare-ok of a durable entity is sent (both happen in the same flush, metadata
first).
"""

from __future__ import annotations

import base64
import json
import os
import struct
from typing import TYPE_CHECKING, Iterable

from pamqp import decode as pamqp_decode

from ..amqp import codec, spec
from ..amqp.errors import AMQPError
from ..auth.users import FULL, Permissions, User, UserStore
from ..fifo import commands as fifo
from ..queues.classic import ClassicQueue, Entry, Message
from ..queues.quorum import NO_ACK_CREDIT, QuorumQueue, fifo_config
from ..queues.types import QueueSpec
from ..routing.exchanges import EXCHANGE, QUEUE, Destination
from ..storage.message_store import MessageStore, queue_key
from ..storage.metadata_store import MetadataStore, decode_arguments, encode_arguments
from . import management
from .policies import Policy, classic_limits, matching, parse_policy, quorum_config
from .quorum import QuorumGroups, now_ms
from .vhost import VHost

if TYPE_CHECKING:  # pragma: no cover
    from .channel import Channel
    from .session import Session

REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."
# Idempotent publishing into quorum queues (broker/README.md, "Idempotent publishing").
PUBLISHER_HEADER = "x-quorumqueue-publisher"
SEQ_HEADER = "x-quorumqueue-seq"
MAX_SEQ = (1 << 64) - 1  # the fifo Enqueue's u64


class Node:
    def __init__(self, settings, users: UserStore | None = None,
                 message_store: MessageStore | None = None,
                 metadata_store: MetadataStore | None = None,
                 quorum: QuorumGroups | None = None) -> None:
        self.settings = settings
        self.quorum = quorum  # None: quorum queues are refused (no log store)
        self.cluster = None   # broker/cluster/cluster.py Cluster, when clustered
        self.boot_id = base64.b32encode(os.urandom(5)).decode("ascii").lower()
        self.users = users or UserStore.with_default_user()
        self.store = message_store
        self.metadata = metadata_store
        self.vhosts: dict[str, VHost] = {"/": VHost("/")}
        self.sessions: set["Session"] = set()
        self.dirty: set["Session"] = set()
        self.awaiting_sync: set["Channel"] = set()
        self.synced_batch_id = 0
        self.metadata_dirty = False
        self.alarms: set[str] = set()
        self.policies: dict[str, dict[str, Policy]] = {}  # vhost -> name -> policy
        self._reply_to: dict[str, "Channel"] = {}
        self._connection_counter = 0

    # ------------------------------------------------------------ sessions

    def register(self, session: "Session") -> None:
        self.sessions.add(session)

    def unregister(self, session: "Session") -> None:
        self.sessions.discard(session)
        self.dirty.discard(session)
        for vhost in self.vhosts.values():
            for queue in [q for q in vhost.queues.values() if q.exclusive_owner is session]:
                self.delete_queue(vhost, queue)

    def next_connection_id(self) -> int:
        self._connection_counter += 1
        return self._connection_counter

    def vhost(self, name: str) -> VHost | None:
        return self.vhosts.get(name)

    def authenticate(self, username: str, password: str, peer_host: str) -> User | None:
        return self.users.authenticate(username, password, peer_host)

    # ------------------------------------------------------------ queues

    def create_queue(self, vhost: VHost, name: str, queue_spec: QueueSpec,
                     owner: "Session | None", group: str | None = None):
        if queue_spec.type == "quorum":
            if self.quorum is None:
                raise AMQPError(spec.NOT_IMPLEMENTED, "quorum queues need a log store; this "
                                "node runs without one", connection_level=False)
            arguments = dict(queue_spec.arguments)
            queue = (self.quorum.recover(vhost.name, name, arguments, group) if group
                     else self.quorum.create(vhost.name, name, arguments))
            vhost.queues[name] = queue
            self.metadata_dirty = True
            self.reconcile_quorum(queue)  # a policy's settings, as the log's first command
            return queue
        arguments = dict(queue_spec.arguments)
        max_length, max_bytes, overflow = classic_limits(
            arguments, self.policy_for(vhost.name, "classic", name))
        queue = ClassicQueue(vhost.name, name, queue_spec.durable, owner,
                             queue_spec.auto_delete, arguments,
                             max_priority=queue_spec.max_priority,
                             max_length=max_length, max_length_bytes=max_bytes,
                             overflow=overflow,
                             single_active_consumer=queue_spec.single_active_consumer)
        vhost.queues[name] = queue
        if queue.durable:
            self.metadata_dirty = True
        return queue

    def create_replicated_queue(self, vhost: VHost, name: str, queue_spec: QueueSpec,
                                group: str, members: tuple[str, ...], leader: str):
        """A quorum queue the metadata group declared (broker/cluster/meta.py): every
        node records it; its members start their replica of the group."""
        queue = self.quorum.create(vhost.name, name, dict(queue_spec.arguments), group,
                                   members, campaign=leader == self.quorum.member)
        vhost.queues[name] = queue
        self.metadata_dirty = True
        self.reconcile_quorum(queue)  # its leader, once elected, does it on a tick
        return queue

    # ------------------------------------------------------------ policies

    def policy_for(self, vhost: str, kind: str, name: str) -> Policy | None:
        """The policy that applies to a `kind` ("classic", "quorum", "exchange")
        named `name` in `vhost` (policies.py)."""
        return matching(self.policies.get(vhost, {}).values(), kind, name)

    def apply_policies(self, vhost_name: str) -> None:
        """After a policy change: classic queues take their limits at once (drop-head
        drops what is over), exchanges their alternate exchange; quorum queues this
        node leads get their new settings through their log (`reconcile_quorum`)."""
        vhost = self.vhosts.get(vhost_name)
        if vhost is None:
            return
        for exchange in vhost.exchanges.values():
            policy = self.policy_for(vhost_name, "exchange", exchange.name)
            exchange.policy_alternate = (policy.definition.get("alternate-exchange")
                                         if policy is not None else None)
        for queue in list(vhost.queues.values()):
            if isinstance(queue, QuorumQueue):
                self.reconcile_quorum(queue)
                continue
            queue.max_length, queue.max_length_bytes, queue.overflow = classic_limits(
                queue.arguments, self.policy_for(vhost_name, "classic", queue.name))
            for dropped in queue.enforce_limits():
                self._forget(queue, dropped)

    def reconcile_quorum(self, queue: QuorumQueue) -> None:
        """If this node leads `queue` and its machine's settings differ from what its
        arguments and policy give, propose the change (rabbit_fifo's update_config):
        every member applies it at the same log index. Called on policy changes and
        on every tick (a new leader, a restart)."""
        if queue.raft is None or not queue.is_leader or queue.deleted:
            return
        wanted = quorum_config(queue.arguments, self.policy_for(queue.vhost, "quorum",
                                                                queue.name),
                               fifo_config(queue.arguments))
        if wanted == queue.state.config or wanted == queue.config_proposed:
            return
        queue.config_proposed = wanted

        def applied(_reply, queue=queue) -> None:
            queue.config_proposed = None

        queue.propose(fifo.UpdateConfig(wanted.delivery_limit, wanted.max_length,
                                        wanted.max_bytes, wanted.overflow),
                      now_ms(), applied)

    def tick_policies(self) -> None:
        for vhost in self.vhosts.values():
            for queue in vhost.queues.values():
                if isinstance(queue, QuorumQueue):
                    self.reconcile_quorum(queue)

    def delete_queue(self, vhost: VHost, queue: ClassicQueue) -> int:
        """Delete a queue: cancel its consumers (notifying clients that asked),
        drop its messages. Returns the number of ready messages it held."""
        if vhost.queues.get(queue.name) is not queue:
            return 0
        count = queue.ready_count
        del vhost.queues[queue.name]
        queue.deleted = True
        self.cancel_consumers(queue)
        if isinstance(queue, QuorumQueue):
            self.quorum.delete(queue)
        else:
            queue.purge()
        if self.store is not None and queue.durable and not isinstance(queue, QuorumQueue):
            self.store.append_delete(queue_key(vhost.name, queue.name))
        removed = vhost.remove_bindings_to(Destination(QUEUE, queue.name))
        if queue.durable or any(e.durable for e in removed):
            self.metadata_dirty = True
        return count

    def cancel_consumers(self, queue) -> None:
        """Cancel the queue's consumers on this node (basic.cancel to clients that
        asked for consumer_cancel_notify)."""
        for consumer in list(queue.consumers):
            channel = consumer.channel
            channel.consumers.pop(consumer.tag, None)
            queue.remove_consumer(consumer)
            if channel.session.capabilities.get("consumer_cancel_notify"):
                channel.send(codec.basic_cancel(channel.number, consumer.tag))

    def drop_replica(self, queue: QuorumQueue) -> None:
        """This node is no longer one of the queue's members (cluster membership)."""
        self.cancel_consumers(queue)
        self.quorum.leave(queue)

    def purge_queue(self, queue, respond) -> None:
        """Drop the queue's ready messages; `respond(count)` is called once that is
        done (at once for classic queues, once the purge is applied for quorum ones)."""
        if isinstance(queue, QuorumQueue):
            queue.propose(fifo.Purge(), now_ms(), lambda count: respond(count or 0))
            return
        respond(self._purge_classic(queue))

    def _purge_classic(self, queue: ClassicQueue) -> int:
        purged = queue.purge()
        for entry in purged:  # unacked messages survive a purge, so settle one by one
            self._forget(queue, entry)
        return len(purged)

    def consumer_removed(self, queue: ClassicQueue) -> None:
        if queue.is_unused_for_auto_delete() and not queue.deleted:
            vhost = self.vhosts.get(queue.vhost)
            if vhost is not None:
                self.delete_queue(vhost, queue)

    # ------------------------------------------------------------ messages

    def publish(self, channel: "Channel", publish: codec.Publish, properties: codec.Properties,
                body: bytes, confirm_seq: int = 0) -> None:
        """Route and enqueue one complete message; handles mandatory returns and
        publisher confirms. Errors (unknown exchange...) raise AMQPError."""
        vhost = channel.session.vhost
        exchange = vhost.exchange(publish.exchange)
        if exchange.internal:
            raise AMQPError(spec.ACCESS_REFUSED, f"cannot publish to internal exchange "
                            f"'{exchange.name}' in vhost '{vhost.name}'", 60, 40)
        message = Message(publish.exchange, publish.routing_key, properties, body)
        if publish.exchange == "" and publish.routing_key == management.ROUTING_KEY:
            delivered = self._management_request(channel, properties, body)
            queues = []
        elif publish.exchange == "" and publish.routing_key.startswith(REPLY_TO_PREFIX):
            delivered = self._deliver_reply(publish.routing_key, message)
            queues = []
        else:
            delivered = False
            queues = vhost.route(exchange, publish.routing_key,
                                 lambda: properties.decoded().get("headers"))
        if not queues and not delivered and publish.mandatory:
            channel.send(codec.basic_return(channel.number, spec.NO_ROUTE, "NO_ROUTE",
                                            publish.exchange, publish.routing_key))
            channel.session.write_parts(codec.content(channel.number, properties.raw, body,
                                                      channel.session.frame_max))
        batch_id, ok = 0, True
        replicated = []
        for queue in queues:
            if isinstance(queue, QuorumQueue):
                replicated.append(queue)
                continue
            queue_batch, accepted = self.enqueue(queue, message)
            batch_id = max(batch_id, queue_batch)
            ok = ok and accepted
        if not replicated:
            if confirm_seq:
                channel.record_confirm(confirm_seq, batch_id, ok)
            return
        record = (channel.record_confirm(confirm_seq, batch_id, ok, len(replicated))
                  if confirm_seq else None)
        for queue in replicated:
            self.enqueue_quorum(queue, message, channel, record)

    def enqueue_quorum(self, queue: QuorumQueue, message: Message, channel: "Channel | None",
                       record: list | None) -> None:
        """Propose the message to the queue's log; the publisher's confirm (if any)
        waits for the entry to be fsynced and applied. A client's publish may carry
        an idempotency key (`publisher_sequence`); messages the broker moves itself
        (channel None: dead-lettering) never do, as their keys are out of order."""
        publisher, seq = (publisher_sequence(message.properties) if channel is not None
                          else ("", 0))
        data = fifo.encode_enqueue(publisher, seq, min(message.priority, 255), message.exchange,
                                   message.routing_key, message.properties.raw, message.body)
        waiter = None
        if record is not None:
            # "ok" and "duplicate" (stored by an earlier publish) are both confirmed
            waiter = lambda reply: channel.quorum_confirmed(record, reply != "rejected")
        queue.propose(data, 0, waiter)

    def enqueue(self, queue, message: Message) -> tuple[int, bool]:
        """(store batch id to wait for or 0, accepted)."""
        if isinstance(queue, QuorumQueue):
            self.enqueue_quorum(queue, message, None, None)
            return 0, True
        if queue.would_overflow(message):
            return 0, False
        stored = queue.durable and message.persistent and self.store is not None
        entry = queue.make_entry(message, stored)
        batch_id = 0
        if stored:
            batch_id = self.store.append_enqueue(
                queue_key(queue.vhost, queue.name), entry.seq, message.exchange,
                message.routing_key, message.properties.raw, message.body)
        for dropped in queue.push(entry):
            self._forget(queue, dropped)
        if queue.consumers:
            self.deliver(queue)
        return batch_id, True

    def deliver(self, queue: ClassicQueue) -> None:
        if isinstance(queue, QuorumQueue):
            return  # the fifo machine hands out messages (Deliver effects)
        while queue.ready_count:
            consumer = queue.next_consumer()
            if consumer is None:
                return
            entry = queue.pop()
            queue.unacked_count += 1
            consumer.channel.deliver(consumer, queue, entry)

    def settle(self, queue: ClassicQueue, entry: Entry) -> None:
        """An unacked delivery is done with (acked, or rejected without requeue)."""
        queue.unacked_count -= 1
        self._forget(queue, entry)

    def _forget(self, queue: ClassicQueue, entry: Entry) -> None:
        if entry.stored and not queue.deleted and self.store is not None:
            self.store.append_ack(queue_key(queue.vhost, queue.name), entry.seq)

    def requeue(self, queue: ClassicQueue, entry: Entry) -> None:
        queue.unacked_count -= 1
        if not queue.deleted:
            queue.requeue(entry)

    # ------------------------------------------------------------ quorum consumers

    def consume_quorum(self, queue: QuorumQueue, channel: "Channel", consumer) -> None:
        key = f"{channel.quorum_identity}/{consumer.tag}"
        queue.add_consumer(consumer, key)
        channel.quorum_queues[id(queue)] = queue
        prefetch = NO_ACK_CREDIT if consumer.no_ack else consumer.prefetch
        queue.propose(fifo.Checkout(key, prefetch, consumer.priority, channel.quorum_identity),
                      now_ms())

    def cancel_quorum_consumer(self, queue: QuorumQueue, channel: "Channel", consumer) -> None:
        if not queue.deleted:
            queue.propose(fifo.Cancel(f"{channel.quorum_identity}/{consumer.tag}"), now_ms())

    def get_quorum(self, queue: QuorumQueue, channel: "Channel", no_ack: bool) -> None:
        key = f"{channel.quorum_identity}/get"
        channel.quorum_queues[id(queue)] = queue
        queue.propose(fifo.Dequeue(key, no_ack, channel.quorum_identity), now_ms(),
                      lambda reply: channel.get_quorum_reply(queue, key, no_ack, reply))

    def settle_quorum(self, queue: QuorumQueue, key: str, msg_ids: list[int],
                      requeue: bool | None) -> None:
        """ack (requeue None) -> Settle, nack/reject requeue -> Return (delivery count
        + 1), without requeue -> Discard."""
        if queue.deleted:
            return
        kind = fifo.Settle if requeue is None else (fifo.Return if requeue else fifo.Discard)
        queue.propose(kind(key, tuple(msg_ids)), now_ms())

    def quorum_channel_down(self, queue: QuorumQueue, channel: "Channel") -> None:
        if not queue.deleted:
            queue.propose(fifo.Down(channel.quorum_identity), now_ms())

    def _management_request(self, channel: "Channel", properties: codec.Properties,
                            body: bytes) -> bool:
        """Answer a management RPC on its reply_to (node/management.py)."""
        request = properties.decoded()
        reply_to = request.get("reply_to")
        if not reply_to:
            return False
        vhost = channel.session.vhost

        def respond(document: dict) -> None:
            answer = json.dumps(document).encode()
            values = {"content_type": "application/json",
                      "correlation_id": request.get("correlation_id")}
            raw = codec.encode_properties(len(answer), {k: v for k, v in values.items() if v})
            reply = Message("", reply_to, codec.decode_properties(raw)[1], answer)
            if reply_to.startswith(REPLY_TO_PREFIX):
                self._deliver_reply(reply_to, reply)
            else:
                queue = vhost.queues.get(reply_to)
                if queue is not None:
                    self.enqueue(queue, reply)

        management.handle(self, channel.session, body, respond)
        return True

    # ------------------------------------------------------------ direct reply-to

    def register_reply_to(self, channel: "Channel") -> str:
        token = base64.urlsafe_b64encode(os.urandom(18)).decode("ascii").rstrip("=")
        name = REPLY_TO_PREFIX + token
        self._reply_to[name] = channel
        return name

    def unregister_reply_to(self, channel: "Channel") -> None:
        for name in [n for n, c in self._reply_to.items() if c is channel]:
            del self._reply_to[name]

    def has_reply_to(self, name: str) -> bool:
        return name in self._reply_to

    def reply_to_name(self, channel: "Channel") -> str | None:
        for name, owner in self._reply_to.items():
            if owner is channel:
                return name
        return None

    def _deliver_reply(self, routing_key: str, message: Message) -> bool:
        channel = self._reply_to.get(routing_key)
        if channel is None or channel.reply_to_consumer is None or channel.state != "open":
            return False
        consumer = channel.reply_to_consumer
        tag = channel.next_delivery_tag
        channel.next_delivery_tag += 1
        channel.send(codec.basic_deliver(channel.number, consumer.tag, tag, False,
                                         message.exchange, message.routing_key))
        channel.session.write_parts(codec.content(channel.number, message.properties.raw,
                                                  message.body, channel.session.frame_max))
        return True

    # ------------------------------------------------------------ alarms

    def set_alarm(self, resource: str, active: bool) -> None:
        """A memory or disk alarm started or cleared: block or unblock publishers."""
        if active == (resource in self.alarms):
            return
        if active:
            self.alarms.add(resource)
        else:
            self.alarms.discard(resource)
        for session in list(self.sessions):
            session.alarms_changed()

    @property
    def blocked_reason(self) -> str | None:
        if not self.alarms:
            return None
        return "low on " + " and ".join(sorted(
            "memory" if a == "memory" else "disk space" for a in self.alarms))

    # ------------------------------------------------------------ storage

    def synced(self, batch_id: int) -> None:
        self.synced_batch_id = batch_id
        for channel in list(self.awaiting_sync):
            if channel.release_confirms(batch_id):
                self.awaiting_sync.discard(channel)

    def flush(self) -> None:
        """Persist what is pending (metadata first, then messages with one fsync)
        and release the confirms that waited for it. Called by the server shell."""
        if self.metadata_dirty and self.metadata is not None:
            self.metadata.save(self.metadata_document())
        self.metadata_dirty = False
        if self.store is not None:
            if self.store.has_pending or self.awaiting_sync:
                self.synced(self.store.flush())
        elif self.awaiting_sync:
            self.synced(self.synced_batch_id + 1)
        if self.quorum is not None:
            self.quorum.flush()

    def metadata_document(self) -> dict:
        exchanges, queues, bindings = [], [], []
        for vhost in self.vhosts.values():
            for exchange in vhost.exchanges.values():
                if exchange.durable and exchange.name and not exchange.name.startswith("amq."):
                    exchanges.append({"vhost": vhost.name, "name": exchange.name,
                                      "type": exchange.type, "auto_delete": exchange.auto_delete,
                                      "internal": exchange.internal,
                                      "arguments": encode_arguments(exchange.arguments)})
            for queue in vhost.queues.values():
                if queue.durable:
                    item = {"vhost": vhost.name, "name": queue.name,
                            "type": queue.type_name, "auto_delete": queue.auto_delete,
                            "arguments": encode_arguments(queue.arguments)}
                    if isinstance(queue, QuorumQueue):
                        item["group"] = queue.group
                        if self.cluster is not None:
                            item["members"] = list(queue.members)
                    queues.append(item)
            for binding in vhost.bindings():
                if self._durable_binding(vhost, binding):
                    bindings.append({"vhost": vhost.name, "source": binding.source,
                                     "destination_kind": binding.destination.kind,
                                     "destination": binding.destination.name,
                                     "routing_key": binding.routing_key,
                                     "arguments": encode_arguments(binding.arguments_dict)})
        users = [{"name": u.name, "password_hash": u.password_hash, "tags": list(u.tags),
                  "vhosts": sorted(u.vhosts),
                  "permissions": {vhost: rights.as_list()
                                  for vhost, rights in sorted(u.permissions.items())}}
                 for u in self.users.users.values()]
        policies = [policy.as_dict() for vhost in sorted(self.policies)
                    for _name, policy in sorted(self.policies[vhost].items())]
        return {"vhosts": sorted(self.vhosts), "users": users, "policies": policies,
                "exchanges": exchanges,
                "queues": queues, "bindings": bindings}

    @staticmethod
    def _durable_binding(vhost: VHost, binding) -> bool:
        source = vhost.exchanges.get(binding.source)
        if source is None or not source.durable:
            return False
        if binding.destination.kind == QUEUE:
            queue = vhost.queues.get(binding.destination.name)
            return queue is not None and queue.durable
        target = vhost.exchanges.get(binding.destination.name)
        return target is not None and target.durable

    def recover(self) -> dict[str, int]:
        """Rebuild durable state from the stores at start. Returns counts."""
        from ..amqp.codec import decode_properties
        from ..queues.types import validate_declaration

        counts = {"queues": 0, "messages": 0}
        document = self.metadata.load() if self.metadata is not None else None
        if document is not None:
            self.users.users.clear()
            for user in document["users"]:
                # written before permissions had patterns: full rights in each vhost
                rights = user.get("permissions") or {vhost: FULL.as_list()
                                                     for vhost in user["vhosts"]}
                self.users.users[user["name"]] = User(
                    user["name"], user["password_hash"], tuple(user["tags"]),
                    {vhost: Permissions(*patterns) for vhost, patterns in rights.items()})
            for name in document["vhosts"]:
                self.vhosts.setdefault(name, VHost(name))
            for item in document.get("policies", ()):
                policy = parse_policy(item["vhost"], item["name"], item["pattern"],
                                      item["definition"], item["priority"], item["apply_to"])
                self.policies.setdefault(policy.vhost, {})[policy.name] = policy
            for item in document["exchanges"]:
                self.vhosts[item["vhost"]].declare_exchange(
                    item["name"], item["type"], False, True, item["auto_delete"],
                    item["internal"], decode_arguments(item["arguments"]))
            for item in document["queues"]:
                arguments = decode_arguments(item["arguments"])
                vhost = self.vhosts[item["vhost"]]
                queue_spec = validate_declaration(item["name"], vhost.name, True, False,
                                                  item["auto_delete"], arguments)
                if item.get("members"):
                    vhost.queues[item["name"]] = self.quorum.recover(
                        vhost.name, item["name"], dict(queue_spec.arguments), item["group"],
                        tuple(item["members"]))
                else:
                    self.create_queue(vhost, item["name"], queue_spec, None, item.get("group"))
                counts["queues"] += 1
            for item in document["bindings"]:
                vhost = self.vhosts[item["vhost"]]
                kind = QUEUE if item["destination_kind"] == QUEUE else EXCHANGE
                vhost.bind(item["source"], Destination(kind, item["destination"]),
                           item["routing_key"], decode_arguments(item["arguments"]))
        if self.quorum is not None:
            self.quorum.orphans({q.group for q in self.all_queues()
                                 if isinstance(q, QuorumQueue)})
        if self.store is not None:
            recovered = self.store.recover()
            for key, messages in recovered.items():
                vhost_name, _, name = key.decode("utf-8", "surrogateescape").partition("\x00")
                vhost = self.vhosts.get(vhost_name)
                queue = vhost.queues.get(name) if vhost else None
                if queue is None:
                    self.store.append_delete(key)  # messages of a queue that is gone
                    continue
                for item in messages:
                    _class_id, properties = decode_properties(item.header)
                    message = Message(item.exchange, item.routing_key, properties, item.body)
                    entry = Entry(message, item.seq, stored=True)
                    queue.next_seq = max(queue.next_seq, item.seq + 1)
                    queue.push(entry)
                    counts["messages"] += 1
        for name in list(self.vhosts):
            self.apply_policies(name)
        self.metadata_dirty = False
        return counts

    def all_queues(self) -> Iterable[ClassicQueue]:
        for vhost in self.vhosts.values():
            yield from vhost.queues.values()


def publisher_sequence(properties: codec.Properties) -> tuple[str, int]:
    """(publisher, seq) from a publish's headers, or ("", 0) when it carries neither.

    Only a header table naming one of the two headers is decoded (the table alone:
    decoding every property costs 4x more), so plain publishes keep the fast path.
    Both must be given: a publisher string of 1 to 255 bytes and an integer seq in
    1..2^64-1; anything else is a client bug (PRECONDITION_FAILED)."""
    if b"x-quorumqueue-" not in properties.raw:
        return "", 0
    found = _scan_sequence_headers(properties)
    if found is None:
        headers = _headers(properties) or {}
        found = headers.get(PUBLISHER_HEADER), headers.get(SEQ_HEADER)
    publisher, seq = found
    if publisher is None and seq is None:
        return "", 0
    if isinstance(publisher, bytes):
        publisher = publisher.decode("utf-8", "surrogateescape")
    if (not isinstance(publisher, str) or not publisher
            or len(publisher.encode("utf-8", "surrogateescape")) > 255):
        raise AMQPError(spec.PRECONDITION_FAILED, f"header '{PUBLISHER_HEADER}' must be a "
                        f"string of 1 to 255 bytes (with '{SEQ_HEADER}'), got {publisher!r}",
                        60, 40)
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 < seq <= MAX_SEQ:
        raise AMQPError(spec.PRECONDITION_FAILED, f"header '{SEQ_HEADER}' must be an integer "
                        f"from 1 to 2^64-1 (with '{PUBLISHER_HEADER}'), got {seq!r}", 60, 40)
    return publisher, seq


# Basic property flags (AMQP 0-9-1, 4.2.6.1): the fields before `headers` in a header.
_CONTENT_TYPE, _CONTENT_ENCODING, _HEADERS = 1 << 15, 1 << 14, 1 << 13


# Field-table value types (as pamqp reads them): fixed sizes, and those that carry a
# u32 length first (long string, array, table, byte array).
_FIXED_SIZE = {ord("t"): 1, ord("b"): 1, ord("B"): 1, ord("s"): 2, ord("u"): 2, ord("I"): 4,
               ord("i"): 4, ord("l"): 8, ord("L"): 8, ord("f"): 4, ord("d"): 8, ord("D"): 5,
               ord("T"): 8, ord("V"): 0, 0: 0}
_LENGTH_FIRST = frozenset(map(ord, "SAFx"))
_INTEGER = {ord("b"): struct.Struct(">b"), ord("B"): struct.Struct(">B"),
            ord("s"): struct.Struct(">h"), ord("u"): struct.Struct(">H"),
            ord("I"): struct.Struct(">i"), ord("i"): struct.Struct(">I"),
            ord("l"): struct.Struct(">q"), ord("L"): struct.Struct(">q")}
_PUBLISHER_KEY, _SEQ_KEY = PUBLISHER_HEADER.encode(), SEQ_HEADER.encode()


def _header_table_span(raw: bytes, flags: int) -> tuple[int, int]:
    """Where a content header's header table starts (its u32 length) and ends."""
    offset = 14
    for present in (_CONTENT_TYPE, _CONTENT_ENCODING):
        if flags & present:
            offset += 1 + raw[offset]
    return offset, offset + 4 + int.from_bytes(raw[offset:offset + 4])


def _scan_sequence_headers(properties: codec.Properties) -> tuple[object, object] | None:
    """(publisher, seq) found by walking the header table's entries without decoding
    the others (the Spark sink sends them on every message; pamqp's decoding of the
    whole table was ~12% of the broker's time per keyed publish). None when the table
    is anything but a plain, well-formed one with a long-string publisher and an
    integer seq: then pamqp decodes it and the checks name what is wrong."""
    raw = properties.raw
    flags = int.from_bytes(raw[12:14])
    if flags & 1 or not flags & _HEADERS:
        return None
    offset, end = _header_table_span(raw, flags)
    if end > len(raw):
        return None
    position = offset + 4
    publisher = seq = None
    while position < end:
        key_end = position + 1 + raw[position]
        if key_end >= end:
            return None
        key, kind, position = raw[position + 1:key_end], raw[key_end], key_end + 1
        if kind in _LENGTH_FIRST:
            if position + 4 > end:
                return None
            size = 4 + int.from_bytes(raw[position:position + 4])
        else:
            size = _FIXED_SIZE.get(kind, -1)
            if size < 0:
                return None
        if position + size > end:
            return None
        if key == _PUBLISHER_KEY:
            if kind != ord("S"):
                return None
            try:
                publisher = raw[position + 4:position + size].decode("utf-8")
            except UnicodeDecodeError:
                return None
        elif key == _SEQ_KEY:
            reader = _INTEGER.get(kind)
            if reader is None:
                return None
            seq = reader.unpack_from(raw, position)[0]
        position += size
    return publisher, seq


def _headers(properties: codec.Properties) -> dict | None:
    """The header table of a content header, decoded by pamqp."""
    raw = properties.raw
    flags = int.from_bytes(raw[12:14])
    if flags & 1:  # continuation flags: not used by 0-9-1 basic; decode everything
        return properties.decoded().get("headers")
    if not flags & _HEADERS:
        return None
    offset, end = _header_table_span(raw, flags)
    try:
        return pamqp_decode.field_table(raw[offset:end])[1]
    except (struct.error, ValueError, TypeError, IndexError) as error:
        raise AMQPError(spec.FRAME_ERROR, f"cannot decode content header: {error}") from None

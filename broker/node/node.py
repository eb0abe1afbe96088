"""The broker node: vhosts, users, sessions, the publish and delivery pipeline.

Responsibilities: what crosses channels and connections.
- Routing a published message into queues.
- Handing ready messages to consumers; settling and requeueing.
- Deleting queues, with consumer-cancel notifications.
- Exclusive and auto-delete lifecycles; direct reply-to.
- Resource alarms (connection.blocked).
- What must be made durable (metadata, persistent messages).

How it works: the node is synchronous and does no I/O itself. Sessions call into
it. It writes frames into sessions' buffers, and records into the stores' pending
batches. The server shell then calls `flush()`: one write and fsync for everything
pending (group commit). Afterwards it sends every session's buffered bytes.
`synced()` releases the confirms that wait on a store batch.

Invariants: a publisher confirm for a persistent message in a durable queue is
sent only after the store batch holding it is fsynced. Metadata is saved before the
declare-ok of a durable entity is sent. Both happen in the same flush, metadata
first.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from typing import TYPE_CHECKING, Iterable

from ..amqp import codec, spec
from ..amqp.channel import ChannelState
from ..amqp.errors import AMQPError
from ..amqp.properties import FLAG_EXPIRATION, expiration_error
from ..auth.users import FULL, SHA256, Permissions, User, UserStore
from ..cluster.cluster import Cluster
from ..queues.actions import carry_out
from ..queues.base import Confirm, Queue
from ..queues import registry
from ..queues.deadlines import Deadlines
from ..queues.message import Message
from ..queues.types import QueueSpec
from ..raft.storage import LogStore
from ..routing.exchanges import EXCHANGE, QUEUE, Destination
from ..storage.message_store import MessageStore, queue_key
from ..storage.metadata_store import MetadataStore, decode_arguments, encode_arguments
from . import dead_letters, group_commit, limits, management, ordering
from .counters import Counters
from .operator_policies import effective, parse_operator_policy
from .policies import Policy, matching, parse_policy
from .shell import NO_SHELL, Shell
from ..queues.quorum.groups import QuorumGroups
from .vhost import VHost

if TYPE_CHECKING:  # pragma: no cover
    from .channel import Channel
    from .session import Session

log = logging.getLogger("quorumqueue.broker")

REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."
# metadata commands that trigger continuous membership reconciliation (the 4.2 quorum
# queues guide: a node added, a node removed for good, a policy change)
CMR_TRIGGERS = frozenset({"cluster.add_node", "cluster.forget_node", "policy.set",
                          "policy.clear", "operator_policy.set", "operator_policy.clear"})


class Node:
    def __init__(self, settings, users: UserStore | None, log_store: LogStore,
                 message_store: MessageStore | None = None,
                 metadata_store: MetadataStore | None = None, shell: Shell = NO_SHELL) -> None:
        self.settings = settings
        # the server shell running the node (shell.py): its shovels' rows, its clients
        self.shell = shell
        # this run of the node; fifo identities start with it, and carry the node's
        # name: every node tells its own from others'
        self.boot_id = (f"{settings.node_name}:"
                        + base64.b32encode(os.urandom(5)).decode("ascii").lower())
        self.users = users or UserStore.with_default_user()
        self.store = message_store
        self.metadata = metadata_store
        self.vhosts: dict[str, VHost] = {"/": VHost("/")}
        self.sessions: set["Session"] = set()
        self.dirty: set["Session"] = set()
        self.awaiting_sync: set["Channel"] = set()
        # channels a queue answered a confirm of (queues/base.py Confirm: answers are
        # data), released after each round (`release_answered`); one set for the node's
        # life, which every Confirm of its channels holds
        self.answered_confirms: set["Channel"] = set()
        self.synced_batch_id = 0
        self.metadata_dirty = False
        # (vhost, name) of the queues whose records changed since the file's last save:
        # lines of the file's journal at the next group commit (node/group_commit.py)
        self.metadata_queue_changes: dict[tuple[str, str], None] = {}
        # saved with the metadata file: the metadata group's last entry it holds
        # (groups/metadata.py `_save_metadata`; None: not recorded this time)
        self.metadata_applied_index: int | None = None
        self.alarms: set[str] = set()
        self.counters = Counters()  # messages and connections (broker/metrics/ reads them)
        # user -> the channels its connections have open here (node/limits.py)
        self.channel_quotas: dict = {}
        self.policies: dict[str, dict[str, Policy]] = {}  # vhost -> name -> policy
        # rabbitmqctl set_operator_policy (node/operator_policies.py): vhost -> name -> it
        self.operator_policies: dict[str, dict[str, Policy]] = {}
        # runtime parameters (rabbitmqctl set_parameter; component "shovel" only,
        # broker/shovel/): (component, vhost, name) -> value
        self.parameters: dict[tuple[str, str, str], object] = {}
        # metadata commands applied that are continuous membership reconciliation's
        # trigger events (a node joined or was forgotten, a policy changed: the 4.2
        # guide's CMR); the server runs CMR a trigger_interval after a new one
        self.membership_events = 0
        # membership commands answered once their change shows (membership.py)
        self.membership_waits: list = []
        self._reply_to: dict[str, "Channel"] = {}
        self._connection_counter = 0
        # time, as the shell last told it (`set_clock`): the node reads no clock
        self.now = 0.0        # monotonic seconds (timeouts)
        self.clock_ms = 0     # wall-clock milliseconds (the leader time of timed commands)
        # the queues with a `tick` of their own (Queue.TICKS), an ordered set: tick_queues
        self.ticked_queues: dict = {}
        # when classic queues next expire something (`wake_at`): the shell wakes the
        # node then (`next_deadline_ms`, `run_deadlines`)
        self.deadlines = Deadlines()
        # the node's place in its cluster (a node alone: a cluster of one), with this
        # node as its host (cluster/host.py); it builds the node's quorum groups over
        # `log_store`, with this node as their host too (queues/quorum/host.py)
        self.cluster = Cluster(self, settings, log_store)
        self.quorum: QuorumGroups = self.cluster.groups

    def set_clock(self, now: float, clock_ms: int) -> None:
        """The server shell passes time in (tests drive it themselves)."""
        self.now = now
        self.clock_ms = clock_ms
        self.quorum.now = now  # (the commit-latency gauge's clock)
        self.quorum.clock_ms = clock_ms  # (what a publish is stamped with)
        self.cluster.set_clock(now)  # (the cluster's timeouts and liveness)

    # ------------------------------------------------------------ sessions

    def register(self, session: "Session") -> None:
        self.sessions.add(session)

    def unregister(self, session: "Session") -> None:
        """A connection closed: its exclusive queues are deleted. They live on this
        node. The deletion goes through the metadata log, as every deletion."""
        self.sessions.discard(session)
        self.dirty.discard(session)
        identity = session.identity
        for vhost in self.vhosts.values():
            for queue in [q for q in vhost.queues.values() if q.exclusive_owner == identity]:
                self.propose_delete(vhost, queue)

    @property
    def name(self) -> str:
        return self.settings.node_name

    @property
    def classic_link(self):
        """How classic queues hosted on other nodes are reached (cluster/classic_link.py)."""
        return self.cluster.classic

    @property
    def mirror_link(self):
        """How a mirrored classic queue's leader reaches its mirrors
        (cluster/mirror_link.py)."""
        return self.cluster.mirrors

    def next_connection_id(self) -> int:
        self._connection_counter += 1
        return self._connection_counter

    def vhost(self, name: str) -> VHost | None:
        return self.vhosts.get(name)

    def queue(self, vhost: str, name: str) -> Queue | None:
        """The queue `name` of vhost `vhost`, or None (cluster/host.py)."""
        found = self.vhosts.get(vhost)
        return found.queues.get(name) if found is not None else None

    def authenticate(self, username: str, password: str, peer_host: str) -> User | None:
        return self.users.authenticate(username, password, peer_host)

    # ------------------------------------------------------------ queues

    def create_recorded_queue(self, vhost: VHost, name: str, queue_spec: QueueSpec,
                                record: dict, recover: bool = False) -> Queue:
        """A queue the metadata group declared: by node/metadata.py, a snapshot or
        the metadata file. Every node records it (registry.create_recorded). That is
        a quorum queue's replica or proxy, a classic queue on its host, or a remote
        one elsewhere."""
        queue = registry.create_recorded(self, vhost.name, name, queue_spec, record, recover)
        vhost.queues[name] = queue
        if queue.REPLICATED:  # its group follows the record (membership.reconcile)
            self.quorum.membership_due[(vhost.name, name)] = None
        if queue.TICKS:
            self.ticked_queues[queue] = None
        if queue.durable:  # a non-durable one reaches the file with the next save (a
            self.queue_changed(vhost.name, name)  # snapshot's at the latest); the log has it
        # classic queues take a policy's settings at once; a quorum queue's leader, once
        # elected, proposes them on a tick
        queue.policy_changed(self.policy_for(vhost.name, queue.type_name, name))
        return queue

    def queue_record_changed(self, vhost: VHost, queue: Queue, record: dict) -> None:
        """A queue's metadata record changed (`queue.record`: node/metadata.py
        record_changed)."""
        from . import metadata

        metadata.record_changed(self, vhost, queue, record)

    def dead_letter(self, queue: Queue, message: Message, reason: str) -> None:
        """A classic queue's message died (queues/classic.py ClassicHost): its
        dead-lettered copy goes out through node/dead_letters.py, as quorum
        queues' do."""
        dead_letters.publish(self, queue, message.exchange, message.routing_key,
                             message.properties.raw, message.body, reason, self.clock_ms,
                             message.properties.blind_keys)

    def has_open_channel(self, identity: str) -> bool:
        """An open channel of this node has the fifo identity `identity`
        (queues/quorum/host.py: a quorum consumer the node no longer knows)."""
        return any(channel.quorum_identity == identity
                   for session in list(self.sessions)
                   for channel in getattr(session, "channels", {}).values()
                   if channel.state == ChannelState.OPEN)

    def dead_letters_to(self, queue: Queue) -> bool:
        """Whether `queue` has a dead-letter exchange (its arguments or its policy)."""
        return dead_letters.has_target(self, queue)

    def dead_letter_copy(self, queue: Queue, exchange: str, routing_key: str, header: bytes,
                         body: bytes, reason: str, time_ms: int,
                         blind_keys: tuple[str, ...] = ()) -> None:
        """A quorum queue's leader dropped a message (read back from its log, with
        its BCC keys). Its dead-lettered copy goes out through node/dead_letters.py."""
        dead_letters.publish(self, queue, exchange, routing_key, header, body, reason,
                             time_ms, blind_keys)

    def route_dead_letter(self, queue: Queue, exchange: str, routing_key: str, header: bytes,
                          body: bytes, reason: str, time_ms: int,
                          blind_keys: tuple[str, ...] = ()):
        """Where the dead-lettered copy of a quorum queue's message goes, for its
        at-least-once dead-letter worker, which publishes it with confirms
        (node/dead_letters.py `route`: a Routed, or an Unrouted)."""
        return dead_letters.route(self, queue, exchange, routing_key, header, body, reason,
                                  time_ms, blind_keys)

    def expire_queue(self, queue: Queue) -> None:
        """A classic queue unused for its x-expires period. It is deleted through
        the metadata log, as a client's queue.delete. RabbitMQ's classic queue
        deletes itself the same way."""
        vhost = self.vhosts.get(queue.vhost)
        if vhost is None or vhost.queues.get(queue.name) is not queue:
            return
        log.info(
            "classic queue '%s' in vhost '%s': unused for its x-expires period: deleting it",
            queue.name, queue.vhost)
        self.propose_delete(vhost, queue)

    def wake_at(self, queue: Queue, ms: int) -> None:
        """A classic queue expires something at `ms` (queues/classic.py ClassicHost)."""
        self.deadlines.add(ms, queue, queue.tick)

    def next_deadline_ms(self) -> int | None:
        """When a queue next expires a message or itself (wall-clock ms). None: no
        queue waits for the clock. The shell runs `run_deadlines` then."""
        quorum = self.quorum
        if not self.deadlines.pending and not quorum.deadlines.pending:
            return None  # the usual case, after every flush: no call
        deadlines = [ms for ms in (self.deadlines.next_ms(), quorum.deadlines.next_ms())
                     if ms is not None]
        return min(deadlines) if deadlines else None

    def run_deadlines(self) -> None:
        """The queues whose deadline the clock reached expire what is due. (The
        clock as the shell last passed it.) Classic queues do it at once. Quorum
        queues' leaders propose the Tick that does it (queues/deadlines.py)."""
        now = self.clock_ms
        for callback in self.deadlines.due(now):
            callback(now)
        for callback in self.quorum.deadlines.due(now):
            callback(now)

    def tick_queues(self) -> None:
        """The timer, about twice a second, with the clock the shell passed in.
        It runs the `tick` of every queue whose type has one (`Queue.TICKS`: classic
        queues expire messages and themselves there), from `ticked_queues`
        (create_recorded_queue fills it; a deleted queue leaves it here). A quorum
        queue's timers are its leader's (queues/quorum/groups.py `tick`)."""
        now = self.clock_ms
        ticked = self.ticked_queues
        for queue in list(ticked):
            if queue.deleted:
                del ticked[queue]
            else:
                queue.tick(now)

    def propose_delete(self, vhost: VHost, queue: Queue, then=None) -> None:
        """Delete a queue through the metadata log (auto-delete, an exclusive owner
        gone, a restart); `then(count)` once applied here."""
        from ..groups import metadata as meta

        self.cluster.meta.propose_data(meta.encode(
            "queue.delete", vhost=vhost.name, name=queue.name, group=queue.group), then)

    # ------------------------------------------------------------ policies

    def policy_for(self, vhost: str, kind: str, name: str):
        """What applies to a `kind` named `name` in `vhost`. The kind is "classic",
        "quorum" or "exchange". Its policy (policies.py) is combined with its
        operator policy, if one applies (operator_policies.py `effective`). None
        when neither does."""
        return effective(*self.policies_for(vhost, kind, name))

    def policies_for(self, vhost: str, kind: str,
                     name: str) -> tuple[Policy | None, Policy | None]:
        """(the policy, the operator policy) that apply to it (exchanges: never an
        operator policy)."""
        policy = matching(self.policies.get(vhost, {}).values(), kind, name)
        if kind == "exchange":
            return policy, None
        return policy, matching(self.operator_policies.get(vhost, {}).values(), kind, name)

    def apply_policies(self, vhost_name: str) -> None:
        """After a policy change, every queue takes its settings. Classic queues do
        so at once, drop-head dropping what is over. Quorum queues do so through
        their log, by their leader. Exchanges take their alternate exchange."""
        vhost = self.vhosts.get(vhost_name)
        if vhost is None:
            return
        for exchange in vhost.exchanges.values():
            self.apply_exchange_policy(vhost_name, exchange)
        for queue in list(vhost.queues.values()):
            queue.policy_changed(self.policy_for(vhost_name, queue.type_name, queue.name))

    def apply_exchange_policy(self, vhost_name: str, exchange) -> None:
        """The exchange takes the alternate-exchange of the policy that applies to it
        (its own argument still wins: Exchange.alternate_exchange)."""
        policy = self.policy_for(vhost_name, "exchange", exchange.name)
        exchange.policy_alternate = (policy.definition.get("alternate-exchange")
                                     if policy is not None else None)

    def tick_policies(self) -> None:
        """On every tick, a queue whose settings are applied through a log catches
        up. It does so once it leads in a new term: a new leader, a restart
        (`policy_due`). Only the quorum queues that had a Ready as leaders of a term
        they have not checked in are visited (the groups' `policy_due` set,
        queues/quorum/groups.py `_watch`): a leader that checked in its term costs
        nothing per tick."""
        quorum = self.quorum
        for queue in quorum.members_of(quorum.policy_due, _policy_unchecked):
            if queue.POLICY_ON_TICK and queue.policy_due():
                queue.policy_changed(self.policy_for(queue.vhost, queue.type_name,
                                                     queue.name))

    # ------------------------------------------------------------ the metadata group

    def apply_metadata(self, command: dict):
        """One metadata command, applied here as on every node (node/metadata.py)."""
        from . import metadata

        result = metadata.apply(self, command)
        if command["op"] in CMR_TRIGGERS:
            self.membership_events += 1
        return result

    def metadata_snapshot(self) -> bytes:
        """Everything the metadata group replicates, as its snapshot."""
        from . import metadata_snapshot

        return metadata_snapshot.encode(self)

    def restore_metadata(self, data: bytes, transient_only: bool = False) -> None:
        """Make this node's metadata equal to a snapshot. With `transient_only`, add
        only what the metadata file cannot hold, over a file at least as new."""
        from . import metadata_snapshot

        document = metadata_snapshot.decode(data)
        if transient_only:
            metadata_snapshot.add_transient(self, document)
        else:
            metadata_snapshot.restore(self, document)

    def metadata_replayed(self) -> None:
        """The metadata log was replayed after a restart. Some classic queues this
        node hosts cannot outlive it. They are the non-durable ones, and the
        exclusive ones of an earlier run's connections. They are deleted, as RabbitMQ
        deletes them when their node restarts. A node of its own restarted its whole
        cluster. So non-durable exchanges are gone too, as RabbitMQ's transient
        exchanges are after a full restart. Both deletions go through the log, so
        the next replay agrees."""
        for vhost in self.vhosts.values():
            for queue in list(vhost.queues.values()):
                if queue.gone_after_restart(self.name, self.boot_id):
                    self.propose_delete(vhost, queue)
        if self.settings.clustered or not self.cluster.meta.is_leader:
            return
        from ..groups import metadata as meta

        for vhost in self.vhosts.values():
            for exchange in list(vhost.exchanges.values()):
                if not exchange.durable and exchange.name and \
                        not exchange.name.startswith("amq."):
                    self.cluster.meta.propose_data(meta.encode(
                        "exchange.delete", vhost=vhost.name, name=exchange.name,
                        if_unused=False))

    def delete_queue(self, vhost: VHost, queue: Queue) -> int:
        """Delete a queue: cancel its consumers, notifying clients that asked.
        Drop its messages. Returns the number of ready messages it held."""
        if vhost.queues.get(queue.name) is not queue:
            return 0
        count = queue.ready_count
        del vhost.queues[queue.name]
        queue.deleted = True
        self.cancel_consumers(queue)
        queue.delete()
        self.cluster.classic.hosted_deleted(queue)
        removed = vhost.remove_bindings_to(Destination(QUEUE, queue.name))
        if queue.durable or any(e.durable for e in removed):
            self.queue_changed(vhost.name, queue.name)
        return count

    def queue_changed(self, vhost: str, name: str) -> None:
        """The queue's record changed: declared, deleted, its members or host.
        It is saved at the next group commit, as a line of the file's journal. A
        quorum queue's group follows its record at the next tick
        (membership.reconcile)."""
        self.metadata_queue_changes[(vhost, name)] = None
        self.quorum.membership_due[(vhost, name)] = None

    def queue_document(self, vhost: str, name: str) -> dict | None:
        """The queue's record as the metadata file holds it (None: no such queue)."""
        found = self.vhosts.get(vhost)
        queue = found.queues.get(name) if found is not None else None
        if queue is None:
            return None
        return {"vhost": vhost, "name": queue.name, "type": queue.type_name,
                "durable": queue.durable, "auto_delete": queue.auto_delete,
                "arguments": encode_arguments(queue.arguments), **queue.metadata_record()}

    def cancel_consumers(self, queue) -> None:
        """Cancel the queue's consumers on this node. Clients that asked for
        consumer_cancel_notify get basic.cancel. The consumers of other nodes on a
        queue held here are dropped. Their nodes cancel them when they apply the
        same deletion."""
        for consumer in list(queue.consumers):
            self.cancel_consumer(queue, consumer)

    def cancel_consumer(self, queue, consumer) -> None:
        from .channel import Consumer

        queue.remove_consumer(consumer)
        if not isinstance(consumer, Consumer):
            return  # another node's (cluster/classic_link.py)
        channel = consumer.channel
        channel.consumers.pop(consumer.tag, None)
        if channel.session.capabilities.get("consumer_cancel_notify"):
            frame = codec.basic_cancel(channel.number, consumer.tag)
            deleting = channel.deleting
            if deleting is not None and deleting[:2] == (queue.vhost, queue.name):
                deleting[2].append(frame)  # after the delete-ok this channel waits for
            else:
                channel.send(frame)

    def drop_replica(self, queue) -> None:
        """This node is no longer one of the queue's members (cluster membership)."""
        self.cancel_consumers(queue)
        self.quorum.leave(queue)

    def purge_queue(self, queue: Queue, to) -> None:
        """Drop the queue's ready messages. `to` (queues/base.py Asker) gets the
        count once that is done: at once for classic queues, once the purge is
        applied for quorum ones, once the host answers for a remote one."""
        carry_out(queue.purge(to))

    def consumer_removed(self, queue: Queue) -> None:
        """A consumer went: of this node, or a remote one on a queue hosted here.
        An auto-delete queue that had consumers and has none left is deleted. That
        goes through the metadata log. Its host decides: it sees every node's
        consumers."""
        if queue.is_unused_for_auto_delete() and not queue.deleted:
            vhost = self.vhosts.get(queue.vhost)
            if vhost is not None and vhost.queues.get(queue.name) is queue:
                self.propose_delete(vhost, queue)

    # ------------------------------------------------------------ messages

    def publish(self, channel: "Channel", messages: list[tuple], tx: bool = False,
                routed_again: bool = False) -> tuple[int, AMQPError] | None:
        """Route and enqueue complete messages, in order.

        A run is what one read carried on `channel`, usually one. Each is
        (basic.publish, properties, body, confirm seq), already checked
        (`handlers.publish`). A run of one exchange and routing key is routed once.
        (Not when a headers exchange reads each message's headers.) Handles
        mandatory returns and publisher confirms. `tx`: a committed transaction's
        publishes, whose silent confirms the tx.commit-ok waits behind.

        In a cluster, a mandatory message that routes nowhere is routed once more
        after a metadata barrier (`routed_again`). Only then is it returned. The
        messages after it wait behind the barrier too. A message may fail: a headers
        exchange cannot read its headers, or a queue refuses its properties. On the
        first that fails, those before it are published. Then (its position, its
        error) is returned."""
        vhost = channel.session.vhost
        counters = self.counters
        routed: tuple[str, str] | None = None  # (exchange, routing key) of `queues`
        queues: list = []
        position = 0
        try:
            for position, (publish, properties, body, confirm_seq) in enumerate(messages):
                exchange_name, routing_key = publish.exchange, publish.routing_key
                message = Message(exchange_name, routing_key, properties, body)
                delivered = False
                if publish.immediate and exchange_name == "" and routing_key.startswith(
                        REPLY_TO_PREFIX):
                    raise AMQPError(spec.PRECONDITION_FAILED, "a batch publish cannot be "
                                    "sent to direct reply-to", spec.BASIC, 40)
                if exchange_name == "" and routing_key == management.ROUTING_KEY:
                    delivered = self._management_request(channel, properties, body)
                    queues, routed = [], None
                elif exchange_name == "" and routing_key.startswith(REPLY_TO_PREFIX):
                    delivered = self._deliver_reply(routing_key, message)
                    queues, routed = [], None
                else:
                    if routed is None or routed[0] != exchange_name or routed[1] != routing_key:
                        queues, routed = self._route(vhost, exchange_name, routing_key,
                                                     properties)
                    if not queues and publish.mandatory and not tx and not routed_again \
                            and ordering.may_be_unapplied(channel.session):
                        # perhaps a queue or binding committed elsewhere and not applied
                        # here yet: routed once more after a metadata barrier
                        # (node/ordering.py), the rest of the run held behind it
                        rest = messages[position + 1:]
                        ordering.after_barrier(channel.session, channel, lambda: self.publish_all(
                            channel, [messages[position]], routed_again=True),
                            spec.BASIC_PUBLISH)
                        if rest:
                            ordering.hold(channel.session, channel,
                                          lambda: self.publish_all(channel, rest),
                                          spec.BASIC_PUBLISH)
                        return None
                # messages, as RabbitMQ counts them: a batch publish carries many
                count = body.count if publish.immediate else 1
                counters.received += count
                channel.published = True
                if confirm_seq:
                    counters.received_confirm += count
                if queues or delivered:
                    counters.routed += count
                elif publish.mandatory:
                    counters.unroutable_returned += count
                    channel.send(codec.basic_return(channel.number, spec.NO_ROUTE, "NO_ROUTE",
                                                    exchange_name, routing_key))
                    channel.session.write_parts(codec.content(  # a batch: as published
                        channel.number, properties.raw, body.body if publish.immediate
                        else body, channel.session.frame_max))
                else:
                    counters.unroutable_dropped += count
                confirm = channel.open_confirm(confirm_seq) if confirm_seq or tx else None
                if publish.immediate and len(queues) == 1:  # a batch, to one queue
                    queue = queues[0]
                    queue.message_counts.publish += count
                    carry_out(queue.publish_batch(body, exchange_name, routing_key, channel,
                                                  confirm))
                elif publish.immediate:  # (handlers.publish lets no other batch through)
                    for record_properties, record_body in body.records:
                        record = Message(exchange_name, routing_key, record_properties,
                                         record_body)
                        for queue in queues:
                            queue.message_counts.publish += 1
                            actions = queue.publish(record, channel, confirm)
                            if actions:
                                carry_out(actions)
                else:
                    for queue in queues:
                        queue.message_counts.publish += 1
                        actions = queue.publish(message, channel, confirm)
                        if actions:
                            carry_out(actions)
                if confirm is not None:
                    channel.close_confirm(confirm)
        except AMQPError as error:  # a queue refused it, or its headers cannot be read
            return position, error
        return None

    def publish_all(self, channel: "Channel", messages: list[tuple], tx: bool = False,
                    routed_again: bool = False) -> None:
        """`publish`, its failure raised (what a held method or a tx.commit does)."""
        failed = self.publish(channel, messages, tx, routed_again)
        if failed is not None:
            raise failed[1]

    def _route(self, vhost, exchange_name: str, routing_key: str,
               properties: codec.Properties) -> tuple[list, tuple[str, str] | None]:
        """The queues a message reaches, and its (exchange, routing key). Any
        message with the same two reaches the same queues. The key is None when a
        headers exchange read this message's headers."""
        if properties.selected_keys:  # CC and BCC: routed by every key, never cached
            return vhost.route(vhost.exchange(exchange_name), routing_key,
                               lambda: properties.decoded().get("headers"),
                               properties.selected_keys), None
        if exchange_name == "":  # twin of VHost.route's default exchange: keep in step
            queue = vhost.queues.get(routing_key)
            return [queue] if queue is not None else [], (exchange_name, routing_key)
        read_headers = False

        def headers() -> dict | None:
            nonlocal read_headers
            read_headers = True
            return properties.decoded().get("headers")

        queues = vhost.route(vhost.exchange(exchange_name), routing_key, headers)
        return queues, None if read_headers else (exchange_name, routing_key)

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
                    carry_out(queue.publish(reply, None, None))

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
        if channel is None or channel.reply_to_consumer is None or not channel.is_open:
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

    def after_sync(self, batch_id: int, waiter) -> bool:
        """Whether the message-store batch `batch_id` is still to be fsynced; if so,
        `waiter.release_confirms(synced_batch_id)` is called after each fsync until
        it returns True (`synced`). For what answers once a batch is durable and is
        no channel: the cluster's links, a dead-letter worker's confirms."""
        if batch_id <= self.synced_batch_id:
            return False
        self.awaiting_sync.add(waiter)
        return True

    def release_answered(self) -> None:
        """Send the confirms due on channels a queue answered a confirm of since the
        last time (node/group_commit.py `end_sync`, after the quorum groups' round)."""
        answered = self.answered_confirms
        if answered:
            channels = list(answered)
            answered.clear()  # in place: the channels' Confirms hold this set
            for channel in channels:
                channel.release_answered_confirms()

    def synced(self, batch_id: int) -> None:
        self.synced_batch_id = batch_id
        for channel in list(self.awaiting_sync):
            if channel.release_confirms(batch_id):
                self.awaiting_sync.discard(channel)

    def flush(self) -> None:
        """Persist what is pending, and release what waited for it. Metadata comes
        first, then messages with one fsync, then the quorum queues' Raft rounds.
        All of it runs on this thread (node/group_commit.py). The server runs the
        same steps with the fsyncs off its event loop."""
        group_commit.flush(self)

    def metadata_document(self) -> dict:
        exchanges, queues, bindings = [], [], []
        for vhost in self.vhosts.values():
            for exchange in vhost.exchanges.values():
                if exchange.durable and exchange.name and not exchange.name.startswith("amq."):
                    exchanges.append({"vhost": vhost.name, "name": exchange.name,
                                      "type": exchange.type, "auto_delete": exchange.auto_delete,
                                      "internal": exchange.internal,
                                      "arguments": encode_arguments(exchange.arguments)})
            for name in vhost.queues:
                # every queue in the metadata (non-durable ones too: other nodes' and
                # this node's, which a restart of this node deletes through the log)
                queues.append(self.queue_document(vhost.name, name))
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
                                  for vhost, rights in sorted(u.permissions.items())},
                  **({"limits": dict(u.limits)} if u.limits else {}),
                  **({"hashing_algorithm": u.hashing} if u.hashing != SHA256 else {})}
                 for u in self.users.users.values()]
        policies = [policy.as_dict() for vhost in sorted(self.policies)
                    for _name, policy in sorted(self.policies[vhost].items())]
        operator_policies = [policy.as_dict() for vhost in sorted(self.operator_policies)
                             for _name, policy in sorted(self.operator_policies[vhost].items())]
        return {"vhosts": sorted(self.vhosts), "users": users, "policies": policies,
                "operator_policies": operator_policies,
                **({"parameters": self.parameter_items()} if self.parameters else {}),
                "vhost_limits": limits.document(self),
                "exchanges": exchanges,
                "queues": queues, "bindings": bindings}

    def parameter_items(self) -> list[dict]:
        """The runtime parameters as [{vhost, component, name, value}], sorted."""
        return [{"vhost": vhost, "component": component, "name": name, "value": value}
                for (component, vhost, name), value in sorted(self.parameters.items())]

    def shovel_parameters(self) -> dict[tuple[str, str], dict]:
        """{(vhost, name): value} of the shovel parameters. The server shell runs
        them on the node that leads the metadata group (broker/shovel/)."""
        return {(vhost, name): value for (component, vhost, name), value
                in self.parameters.items() if component == "shovel"}

    @staticmethod
    def _durable_binding(vhost: VHost, binding) -> bool:
        source = vhost.exchanges.get(binding.source)
        if source is None or not source.durable:
            return False
        if binding.destination.kind == QUEUE:  # every queue the file holds
            queue = vhost.queues.get(binding.destination.name)
            return queue is not None
        target = vhost.exchanges.get(binding.destination.name)
        return target is not None and target.durable

    def recover(self) -> dict[str, int]:
        """Rebuild durable state from the stores at start. Returns counts."""
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
                    {vhost: Permissions(*patterns) for vhost, patterns in rights.items()},
                    dict(user.get("limits", {})), user.get("hashing_algorithm", SHA256))
            for name in document["vhosts"]:
                self.vhosts.setdefault(name, VHost(name))
            limits.restore(self, document.get("vhost_limits", {}))
            for item in document.get("policies", ()):
                policy = parse_policy(item["vhost"], item["name"], item["pattern"],
                                      item["definition"], item["priority"], item["apply_to"],
                                      permit_mirroring=self.settings.permit_classic_queue_mirroring)
                self.policies.setdefault(policy.vhost, {})[policy.name] = policy
            for item in document.get("operator_policies", ()):
                policy = parse_operator_policy(item["vhost"], item["name"], item["pattern"],
                                               item["definition"], item["priority"],
                                               item["apply_to"])
                self.operator_policies.setdefault(policy.vhost, {})[policy.name] = policy
            for item in document.get("parameters", ()):
                self.parameters[(item["component"], item["vhost"], item["name"])] = \
                    item["value"]
            for item in document["exchanges"]:
                self.vhosts[item["vhost"]].declare_exchange(
                    item["name"], item["type"], False, True, item["auto_delete"],
                    item["internal"], decode_arguments(item["arguments"]))
            for item in document["queues"]:
                arguments = decode_arguments(item["arguments"])
                vhost = self.vhosts[item["vhost"]]
                queue_spec = validate_declaration(
                    item["name"], vhost.name, item.get("durable", True),
                    item.get("exclusive_owner") is not None, item["auto_delete"], arguments,
                    recorded=True)
                self.create_recorded_queue(vhost, item["name"], queue_spec, item,
                                             recover=True)
                counts["queues"] += 1
            for item in document["bindings"]:
                vhost = self.vhosts[item["vhost"]]
                kind = QUEUE if item["destination_kind"] == QUEUE else EXCHANGE
                vhost.bind(item["source"], Destination(kind, item["destination"]),
                           item["routing_key"], decode_arguments(item["arguments"]))
        self.quorum.orphans({q.metadata_record().get("group") for q in self.all_queues()} - {None})
        if self.store is not None:
            recovered = self.store.recover()
            for key, messages in recovered.items():
                vhost_name, _, name = key.decode("utf-8", "surrogateescape").partition("\x00")
                vhost = self.vhosts.get(vhost_name)
                queue = vhost.queues.get(name) if vhost else None
                if queue is None:
                    self.store.append_delete(key)  # messages of a queue that is gone
                    continue
                taken = queue.recover_stored(messages)
                if not taken:
                    self.store.append_delete(key)  # a queue of another type now
                counts["messages"] += taken
        for name in list(self.vhosts):
            self.apply_policies(name)
        self.metadata_dirty = False
        self.metadata_queue_changes.clear()  # what was just read
        # saved with the metadata file: the metadata group's last entry it holds
        # (groups/metadata.py `_save_metadata`; None: not recorded this time)
        self.metadata_applied_index: int | None = None
        return counts

    def all_queues(self) -> Iterable[Queue]:
        for vhost in self.vhosts.values():
            yield from vhost.queues.values()

    # ------------------------------------------------------------ for other nodes
    # (what cluster/replica_rpc.py and tracking.py ask of this node: cluster/host.py)

    def message_stats(self) -> dict:
        """This node's message counters and the counts of its queues that have any
        (another node's management API sums them: management/rates.py)."""
        queues = {}
        for queue in list(self.all_queues()):
            row = queue.message_counts.as_row()
            if any(row):
                queues[queue.group] = row
        return {"node": self.counters.message_stats(), "queues": queues}

    def connection_counts(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """Open connections per vhost and per user, open channels per user (limits.py)."""
        return limits.connection_counts(self)

    def refresh_channel_quotas(self) -> None:
        """The channel quotas take the channels open on other nodes (limits.py)."""
        limits.refresh_elsewhere(self)

    def shovel_rows(self) -> list:
        """The status rows of the dynamic shovels this node runs (the shell's)."""
        return self.shell.shovel_rows()

    def clients(self) -> dict:
        """This node's AMQP clients' management rows (the shell's)."""
        return self.shell.client_rows()

    def close_connection(self, name: str, reason: str) -> bool:
        """Close the client connection named `name` with 320 and `reason` (the
        shell's); False if there is none."""
        return self.shell.close_client(name, reason)


def _policy_unchecked(member) -> bool:
    """A quorum queue that leads in a term it has not compared its settings in
    (kept while a restart's replay makes it wait: QuorumQueue.policy_due)."""
    raft = member.raft
    return (getattr(member, "POLICY_ON_TICK", False) and raft is not None
            and not member.deleted and member.is_leader and member.policy_term != raft.term)

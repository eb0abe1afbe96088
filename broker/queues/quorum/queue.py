"""Quorum queue: a Raft group whose log holds the messages, plus the fifo machine's
compact state. Pure: no I/O. broker/queues/quorum/groups.py drives it against the
log store.

Responsibilities:
- What a queue object must answer for the node and the AMQP layer: name,
  arguments, counts, the consumers attached on this node.
- Proposing fifo commands to the log. `broker/fifo/envelope.py` encodes them: a
  command, stamped with the leader's clock when its effect depends on time.
- The bookkeeping that ties a log index to whoever waits for it to be applied: a
  publisher confirm, a basic.get, a purge, a lease operation.

As a queue type (queues/base.py): every operation is a fifo command proposed to the
queue's log. That is here, or at the leader through the cluster's router. Replies
come from this member's own apply. (queues/quorum/groups.py drives the groups.
queues/quorum/deliveries.py turns Deliver effects into `DeliverBatch` actions.)
No channel is called here: what a channel is to do is an action
(queues/actions.py). An answer known at once is returned. An answer the log gives
later is `handle_event`'s, from the data its waiter holds (answers.py): a
basic.get's `GetOk` or `GetEmpty`, a declare's `DeclareOk`, a purge's `PurgeOk`.

Settlements and publishes are held until the queue's next command or the node's
next round. Then they are proposed together: a run of publishes is one log
append. An unacked delivery's token is a `QuorumToken`: the fifo consumer key and
the machine's message id. Settling goes through the log by id. The envelope's
TIMED_COMMANDS carry the proposer's clock. That is `now_ms`, or the node's when a
caller has none (0). The others carry no time.

Invariants:
- Every live message is in the log at its raft index. Bodies are read from there,
  never copied into the state.
- `waiters[i]` is called exactly once, with the machine's reply, when entry i is
  applied. Or with None, if the queue is deleted first.
- `by_key` maps the fifo consumer keys of this node's AMQP consumers.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Iterable, assert_never

from ...amqp import codec, spec
from ...amqp.channel import ChannelState
from ...amqp.errors import AMQPError
from ...amqp.properties import publisher_sequence
from ...fifo import commands
from ...fifo.envelope import encode_command, stamped_enqueue, stamped_enqueues
from ...fifo.single_active import waiting_order
from ...fifo.state import FifoState, fifo_config
from ...groups.replicated import ReplicatedGroup, RunWaiter, Waiter
from ...raft import RaftNode
from ...raft.forwarded import dump_snapshot, load_snapshot
from ..actions import Action, DeclareOk, Deliver, GetEmpty, GetOk, PurgeOk, carry_out
from ..base import Asker, Channel, Confirm, Consumer, MessageCounts, Queue
from ..settings import leader_locator, quorum_config
from ..types import EQUIVALENCE_KEYS_BY_TYPE
from .answers import Answer, DeclareAsked, Event, GetAsked, PurgeAsked
from .host import QuorumCluster

if TYPE_CHECKING:  # pragma: no cover
    from .groups import QuorumGroups

# a no-ack consumer gets this much credit in the machine: its deliveries are settled as
# soon as they are written, which gives the credit back (flow control without acks)
NO_ACK_CREDIT = 2000


# ra's names for the Raft roles (a pre-vote round is ra's pre_vote state)
RAFT_STATES = {"leader": "leader", "follower": "follower", "candidate": "candidate",
               "pre_candidate": "pre_vote"}


def must_land(_reply) -> None:
    """The waiter of a command that needs no answer but must reach the log.
    That is a consumer's Checkout, Cancel and its channel's Down.

    A proposal without a waiter is forgotten once appended. So one appended by a
    leader deposed before it committed was lost with that leader's tail. (A leader
    paused longer than an election does that. When it resumes, it closes its
    clients' connections for missed heartbeats before it learns of the new term.)
    The consumer stayed in the queue with no channel behind it. Once it was the
    single active consumer, every message went to it. Each came back from its node
    counted, and went to it again, until the delivery limit dropped it. With a
    waiter, groups/replicated.py proposes a lost append again."""


class MessageGone(RuntimeError):
    """A message's entry is no longer in the log: the log was released past it.
    Only a settled message's can be; a live one's never is."""


class QuorumToken:
    """An unacked delivery from a quorum queue. It names the fifo consumer that
    holds it, and the machine's message id. It is settled through the log, by id."""

    __slots__ = ("key", "msg_id")

    def __init__(self, key: str, msg_id: int) -> None:
        self.key = key
        self.msg_id = msg_id


def with_delivery_count(header: bytes, count: int, extra: dict | None = None) -> bytes:
    """The content header with `x-delivery-count` (when count > 0) and any `extra`
    integer headers set. Everything else stays byte for byte as published."""
    values = dict(extra or {})
    if count:
        values["x-delivery-count"] = count
    return codec.with_long_headers(header, values) if values else header


def group_uid(vhost: str, name: str) -> str:
    """A new group uid: vhost and name (readable in `ls`), plus a random suffix.
    So a queue declared again after a delete never meets its predecessor's files."""
    from urllib.parse import quote

    return f"{quote(vhost, safe='')}/{name}/{os.urandom(6).hex()}"


class QuorumQueue(ReplicatedGroup, Queue):
    type_name = "quorum"
    EQUIVALENCE_KEYS = EQUIVALENCE_KEYS_BY_TYPE["quorum"]
    REPLICATED = True
    POLICY_ON_TICK = True

    @staticmethod
    def place(vhost: str, name: str, arguments: dict, policy, settings, cluster,
              exclusive: bool = False) -> dict:
        """The record of a new queue: queue.declare's fields beyond name and
        arguments.
        - Its group uid.
        - Its members: x-quorum-initial-group-size, else
          quorum_queue.initial_cluster_size, capped at the cluster's size.
        - Its intended leader, by queue-leader-locator: the policy's, the argument,
          the configuration."""
        size = arguments.get("x-quorum-initial-group-size") or settings.quorum_initial_cluster_size
        locator = leader_locator(arguments, policy, settings.queue_leader_locator)
        members, leader = cluster.place(size, locator)
        return {"group": group_uid(vhost, name), "members": list(members), "leader": leader}

    @staticmethod
    def recorded_flags(durable: bool, auto_delete: bool, exclusive_owner: Any) -> dict:
        return {}  # always durable, shared, never auto-deleted (the class attributes)

    durable = True
    auto_delete = False
    exclusive_owner = None
    router: QuorumCluster  # ReplicatedGroup's, as the quorum type uses it (counts too)

    def __init__(self, vhost: str, name: str, arguments: dict, group: str,
                 raft: RaftNode | None, state: FifoState, members: tuple[str, ...],
                 router: QuorumCluster, groups: "QuorumGroups") -> None:
        super().__init__(group, raft, router)  # the node's cluster: forwards, counts
        self.groups = groups          # the node's QuorumGroups (reads bodies from the log)
        self.vhost = vhost
        self.name = name
        self.arguments = arguments
        self.members = members        # the group's members when declared (cluster)
        self.state = state
        self.consumers: list = []     # AMQP consumers on this node (channel.Consumer)
        self.message_counts = MessageCounts()  # this node's (queues/base.py)
        self.by_key: dict[str, Any] = {}
        self.exclusive_consumer = None
        self.had_consumers = False
        # NodeDown / NodeUp / Down commands this node proposed as the leader, and when
        # (cluster/consumer_nodes.py: not proposed again within a few seconds)
        self.node_proposals: dict = {}
        self.last_time_ms = 0         # the last leader time applied (see module doc)
        self.replay_until = 0         # entries up to here were applied before a restart
        # no entry above this index keeps BCC keys (tag 21): the last such Enqueue
        # applied here, or a snapshot's index (what it holds was not seen here)
        self.blind_upto = 0
        self.joined_at = 0.0          # when this node's replica joined (`QuorumGroups.join`)
        self.pending_snapshot: tuple[int, int, bytes] | None = None  # cursor, index, data
        self.snapshot_candidates: list[tuple[int, bytes]] = []  # cluster: (index, data)
        self.last_tick_ms = 0
        self.compacted_dead = 0       # dead entries below the snapshot at the last compaction
        self.config_proposed = None   # settings proposed for the machine, not yet applied
        self.policy_term = 0          # the term whose leader compared them (policy_due)
        # settlements (Settle/Return/Discard: kind, consumer key, msg ids) not proposed
        # yet: coalesced until the queue's next command or the node's next round
        self.settling: list[tuple[type, str, list[int]]] = []
        # publishes (an Enqueue's data, its confirm's waiter; a batch publish's
        # entries as one list, its RunWaiter) not proposed yet: held until the queue's
        # next command or the node's next round, then proposed as one run (one log
        # append). At most one of `settling` and `publishing` holds anything: each
        # proposes the other's before it takes more (client order)
        self.publishing: list[tuple[bytes | list[bytes], Waiter | None]] = []
        self.expiry_proposed = False  # x-expires: this leader asked the metadata to delete it

    # ------------------------------------------------------------ counts

    @property
    def served_here(self) -> bool:
        """The leader serves the queue (its counts are the queue's)."""
        return self.is_leader

    @property
    def ready_count(self) -> int:
        return self.state.ready_count

    @property
    def ready_bytes(self) -> int:
        return self.state.ready_bytes

    @property
    def unacked_count(self) -> int:
        return self.state.checked_out_count + self.state.leased_count

    @property
    def consumer_count(self) -> int:
        """Consumers the machine knows, as RabbitMQ counts them. A cancelled consumer
        still holding unacked messages counts too. So does a channel holding an
        unacked basic.get."""
        return sum(1 for c in self.state.consumers.values() if not c.pull_only or c.checked)

    @property
    def declare_ok_consumer_count(self) -> int:
        """queue.declare-ok's consumer count. rabbit_fifo's query_stat counts its
        consumers map. On a single-active-consumer queue that holds the active
        consumer, and cancelled ones still holding messages. It does not hold the
        waiting ones. RabbitMQ 3.10.8 answers so (tests/differential/
        test_single_active_consumer_against_rabbitmq.py). `queues list` counts the
        waiting ones too (rabbit_fifo's query_consumer_count), as `consumer_count`
        does."""
        if not self.state.config.single_active:
            return self.consumer_count
        waiting = set(waiting_order(self.state))
        return sum(1 for key, c in self.state.consumers.items()
                   if (not c.pull_only or c.checked) and key not in waiting)

    @property
    def single_active_consumer(self) -> bool:
        return self.state.config.single_active

    @property
    def single_active_consumer_tag(self) -> str | None:
        """The tag of the machine's active consumer (fifo/single_active.py): its key
        is `<channel identity>/<tag>`, and identities hold no '/'."""
        active = self.state.active
        return active.partition("/")[2] if active is not None else None

    @property
    def message_bytes(self) -> int:
        """Body bytes of every message still in the queue. That is ready, unacked,
        leased, and dead letters held by at-least-once dead lettering. (RabbitMQ's
        message_bytes includes message_bytes_dlx.)"""
        from ...fifo.state import size_of

        total = self.state.ready_bytes + self.state.dlx.bytes
        for consumer in self.state.consumers.values():
            total += sum(size_of(item[1]) for item in consumer.checked.values())
        for lease in self.state.leases.values():
            total += sum(size_of(packed) for packed in lease.sizes)
        return total

    @property
    def unacked_bytes(self) -> int:
        return self.message_bytes - self.state.ready_bytes

    # ------------------------------------------------------------ consumers

    def add_consumer(self, consumer, key: str) -> None:
        self.consumers.append(consumer)
        self.by_key[key] = consumer
        self.had_consumers = True
        if consumer.exclusive:
            self.exclusive_consumer = consumer

    def remove_consumer(self, consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        for key in [k for k, c in self.by_key.items() if c is consumer]:
            del self.by_key[key]
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None

    def is_unused_for_auto_delete(self) -> bool:
        return False  # quorum queues cannot be auto-delete

    def check_out_again(self, connection: str) -> None:
        """A leader took this node for down and returned the messages of this node's
        `connection` (a Down). But its channels are alive: the node was cut off, or
        paused. Their consumers consume again."""
        for key, consumer in list(self.by_key.items()):
            if key.startswith(connection + "/") and consumer.channel.state == ChannelState.OPEN:
                prefetch = NO_ACK_CREDIT if consumer.no_ack else consumer.prefetch
                self.propose(commands.Checkout(key, prefetch, consumer.priority, connection),
                             0, must_land)  # at the node's clock

    # ------------------------------------------------------------ proposals

    def propose(self, command: commands.Command | bytes, now_ms: int,
                waiter: Waiter | None = None) -> None:
        """Append a command to the log, here or at the group's leader. `waiter` gets
        the machine's reply once the entry is committed and applied here. A timed
        command carries `now_ms`, or the node's clock when it is 0."""
        if self.settling or self.publishing:  # what was held before this goes first
            self.flush_held()
        data = command if isinstance(command, bytes) else encode_command(
            command, now_ms or self.groups.clock_ms)
        self.propose_data(data, waiter)

    def has_unapplied(self) -> bool:
        return super().has_unapplied() or (self.raft is not None and bool(
            self.settling or self.publishing))

    def after_applied(self, waiter: Waiter) -> None:
        """A barrier, also after the settlements and publishes not proposed yet.
        So a count asked right after an ack includes it."""
        if self.settling or self.publishing:
            self.flush_held()
        super().after_applied(waiter)

    def flush_held(self) -> None:
        """Propose what the queue holds: its settlements or its publishes. Never
        both: see `publishing`. QuorumGroups' round calls it, or the queue's next
        command. A deleted queue proposes nothing. Its publishes' waiters get None,
        as the waiters of what it proposed did (`fail_waiters`)."""
        if self.settling:
            self.flush_settlements()
        if self.publishing:
            run, self.publishing = self.publishing, []
            if self.deleted:
                for _data, waiter in run:
                    if waiter is not None:
                        waiter(None)
                return
            self.propose_run(run)

    def flush_settlements(self) -> None:
        """Propose the settlements coalesced since the queue's last command, in
        order. A run of one kind for one consumer is one command."""
        settling, self.settling = self.settling, []
        if self.deleted:
            return
        now_ms = self.groups.clock_ms
        for kind, key, msg_ids in settling:
            self.propose_data(encode_command(kind(key, tuple(msg_ids)), now_ms))

    def restore(self, data: bytes) -> None:
        """The state machine, and the identities of the forwarded commands applied,
        from a snapshot the leader sent. It replaces both."""
        from ...fifo import snapshot

        self.applied, machine = load_snapshot(data, commands.decode_reply)
        self.state = snapshot.load(machine)

    def snapshot(self) -> bytes:
        """The group's snapshot now: the identities applied, then the machine's state
        (broker/raft/forwarded.py wraps broker/fifo/snapshot.py)."""
        from ...fifo import snapshot

        return dump_snapshot(self.applied, snapshot.dump(self.state), commands.encode_reply)

    # ------------------------------------------------------------ the queue type

    def read_message(self, index: int) -> tuple[str, str, bytes, bytes]:
        """(exchange, routing key, content header, body) of the message at `index`."""
        return self.groups.read_message(self, index)

    def read_message_spans(self, indexes: list[int]) -> list[tuple]:
        """The messages at `indexes` (increasing) as views into their log entries.
        Each is (exchange, routing key, content header length, content header +
        body)."""
        return self.groups.read_message_spans(self, indexes)

    def read_entries(self, indexes) -> list[bytes]:
        """The whole log entries of the messages at `indexes`, in that order."""
        return self.groups.read_entries(self, indexes)

    def publish(self, message, channel: "Channel | None",
                confirm: Confirm | None) -> list[Action]:
        """Propose the message to the log. The confirm waits for the entry to be
        fsynced and applied. A client's publish may carry an idempotency key
        (publisher_sequence). Messages the broker moves itself (channel None) never
        do, as their keys are out of order. No actions: deliveries come from the
        apply (groups.py)."""
        publisher, seq = (publisher_sequence(message.properties) if channel is not None
                          else ("", 0))
        # every Enqueue carries the proposer's clock: message TTLs count from it
        data = stamped_enqueue(self.groups.clock_ms, publisher, seq,
                               min(message.priority, 255),
                               message.exchange, message.routing_key,
                               message.properties.raw, message.body,
                               message.properties.blind_keys)
        # "ok" and "duplicate" (stored by an earlier publish) are both confirmed
        waiter = None if confirm is None else confirm.hold_reply("rejected")
        if self.settling:  # settlements made before go first
            self.flush_settlements()
        # what one read publishes to the queue becomes one run: one append, one
        # Ready entry list for the apply loop (proposed at the node's next round, or
        # before the queue's next command: nothing is reordered against them)
        if not self.publishing:
            self.groups.holding.add(self)
        self.publishing.append((data, waiter))
        return []

    def publish_batch(self, batch, exchange: str, routing_key: str, channel: "Channel | None",
                      confirm: Confirm | None) -> list[Action]:
        """The messages of a batch publish (amqp/batch_publish.py), each proposed as
        `publish` proposes it alone: the same entry bytes in the same run. The
        entries are built from the batch in place (fifo/envelope.py
        `stamped_enqueues`); no message, header or body is made first. The confirm
        holds one reply for them all, a `RunWaiter` (groups/replicated.py): the
        last message's, or "rejected" if any was, which is the same answer as one
        per message, since the machine refuses every later seq of a publisher after
        one it refused. No actions, as `publish`."""
        groups = self.groups
        if channel is None:  # (a batch comes from a client's channel)
            return super().publish_batch(batch, exchange, routing_key, channel, confirm)
        entries = stamped_enqueues(groups.clock_ms, batch.publisher, batch.first,
                                   min(batch.properties.priority, 255), exchange,
                                   routing_key, batch.head, batch.middle, batch.tail,
                                   batch.body, batch.offsets)
        # "ok" and "duplicate" (stored by an earlier publish) are both confirmed
        waiter = (None if confirm is None
                  else RunWaiter(confirm.hold_reply("rejected"), "rejected"))
        if self.settling:  # settlements made before go first
            self.flush_settlements()
        if not self.publishing:
            groups.holding.add(self)
        self.publishing.append((entries, waiter))
        return []

    def check_consume(self, channel: "Channel", exclusive: bool) -> bool:
        if channel.global_prefetch:
            # rabbit_quorum_queue:consume refuses global QoS with not_implemented, and
            # 540 is a hard error: RabbitMQ (3.10 as 4.x) closes the connection. The 4.2
            # guide ("Global QoS") calls it "a channel error"; clients see what the
            # broker does, so this follows RabbitMQ, not the guide's wording.
            raise AMQPError(spec.NOT_IMPLEMENTED, f"queue '{self.name}' in vhost "
                            f"'{self.vhost}' does not support global qos", 60, 20)
        return False  # the exclusive flag is accepted and ignored (no consumer exclusivity)

    def consume(self, channel: "Channel", consumer: "Consumer") -> list[Action]:
        """A Checkout. No actions: its deliveries come from the apply (groups.py)."""
        key = f"{channel.quorum_identity}/{consumer.tag}"
        self.add_consumer(consumer, key)
        prefetch = NO_ACK_CREDIT if consumer.no_ack else consumer.prefetch
        self.propose(commands.Checkout(key, prefetch, consumer.priority,
                                       channel.quorum_identity), 0, must_land)
        return []

    def cancel(self, channel: "Channel", consumer: "Consumer") -> list[Action]:
        """basic.cancel: a Cancel. Its unacked messages stay settleable. A channel
        that is closing proposes none. Its Down (`channel_closed`, proposed right
        after) removes the consumer and returns its messages in one command. That is
        how rabbit_fifo handles a channel's down. With a single active consumer this
        keeps the order. The next consumer takes over with the returned messages
        first, not with what was queued behind them."""
        self.remove_consumer(consumer)
        if not self.deleted and channel.is_open:
            self.propose(commands.Cancel(f"{channel.quorum_identity}/{consumer.tag}"), 0,
                         must_land)
        return []  # what the others take, the machine's effects deliver once applied

    def basic_get(self, channel: "Channel", no_ack: bool) -> list[Action]:
        """A Dequeue. No actions now: its answer is `handle_event`'s, once applied."""
        # the channel's basic.get messages are held under a key no consumer has: a
        # consumer's key ends in its tag, never empty (an empty tag is replaced by a
        # server-named one), where "/get" was also the key of a consumer tagged "get"
        key = f"{channel.quorum_identity}/"
        self.propose(commands.Dequeue(key, no_ack, channel.quorum_identity), 0,
                     Answer(self, GetAsked(channel, key, no_ack)))
        return []

    def handle_event(self, event: Event, reply) -> list[Action]:
        """The actions a command's applied entry answers (answers.py), as
        rabbit_quorum_queue:handle_event returns them: a basic.get's (`got`), a
        purge's count, a declare-ok's counts once what came before is applied.
        `reply`: the machine's (None for a barrier, or when the queue went)."""
        match event:
            case GetAsked():
                return self.got(event.channel, event.key, event.no_ack, reply)
            case PurgeAsked():
                return [PurgeOk(event.to, reply or 0)]
            case DeclareAsked():
                return [DeclareOk(event.to, self.ready_count, self.declare_ok_consumer_count)]
            case _:
                assert_never(event)

    def got(self, channel: "Channel", key: str, no_ack: bool, reply) -> list[Action]:
        """The machine answered a basic.get (Dequeue): a `GetOk` with the message, or
        a `GetEmpty`, to `channel`. Nothing to a channel that is gone."""
        if not channel.is_open:
            return []  # the channel is gone; its Down returns an unsettled message
        if reply is None:
            return [GetEmpty(channel)]
        delivery, remaining, *message = reply
        try:
            exchange, routing_key, header, body = (
                message[0] if message  # from the leader: no replica on this node
                else self.read_message(delivery.raft_index))
        except MessageGone:
            if delivery.msg_id:  # checked out to this channel: live, never released
                raise
            # a forwarded no-ack get applied twice: the first took and settled this
            # message, and the log below it was released before the second was applied
            return [GetEmpty(channel)]
        count = delivery.delivery_count
        if count:
            header = with_delivery_count(header, count)
        return [GetOk(channel, self, QuorumToken(key, delivery.msg_id), no_ack,
                      delivery.redelivered, exchange, routing_key, remaining, header, body)]

    def deliver(self, consumer: "Consumer", key: str, delivery: commands.Delivery,
                exchange: str, routing_key: str, header: bytes, body: bytes) -> list[Action]:
        """One Deliver effect's message to this node's consumer: a `Deliver`,
        counted against the consumer's limits now (`charge`)."""
        count = delivery.delivery_count
        if count:
            header = with_delivery_count(header, count)
        consumer.charge()
        return [Deliver(consumer, self, QuorumToken(key, delivery.msg_id),
                        delivery.redelivered, exchange, routing_key, header, body)]

    def settle(self, channel: "Channel", tokens: list, requeue: bool | None) -> list[Action]:
        """One command per fifo consumer:
        - ack (requeue None) -> Settle;
        - nack/reject with requeue -> Return (delivery count + 1);
        - without requeue -> Discard.
        No actions: what the room lets through comes from the apply (groups.py)."""
        if self.deleted:
            return []
        kind = (commands.Settle if requeue is None
                else commands.Return if requeue else commands.Discard)
        if len(tokens) == 1:  # one ack (PerfTest acks each): no grouping
            token = tokens[0]
            per_key: Iterable[tuple[str, list[int]]] = ((token.key, [token.msg_id]),)
        else:
            by_key: dict[str, list[int]] = {}
            for token in tokens:
                by_key.setdefault(token.key, []).append(token.msg_id)
            per_key = by_key.items()
        # A client acking every message would otherwise make a log entry (and an
        # append, a decode and an apply on every member) per ack: what one read
        # settles becomes one command per consumer, proposed before the queue's next
        # command or at the node's next round (QuorumGroups.begin_round), so nothing
        # is reordered against this queue's other commands.
        if self.publishing:  # publishes made before go first
            self.flush_held()
        settling = self.settling
        for key, msg_ids in per_key:
            if settling and settling[-1][0] is kind and settling[-1][1] == key:
                settling[-1][2].extend(msg_ids)
            else:
                settling.append((kind, key, msg_ids))
        self.groups.holding.add(self)
        return []

    def remove_unknown_consumer(self, key: str, msg_ids: tuple[int, ...],
                                open_channel: bool) -> None:
        """The machine handed `msg_ids` to a consumer this node does not have.
        The consumer is of this node's current run. It was cancelled, or its channel
        closed. That Cancel or Down never reached the log (`must_land`). Or it is on
        its way: then this is a harmless repeat.

        Propose it (again). A Down when the channel is gone: it returns these and
        whatever the consumer held, delivery count + 1, and removes it. Else a
        Cancel: it gets nothing more, and what the client received before stays
        settleable. Then a Return of these. Returning them alone, as before, handed
        them straight back to the same consumer. As the single active consumer it
        took every message and gave it back counted, until the delivery limit
        dropped it. `open_channel`: the consumer's channel is open on this node
        (QuorumHost.has_open_channel)."""
        identity = key.partition("/")[0]
        if open_channel:
            self.propose(commands.Cancel(key), 0, must_land)
            self.propose(commands.Return(key, msg_ids), 0)
        else:
            self.propose(commands.Down(identity), 0, must_land)

    def channel_closed(self, channel: "Channel", tokens: list) -> list[Action]:
        """One Down returns everything the channel held (delivery count + 1),
        tx-buffered settlements included."""
        if not self.deleted:
            self.propose(commands.Down(channel.quorum_identity), 0, must_land)
        return []

    def capacity_freed(self) -> list[Action]:
        return []  # the machine's credit: a Settle through the log frees it

    def purge(self, to: "Asker") -> list[Action]:
        """A Purge. Its `PurgeOk` to `to` is `handle_event`'s, once applied."""
        self.propose(commands.Purge(), 0, Answer(self, PurgeAsked(to)))
        return []

    def delete(self) -> None:
        self.groups.delete(self)

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """rabbit_quorum_queue:delete refuses if-unused and if-empty (a connection
        error, in RabbitMQ 3.10 as in 4.x) rather than check them."""
        for flag, given in (("if-unused", if_unused), ("if-empty", if_empty)):
            if given:
                raise AMQPError(spec.NOT_IMPLEMENTED, f"cannot delete queue '{self.name}' in "
                                f"vhost '{self.vhost}'. queue.delete operations with {flag} "
                                "flag set are not supported by quorum queues", 50, 40)

    def declare_ok(self, to: "Asker") -> list[Action]:
        """A `DeclareOk` to `to` once what was proposed before is applied: acks,
        publishes of this burst. So the counts are those a client that already sent
        them expects. With nothing unapplied it is returned. Else it is
        `handle_event`'s once applied. With no replica here, a member counts
        (cluster/proxy.py)."""
        if self.raft is None:
            self.router.counts(self, lambda counts: carry_out([DeclareOk(
                to, counts["ready"], counts["declared"]
                if counts.get("declared") is not None else counts["consumers"])]))
            return []
        if self.raft is not None and self.has_unapplied():
            self.after_applied(Answer(self, DeclareAsked(to)))
            return []
        return [DeclareOk(to, self.ready_count, self.declare_ok_consumer_count)]

    def policy_due(self) -> bool:
        """Whether the node's tick is to compare the machine's settings with the
        policy's. That is once per term this node leads, after a restart's replay.
        A policy change compares them at once (`Node.apply_policies`)."""
        raft = self.raft
        if raft is None or self.deleted or self.replay_until or not self.is_leader \
                or self.policy_term == raft.term:
            return False
        self.policy_term = raft.term
        return True

    def policy_changed(self, policy) -> list:
        """Propose a change of the machine's settings (rabbit_fifo's update_config).
        That is when this node leads the queue, and the settings differ from what
        its arguments and `policy` give. Every member applies it at the same log
        index. Called on policy changes and on every tick (a new leader, a
        restart)."""
        if self.raft is None or not self.is_leader or self.deleted:
            return []
        wanted = quorum_config(self.arguments, policy, fifo_config(self.arguments))
        if wanted == self.state.config or wanted == self.config_proposed:
            return []
        self.config_proposed = wanted

        def applied(_reply) -> None:
            self.config_proposed = None

        self.propose(commands.UpdateConfig(wanted.delivery_limit, wanted.max_length,
                                           wanted.max_bytes, wanted.overflow,
                                           wanted.msg_ttl, wanted.expires,
                                           wanted.dead_letter_at_least_once), 0, applied)
        return []

    def check_leases(self, detail: str) -> None:
        pass  # quorum queues hold leases

    def lease_entries(self, lease: str, start: int, end: int) -> Iterable[tuple[int, int, int]]:
        from ...fifo.leases import entries

        return entries(self.state, lease, start, end)

    def lease_slice(self, lease: str, start: int, end: int) -> tuple[Any, dict[int, int]]:
        from ...fifo.leases import lease_slice

        return lease_slice(self.state, lease, start, end)

    def stats_later(self, node_name: str, done: Callable[[dict[str, Any]], None]) -> None:
        """With no replica here, the counts come from a member (as a passive declare's)."""
        row = self.stats(node_name)
        if self.raft is not None:
            done(row)
            return

        def counted(counts: dict) -> None:
            row.update(ready=counts["ready"], unacked=counts["unacked"],
                       consumers=counts["consumers"], bytes=counts["bytes"],
                       single_active_consumer_tag=counts.get("sac"),
                       messages_dlx=counts.get("messages_dlx", 0),
                       message_bytes_dlx=counts.get("message_bytes_dlx", 0))
            done(row)

        self.router.counts(self, counted)

    def member_status(self, node_name: str) -> dict[str, Any]:
        """This member's row of `queues quorum_status` (rabbitmq-queues' columns; see
        docs/behaviour/queue-commands.md): its Raft role, log and commit positions, term."""
        raft = self.raft
        snapshot = raft.log.snapshot_meta()
        return {"Node Name": node_name, "Raft State": RAFT_STATES[raft.role.value],
                "Membership": "voter", "Last Log Index": raft.log.last_index(),
                "Last Written": raft.log.persisted_index(),
                "Last Applied": raft.applied_index, "Commit Index": raft.commit_index,
                "Snapshot Index": snapshot.index if snapshot else 0, "Term": raft.term}

    def peek(self, position: int) -> list | None:
        """The ready message at `position` (1 = next delivered), as
        `rabbitmq-queues peek` shows it (queues/quorum/peeked.py). None when fewer
        are ready."""
        from ...fifo.peek import peek
        from . import peeked

        found = peek(self.state, position)
        if found is None:
            return None
        index, count = found
        return peeked.rows(*self.read_message(index), count)

    def lease_info(self, lease: str):
        return self.state.leases.get(lease)

    def leases(self) -> dict:
        return self.state.leases

    def replaying(self) -> bool:
        """This replica is still applying the log its node had when it started.
        Its state (a lease, a lease's end) may be behind what was committed before
        the restart. That lasts until a leader's commit index lets it apply the
        rest."""
        return bool(self.replay_until)

    def stats(self, node_name: str) -> dict[str, Any]:
        row = super().stats(node_name)
        if self.raft is None:  # no replica on this node
            row.update(leader=self.leader_id, members=list(self.members), group=self.group,
                       replica=False)
            return row
        row.update(bytes=self.message_bytes, leader=self.raft.leader_id,
                   members=list(self.raft.members), group=self.group,
                   commit_index=self.raft.commit_index,
                   # at-least-once dead lettering: dead letters held until every target
                   # queue confirmed them (RabbitMQ's messages_dlx, message_bytes_dlx)
                   messages_dlx=self.state.dlx.count,
                   message_bytes_dlx=self.state.dlx.bytes,
                   # replies this node waits for (confirms, gets...): (index, term) each,
                   # term None for a wait that any term's entry at the index ends
                   waiting=sorted(((index, term) for index, waiting in self.waiters.items()
                                   for term, _data, _waiter in waiting),
                                  key=lambda pair: (pair[0], -1 if pair[1] is None else pair[1])),
                   # memory: the log's entries not yet moved to segment files, and the
                   # machine's per-message state (the memory-footprint figures)
                   memtable_bytes=self.groups.store.memtable_bytes(self.group),
                   state_bytes=self.state.metadata_bytes())
        return row

    def metadata_record(self) -> dict[str, Any]:
        return {"group": self.group, "members": list(self.members)}

"""Classic queue: a FIFO with optional message priorities, on its host node. Pure, no I/O.

Responsibilities:
- ready messages, per priority level when x-max-priority is set;
- consumers in priority groups, served round-robin within their prefetch;
- counts for declare-ok, purge and delete;
- length limits: x-max-length / x-max-length-bytes, with x-overflow drop-head,
  reject-publish or reject-publish-dlx;
- message TTL and queue TTL;
- which messages die for which reason (dead lettering).

How it works: an enqueued message becomes an `Entry`: the message and a per-queue
sequence number. Delivery pops the head of the highest non-empty priority level. It
hands it to the next consumer that has capacity. The channel that owns the consumer
tracks it as unacked. A returned (requeued) entry goes back to its original
position: entries are ordered by sequence number within a level. That may take the
queue past a drop-head limit. Then the head is dropped back to it at once, as after
a publish.

As a queue type (queues/base.py): the queue object lives on its host node. Its
record is in the metadata on every node. Other nodes hold a remote.py
RemoteClassicQueue. The cluster's link serves them through this one: their
consumers are proxy consumers here. A persistent message in a durable queue is
appended to the node's message store. The publisher's confirm waits for that
batch's fsync. The queue calls no channel: each command returns its actions
(queues/actions.py): deliveries to consumers, basic.get's answer, the counts of
declare-ok and purge-ok. The caller carries them out at once. A delivery is charged
to its consumer when decided (`consumer.charge()`), so prefetch holds. An unacked
delivery's token is its `Entry`. Settling one writes an ack record for a stored
message. A stored message's first delivery that must be acked writes a delivered
record. So after a restart it comes back redelivered, as RabbitMQ's classic queues
do.

Message TTL (the TTL guide, as rabbit_amqqueue_process): a message gets its expiry
when published, `now + ttl`. The ttl is the lower of the queue's and the message's
`expiration` property. (The queue's is x-message-ttl or the policy's message-ttl,
the lower.) A later TTL change leaves queued messages' expiries alone. Expired
messages leave from the heads of the ready levels. That happens before anything is
handed out (deliver, basic.get), and after every publish. It also happens on the
node's timer (`tick`), at the moment a ready message expires
(`ClassicHost.wake_at`, queues/deadlines.py), as RabbitMQ's ttl timer. And about
twice a second besides. So an expired message is never delivered, and does not wait
for a consumer. As in RabbitMQ only heads expire. A message behind a longer-lived
one leaves when it reaches the head. TTL 0: a message is delivered if a consumer
can take it at once, else it expires at once. An unacked message does not expire;
requeued, it keeps its expiry. Expiry is `expiry <= now`. Time comes from the node
(`ClassicHost.clock_ms`); the shell sets it.

Dead lettering: a message dies for one of three reasons.
- `rejected`: basic.reject/nack without requeue.
- `expired`.
- `maxlen`: drop-head, or a publish refused by reject-publish-dlx (nacked and
  dead-lettered).
The queue hands it to `ClassicHost.dead_letter`. That publishes the copy if the
queue has a dead-letter exchange (node/dead_letters.py, shared with quorum queues).
Purge, delete and no-ack deliveries are not deaths.

Queue TTL (x-expires or the policy's expires, the lower), as RabbitMQ's classic
queues count it. The queue is unused while it has no consumer (remote ones
included). And while no basic.get or declare (redeclare, passive too) renewed it.
Once unused for the period, `tick` asks the host to delete it. (The host wakes it
then.) That is `ClassicHost.expire_queue`: through the metadata log, as every
delete. The period starts at the declaration, again when the last consumer leaves,
and after a restart.

Mirroring (behind its deprecated-feature switch): a mirrored queue's leader has a
`mirroring` (mirroring.py). It is told of every publish, first delivery and
removal. The confirm holds until every mirror has the message. `take_over` turns a
promoted mirror's copy into the queue. While the leader synchronises its mirrors,
no message goes to a consumer. basic.gets wait (`held_gets`) until `sync_ended`.

Invariants:
- `ready_count == sum(len(level) for level in levels)`.
- An entry is either ready here, or unacked on exactly one channel, or settled.
- Sequence numbers only grow.
- `unacked_count` counts the entries handed out and not yet settled or returned.
- A ready entry with `expires` at or below the clock is never handed out.

Not here: routing, AMQP framing, the store's format (storage/message_store.py), the
x-death headers and the dead-letter route (queues/dead_letter.py, node/dead_letters.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

from ..fifo.commands import expiration_ms
from ..storage.message_store import queue_key
from .actions import Action, DeclareOk, Deliver, GetEmpty, GetOk, PurgeOk
from .base import Asker, Channel, Confirm, Consumer, MessageCounts, Queue
from .message import Message
from .mirroring import desired_mirrors, ha_settings, leader_record_changed, promote
from .settings import classic_limits, classic_ttls
from .types import EQUIVALENCE_KEYS_BY_TYPE

_EXPIRATION_FLAG = 1 << 8  # the content header's expiration property is present
# x-expires: an expired queue still here this long after its deletion was proposed
# (the metadata group had no majority) is proposed for deletion again
EXPIRY_RETRY_MS = 10_000


class Entry:
    """A message's place in one queue."""

    __slots__ = ("message", "seq", "redelivered", "stored", "expires")

    def __init__(self, message: Message, seq: int, stored: bool, redelivered: bool = False,
                 expires: int = 0) -> None:
        self.message = message
        self.seq = seq
        self.stored = stored  # written to the message store (durable queue, persistent)
        self.redelivered = redelivered
        self.expires = expires  # wall-clock ms it expires at (0: never)


class ClassicHost(Protocol):
    """What a classic queue asks of the node that holds it (node/node.py)."""

    clock_ms: int  # wall-clock milliseconds, as the shell last passed them in

    def dead_letter(self, queue: "ClassicQueue", message: Message, reason: str) -> None:
        """`message` died here for `reason`: publish its dead-lettered copy (or not:
        no dead-letter exchange)."""

    def expire_queue(self, queue: "ClassicQueue") -> None:
        """The queue was unused for its x-expires period: delete it."""

    def wake_at(self, queue: "ClassicQueue", ms: int) -> None:
        """Run `queue.tick` once the clock reaches `ms` (something of it expires)."""

    @property
    def mirror_link(self) -> Any:
        """How a mirrored queue's leader reaches its mirrors (mirroring.MirrorLink)."""


@dataclass(slots=True, eq=False)
class ClassicQueue(Queue):
    vhost: str
    name: str
    durable: bool
    exclusive_owner: str | None  # the owning connection's identity (exclusive queues)
    auto_delete: bool
    arguments: dict
    max_priority: int = 0
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    single_active_consumer: bool = False
    message_ttl: int | None = None  # ms (x-message-ttl / policy message-ttl)
    expires: int | None = None      # ms (x-expires / policy expires)
    levels: list[deque] = field(default_factory=list)
    ready_count: int = 0
    ready_bytes: int = 0
    unacked_count: int = 0
    next_seq: int = 1
    consumers: list = field(default_factory=list)  # Consumer, sorted by priority desc
    had_consumers: bool = False
    exclusive_consumer: Any | None = None
    _rotation: int = 0
    _arrivals: list = field(default_factory=list)  # consumers in registration order
    deleted: bool = False
    store: Any = None  # the node's MessageStore (None: nothing is persisted)
    group: str = ""    # the metadata record's uid (queue.delete names it)
    host: str = ""     # this node: the one holding the queue
    node: ClassicHost | None = None  # the clock, dead letters, queue expiry (None: no
    #                                  clock, no dead lettering: unit tests of the FIFO)
    expiring: bool = False  # some entry ever had an expiry (else no head is checked)
    last_used_ms: int = 0   # x-expires: when the queue was last used (0: not yet known)
    expiry_asked_ms: int = 0  # x-expires: when the host was last asked to delete it
    message_counts: MessageCounts = field(default_factory=MessageCounts, repr=False)
    # classic queue mirroring (mirroring.py): the record's ordered mirrors (None: not
    # mirrored), which of them are synchronised, and the leader's replication state
    mirrors: tuple | None = None
    synced: tuple = ()
    stopped: tuple = ()  # mirrors whose node announced its shutdown, oldest first
    mirroring: Any = None
    held_gets: list = field(default_factory=list)  # (channel, no_ack) during a sync

    type_name = "classic"
    EQUIVALENCE_KEYS = EQUIVALENCE_KEYS_BY_TYPE["classic"]
    REPLICATED = False
    POLICY_ON_TICK = False  # its limits change at once, on the policy change
    TICKS = True            # expiry of heads and of the queue itself (`tick`)

    @staticmethod
    def place(vhost: str, name: str, arguments: dict, policy, settings, cluster,
              exclusive: bool = False) -> dict:
        """The record of a new queue: its uid and its host.

        The host is the declaring node (client-local). With queue-leader-locator
        "balanced", it is the node hosting the fewest classic queues (RabbitMQ's
        guides, "Queue Leader Location"). With the classic-queue-mirroring switch on,
        RabbitMQ 3.13's locators apply, as its mirroring guide gives them.
        "min-masters" is the running node hosting the fewest. "random" is a running
        node at random. (settings.leader_locator: the configuration's
        `queue_master_locator`, where `queue_leader_locator` is left at
        client-local.) Exclusive queues always live on the declaring connection's
        node (the queues guide, "Exclusive Queues"). A queue an ha-* policy mirrors
        has its mirrors from the start (mirroring.py). An exclusive one never does."""
        from .quorum.queue import group_uid
        from .settings import leader_locator

        permit = settings.permit_classic_queue_mirroring
        configured = settings.queue_leader_locator
        if permit and configured == "client-local":  # 3.13's queue_master_locator
            configured = settings.queue_master_locator or configured
        locator = leader_locator(arguments, policy, configured, classic_mirroring=permit)
        if exclusive or locator == "client-local":
            host = cluster.name
        elif locator == "random":  # 3.13 with mirroring: any running node
            host = cluster.random_running()
        else:  # balanced; 3.13's min-masters: among the running nodes
            host = cluster.least_hosting(running_only=locator == "min-masters")
        record = {"group": group_uid(vhost, name), "host": host}
        mirroring = ha_settings(policy) if permit and not exclusive else None
        if mirroring is not None:  # mirrored from its declaration; empty: synchronised
            down = [n for n in cluster.nodes if not cluster.reachable(n)]
            mirrors = list(desired_mirrors(mirroring, host, cluster.nodes, down, ()))
            record.update(mirrors=mirrors, synced=mirrors)
        return record

    def __post_init__(self) -> None:
        self.levels = [deque() for _ in range(self.max_priority + 1)]
        if self.node is not None:  # x-expires counts from the declaration (0: from
            self.last_used_ms = self.node.clock_ms  # the first tick, the clock unknown)

    # ------------------------------------------------------------ messages

    def make_entry(self, message: Message, stored: bool, expires: int = 0) -> Entry:
        entry = Entry(message, self.next_seq, stored, expires=expires)
        self.next_seq += 1
        if expires:
            self.expiring = True
        return entry

    # ------------------------------------------------------------ time

    @property
    def now_ms(self) -> int:
        return self.node.clock_ms if self.node is not None else 0

    def expiry_of(self, message: Message, now: int) -> int:
        """When a message published at `now` expires (0: never). It is now + the
        lower of the queue's message TTL and the message's expiration. At least 1, so
        a TTL of 0 at time 0 still expires."""
        ttl = self.message_ttl
        own = (expiration_ms(message.properties.raw)
               if message.properties.flags & _EXPIRATION_FLAG else None)
        if own is not None:
            ttl = own if ttl is None else min(ttl, own)
        return 0 if ttl is None else max(1, now + ttl)

    def expire_heads(self, now: int, spare: Entry | None = None) -> int:
        """Remove expired entries from the heads of the ready levels (dead letters,
        reason expired). All but `spare`: a message being published, which a consumer
        may take at once even with a TTL of 0. Returns how many."""
        if not self.expiring or not self.ready_count or not now:
            return 0
        count = 0
        for level in self.levels:
            while (level and level[0] is not spare and level[0].expires
                   and level[0].expires <= now):
                entry = level.popleft()
                self.ready_count -= 1
                self.ready_bytes -= entry.message.size
                self._forget(entry)
                self._died(entry.message, "expired")
                count += 1
        return count

    def touch(self, now: int | None = None) -> None:
        """The queue was used (x-expires): a consumer, a basic.get, a declare."""
        self.last_used_ms = self.now_ms if now is None else now
        if self.expires is not None and self.node is not None and self.last_used_ms:
            self.node.wake_at(self, self.last_used_ms + self.expires)

    def tick(self, now_ms: int) -> None:
        """The node's timer: expired heads leave. An unused queue past its x-expires
        period is handed to the host for deletion. That is tried again after
        EXPIRY_RETRY_MS if it still exists: the metadata log could not delete it
        then."""
        if self.deleted:
            return
        self.expire_heads(now_ms)
        self._expire_unused(now_ms)
        if self.node is not None and not self.deleted:
            wake = self.next_deadline()
            if wake:
                self.node.wake_at(self, wake)

    def _expire_unused(self, now_ms: int) -> None:
        if (self.expires is None or self.consumers or not now_ms
                or (self.expiry_asked_ms and now_ms - self.expiry_asked_ms < EXPIRY_RETRY_MS)):
            return
        if not self.last_used_ms:
            self.last_used_ms = now_ms  # a new or recovered queue: the period starts
            return
        if now_ms - self.last_used_ms >= self.expires and self.node is not None:
            self.expiry_asked_ms = now_ms
            self.node.expire_queue(self)

    def next_deadline(self) -> int:
        """When `tick` next has something to do (0: nothing timed). That is the
        earliest expiry among the ready heads, or the end of the x-expires period
        while unused."""
        deadlines = [level[0].expires for level in self.levels
                     if level and level[0].expires] if self.expiring else []
        if self.expires is not None and not self.consumers and self.last_used_ms:
            deadlines.append(self.expiry_asked_ms + EXPIRY_RETRY_MS if self.expiry_asked_ms
                             else self.last_used_ms + self.expires)
        return min(deadlines) if deadlines else 0

    def _died(self, message: Message, reason: str) -> None:
        if self.node is not None and not self.deleted:
            self.node.dead_letter(self, message, reason)

    # ------------------------------------------------------------ limits

    def would_overflow(self, message: Message) -> bool:
        """True when reject-publish (or reject-publish-dlx) must refuse this message."""
        if self.overflow == "drop-head":
            return False
        if self.max_length is not None and self.ready_count >= self.max_length:
            return True
        return (self.max_length_bytes is not None
                and self.ready_bytes + message.size > self.max_length_bytes)

    def push(self, entry: Entry) -> list[Entry]:
        """Append a ready entry; returns entries dropped from the head by drop-head."""
        level = min(entry.message.priority, self.max_priority) if self.max_priority else 0
        self.levels[level].append(entry)
        self.ready_count += 1
        self.ready_bytes += entry.message.size
        if entry.expires and self.node is not None:
            self.node.wake_at(self, entry.expires)
        dropped = []
        while self.ready_count and self._over_limit():
            dropped.append(self.pop())
        return dropped

    def enforce_limits(self) -> list[Entry]:
        """After the limits changed (a policy). Drop-head drops ready entries from
        the head until within them, and returns them. Reject-publish keeps what it has,
        and refuses publishes until below."""
        dropped = []
        if self.overflow == "drop-head":
            while self.ready_count and self._over_limit():
                dropped.append(self.pop())
        return dropped

    def _over_limit(self) -> bool:
        return ((self.max_length is not None and self.ready_count > self.max_length)
                or (self.max_length_bytes is not None
                    and self.ready_bytes > self.max_length_bytes))

    def pop(self) -> Entry | None:
        if not self.ready_count:
            return None
        levels = self.levels
        for index in range(len(levels) - 1, -1, -1):
            if levels[index]:
                entry = levels[index].popleft()
                self.ready_count -= 1
                self.ready_bytes -= entry.message.size
                return entry
        raise AssertionError("ready_count out of sync with levels")

    def requeue(self, entry: Entry) -> None:
        """Put a returned entry back at its original position, marked redelivered."""
        entry.redelivered = True
        level_index = min(entry.message.priority, self.max_priority) if self.max_priority else 0
        level = self.levels[level_index]
        position = 0
        for queued in level:  # returned entries are usually older than all ready ones
            if queued.seq > entry.seq:
                break
            position += 1
        level.insert(position, entry)
        self.ready_count += 1
        self.ready_bytes += entry.message.size
        if entry.expires and self.node is not None:
            self.node.wake_at(self, entry.expires)

    def ready_entries(self) -> Iterator[Entry]:
        for level in reversed(self.levels):
            yield from level

    # ------------------------------------------------------------ consumers

    @property
    def active_consumer(self) -> "Consumer | None":
        """With x-single-active-consumer: the earliest registered consumer."""
        return self._arrivals[0] if self._arrivals else None

    @property
    def single_active_consumer_tag(self) -> str | None:
        active = self.active_consumer if self.single_active_consumer else None
        return active.tag if active is not None else None

    def add_consumer(self, consumer: "Consumer") -> None:
        self._arrivals.append(consumer)
        self.consumers.append(consumer)
        # stable sort keeps arrival order within a priority
        self.consumers.sort(key=lambda c: -c.priority)
        self.had_consumers = True
        if consumer.exclusive:
            self.exclusive_consumer = consumer

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def next_consumer(self) -> "Consumer | None":
        """The consumer the next message goes to: the highest priority group with
        capacity, round-robin within the group."""
        consumers = self.consumers
        if self.single_active_consumer:
            active = self.active_consumer
            return active if active is not None and active.has_capacity() else None
        count = len(consumers)
        start = 0
        while start < count:
            priority = consumers[start].priority
            end = start
            while end < count and consumers[end].priority == priority:
                end += 1
            size = end - start
            offset = self._rotation % size
            for step in range(size):
                candidate = consumers[start + (offset + step) % size]
                if candidate.has_capacity():
                    self._rotation = offset + step + 1
                    return candidate
            start = end
        return None

    def is_unused_for_auto_delete(self) -> bool:
        return self.auto_delete and self.had_consumers and not self.consumers

    # ------------------------------------------------------------ the queue type

    def equivalence_arguments(self, arguments: dict) -> tuple[dict, dict]:
        """x-queue-type: classic is the default, so declaring it or not is equivalent."""
        return _without_default_type(arguments), _without_default_type(self.arguments)

    def publish(self, message: Message, channel: "Channel | None",
                confirm: Confirm | None) -> list[Action]:
        if self.would_overflow(message):  # reject-publish(-dlx): nacked
            if confirm is not None:
                confirm.refuse()
            if self.overflow == "reject-publish-dlx":
                self._died(message, "maxlen")
            return []
        expires = (self.expiry_of(message, self.now_ms) if self.message_ttl is not None
                   or message.properties.flags & _EXPIRATION_FLAG else 0)
        stored = self.durable and message.persistent and self.store is not None
        entry = self.make_entry(message, stored, expires)
        if stored:
            batch_id = self.store.append_enqueue(
                queue_key(self.vhost, self.name), entry.seq, message.exchange,
                message.routing_key, message.properties.raw, message.body, expires,
                message.properties.blind_keys)
            if confirm is not None:
                confirm.after_batch(batch_id)
        if self.mirroring is not None:  # every mirror gets it; the confirm waits for all
            self.mirroring.published(entry, None if confirm is None else confirm.hold)
        for dropped in self.push(entry):
            self._forget(dropped)
            self._died(dropped.message, "maxlen")
        actions = self.deliver(entry) if self.consumers else []
        if expires:  # TTL 0: not taken at once, it expires now
            self.expire_heads(self.now_ms)
        return actions

    def deliver(self, fresh: Entry | None = None) -> list[Action]:
        """Hand ready messages to consumers with capacity: the `Deliver` actions.
        Expired heads leave first. `fresh`, the message being published, may go
        out whatever its TTL. Each delivery is charged to its consumer at once, so
        the next `has_capacity` counts it."""
        actions: list[Action] = []
        if self.mirroring is not None and self.mirroring.syncing is not None:
            return actions  # synchronising its mirrors: deliveries wait (sync_ended)
        now = self.now_ms if self.expiring else 0
        while self.ready_count:
            if self.expiring and self.expire_heads(now, fresh) and not self.ready_count:
                break
            consumer = self.next_consumer()
            if consumer is None:
                break
            entry = self.pop()
            self.unacked_count += 1
            message = entry.message
            consumer.charge()
            actions.append(Deliver(consumer, self, entry, entry.redelivered,
                                   message.exchange, message.routing_key,
                                   message.properties.raw, message.body))
            if consumer.no_ack:
                self._settled(entry)
            elif not entry.redelivered:
                self._first_delivery(entry)
        return actions

    def consume(self, channel: "Channel", consumer: "Consumer") -> list[Action]:
        self.add_consumer(consumer)
        return self.deliver()

    def cancel(self, channel: "Channel", consumer: "Consumer") -> list[Action]:
        """basic.cancel: the consumer goes. What it no longer takes goes to the others:
        a single active consumer's successor takes the ready messages at once, as
        rabbit_amqqueue_process runs the queue after a cancel. A channel closing
        delivers nothing yet: `channel_closed` first returns what it held, which then
        goes out in queue order. (`channel` None: another node's consumer,
        cluster/classic_link.py.)"""
        self.remove_consumer(consumer)
        if self.deleted or (channel is not None and not channel.is_open):
            return []
        return self.deliver()

    def remove_consumer(self, consumer: "Consumer") -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            self._arrivals.remove(consumer)
            if not self.consumers:
                self.touch()  # x-expires counts from the last consumer's leaving
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None

    def declare_ok(self, to: "Asker") -> list[Action]:
        """The declare-ok's counts, to `to`. A declare (or redeclare, passive too)
        renews x-expires, as in RabbitMQ."""
        self.touch()
        self.expire_heads(self.now_ms)
        return [DeclareOk(to, self.ready_count, self.consumer_count)]

    def basic_get(self, channel: "Channel", no_ack: bool) -> list[Action]:
        """A `GetOk` or `GetEmpty` to `channel`. None yet while the mirrors
        synchronise: `sync_ended` returns it."""
        if self.mirroring is not None and self.mirroring.syncing is not None:
            self.held_gets.append((channel, no_ack))  # answered when the sync ends
            return []
        now = self.now_ms
        self.touch(now)
        self.expire_heads(now)
        entry = self.pop()
        if entry is None:
            return [GetEmpty(channel)]
        self.unacked_count += 1
        message = entry.message
        answer = GetOk(channel, self, entry, no_ack, entry.redelivered, message.exchange,
                       message.routing_key, self.ready_count, message.properties.raw,
                       message.body)
        if no_ack:
            self._settled(entry)
        elif not entry.redelivered:
            self._first_delivery(entry)
        return [answer]

    def settle(self, channel: "Channel", tokens: list, requeue: bool | None) -> list[Action]:
        for entry in tokens:
            if requeue:
                self.unacked_count -= 1
                if not self.deleted:
                    self.requeue(entry)
            else:
                self._settled(entry)
                if requeue is False:  # reject / nack without requeue
                    self._died(entry.message, "rejected")
        if requeue and not self.deleted:
            # what came back may take the queue past its limit: drop-head drops from
            # the head back to it at once (rabbit_amqqueue_process:requeue_and_run)
            for dropped in self.enforce_limits():
                self._forget(dropped)
                self._died(dropped.message, "maxlen")
            return self.deliver()
        return []

    def channel_closed(self, channel: "Channel", tokens: list) -> list[Action]:
        """What the channel held comes back; its consumers went (`cancel`): the ready
        messages go to those left."""
        if tokens:
            return self.settle(channel, tokens, True)
        return [] if self.deleted else self.deliver()

    def capacity_freed(self) -> list[Action]:
        return [] if self.deleted else self.deliver()

    def take_ready(self) -> list[Entry]:
        """Remove and return every ready entry (the pure FIFO operation)."""
        purged = [entry for level in self.levels for entry in level]
        for level in self.levels:
            level.clear()
        self.ready_count = 0
        self.ready_bytes = 0
        return purged

    def purge(self, to: "Asker") -> list[Action]:
        """Drop the ready messages (unacked ones survive a purge): a `PurgeOk` with
        their count, to `to`."""
        purged = self.take_ready()
        for entry in purged:
            self._forget(entry)
        return [PurgeOk(to, len(purged))]

    def gone_after_restart(self, node_name: str, boot_id: str) -> bool:
        return not self.durable or (self.exclusive_owner is not None
                                    and not self.exclusive_owner.startswith(boot_id + "."))

    def metadata_record(self) -> dict[str, Any]:
        record = {"group": self.group, "host": self.host,
                  "exclusive_owner": self.exclusive_owner}
        if self.mirrors is not None:
            record.update(mirrors=list(self.mirrors), synced=list(self.synced))
            if self.stopped:
                record["stopped"] = list(self.stopped)
        return record

    # ------------------------------------------------------------ mirroring

    def record_changed(self, record: dict) -> bool:
        """A new record: still the leader here, the mirrors change in place
        (mirroring.leader_record_changed); another leader: False (rebuilt)."""
        return leader_record_changed(self, record)

    def sync_ended(self) -> list[Action]:
        """The mirrors' synchronisation finished or was cancelled: the gets that
        waited are answered, deliveries resume (the actions, for the mirror link to
        carry out)."""
        held, self.held_gets = self.held_gets, []
        actions: list[Action] = []
        for channel, no_ack in held:
            if getattr(channel, "is_open", True):  # (a remote one's reply: always)
                if self.deleted:
                    actions.append(GetEmpty(channel))
                else:
                    actions += self.basic_get(channel, no_ack)
        if not self.deleted:
            actions += self.deliver()
        return actions

    @property
    def sync_progress(self) -> int | None:
        """Messages sent so far by the synchronisation in progress (None: none)."""
        syncing = self.mirroring.syncing if self.mirroring is not None else None
        return None if syncing is None else syncing.sent

    def take_over(self, previous: Queue) -> None:
        """Promoted from mirror to leader: mirroring.promote."""
        promote(self, previous)

    def delete(self) -> None:
        self.deleted = True
        if self.mirroring is not None:
            self.mirroring.stop()
        self.take_ready()
        if self.store is not None and self.durable:
            self.store.append_delete(queue_key(self.vhost, self.name))

    def policy_changed(self, policy) -> list:
        """New limits and TTLs. Drop-head drops (dead letters, maxlen) what is over a
        new limit at once. A new message TTL applies to messages published from now
        on. (RabbitMQ's classic queues keep each message's expiry.)"""
        self.max_length, self.max_length_bytes, self.overflow = classic_limits(
            self.arguments, policy)
        self.message_ttl, self.expires = classic_ttls(self.arguments, policy)
        if self.mirroring is not None:
            self.mirroring.settings = ha_settings(policy)
        dropped = self.enforce_limits()
        for entry in dropped:
            self._forget(entry)
            self._died(entry.message, "maxlen")
        return dropped

    def recover_stored(self, items) -> int:
        """The message store's records of this queue after a restart, in order."""
        from ..amqp.codec import decode_properties

        for item in items:
            _class_id, properties = decode_properties(item.header)
            properties.blind_keys = item.blind_keys
            message = Message(item.exchange, item.routing_key, properties, item.body)
            self.next_seq = max(self.next_seq, item.seq + 1)
            if item.expires:
                self.expiring = True
            entry = Entry(message, item.seq, stored=True, redelivered=item.delivered,
                          expires=item.expires)
            self.push(entry)
            if self.mirroring is not None:
                self.mirroring.recovered(entry)
        return len(items)

    def _settled(self, entry: Entry) -> None:
        """An unacked delivery is done with (acked, or rejected without requeue)."""
        self.unacked_count -= 1
        self._forget(entry)

    def _first_delivery(self, entry: Entry) -> None:
        """An entry's first delivery that must be acked. It is recorded in the store
        (a stored one), and on the mirrors (redelivered if a mirror takes over)."""
        if entry.stored:
            self._record_delivery(entry)
        if self.mirroring is not None:
            self.mirroring.delivered(entry)

    def _record_delivery(self, entry: Entry) -> None:
        """A stored entry's first delivery that must be acked: the store records it.
        Once: a later delivery is of a redelivered entry."""
        if not self.deleted and self.store is not None:
            self.store.append_delivered(queue_key(self.vhost, self.name), entry.seq)

    def _forget(self, entry: Entry) -> None:
        if entry.stored and not self.deleted and self.store is not None:
            self.store.append_ack(queue_key(self.vhost, self.name), entry.seq)
        if self.mirroring is not None and not self.deleted:
            self.mirroring.removed(entry)


def _without_default_type(arguments: dict) -> dict:
    return {k: v for k, v in arguments.items()
            if not (k == "x-queue-type" and _text(v) == "classic")}


def _text(value) -> str | None:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value

"""What every queue type implements: the one interface the node and the channels call.

RabbitMQ's `rabbit_queue_type` behaviour is the model. A queue type is a class in
this package, built by `registry.py`. The types are `classic.py`, `remote.py`
(a classic queue hosted on another node) and `quorum/`. `mirroring.py` gives a
classic queue its mirrors. The channel, the method handlers and the node hold a
`Queue` and call these methods. They never ask which type it is. A new type is a
new module here, not edits across the node.

The operations, and what each owes its caller. An operation may return a list of
actions (queues/actions.py: deliver, get-ok, get-empty, declare-ok, purge-ok), which
the caller carries out at once, in order (`actions.carry_out`). No type calls a
channel. A quorum queue answers most commands once its log applied them: its
driver (quorum/groups.py) carries out what applied entries return, and a command's
answer is what its `handle_event` returns for the data its waiter holds
(quorum/answers.py). A remote queue's host answers later: its link
(cluster/classic_link.py) carries out the answer's actions.
- `publish(message, channel, confirm)`: take one routed message. With a `Confirm`
  (publisher confirms), the queue says what the confirm waits for. That is one of:
  a message-store batch (`confirm.after_batch`); an answer later (`confirm.hold()`
  returns the callback to call with True/False; `confirm.hold_reply(refused)`
  returns one to call with a reply, a nack when it equals `refused`); a refusal
  now (`confirm.refuse()`). Returns the deliveries it made, if any.
- `consume(channel, consumer)` / `cancel(channel, consumer)`: an AMQP consumer on
  this node starts or stops. Deliveries are `Deliver` actions (classic: to the
  new consumer, or to the others once one went), or `DeliverBatch` actions once
  the log applied them (quorum).
- `check_consume(channel, exclusive)`: what the type refuses at basic.consume
  (global QoS on quorum queues). Also whether the consumer is exclusive.
- `basic_get(channel, no_ack)`: answer a basic.get: a `GetOk` or `GetEmpty`
  action to `channel` (classic; it may be returned by a later operation), or
  returned by `handle_event` once the queue's log applied it (quorum).
- `settle(channel, tokens, requeue)`: the channel's unacked deliveries of this
  queue are acked (requeue None), or nacked/rejected (requeue True/False). The
  tokens are those of the queue's deliveries.
- `channel_closed(channel, tokens)`: the channel is gone. Its unacked deliveries
  (tokens, possibly none) come back.
- `capacity_freed()`: a consumer of this queue may take more (acks freed prefetch).
- `purge(to)`, `delete()`: a `PurgeOk` to `to` (an `Asker`; classic at once;
  quorum and remote: carried out once applied or answered). Or a `Refused` with an
  AMQPError, when the queue's host could not be asked.
  Delete drops the queue's messages and resources. (The node has cancelled its
  consumers.)
- `check_delete(if_unused, if_empty)`: what queue.delete refuses. It uses the
  counts `refresh(done)` made current: a queue hosted elsewhere asks its host.
- `declare_ok(to)`: a `DeclareOk` to `to` (classic; quorum, when nothing waits to
  be applied), else one carried out once the counts are known. Those are the
  counts a client that already sent its publishes and acks expects.
- `policy_changed(policy)`: settings from policies. Some types' settings go
  through a log (`POLICY_ON_TICK`). They are applied again from the tick when
  `policy_due()`: a new leader catches up.
- `tick(now_ms)`: the node's timer, with the wall clock. Classic queues expire
  messages and themselves here. Quorum queues do it through their log
  (queues/quorum/groups.py).
- Lease ranges: `check_leases(detail)`, `lease_entries(lease, start, end)`,
  `lease_slice(lease, start, end)`, `read_message(index)`,
  `read_message_spans(indexes)`, `read_entries(indexes)`. Quorum queues only; the
  others refuse with 406 and `detail`.
- `recover_stored(items)`: messages the node's message store kept (classic queues).
- `stats()`, `stats_later(done)`: the queue's line in `queues list`. Later: with
  the counts of the node that serves the queue. The active consumer's tag of a
  single-active-consumer queue is included (`single_active_consumer_tag`).
- `metadata_record()`: what the metadata file keeps beyond name, type and
  arguments.
- `message_counts`, `message_stats()`: what this node's clients did with the
  queue, as RabbitMQ's per-queue `message_stats`. That is messages published to it,
  delivered and got from it, redelivered, acked. The node's channels and publish
  path add to them. They count since the queue was declared or the node started.
  The management API sums every node's (management/rates.py), as RabbitMQ's plugin
  does.
- `record_changed(record)`, `take_over(previous)`: the queue's metadata record
  changed. An example is a mirrored classic queue's mirrors or leader
  (mirroring.py). False when the node must build the queue anew from the record:
  another node serves it now. Then the new queue takes over from the old one (a
  promoted mirror's copy).
- `served_here`: this node serves the queue: a classic queue's host, a quorum
  queue's leader. So its counts here are the queue's own. This node reports them
  in the Prometheus metrics, as RabbitMQ's queue metrics come from the queue's
  process.

Counts (`ready_count`, `unacked_count`, `consumer_count`, `ready_bytes`,
`message_bytes`) are properties or fields of every type. `unacked_bytes` is one of
the types that count it (None elsewhere).

Not here: routing (routing/, node/vhost.py), AMQP framing (amqp/, channel).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterable, Protocol

from ..amqp.channel import ChannelState
from ..amqp.errors import AMQPError, precondition
from .message import Message


class Consumer(Protocol):
    """An AMQP consumer on this node, as a queue sees it (node/channel.py implements
    it)."""

    channel: "Channel"
    tag: str
    no_ack: bool
    exclusive: bool
    priority: int
    prefetch: int    # 0: unlimited

    def has_capacity(self) -> bool:
        """It may take another delivery now (prefetch, flow, channel open)."""

    def charge(self) -> None:
        """A delivery to it is decided (a `Deliver` action): count it against its
        limits now, before the next `has_capacity` (as rabbit_limiter counts a
        delivery it allows)."""


class Asker(Protocol):
    """Who asked a queue for declare-ok's counts or a purge: a method handler
    (node/handlers.py), the management API, another node's request
    (cluster/classic_link.py). A queue names it in the answer's action
    (`DeclareOk`, `PurgeOk`, `Refused`) and never calls it; `actions.carry_out`
    does. An asker answers what it asks."""

    def declare_ok(self, ready: int, consumers: int) -> None:
        """queue.declare-ok's counts."""

    def purge_ok(self, count: int) -> None:
        """The purge dropped `count` ready messages."""

    def refused(self, error: AMQPError) -> None:
        """What it asked failed: the queue's host could not be asked."""


class Channel(Protocol):
    """The AMQP channel a queue serves (node/channel.py implements it):
    deliveries and basic.get's answers. `actions.carry_out` calls them; no queue
    type does. (Its confirms' answers are data: `Confirm`.)"""

    state: ChannelState
    global_prefetch: int

    @property
    def is_open(self) -> bool:
        """The channel takes deliveries."""

    @property
    def quorum_identity(self) -> str:
        """Who the channel is to a fifo machine (its Down returns its messages)."""

    def deliver(self, consumer: Consumer, queue: "Queue", token, redelivered: bool,
                exchange: str, routing_key: str, header: bytes, body: bytes,
                charged: bool = False) -> None:
        """basic.deliver of one message; `token` comes back when it is settled.
        `charged`: `consumer.charge()` already counted it (a `Deliver` action)."""

    def deliver_batch(self, consumer: Consumer, queue: "Queue", tokens: list,
                      messages: list) -> None:
        """`deliver` of each of `messages`, as one run of frames."""

    def get_ok(self, queue: "Queue", token, no_ack: bool, redelivered: bool,
               exchange: str, routing_key: str, remaining: int, header: bytes,
               body: bytes) -> None:
        """basic.get-ok with one message."""

    def get_empty(self) -> None:
        """basic.get-empty."""

    def refused(self, error: AMQPError) -> None:
        """Its basic.get failed (the queue's host could not be asked): a channel
        error, once what it sent before is answered."""


class Confirm:
    """The publisher confirm one publish owes: it leaves once the message-store batch
    it waits for is fsynced and every queue that answers later has answered; it is a
    nack if any queue refused the message.

    A transaction's publishes owe the same wait without a basic.ack: their confirms
    have seq 0 (nothing is sent for them), and the tx.commit-ok that follows them in
    the channel's queue of confirms is `reply`, sent once everything before it left.

    How it works: an answer is data. It counts down `outstanding` and puts the
    confirm's channel in `answered`, the set its maker gave (node/channel.py: the
    node's `answered_confirms`); the node sends what is due on those channels after
    its round (node/group_commit.py `end_sync`). No answer calls the channel.

    Invariant: `outstanding` counts the holds not yet answered; each hold's callback
    is called exactly once. A subclass that answers differently overrides `_answer`
    alone: `hold_reply`'s callback then goes through it (`__init_subclass__`)."""

    __slots__ = ("seq", "batch_id", "ok", "outstanding", "channel", "answered", "reply",
                 "refused")

    def __init__(self, channel: "Channel | None", seq: int, answered: "set[Channel] | None",
                 reply: bytes | None = None) -> None:
        self.channel = channel  # who sends it (an addressee, never called)
        self.answered = answered  # where an answer puts `channel` (None: a subclass's)
        self.seq = seq          # 0: a transaction's publish, or the commit-ok (`reply`)
        self.reply = reply      # a frame to send when released (tx.commit-ok)
        self.batch_id = 0       # the message-store batch to wait for (0: none)
        self.ok = True
        self.outstanding = 0    # queues that answer later

    def after_batch(self, batch_id: int) -> None:
        if batch_id > self.batch_id:
            self.batch_id = batch_id

    def refuse(self) -> None:
        self.ok = False

    def hold(self) -> Callable[[bool], None]:
        """A queue will answer later: call the returned function with whether it
        took the message."""
        self.outstanding += 1
        return self._answer

    def _answer(self, accepted: bool) -> None:
        self.outstanding -= 1
        if not accepted:
            self.ok = False
        self.answered.add(self.channel)

    def hold_reply(self, refused: object) -> Callable[[object], None]:
        """`hold()` for a queue that answers with a reply (a quorum queue's machine
        reply): call the returned function with it; the confirm is a nack if it
        equals `refused`. (One call per publish fewer than wrapping `hold()`'s
        callback in a function of the queue's.)"""
        self.outstanding += 1
        self.refused = refused
        return self._reply

    def _reply(self, reply: object) -> None:
        # twin of `_answer(reply != self.refused)`: keep in step; a subclass that
        # overrides `_answer` gets `_reply_through_answer` instead (below)
        self.outstanding -= 1
        if reply == self.refused:
            self.ok = False
        self.answered.add(self.channel)

    def _reply_through_answer(self, reply: object) -> None:
        self._answer(reply != self.refused)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_answer" in cls.__dict__ and "_reply" not in cls.__dict__:
            cls._reply = Confirm._reply_through_answer  # its _answer is the one answer


class MessageCounts:
    """One queue's message counters on this node (RabbitMQ's per-queue message_stats):
    plain ints the publish path and the channels add to."""

    __slots__ = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "redeliver",
                 "ack")

    def __init__(self) -> None:
        self.publish = 0          # routed to the queue by a basic.publish here
        self.deliver = 0          # basic.deliver to a consumer that acks
        self.deliver_no_ack = 0   # basic.deliver to a no-ack consumer
        self.get = 0              # basic.get-ok, no_ack=false
        self.get_no_ack = 0       # basic.get-ok, no_ack=true
        self.redeliver = 0        # deliveries and get-oks with redelivered set
        self.ack = 0              # deliveries settled by basic.ack

    def as_row(self) -> list[int]:
        """The counts in `__slots__` order: what a node tells the node answering a
        management request (cluster/replica_rpc.py "message_stats")."""
        return [self.publish, self.deliver, self.deliver_no_ack, self.get,
                self.get_no_ack, self.redeliver, self.ack]

    def add_row(self, row: list[int]) -> None:
        """Add another node's counts of the queue (an `as_row` list)."""
        for field, count in zip(self.__slots__, row):
            setattr(self, field, getattr(self, field) + count)

    def as_dict(self) -> dict[str, int]:
        """RabbitMQ's message_stats counts (deliver_get: every delivery and get)."""
        return {"publish": self.publish, "deliver": self.deliver,
                "deliver_no_ack": self.deliver_no_ack, "get": self.get,
                "get_no_ack": self.get_no_ack,
                "deliver_get": self.deliver + self.deliver_no_ack + self.get
                + self.get_no_ack,
                "redeliver": self.redeliver, "ack": self.ack}


class Queue:
    """The interface (see the module header). Subclasses set `type_name` and
    `EQUIVALENCE_KEYS` and implement the operations. Every queue is declared, deleted
    and bound through the cluster's metadata group (a node is a cluster of one): a
    type's `place(vhost, name, arguments, policy, settings, cluster, exclusive)`
    gives the fields of a new queue's record."""

    type_name: ClassVar[str]
    # arguments compared when a queue is declared again (RabbitMQ's per-type list)
    EQUIVALENCE_KEYS: ClassVar[tuple[str, ...]]
    # has replicas on several nodes (`members`, a Raft group): replica management
    # (add_member, grow, shrink, rebalance, continuous reconciliation) applies
    REPLICATED: ClassVar[bool]
    # policy_changed is called from the tick too, when the queue's `policy_due()`
    # (settings applied through a log, which a new leader or a restart catches up with)
    POLICY_ON_TICK: ClassVar[bool]
    # does `tick` do anything (Node.tick_queues visits only those that do)?
    TICKS: ClassVar[bool] = False

    vhost: str
    name: str
    group: str          # the metadata record's uid (a quorum queue's Raft group)
    durable: bool
    auto_delete: bool
    exclusive_owner: Any
    arguments: dict
    consumers: list
    exclusive_consumer: Any
    deleted: bool

    # this node's message counters of the queue: each type makes one when the queue
    # is made (a plain attribute: the publish and delivery paths add to it)
    message_counts: MessageCounts

    def message_stats(self) -> dict[str, int]:
        """RabbitMQ's per-queue message_stats counts, this node's."""
        return self.message_counts.as_dict()

    # ------------------------------------------------------------ declaring

    @staticmethod
    def recorded_flags(durable: bool, auto_delete: bool, exclusive_owner: Any) -> dict:
        """The declaration's flags as a new queue's record keeps them (beside `place`'s
        fields); a type whose flags are fixed records none."""
        return {"durable": durable, "auto_delete": auto_delete,
                "exclusive_owner": exclusive_owner}

    def equivalence_arguments(self, arguments: dict) -> tuple[dict, dict]:
        """(received, current) arguments to compare on a redeclare."""
        return arguments, self.arguments

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        where = f"queue '{self.name}' in vhost '{self.vhost}'"
        if if_unused and self.consumers:
            raise precondition(f"{where} in use")
        if if_empty and self.ready_count:  # RabbitMQ: unacked messages do not count
            raise precondition(f"{where} not empty")

    def check_available(self, deleting: bool = False) -> None:
        """Refuse any use of a queue that cannot be used now: a classic queue whose home
        node is down (the mirroring guide's "Non-mirrored Queue Behavior in a
        Cluster": not_found, `queues/remote.py`). Nothing for a usable queue.
        `deleting`: for queue.delete, which a mirrored queue waiting for its lost
        leader always allows (the guide's way out of it)."""

    def check_consume(self, channel: "Channel", exclusive: bool) -> bool:
        """Refuse what this type cannot do at basic.consume; returns whether the new
        consumer is exclusive."""
        return exclusive

    def declare_ok(self, to: Asker) -> list:
        """A `DeclareOk` to `to`, now or once the counts are known."""
        raise NotImplementedError

    def when_led(self, callback: Callable[[], None]) -> None:
        """`callback()` once the queue can answer (a new quorum queue: once its group
        has a leader); at once here."""
        callback()

    def refresh(self, done: Callable[[], None]) -> None:
        """`done()` once the counts are current (a queue served by another node asks
        it first: queue.delete's checks and answer); at once here."""
        done()

    # ------------------------------------------------------------ messages

    def publish(self, message, channel: "Channel | None", confirm: Confirm | None) -> list:
        raise NotImplementedError

    def publish_batch(self, batch, exchange: str, routing_key: str, channel: "Channel | None",
                      confirm: Confirm | None) -> list | None:
        """The messages of a batch publish (amqp/batch_publish.py `Batch`), in order,
        each as `publish` takes it alone; what those return, in order. A type may
        store them without making each message first (quorum queues)."""
        actions: list = []
        for properties, body in batch.records:
            returned = self.publish(Message(exchange, routing_key, properties, body), channel,
                                    confirm)
            if returned:
                actions += returned
        return actions

    def consume(self, channel: "Channel", consumer: "Consumer") -> list:
        raise NotImplementedError

    def cancel(self, channel: "Channel", consumer: "Consumer") -> list:
        raise NotImplementedError

    def basic_get(self, channel: "Channel", no_ack: bool) -> list:
        raise NotImplementedError

    def settle(self, channel: "Channel", tokens: list, requeue: bool | None) -> list:
        raise NotImplementedError

    def channel_closed(self, channel: "Channel", tokens: list) -> list:
        raise NotImplementedError

    def capacity_freed(self) -> list:
        """Nothing to deliver here (a type that holds deliveries back overrides it)."""
        return []

    def purge(self, to: Asker) -> list:
        raise NotImplementedError

    def delete(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ settings, time

    def policy_changed(self, policy) -> list:
        """New settings from a policy; returns messages dropped by it (none here)."""
        return []

    def tick(self, now_ms: int) -> None:
        """The node's timer (about twice a second): nothing to do here."""

    # ------------------------------------------------------------ leases

    def check_leases(self, detail: str) -> None:
        """Refuse a lease operation (406 with `detail`) unless this type holds leases."""
        raise precondition(detail)

    def lease_entries(self, lease: str, start: int, end: int) -> Iterable[tuple[int, int, int]]:
        """(sequence, log index, delivery count) of a lease's range (start, end];
        KeyError for an unknown lease, ValueError for a range it does not hold."""
        raise NotImplementedError

    def replaying(self) -> bool:
        """Whether this queue's state here may still lack what was committed before its
        node restarted (a replica applying its old log): then a missing lease or range
        is not an answer yet."""
        return False

    def read_message(self, index: int) -> tuple[str, str, bytes, bytes]:
        """A message of a lease range by its log index."""
        raise NotImplementedError

    def read_message_spans(self, indexes: list[int]) -> list[tuple]:
        """Messages of a lease range by their log indexes, as views into the log:
        (exchange, routing key, content header length, content header + body)."""
        raise NotImplementedError

    def lease_slice(self, lease: str, start: int, end: int) -> tuple[Any, dict[int, int]]:
        """A lease range in bulk: (raft indexes in sequence order, {position: delivery
        count} of those delivered before)."""
        raise NotImplementedError

    def read_entries(self, indexes) -> list[bytes]:
        """The whole log entries of messages of a lease range, in that order."""
        raise NotImplementedError

    def lease_info(self, lease: str):
        """The lease's state (first_seq, end_seq, timeout_ms), or None if unknown."""
        return None

    def leases(self) -> dict:
        """Every lease of this queue by name (fifo/state.LeaseState), as this replica
        has applied them; none for a type without leases."""
        return {}

    # ------------------------------------------------------------ recovery

    def gone_after_restart(self, node_name: str, boot_id: str) -> bool:
        """Held by this node and unable to outlive its restart (a non-durable classic
        queue, an exclusive one of an earlier run's connection): deleted once the
        metadata log is replayed (Node.metadata_replayed)."""
        return False

    def recover_stored(self, items) -> int:
        """Messages the node's message store kept for this queue (classic queues);
        returns how many were taken (0: not this type's, the store forgets them)."""
        return 0

    # ------------------------------------------------------------ listing

    served_here: bool = True
    # classic queue mirroring (mirroring.py): the ordered mirrors of the queue's record
    # (None: not mirrored) and the synchronised ones
    mirrors: tuple | None = None
    synced: tuple = ()

    def record_changed(self, record: dict) -> bool:
        """A new metadata record for this queue: True when taken in place, False when
        the node must build the queue from it (then `take_over(self)` on the new one)."""
        return False

    def take_over(self, previous: "Queue") -> None:
        """This queue replaces `previous` (rebuilt from a changed record)."""

    def replaced(self) -> None:
        """Rebuilt from a changed record (node/metadata.py record_changed): released
        as by `delete`, except what the successor's `take_over` keeps (a mirror's
        copy)."""
        self.delete()

    @property
    def message_bytes(self) -> int:
        return self.ready_bytes

    @property
    def unacked_bytes(self) -> int | None:
        """Body bytes of the unacknowledged messages; None where the type does not
        count them (classic queues count ready bytes only): the metrics then leave
        the queue out of the byte families that need them."""
        return None

    def single_active_consumer_tag(self) -> str | None:
        """The consumer tag of the queue's single active consumer
        (x-single-active-consumer; RabbitMQ's `single_active_consumer_tag`), None
        when the queue has none (or is not such a queue)."""
        return None

    def stats_later(self, node_name: str, done: Callable[[dict[str, Any]], None]) -> None:
        """`done(stats)` once the counts are known (a queue served by another node
        asks it); at once here."""
        done(self.stats(node_name))

    def stats(self, node_name: str) -> dict[str, Any]:
        return {"vhost": self.vhost, "name": self.name, "type": self.type_name,
                "durable": self.durable, "ready": self.ready_count,
                "unacked": self.unacked_count, "consumers": self.consumer_count,
                "bytes": self.message_bytes, "leader": node_name, "members": [node_name],
                "single_active_consumer_tag": self.single_active_consumer_tag,
                **self.mirror_stats(node_name)}

    def mirror_stats(self, node_name: str) -> dict[str, Any]:
        """A mirrored classic queue's mirrors and synchronised mirrors (RabbitMQ's
        slave_pids and synchronised_slave_pids), and those whose node announced a
        controlled shutdown while in the record, in order (stopped_mirrors: shown
        only when some did); nothing for other queues."""
        if self.mirrors is None:
            return {}
        stats = {"mirrors": list(self.mirrors), "synchronised_mirrors": list(self.synced),
                 "members": [node_name, *self.mirrors]}
        if self.sync_progress is not None:  # RabbitMQ's state {syncing, N}
            stats["syncing"] = self.sync_progress
        stopped = getattr(self, "stopped", ())
        if stopped:  # announced a controlled shutdown, oldest first (forget_leader)
            stats["stopped_mirrors"] = list(stopped)
        return stats

    @property
    def sync_progress(self) -> int | None:
        """A mirrored classic queue synchronising its mirrors: the messages sent so far
        (its leader's; None otherwise)."""
        return None

    def metadata_record(self) -> dict[str, Any]:
        return {}

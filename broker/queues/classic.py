"""Classic queue: a local FIFO with optional message priorities. Pure, no I/O.

Responsibilities: ready messages (per priority level when x-max-priority is set),
consumers in priority groups served round-robin within their prefetch, counts for
declare-ok/purge/delete, length limits (x-max-length / x-max-length-bytes with
x-overflow drop-head or reject-publish).

How it works: an enqueued message becomes an `Entry` (message + per-queue sequence
number). Delivery pops the head of the highest non-empty priority level and hands it
to the next consumer that has capacity; the channel that owns the consumer tracks it
as unacked. A returned (requeued) entry goes back to its original position: entries
are ordered by sequence number within a level.

Invariants: `ready_count == sum(len(level) for level in levels)`; an entry is either
ready here, or unacked on exactly one channel, or settled; sequence numbers only grow.
Not here: persistence (the node writes the store), routing, AMQP framing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # pragma: no cover
    from ..node.channel import Consumer


class Message:
    """An immutable published message; shared by every queue it was routed to."""

    __slots__ = ("exchange", "routing_key", "properties", "body", "persistent", "priority")

    def __init__(self, exchange: str, routing_key: str, properties: Any, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties  # amqp.codec.Properties (raw header kept)
        self.body = body
        self.persistent = properties.delivery_mode == 2
        self.priority = properties.priority

    @property
    def size(self) -> int:
        return len(self.body)


class Entry:
    """A message's place in one queue."""

    __slots__ = ("message", "seq", "redelivered", "stored")

    def __init__(self, message: Message, seq: int, stored: bool, redelivered: bool = False) -> None:
        self.message = message
        self.seq = seq
        self.stored = stored  # written to the message store (durable queue, persistent)
        self.redelivered = redelivered


@dataclass(slots=True)
class ClassicQueue:
    vhost: str
    name: str
    durable: bool
    exclusive_owner: Any | None  # the owning session, for exclusive queues
    auto_delete: bool
    arguments: dict
    max_priority: int = 0
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    single_active_consumer: bool = False
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

    type_name = "classic"

    def __post_init__(self) -> None:
        self.levels = [deque() for _ in range(self.max_priority + 1)]

    # ------------------------------------------------------------ messages

    def make_entry(self, message: Message, stored: bool) -> Entry:
        entry = Entry(message, self.next_seq, stored)
        self.next_seq += 1
        return entry

    def would_overflow(self, message: Message) -> bool:
        """True when reject-publish must refuse this message."""
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
        dropped = []
        while self.ready_count and self._over_limit():
            dropped.append(self.pop())
        return dropped

    def enforce_limits(self) -> list[Entry]:
        """After the limits changed (a policy): drop-head drops ready entries from the
        head until within them, and returns them; reject-publish keeps what it has and
        refuses publishes until below."""
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

    def purge(self) -> list[Entry]:
        purged = [entry for level in self.levels for entry in level]
        for level in self.levels:
            level.clear()
        self.ready_count = 0
        self.ready_bytes = 0
        return purged

    def ready_entries(self) -> Iterator[Entry]:
        for level in reversed(self.levels):
            yield from level

    # ------------------------------------------------------------ consumers

    @property
    def active_consumer(self) -> "Consumer | None":
        """With x-single-active-consumer: the earliest registered consumer."""
        return self._arrivals[0] if self._arrivals else None

    def add_consumer(self, consumer: "Consumer") -> None:
        self._arrivals.append(consumer)
        self.consumers.append(consumer)
        # stable sort keeps arrival order within a priority
        self.consumers.sort(key=lambda c: -c.priority)
        self.had_consumers = True
        if consumer.exclusive:
            self.exclusive_consumer = consumer

    def remove_consumer(self, consumer: "Consumer") -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
            self._arrivals.remove(consumer)
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None

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

"""The quorum-queue machine's state, kept compact: typed arrays, not objects per message.

A queued message costs 12 bytes of state: its raft index (u64) and a u32 that packs
its body size with its priority level in the top bit (`pack`). Delivery counts are
kept only for messages that have been returned (a dict, usually tiny). Checked-out
messages (bounded by the consumers' prefetch) and leased ones carry a little more.
Message TTL: a ready queue that has held a message with an expiry keeps a third
typed array beside the two, the expiry (leader time in ms, 0 = none) of each entry:
8 more bytes per message there, none in a queue that never saw a TTL. A message with
an expiry that is checked out or leased keeps it in `expiries_out` (bounded like
the delivery counts: by prefetch and lease sizes), so it still expires if returned.

At-least-once dead lettering: a dead-lettered message stays in the state (`dlx`,
a tuple of raft index, size and reason each, about 100 bytes: such messages are
expected to be few and short-lived) until the dead-letter worker settles it.

Invariants: a live message is in exactly one place — a ready queue (high, normal),
the returns queue, one consumer's checked-out map, one lease, or the dead-letter
state (waiting for the worker, or checked out to it); `IndexQueue`
entries between `head` and the end are live; sizes are < 2**31. After every
command, ready messages are within the configured length limits (drop-head), or
`publishers_blocked` is set (reject-publish).
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field

HIGH_BIT = 1 << 31
SIZE_MASK = HIGH_BIT - 1
HIGH_PRIORITY_ABOVE = 4  # AMQP priority > 4 is high (the 4.2 guide)


def pack(size: int, priority: int) -> int:
    return min(size, SIZE_MASK) | (HIGH_BIT if priority > HIGH_PRIORITY_ABOVE else 0)


def size_of(packed: int) -> int:
    return packed & SIZE_MASK


def is_high(packed: int) -> bool:
    return bool(packed & HIGH_BIT)


class IndexQueue:
    """A FIFO of (raft index, packed size) in two typed arrays with a moving head."""

    __slots__ = ("indexes", "sizes", "head", "ascending", "bytes", "expiries")

    def __init__(self) -> None:
        self.indexes = array("Q")
        self.sizes = array("I")
        self.head = 0
        self.ascending = True  # indexes[head:] sorted: min() is O(1)
        self.bytes = 0
        # expiry (ms, 0 = none) per entry, parallel to indexes; None until an entry
        # with an expiry is appended (a queue without TTLs pays nothing)
        self.expiries: array | None = None

    def __len__(self) -> int:
        return len(self.indexes) - self.head

    def append(self, index: int, packed: int, expiry: int = 0) -> None:
        if self.ascending and len(self.indexes) > self.head and self.indexes[-1] > index:
            self.ascending = False
        self.indexes.append(index)
        self.sizes.append(packed)
        self.bytes += packed & SIZE_MASK
        if self.expiries is not None:
            self.expiries.append(expiry)
        elif expiry:
            self.expiries = array("Q", bytes(8 * (len(self.indexes) - 1)))
            self.expiries.append(expiry)

    def head_index(self) -> int:
        return self.indexes[self.head]

    def head_expiry(self) -> int:
        """The head entry's expiry (0: none). The queue must not be empty."""
        return self.expiries[self.head] if self.expiries is not None else 0

    def expiry_at(self, position: int) -> int:
        """The expiry of the entry `position` places after the head (0: none)."""
        return self.expiries[self.head + position] if self.expiries is not None else 0

    def popleft(self) -> tuple[int, int]:
        head = self.head
        index, packed = self.indexes[head], self.sizes[head]
        self.head = head + 1
        self.bytes -= packed & SIZE_MASK
        self._compact()
        return index, packed

    def pop(self) -> tuple[int, int]:
        """Remove the last entry (a TTL-0 message nobody took at once)."""
        index, packed = self.indexes.pop(), self.sizes.pop()
        if self.expiries is not None:
            self.expiries.pop()
        self.bytes -= packed & SIZE_MASK
        if self.head == len(self.indexes):
            self.clear()
        return index, packed

    def popleft_many(self, count: int) -> tuple[array, array]:
        """The first `count` entries (at most len(self)), removed: (indexes, sizes)."""
        head = self.head
        end = head + min(count, len(self))
        indexes, sizes = self.indexes[head:end], self.sizes[head:end]
        assert self.expiries is None, "popleft_many is for queues without expiries"
        self.head = end
        self.bytes -= sum(sizes) if not self._any_high(sizes) else sum(
            packed & SIZE_MASK for packed in sizes)
        self._compact()
        return indexes, sizes

    def _compact(self) -> None:
        """After taking from the head: drop the taken entries once they are half the
        arrays (or all of them)."""
        if self.head == len(self.indexes):
            self.clear()
        elif self.head >= 4096 and self.head * 2 >= len(self.indexes):
            del self.indexes[:self.head]
            del self.sizes[:self.head]
            if self.expiries is not None:
                del self.expiries[:self.head]
            self.head = 0

    @staticmethod
    def _any_high(sizes: array) -> bool:
        return bool(sizes) and max(sizes) >= HIGH_BIT

    def clear(self) -> None:
        self.indexes = array("Q")
        self.sizes = array("I")
        self.head = 0
        self.ascending = True
        self.bytes = 0
        self.expiries = None

    def min_index(self) -> int | None:
        if not len(self):
            return None
        if self.ascending:
            return self.indexes[self.head]
        return min(self.indexes[self.head:])

    def items(self):
        return zip(self.indexes[self.head:], self.sizes[self.head:])

    def memory_bytes(self) -> int:
        total = self.indexes.buffer_info()[1] * 8 + self.sizes.buffer_info()[1] * 4
        if self.expiries is not None:
            total += self.expiries.buffer_info()[1] * 8
        return total


@dataclass(slots=True)
class ConsumerState:
    prefetch: int          # 0 = unlimited
    priority: int
    connection: str
    order: int             # registration order, for round-robin and ties
    pull_only: bool = False   # basic.get holder: never pushed to
    cancelled: bool = False   # kept until its checked-out messages are settled
    # its node is suspected down (a NodeDown, until a NodeUp: fifo/nodes.py): it holds
    # no message, gets none and is never the single active consumer
    suspected: bool = False
    next_msg_id: int = 1
    # msg id -> (raft index, packed size, delivery count)
    checked: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def has_capacity(self) -> bool:
        if self.cancelled or self.pull_only or self.suspected:
            return False
        return not self.prefetch or len(self.checked) < self.prefetch


@dataclass(slots=True)
class ServingRoster:
    """The consumers serving.py may push to, kept between commands so that serving
    an Enqueue need not visit every consumer. Derived from `FifoState.consumers`:
    never snapshotted, not compared, rebuilt when None (serving.py `_roster`).

    `ranked`: the consumers neither cancelled, pull-only nor suspected, highest
    priority first, then registration order. `full`: the keys of those at their
    prefetch. `one_priority`: every ranked consumer has the same priority.

    Invariant: while not None, it is what `_roster` would build from the consumers.
    machine.py `apply` drops it (None) on every command but Enqueue, Settle, Return
    and Discard; serving.py adds a consumer to `full` when it fills, machine.py
    `_checked` removes it when a settle, return or discard makes room."""
    ranked: list[tuple[str, ConsumerState]]
    full: set[str]
    one_priority: bool


@dataclass(frozen=True, slots=True)
class LeaseFence:
    """Why a lease refuses its holder: its messages first_seq..end_seq went back to the
    queue while the holder was away (an operator's release, or its idle timeout), so
    a checkpoint that covers them could neither settle nor replay them."""
    first_seq: int
    end_seq: int
    reason: str      # "released" (an operator) | "timeout"
    at_ms: int       # leader time (ms since the epoch) of the release
    timeout_ms: int  # the lease's idle timeout then


@dataclass(slots=True)
class LeaseState:
    """Messages assigned to a durable lease, in lease-sequence order.
    indexes[i] has lease sequence first_seq + i; next_seq - 1 is the lease's end.
    A fenced lease holds nothing and refuses grows and settles (fifo/leases.py)."""
    indexes: array = field(default_factory=lambda: array("Q"))
    sizes: array = field(default_factory=lambda: array("I"))
    counts: dict[int, int] = field(default_factory=dict)  # raft index -> delivery count (>0)
    first_seq: int = 1
    next_seq: int = 1
    timeout_ms: int = 0
    last_active: int = 0
    fence: LeaseFence | None = None

    @property
    def end_seq(self) -> int:
        return self.next_seq - 1


@dataclass(slots=True)
class DlxConsumer:
    """The dead-letter worker of at-least-once dead lettering (one per queue, on its
    leader): the messages checked out to it, msg id -> (raft index, body size,
    reason), until it settles them (DlxSettle) once every target queue confirmed."""
    worker: str            # the worker's identity (a leader's node, run and term)
    prefetch: int          # at most this many checked out (dead_letter_worker_consumer_prefetch)
    checked: dict[int, tuple[int, int, str]] = field(default_factory=dict)


@dataclass(slots=True)
class DlxState:
    """Messages dead-lettered at least once (rabbit_fifo_dlx): held by the queue until
    the dead-letter worker settles them. `discards` waits for the worker, in the order
    the messages died: (raft index, body size, reason) each; `consumer` is the worker
    they are checked out to. `next_msg_id` only grows, across workers, so a replaced
    worker's settle can never name a message given to its successor."""
    discards: deque = field(default_factory=deque)
    consumer: DlxConsumer | None = None
    next_msg_id: int = 1
    bytes: int = 0         # body bytes of every held message (waiting or checked out)

    @property
    def count(self) -> int:
        return len(self.discards) + (len(self.consumer.checked) if self.consumer else 0)


OVERFLOW_MODES = ("drop-head", "reject-publish")
SOFT_LIMIT_PERCENT = 80  # rabbit_fifo's ?LOW_LIMIT: reject-publish lifts at or below 80%


@dataclass(slots=True)
class FifoConfig:
    """A queue's machine settings, validated on construction: from its x-arguments at
    declaration, then the limits from each UpdateConfig in its log (policies; the
    snapshot carries the current ones).

    Length limits count *ready* messages only (queued or returned, not checked out
    or leased), as RabbitMQ does; see machine.py for the overflow semantics."""
    delivery_limit: int = 20          # -1 disables it (returns then go to the tail)
    release_cursor_interval: int = 2048  # commands between release-cursor checks
    max_length: int | None = None     # x-max-length: ready messages; None = no limit
    max_bytes: int | None = None      # x-max-length-bytes: ready body bytes; None = no limit
    overflow: str = "drop-head"       # x-overflow: "drop-head" | "reject-publish"
    # x-message-ttl / policy message-ttl (the lower): ms a message may stay in the
    # queue, set on each message at its enqueue; None = no queue TTL
    msg_ttl: int | None = None
    # x-expires / policy expires (the lower): ms the queue may stay unused (no
    # consumer, no basic.get) before it is deleted; None = never
    expires: int | None = None
    # x-single-active-consumer: one consumer at a time gets messages (single_active.py).
    # An argument only, as in RabbitMQ (no policy key): fixed at declaration, kept by
    # every UpdateConfig
    single_active: bool = False
    # at-least-once dead lettering (the quorum queues guide, "Dead Lettering"): in
    # force only with a dead-letter exchange, x-dead-letter-strategy at-least-once
    # and overflow reject-publish (with drop-head RabbitMQ falls back to at-most-once)
    dead_letter_at_least_once: bool = False
    # derived (never passed): nothing of these settings acts on an Enqueue beyond
    # storing it: no single active consumer, no TTLs, no length limits, no
    # at-least-once dead lettering (`machine.apply` takes the short way then)
    quiet_enqueue: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.quiet_enqueue = not (self.single_active or self.msg_ttl is not None
                                  or self.expires is not None or self.max_length is not None
                                  or self.max_bytes is not None
                                  or self.dead_letter_at_least_once)
        for key in ("max_length", "max_bytes", "msg_ttl", "expires"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise ValueError(f"fifo config '{key}' must be a non-negative integer or "
                                 f"None, not {value!r}")
        if self.overflow not in OVERFLOW_MODES:
            raise ValueError(f"fifo config 'overflow' must be one of "
                             f"{', '.join(OVERFLOW_MODES)}, not {self.overflow!r}")
        if not isinstance(self.single_active, bool):
            raise ValueError(f"fifo config 'single_active' must be a bool, not "
                             f"{self.single_active!r}")

    @property
    def has_limit(self) -> bool:
        return self.max_length is not None or self.max_bytes is not None


def fifo_config(arguments: dict) -> FifoConfig:
    """A queue's machine settings from its validated x-arguments (broker/queues/types.py
    validates them at declaration; the analytics jobs read them from metadata.json):
    `x-delivery-limit` (default 20, negative = none), `x-max-length`,
    `x-max-length-bytes`, `x-overflow` (default drop-head), `x-message-ttl`,
    `x-expires`, `x-single-active-consumer` (a bool, default false), and
    `x-dead-letter-exchange` / `-strategy` with the overflow for at-least-once dead
    lettering."""
    limit = arguments.get("x-delivery-limit", 20)
    overflow = _text(arguments.get("x-overflow"))
    return FifoConfig(delivery_limit=-1 if limit < 0 else limit,
                      max_length=arguments.get("x-max-length"),
                      max_bytes=arguments.get("x-max-length-bytes"),
                      overflow=overflow or "drop-head",
                      msg_ttl=arguments.get("x-message-ttl"),
                      expires=arguments.get("x-expires"),
                      single_active=arguments.get("x-single-active-consumer") is True,
                      dead_letter_at_least_once=at_least_once(
                          _text(arguments.get("x-dead-letter-exchange")),
                          _text(arguments.get("x-dead-letter-strategy")),
                          overflow or "drop-head"))


def _text(value):
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def at_least_once(exchange: str | None, strategy: str | None, overflow: str) -> bool:
    """rabbit_quorum_queue's `dlh`: at-least-once dead lettering is in force only with
    a dead-letter exchange, the strategy at-least-once and overflow reject-publish
    (with drop-head it falls back to at-most-once)."""
    return exchange is not None and strategy == "at-least-once" and overflow == "reject-publish"


@dataclass(slots=True)
class FifoState:
    config: FifoConfig = field(default_factory=FifoConfig)
    high: IndexQueue = field(default_factory=IndexQueue)
    normal: IndexQueue = field(default_factory=IndexQueue)
    returns: IndexQueue = field(default_factory=IndexQueue)
    # ready messages handed out before -> their delivery count: > 0, or 0 for one a
    # suspected consumer held (returned uncounted, still redelivered: fifo/nodes.py)
    delivery_counts: dict[int, int] = field(default_factory=dict)
    # raft index -> expiry (ms) of a checked-out or leased message that has one
    expiries_out: dict[int, int] = field(default_factory=dict)
    high_run: int = 0              # high-priority deliveries since the last normal one
    consumers: dict[str, ConsumerState] = field(default_factory=dict)
    # single active consumer (config.single_active): the key of the one consumer that
    # may get messages, None when there is none; always a consumer of `consumers` that
    # is neither cancelled nor pull-only. The others wait (single_active.py)
    active: str | None = None
    next_consumer_order: int = 1
    rotation: int = 0              # round-robin position among equal-priority consumers
    enqueuers: dict[str, int] = field(default_factory=dict)  # publisher -> last seq
    # publisher -> its first rejected seq, while not yet stored: later seqs are rejected
    enqueuer_gaps: dict[str, int] = field(default_factory=dict)
    # reject-publish: set when ready messages went over a limit, cleared when they are
    # back at or below SOFT_LIMIT_PERCENT of every limit; while set, enqueues are rejected
    publishers_blocked: bool = False
    leases: dict[str, LeaseState] = field(default_factory=dict)
    # at-least-once dead lettering: messages held until the dead-letter worker settles
    # them (empty unless config.dead_letter_at_least_once)
    dlx: DlxState = field(default_factory=DlxState)
    enqueue_count: int = 0
    applied_since_cursor: int = 0
    release_cursor: int = 0        # last emitted
    last_index: int = 0            # raft index of the last applied command
    # queue TTL: the leader time the queue was last used (a consumer, a basic.get, a
    # config change); 0 = not yet known (the first Tick starts the period)
    last_active: int = 0
    # the leader time of the command being applied (set by `apply`, not snapshotted)
    now_ms: int = 0
    # who serving.py may push to (ServingRoster), None until built: derived from
    # `consumers`, not snapshotted, not compared
    roster: ServingRoster | None = field(default=None, compare=False, repr=False)

    @property
    def ready_count(self) -> int:
        # twin of len() of the three queues: keep in step; read after every command
        high, normal, returns = self.high, self.normal, self.returns
        return (len(high.indexes) - high.head + len(normal.indexes) - normal.head
                + len(returns.indexes) - returns.head)

    @property
    def ready_bytes(self) -> int:
        return self.high.bytes + self.normal.bytes + self.returns.bytes

    @property
    def checked_out_count(self) -> int:
        return sum(len(c.checked) for c in self.consumers.values())

    @property
    def leased_count(self) -> int:
        return sum(len(lease.indexes) for lease in self.leases.values())

    def metadata_bytes(self) -> int:
        """Bytes the state holds for queued messages (typed arrays + returned-message
        counts), the figure the memory-footprint analytics report."""
        total = (self.high.memory_bytes() + self.normal.memory_bytes()
                 + self.returns.memory_bytes())
        total += (len(self.delivery_counts) + len(self.expiries_out)) * 100  # dict entries, roughly
        for lease in self.leases.values():
            total += lease.indexes.buffer_info()[1] * 8 + lease.sizes.buffer_info()[1] * 4
        total += self.dlx.count * 100  # a tuple per held dead letter, roughly
        return total

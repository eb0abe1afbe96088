"""The quorum-queue machine's vocabulary: commands (log entries), replies, effects.

Commands are what the Raft log holds, so each has a compact binary encoding
(`encode` / `decode`). An Enqueue entry carries the whole message (exchange, routing
key, raw content header, body): the message lives only in the log, and the machine
keeps just its raft index and size. `decode` of an Enqueue reads only the fixed
header the machine needs; `decode_message` reads the rest when delivering. Replies
have a JSON form (`encode_reply` / `decode_reply`) for the snapshots that keep the
replies of forwarded commands.

Format (version 1, all big-endian), first octet = command tag:
  Enqueue       1 | u8 priority | u32 body size | u64 seq | u16 plen publisher |
                  u8 elen exchange | u8 rlen routing key | u32 hlen header | body
  Checkout      2 | consumer | u32 prefetch | i32 priority | connection
  Cancel        3 | consumer
  Settle        4 | consumer | u32 n | n x u64 msg id
  Return        5 | consumer | u32 n | n x u64 msg id
  Discard       6 | consumer | u32 n | n x u64 msg id
  Purge         7
  Down          8 | connection
  Dequeue       9 | consumer | u8 settled | connection
  LeaseGrow    10 | lease | u32 max messages | u64 max bytes | u64 timeout ms
  LeaseSettle  11 | lease | u64 up to
  LeaseRelease 12 | lease [| u8 1: fenced, an operator's release; absent: not]
  Tick         13
  UpdateConfig 14 | u8 overflow (0 drop-head, 1 reject-publish) | i64 delivery limit |
                  i64 max length | i64 max bytes          (-1 = no limit, each)
  UpdateConfig 15 | as 14 | i64 message TTL ms | i64 queue expiry ms (-1 = none, each;
                  written only for a queue with a message TTL or an expiry)
  DlxCheckout  16 | worker | u32 prefetch
  DlxSettle    17 | worker | u32 n | n x u64 msg id
  UpdateConfig 18 | as 15 | u8 dead lettering (1: at-least-once; written only for a
                  queue switched to at-least-once dead lettering)
  NodeDown     19 | u16 n | n x node
  NodeUp       20 | node | boot
  Enqueue      21 | as 1, but the body is `body size` octets, followed by u32 n |
                  n x (u32 length + UTF-8): the message's BCC keys (written only for
                  a message published with a BCC header that held a string)
  where consumer/lease/connection/publisher/worker = u16 length + UTF-8.

Tags are only ever added, and 0xFE and 0xFF never are tags (the forwarded-command
identity and the time envelope that may wrap a command in its entry: FORMAT.md,
"Quorum-queue entries"): a build that does not know a tag refuses the entry
("unknown fifo command tag 14") rather than skipping it, since skipping would make
its replica diverge. UpdateConfig (14) came after 1-13, 15 (with a message TTL)
after 14: every member of a queue's group must run a build that knows it before
one is proposed (15 only ever is for a queue given a message TTL; 16-18 only for a
queue with at-least-once dead lettering; 19-20, in any cluster of more than one node,
by the leader when a node with consumers goes silent or comes back: fifo/nodes.py; 21
only for a message published with BCC keys).

The BCC keys (tag 21): a message is routed by its routing key, CC and BCC keys, and
its BCC header is removed before it is stored (handlers.py, sender-selected
distribution). A dead-lettered copy is routed by all of them again (rabbit_dead_letter),
so the keys are kept in the entry, after the body, where no reader of the message
looks: the machine never reads them (`decode` gives the same Enqueue for 1 and 21),
deliveries cut the body at its size, and dead lettering reads them (`blind_keys`).

An Enqueue's per-message TTL is the `expiration` property of the content header in
its entry: `decode` reads it from there (one flag test when absent), so the entry
layout did not change for it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Union

from .state import OVERFLOW_MODES

_u8 = struct.Struct(">B")
_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_enqueue_head = struct.Struct(">BBIQ")
_checkout_args = struct.Struct(">Ii")
_grow_args = struct.Struct(">IQQ")
_update_args = struct.Struct(">Bqqq")
_i64 = struct.Struct(">q")
_I64_LIMIT = 1 << 63
BLIND_ENQUEUE = 21  # an Enqueue that keeps the message's BCC keys after its body
# UpdateConfig's overflow octet: the position here (append only, never reorder)
_OVERFLOW_CODES = ("drop-head", "reject-publish")


# Meta, Enqueue and Delivery are built once per message on every member (the hottest
# objects of the apply path), so they are not frozen: a frozen dataclass's __init__
# sets each field through object.__setattr__, about four times the cost of a plain
# slots __init__. They are never changed once made (nothing assigns a field; hashing
# is by value as for the frozen ones: unsafe_hash).
@dataclass(slots=True, unsafe_hash=True)
class Meta:
    """What Raft tells the machine about the entry being applied."""
    index: int
    term: int
    system_time: int  # milliseconds, from the leader's clock when proposed


# ------------------------------------------------------------------ commands


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see above Meta
class Enqueue:
    """Reply: "ok" (stored), "duplicate" (stored before) or "rejected" (x-overflow
    reject-publish while over the length limit: not stored, to be nacked)."""
    publisher: str   # "" = no de-duplication
    seq: int         # per-publisher sequence; a seq at or below the last seen is a duplicate
    size: int        # body bytes
    priority: int    # AMQP priority property (0-255); > 4 is high
    ttl: int | None = None  # the message's expiration property in ms (None: none)


@dataclass(frozen=True, slots=True)
class Checkout:
    consumer: str
    prefetch: int    # 0 = unlimited
    priority: int    # x-priority
    connection: str  # whose Down returns this consumer's messages


@dataclass(frozen=True, slots=True)
class Cancel:
    consumer: str


@dataclass(frozen=True, slots=True)
class Settle:
    consumer: str
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Return:
    consumer: str
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Discard:
    consumer: str
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Purge:
    pass


@dataclass(frozen=True, slots=True)
class Down:
    connection: str


@dataclass(frozen=True, slots=True)
class NodeDown:
    """The leader has not heard from these nodes (silent, cut off, or not heard since
    the leader started): their consumers are *suspected* (fifo/nodes.py), as
    rabbit_fifo's `{down, Pid, noconnection}`: their unacked messages return without
    counting as a delivery attempt and they get nothing until a NodeUp. All in one
    command, so that none of them is handed another's messages meanwhile. Reply: None."""
    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, tuple) or not all(isinstance(n, str) for n in self.nodes):
            raise ValueError(f"fifo node_down 'nodes' must be a tuple of node names, not "
                             f"{self.nodes!r}")


@dataclass(frozen=True, slots=True)
class NodeUp:
    """The leader hears from `node` again, in its run `boot` (the node's boot id, the
    prefix of its connections' identities): that run's suspected consumers are
    reinstated, and consumers of the node's earlier runs, which died with them, are
    removed as by a Down (fifo/nodes.py). Reply: None."""
    node: str
    boot: str


@dataclass(frozen=True, slots=True)
class Dequeue:
    consumer: str    # the basic.get "consumer" of a channel
    settled: bool    # no-ack get
    connection: str


@dataclass(frozen=True, slots=True)
class LeaseGrow:
    lease: str
    max_messages: int
    max_bytes: int   # 0 = unlimited
    timeout_ms: int  # idle time after which the lease is released (0 = never)


@dataclass(frozen=True, slots=True)
class LeaseSettle:
    lease: str
    up_to: int       # lease sequence: everything at or below it is settled


@dataclass(frozen=True, slots=True)
class LeaseRelease:
    lease: str
    fence: bool = False  # an operator's release: the lease refuses its holder after it


@dataclass(frozen=True, slots=True)
class Tick:
    pass


@dataclass(frozen=True, slots=True)
class UpdateConfig:
    """A policy changed the queue's limits (rabbit_fifo's update_config): the four
    settings replace the machine's (each one, not only those the policy names); what
    is not here (release_cursor_interval) is kept. Reply: None. Values are checked
    here, so an impossible one fails when the command is built, naming the key."""
    delivery_limit: int        # -1 = no limit (x-delivery-limit / policy delivery-limit)
    max_length: int | None     # ready messages; None = no limit
    max_bytes: int | None      # ready body bytes; None = no limit
    overflow: str              # "drop-head" | "reject-publish"
    msg_ttl: int | None = None  # message TTL in ms (x-message-ttl / policy message-ttl)
    expires: int | None = None  # queue TTL in ms (x-expires / policy expires)
    # at-least-once dead lettering in force (FifoConfig.dead_letter_at_least_once)
    dead_letter_at_least_once: bool = False

    def __post_init__(self) -> None:
        limit = self.delivery_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or not -1 <= limit < _I64_LIMIT:
            raise ValueError(f"fifo update_config 'delivery_limit' must be -1 (no limit) or a "
                             f"non-negative integer below 2^63, not {limit!r}")
        for key in ("max_length", "max_bytes", "msg_ttl", "expires"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value < _I64_LIMIT):
                raise ValueError(f"fifo update_config '{key}' must be a non-negative integer "
                                 f"below 2^63 or None, not {value!r}")
        if self.overflow not in OVERFLOW_MODES:
            raise ValueError(f"fifo update_config 'overflow' must be one of "
                             f"{', '.join(OVERFLOW_MODES)}, not {self.overflow!r}")


@dataclass(frozen=True, slots=True)
class DlxCheckout:
    """The dead-letter worker of a (new) leader registers (rabbit_fifo_dlx's
    checkout): it replaces any earlier worker, whose unsettled messages go back to
    the front of the waiting dead letters, in the order they died."""
    worker: str
    prefetch: int    # at most this many dead letters checked out to it


@dataclass(frozen=True, slots=True)
class DlxSettle:
    """Every target queue confirmed these dead letters: they leave the queue. Ignored
    unless `worker` is the current one (a replaced worker's ids are not its own).
    Reply: how many left."""
    worker: str
    msg_ids: tuple[int, ...]


Command = Union[Enqueue, Checkout, Cancel, Settle, Return, Discard, Purge, Down, Dequeue,
                LeaseGrow, LeaseSettle, LeaseRelease, Tick, UpdateConfig, DlxCheckout,
                DlxSettle, NodeDown, NodeUp]


# ------------------------------------------------------------------ effects


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see above Meta
class Delivery:
    msg_id: int
    raft_index: int
    delivery_count: int   # failed delivery attempts (x-delivery-count)
    # handed out before and returned without a count (a suspected consumer's: NodeDown),
    # so redelivered although delivery_count is 0; only ever set with delivery_count 0.
    # AMQP's redelivered flag is `delivery_count > 0 or returned`
    returned: bool = False

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 0 or self.returned


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send these messages to a consumer (bodies are read from the log)."""
    consumer: str
    deliveries: tuple[Delivery, ...]


@dataclass(frozen=True, slots=True)
class Dropped:
    """A message left the queue without being consumed: the node dead-letters it
    (the queue has a dead-letter exchange) or it is gone."""
    raft_index: int
    reason: str  # "rejected" | "expired" | "delivery_limit" | "maxlen"


@dataclass(frozen=True, slots=True)
class DlxDelivery:
    msg_id: int
    raft_index: int
    reason: str


@dataclass(frozen=True, slots=True)
class DlxDeliver:
    """At-least-once dead lettering: these dead letters are checked out to `worker`,
    which publishes them to the dead-letter exchange and settles them (DlxSettle)
    once every target queue confirmed."""
    worker: str
    deliveries: tuple[DlxDelivery, ...]


@dataclass(frozen=True, slots=True)
class ReleaseCursor:
    """Every log entry below `index` is dead: storage may delete it once a snapshot
    of the machine at `snapshot_index` is written."""
    index: int
    snapshot_index: int


@dataclass(frozen=True, slots=True)
class QueueExpired:
    """The queue has been unused for longer than its expiry (x-expires): the leader's
    node deletes it (through the metadata, on every node)."""
    unused_ms: int


@dataclass(frozen=True, slots=True)
class LeaseReleased:
    lease: str
    reason: str  # "released" | "timeout"


@dataclass(frozen=True, slots=True)
class ActiveConsumerChanged:
    """Single active consumer (fifo/single_active.py): `consumer` is the active one
    from this command on (None: no consumer is left), as rabbit_fifo's
    consumer_update_active effect (what RabbitMQ turns into its ConsumerUpdate and
    the consumer's "active" flag). The leader's node logs it."""
    consumer: str | None


Effect = Union[Deliver, Dropped, ReleaseCursor, LeaseReleased, QueueExpired,
               ActiveConsumerChanged, DlxDeliver]


# ------------------------------------------------------------------ replies as JSON


def encode_reply(reply):
    """A machine reply as a JSON value (a snapshot keeps the replies of forwarded
    commands: broker/raft/forwarded.py): strings, numbers and None as they are, a
    tuple as a list, a Delivery as {"delivery": [msg id, raft index, delivery count]}
    (and `true` fourth when it was returned uncounted: Delivery.returned)."""
    if isinstance(reply, Delivery):
        return {"delivery": [reply.msg_id, reply.raft_index, reply.delivery_count]
                + ([True] if reply.returned else [])}
    if isinstance(reply, tuple):
        return [encode_reply(item) for item in reply]
    return reply


def decode_reply(value):
    """The reply `encode_reply` wrote."""
    if isinstance(value, dict):
        return Delivery(*value["delivery"])
    if isinstance(value, list):
        return tuple(decode_reply(item) for item in value)
    return value


# ------------------------------------------------------------------ encoding

# the AMQP 0-9-1 basic properties before `expiration`, in wire order (bit, size: None =
# a short string, 4 = a u32-length table, else fixed), and expiration's own bit
_PROPERTIES_BEFORE_EXPIRATION = ((1 << 15, None), (1 << 14, None), (1 << 13, 4),
                                 (1 << 12, 1), (1 << 11, 1), (1 << 10, None), (1 << 9, None))
_EXPIRATION = 1 << 8
_header_fixed = struct.Struct(">HHQH")  # class, weight, body size, property flags


def expiration_ms(header: bytes) -> int | None:
    """The `expiration` property of an AMQP content header payload as milliseconds, or
    None when absent or not a decimal string (RabbitMQ's per-message TTL). Reads only
    the properties before it: a header without one costs one flag test. (The fifo
    imports nothing of the codec, so this little reader lives here.)"""
    try:
        flags = _header_fixed.unpack_from(header)[3]
        if not flags & _EXPIRATION or flags & 1:
            return None
        offset = _header_fixed.size
        for bit, size in _PROPERTIES_BEFORE_EXPIRATION:
            if flags & bit:
                if size is None:
                    offset += 1 + header[offset]
                elif size == 4:
                    offset += 4 + _u32.unpack_from(header, offset)[0]
                else:
                    offset += size
        text = header[offset + 1:offset + 1 + header[offset]]
    except (struct.error, IndexError):
        return None
    return int(text) if text.isdigit() else None


def _s(value: str) -> bytes:
    data = value.encode("utf-8", "surrogateescape")
    return _u16.pack(len(data)) + data


def _read_s(data: bytes, offset: int) -> tuple[str, int]:
    (length,) = _u16.unpack_from(data, offset)
    end = offset + 2 + length
    return data[offset + 2:end].decode("utf-8", "surrogateescape"), end


def _ids(ids: tuple[int, ...]) -> bytes:
    return _u32.pack(len(ids)) + struct.pack(f">{len(ids)}Q", *ids)


def _read_ids(data: bytes, offset: int) -> tuple[int, ...]:
    (count,) = _u32.unpack_from(data, offset)
    return struct.unpack_from(f">{count}Q", data, offset + 4)


def encode_enqueue(publisher: str, seq: int, priority: int, exchange: str, routing_key: str,
                   header: bytes, body: bytes, head: bytes = b"",
                   blind_keys: tuple[str, ...] = ()) -> bytes:
    """An Enqueue's data, after `head` (an envelope's, written in the same join: the
    message is copied once). With `blind_keys` (the message's BCC keys) it is tag 21,
    the keys after the body; else tag 1."""
    publisher_bytes = publisher.encode("utf-8", "surrogateescape")  # twin of _s
    exchange_bytes = exchange.encode("utf-8", "surrogateescape")
    key_bytes = routing_key.encode("utf-8", "surrogateescape")
    parts = [head, _enqueue_head.pack(BLIND_ENQUEUE if blind_keys else 1, priority,
                                      len(body), seq),
             _u16.pack(len(publisher_bytes)), publisher_bytes,
             _u8.pack(len(exchange_bytes)), exchange_bytes, _u8.pack(len(key_bytes)),
             key_bytes, _u32.pack(len(header)), header, body]
    if blind_keys:
        parts.append(_u32.pack(len(blind_keys)))
        for key in blind_keys:
            encoded = key.encode("utf-8", "surrogateescape")
            parts += (_u32.pack(len(encoded)), encoded)
    return b"".join(parts)


def _body_end(data: bytes, start: int, body_start: int) -> int | None:
    """Where the body of the Enqueue at `start` ends: None (the entry's end) for tag 1,
    before the BCC keys for tag 21."""
    if data[start] == BLIND_ENQUEUE:
        return body_start + _u32.unpack_from(data, start + 2)[0]
    return None


def cut_blind_keys(data: bytes, start: int) -> bytes:
    """The Enqueue entry `data` (its command at `start`) with no BCC keys: a tag 21
    entry becomes the tag 1 entry of the same message (the layouts are the same up
    to the body's end); any other entry is returned as it is."""
    if data[start] != BLIND_ENQUEUE:
        return data
    offset = start + _enqueue_head.size  # the publisher, then the exchange
    offset += 2 + _u16.unpack_from(data, offset)[0]
    key_end = offset + 2 + data[offset] + data[offset + 1 + data[offset]]
    body_start = key_end + 4 + _u32.unpack_from(data, key_end)[0]
    return b"".join((data[:start], b"\x01", data[start + 1:_body_end(data, start, body_start)]))


def decode_message(data: bytes, start: int = 0) -> tuple[str, str, bytes, bytes]:
    """(exchange, routing key, raw content header, body) of an Enqueue entry that
    begins at `start` in `data` (after an envelope: nothing is copied to skip it)."""
    offset = start + _enqueue_head.size  # the publisher, then the exchange
    offset += 2 + _u16.unpack_from(data, offset)[0]
    exchange_length = data[offset]
    exchange = data[offset + 1:offset + 1 + exchange_length].decode("utf-8", "surrogateescape")
    offset += 1 + exchange_length
    key_length = data[offset]
    routing_key = data[offset + 1:offset + 1 + key_length].decode("utf-8", "surrogateescape")
    offset += 1 + key_length
    (header_length,) = _u32.unpack_from(data, offset)
    header = data[offset + 4:offset + 4 + header_length]
    body_start = offset + 4 + header_length
    return exchange, routing_key, header, data[body_start:_body_end(data, start, body_start)]


def blind_keys(data: bytes, start: int = 0) -> tuple[str, ...]:
    """The BCC keys kept in the Enqueue entry at `start` (tag 21); () for tag 1."""
    if data[start] != BLIND_ENQUEUE:
        return ()
    offset = start + _enqueue_head.size  # the publisher, the names, the header
    offset += 2 + _u16.unpack_from(data, offset)[0]
    offset += 1 + data[offset]
    offset += 1 + data[offset]
    offset += 4 + _u32.unpack_from(data, offset)[0] + _u32.unpack_from(data, start + 2)[0]
    (count,) = _u32.unpack_from(data, offset)
    offset += 4
    keys = []
    for _ in range(count):
        (length,) = _u32.unpack_from(data, offset)
        keys.append(data[offset + 4:offset + 4 + length].decode("utf-8", "surrogateescape"))
        offset += 4 + length
    return tuple(keys)


def message_spans(data: bytes, start: int = 0) -> tuple[memoryview, memoryview, int, memoryview]:
    """The same message as `decode_message`, as views into `data` (nothing decoded or
    copied): (exchange, routing key, content header length, content header followed
    by the body). A packed lease read cuts its records from these (amqp/lease_records.py)."""
    view = memoryview(data)
    offset = start + _enqueue_head.size  # the publisher, then the exchange
    offset += 2 + _u16.unpack_from(data, offset)[0]
    exchange_end = offset + 1 + data[offset]
    key_end = exchange_end + 1 + data[exchange_end]
    (header_length,) = _u32.unpack_from(data, key_end)
    return (view[offset + 1:exchange_end], view[exchange_end + 1:key_end], header_length,
            view[key_end + 4:_body_end(data, start, key_end + 4 + header_length)])


def delivery_spans(data: bytes, start: int = 0) -> tuple[memoryview, memoryview, memoryview]:
    """The same message as `decode_message`, as views into `data` for a delivery:
    (names, content header, body), where `names` is the exchange and the routing key
    as stored, each a length octet and its UTF-8 (two AMQP short strings, as
    basic.deliver carries them)."""
    view = memoryview(data)
    offset = start + _enqueue_head.size  # the publisher, then the exchange
    offset += 2 + _u16.unpack_from(data, offset)[0]
    key_end = offset + 2 + data[offset] + data[offset + 1 + data[offset]]
    header_start = key_end + 4
    body_start = header_start + _u32.unpack_from(data, key_end)[0]
    if data[start] == BLIND_ENQUEUE:  # (twin of _body_end, inline: one per delivery)
        return (view[offset:key_end], view[header_start:body_start],
                view[body_start:body_start + _u32.unpack_from(data, start + 2)[0]])
    return view[offset:key_end], view[header_start:body_start], view[body_start:]


def encode(command: Command) -> bytes:
    match command:
        case Enqueue():
            raise TypeError("encode Enqueue with encode_enqueue (it carries the message)")
        case Checkout(consumer, prefetch, priority, connection):
            return b"\x02" + _s(consumer) + _checkout_args.pack(prefetch, priority) + _s(connection)
        case Cancel(consumer):
            return b"\x03" + _s(consumer)
        case Settle(consumer, ids):
            return b"\x04" + _s(consumer) + _ids(ids)
        case Return(consumer, ids):
            return b"\x05" + _s(consumer) + _ids(ids)
        case Discard(consumer, ids):
            return b"\x06" + _s(consumer) + _ids(ids)
        case Purge():
            return b"\x07"
        case Down(connection):
            return b"\x08" + _s(connection)
        case Dequeue(consumer, settled, connection):
            return b"\x09" + _s(consumer) + (b"\x01" if settled else b"\x00") + _s(connection)
        case LeaseGrow(lease, max_messages, max_bytes, timeout_ms):
            return b"\x0a" + _s(lease) + _grow_args.pack(max_messages, max_bytes, timeout_ms)
        case LeaseSettle(lease, up_to):
            return b"\x0b" + _s(lease) + _u64.pack(up_to)
        case LeaseRelease(lease, fence):
            return b"\x0c" + _s(lease) + (b"\x01" if fence else b"")
        case Tick():
            return b"\x0d"
        case UpdateConfig(delivery_limit, max_length, max_bytes, overflow, msg_ttl, expires,
                          at_least_once):
            args = _update_args.pack(
                _OVERFLOW_CODES.index(overflow), delivery_limit,
                -1 if max_length is None else max_length, -1 if max_bytes is None else max_bytes)
            if msg_ttl is None and expires is None and not at_least_once:
                return b"\x0e" + args
            times = (_i64.pack(-1 if msg_ttl is None else msg_ttl)
                     + _i64.pack(-1 if expires is None else expires))
            if at_least_once:
                return b"\x12" + args + times + b"\x01"
            return b"\x0f" + args + times
        case DlxCheckout(worker, prefetch):
            return b"\x10" + _s(worker) + _u32.pack(prefetch)
        case DlxSettle(worker, ids):
            return b"\x11" + _s(worker) + _ids(ids)
        case NodeDown(nodes):
            return b"\x13" + _u16.pack(len(nodes)) + b"".join(_s(node) for node in nodes)
        case NodeUp(node, boot):
            return b"\x14" + _s(node) + _s(boot)
    raise TypeError(f"not a fifo command: {command!r}")


def decode(data: bytes, start: int = 0) -> Command:
    """The command encoded at `start` in `data` (after an envelope)."""
    tag = data[start]
    if tag == 1 or tag == BLIND_ENQUEUE:  # read in place: an Enqueue carries the message
        _tag, priority, size, seq = _enqueue_head.unpack_from(data, start)
        publisher, offset = _read_s(data, start + _enqueue_head.size)
        offset += 1 + data[offset]           # exchange
        offset += 1 + data[offset]           # routing key
        length = _u32.unpack_from(data, offset)[0]
        offset += 4
        # the expiration flag (1 << 8 of the header's property flags, octet 12) tested
        # in place: a message without one costs no slice and no call
        ttl = (expiration_ms(data[offset:offset + length])
               if length >= _header_fixed.size and data[offset + 12] & 1 else None)
        return Enqueue(publisher, seq, size, priority, ttl)
    if start:
        data = data[start:]
    if tag in (7, 13):
        return Purge() if tag == 7 else Tick()
    if tag in (14, 15, 18):
        overflow, delivery_limit, max_length, max_bytes = _update_args.unpack_from(data, 1)
        if overflow >= len(_OVERFLOW_CODES):
            raise ValueError(f"unknown overflow code {overflow} in a fifo UpdateConfig")
        msg_ttl = expires = -1
        if tag in (15, 18):
            msg_ttl, expires = struct.unpack_from(">qq", data, 1 + _update_args.size)
        at_least_once = tag == 18 and data[1 + _update_args.size + 16] == 1
        return UpdateConfig(delivery_limit, None if max_length < 0 else max_length,
                            None if max_bytes < 0 else max_bytes, _OVERFLOW_CODES[overflow],
                            None if msg_ttl < 0 else msg_ttl, None if expires < 0 else expires,
                            at_least_once)
    if tag == 19:
        (count,) = _u16.unpack_from(data, 1)
        nodes, offset = [], 3
        for _ in range(count):
            node, offset = _read_s(data, offset)
            nodes.append(node)
        return NodeDown(tuple(nodes))
    name, offset = _read_s(data, 1)
    if tag == 2:
        prefetch, priority = _checkout_args.unpack_from(data, offset)
        connection, _ = _read_s(data, offset + _checkout_args.size)
        return Checkout(name, prefetch, priority, connection)
    if tag == 3:
        return Cancel(name)
    if tag in (4, 5, 6):
        return (Settle, Return, Discard)[tag - 4](name, _read_ids(data, offset))
    if tag == 8:
        return Down(name)
    if tag == 9:
        return Dequeue(name, data[offset] == 1, _read_s(data, offset + 1)[0])
    if tag == 10:
        return LeaseGrow(name, *_grow_args.unpack_from(data, offset))
    if tag == 11:
        return LeaseSettle(name, _u64.unpack_from(data, offset)[0])
    if tag == 12:  # the fence byte is absent from entries written before it existed
        return LeaseRelease(name, len(data) > offset and data[offset] == 1)
    if tag == 16:
        return DlxCheckout(name, _u32.unpack_from(data, offset)[0])
    if tag == 17:
        return DlxSettle(name, _read_ids(data, offset))
    if tag == 20:
        return NodeUp(name, _read_s(data, offset)[0])
    raise ValueError(f"unknown fifo command tag {tag}")

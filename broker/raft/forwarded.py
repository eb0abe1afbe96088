"""Forwarded commands: the identity a command carries in its log entry, and the window of
identities a group has applied, so that no member applies a forwarded command twice.

Responsibilities: wrap a command's data with its identity (`wrap`) and take it off
again (`unwrap`; or `identity_of`, the command then read in place at HEAD_SIZE);
remember, per group, which identities were applied and the reply their first
application produced (`AppliedIds`: `seen`, `reply`, `record`, and for
the apply loop `admit` -- seen, else recorded, in one call -- and `keep_reply`); carry
that memory in the group's snapshots (`dump_snapshot` / `load_snapshot`). Pure: no
I/O, no clock. Used alike by every replicated group (a quorum queue, the metadata
group: broker/groups/replicated.py) and by the analytics jobs' replay.

Why: a node that does not lead a group forwards a command to the leader and sends
it again until the leader says at which (index, term) it appended it. A leader that
appended and replicated the command, then crashed before answering, leaves the
command in the log, and the resend is appended again by the next leader. Each
member skips the second entry when it applies it, because both carry the same
identity; the waiter of the second gets the first one's reply.

How it works:
- Identity: (origin, seq). `origin` is a 64-bit number a node draws when it starts
  (one per run of a node: its counters start again after a restart), `seq` counts
  that run's forwards to one group, from 1. Commands proposed on the leader itself
  carry no identity (nothing resends them to another leader).
- Entry wrapper: `u8 0xFE | u8 flags | u64 origin | u64 seq | the command's data`
  (big-endian). Flags bit 0, REPLY_AWAITED: the forwarding node waits for the
  command's reply, so it is worth keeping; the other bits are 0 and a reader
  refuses an entry with any of them set. 0xFE is neither a fifo command tag nor the
  time envelope (0xFF) nor the `{` that opens a metadata command, so the first octet
  tells a wrapped entry from any other.
- The window, per origin: `high` is the highest seq applied, `floor` =
  max(0, high - WINDOW) the seq at and below which nothing is known, and `missing`
  the seqs in (floor, high) not applied (yet): forwards are appended out of order
  after retries, so a seq below `high` may still come.
  A seq is *seen* when floor < seq <= high and it is not missing. `replies` keeps,
  for seen seqs above the floor, the first reply of each entry that awaited one and
  was not None. A seq at or below the floor is not seen: the machine applies it
  (again, if it was applied before it fell below the floor: at least once, never
  lost). Nothing is ever skipped that the window does not show applied, however
  long a forward stayed unacknowledged (a resend after a leader change, after
  thousands of later forwards of its node were applied: its publish is stored).
- At most MAX_ORIGINS origins per group: a new one evicts the origin applied least
  recently (by log index), deterministically on every member. So a group keeps at
  most MAX_ORIGINS x (WINDOW missing seqs + WINDOW replies); in practice a handful
  of origins with nothing missing and only the replies of basic.gets and purges.
- Snapshot wrapper: `b"QQAI" | u16 version (1) | u32 JSON length | JSON | the
  machine's own snapshot`. The JSON is {"origins": [[origin as 16 hex digits, floor,
  high, last index, [missing seqs], [[seq, reply], ...]], ...]}, in eviction order;
  each machine encodes its replies as JSON values (`encode_reply`). A snapshot
  without the magic (written before identities existed) is the machine's snapshot
  alone, with nothing applied.

Invariants: every member applies the same entries in the same order, so `record`
and eviction leave the same AppliedIds on every member, and a snapshot taken after
entry i restored and followed by entries i+1.. equals applying every entry. An
identity is recorded in the same apply as its command, before the snapshot that
could cover it is taken.

Not here: where the identity is given (broker/cluster/cluster.py `forward`), applying
(broker/queues/quorum/groups.py, broker/groups/metadata.py), what the commands mean.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Callable

FORWARDED = 0xFE                    # first octet of a wrapped entry
REPLY_AWAITED = 0x01                # flags: the forwarding node waits for the reply
_head = struct.Struct(">BBQQ")      # FORWARDED, flags, origin, seq
HEAD_SIZE = _head.size              # 18
WINDOW = 4096                       # seqs per origin the window tells apart
MAX_ORIGINS = 32                    # origins a group remembers
SNAPSHOT_MAGIC = b"QQAI"
SNAPSHOT_VERSION = 1
_snapshot_head = struct.Struct(">4sHI")


@dataclass(slots=True)
class Identity:
    """Never changed once made; not a frozen dataclass only because that costs three
    times as much to build (object.__setattr__ per field), and every member builds one
    per forwarded entry it applies."""

    origin: int           # the forwarding node's run (64 random bits)
    seq: int              # that run's forwards to this group, from 1
    reply_awaited: bool   # the forwarding node waits for the reply


def wrap(identity: Identity, data: bytes) -> bytes:
    """The entry data of a forwarded command."""
    flags = REPLY_AWAITED if identity.reply_awaited else 0
    return _head.pack(FORWARDED, flags, identity.origin, identity.seq) + data


def unwrap(data: bytes) -> tuple[Identity | None, bytes]:
    """(identity or None, the command's data) of a COMMAND entry."""
    identity = identity_of(data)
    return (None, data) if identity is None else (identity, data[HEAD_SIZE:])


def identity_of(data: bytes) -> Identity | None:
    """The identity of a COMMAND entry (None: not forwarded), without copying the
    command out: a wrapped command starts at HEAD_SIZE in `data` (the apply loop
    and the readers of message bodies decode it there)."""
    if not data or data[0] != FORWARDED:
        return None
    if len(data) < HEAD_SIZE:
        raise ValueError(f"a forwarded entry of {len(data)} bytes is shorter than its "
                         f"{HEAD_SIZE}-byte identity")
    _tag, flags, origin, seq = _head.unpack_from(data)
    if flags & ~REPLY_AWAITED:
        raise ValueError(f"unknown flags {flags:#04x} in a forwarded entry")
    return Identity(origin, seq, bool(flags & REPLY_AWAITED))


class _Origin:
    """One origin's window (see the module header)."""

    __slots__ = ("floor", "high", "last_index", "missing", "replies")

    def __init__(self, floor: int, high: int, last_index: int) -> None:
        self.floor = floor
        self.high = high
        self.last_index = last_index      # log index of its latest recorded entry
        self.missing: set[int] = set()    # seqs in (floor, high) not applied
        self.replies: dict[int, Any] = {}  # seq -> first reply (awaited, not None)

    def seen(self, seq: int) -> bool:
        return self.floor < seq <= self.high and seq not in self.missing

    def record(self, seq: int) -> None:
        if seq > self.high:
            if seq > self.high + 1:  # (the usual next seq skips nothing)
                self.missing.update(range(max(self.high, seq - WINDOW) + 1, seq))
            self.high = seq
            if seq - WINDOW > self.floor:
                self.floor = seq - WINDOW
                if self.missing or self.replies:
                    self.drop_below_floor()
        else:
            self.missing.discard(seq)

    def drop_below_floor(self) -> None:
        """The floor moved: forget the missing seqs and replies it passed. Past
        WINDOW forwards it moves with every one, so this rebuilds only what holds a
        seq it passed (usually nothing is missing, and replies are few)."""
        floor = self.floor
        if self.missing and min(self.missing) <= floor:
            self.missing = {s for s in self.missing if s > floor}
        if self.replies and min(self.replies) <= floor:
            self.replies = {s: r for s, r in self.replies.items() if s > floor}


class AppliedIds:
    """The identities a group applied, per origin, as a bounded window."""

    __slots__ = ("origins",)

    def __init__(self) -> None:
        # origin -> window, least recently recorded first (the eviction order)
        self.origins: dict[int, _Origin] = {}

    def seen(self, identity: Identity) -> bool:
        """Whether an entry with this identity was applied (within the window)."""
        window = self.origins.get(identity.origin)
        return window is not None and window.seen(identity.seq)

    def reply(self, identity: Identity) -> Any:
        """The reply the first application of a seen identity produced, if it was
        kept (awaited and not None); else None."""
        window = self.origins.get(identity.origin)
        return None if window is None else window.replies.get(identity.seq)

    def admit(self, identity: Identity, index: int) -> bool:
        """`seen` and the first half of `record` in one call, for the apply loop: False
        if an entry with this identity was applied (nothing changes); else the entry
        at `index` is recorded as applied and True returned (its reply, once known,
        goes to `keep_reply`)."""
        origins = self.origins
        origin = identity.origin
        seq = identity.seq
        window = origins.get(origin)
        if window is None:
            window = _Origin(0, 0, index)
            if len(origins) >= MAX_ORIGINS:
                del origins[next(iter(origins))]
        else:
            if window.floor < seq <= window.high and seq not in window.missing:
                return False  # seen
            del origins[origin]
        if seq == window.high + 1:  # twin of _Origin.record's usual next seq
            window.high = seq
            if seq - WINDOW > window.floor:  # past WINDOW forwards, on every one
                window.floor = seq - WINDOW
                if window.missing or window.replies:
                    window.drop_below_floor()
        else:
            window.record(seq)
        window.last_index = index
        origins[origin] = window  # the most recent, last
        return True

    def keep_reply(self, identity: Identity, reply: Any) -> None:
        """The reply of an entry `admit` recorded: kept if awaited and not None."""
        if identity.reply_awaited and reply is not None:
            window = self.origins.get(identity.origin)
            if window is not None and identity.seq > window.floor:
                window.replies[identity.seq] = reply

    def record(self, identity: Identity, index: int, reply: Any) -> None:
        """The entry at `index` with this identity, not seen, was applied."""
        window = self.origins.pop(identity.origin, None)
        if window is None:
            window = _Origin(0, 0, index)
            if len(self.origins) >= MAX_ORIGINS:
                del self.origins[next(iter(self.origins))]
        window.record(identity.seq)
        window.last_index = index
        self.origins[identity.origin] = window  # the most recent, last
        if identity.reply_awaited and reply is not None and identity.seq > window.floor:
            window.replies[identity.seq] = reply

    def to_json(self, encode_reply: Callable[[Any], Any]) -> dict:
        return {"origins": [[f"{origin:016x}", w.floor, w.high, w.last_index,
                             sorted(w.missing),
                             [[seq, encode_reply(reply)]
                              for seq, reply in sorted(w.replies.items())]]
                            for origin, w in self.origins.items()]}

    @classmethod
    def from_json(cls, document: dict, decode_reply: Callable[[Any], Any]) -> "AppliedIds":
        applied = cls()
        for origin, floor, high, last_index, missing, replies in document["origins"]:
            window = _Origin(floor, high, last_index)
            window.missing = set(missing)
            window.replies = {seq: decode_reply(reply) for seq, reply in replies}
            applied.origins[int(origin, 16)] = window
        return applied

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AppliedIds):
            return NotImplemented
        return self.to_json(repr) == other.to_json(repr)


def dump_snapshot(applied: AppliedIds, machine: bytes,
                  encode_reply: Callable[[Any], Any]) -> bytes:
    """A group's snapshot: the identities it applied, then its machine's snapshot."""
    document = json.dumps(applied.to_json(encode_reply), separators=(",", ":")).encode()
    return _snapshot_head.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, len(document)) + document \
        + machine


def load_snapshot(data: bytes,
                  decode_reply: Callable[[Any], Any]) -> tuple[AppliedIds, bytes]:
    """(identities applied, the machine's snapshot) of a group's snapshot; a snapshot
    written before identities existed is the machine's alone."""
    if data[:len(SNAPSHOT_MAGIC)] != SNAPSHOT_MAGIC:
        return AppliedIds(), data
    _magic, version, length = _snapshot_head.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise ValueError(f"unknown applied-identities snapshot version {version}")
    start = _snapshot_head.size
    document = json.loads(data[start:start + length])
    return AppliedIds.from_json(document, decode_reply), data[start + length:]

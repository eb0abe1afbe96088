"""Forwarded commands: the identity a command carries in its log entry, and the window of
identities a group has applied, so that no member applies a forwarded command twice.

Responsibilities: wrap a command's data with its identity (`wrap`) and take it off
again (`unwrap`; or `identity_of`, the command then read in place at HEAD_SIZE);
remember, per group, which identities were applied and the reply their first
application produced (`AppliedIds`: `seen`, `reply`, `record`, and for
the apply loop `admit` -- seen, else recorded, in one call -- and `keep_reply`); for
a quorum queue, keep each forwarding node's order (`admit_in_order`, `take_released`,
`give_up`); carry that memory in the group's snapshots (`dump_snapshot` /
`load_snapshot`). Pure: no
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
- Order (quorum queues: `admit_in_order`): an origin's commands are applied in
  its seq order, as rabbit_fifo keeps each enqueuer's order with its next expected
  sequence number. An entry whose seq is above `high` + 1 (a lower one was lost with
  a leader and is being resent) is *pending*: kept by (index, term) in the window,
  not applied, its waiters left waiting. Once the missing seq is applied, the pending
  ones follow in seq order (`take_released`; the apply loop reads them back from the
  log at their own index, so the group's release cursor stays at or below the
  lowest pending index: `lowest_pending`). The same seq appended again while pending
  is kept beside it and answered with its reply. A seq that is missing and not
  pending any more, or at or below the floor, is applied when it comes (as before).
- A gap that never fills (the forwarding node died before resending: a live one
  watches every numbered command until applied, groups/replicated.py) is
  given up, in log terms only, never by this member's clock: when a pending seq is
  more than WINDOW above `high` (the window could not tell the seqs between apart),
  once HOLD_ENTRIES log entries were applied past the origin's oldest pending entry
  (`give_up_at`), or once an entry stamped HOLD_MS after that entry's own stamp is
  applied (`give_up_ms`; the leader proposes a Tick then, so an idle queue gets one).
  Its pending entries are then released in seq order and the seqs skipped become
  missing: a late arrival is still applied, once, out of order (rabbit_fifo v1
  enqueues an enqueuer's pending messages when its process is down).
  An origin first seen with a seq above 1 waits for the seqs below it likewise.
- At most MAX_ORIGINS origins per group: a new one evicts the origin applied least
  recently (by log index), deterministically on every member; an origin with pending
  entries is not evicted. So a group keeps at most MAX_ORIGINS x (WINDOW missing seqs +
  WINDOW replies) beside the pending entries; in practice a handful of origins with
  nothing missing and only the replies of basic.gets and purges.
- Snapshot wrapper: `b"QQAI" | u16 version (2) | u32 JSON length | JSON | the
  machine's own snapshot`. The JSON is {"origins": [[origin as 16 hex digits, floor,
  high, last index, [missing seqs], [[seq, reply], ...], [[seq, [[index, term, ms],
  ...]], ...]], ...]}, in eviction order (ms: the entry's leader time, 0 if it has
  none); the last list, the pending entries, is what
  version 2 added (a version-1 snapshot loads with nothing pending). Each machine
  encodes its replies as JSON values (`encode_reply`). A snapshot without the magic
  (written before identities existed) is the machine's snapshot alone, with nothing
  applied.

Invariants: every member applies the same entries in the same order, so `record`
and eviction leave the same AppliedIds on every member, and a snapshot taken after
entry i restored and followed by entries i+1.. equals applying every entry. An
identity is recorded in the same apply as its command, before the snapshot that
could cover it is taken; a pending entry is recorded only when it is handed out to
be applied. Pending seqs are above `high`, at most WINDOW above it.

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
SNAPSHOT_VERSION = 2                # 2: pending entries per origin; 1 still loads
HOLD_ENTRIES = 65_536               # log entries a gap may hold an origin's later ones
HOLD_MS = 60_000                    # leader time a gap may hold them (a live node resends
                                    # within seconds: cluster.py RESEND_AFTER)
NEVER = 1 << 63                     # give_up_at / give_up_ms with nothing pending

# admit_in_order's answers
APPLY, SEEN, HELD = 0, 1, 2
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

    __slots__ = ("floor", "high", "last_index", "missing", "replies", "pending",
                 "flush_to")

    def __init__(self, floor: int, high: int, last_index: int) -> None:
        self.floor = floor
        self.high = high
        self.last_index = last_index      # log index of its latest recorded entry
        self.missing: set[int] = set()    # seqs in (floor, high) not applied
        self.replies: dict[int, Any] = {}  # seq -> first reply (awaited, not None)
        # seq (> high + 1) -> the (index, term, leader ms or 0) of each append of it,
        # first first: in the log, committed, waiting for a lower seq
        self.pending: dict[int, list[tuple[int, int, int]]] = {}
        self.flush_to = 0                 # pending seqs up to this go, gaps given up

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

    def raise_high(self, seq: int) -> None:
        """`seq` = high + 1 was applied (the usual next seq)."""
        self.high = seq
        if seq - WINDOW > self.floor:  # past WINDOW forwards, on every one
            self.floor = seq - WINDOW
            if self.missing or self.replies:
                self.drop_below_floor()

    def next_released(self) -> int | None:
        """The lowest pending seq if its turn came: it is the next one, or its gap
        was given up."""
        if not self.pending:
            return None
        seq = min(self.pending)
        return seq if seq == self.high + 1 or seq <= self.flush_to else None

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

    __slots__ = ("origins", "released", "give_up_at", "give_up_ms")

    def __init__(self) -> None:
        # origin -> window, least recently recorded first (the eviction order)
        self.origins: dict[int, _Origin] = {}
        # origins whose lowest pending entry may be due (take_released empties it)
        self.released: dict[int, None] = {}
        # the log index at which the oldest pending entry's gap is given up
        # (HOLD_ENTRIES after it); NEVER with nothing pending
        self.give_up_at = NEVER
        # the leader time from which an entry given up: its stamp + HOLD_MS
        self.give_up_ms = NEVER

    def _evict(self) -> None:
        """Room for a new origin: the least recent one with nothing pending goes."""
        origins = self.origins
        if len(origins) < MAX_ORIGINS:
            return
        for origin, window in origins.items():
            if not window.pending:
                del origins[origin]
                return

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
                self._evict()
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

    def admit_in_order(self, identity: Identity, index: int, term: int,
                       time_ms: int = 0) -> int:
        """`admit` keeping the origin's order (see the module header): APPLY (recorded
        now; its reply goes to `keep_reply`, then what `take_released` hands out),
        SEEN (applied before: skip it), or HELD (kept pending: apply nothing now, its
        waiters wait). `time_ms`: the entry's own leader time (0: it has none)."""
        origin, seq = identity.origin, identity.seq
        window = self.origins.get(origin)
        if window is None:
            if seq > 1:
                window = _Origin(0, 0, index)
                self._evict()
                self.origins[origin] = window
                return self._hold(origin, window, seq, index, term, time_ms)
        elif seq > window.high + 1:
            return self._hold(origin, window, seq, index, term, time_ms)
        elif window.floor < seq <= window.high and seq not in window.missing:
            return SEEN
        self.admit(identity, index)
        if window is not None and window.pending and min(window.pending) == seq + 1:
            self.released[origin] = None
        return APPLY

    def _hold(self, origin: int, window: _Origin, seq: int, index: int, term: int,
              time_ms: int) -> int:
        appends = window.pending.get(seq)
        if appends is None:
            window.pending[seq] = [(index, term, time_ms)]
            self.give_up_at = min(self.give_up_at, index + HOLD_ENTRIES)
            if time_ms:
                self.give_up_ms = min(self.give_up_ms, time_ms + HOLD_MS)
        else:
            appends.append((index, term, time_ms))  # appended again while pending
        if seq - window.high > WINDOW:  # the window cannot wait that far: give up
            window.flush_to = max(window.pending)
            self.released[origin] = None
        return HELD

    def give_up(self, index: int, time_ms: int = 0) -> None:
        """The apply loop is at log `index`, the entry there stamped `time_ms` (0:
        none), and `index` >= `give_up_at` or `time_ms` >= `give_up_ms`: the gaps of
        the origins whose oldest pending entry is HOLD_ENTRIES or HOLD_MS behind are
        given up. Decided before that entry is applied, from it and this state alone,
        so a member restored from a snapshot decides as one that applied every entry."""
        self.give_up_at = self.give_up_ms = NEVER
        for origin, window in self.origins.items():
            if not window.pending:
                continue
            firsts = [appends[0] for appends in window.pending.values()]
            oldest = min(first[0] for first in firsts)
            stamped = min((first[2] for first in firsts if first[2]), default=0)
            if oldest + HOLD_ENTRIES <= index or (
                    stamped and time_ms and stamped + HOLD_MS <= time_ms):
                window.flush_to = max(window.pending)
                self.released[origin] = None
            else:
                self.give_up_at = min(self.give_up_at, oldest + HOLD_ENTRIES)
                if stamped:
                    self.give_up_ms = min(self.give_up_ms, stamped + HOLD_MS)

    def take_released(self) -> tuple[Identity, list[tuple[int, int, int]]] | None:
        """The next pending entry whose turn came, recorded as applied now: its
        origin and seq (as an Identity: the entry itself tells whether a reply is
        awaited) and the (index, term, ms) of each append of it; the first is applied,
        the others are its duplicates. None when nothing is due."""
        released = self.released
        while released:
            origin = next(iter(released))
            window = self.origins.get(origin)
            seq = None if window is None else window.next_released()
            if seq is None:
                del released[origin]
                if window is not None:
                    window.flush_to = 0
                continue
            appends = window.pending.pop(seq)
            if seq > window.high + 1:  # a gap given up: its seqs may still come
                window.missing.update(range(max(window.high, seq - WINDOW) + 1, seq))
                window.high = seq - 1
            window.raise_high(seq)
            if window.missing and min(window.missing) <= window.floor:
                window.drop_below_floor()
            if not window.pending:
                window.flush_to = 0
                del released[origin]
            window.last_index = appends[0][0]
            del self.origins[origin]
            self.origins[origin] = window  # the most recent, last
            return Identity(origin, seq, True), appends
        return None

    def lowest_pending(self) -> int | None:
        """The lowest log index a pending entry was appended at (the log must keep it)."""
        indexes = [appends[0][0] for window in self.origins.values()
                   for appends in window.pending.values()]
        return min(indexes) if indexes else None

    def pending_indexes(self) -> list[int]:
        """Every log index that holds a pending entry or one of its repeats."""
        return sorted(append[0] for window in self.origins.values()
                      for appends in window.pending.values() for append in appends)

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
            self._evict()
        window.record(identity.seq)
        window.last_index = index
        self.origins[identity.origin] = window  # the most recent, last
        if identity.reply_awaited and reply is not None and identity.seq > window.floor:
            window.replies[identity.seq] = reply

    def to_json(self, encode_reply: Callable[[Any], Any]) -> dict:
        return {"origins": [[f"{origin:016x}", w.floor, w.high, w.last_index,
                             sorted(w.missing),
                             [[seq, encode_reply(reply)]
                              for seq, reply in sorted(w.replies.items())],
                             [[seq, [list(append) for append in appends]]
                              for seq, appends in sorted(w.pending.items())]]
                            for origin, w in self.origins.items()]}

    @classmethod
    def from_json(cls, document: dict, decode_reply: Callable[[Any], Any]) -> "AppliedIds":
        applied = cls()
        for origin, floor, high, last_index, missing, replies, *rest in document["origins"]:
            window = _Origin(floor, high, last_index)
            window.missing = set(missing)
            window.replies = {seq: decode_reply(reply) for seq, reply in replies}
            if rest:  # version 2: the pending entries
                window.pending = {seq: [(index, term, ms[0] if ms else 0)
                                        for index, term, *ms in appends]
                                  for seq, appends in rest[0]}
            applied.origins[int(origin, 16)] = window
        applied.give_up(0)  # give_up_at and _ms from the pending (nothing is due at 0)
        # a snapshot taken in the apply after a gap filled, before what that let through
        # was applied: those are due before the next entry, as on a member that went on
        applied.released = {origin: None for origin, window in applied.origins.items()
                            if window.next_released() is not None}
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
    if version not in (1, SNAPSHOT_VERSION):
        raise ValueError(f"unknown applied-identities snapshot version {version}")
    start = _snapshot_head.size
    document = json.loads(data[start:start + length])
    return AppliedIds.from_json(document, decode_reply), data[start + length:]

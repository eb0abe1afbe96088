"""Durable leases: named consumers, for the Spark connector's exactly-once replay.

A lease survives disconnects. `grow` assigns the next ready messages to it, each
getting the next lease sequence number, and replies with the new end sequence; the
assignment is a log command, so (start, end] is the same on every replica and after
every restart. Reading a range (`entries`) is a query and settles nothing. `settle`
removes everything at or below a sequence; `release` returns what is unsettled to
the queue with delivery count + 1; a lease idle for longer than its timeout is
released by the next Tick. A released lease keeps its sequence counter, so offsets
never go backwards for a query that comes back.

Fencing: a release the holder did not ask for (an operator's, `LeaseRelease(fence=True)`,
or the idle timeout) that returns messages fences the lease: it records what went
back (`LeaseFence`) and refuses every later grow and settle with that record as the
reply, so a holder that comes back learns that its checkpoint's messages may be read
elsewhere instead of settling nothing or growing past them. A holder's own release
(the connector's releaseLeaseOnStop) does not fence.

Invariants: lease sequences are contiguous from `first_seq` to `end_seq`; a message
is in at most one lease; a fenced lease holds no message and never holds one again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .commands import LeaseGrow, LeaseReleased, Meta
from .serving import take_next
from .state import FifoState, LeaseFence, LeaseState, size_of

if TYPE_CHECKING:  # pragma: no cover
    from array import array


def grow(meta: Meta, command: LeaseGrow, state: FifoState,
         effects: list) -> tuple[int, int] | LeaseFence:
    """Assign up to max_messages / max_bytes; reply (first new seq, end seq), or the
    fence of a fenced lease (nothing assigned)."""
    lease = state.leases.get(command.lease)
    if lease is None:
        lease = state.leases[command.lease] = LeaseState()
    if lease.fence is not None:
        return lease.fence
    lease.timeout_ms = command.timeout_ms
    lease.last_active = meta.system_time
    first_new = lease.next_seq
    if (not command.max_bytes and not len(state.returns) and not len(state.high)
            and state.normal.expiries is None):
        _take_normal(command.max_messages, state, lease)
    else:
        _take_each(command.max_messages, command.max_bytes, state, lease, effects)
    return first_new, lease.end_seq


def _take_each(count: int, max_bytes: int, state: FifoState, lease: LeaseState,
               effects: list) -> None:
    """Assign the next ready messages one by one, in take_next's order: up to `count`,
    stopping once `max_bytes` (0: no limit) is reached; expired ones are dropped
    (take_next), never leased."""

    taken_bytes = 0
    for _ in range(count):
        if not state.ready_count:
            break
        if max_bytes and taken_bytes and taken_bytes >= max_bytes:
            break
        taken = take_next(state, effects)
        if taken is None:
            break
        index, packed, delivered, _returned = taken  # a lease keeps counts > 0 only
        lease.indexes.append(index)
        lease.sizes.append(packed)
        if delivered:
            lease.counts[index] = delivered
        lease.next_seq += 1
        taken_bytes += size_of(packed)


def _take_normal(count: int, state: FifoState, lease: LeaseState) -> None:
    """`grow` when every ready message is in the normal queue and no byte limit
    applies: the next `count` in one slice, as `_take_each` would assign them (the
    Spark source's grows; test_machine.py's bulk-grow property holds the two equal)."""
    indexes, sizes = state.normal.popleft_many(count)
    if not indexes:
        return
    lease.indexes.extend(indexes)
    lease.sizes.extend(sizes)
    if state.delivery_counts:
        for index in indexes:
            delivered = state.delivery_counts.pop(index, 0)
            if delivered:
                lease.counts[index] = delivered
    lease.next_seq += len(indexes)
    state.high_run = 0


def settle(meta: Meta, name: str, up_to: int, state: FifoState) -> int | LeaseFence:
    """Settle everything at or below `up_to`: the count settled, or a fenced lease's
    fence (its messages went back to the queue: a late settle is refused)."""
    lease = state.leases.get(name)
    if lease is None:
        return 0
    if lease.fence is not None:
        return lease.fence
    lease.last_active = meta.system_time
    count = max(0, min(up_to, lease.end_seq) - lease.first_seq + 1)
    if count:
        for index in lease.indexes[:count]:
            lease.counts.pop(index, None)
            if state.expiries_out:
                state.expiries_out.pop(index, None)
        del lease.indexes[:count]
        del lease.sizes[:count]
        lease.first_seq += count
    return count


def release(meta: Meta, name: str, reason: str, state: FifoState, effects: list,
            fence: bool = False) -> int:
    """Return the lease's unsettled messages to the queue; with `fence` (an operator's
    release, the idle timeout) a lease that held some is fenced."""
    from .machine import requeue

    lease = state.leases.get(name)
    if lease is None:
        return 0
    count = len(lease.indexes)
    if fence and count:
        lease.fence = LeaseFence(lease.first_seq, lease.end_seq, reason, meta.system_time,
                                 lease.timeout_ms)
    for index, packed in zip(lease.indexes, lease.sizes):
        requeue(index, packed, lease.counts.get(index, 0) + 1, state, effects)
    lease.indexes = type(lease.indexes)("Q")
    lease.sizes = type(lease.sizes)("I")
    lease.counts.clear()
    lease.first_seq = lease.next_seq
    effects.append(LeaseReleased(name, reason))
    return count


def expire(meta: Meta, state: FifoState, effects: list) -> None:
    for name, lease in list(state.leases.items()):
        if (lease.timeout_ms and len(lease.indexes)
                and meta.system_time - lease.last_active > lease.timeout_ms):
            release(meta, name, "timeout", state, effects, fence=True)


def _readable(state: FifoState, name: str) -> LeaseState:
    """The lease `name` to read a range of: KeyError if unknown, ValueError naming the
    fence if it is fenced (what it held went back to the queue)."""
    lease = state.leases[name]
    fence = lease.fence
    if fence is not None:
        why = "an operator released it" if fence.reason == "released" else "its timeout"
        raise ValueError(f"lease '{name}' is fenced: its sequences {fence.first_seq}.."
                         f"{fence.end_seq} went back to the queue ({why})")
    return lease


def entries(state: FifoState, name: str, start: int, end: int) -> list[tuple[int, int, int]]:
    """The messages with lease sequence in (start, end]: (seq, raft index, delivery count).
    Raises KeyError for an unknown lease, ValueError for a range that is settled or
    not assigned."""
    lease = _readable(state, name)
    if start + 1 < lease.first_seq:
        raise ValueError(f"lease '{name}': sequences up to {lease.first_seq - 1} are settled")
    if end > lease.end_seq:
        raise ValueError(f"lease '{name}': sequences above {lease.end_seq} are not assigned")
    out = []
    for seq in range(start + 1, end + 1):
        index = lease.indexes[seq - lease.first_seq]
        out.append((seq, index, lease.counts.get(index, 0)))
    return out


def lease_slice(state: FifoState, name: str, start: int,
                end: int) -> tuple["array[int]", dict[int, int]]:
    """The messages with lease sequence in (start, end] in bulk: their raft indexes in
    sequence order (a slice of the lease's array) and {position: delivery count} for
    those delivered before. Raises as `entries` does."""
    lease = _readable(state, name)
    if start + 1 < lease.first_seq:
        raise ValueError(f"lease '{name}': sequences up to {lease.first_seq - 1} are settled")
    if end > lease.end_seq:
        raise ValueError(f"lease '{name}': sequences above {lease.end_seq} are not assigned")
    indexes = lease.indexes[start + 1 - lease.first_seq:end + 1 - lease.first_seq]
    counts = lease.counts
    if not counts:
        return indexes, {}
    return indexes, {position: count for position, index in enumerate(indexes)
                     if (count := counts.get(index))}

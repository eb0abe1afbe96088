"""The short way of `machine.apply` for an Enqueue read in place from its log entry.

What it is for: the apply loop (queues/quorum/groups.py `_apply_entries`) meets
runs of Enqueues on a quiet queue, one per published message. For each, decoding
built an Enqueue and a Meta, and `apply` then tested its short way's guard. Here
the entry's bytes are read where they lie and the message is stored at once.

`enqueue_in_place(state, index, time_ms, data, start)` is the twin of
`apply(Meta(index, term, time_ms), decode(data, start), state)` where that takes
its short way and stores the message or finds it a duplicate (machine.py, the
first branch; `_enqueue`, with no TTL; commands.py `decode` of a tag 1 Enqueue).
It returns the reply ("ok" or "duplicate"). The effects are none.

Invariant: it returns None, with the state untouched, for everything else. That is
another command (a BCC Enqueue too), a message with an expiration, a queue
something watches (consumers, settings, expiries), a release cursor due, a
rejection (publishers blocked, a publisher's gap), a duplicate into a queue with
nothing ready (a cursor then). The caller applies those the usual way.
tests/broker/fifo/test_twins.py holds the two ways equal.

Not here: the entry's envelope and forwarding head (the caller skips them).
"""

from __future__ import annotations

from .commands import _enqueue_head, _header_fixed, _u16, _u32
from .state import HIGH_BIT, HIGH_PRIORITY_ABOVE, SIZE_MASK, FifoState

_unpack_head = _enqueue_head.unpack_from
_head_size = _enqueue_head.size
_unpack_u16 = _u16.unpack_from
_unpack_u32 = _u32.unpack_from
_header_fixed_size = _header_fixed.size


def enqueue_in_place(state: FifoState, index: int, time_ms: int, data: bytes,
                     start: int) -> str | None:
    """The reply of the Enqueue at `start` in `data`, stored at `index`, or None
    (nothing done: apply it the usual way). See the module's header."""
    config = state.config
    if (data[start] != 1 or not config.quiet_enqueue or state.consumers
            or state.applied_since_cursor + 1 >= config.release_cursor_interval
            or state.normal.expiries is not None or state.high.expiries is not None
            or state.returns.expiries is not None):
        return None  # twin of apply's short-way guard (the command's part below)
    _tag, priority, size, seq = _unpack_head(data, start)
    offset = start + _head_size  # twin of decode: publisher, exchange, key, header
    (length,) = _unpack_u16(data, offset)
    publisher = data[offset + 2:offset + 2 + length].decode(
        "utf-8", "surrogateescape") if length else ""
    offset += 2 + length
    offset += 1 + data[offset]
    offset += 1 + data[offset]
    (length,) = _unpack_u32(data, offset)
    if length >= _header_fixed_size and data[offset + 16] & 1:
        return None  # an expiration property: a TTL
    # twin of _enqueue without a TTL (quiet: the queue has none either)
    if publisher:
        enqueuers = state.enqueuers
        if seq <= enqueuers.get(publisher, 0):
            if not state.ready_count:
                return None  # a duplicate into an empty queue: a release cursor
            state.now_ms = time_ms
            state.last_index = index
            state.applied_since_cursor += 1
            return "duplicate"
        gap = state.enqueuer_gaps.get(publisher)
        if state.publishers_blocked or (gap is not None and seq >= gap):
            return None  # rejected, or the gap closed: the usual way
        enqueuers[publisher] = seq
    elif state.publishers_blocked:
        return None
    # twin of state.pack and state.is_high, as _enqueue's
    packed = min(size, SIZE_MASK) | (HIGH_BIT if priority > HIGH_PRIORITY_ABOVE else 0)
    (state.high if packed & HIGH_BIT else state.normal).append(index, packed, 0)
    state.enqueue_count += 1
    state.now_ms = time_ms
    state.last_index = index
    state.applied_since_cursor += 1
    return "ok"

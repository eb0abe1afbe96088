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

`enqueue_run_in_place(state, entries, position, stop, command_kind, term_limit)`
goes on from there: the log entries after one stored "ok", as long as each is a
timed tag 1 Enqueue that `enqueue_in_place` would store "ok". Per entry it reads
the command's head, checks that the bytes from the publisher to the header's length
are the last entry's (one `startswith`), tests the header's expiration flag and
appends the message. The guard is read once per run; the fields behind those bytes
(publisher, exchange, routing key, header length) once per change of them, and the
publisher's highest seq once per change of publisher, not per message. It stops before a duplicate (the per-entry way gives
that its reply) and before the release cursor is due.

Invariant: it returns None, with the state untouched, for everything else. That is
another command (a BCC Enqueue too), a message with an expiration, a queue
something watches (consumers, settings, expiries), a release cursor due, a
rejection (publishers blocked, a publisher's gap), a duplicate into a queue with
nothing ready (a cursor then). The caller applies those the usual way.
tests/broker/fifo/test_twins.py holds the two ways equal.

Not here: the entry's envelope and forwarding head (the caller skips them; the run
takes entries without a forwarding head alone).
"""

from __future__ import annotations

from .commands import _enqueue_head, _header_fixed, _u16, _u32
from .envelope import TIMED, TIMED_HEAD
from .state import HIGH_BIT, HIGH_PRIORITY_ABOVE, SIZE_MASK, FifoState

_unpack_head = _enqueue_head.unpack_from
_head_size = _enqueue_head.size
_unpack_u16 = _u16.unpack_from
_unpack_u32 = _u32.unpack_from
_header_fixed_size = _header_fixed.size
_unpack_time = TIMED_HEAD.unpack_from
_timed_size = TIMED_HEAD.size
_command_at = TIMED_HEAD.size + _enqueue_head.size  # a timed Enqueue's publisher field
_name_at = _command_at + _u16.size                  # ... and its publisher's name


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


def enqueue_run_in_place(state: FifoState, entries, position: int, stop: int,
                         command_kind: int, term_limit: int) -> tuple[int, int]:
    """Entries `position` up to `stop` (log entries: index, term, kind, data) stored
    as `enqueue_in_place` stores each with the reply "ok", after one it stored so;
    the first one it would not store so, of a term above `term_limit`, or that is
    not a timed COMMAND (`command_kind`) ends the run. Returns (the position of the
    first entry not taken, the leader time of the last one taken, or -1 if none)."""
    config = state.config
    if (not config.quiet_enqueue or state.consumers or state.publishers_blocked
            or state.normal.expiries is not None or state.high.expiries is not None
            or state.returns.expiries is not None):
        return position, -1  # twin of enqueue_in_place's guard, once for the run
    # the cursor is due once applied_since_cursor + 1 reaches the interval
    stop = min(stop, position + config.release_cursor_interval - 1
               - state.applied_since_cursor)
    enqueuers, gaps = state.enqueuers, state.enqueuer_gaps
    normal, high = state.normal, state.high
    normal_indexes, normal_sizes = normal.indexes.append, normal.sizes.append
    high_indexes, high_sizes = high.indexes.append, high.sizes.append
    raw = b""       # the current publisher's name as it lies in the entries
    publisher = ""  # ... decoded ("": an Enqueue without a key)
    last = known = 0  # its highest seq stored; what `enqueuers` says of it
    gap = None        # its first refused seq, if any
    # the last entry's layout: its bytes from the publisher's length to the header's
    # length (publisher, exchange, routing key); where its header's property flags
    # lie (0: a header too short to hold them)
    layout: bytes | None = None
    flags_at = 0
    first = position
    normal_bytes = high_bytes = 0
    index = 0
    while position < stop:
        entry = entries[position]
        data = entry.data
        if (entry.kind != command_kind or entry.term > term_limit or data[0] != TIMED
                or data[_timed_size] != 1):
            break
        _tag, priority, size, seq = _unpack_head(data, _timed_size)
        if layout is None or not data.startswith(layout, _command_at):
            # another layout: read the fields (twin of decode's walk), and if the
            # publisher changed, its seq and gap (twin of the lookups)
            (length,) = _unpack_u16(data, _command_at)
            offset = _name_at + length
            if data[_name_at:offset] != raw:
                if last != known:
                    enqueuers[publisher] = last
                raw = data[_name_at:offset]
                publisher = raw.decode("utf-8", "surrogateescape")
                last = known = enqueuers.get(publisher, 0)
                gap = gaps.get(publisher)
            offset += 1 + data[offset]
            offset += 1 + data[offset]
            (length,) = _unpack_u32(data, offset)
            layout = data[_command_at:offset + 4]
            flags_at = offset + 16 if length >= _header_fixed_size else 0
        if flags_at and data[flags_at] & 1:
            break  # an expiration property: a TTL
        if publisher:
            if seq <= last or (gap is not None and seq >= gap):
                break  # a duplicate, or refused, or the gap closed: the usual way
            last = seq
        index = entry.index
        packed = size if size < SIZE_MASK else SIZE_MASK  # twin of state.pack, as _enqueue's
        if priority > HIGH_PRIORITY_ABOVE:  # twin of IndexQueue.append (ascending:
            high_indexes(index)             # the log's index is above every queued one)
            high_sizes(packed | HIGH_BIT)
            high_bytes += packed
        else:
            normal_indexes(index)
            normal_sizes(packed)
            normal_bytes += packed
        position += 1
    if last != known:
        enqueuers[publisher] = last
    taken = position - first
    if not taken:
        return position, -1
    time_ms = _unpack_time(entries[position - 1].data)[1]  # the last one's, as per entry
    normal.bytes += normal_bytes
    high.bytes += high_bytes
    state.enqueue_count += taken
    state.now_ms = time_ms
    state.last_index = index
    state.applied_since_cursor += taken
    return position, time_ms

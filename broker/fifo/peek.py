"""Peek: which ready message a consumer would get at a 1-based position, without
taking it (`rabbitmq-queues peek QUEUE POSITION`, RabbitMQ's `rabbit_fifo:query_peek`).

How it works: the order of `serving.take_next` is replayed on read-only cursors —
returned messages first, then the high- and normal-priority queues interleaved as
take_next interleaves them (at most two high deliveries in a row while a normal
message is older, `high_run`). Nothing in the state changes.

Like RabbitMQ's query_peek, a message whose TTL has passed but which the machine has
not dropped yet (no Tick since) still shows: peek reports the state, it does not
expire anything. Checked-out (unacked) and leased messages are not ready, so they
have no position.

Not here: reading the message's body from the log (queues/quorum/groups.py), the command line.
"""

from __future__ import annotations

from .state import FifoState


def peek(state: FifoState, position: int) -> tuple[int, int] | None:
    """(raft index, delivery count) of the ready message at `position` (1 = the next
    one delivered), or None when fewer messages are ready."""
    if position < 1:
        raise ValueError(f"position must be a positive integer, not {position}")
    returns = state.returns
    if position <= len(returns):
        index = returns.indexes[returns.head + position - 1]
        return index, state.delivery_counts.get(index, 0)
    remaining = position - len(returns)
    high, normal = state.high, state.normal
    h, n = high.head, normal.head                  # read-only cursors
    high_end, normal_end = len(high.indexes), len(normal.indexes)
    high_run = state.high_run
    while True:
        if h < high_end and n < normal_end:
            if high_run < 2 or high.indexes[h] < normal.indexes[n]:
                index, h, high_run = high.indexes[h], h + 1, high_run + 1
            else:
                index, n, high_run = normal.indexes[n], n + 1, 0
        elif h < high_end:
            index, h = high.indexes[h], h + 1
        elif n < normal_end:
            index, n, high_run = normal.indexes[n], n + 1, 0
        else:
            return None
        remaining -= 1
        if not remaining:
            return index, state.delivery_counts.get(index, 0)

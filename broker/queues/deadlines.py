"""When queues next need the clock: message TTL and queue TTL on time.

Responsibilities: keep, for each queue that asked, the earliest wall-clock
millisecond at which something of it expires (a ready head's message TTL, an unused
queue's x-expires period), so that the server wakes the node at that moment rather
than at its next half-second tick. RabbitMQ expires on timers set for the moment
(rabbit_amqqueue_process's ttl and expiry timers, rabbit_fifo's expire_msgs timer
effect): a message with a 1 ms TTL is gone a few milliseconds after it arrived,
which client test suites count on (they sleep 100 ms and look).

How it works: a heap of (ms, order, owner, callback). `add` keeps one pending
deadline per owner, the earliest: a later one is ignored, an earlier one pushed
(the older entry stays in the heap, stale). `due(now)` pops what is due and returns
the callbacks of the owners' current deadlines, each once; stale entries are
dropped. An owner whose callback ran registers its next deadline itself. Deadlines
are hints: the periodic tick still runs every queue's timers, so one missed here
is late, not lost.

Invariants: `pending[id(owner)]` is the ms of an entry of that owner in the heap;
an owner is referenced by the heap until its entries pop (so its id is not reused
meanwhile).

Not here: what an owner does when its deadline comes (queues/classic.py `tick`,
queues/quorum/groups.py `tick_queue`), arming the timer (server/server.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import count


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, object, Callable[[int], None]]] = []
        # id(owner) -> its earliest deadline; empty: nothing waits (read by the node
        # on every flush, so that the usual case costs no call)
        self.pending: dict[int, int] = {}
        self._order = count()

    def add(self, ms: int, owner: object, callback: Callable[[int], None]) -> None:
        """`callback(now_ms)` once the clock reaches `ms`, unless `owner` waits for
        an earlier deadline already (its callback registers the next one)."""
        pending = self.pending.get(id(owner))
        if pending is not None and pending <= ms:
            return
        self.pending[id(owner)] = ms
        heapq.heappush(self._heap, (ms, next(self._order), owner, callback))

    def next_ms(self) -> int | None:
        """The earliest deadline (None: none)."""
        heap = self._heap
        while heap and self.pending.get(id(heap[0][2])) != heap[0][0]:
            heapq.heappop(heap)  # stale: its owner has an earlier one, or ran
        return heap[0][0] if heap else None

    def due(self, now_ms: int) -> list[Callable[[int], None]]:
        """The callbacks whose deadline is at or before `now_ms`, forgotten here."""
        heap, pending = self._heap, self.pending
        callbacks = []
        while heap and heap[0][0] <= now_ms:
            ms, _order, owner, callback = heapq.heappop(heap)
            if pending.get(id(owner)) == ms:
                del pending[id(owner)]
                callbacks.append(callback)
        return callbacks

    def __len__(self) -> int:
        return len(self.pending)

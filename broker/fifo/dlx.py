"""At-least-once dead lettering inside the fifo machine (RabbitMQ's rabbit_fifo_dlx).

Responsibilities: hold the messages a queue dead-letters while at-least-once dead
lettering is in force (`hold`), hand them to the queue's dead-letter worker within its
prefetch (`serve`: DlxDeliver effects), let them leave once the worker settles them
(`settle`), give a new worker what the old one had not settled (`checkout`), and drop
them all when the queue switches away from at-least-once (`clear`).

How it works, as the quorum queues guide ("Dead Lettering") describes it: the source
queue keeps a dead-lettered message until every target queue confirmed it. The worker
is "a special, internal dead-letter consumer ... with manual acknowledgements": it
registers with DlxCheckout (one per leader: the newest replaces the earlier, whose
checked-out messages go back to the front of the waiting ones, in the order they
died), takes up to `prefetch` messages, publishes each through the dead-letter
exchange with publisher confirms and settles it (DlxSettle) once all its target
queues confirmed. Held messages are "live": they count towards the length limits
(reject-publish; `machine._over_limit`), keep their log entries (the release cursor
stays below them) and are reported (`messages_dlx`, `message_bytes_dlx`).

Invariants: a held message is in `discards` or in the consumer's `checked`, never
both, and never also ready, checked out to a client consumer or leased; `bytes` is
the sum of their sizes; message ids only grow, so a DlxSettle of a replaced worker
cannot settle what its successor holds (it is ignored: the successor resends, a
duplicate at worst, never a loss).

Not here: when messages die (machine.py), publishing them (queues/quorum/dead_letter_worker.py).
"""

from __future__ import annotations

from .commands import DlxDeliver, DlxDelivery, Effect
from .state import DlxConsumer, FifoState


def hold(state: FifoState, index: int, size: int, reason: str) -> None:
    """A message died: it waits for the worker."""
    state.dlx.discards.append((index, size, reason))
    state.dlx.bytes += size


def checkout(state: FifoState, worker: str, prefetch: int) -> None:
    """A new worker (or the same one with a new prefetch): see the module header."""
    dlx = state.dlx
    consumer = dlx.consumer
    if consumer is not None and consumer.worker == worker:
        consumer.prefetch = prefetch
        return
    if consumer is not None:
        for msg_id in sorted(consumer.checked, reverse=True):
            dlx.discards.appendleft(consumer.checked[msg_id])
    dlx.consumer = DlxConsumer(worker, prefetch)


def settle(state: FifoState, worker: str, msg_ids) -> int:
    consumer = state.dlx.consumer
    if consumer is None or consumer.worker != worker:
        return 0
    settled = 0
    for msg_id in msg_ids:
        item = consumer.checked.pop(msg_id, None)
        if item is not None:
            state.dlx.bytes -= item[1]
            settled += 1
    return settled


def serve(state: FifoState, effects: list[Effect]) -> None:
    """Check waiting dead letters out to the worker, up to its prefetch."""
    dlx = state.dlx
    consumer = dlx.consumer
    if consumer is None or not dlx.discards:
        return
    deliveries = []
    while dlx.discards and len(consumer.checked) < consumer.prefetch:
        item = dlx.discards.popleft()
        msg_id = dlx.next_msg_id
        dlx.next_msg_id += 1
        consumer.checked[msg_id] = item
        deliveries.append(DlxDelivery(msg_id, item[0], item[2]))
    if deliveries:
        effects.append(DlxDeliver(consumer.worker, tuple(deliveries)))


def clear(state: FifoState) -> int:
    """The queue left at-least-once: every held dead letter is deleted, as the guide
    says ("any dead-lettered messages that have not yet been confirmed by all target
    queues will be deleted"); the worker is forgotten. How many were deleted."""
    count = state.dlx.count
    state.dlx.discards.clear()
    state.dlx.consumer = None
    state.dlx.bytes = 0
    return count


def indexes(state: FifoState) -> list[int]:
    """Raft indexes of every held dead letter (live: their entries stay)."""
    held = [item[0] for item in state.dlx.discards]
    if state.dlx.consumer is not None:
        held.extend(item[0] for item in state.dlx.consumer.checked.values())
    return held

"""Consume mode's ledger: one queue's unacked deliveries, numbered (pure).

Responsibilities
    Number the deliveries of one queue contiguously from the count Spark's offsets
    name, hand out the ranges batches cover, and give the delivery tag to ack a range
    with (cumulatively). consume_reader.py does the I/O and says when.

Invariants
    - `held` is in delivery order and its numbers are contiguous.
    - After `forget` (a lost channel) numbering goes on from the last count handed to
      Spark: the broker requeued everything unacked, and delivers it again.

Not here
    The channel and its acks (consume_reader.py).
"""

from __future__ import annotations

from dataclasses import replace

from ..client.delivery import Delivery


class Ledger:
    """One queue's unacked deliveries on the current channel, numbered contiguously
    (pure: the reader does the I/O)."""

    def __init__(self) -> None:
        self.held: list[Delivery] = []
        self.next_seq: int | None = None   # None: numbering not started
        self.arrived = 0                   # deliveries received on the current channel

    @property
    def started(self) -> bool:
        return self.next_seq is not None

    @property
    def last(self) -> int:
        """The number of the last delivery received."""
        assert self.next_seq is not None
        return self.next_seq - 1

    def start_at(self, count: int) -> None:
        """Number deliveries from `count` + 1, unless numbering has started."""
        if self.next_seq is None:
            self.next_seq = count + 1

    def add(self, tag: int, method, properties, body: bytes) -> None:
        assert self.next_seq is not None, "deliveries before numbering started"
        self.held.append(Delivery(self.next_seq, body, method.exchange, method.routing_key,
                                  method.redelivered, properties, tag))
        self.next_seq += 1
        self.arrived += 1

    def ahead(self, start: int) -> int:
        """Deliveries held beyond `start`."""
        return sum(1 for delivery in self.held if delivery.seq > start)

    def through(self, seq: int) -> int | None:
        """Drop the deliveries numbered up to `seq`; the tag of the last one (to ack
        with multiple=True), None if there were none."""
        dropped = [delivery for delivery in self.held if delivery.seq <= seq]
        self.held = self.held[len(dropped):]
        return dropped[-1].tag if dropped else None

    def span(self, start: int, end: int) -> list[Delivery] | None:
        """The deliveries numbered start+1..end, None unless all of them are held."""
        chosen = [delivery for delivery in self.held if start < delivery.seq <= end]
        return chosen if len(chosen) == end - start else None

    def renumber_from(self, start: int) -> None:
        """Number the deliveries held beyond `start` (and the next ones) from start+1."""
        kept = [delivery for delivery in self.held if delivery.seq <= start]
        moved = self.held[len(kept):]
        self.held = kept + [_renumbered(delivery, start + 1 + i)
                            for i, delivery in enumerate(moved)]
        self.next_seq = start + 1 + len(moved)

    def forget(self, handed: int) -> int:
        """The channel is gone (its tags are void): drop everything, number on from
        `handed` + 1. Returns how many handed-but-unacked deliveries will come again."""
        again = sum(1 for delivery in self.held if delivery.seq <= handed)
        self.held = []
        self.arrived = 0
        if self.next_seq is not None:
            self.next_seq = handed + 1
        return again


def _renumbered(delivery: Delivery, seq: int) -> Delivery:
    return replace(delivery, seq=seq)

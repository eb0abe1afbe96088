"""Offsets of both modes, and the planning decisions made on them (pure).

Lease mode: an offset names the query's lease and, per queue, the last lease sequence a batch
covers:

    {"lease": "spark-5f0c...", "queues": {"orders": 1200, "returns": 75}}

Spark logs the end offset of batch N before running it, so `(start, end]` per queue
is fixed once logged; the broker assigned those sequences through a Raft command
(lease.grow), so reading the range again after any restart yields the same messages.

Consume mode: an offset counts, per queue, the messages handed to Spark since the
query first started (the driver numbers deliveries on from the checkpoint's count):

    {"delivered": {"orders": 1200, "returns": 75}}

The count fixes how many messages each queue contributes to a logged batch; which
messages they are is the broker's choice again after a driver restart (consume_reader.py).

Responsibilities
    - `LeaseOffset`: the offset's JSON form, validated when read back from a
      checkpoint (a malformed offset is an error naming the checkpoint, never a
      silent restart from zero).
    - `batch_limit`, `to_grow`, `batch_end`: how far a batch may go in one queue,
      given what the lease already holds, the read limit and the Trigger.AvailableNow
      target, and how much more to ask the broker for.
    - `ranges`: a batch's `(start, end]` per queue cut into partitions, of the size
      `partition_sizes` picks (options minPartitions and maxMessagesPerPartition).
    - `ConsumeOffset`: consume mode's JSON form, validated the same way.

Invariants
    - Sequences only grow: a batch's end is never below its start, per queue.
    - `to_json` is canonical (queues sorted), so an unchanged offset serialises to the
      same text and Spark sees "no new data".

Not here
    Talking to the broker (lease_reader.py, consume_reader.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition


class OffsetError(ValueError):
    """An offset (from Spark's checkpoint) that is not a lease-mode offset."""



def moved_forward(positions, ends: Mapping[str, int]) -> dict[str, int]:
    """`positions` ((queue, position) pairs) with the queues in `ends` moved to their
    new positions; a queue may not move back."""
    merged = dict(positions)
    for queue, position in ends.items():
        if position < merged.get(queue, 0):
            raise OffsetError(f"queue {queue!r} would move back from "
                              f"{merged[queue]} to {position}")
        merged[queue] = position
    return merged

@dataclass(frozen=True, slots=True)
class LeaseOffset:
    lease: str
    positions: tuple[tuple[str, int], ...]   # (queue, last sequence covered), by queue

    @classmethod
    def initial(cls, lease: str, queues: Iterable[str]) -> "LeaseOffset":
        return cls(lease, tuple(sorted((queue, 0) for queue in queues)))

    @classmethod
    def of(cls, lease: str, positions: Mapping[str, int]) -> "LeaseOffset":
        return cls(lease, tuple(sorted(positions.items())))

    @classmethod
    def from_json(cls, document: object) -> "LeaseOffset":
        if (not isinstance(document, dict) or set(document) != {"lease", "queues"}
                or not isinstance(document["lease"], str) or not document["lease"]
                or not isinstance(document["queues"], dict)):
            raise OffsetError(f"not a quorumqueue lease-mode offset: {document!r}; was this "
                              "checkpoint written by another source or in consume mode?")
        positions = document["queues"]
        for queue, seq in positions.items():
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
                raise OffsetError(f"offset {document!r}: queue {queue!r} has an invalid "
                                  f"position {seq!r}")
        return cls.of(document["lease"], positions)

    def to_json(self) -> dict:
        return {"lease": self.lease, "queues": dict(self.positions)}

    def position(self, queue: str) -> int:
        """The last sequence covered in `queue`; 0 for a queue not read yet."""
        for name, seq in self.positions:
            if name == queue:
                return seq
        return 0

    def advanced(self, ends: Mapping[str, int]) -> "LeaseOffset":
        """This offset with the queues in `ends` moved to their new positions."""
        return LeaseOffset.of(self.lease, moved_forward(self.positions, ends))


def new_lease_name() -> str:
    """One lease per query: named once, when the query first starts, and from then on
    carried in every offset Spark checkpoints."""
    return f"spark-{uuid.uuid4().hex}"


def rotated(queues: Sequence[str], turn: int) -> list[str]:
    """The queues starting at `turn` (mod len): who is served first this trigger."""
    if not queues:
        return []
    k = turn % len(queues)
    return list(queues[k:]) + list(queues[:k])


def batch_limit(start: int, budget: int | None, target: int | None) -> int | None:
    """The highest sequence a batch starting after `start` may reach in one queue.

    `budget`: messages the queue may add to this batch (None: no limit);
    `target`: a Trigger.AvailableNow run's last sequence (None: not such a run).
    None: no limit at all.
    """
    limit = None if budget is None else start + budget
    if target is not None:
        limit = target if limit is None else min(limit, target)
    return None if limit is None else max(limit, start)


def to_grow(held: int, limit: int | None, everything: int) -> int:
    """How many more messages to ask the broker for, when the lease already holds
    sequences up to `held`: none if that reaches `limit`, `everything` (the broker's
    maximum) if there is no limit."""
    if limit is None:
        return everything
    return max(0, limit - held)


def batch_end(held: int, limit: int | None) -> int:
    """Where the batch ends once the lease holds sequences up to `held`."""
    return held if limit is None else min(held, limit)


@dataclass(frozen=True)
class LeaseRange(InputPartition):
    """One partition: the messages with sequences start+1..end of `lease` on `queue`."""

    queue: str
    lease: str
    start: int
    end: int

    @property
    def value(self):  # InputPartition's field, shown by Spark in plans
        return (self.queue, self.start, self.end)


@dataclass(frozen=True, slots=True)
class Cut:
    """How a mode cuts a batch into partitions, before the options change it."""

    per_queue: int | None   # aim for this many partitions per queue (None: as few as fit)
    floor: int              # ... but no partition smaller than this
    cap: int                # no partition larger than this


def partition_sizes(counts: Mapping[str, int], cut: Cut, min_partitions: int | None = None,
                    max_per_partition: int | None = None) -> dict[str, int]:
    """Messages per partition, per queue, for a batch whose queues contribute `counts`.

    The mode's cut first: one size for every queue, a share of the largest queue
    (`per_queue` partitions of it) between `floor` and `cap`, and when `cap` cuts the
    largest queue into more than `per_queue` partitions, into a multiple of
    `per_queue` of them (the size evened out to it); option maxMessagesPerPartition
    replaces `cap` (and lowers `floor` to it) and is then the size whenever it is
    below the share (no evening out), else the share stays (it only caps: 100,000 in
    lease mode with 50,000 are still 4 of 25,000). If that gives
    fewer partitions than option minPartitions, the size shrinks to the largest that
    gives enough (or 1, when the batch has fewer messages than that), and each queue's
    partitions are then evened out (100 messages in 4 partitions: 25 each, not 33, 33,
    33 and 1). A function of the counts and options alone, so a replayed batch is cut
    the same way.
    """
    sizes = [count for count in counts.values() if count > 0]
    cap = max_per_partition or cut.cap
    floor = min(cut.floor, cap)
    largest = max(sizes, default=0)
    size = cap if cut.per_queue is None else -(-largest // cut.per_queue)
    size = max(1, min(cap, max(floor, size)))
    if cut.per_queue is not None and max_per_partition is None and size == cap:
        # more than per_queue partitions of the largest queue: a multiple of per_queue,
        # so that they fill every core in whole waves (5 on 2 cores are 3 waves)
        pieces = cut.per_queue * -(-largest // (cut.per_queue * cap))
        size = -(-largest // pieces)
    if min_partitions is None or _pieces(sizes, size) >= min_partitions:
        return {queue: size for queue in counts}
    if sum(sizes) <= min_partitions:
        size = 1
    else:
        low, high = 1, size   # _pieces(low) >= min_partitions > _pieces(high)
        while high - low > 1:
            middle = (low + high) // 2
            if _pieces(sizes, middle) >= min_partitions:
                low = middle
            else:
                high = middle
        size = low
    return {queue: -(-count // -(-count // size)) if count > 0 else size
            for queue, count in counts.items()}


def _pieces(counts: Iterable[int], size: int) -> int:
    return sum(-(-count // size) for count in counts)


def ranges(start: LeaseOffset, end: LeaseOffset,
           max_messages: int | Mapping[str, int]) -> list[LeaseRange]:
    """Partitions covering `(start, end]` in every queue, at most `max_messages` each
    (one number, or one per queue)."""
    if start.lease != end.lease:
        raise OffsetError(f"a batch cannot span two leases ({start.lease!r} -> {end.lease!r})")
    out = []
    for queue, last in end.positions:
        first = start.position(queue)
        if last < first:
            raise OffsetError(f"queue {queue!r}: batch end {last} is below its start {first}")
        step = max_messages if isinstance(max_messages, int) else max_messages[queue]
        for low in range(first, last, step):
            out.append(LeaseRange(queue, end.lease, low, min(low + step, last)))
    return out


@dataclass(frozen=True, slots=True)
class ConsumeOffset:
    positions: tuple[tuple[str, int], ...]   # (queue, messages handed to Spark), by queue

    @classmethod
    def initial(cls, queues: Iterable[str]) -> "ConsumeOffset":
        return cls(tuple(sorted((queue, 0) for queue in queues)))

    @classmethod
    def of(cls, positions: Mapping[str, int]) -> "ConsumeOffset":
        return cls(tuple(sorted(positions.items())))

    @classmethod
    def from_json(cls, document: object) -> "ConsumeOffset":
        if (not isinstance(document, dict) or set(document) != {"delivered"}
                or not isinstance(document["delivered"], dict)):
            raise OffsetError(f"not a quorumqueue consume-mode offset: {document!r}; was this "
                              "checkpoint written by another source or in lease mode?")
        for queue, count in document["delivered"].items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise OffsetError(f"offset {document!r}: queue {queue!r} has an invalid "
                                  f"count {count!r}")
        return cls.of(document["delivered"])

    def to_json(self) -> dict:
        return {"delivered": dict(self.positions)}

    def position(self, queue: str) -> int:
        """Messages of `queue` handed to Spark so far; 0 for a queue not read yet."""
        return dict(self.positions).get(queue, 0)

    def advanced(self, ends: Mapping[str, int]) -> "ConsumeOffset":
        return ConsumeOffset.of(moved_forward(self.positions, ends))

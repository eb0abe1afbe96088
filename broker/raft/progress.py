"""What a leader knows about each follower's log, and how fast it may send to it.

Responsibilities: per follower, the highest index known to match (`match`), the next
index to send (`next`), and a flow-control state (the etcd-io/raft design):

- PROBE: we do not know where the follower's log diverges. Send one AppendEntries,
  then pause until an answer (or a heartbeat answer) arrives; a rejection moves `next`
  back using the follower's hint.
- REPLICATE: the follower is known to accept what we send. Send optimistically,
  advancing `next` as we send, with at most `max_inflight` unacknowledged messages.
- SNAPSHOT: the follower needs entries we compacted; an InstallSnapshot is out. Send
  nothing else until it is answered or reported failed.

Invariants: match < next; match only grows (a follower's matching prefix never
shrinks while we lead); inflights hold increasing last-indexes of unacknowledged
AppendEntries and exist only in REPLICATE.

Not here: the messages themselves (leader.py), the quorum rule (membership.quorum).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Inflights:
    """The last index of each unacknowledged AppendEntries, oldest first."""

    __slots__ = ("capacity", "_last_indexes")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._last_indexes: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._last_indexes)

    def full(self) -> bool:
        return len(self._last_indexes) >= self.capacity

    def add(self, last_index: int) -> None:
        assert not self.full(), "inflight window overflow"
        self._last_indexes.append(last_index)

    def oldest(self) -> int | None:
        return self._last_indexes[0] if self._last_indexes else None

    def free_le(self, index: int) -> None:
        """Acknowledged up to `index`: forget every message ending at or before it."""
        while self._last_indexes and self._last_indexes[0] <= index:
            self._last_indexes.popleft()

    def reset(self) -> None:
        self._last_indexes.clear()


@dataclass(slots=True)
class Progress:
    match: int
    next: int
    inflights: Inflights
    state: ProgressState = ProgressState.PROBE
    probe_sent: bool = False       # PROBE: an AppendEntries is out, wait for an answer
    pending_snapshot: int = 0      # SNAPSHOT: the index of the snapshot sent
    snapshot_elapsed: int = 0      # SNAPSHOT: ticks since it was sent
    recent_active: bool = True     # answered since the last check-quorum round
    stalled_candidate: int | None = None  # REPLICATE: oldest inflight at the last heartbeat

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
            self.pending_snapshot = 0
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflights.reset()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.stalled_candidate = None
        self.inflights.reset()

    def become_snapshot(self, index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = index
        self.snapshot_elapsed = 0
        self.inflights.reset()

    def maybe_update(self, index: int) -> bool:
        """The follower matches up to `index`; True if that is news."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return updated

    def maybe_decr_to(self, rejected: int, hint: int) -> bool:
        """The follower rejected prev_index `rejected`; False if the rejection is stale."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.state is ProgressState.SNAPSHOT or self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, hint + 1), self.match + 1)
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return True

    def sent_entries(self, count: int, last_index: int) -> None:
        """An AppendEntries carrying `count` entries ending at `last_index` went out."""
        if self.state is ProgressState.REPLICATE:
            if count:
                self.next = last_index + 1
                self.inflights.add(last_index)
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True


def quorum_index(matches: list[int]) -> int:
    """The largest index a majority of `matches` has reached."""
    ordered = sorted(matches, reverse=True)
    return ordered[len(ordered) // 2]

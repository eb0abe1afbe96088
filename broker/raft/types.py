"""Values shared by the Raft core and the log storage. Small, frozen, slotted.

Invariants: log indexes start at 1 and are contiguous within a group; a term never
decreases along a log; `SnapshotMeta.index` is the last index the snapshot covers.
"""

from __future__ import annotations

from dataclasses import dataclass

# LogEntry.kind
COMMAND = 0      # an opaque state-machine command (e.g. a fifo enqueue)
NOOP = 1         # appended by a new leader to commit entries of earlier terms
MEMBERSHIP = 2   # data = encoded member list; takes effect when appended


@dataclass(frozen=True, slots=True)
class LogEntry:
    index: int
    term: int
    kind: int
    data: bytes


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message depending on it is sent."""
    term: int = 0
    voted_for: str | None = None


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    index: int
    term: int
    members: tuple[str, ...]

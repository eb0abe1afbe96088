"""Values shared by the Raft core and the log storage. Small, slotted, frozen (LogEntry:
never changed, but not frozen, for speed).

Invariants: log indexes start at 1 and are contiguous within a group; a term never
decreases along a log; `SnapshotMeta.index` is the last index the snapshot covers.
"""

from __future__ import annotations

from dataclasses import dataclass

# LogEntry.kind
COMMAND = 0      # an opaque state-machine command (e.g. a fifo enqueue)
NOOP = 1         # appended by a new leader to commit entries of earlier terms
MEMBERSHIP = 2   # data = encoded member list; takes effect when appended


@dataclass(slots=True, unsafe_hash=True)
class LogEntry:
    """Never changed once made; not frozen because a frozen dataclass's __init__
    costs about four times a plain one (object.__setattr__ per field), and an entry
    is built per message on every member (a proposal, each one received)."""

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

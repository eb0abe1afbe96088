"""The messages Raft members exchange: a closed vocabulary of frozen dataclasses.

Responsibilities: name every message and its fields; nothing else (no encoding, no
behaviour). Every message carries `term`, `from_` and `to` (member ids); `from_`
has a trailing underscore because `from` is a Python keyword.

How they are used (Raft paper section numbers, Ongaro's thesis for the extensions):
- RequestVote / RequestVoteResponse: elections (§5.2). With `pre_vote` the request
  names the term the sender *would* campaign in, and nobody's term changes (thesis
  §9.6). `leadership_transfer` marks the election a TimeoutNow started; it may
  interrupt a live leader's lease (thesis §3.10).
- AppendEntries / AppendEntriesResponse: replication and heartbeats (§5.3). A
  heartbeat is an AppendEntries with no entries. A rejection carries a hint for fast
  backtracking: the follower's largest index whose term is <= prev_term. A heartbeat
  marked `quiet` is a quiescing leader's last (config.py `quiesce`): every member
  holds its whole log, committed, and it sends nothing more until something changes.
- InstallSnapshot / InstallSnapshotResponse: a follower needs entries the leader has
  compacted (§7). The core emits InstallSnapshot with `data=None`; the shell attaches
  the bytes of the snapshot `meta` names before sending (`with_data`).
- TimeoutNow: the leader asks a caught-up follower to campaign at once (thesis §3.10).

Invariants: messages are immutable values; `entries` are contiguous and start at
prev_index + 1.

Not here: wire encoding (the transport's business), the state machine's commands.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeAlias

from .types import LogEntry, SnapshotMeta


@dataclass(frozen=True, slots=True)
class RequestVote:
    term: int                  # pre_vote: the term the sender would campaign in
    from_: str
    to: str
    last_index: int            # the candidate's last log index ...
    last_term: int             # ... and its term (§5.4.1 up-to-date check)
    pre_vote: bool = False
    leadership_transfer: bool = False


@dataclass(frozen=True, slots=True)
class RequestVoteResponse:
    term: int                  # granted pre-vote: the request's term; else the voter's
    from_: str
    to: str
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class AppendEntries:
    term: int
    from_: str
    to: str
    prev_index: int
    prev_term: int
    entries: tuple[LogEntry, ...]
    leader_commit: int
    quiet: bool = False        # the last heartbeat before the leader falls silent


@dataclass(frozen=True, slots=True)
class AppendEntriesResponse:
    term: int
    from_: str
    to: str
    success: bool
    match_index: int           # success: the follower's log matches the leader's up to here
    rejected_index: int = 0    # rejection: the prev_index that did not match
    hint_index: int = 0        # rejection: largest follower index with term <= prev_term
    hint_term: int = 0         # rejection: the term at hint_index


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    term: int
    from_: str
    to: str
    meta: SnapshotMeta
    data: bytes | None = None  # None until the shell attaches the snapshot bytes

    def with_data(self, data: bytes) -> InstallSnapshot:
        return replace(self, data=data)


@dataclass(frozen=True, slots=True)
class InstallSnapshotResponse:
    term: int
    from_: str
    to: str
    match_index: int           # the follower's log matches the leader's up to here


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    term: int
    from_: str
    to: str


Message: TypeAlias = (RequestVote | RequestVoteResponse | AppendEntries
                      | AppendEntriesResponse | InstallSnapshot | InstallSnapshotResponse
                      | TimeoutNow)

"""Ready: everything a RaftNode needs its caller to do, in the order it must be done.

Responsibilities: carry the core's outputs across the boundary, and say in its shape
what ordering the caller owes (etcd-io/raft's Ready):

1. persist — `snapshot` (replaces the whole stored log), then drop stored entries
   >= `truncate_from`, then append `entries`, then `hard_state`. All of it durable
   before step 2: a vote or an acknowledgement must never leave before what it
   promises is on disk.
2. send `messages` (after attaching snapshot bytes to InstallSnapshot messages: the
   core emits them with `data=None`; attach the stored snapshot named by `meta`, or
   call `report_snapshot(peer, success=False)` if it is gone).
3. apply — restore the state machine from `snapshot` if any, then apply `committed` in
   index order. Entries of kind NOOP and MEMBERSHIP are included (the state machine
   skips them or uses them); every committed index is handed out exactly once.
4. call `advance(ready)`.

`committed` may include entries that this same Ready persists (a follower can learn an
entry and its commit in one message): step 1 comes first, so nothing is applied before
it is durable locally. `RaftNode.ready_to_apply()` gives the other kind of Ready: only
committed entries that are already durable here, nothing to persist or send, so the
caller applies and advances it at once (a single member's entries right after the
fsync that committed them, without waiting for the fsync of entries proposed
meanwhile); its soft fields repeat the last reported ones (leader news waits for
`ready()`). Inputs (`step`, `tick`, `propose`...) may arrive between
`ready()` and `advance()`; what they produce waits for the next Ready.

The remaining fields describe the node after this Ready, for the shell (routing client
requests to `leader_id`, connecting to `members`).

Invariants: one Ready is outstanding at a time; `entries` are contiguous; if
`truncate_from` is set it equals entries[0].index; committed entries never precede
the snapshot.

Not here: how the caller persists or sends (storage, transport).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .log import Snapshot
from .messages import Message
from .types import HardState, LogEntry


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class Ready:
    # 1. persist
    hard_state: HardState | None          # None: unchanged since the last Ready
    snapshot: Snapshot | None             # received from the leader; persist, then restore
    truncate_from: int | None             # drop stored entries with index >= this first
    entries: tuple[LogEntry, ...]         # append (contiguous)
    # 2. send, only after everything above is durable
    messages: tuple[Message, ...]
    # 3. apply, in order
    committed: tuple[LogEntry, ...]
    # the node after this Ready
    term: int
    role: Role
    leader_id: str | None
    leader_changed: bool                  # leader_id differs from the previous Ready's
    commit_index: int
    members: tuple[str, ...]

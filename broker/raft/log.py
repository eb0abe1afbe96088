"""The Raft log as the core sees it: stable storage underneath, an unstable suffix on top.

Responsibilities: answer "what term is at index i", "give me entries [lo, hi)",
"is this candidate's log at least as up to date as mine" (§5.4.1), append and
truncate-on-conflict (§5.3), and track three cursors: what is persisted, committed
and applied.

How it works: `LogReader` is the read interface the storage layer implements. The
core never writes to storage; it keeps what it has appended but the caller has not yet
persisted in an in-memory suffix (`_unstable`, starting at `_offset`), hands it out in
`Ready.entries`, and drops it once `advance()` reports it durable (`stable_to`). A
snapshot a follower received from its leader is held the same way until persisted
(`_unstable_snapshot`); while it is held, storage's contents are ignored (persisting
the snapshot replaces the whole stored log).

Invariants:
- applied <= committed <= last_index(); committed entries are never truncated.
- index 0 has term 0 and matches every log (the empty prefix).
- stored entries at index >= `_offset` are stale (being overwritten) and never read.
- a conflict truncation always comes with at least one new entry, so an empty unstable
  suffix means storage's last index is the log's last index.

Not here: membership (membership.py), who replicates what to whom (leader.py), any I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from itertools import repeat
from typing import Protocol

from .errors import RaftInvariantError
from .types import HardState, LogEntry, SnapshotMeta


class LogReader(Protocol):
    """What the core reads from a member's durable state. Implemented by storage.

    - first_index(): the first index held; 1 for a fresh log, at most snapshot.index + 1
      after compaction (storage may keep some entries below its snapshot).
    - last_index(): the last index held; first_index() - 1 when it holds none.
    - term_at(i): the term of entry i for first_index() <= i <= last_index(), else None.
      (Index 0 and the snapshot's index are answered by the core itself.)
    - entries(lo, hi): the entries lo <= index < hi, all within the held range.
    - snapshot_meta(): the latest persisted snapshot, or None.
    - hard_state(): the latest persisted HardState (HardState() when none).
    - members(): the initial membership, used when neither a snapshot nor a membership
      entry says otherwise.
    """

    def first_index(self) -> int: ...
    def last_index(self) -> int: ...
    def term_at(self, index: int) -> int | None: ...
    def entries(self, lo: int, hi: int) -> list[LogEntry]: ...
    def snapshot_meta(self) -> SnapshotMeta | None: ...
    def hard_state(self) -> HardState: ...
    def members(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A state-machine snapshot and what it covers (log up to meta.index)."""
    meta: SnapshotMeta
    data: bytes


class RaftLog:
    def __init__(self, storage: LogReader) -> None:
        self.storage = storage
        snapshot = storage.snapshot_meta()
        first = storage.first_index()
        if snapshot is None and first != 1:
            raise RaftInvariantError(f"storage starts at index {first} without a snapshot")
        if snapshot is not None and first > snapshot.index + 1:
            raise RaftInvariantError(
                f"storage starts at index {first}, after its snapshot ({snapshot.index}) + 1")
        base = snapshot.index if snapshot else 0
        self.committed = base   # the state machine restarts from the snapshot
        self.applied = base     # highest index handed to the caller to apply (or snapshot)
        self._unstable_snapshot: Snapshot | None = None
        self._offset = storage.last_index() + 1   # index of _unstable[0]
        self._unstable: list[LogEntry] = []

    # --- reading ---------------------------------------------------------------------

    def snapshot_meta(self) -> SnapshotMeta | None:
        if self._unstable_snapshot is not None:
            return self._unstable_snapshot.meta
        return self.storage.snapshot_meta()

    def first_index(self) -> int:
        if self._unstable_snapshot is not None:
            return self._unstable_snapshot.meta.index + 1
        return self.storage.first_index()

    def last_index(self) -> int:
        if self._unstable:
            return self._offset + len(self._unstable) - 1
        if self._unstable_snapshot is not None:
            return self._unstable_snapshot.meta.index
        return self.persisted_index()

    def persisted_index(self) -> int:
        """The last index of the log that is durable (and current) in storage."""
        if self._unstable_snapshot is not None:
            return 0
        return min(self.storage.last_index(), self._offset - 1)

    def last_term(self) -> int:
        term = self.term_at(self.last_index())
        assert term is not None
        return term

    def term_at(self, index: int) -> int | None:
        if index == 0:
            return 0
        if index >= self._offset:
            position = index - self._offset
            return self._unstable[position].term if position < len(self._unstable) else None
        if self._unstable_snapshot is not None:
            meta = self._unstable_snapshot.meta
            return meta.term if index == meta.index else None
        meta = self.storage.snapshot_meta()
        if meta is not None and index == meta.index:
            return meta.term
        if index < self.storage.first_index() or index > self.persisted_index():
            return None
        return self.storage.term_at(index)

    def match_term(self, index: int, term: int) -> bool:
        return self.term_at(index) == term

    def entries(self, lo: int, hi: int) -> list[LogEntry]:
        """Entries lo <= index < hi; lo must not be compacted (lo >= first_index())."""
        if lo >= hi:
            return []
        if lo < self.first_index() or hi > self.last_index() + 1:
            raise RaftInvariantError(f"entries [{lo}, {hi}) outside the log "
                                     f"[{self.first_index()}, {self.last_index() + 1})")
        out: list[LogEntry] = []
        if lo < self._offset:
            out.extend(self.storage.entries(lo, min(hi, self._offset)))
        if hi > self._offset:
            out.extend(self._unstable[max(lo, self._offset) - self._offset:hi - self._offset])
        return out

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Is a log ending at (last_index, last_term) at least as up to date as ours?"""
        ours = self.last_term()
        return last_term > ours or (last_term == ours and last_index >= self.last_index())

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest i <= index whose term is <= term, and that term (0 if unknown).

        Used for fast backtracking: a follower rejecting prev (index, term) answers with
        this, and the leader looks up the answer in its own log.
        """
        while index > 0:
            ours = self.term_at(index)
            if ours is None:
                return index, 0
            if ours <= term:
                return index, ours
            index -= 1
        return 0, 0

    # --- writing ---------------------------------------------------------------------

    def append(self, entries: list[LogEntry]) -> None:
        """Leader path: entries continue the log."""
        if entries and entries[0].index != self.last_index() + 1:
            raise RaftInvariantError(f"append at {entries[0].index} after last index "
                                     f"{self.last_index()}")
        if not self._unstable:
            self._offset = self.last_index() + 1
        self._unstable.extend(entries)

    def append_run(self, term: int, kind: int, datas: Sequence[bytes]) -> int:
        """Leader path, once per proposal run: one entry per data after the last, in
        order; the index of the first. (`append([LogEntry(last_index() + 1, ...),
        ...])` without the list and the second `last_index`.)"""
        unstable = self._unstable
        if unstable:
            index = self._offset + len(unstable)
        else:
            index = self._offset = self.last_index() + 1
        unstable.extend(map(LogEntry, range(index, index + len(datas)), repeat(term),
                            repeat(kind), datas))
        return index

    def maybe_append(self, prev_index: int, prev_term: int,
                     entries: tuple[LogEntry, ...]) -> tuple[int, list[LogEntry], int | None] | None:
        """Follower path (§5.3). None if (prev_index, prev_term) does not match.

        Otherwise (last new index, the entries actually appended, truncated-from index
        or None): entries we already have are skipped; at the first conflicting entry
        our suffix is cut off and the rest of `entries` appended.
        """
        if not self.match_term(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        for position, entry in enumerate(entries):
            if self.match_term(entry.index, entry.term):
                continue
            if entry.index <= self.committed:
                raise RaftInvariantError(f"entry {entry.index} conflicts with the committed "
                                         f"log (committed {self.committed})")
            new = list(entries[position:])
            truncated = entry.index if entry.index <= self.last_index() else None
            self._truncate_and_append(new)
            return last_new, new, truncated
        return last_new, [], None

    def _truncate_and_append(self, entries: list[LogEntry]) -> None:
        first = entries[0].index
        if first == self._offset + len(self._unstable):
            self._unstable.extend(entries)
        elif first <= self._offset:
            self._offset = first          # stored entries >= first are stale from now on
            self._unstable = list(entries)
        else:
            del self._unstable[first - self._offset:]
            self._unstable.extend(entries)

    def restore(self, snapshot: Snapshot) -> None:
        """Follower path (§7): replace the whole log with a leader's snapshot."""
        self._unstable_snapshot = snapshot
        self._offset = snapshot.meta.index + 1
        self._unstable = []
        self.committed = snapshot.meta.index

    def commit_to(self, index: int) -> bool:
        if index <= self.committed:
            return False
        if index > self.last_index():
            raise RaftInvariantError(f"commit {index} beyond last index {self.last_index()}")
        self.committed = index
        return True

    def maybe_commit(self, index: int, term: int) -> bool:
        """Leader path: commit up to `index` only if it is from the current term (§5.4.2)."""
        return index > self.committed and self.term_at(index) == term and self.commit_to(index)

    # --- the Ready cycle -------------------------------------------------------------

    def unstable_snapshot(self) -> Snapshot | None:
        return self._unstable_snapshot

    def unstable_entries(self) -> tuple[LogEntry, ...]:
        return tuple(self._unstable)

    def stored_last_index(self) -> int:
        return self.storage.last_index()

    def stable_to(self, index: int, term: int) -> None:
        """Entries up to (index, term) are durable, unless they were replaced meanwhile."""
        if index >= self._offset and self.term_at(index) == term:
            del self._unstable[:index + 1 - self._offset]
            self._offset = index + 1

    def stable_snapshot_to(self, index: int) -> None:
        snapshot = self._unstable_snapshot
        if snapshot is not None and snapshot.meta.index == index:
            self._unstable_snapshot = None
        self.applied = max(self.applied, index)

    def applied_to(self, index: int) -> None:
        if index < self.applied or index > self.committed:
            raise RaftInvariantError(f"applied {index} outside ({self.applied}, "
                                     f"{self.committed}]")
        self.applied = index

    def committed_to_apply(self, after: int) -> list[LogEntry]:
        """Committed entries after max(applied, after), in index order."""
        lo = max(self.applied, after) + 1
        return self.entries(lo, self.committed + 1) if lo <= self.committed else []

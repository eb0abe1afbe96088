"""GroupLog: one group's stored log, as the Raft core reads it.

Implements `broker.raft.log.LogReader` by delegating to the node's LogStore, so a
RaftLog can be built over it: `RaftLog(store.group_log("%2F/orders"))`. The view holds
no state of its own; what it answers changes as the store is written to.

- first_index(): snapshot index + 1, or 1 without a snapshot (entries the store keeps
  below the snapshot are message bodies for the state machine, not Raft's log);
- last_index(): the last index written (durable or pending a flush);
- term_at(i): the term of entry i in [first_index(), last_index()], the snapshot's
  term at its index, 0 at index 0, None anywhere else;
- members(): the group's initial membership (`LogStore.set_initial_members`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..types import HardState, LogEntry, SnapshotMeta

if TYPE_CHECKING:
    from .log_store import LogStore


class GroupLog:
    __slots__ = ("_store", "group")

    def __init__(self, store: LogStore, group: str) -> None:
        self._store = store
        self.group = group

    def first_index(self) -> int:
        return self._store.first_index(self.group)

    def last_index(self) -> int:
        return self._store.last_index(self.group)

    def term_at(self, index: int) -> int | None:
        if 0 < index < self._store.first_index(self.group) - 1:
            return None            # below the snapshot: not part of Raft's log
        return self._store.term_at(self.group, index)

    def entries(self, lo: int, hi: int) -> list[LogEntry]:
        return self._store.entries(self.group, lo, hi)

    def snapshot_meta(self) -> SnapshotMeta | None:
        return self._store.snapshot_meta(self.group)

    def hard_state(self) -> HardState:
        return self._store.hard_state(self.group)

    def members(self) -> tuple[str, ...]:
        return self._store.members(self.group)

    def __repr__(self) -> str:
        return f"GroupLog({self.group!r})"

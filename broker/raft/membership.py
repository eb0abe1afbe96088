"""Group membership: who votes, as a function of the log.

Responsibilities: encode/decode the member list a MEMBERSHIP entry carries, remember
which configuration each membership entry introduced, and answer "what is the
configuration now" and "what was it at index i".

How it works (thesis §4.1, single-server changes): a configuration takes effect on a
member as soon as its entry is appended to that member's log, committed or not. If a
conflict truncation removes the entry, the previous configuration is back in force.
A leader proposes a change only after the previous one committed, so in any log every
membership entry but the last is committed; keeping the last two found is enough to
recover from a truncation. `_history` therefore holds (index, members) pairs, oldest
first, and is exact for every index >= `_known_from`.

Invariants: `_history` is never empty; its indexes increase; nothing committed is
ever truncated from it.

Not here: the rules for proposing a change (core.py), replication to new members
(leader.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from .errors import RaftInvariantError
from .types import MEMBERSHIP, LogEntry


def encode_members(members: Iterable[str]) -> bytes:
    members = tuple(members)
    if not members or len(set(members)) != len(members):
        raise ValueError(f"a membership must list distinct members, got {members!r}")
    return json.dumps(list(members), separators=(",", ":")).encode("utf-8")


def decode_members(data: bytes) -> tuple[str, ...]:
    members = json.loads(data.decode("utf-8"))
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise RaftInvariantError(f"malformed membership entry: {data!r}")
    return tuple(members)


def quorum(voters: int) -> int:
    """The size of a majority."""
    return voters // 2 + 1


class MembershipHistory:
    def __init__(self, index: int, members: tuple[str, ...]) -> None:
        self._history: list[tuple[int, tuple[str, ...]]] = [(index, tuple(members))]
        self._known_from = index

    @classmethod
    def recovered(cls, base_index: int, base_members: tuple[str, ...],
                  found: list[tuple[int, tuple[str, ...]]], complete: bool) -> MembershipHistory:
        """From a backward scan of the log: `found` oldest first; `complete` if the scan
        reached `base_index` (else only the last two entries were read)."""
        if complete or not found:
            history = cls(base_index, base_members)
        else:
            history = cls(found[0][0], found[0][1])
            found = found[1:]
        for index, members in found:
            history._history.append((index, members))
        return history

    @property
    def current(self) -> tuple[str, ...]:
        return self._history[-1][1]

    @property
    def last_change_index(self) -> int:
        return self._history[-1][0]

    def at(self, index: int) -> tuple[str, ...] | None:
        """The configuration in force at `index`; None if not remembered."""
        if index < self._known_from:
            return None
        for change_index, members in reversed(self._history):
            if change_index <= index:
                return members
        return None

    def appended(self, entries: Iterable[LogEntry]) -> bool:
        """Record membership entries just appended; True if the configuration changed."""
        changed = False
        for entry in entries:
            if entry.kind == MEMBERSHIP:
                self._history.append((entry.index, decode_members(entry.data)))
                changed = True
        return changed

    def truncated_from(self, index: int) -> bool:
        """Entries >= index were cut off; True if the configuration changed."""
        changed = False
        while self._history and self._history[-1][0] >= index:
            self._history.pop()
            changed = True
        if not self._history:
            raise RaftInvariantError(f"truncation at {index} removed every configuration")
        return changed

    def compacted_to(self, index: int, members: tuple[str, ...]) -> None:
        """The log up to `index` is covered by a snapshot whose configuration is `members`."""
        newer = [(i, m) for i, m in self._history if i > index]
        self._history = [(index, members), *newer]
        self._known_from = index

    def reset(self, index: int, members: tuple[str, ...]) -> None:
        self._history = [(index, tuple(members))]
        self._known_from = index

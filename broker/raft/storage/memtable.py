"""A group's memory table: its entries that are in the WAL but not yet in segments.

Responsibilities: hold a contiguous run of LogEntry values, answer reads over it, and
say how many bytes of memory it holds (what `raft.wal_max_size_bytes` bounds, and what
the memory-footprint analytics compare against).

How it works: a list plus the index of its first element. `nbytes` is an estimate of
the Python heap the entries occupy: the data bytes plus a fixed per-entry overhead
(the LogEntry object, the bytes object's header, its index — an int object of its
own — and the list slot), measured once at import on this interpreter. Terms and
kinds are small or shared ints, so they cost nothing per entry.

Invariants: indexes are contiguous (entries[k].index == first + k); the table is
emptied only when its entries are in segment files (WAL rollover) or dead (released
or truncated).

Not here: durability (the WAL), and entries that reached segments.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from operator import attrgetter

from ..types import LogEntry

_data_of = attrgetter("data")

ENTRY_OVERHEAD = (sys.getsizeof(LogEntry(1 << 40, 1 << 20, 0, b"")) + sys.getsizeof(b"")
                  + sys.getsizeof(1 << 40) + 8)


def entry_cost(entry: LogEntry) -> int:
    return ENTRY_OVERHEAD + len(entry.data)


class MemTable:
    __slots__ = ("entries", "first", "nbytes")

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []
        self.first = 0          # index of entries[0]; meaningless while empty
        self.nbytes = 0

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def last(self) -> int:
        """Index of the last entry; first - 1 while empty."""
        return self.first + len(self.entries) - 1

    def extend(self, entries: Sequence[LogEntry], data_bytes: int | None = None) -> None:
        """Entries after the last; `data_bytes`, if given, is the sum of their data's
        lengths (the caller's, already counted)."""
        if not entries:
            return
        if not self.entries:
            self.first = entries[0].index
        self.entries.extend(entries)
        if data_bytes is None:
            data_bytes = sum(map(len, map(_data_of, entries)))
        self.nbytes += data_bytes + ENTRY_OVERHEAD * len(entries)

    def get(self, index: int) -> LogEntry | None:
        position = index - self.first
        if self.entries and 0 <= position < len(self.entries):
            return self.entries[position]
        return None

    def slice(self, lo: int, hi: int) -> list[LogEntry]:
        """Entries lo <= index < hi that are here."""
        if not self.entries:
            return []
        start = max(lo - self.first, 0)
        stop = min(hi - self.first, len(self.entries))
        return self.entries[start:stop] if start < stop else []

    def truncate_from(self, index: int) -> None:
        """Drop entries with index >= `index`."""
        keep = max(index - self.first, 0)
        if keep < len(self.entries):
            self.nbytes -= sum(entry_cost(e) for e in self.entries[keep:])
            del self.entries[keep:]

    def drop_below(self, index: int) -> None:
        """Drop entries with index < `index` (they are dead)."""
        cut = min(max(index - self.first, 0), len(self.entries))
        if cut:
            self.nbytes -= sum(entry_cost(e) for e in self.entries[:cut])
            del self.entries[:cut]
            self.first += cut

    def clear(self) -> None:
        self.entries = []
        self.nbytes = 0

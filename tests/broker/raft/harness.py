"""Test doubles around the pure core: storage in memory, a toy state machine, and the
caller's side of the Ready contract (persist, then send, then apply, then advance).

`MemoryStorage` is an in-memory `LogReader` that also checks what it is asked to
write: appends must be contiguous, and overwriting stored entries requires the
Ready's `truncate_from`. `Member` is one node as a shell would run it; `restart()`
builds a new RaftNode over what was persisted, and nothing else.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.core import RaftNode
from quorumqueue.broker.raft.log import Snapshot
from quorumqueue.broker.raft.membership import decode_members
from quorumqueue.broker.raft.messages import InstallSnapshot, Message
from quorumqueue.broker.raft.ready import Ready
from quorumqueue.broker.raft.types import (COMMAND, MEMBERSHIP, NOOP, HardState, LogEntry,
                                           SnapshotMeta)


class MemoryStorage:
    """A LogReader over lists, plus the writes a shell performs for a Ready."""

    def __init__(self, members: tuple[str, ...]) -> None:
        self._members = tuple(members)
        self._hard_state = HardState()
        self.snapshot: Snapshot | None = None
        self._first = 1
        self._entries: list[LogEntry] = []      # _entries[i].index == _first + i

    # LogReader
    def first_index(self) -> int:
        return self._first

    def last_index(self) -> int:
        return self._first + len(self._entries) - 1

    def term_at(self, index: int) -> int | None:
        if self._first <= index <= self.last_index():
            return self._entries[index - self._first].term
        return None

    def entries(self, lo: int, hi: int) -> list[LogEntry]:
        assert self._first <= lo and hi <= self.last_index() + 1, (lo, hi, self._first)
        return self._entries[lo - self._first:hi - self._first]

    def snapshot_meta(self) -> SnapshotMeta | None:
        return self.snapshot.meta if self.snapshot else None

    def hard_state(self) -> HardState:
        return self._hard_state

    def members(self) -> tuple[str, ...]:
        return self._members

    @classmethod
    def preloaded(cls, members: tuple[str, ...], terms: list[int],
                  hard_state: HardState) -> MemoryStorage:
        """A storage whose log holds one command per term in `terms` (index 1 first)."""
        storage = cls(members)
        storage._entries = [LogEntry(i, t, COMMAND, f"e{i}".encode())
                            for i, t in enumerate(terms, 1)]
        storage._hard_state = hard_state
        return storage

    # writes
    def persist(self, ready: Ready) -> None:
        if ready.snapshot is not None:
            self.snapshot = ready.snapshot
            self._first = ready.snapshot.meta.index + 1
            self._entries = []
        if ready.truncate_from is not None:
            assert ready.entries and ready.truncate_from == ready.entries[0].index
            assert self._first <= ready.truncate_from <= self.last_index()
            del self._entries[ready.truncate_from - self._first:]
        if ready.entries:
            first = ready.entries[0].index
            assert first == self.last_index() + 1, \
                f"append at {first} after {self.last_index()} without truncate_from"
            for previous, entry in zip(ready.entries, ready.entries[1:]):
                assert entry.index == previous.index + 1
            self._entries.extend(ready.entries)
        if ready.hard_state is not None:
            assert ready.hard_state.term >= self._hard_state.term
            self._hard_state = ready.hard_state

    def save_snapshot(self, meta: SnapshotMeta, data: bytes, keep: int = 0) -> None:
        """The state machine's snapshot at meta.index; drop entries before it (but
        keep the last `keep` of them for followers that are only a little behind)."""
        self.snapshot = Snapshot(meta, data)
        new_first = max(self._first, meta.index + 1 - keep)
        del self._entries[:new_first - self._first]
        self._first = new_first

    def log(self) -> list[LogEntry]:
        return list(self._entries)


@dataclass
class Machine:
    """A toy state machine: the list of commands applied, with their indexes."""
    applied_index: int = 0
    commands: list[tuple[int, bytes]] = field(default_factory=list)

    def apply(self, entry: LogEntry) -> None:
        assert entry.index == self.applied_index + 1, \
            f"applied {entry.index} after {self.applied_index}"
        self.applied_index = entry.index
        if entry.kind == COMMAND:
            self.commands.append((entry.index, entry.data))

    def snapshot(self) -> bytes:
        return json.dumps([[i, d.hex()] for i, d in self.commands]).encode()

    @classmethod
    def restored(cls, snapshot: Snapshot | None) -> Machine:
        if snapshot is None:
            return cls()
        commands = [(i, bytes.fromhex(d)) for i, d in json.loads(snapshot.data)]
        return cls(snapshot.meta.index, commands)


class Member:
    """One node run the way a shell runs it."""

    def __init__(self, id: str, config: RaftConfig, storage: MemoryStorage,
                 seed: int) -> None:
        self.id = id
        self.config = config
        self.storage = storage
        self.seed = seed
        self.restarts = 0
        self.node = RaftNode(id, config, storage, random.Random(seed))
        self.machine = Machine.restored(storage.snapshot)

    def restart(self) -> None:
        """Crash (losing everything not persisted) and recover from storage."""
        self.restarts += 1
        self.node = RaftNode(self.id, self.config, self.storage,
                             random.Random(self.seed * 1000 + self.restarts))
        self.machine = Machine.restored(self.storage.snapshot)

    def handle_ready(self, on_apply=None) -> tuple[Ready, list[Message]] | None:
        """One Ready cycle; returns it and the messages to send (snapshot bytes attached)."""
        ready = self.node.ready()
        if ready is None:
            return None
        return ready, self.finish_ready(ready, on_apply)

    def finish_ready(self, ready: Ready, on_apply=None) -> list[Message]:
        """Persist, collect messages, apply and advance a Ready taken earlier."""
        self.storage.persist(ready)
        outgoing: list[Message] = []
        for message in ready.messages:
            if isinstance(message, InstallSnapshot):
                stored = self.storage.snapshot
                if stored is None or stored.meta != message.meta:
                    self.node.report_snapshot(message.to, success=False)
                    continue
                message = message.with_data(stored.data)
            outgoing.append(message)
        if ready.snapshot is not None:
            self.machine = Machine.restored(ready.snapshot)
            if on_apply:
                on_apply(self, None, ready.snapshot)
        for entry in ready.committed:
            self.machine.apply(entry)
            if on_apply:
                on_apply(self, entry, None)
        self.node.advance(ready)
        return outgoing

    def compact(self, keep: int = 0) -> SnapshotMeta | None:
        index = self.machine.applied_index
        current = self.storage.snapshot_meta()
        if index == 0 or (current is not None and index <= current.index):
            return None
        meta = self.node.compact(index)
        self.storage.save_snapshot(meta, self.machine.snapshot(), keep=keep)
        return meta


def entry_text(entry: LogEntry) -> str:
    head = f"{entry.index}@{entry.term}"
    if entry.kind == NOOP:
        return f"{head}:noop"
    if entry.kind == MEMBERSHIP:
        return f"{head}:members={','.join(decode_members(entry.data))}"
    return f"{head}:{entry.data.decode()}"

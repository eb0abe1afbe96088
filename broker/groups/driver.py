"""The Ready loop: many Raft groups of one node driven over one LogStore in group commit.

Responsibilities: the order a `Ready` demands (ready.py), for every group at once.
1. Collect a Ready from each group.
2. Persist them all, and make them durable with one `LogStore.flush()` (one
   fdatasync for every group).
3. Send each group's messages.
4. Apply each group's committed entries, then advance it.
What sending and applying mean is the caller's. That is `ReadyHandler`: the node's
quorum queues and metadata group (broker/queues/quorum/groups.py). This module only
guarantees when they are called.

How it works: one *round* is three steps. `persist_round` collects and persists,
buffered in the store. Then the store's flush. Then `finish_round` sends, applies
and advances. The flush is the caller's, so it can run wherever the caller likes.
The server runs it on a writer thread: the round, with the store's batch sealed
for it, is a `Round`, whose `make_durable` writes and fdatasyncs that batch there.
`finish_round` runs only once it completed.
A caller that runs the flush apart may hand the leaders' appends to the transport
before it (`send_early`). Applying may propose new entries: a no-ack delivery is
settled at once, a restart's Down... And a single-member group commits its own
entries only after they are durable. So callers repeat rounds until `persist_round`
finds no Ready (at most `MAX_ROUNDS`).

`apply_round` is a round without a persist step. Each group's `ready_to_apply` is
applied and advanced at once: committed entries already durable here. The node
calls it right after `finish_round`. Some entries become committed while the fsync
runs: those a single-member group committed when it completed, and those a
leader's peers acknowledged meanwhile. They are applied then, not after the next
round's fsync.

A full disk (raft/storage/errors.py `is_disk_full`) stops one group, not the node.
One persist step writes straight to disk: a follower's snapshot install. It fails with
nothing written. `persist_round` keeps that group's Ready aside (`held`, the
caller's dict) and leaves the group out of the round. The next round tries its
persist again before anything else of it. Until then the group hands out no Ready:
its core waits for `advance`. It is left out of `apply_round` too. Its core goes on
hearing its leader.

Invariants:
- `finish_round(batch)` is called only once everything in `batch` is durable.
- No message leaves before that but what `leaves_early` allows.
- Every group's Ready is advanced exactly once. That is after its messages went to
  `send` and its committed entries to `apply`.
- One Ready is outstanding per group at a time. No `ready()` comes between
  `persist_round` and `finish_round` of the same round.

Not here: consensus (core.py), the on-disk format (storage/), what an entry means
(the state machines), the transport.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ..raft.core import RaftNode
from ..raft.messages import AppendEntries, Message
from ..raft.ready import Ready
from ..raft.storage import LogStore
from ..raft.storage.errors import is_disk_full
from ..raft.storage.wal import WalBatch

MAX_ROUNDS = 64  # rounds per flush: proposals made while applying are bounded


class Member(Protocol):
    """One group's member on this node: its log store key and its core."""
    group: str
    raft: RaftNode


class ReadyHandler(Protocol):
    def send(self, member: Member, messages: tuple[Message, ...]) -> None:
        """Hand `messages` to the transport (called only after they are durable)."""

    def apply(self, member: Member, ready: Ready) -> None:
        """Restore `ready.snapshot` if any, then apply `ready.committed` in order."""

    def advanced(self, member: Member, ready: Ready) -> None:
        """After `advance(ready)`: leadership news, work that follows applying."""


# (member, the core that produced the Ready, the Ready)
Batch = list[tuple[Member, RaftNode, Ready]]


@dataclass(slots=True)
class Round:
    """One round in halves, for a caller that fsyncs off its event loop
    (queues/quorum/groups.py `begin_round`, `end_round`): the Readies persisted, and
    the log store's batch they were sealed into (`LogStore.seal`). Between the two
    halves the batch is made durable here, on any thread: `make_durable` touches
    only the WAL file. The caller then hands the batch back to its store
    (`LogStore.synced`) and calls `finish_round` with `readies`.

    A full disk (errors.is_disk_full) fails `write` or `make_durable` without harm:
    `rewind` cuts the file back to where the batch began, and the next
    `make_durable` writes the whole batch again (a failed fdatasync may have dropped
    its pages: never only synced again)."""
    readies: Batch
    log: WalBatch
    written: bool = False              # the records are in the file (the page cache)

    @property
    def sync_due(self) -> bool:
        """Whether `make_durable` has file work: records to fdatasync, or a sliced
        rollover's steps (raft/storage/rollover.py `WalBatch.after`)."""
        log = self.log
        return (bool(log.records) and log.fsync) or bool(log.after)

    @property
    def has_file_work(self) -> bool:
        """Records to write, synced or not, or a rollover's steps."""
        log = self.log
        return bool(log.records) or bool(log.after)

    def write(self) -> None:
        """The records into the file, without the fdatasync: for a round with none
        due (`sync_due` False), written where the caller stands."""
        self.log.write_records()
        self.written = True

    def make_durable(self) -> None:
        """The records into the file unless `write` put them there, then the
        fdatasync and the rollover's file syncs."""
        if self.written:
            self.log.sync()
        else:
            self.log.write()
            self.written = True

    def rewind(self) -> None:
        """Undo a failed attempt: the file as before the batch."""
        self.log.rewind()
        self.written = False


def persist(store: LogStore, group: str, ready: Ready) -> None:
    """Step 1 of a Ready, buffered in the store. The order: snapshot, truncation,
    entries, hard state. Durable after the store's next flush."""
    if ready.snapshot is not None:
        store.install_snapshot(group, ready.snapshot.meta, ready.snapshot.data)
    if ready.truncate_from is not None:
        store.truncate_from(group, ready.truncate_from)
    if ready.entries:
        store.append(group, ready.entries)
    if ready.hard_state is not None:
        store.set_hard_state(group, ready.hard_state)


def persist_round(store: LogStore, members: Iterable[Member],
                  held: dict[str, tuple[Member, RaftNode, Ready]] | None = None) -> Batch:
    """Collect every group's Ready and persist it (not yet flushed). With `held`,
    a Ready the disk had no room for is kept there by group. The next round tries
    it again first. A core replaced meanwhile drops it."""
    collected = []
    for member in list(members):
        waiting = held.pop(member.group, None) if held else None
        if waiting is not None:
            if waiting[1] is member.raft:
                collected.append(waiting)
            continue
        ready = member.raft.ready()
        if ready is not None:
            collected.append((member, member.raft, ready))
    batch = []
    for entry in collected:
        member, _raft, ready = entry
        try:
            persist(store, member.group, ready)
        except OSError as error:
            if held is None or not is_disk_full(error):
                raise
            held[member.group] = entry
            continue
        batch.append(entry)
    return batch


def leaves_early(ready: Ready, message: Message) -> bool:
    """May `message` be sent before `ready`'s persisting is durable?

    A leader's AppendEntries may. The Raft paper (section 10.2.1) lets the leader
    write its log in parallel with replicating it. etcd-io/raft sends a leader's
    appends while the same Ready's entries are persisted. An append promises
    nothing about this node's disk. The leader counts itself towards a commit only
    with what it made durable (`Leader.maybe_commit` takes the log's persisted
    index). So an entry commits on a majority's disks either way.

    Not when the Ready changes the hard state: a new term or vote must be durable
    before anything depending on it leaves. Not with a snapshot either. Votes,
    responses, InstallSnapshot and TimeoutNow always wait."""
    return (type(message) is AppendEntries and ready.hard_state is None
            and ready.snapshot is None)


def send_early(batch: Batch, handler: ReadyHandler) -> None:
    """Step 2 ahead of the flush, for the messages that may leave before it
    (`leaves_early`). A leader's appends reach its followers while its own fsync
    runs. So a commit waits for the slower of the two fsyncs, not for both in turn.
    The caller then passes `sent_early=True` to `finish_round`."""
    for member, _raft, ready in batch:
        early = tuple(m for m in ready.messages if leaves_early(ready, m))
        if early:
            handler.send(member, early)


def finish_round(batch: Batch, handler: ReadyHandler, sent_early: bool = False) -> None:
    """Steps 2-4 of every Ready in `batch`, whose persisting is now durable.
    First every group's messages: those `send_early` did not send, if it ran
    (`sent_early`). Then per group: apply, advance, `advanced`. A member whose core
    was dropped or replaced since `persist_round` is skipped. (This node left the
    group while the store flushed.) Nobody drives that core any more."""
    batch = [(member, raft, ready) for member, raft, ready in batch if member.raft is raft]
    for member, _raft, ready in batch:
        messages = ready.messages
        if sent_early and messages:
            messages = tuple(m for m in messages if not leaves_early(ready, m))
        if messages:
            handler.send(member, messages)
    for member, raft, ready in batch:
        if member.raft is not raft:  # left while an earlier group was applied
            continue
        handler.apply(member, ready)
        raft.advance(ready)
        handler.advanced(member, ready)


def apply_round(members: Iterable[Member], handler: ReadyHandler,
                held: dict | None = None) -> None:
    """Apply, then advance, what every group committed and already made durable
    (`RaftNode.ready_to_apply`). There is no persist step. Call it only between
    rounds. No group may have a Ready outstanding, but those `held` for want of
    space. Those are skipped."""
    for member in list(members):
        if held and member.group in held:
            continue
        raft = member.raft
        ready = raft.ready_to_apply()
        if ready is None:
            continue
        handler.apply(member, ready)
        raft.advance(ready)
        handler.advanced(member, ready)

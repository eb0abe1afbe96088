"""The Ready loop: many Raft groups of one node driven over one LogStore in group commit.

Responsibilities: the order a `Ready` demands (ready.py), for every group at once:
collect a Ready from each group, persist them all, make them durable with one
`LogStore.flush()` (one fdatasync for every group), then send each group's messages,
then apply each group's committed entries, then advance it. What sending and
applying mean is the caller's (`ReadyHandler`: the node's quorum queues and metadata
group, broker/queues/quorum/groups.py); this module only guarantees when they are called.

How it works: one *round* is `persist_round` (collect and persist, buffered in the
store), the store's flush, and `finish_round` (send, apply, advance). The flush is the
caller's, so that it can run wherever the caller likes (the server runs it on a
writer thread), as long as `finish_round` runs only once it completed; a caller that
runs the flush apart may hand the leaders' appends to the transport before it
(`send_early`). Applying may propose new entries (a no-ack delivery is settled at
once, a restart's Down...) and a single-member group commits its own entries only
after they are durable, so callers repeat rounds until `persist_round` finds no
Ready (at most `MAX_ROUNDS`).

`apply_round` is a round without a persist step: every group's `ready_to_apply`
(committed entries that are already durable here), applied and advanced at once. The
node calls it right after `finish_round`: entries a single-member group committed
when the fsync completed, and those a leader's peers acknowledged while it ran, are
applied then, not after the next round's fsync of entries proposed meanwhile.

A full disk (raft/storage/errors.py `is_disk_full`) stops one group, not the node: the
one persist step that writes at once, a follower's snapshot install, fails with
nothing written, and `persist_round` keeps that group's Ready aside (`held`, the
caller's dict) and leaves the group out of the round. The next round tries its
persist again before anything else of it; until then the group hands out no Ready
(its core waits for `advance`) and is left out of `apply_round`, while its core goes
on hearing its leader.

Invariants: `finish_round(batch)` is called only after everything `persist_round`
returned `batch` for is durable; no message leaves before that but what
`leaves_early` allows; every group's Ready is advanced exactly once, after
its messages were handed to `send` and its committed entries to `apply`; one Ready is
outstanding per group at a time (no `ready()` between `persist_round` and
`finish_round` of the same round).

Not here: consensus (core.py), the on-disk format (storage/), what an entry means
(the state machines), the transport.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from ..raft.core import RaftNode
from ..raft.messages import AppendEntries, Message
from ..raft.ready import Ready
from ..raft.storage import LogStore
from ..raft.storage.errors import is_disk_full

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


def persist(store: LogStore, group: str, ready: Ready) -> None:
    """Step 1 of a Ready, buffered in the store: snapshot, truncation, entries, hard
    state, in that order. Durable after the store's next flush."""
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
    """Collect every group's Ready and persist it (not yet flushed). With `held`, a
    Ready the disk had no room for is kept there by group, and tried again first
    in the next round (a core replaced meanwhile drops it)."""
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
    """May `message` be sent before `ready`'s persisting is durable? A leader's
    AppendEntries may (the Raft paper, section 10.2.1: the leader writes its log in
    parallel with replicating it; etcd-io/raft sends a leader's appends while the
    same Ready's entries are persisted): it promises nothing about this node's disk,
    and the leader counts itself towards a commit only with what it made durable
    (`Leader.maybe_commit` takes the log's persisted index), so an entry commits on
    a majority's disks either way. Not when the Ready changes the hard state (a new
    term or vote must be durable before anything depending on it leaves), nor with a
    snapshot; votes, responses, InstallSnapshot and TimeoutNow always wait."""
    return (type(message) is AppendEntries and ready.hard_state is None
            and ready.snapshot is None)


def send_early(batch: Batch, handler: ReadyHandler) -> None:
    """Step 2 ahead of the flush, for the messages that may leave before it
    (`leaves_early`): a leader's appends reach its followers while its own fsync runs,
    so a commit waits for the slower of the two fsyncs, not for both in turn. The
    caller then passes `sent_early=True` to `finish_round`."""
    for member, _raft, ready in batch:
        early = tuple(m for m in ready.messages if leaves_early(ready, m))
        if early:
            handler.send(member, early)


def finish_round(batch: Batch, handler: ReadyHandler, sent_early: bool = False) -> None:
    """Steps 2-4 of every Ready in `batch`, whose persisting is now durable: first
    every group's messages (those `send_early` did not send, if it ran: `sent_early`),
    then per group apply, advance, `advanced`. A member whose core was dropped or
    replaced since `persist_round` (this node left the group while the store flushed)
    is skipped: nobody drives that core any more."""
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
    """Apply, then advance, what every group has committed and already made durable
    (`RaftNode.ready_to_apply`), without a persist step. Only between rounds: no
    group may have a Ready outstanding but those `held` for want of space (skipped)."""
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

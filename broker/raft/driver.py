"""The Ready loop: many Raft groups of one node driven over one LogStore in group commit.

Responsibilities: the order a `Ready` demands (ready.py), for every group at once:
collect a Ready from each group, persist them all, make them durable with one
`LogStore.flush()` (one fdatasync for every group), then send each group's messages,
then apply each group's committed entries, then advance it. What sending and
applying mean is the caller's (`ReadyHandler`: the node's quorum queues and metadata
group, broker/node/quorum.py); this module only guarantees when they are called.

How it works: one *round* is `persist_round` (collect and persist, buffered in the
store), the store's flush, and `finish_round` (send, apply, advance). Applying may
propose new entries (a no-ack delivery is settled at once, a restart's Down...) and a
single-member group commits its own entries only after they are durable, so `run`
repeats rounds until no group has a Ready, at most `max_rounds` times. `persist_round`
and `finish_round` are separate so that a shell may flush the store in between
however it likes, as long as `finish_round` runs only once that flush completed.

Invariants: `finish_round(batch)` is called only after everything `persist_round`
returned `batch` for is durable; every group's Ready is advanced exactly once, after
its messages were handed to `send` and its committed entries to `apply`; one Ready is
outstanding per group at a time (no `ready()` between `persist_round` and
`finish_round` of the same round).

Not here: consensus (core.py), the on-disk format (storage/), what an entry means
(the state machines), the transport.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from .core import RaftNode
from .messages import Message
from .ready import Ready
from .storage import LogStore

log = logging.getLogger("quorumqueue.broker")

MAX_ROUNDS = 64


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


Batch = list[tuple[Member, Ready]]


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


def persist_round(store: LogStore, members: Iterable[Member]) -> Batch:
    """Collect every group's Ready and persist it (not yet flushed)."""
    batch = []
    for member in list(members):
        ready = member.raft.ready()
        if ready is not None:
            batch.append((member, ready))
    for member, ready in batch:
        persist(store, member.group, ready)
    return batch


def finish_round(batch: Batch, handler: ReadyHandler) -> None:
    """Steps 2-4 of every Ready in `batch`, whose persisting is now durable: first
    every group's messages, then per group apply, advance, `advanced`."""
    for member, ready in batch:
        if ready.messages:
            handler.send(member, ready.messages)
    for member, ready in batch:
        handler.apply(member, ready)
        member.raft.advance(ready)
        handler.advanced(member, ready)


def run(store: LogStore, members: Callable[[], Iterable[Member]], handler: ReadyHandler,
        max_rounds: int = MAX_ROUNDS) -> None:
    """Rounds until no group has a Ready (`members()` is asked again each round: the
    handler may add or remove groups while applying), then a last flush for whatever
    applying buffered without a Ready (snapshots' WAL records, releases)."""
    for _round in range(max_rounds):
        batch = persist_round(store, members())
        if not batch:
            break
        store.flush()  # one fdatasync for every group
        finish_round(batch, handler)
    else:  # pragma: no cover - proposals while applying are bounded
        log.warning("raft driver: still busy after %d rounds", max_rounds)
    store.flush()

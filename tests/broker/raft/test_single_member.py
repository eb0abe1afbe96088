"""A group of one: the Ready cycle without any network (etcd-io/raft's basic contract).

A proposal is committed as soon as the leader persisted it: the commit index moves in
`advance()`, and the next Ready hands the entry out for applying.
"""

from __future__ import annotations

import random

import pytest

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.core import RaftNode
from quorumqueue.broker.raft.errors import NotLeader
from quorumqueue.broker.raft.messages import AppendEntries
from quorumqueue.broker.raft.ready import Role
from quorumqueue.broker.raft.types import COMMAND, HardState, LogEntry

from .harness import MemoryStorage, entry_text

CONFIG = RaftConfig(election_ticks=10, heartbeat_ticks=2)


def texts(entries):
    return [entry_text(e) for e in entries]


def drain(node, storage):
    for _ in range(100):
        if (ready := node.ready()) is None:
            return
        storage.persist(ready)
        node.advance(ready)
    raise AssertionError("Readys kept coming")


def test_propose_persist_advance_commit():
    storage = MemoryStorage(("a",))
    a = RaftNode("a", CONFIG, storage, random.Random(1))
    assert a.role is Role.FOLLOWER and a.ready() is None

    # election: pre-vote and vote both win at once with a quorum of one
    a.campaign()
    ready = a.ready()
    assert ready.hard_state == HardState(term=1, voted_for="a")
    assert texts(ready.entries) == ["1@1:noop"]
    assert ready.messages == () and ready.committed == ()
    assert (ready.role, ready.leader_id, ready.leader_changed) == (Role.LEADER, "a", True)
    storage.persist(ready)
    assert a.commit_index == 0                 # nothing counts before it is persisted
    a.advance(ready)
    assert a.commit_index == 1                 # ... and then it is a quorum

    ready = a.ready()
    assert texts(ready.committed) == ["1@1:noop"]
    assert ready.entries == () and ready.hard_state is None and not ready.leader_changed
    a.advance(ready)
    assert a.applied_index == 1 and a.ready() is None

    # two proposals before the next Ready travel together
    assert a.propose(b"x") == 2
    assert a.propose(b"y") == 3
    ready = a.ready()
    assert texts(ready.entries) == ["2@1:x", "3@1:y"] and ready.committed == ()
    storage.persist(ready)
    a.advance(ready)
    ready = a.ready()
    assert texts(ready.committed) == ["2@1:x", "3@1:y"] and ready.entries == ()
    a.advance(ready)
    assert a.ready() is None


def test_ready_must_be_advanced_before_the_next():
    a = RaftNode("a", CONFIG, MemoryStorage(("a",)), random.Random(1))
    a.campaign()
    ready = a.ready()
    with pytest.raises(RuntimeError, match="not advanced"):
        a.ready()
    a.propose(b"x")                            # inputs may arrive meanwhile ...
    a.advance(ready)
    assert texts(a.ready().entries) == ["2@1:x"]   # ... and show up in the next Ready


def test_the_election_timer_fires_within_one_to_two_election_timeouts():
    for seed in range(20):
        a = RaftNode("a", CONFIG, MemoryStorage(("a",)), random.Random(seed))
        for ticks in range(1, 3 * CONFIG.election_ticks):
            a.tick()
            if a.role is Role.LEADER:
                break
        assert CONFIG.election_ticks <= ticks < 2 * CONFIG.election_ticks


def test_restart_recovers_term_vote_and_log_and_reapplies():
    storage = MemoryStorage(("a",))
    a = RaftNode("a", CONFIG, storage, random.Random(1))
    a.campaign()
    a.propose(b"x")
    drain(a, storage)
    assert a.applied_index == 2
    a.propose(b"lost")                         # never in a Ready: lost in the crash

    a = RaftNode("a", CONFIG, storage, random.Random(2))
    assert (a.role, a.term, a.voted_for) == (Role.FOLLOWER, 1, "a")
    assert (a.commit_index, a.applied_index, a.log.last_index()) == (0, 0, 2)
    a.campaign()
    ready = a.ready()
    assert ready.hard_state == HardState(term=2, voted_for="a")
    assert texts(ready.entries) == ["3@2:noop"]
    storage.persist(ready)
    a.advance(ready)
    # the commit index is not persisted: the state machine starts over from the log
    assert texts(a.ready().committed) == ["1@1:noop", "2@1:x", "3@2:noop"]


def test_only_the_leader_takes_proposals():
    a = RaftNode("a", CONFIG, MemoryStorage(("a", "b", "c")), random.Random(1))
    with pytest.raises(NotLeader) as raised:
        a.propose(b"x")
    assert raised.value.leader_hint is None


def test_ready_to_apply_hands_out_what_is_committed_and_durable_alone():
    """The fsync that commits a group of one's entries may end while newer proposals
    wait for the next one: those committed entries are applied at once, in a Ready
    with nothing to persist or send, and the next Ready persists only the newer ones."""
    storage = MemoryStorage(("a",))
    a = RaftNode("a", CONFIG, storage, random.Random(1))
    a.campaign()
    drain(a, storage)
    assert a.ready_to_apply() is None          # nothing committed is left to apply
    a.propose(b"x")
    ready = a.ready()
    storage.persist(ready)
    a.propose(b"y")                            # arrives while x is being persisted
    with pytest.raises(RuntimeError, match="not advanced"):
        a.ready_to_apply()
    a.advance(ready)                           # x is durable, hence committed

    early = a.ready_to_apply()
    assert texts(early.committed) == ["2@1:x"]
    assert (early.entries, early.messages, early.hard_state, early.snapshot) == ((), (), None, None)
    assert (early.role, early.leader_id, early.leader_changed) == (Role.LEADER, "a", False)
    with pytest.raises(RuntimeError, match="not advanced"):
        a.ready()
    a.advance(early)
    assert a.applied_index == 2 and a.ready_to_apply() is None

    ready = a.ready()                          # y alone: x is not handed out again
    assert texts(ready.entries) == ["3@1:y"] and ready.committed == ()
    storage.persist(ready)
    a.advance(ready)
    assert texts(a.ready_to_apply().committed) == ["3@1:y"]


def test_ready_to_apply_holds_back_committed_entries_not_yet_durable_here():
    """A follower may learn an entry and its commit in one message: the entry is
    committed, but applying it must wait until this member persisted it."""
    storage = MemoryStorage(("a", "b"))
    b = RaftNode("b", CONFIG, storage, random.Random(1))
    x = LogEntry(1, 1, COMMAND, b"x")
    b.step(AppendEntries(1, "a", "b", 0, 0, (x,), leader_commit=1))
    assert b.commit_index == 1
    assert b.ready_to_apply() is None          # committed, but only in memory here
    ready = b.ready()
    assert texts(ready.entries) == ["1@1:x"] and texts(ready.committed) == ["1@1:x"]
    storage.persist(ready)
    b.advance(ready)
    assert b.applied_index == 1 and b.ready_to_apply() is None

    y = LogEntry(2, 1, COMMAND, b"y")
    b.step(AppendEntries(1, "a", "b", 1, 1, (y,), leader_commit=1))
    storage.persist(ready := b.ready())
    b.advance(ready)                           # y is durable here, not yet committed
    assert b.ready_to_apply() is None
    b.step(AppendEntries(1, "a", "b", 2, 1, (), leader_commit=2))
    assert texts(b.ready_to_apply().committed) == ["2@1:y"]


def test_a_leader_alone_needs_no_tick_until_it_has_a_peer():
    """Issue 31, "an idle queue costs nothing per tick": a group of one that leads
    says its ticks do nothing (no heartbeat, check-quorum of one), so its caller may
    leave it unticked; a follower, and a leader once it has a peer, need them."""
    storage = MemoryStorage(("a",))
    a = RaftNode("a", CONFIG, storage, random.Random(1))
    assert a.needs_tick                        # a follower counts to its election
    a.campaign()
    drain(a, storage)
    assert a.role is Role.LEADER and not a.needs_tick
    for _ in range(3 * CONFIG.election_ticks):
        a.tick()
        assert a.ready() is None and a.role is Role.LEADER
    a.propose_membership(add="b")
    drain(a, storage)
    assert a.needs_tick                        # heartbeats to b are due now

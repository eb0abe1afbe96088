"""Three members: election, replication, commit, catch-up, conflicts, snapshots.

Raft paper §5.2 (election), §5.3 (log replication and matching), §5.4.2 (commit
only by counting replicas of current-term entries), §7 (snapshots). Each test is a
script: inputs, then the exact messages that follow, then the resulting state.
"""

from __future__ import annotations

import random

from quorumqueue.broker.raft.core import RaftNode
from quorumqueue.broker.raft.messages import AppendEntries
from quorumqueue.broker.raft.ready import Role
from quorumqueue.broker.raft.types import HardState

from .harness import MemoryStorage, entry_text
from .script import CONFIG, Script, message_text


def test_election_replication_commit():
    s = Script("a", "b", "c")
    s.campaign("a")
    # pre-vote (§9.6): asks for term 1 without moving anyone's term
    assert s.send("a") == ["a->b PreVote term=1 last=0@0", "a->c PreVote term=1 last=0@0"]
    s.deliver()
    assert s.node("b").term == 0
    assert s.send("b") + s.send("c") == ["b->a PreVoteResp term=1 granted",
                                         "c->a PreVoteResp term=1 granted"]
    s.deliver()
    assert s.send("a") == ["a->b Vote term=1 last=0@0", "a->c Vote term=1 last=0@0"]
    assert s.members["a"].storage.hard_state() == HardState(1, "a")   # persisted first
    s.deliver()
    assert s.send("b") + s.send("c") == ["b->a VoteResp term=1 granted",
                                         "c->a VoteResp term=1 granted"]
    s.deliver()
    assert s.state("a") == "a leader term=1 leader=a commit=0 applied=0 last=1"
    # a new leader appends a NOOP of its term (§5.4.2, thesis §6.4)
    assert s.send("a") == ["a->b App term=1 prev=0@0 commit=0 [1@1:noop]",
                           "a->c App term=1 prev=0@0 commit=0 [1@1:noop]"]
    assert s.stabilize() == [
        "a->b App term=1 prev=0@0 commit=0 [1@1:noop]",
        "a->c App term=1 prev=0@0 commit=0 [1@1:noop]",
        "b->a AppResp term=1 match=1",
        "c->a AppResp term=1 match=1",
        "a->b App term=1 prev=1@1 commit=1 []",      # the new commit index, at once
        "a->c App term=1 prev=1@1 commit=1 []",
        "b->a AppResp term=1 match=1",
        "c->a AppResp term=1 match=1",
    ]
    s.propose("a", "x", "y")                          # batched into one message each
    assert s.stabilize()[:4] == [
        "a->b App term=1 prev=1@1 commit=1 [2@1:x 3@1:y]",
        "a->c App term=1 prev=1@1 commit=1 [2@1:x 3@1:y]",
        "b->a AppResp term=1 match=3",
        "c->a AppResp term=1 match=3",
    ]
    for id in "abc":
        assert s.log(id) == "1@1:noop 2@1:x 3@1:y"
        assert s.applied(id) == ["x", "y"]
        assert s.node(id).commit_index == 3


def test_commit_needs_a_majority_of_persisted_copies():
    s = Script("a", "b", "c")
    s.elect("a")
    s.crash("b")
    s.crash("c")
    s.propose("a", "x")
    s.stabilize()
    assert s.state("a") == "a leader term=1 leader=a commit=1 applied=1 last=2"
    s.restart("b")
    s.tick("a", 2)                                     # heartbeat -> b answers match=1
    assert s.stabilize()[-1] == "b->a AppResp term=1 match=1"
    assert s.state("a") == "a leader term=1 leader=a commit=1 applied=1 last=2"
    s.tick("a", 2)                                     # x still unacknowledged: resend
    assert "a->b App term=1 prev=1@1 commit=1 [2@1:x]" in s.stabilize()
    assert s.state("a") == "a leader term=1 leader=a commit=2 applied=2 last=2"
    assert s.applied("b") == ["x"]


def test_batching_and_the_inflight_window():
    s = Script("a", "b", "c")
    s.elect("a")
    s.crash("c")
    s.propose("a", *[f"e{i}" for i in range(2, 700)])
    sent = s.send("a")
    to_b = [m for m in sent if m.startswith("a->b")]
    # 64 entries per message, 8 messages outstanding, then paused (progress REPLICATE)
    assert len(to_b) == s.config.max_inflight
    assert to_b[0].startswith("a->b App term=1 prev=1@1 commit=1 [2@1:e2 3@1:e3")
    assert to_b[1].startswith("a->b App term=1 prev=65@1 commit=1 [66@1:e66")
    s.deliver()
    s.send("b")
    s.deliver()
    assert len([m for m in s.send("a") if m.startswith("a->b App")]) == 3  # the rest
    s.stabilize()
    assert s.node("b").log.last_index() == 699 and s.node("a").commit_index == 699


def test_follower_restart_catches_up_by_delta():
    s = Script("a", "b", "c")
    s.elect("a")
    s.propose("a", "x")
    s.stabilize()
    s.crash("c")
    s.propose("a", "y", "z")
    s.stabilize()
    s.restart("c")                                     # a new RaftNode over c's storage
    assert s.state("c") == "c follower term=1 leader=None commit=0 applied=0 last=2"
    assert s.log("c") == "1@1:noop 2@1:x"
    s.tick("a", 2)
    # the heartbeat is anchored at c's known match and carries commit up to it
    assert s.stabilize()[1:] == ["a->c App term=1 prev=2@1 commit=2 []",
                                 "b->a AppResp term=1 match=4",
                                 "c->a AppResp term=1 match=2"]
    assert s.applied("c") == ["x"]
    s.tick("a", 2)
    # no progress for a heartbeat interval with y, z outstanding: probe and resend them
    delivered = s.stabilize()
    assert "a->c App term=1 prev=2@1 commit=4 [3@1:y 4@1:z]" in delivered
    assert all("1@1:noop" not in m and "2@1:x" not in m for m in delivered)
    assert s.log("c") == s.log("a") == "1@1:noop 2@1:x 3@1:y 4@1:z"
    assert s.applied("c") == ["x", "y", "z"]


def test_a_new_leader_probes_back_with_the_followers_hint():
    s = Script("a", "b", "c")
    s.elect("a")
    s.crash("c")
    s.propose("a", *"pqrstu")
    s.stabilize()
    s.crash("a")
    s.restart("c")                                     # c holds only 1@1
    s.tick("b", 10)                                    # b's lease on a runs out ...
    s.campaign("b")                                    # ... b takes over in term 2
    s.stabilize()
    assert s.node("b").role is Role.LEADER
    # b assumed c had its whole log (next=8); c's rejection names c's last index and
    # b jumps straight there instead of stepping back one entry at a time
    assert s.stabilize() == []
    assert s.log("b") == "1@1:noop " + " ".join(f"{i}@1:{c}" for i, c in
                                                 enumerate("pqrstu", 2)) + " 8@2:noop"
    assert s.log("c") == s.log("b")
    assert s.applied("c") == list("pqrstu")


def test_probe_rejection_hint_script():
    s = Script("a", "b", "c")
    s.elect("a")
    s.crash("c")
    s.propose("a", *"pqrstu")
    s.stabilize()
    s.crash("a")
    s.restart("c")
    s.tick("b", 10)
    s.campaign("b")
    assert s.stabilize() == [
        "b->c PreVote term=2 last=7@1",
        "c->b PreVoteResp term=2 granted",
        "b->c Vote term=2 last=7@1",
        "c->b VoteResp term=2 granted",
        "b->c App term=2 prev=7@1 commit=7 [8@2:noop]",
        "c->b AppResp term=2 reject=7 hint=1@1",
        "b->c App term=2 prev=1@1 commit=7 [2@1:p 3@1:q 4@1:r 5@1:s 6@1:t 7@1:u 8@2:noop]",
        "c->b AppResp term=2 match=8",
        "b->c App term=2 prev=8@2 commit=8 []",
        "c->b AppResp term=2 match=8",
    ]


def test_a_new_leader_overwrites_a_conflicting_uncommitted_suffix():
    s = Script("a", "b", "c")
    s.elect("a")
    s.propose("a", "x")
    s.stabilize()
    s.isolate("a")
    s.propose("a", "p1", "p2")                         # only a will ever have these
    s.stabilize()
    s.tick("b", 10)
    s.tick("c", 10)
    s.campaign("b")
    s.stabilize()
    s.propose("b", "q")
    s.stabilize()
    assert s.log("a") == "1@1:noop 2@1:x 3@1:p1 4@1:p2"
    assert s.log("b") == s.log("c") == "1@1:noop 2@1:x 3@2:noop 4@2:q"

    s.heal()
    s.tick("b", 2)
    # a learns term 2 from the heartbeat and answers with what it knows is committed
    assert s.stabilize() == ["b->a App term=2 prev=0@0 commit=0 []",
                             "b->c App term=2 prev=4@2 commit=4 []",
                             "a->b AppResp term=2 match=2",
                             "c->b AppResp term=2 match=4",
                             "b->a App term=2 prev=2@1 commit=4 [3@2:noop 4@2:q]",
                             "a->b AppResp term=2 match=4"]
    # (checked as a whole above; the truncation itself shows in a's Ready:)


def test_conflict_truncation_shows_in_the_ready():
    s = Script("a", "b", "c")
    s.elect("a")
    s.isolate("a")
    s.propose("a", "p1", "p2")
    s.stabilize()
    s.tick("b", 10)
    s.tick("c", 10)
    s.campaign("b")
    s.stabilize()
    s.propose("b", "q")
    s.stabilize()
    s.heal()
    leader = s.node("b")
    a = s.node("a")
    a.step(AppendEntries(leader.term, "b", "a", 1, 1, tuple(leader.log.entries(2, 4)), 3))
    ready = a.ready()
    assert ready.truncate_from == 2
    assert [entry_text(e) for e in ready.entries] == ["2@2:noop", "3@2:q"]
    assert ready.hard_state == HardState(2, None)
    s.members["a"].storage.persist(ready)
    assert [entry_text(e) for e in s.members["a"].storage.log()] == [
        "1@1:noop", "2@2:noop", "3@2:q"]
    # commit=3 arrived with the entries: they are applied after being persisted above
    assert [entry_text(e) for e in ready.committed] == ["2@2:noop", "3@2:q"]
    a.advance(ready)
    assert s.log("a") == "1@1:noop 2@2:noop 3@2:q"
    assert a.ready() is None


def test_a_far_behind_follower_gets_a_snapshot():
    s = Script("a", "b", "c")
    s.elect("a")
    s.crash("c")
    s.propose("a", *[f"e{i}" for i in range(2, 12)])
    s.stabilize()
    meta = s.members["a"].compact()                    # state machine snapshot at 11
    assert (meta.index, meta.term, meta.members) == (11, 1, ("a", "b", "c"))
    assert s.node("a").log.first_index() == 12
    s.restart("c")
    s.tick("a", 2)
    s.stabilize()
    s.tick("a", 2)                                     # c stalled: probe from its match
    delivered = s.stabilize()
    assert "a->c Snapshot term=1 index=11@1 members=a,b,c" in delivered
    assert "c->a SnapshotResp term=1 match=11" in delivered
    assert s.members["c"].storage.snapshot_meta() == meta
    assert s.applied("c") == [f"e{i}" for i in range(2, 12)]   # restored from the bytes
    s.propose("a", "after")
    assert "a->c App term=1 prev=11@1 commit=11 [12@1:after]" in s.stabilize()
    assert s.applied("c")[-1] == "after"
    assert s.log("c") == "12@1:after"


def test_a_follower_commits_no_further_than_the_message_proves():
    # c holds a stale 3@1 the leader does not have (the leader's 3 is 3@2). An append
    # that proves only 1..2 and says commit=3 lets c commit 2, not its own 3 (§5.3:
    # commitIndex = min(leaderCommit, index of last new entry)).
    c = RaftNode("c", CONFIG, MemoryStorage.preloaded(
        ("a", "b", "c"), [1, 1, 1], HardState(1)), random.Random(0))
    c.step(AppendEntries(2, "a", "c", 1, 1, (c.log.entries(2, 3)[0],), 3))
    assert c.commit_index == 2
    [answer] = c.ready().messages
    assert message_text(answer) == "c->a AppResp term=2 match=2"


def test_follower_progress_is_the_leaders_view_of_each_follower():
    """RaftNode.follower_progress (what the management API's queue page shows): on
    the leader each follower's match and next index and flow state; {} elsewhere."""
    s = Script("a", "b", "c")
    s.elect("a")
    s.propose("a", "x", "y")
    s.stabilize()
    leader = s.node("a")
    last = leader.log.last_index()
    assert leader.follower_progress() == {"b": (last, last + 1, "replicate"),
                                          "c": (last, last + 1, "replicate")}
    assert s.node("b").follower_progress() == {}

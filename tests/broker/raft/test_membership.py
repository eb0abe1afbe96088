"""Single-server membership changes (thesis §4.1).

A configuration takes effect on each member when its entry is appended; a leader
proposes one only after committing an entry of its own term and only when the previous
change is committed; a leader that removed itself leads until that commits, then
steps down and hands over with TimeoutNow.
"""

from __future__ import annotations

import random

import pytest

from quorumqueue.broker.raft.core import RaftNode
from quorumqueue.broker.raft.errors import ProposalRejected
from quorumqueue.broker.raft.ready import Role

from .harness import MemoryStorage
from .script import CONFIG, Script


def test_add_a_member():
    s = Script("a", "b", "c")
    s.campaign("a")
    for _ in range(2):                           # votes, in and out
        s.send("a"), s.deliver(), s.send("b"), s.send("c"), s.deliver()
    assert s.node("a").role is Role.LEADER and s.node("a").commit_index == 0
    with pytest.raises(ProposalRejected, match="not committed an entry of its term"):
        s.node("a").propose_membership(add="d")
    s.stabilize()

    s.add_member("d")                            # empty storage, knows no members
    assert s.node("d").members == ()
    assert s.node("a").propose_membership(add="d") == 2
    assert s.node("a").members == ("a", "b", "c", "d")    # in force on append
    with pytest.raises(ProposalRejected, match="change at index 2 is not committed"):
        s.node("a").propose_membership(add="e")
    assert s.stabilize() == [
        "a->d App term=1 prev=2@1 commit=1 []",
        "a->b App term=1 prev=1@1 commit=1 [2@1:members=a,b,c,d]",
        "a->c App term=1 prev=1@1 commit=1 [2@1:members=a,b,c,d]",
        "b->a AppResp term=1 match=2",
        "c->a AppResp term=1 match=2",
        "d->a AppResp term=1 reject=2 hint=0@0",  # d has nothing: start from the top
        "a->b App term=1 prev=2@1 commit=2 []",
        "a->c App term=1 prev=2@1 commit=2 []",
        "a->d App term=1 prev=0@0 commit=2 [1@1:noop 2@1:members=a,b,c,d]",
        "b->a AppResp term=1 match=2",
        "c->a AppResp term=1 match=2",
        "d->a AppResp term=1 match=2",
    ]
    assert s.node("d").members == ("a", "b", "c", "d")
    # with four members, a quorum is three: a and b alone commit nothing
    s.crash("c")
    s.crash("d")
    s.propose("a", "x")
    s.stabilize()
    assert s.node("a").commit_index == 2
    s.restart("d")                               # d recovers members from its log
    assert s.node("d").members == ("a", "b", "c", "d")
    for _ in range(4):
        s.tick("a")
        s.stabilize()
    assert s.node("a").commit_index == 3 and s.applied("d") == ["x"]


def test_remove_a_follower():
    s = Script("a", "b", "c")
    s.elect("a")
    assert s.node("a").propose_membership(remove="c") == 2
    assert s.node("a").members == ("a", "b")
    s.stabilize()
    assert s.node("a").commit_index == 2 and s.node("b").members == ("a", "b")
    # c never hears of its removal; its campaigns are pre-votes nobody grants
    for _ in range(60):
        s.tick_all()
        s.stabilize()
    assert s.state("a") == "a leader term=1 leader=a commit=2 applied=2 last=2"
    assert s.node("c").term == 1
    s.propose("a", "x")
    s.stabilize()
    assert s.applied("b") == ["x"] and s.applied("c") == []


def test_a_removed_leader_steps_down_after_committing_its_removal():
    s = Script("a", "b", "c")
    s.elect("a")
    assert s.node("a").propose_membership(remove="a") == 2
    assert s.node("a").role is Role.LEADER       # still leading, not counting itself
    assert s.send("a") == ["a->b App term=1 prev=1@1 commit=1 [2@1:members=b,c]",
                           "a->c App term=1 prev=1@1 commit=1 [2@1:members=b,c]"]
    s.deliver()
    s.send("b")
    s.deliver()                                  # b's answer alone: 1 of {b, c}
    assert s.node("a").commit_index == 1 and s.node("a").role is Role.LEADER
    s.send("c")
    s.deliver()                                  # c's too: committed, a steps down
    assert s.state("a") == "a follower term=1 leader=None commit=2 applied=1 last=2"
    assert s.send("a")[-1] == "a->b TimeoutNow term=1"   # hand over to a caught-up peer
    s.stabilize()
    assert s.state("b") == "b leader term=2 leader=b commit=3 applied=3 last=3"
    for _ in range(60):                           # a is no member: it never campaigns
        s.tick("a")
    assert s.node("a").role is Role.FOLLOWER and s.node("a").term == 1


def test_membership_is_recovered_from_the_log_on_restart():
    s = Script("a", "b", "c")
    s.elect("a")
    s.add_member("d")
    s.node("a").propose_membership(add="d")
    s.stabilize()
    s.node("a").propose_membership(remove="b")
    s.stabilize()
    storage = s.members["c"].storage
    restarted = RaftNode("c", CONFIG, storage, random.Random(9))
    assert restarted.members == ("a", "c", "d")


def test_an_uncommitted_membership_entry_is_undone_by_truncation():
    s = Script("a", "b", "c")
    s.elect("a")
    s.propose("a", "x")
    s.stabilize()
    s.isolate("a")
    s.node("a").propose_membership(remove="c")    # reaches no one
    s.stabilize()
    assert s.node("a").members == ("a", "b")
    s.tick("b", 10)
    s.tick("c", 10)
    s.campaign("c")
    s.stabilize()
    assert s.node("c").role is Role.LEADER
    s.heal()
    s.tick("c", 2)
    s.stabilize()
    # 3@1 was overwritten by 3@2: the configuration before it is back in force
    assert s.log("a") == "1@1:noop 2@1:x 3@2:noop"
    assert s.node("a").members == ("a", "b", "c")


def test_membership_change_rules():
    s = Script("a", "b", "c")
    s.elect("a")
    a = s.node("a")
    with pytest.raises(ValueError, match="exactly one"):
        a.propose_membership(add="d", remove="b")
    with pytest.raises(ProposalRejected, match="b is already a member"):
        a.propose_membership(add="b")
    with pytest.raises(ProposalRejected, match="z is not a member"):
        a.propose_membership(remove="z")
    solo = Script("a")
    solo.elect("a")
    with pytest.raises(ProposalRejected, match="cannot remove the last member"):
        solo.node("a").propose_membership(remove="a")
    assert MemoryStorage(("a",)).members() == ("a",)


def test_a_member_removed_by_an_uncommitted_change_may_still_campaign():
    # b leads {a, b} and appends its own removal, which a never receives; b then loses
    # its leadership (check-quorum). a's log is shorter, so b refuses to vote for it;
    # b holds the only log that can finish the change, so b must be able to campaign
    # (counting votes of its new configuration {a} only). Found by the simulator.
    s = Script("a", "b")
    s.elect("b")
    s.isolate("b")
    s.node("b").propose_membership(remove="b")
    for _ in range(2 * CONFIG.election_ticks):
        s.tick("b")
        s.stabilize()
    assert s.state("b") == "b follower term=1 leader=None commit=1 applied=1 last=2"
    assert s.node("b").members == ("a",) and s.node("a").members == ("a", "b")
    s.heal()
    for _ in range(6 * CONFIG.election_ticks):
        s.tick_all()
        s.stabilize()
    assert s.node("a").role is Role.LEADER and s.node("a").members == ("a",)
    assert s.node("a").log.term_at(2) == 1          # b's removal entry survived
    assert s.node("b").role is Role.FOLLOWER

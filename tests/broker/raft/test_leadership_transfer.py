"""Leadership transfer (thesis §3.10): catch the target up, then TimeoutNow; the
target campaigns at once (no pre-vote) and its votes may interrupt leases.
"""

from __future__ import annotations

import pytest

from quorumqueue.broker.raft.errors import NotLeader, ProposalRejected
from quorumqueue.broker.raft.ready import Role

from .script import CONFIG, Script


def test_transfer_to_a_caught_up_follower():
    s = Script("a", "b", "c")
    s.elect("a")
    s.propose("a", "x")
    s.stabilize()
    s.node("a").transfer_leadership("b")
    with pytest.raises(ProposalRejected, match="leadership transfer to b in progress"):
        s.propose("a", "y")
    assert s.stabilize()[:7] == [
        "a->b TimeoutNow term=1",
        "b->a Vote term=2 last=2@1 transfer",
        "b->c Vote term=2 last=2@1 transfer",
        "a->b VoteResp term=2 granted",
        "c->b VoteResp term=2 granted",      # c's lease on a does not stop a transfer
        "b->a App term=2 prev=2@1 commit=2 [3@2:noop]",
        "b->c App term=2 prev=2@1 commit=2 [3@2:noop]",
    ]
    assert s.state("a") == "a follower term=2 leader=b commit=3 applied=3 last=3"
    assert s.state("b") == "b leader term=2 leader=b commit=3 applied=3 last=3"


def test_transfer_to_a_lagging_follower_catches_it_up_first():
    s = Script("a", "b", "c")
    s.elect("a")
    s.crash("c")
    s.propose("a", "x", "y")
    s.stabilize()
    s.restart("c")
    s.node("a").transfer_leadership("c")
    delivered = []
    for _ in range(6):
        s.tick("a")
        delivered += s.stabilize()
    timeout_now = delivered.index("a->c TimeoutNow term=1")
    assert "c->a AppResp term=1 match=3" in delivered[:timeout_now]
    assert s.state("c") == "c leader term=2 leader=c commit=4 applied=4 last=4"
    assert s.applied("c") == ["x", "y"]


def test_a_transfer_that_does_not_complete_is_abandoned():
    s = Script("a", "b", "c")
    s.elect("a")
    s.crash("b")
    s.node("a").transfer_leadership("b")
    for _ in range(CONFIG.election_ticks):
        s.tick("a")
        s.stabilize()
    assert s.node("a").role is Role.LEADER
    assert s.propose("a", "x") == [2]           # proposals are taken again


def test_transfer_needs_the_leader_and_a_member():
    s = Script("a", "b", "c")
    s.elect("a")
    with pytest.raises(NotLeader) as raised:
        s.node("b").transfer_leadership("c")
    assert raised.value.leader_hint == "a"
    with pytest.raises(ProposalRejected, match="z is not a member"):
        s.node("a").transfer_leadership("z")
    s.node("a").transfer_leadership("a")        # already there: nothing to do
    assert s.stabilize() == []

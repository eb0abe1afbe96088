"""Elections: votes (§5.2, §5.4.1), pre-vote (thesis §9.6), leases and check-quorum
(thesis §6.2, §4.2.3), stale leaders stepping down (§5.1).
"""

from __future__ import annotations

import random

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.core import RaftNode
from quorumqueue.broker.raft.messages import AppendEntries, RequestVote
from quorumqueue.broker.raft.ready import Role
from quorumqueue.broker.raft.types import HardState

from .harness import MemoryStorage
from .script import CONFIG, Script, message_text


def test_a_vote_per_term_and_only_for_an_up_to_date_log():
    # c holds 1@1 2@2 and is at term 2 without a leader
    c = RaftNode("c", CONFIG, MemoryStorage.preloaded(("a", "b", "c"), [1, 2], HardState(2)),
                 random.Random(0))

    def ask(term, candidate, last_index, last_term, pre_vote=False):
        c.step(RequestVote(term, candidate, "c", last_index, last_term, pre_vote=pre_vote))
        ready = c.ready()
        c.advance(ready)
        [answer] = ready.messages
        return f"{message_text(answer)} (c: term={c.term} vote={c.voted_for})"

    table = [
        # a request from the past is refused with our term
        (ask(1, "a", 9, 1, pre_vote=True), "c->a PreVoteResp term=2 rejected (c: term=2 vote=None)"),
        # pre-votes never move terms nor record votes
        (ask(3, "a", 1, 1, pre_vote=True), "c->a PreVoteResp term=2 rejected (c: term=2 vote=None)"),
        (ask(3, "a", 2, 2, pre_vote=True), "c->a PreVoteResp term=3 granted (c: term=2 vote=None)"),
        # a real vote: log at least as up to date (same last term, longer or equal)
        (ask(3, "a", 2, 2), "c->a VoteResp term=3 granted (c: term=3 vote=a)"),
        # one vote per term; asking again gets the same answer
        (ask(3, "b", 7, 2), "c->b VoteResp term=3 rejected (c: term=3 vote=a)"),
        (ask(3, "a", 2, 2), "c->a VoteResp term=3 granted (c: term=3 vote=a)"),
        # a higher term moves ours even when the vote is refused for a short log ...
        (ask(4, "b", 1, 2), "c->b VoteResp term=4 rejected (c: term=4 vote=None)"),
        # ... or for an older last term, however long the log
        (ask(4, "b", 9, 1), "c->b VoteResp term=4 rejected (c: term=4 vote=None)"),
        (ask(4, "a", 3, 2), "c->a VoteResp term=4 granted (c: term=4 vote=a)"),
        # a higher last term wins even with a shorter log
        (ask(5, "b", 1, 3), "c->b VoteResp term=5 granted (c: term=5 vote=b)"),
    ]
    for got, expected in table:
        assert got == expected
    # every vote was handed out for persisting before its answer
    assert c.ready() is None


def test_pre_vote_keeps_a_rejoining_node_from_disrupting_the_leader():
    s = Script("a", "b", "c")
    s.elect("a")
    s.propose("a", "x")
    s.stabilize()
    s.isolate("c")
    for _ in range(60):                     # c's timer fires again and again
        s.tick_all()
        s.stabilize()
    assert s.node("c").term == 1            # pre-votes never won, so no term was taken
    s.heal()
    s.mailbox.clear()
    for _ in range(2 * CONFIG.election_ticks):   # c campaigns before hearing from a
        if sent := s.send("c"):
            break
        s.tick("c")
    assert sent == ["c->a PreVote term=2 last=2@1", "c->b PreVote term=2 last=2@1"]
    s.deliver()
    # a leads and b heard from a within an election timeout: both refuse
    assert s.send("a") + s.send("b") == ["a->c PreVoteResp term=1 rejected",
                                         "b->c PreVoteResp term=1 rejected"]
    s.deliver("c")
    assert s.state("c") == "c follower term=1 leader=None commit=2 applied=2 last=2"
    s.tick("a", 2)
    s.stabilize()
    assert s.state("a") == "a leader term=1 leader=a commit=2 applied=2 last=2"
    assert s.state("c") == "c follower term=1 leader=a commit=2 applied=2 last=2"


def test_without_pre_vote_a_rejoining_node_deposes_the_leader():
    config = RaftConfig(election_ticks=10, heartbeat_ticks=2, check_quorum=False,
                        pre_vote=False)
    s = Script("a", "b", "c", config=config)
    s.elect("a")
    s.isolate("c")
    for _ in range(60):
        s.tick_all()
        s.stabilize()
    assert s.node("c").term > 3             # every timeout took a new term
    s.heal()
    for _ in range(40):
        s.tick_all()
        s.stabilize()
    assert s.node("a").term == s.node("c").term > 3   # a was deposed


def test_a_follower_with_a_live_leader_ignores_higher_term_votes():
    s = Script("a", "b", "c")
    s.elect("a")
    b = s.node("b")
    b.step(RequestVote(7, "c", "b", 99, 9))
    assert (b.term, b.ready()) == (1, None)             # no answer, no new term
    b.step(RequestVote(7, "c", "b", 99, 9, leadership_transfer=True))
    assert b.term == 7 and b.voted_for == "c"            # a transfer may interrupt


def test_check_quorum_an_isolated_leader_steps_down():
    s = Script("a", "b", "c")
    s.elect("a")
    s.isolate("a")
    for ticks in range(1, 3 * CONFIG.election_ticks):
        s.tick("a")
        s.stabilize()
        if s.node("a").role is not Role.LEADER:
            break
    # the first check after isolation may still count answers from before it
    assert CONFIG.election_ticks <= ticks <= 2 * CONFIG.election_ticks
    assert s.state("a") == "a follower term=1 leader=None commit=1 applied=1 last=1"


def test_without_check_quorum_an_isolated_leader_stays():
    s = Script("a", "b", "c", config=RaftConfig(election_ticks=10, heartbeat_ticks=2,
                                                check_quorum=False))
    s.elect("a")
    s.isolate("a")
    for _ in range(50):
        s.tick("a")
        s.stabilize()
    assert s.node("a").role is Role.LEADER


def test_a_stale_leader_steps_down_when_answered_with_a_higher_term():
    s = Script("a", "b", "c", config=RaftConfig(election_ticks=10, heartbeat_ticks=2,
                                                check_quorum=False))
    s.elect("a")
    s.isolate("a")
    s.tick("b", 10)
    s.tick("c", 10)
    s.campaign("b")
    s.stabilize()
    assert s.node("b").role is Role.LEADER and s.node("b").term == 2
    s.heal()
    s.tick("a", 2)
    assert s.stabilize()[:4] == [
        "a->b App term=1 prev=1@1 commit=1 []",
        "a->c App term=1 prev=1@1 commit=1 []",
        "b->a AppResp term=2 reject=0 hint=0@0",   # a stale term earns our term back
        "c->a AppResp term=2 reject=0 hint=0@0",
    ]
    assert s.state("a") == "a follower term=2 leader=None commit=1 applied=1 last=1"
    b_heartbeat = AppendEntries(2, "b", "a", 0, 0, (), 0)
    s.node("a").step(b_heartbeat)
    assert s.node("a").leader_id == "b"


def test_the_longer_log_wins_the_election():
    s = Script("a", "b", "c")
    s.elect("a")
    s.crash("b")
    s.propose("a", "x")                      # only a and c hold x
    s.stabilize()
    s.crash("a")
    s.restart("b")
    s.tick("c", 10)
    s.campaign("b")
    assert s.stabilize() == ["b->c PreVote term=2 last=1@1",
                             "c->b PreVoteResp term=1 rejected"]
    assert s.node("b").role is Role.PRE_CANDIDATE   # a's answer could still decide
    s.campaign("c")
    assert s.stabilize()[:4] == ["c->b PreVote term=2 last=2@1",
                                 "b->c PreVoteResp term=2 granted",
                                 "c->b Vote term=2 last=2@1",
                                 "b->c VoteResp term=2 granted"]
    assert s.node("c").role is Role.LEADER
    assert s.applied("b") == ["x"]




def test_a_candidate_asks_again_members_that_did_not_answer():
    """A new quorum queue's first election: the member the leader locator chose
    campaigns as soon as its group exists, but the other members may not have started
    theirs yet, and drop its requests. It asks again every heartbeat (not only at its
    next election timeout, which another member's timer may beat), so it wins once
    they start, long before their timers fire."""
    s = Script("a", "b", "c")
    s.campaign("a")
    assert s.send("a") == ["a->b PreVote term=1 last=0@0", "a->c PreVote term=1 last=0@0"]
    s.mailbox.clear()                        # b and c had no group yet: lost
    s.tick("a", CONFIG.heartbeat_ticks - 1)
    assert s.send("a") == []
    s.tick("a")                              # a heartbeat later: asked again
    assert s.send("a") == ["a->b PreVote term=1 last=0@0", "a->c PreVote term=1 last=0@0"]
    s.deliver("b")
    s.mailbox.clear()                        # c still had no group
    assert s.send("b") == ["b->a PreVoteResp term=1 granted"]
    s.deliver("a")                           # a majority of pre-votes: the real vote
    assert s.send("a") == ["a->b Vote term=1 last=0@0", "a->c Vote term=1 last=0@0"]
    s.mailbox.clear()                        # lost again
    s.tick("a", CONFIG.heartbeat_ticks)
    assert s.send("a") == ["a->b Vote term=1 last=0@0", "a->c Vote term=1 last=0@0"]
    s.stabilize()
    assert [s.node(n).role for n in "abc"] == [Role.LEADER, Role.FOLLOWER, Role.FOLLOWER]
    assert s.node("a").term == 1


def test_only_members_that_did_not_answer_are_asked_again():
    s = Script("a", "b", "c", "d", "e")
    s.campaign("a")
    s.send("a")
    s.deliver("b")
    s.mailbox.clear()
    s.send("b")
    s.deliver("a")                           # b granted: 2 of 5, not yet a majority
    s.tick("a", CONFIG.heartbeat_ticks)
    assert s.send("a") == ["a->c PreVote term=1 last=0@0", "a->d PreVote term=1 last=0@0",
                           "a->e PreVote term=1 last=0@0"]

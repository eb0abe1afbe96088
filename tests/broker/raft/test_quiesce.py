"""Quiescing (RaftConfig.quiesce): an idle group of three falls silent after one
quiet heartbeat, wakes for what changes, and leaves it through the caller's failure
detector (`leader_lost`), a campaigning leader, or a member that does not hear it.
The random schedules of test_simulation.py run with it too (safety, and liveness
with a detector); these pin the steps."""
from __future__ import annotations

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.ready import Role

from .script import Script

QUIET = RaftConfig(election_ticks=10, heartbeat_ticks=2, max_inflight=8, quiesce=True)


def quiet_group() -> Script:
    """a leads b and c, everything committed and told, then falls silent."""
    s = Script("a", "b", "c", config=QUIET)
    s.elect("a")
    s.propose("a", "x")
    s.stabilize()
    s.tick("a", 2)                              # a heartbeat: the quiet one
    assert s.stabilize() == [
        "a->b App term=1 prev=2@1 commit=2 [] quiet",
        "a->c App term=1 prev=2@1 commit=2 [] quiet",
        "b->a AppResp term=1 match=2",
        "c->a AppResp term=1 match=2",
    ]
    return s


def fall_silent(s: Script, leader: str) -> list[str]:
    """Heartbeats until the woken `leader` is quiet again (a majority answered in its
    fresh check-quorum window, then a heartbeat marked quiet); what was delivered."""
    log: list[str] = []
    for _ in range(3 * QUIET.election_ticks):
        s.tick(leader)
        log += s.stabilize()
        if not s.node(leader).needs_tick:
            return log
    raise AssertionError(f"{leader} did not fall silent: {log[-4:]}")


def test_an_idle_group_sends_one_quiet_heartbeat_then_nothing_and_needs_no_tick():
    s = quiet_group()
    assert [s.node(id).needs_tick for id in "abc"] == [False, False, False]
    s.tick_all(100)                             # ten election timeouts
    assert s.stabilize() == []
    assert [s.state(id) for id in "abc"] == [
        "a leader term=1 leader=a commit=2 applied=2 last=2",
        "b follower term=1 leader=a commit=2 applied=2 last=2",
        "c follower term=1 leader=a commit=2 applied=2 last=2",
    ]


def test_without_quiesce_heartbeats_go_on():
    s = Script("a", "b", "c")
    s.elect("a")
    s.tick("a", 2)
    assert [line for line in s.stabilize() if "App " in line] == [
        "a->b App term=1 prev=1@1 commit=1 []",
        "a->c App term=1 prev=1@1 commit=1 []",
    ]
    assert s.node("a").needs_tick and s.node("b").needs_tick


def test_a_proposal_wakes_the_leader_and_the_group_falls_silent_again():
    s = quiet_group()
    s.propose("a", "y")
    assert s.node("a").needs_tick
    s.stabilize()
    assert [s.node(id).commit_index for id in "abc"] == [3, 3, 3]
    s.tick("a", 2)
    assert s.stabilize()[:2] == ["a->b App term=1 prev=3@1 commit=3 [] quiet",
                                 "a->c App term=1 prev=3@1 commit=3 [] quiet"]
    s.tick_all(50)
    assert s.stabilize() == []


def test_a_follower_told_its_leader_is_lost_campaigns_and_the_other_elects_it():
    s = quiet_group()
    s.crash("a")
    s.node("b").leader_lost()
    s.node("c").leader_lost()
    assert s.node("b").needs_tick
    for _ in range(2 * QUIET.election_ticks):
        s.tick_all()
        s.stabilize()
        if any(s.node(id).role is Role.LEADER for id in "bc"):
            break
    leaders = [id for id in "bc" if s.node(id).role is Role.LEADER]
    assert len(leaders) == 1 and s.node(leaders[0]).term == 2
    # the new leader sees its entries through and, once a has been silent for an
    # election timeout (its check-quorum round), quiesces in its turn without it
    new = leaders[0]
    s.propose(new, "z")
    s.stabilize()
    for ticks in range(1, 3 * QUIET.election_ticks):
        s.tick(new)
        log = s.stabilize()
        if not s.node(new).needs_tick:
            break
    assert QUIET.election_ticks <= ticks <= 2 * QUIET.election_ticks
    assert [line for line in log if " App " in line][-1].endswith("commit=4 [] quiet")
    s.tick_all(50)
    assert s.stabilize() == [] and s.node(new).role is Role.LEADER


def test_a_quiet_follower_refuses_a_stranger_but_not_its_restarted_leader():
    s = quiet_group()
    # c missed nothing but is made to campaign (a wrong suspicion): b, in a's lease,
    # refuses; a, still leading, wakes and heartbeats, and c follows it again
    s.node("c").leader_lost()
    log = []
    while not log:
        s.tick("c")
        log = s.stabilize()
    assert sorted(log) == ["a->c PreVoteResp term=1 rejected",
                           "b->c PreVoteResp term=1 rejected",
                           "c->a PreVote term=2 last=2@1", "c->b PreVote term=2 last=2@1"]
    assert s.node("a").needs_tick and not s.node("b").needs_tick
    log = fall_silent(s, "a")
    assert log[:2] == ["a->b App term=1 prev=2@1 commit=2 []",     # a fresh window
                       "a->c App term=1 prev=2@1 commit=2 []"]
    assert log[-4:-2] == ["a->b App term=1 prev=2@1 commit=2 [] quiet",
                          "a->c App term=1 prev=2@1 commit=2 [] quiet"]
    assert s.node("a").role is Role.LEADER and s.node("a").term == 1
    assert s.node("c").leader_id == "a" and not s.node("c").needs_tick
    # a restarts: it campaigns, and b and c, quiet under it, no longer wait for it
    s.crash("a")
    s.restart("a")
    s.tick("a", 2 * QUIET.election_ticks)
    s.stabilize()
    assert s.node("a").role is Role.LEADER and s.node("a").term == 2
    assert [s.node(id).leader_id for id in "bc"] == ["a", "a"]


def test_a_follower_that_missed_the_quiet_heartbeat_wakes_the_leader_without_a_new_term():
    s = Script("a", "b", "c", config=QUIET)
    s.elect("a")
    s.cut("a", "c")
    s.tick("a", 2)
    s.stabilize()                               # b got the quiet heartbeat, c did not
    assert not s.node("a").needs_tick and s.node("c").needs_tick
    s.heal()
    s.tick("c", 2 * QUIET.election_ticks)       # c's timer runs out: it pre-votes
    log = s.stabilize()
    assert "c->a PreVote term=2 last=1@1" in log and s.node("a").needs_tick
    fall_silent(s, "a")
    assert [s.state(id) for id in "abc"] == [
        "a leader term=1 leader=a commit=1 applied=1 last=1",
        "b follower term=1 leader=a commit=1 applied=1 last=1",
        "c follower term=1 leader=a commit=1 applied=1 last=1",
    ]
    assert not any(s.node(id).needs_tick for id in "abc")    # quiet again, c too


def test_a_follower_cut_off_while_the_group_went_quiet_catches_up_when_back():
    s = Script("a", "b", "c", config=QUIET)
    s.elect("a")
    s.cut("a", "c")
    s.propose("a", "x", "y")
    s.stabilize()
    for _ in range(3 * QUIET.election_ticks):   # c silent: it stops holding a awake
        s.tick_all()
        s.stabilize()
    assert not s.node("a").needs_tick and not s.node("b").needs_tick
    assert s.node("c").commit_index == 1 and s.node("c").needs_tick
    s.heal()
    for _ in range(4 * QUIET.election_ticks):   # c pre-votes, wakes a, is caught up
        s.tick_all()
        s.stabilize()
        if s.node("c").applied_index == 3 and not s.node("a").needs_tick:
            break
    assert [s.state(id) for id in "abc"] == [
        "a leader term=1 leader=a commit=3 applied=3 last=3",
        "b follower term=1 leader=a commit=3 applied=3 last=3",
        "c follower term=1 leader=a commit=3 applied=3 last=3",
    ]
    assert not any(s.node(id).needs_tick for id in "abc")


def test_a_quiet_follower_made_to_listen_keeps_its_lease_one_election_timeout():
    """What the node asks of a replica its record no longer names (node/membership.py
    `_still_needed`): does the leader still replicate to it? Quiet, it cannot tell."""
    s = quiet_group()
    s.node("c").listen()
    assert s.node("c").needs_tick and s.node("c").hears_leader
    s.tick("c", QUIET.election_ticks - 1)
    assert s.node("c").hears_leader
    s.tick("c")
    assert not s.node("c").hears_leader and s.node("c").role is Role.FOLLOWER
    s = quiet_group()
    s.node("b").listen()         # b's timer runs out: it pre-votes, the leader answers
    while not s.node("a").needs_tick:
        s.tick("b")
        s.stabilize()
    s.tick("a", 2)
    s.stabilize()
    assert s.node("b").hears_leader and s.node("b").leader_id == "a"
    assert s.node("a").role is Role.LEADER and s.node("a").term == 1


def test_a_quiet_leader_told_a_majority_is_lost_steps_down_as_check_quorum_would():
    s = quiet_group()
    s.crash("b")
    s.crash("c")
    s.node("a").member_lost("b")
    s.node("a").member_lost("c")
    assert s.node("a").needs_tick
    for ticks in range(1, 3 * QUIET.election_ticks):
        s.tick("a")
        s.stabilize()
        if s.node("a").role is not Role.LEADER:
            break
    assert ticks <= 2 * QUIET.election_ticks and s.node("a").role is Role.FOLLOWER


def test_a_quiet_leader_told_one_member_is_lost_keeps_leading_and_falls_silent_again():
    s = quiet_group()
    s.crash("c")
    s.node("a").member_lost("c")
    for _ in range(3 * QUIET.election_ticks):
        s.tick_all()
        s.stabilize()
    assert s.node("a").role is Role.LEADER and s.node("a").term == 1
    assert not s.node("a").needs_tick and not s.node("b").needs_tick

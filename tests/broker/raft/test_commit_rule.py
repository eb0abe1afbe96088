"""Raft paper §5.4.2 and Figure 8: a leader never commits an entry of an earlier term
by counting its replicas; only its own term's entries are committed that way (and the
earlier ones with them).

Five members a..e (S1..S5 in the paper), one entry per message so that each
acknowledgement can be watched:
  (a) a leads term 1 and replicates 2@1 to b only, then crashes;
  (b) e is elected in term 2 by c and d, appends 2@2 and crashes before sending it;
  (c) a restarts, is elected in term 3 by b and c, and brings c up to 2@1: 2@1 is now
      on a majority (a, b, c) but is *not* committed; a crashes before 3@3 spreads;
  (d) e restarts and is elected in term 4 by c and d (its last term, 2, beats their
      1) and overwrites 2@1 with 2@2 — legal precisely because 2@1 was never
      committed.
"""

from __future__ import annotations

from quorumqueue.broker.raft.config import RaftConfig
from quorumqueue.broker.raft.ready import Role

from .script import Script

CONFIG = RaftConfig(election_ticks=10, heartbeat_ticks=2, max_entries_per_message=1,
                    check_quorum=False, pre_vote=False)


def test_figure_8_an_old_term_entry_on_a_majority_is_not_committed():
    s = Script(*"abcde", config=CONFIG)
    s.elect("a")

    # (a)
    s.cut("a", "c", "d", "e")
    s.propose("a", "x")
    assert s.stabilize() == ["a->b App term=1 prev=1@1 commit=1 [2@1:x]",
                             "b->a AppResp term=1 match=2"]
    s.crash("a")

    # (b)
    s.heal()
    s.cut("e", "b")
    s.campaign("e")
    s.send("e"), s.deliver(), s.send("c"), s.send("d"), s.deliver("e")
    assert s.state("e") == "e leader term=2 leader=e commit=1 applied=1 last=2"
    s.send("e")                      # 2@2 persisted; the messages die with e
    s.crash("e")
    s.mailbox.clear()

    # (c)
    s.heal()
    s.restart("a")
    s.cut("a", "d", "e")
    s.campaign("a")                  # term 2: c already voted for e there
    s.stabilize()
    s.campaign("a")                  # term 3
    s.send("a"), s.deliver(), s.send("b"), s.send("c"), s.deliver("a")
    assert s.node("a").role is Role.LEADER and s.node("a").term == 3
    # a restarted: its commit index starts from 0 again (it is not persisted)
    assert s.send("a") == ["a->b App term=3 prev=2@1 commit=0 [3@3:noop]",
                           "a->c App term=3 prev=2@1 commit=0 [3@3:noop]",
                           "a->d App term=3 prev=2@1 commit=0 [3@3:noop]",   # cut
                           "a->e App term=3 prev=2@1 commit=0 [3@3:noop]"]   # cut
    s.deliver()
    assert s.send("b") + s.send("c") == ["b->a AppResp term=3 match=3",
                                         "c->a AppResp term=3 reject=2 hint=1@1"]
    s.deliver()
    assert s.send("a") == ["a->c App term=3 prev=1@1 commit=0 [2@1:x]"]
    s.deliver()
    assert s.send("c") == ["c->a AppResp term=3 match=2"]
    s.deliver()
    # 2@1 is on a, b and c, a majority of five — and stays uncommitted
    assert s.node("a").commit_index == 0
    assert s.send("a") == ["a->c App term=3 prev=2@1 commit=0 [3@3:noop]"]
    s.crash("a")

    # (d)
    s.heal()
    s.mailbox.clear()
    s.restart("e")
    s.cut("e", "b")
    s.campaign("e")                  # term 3 (a won it) is refused; term 4 wins
    s.stabilize()
    s.campaign("e")
    s.stabilize()
    assert s.node("e").role is Role.LEADER and s.node("e").term == 4
    assert s.log("c").startswith("1@1:noop 2@2:noop")   # 2@1 overwritten
    assert s.applied("c") == []                         # and never applied anywhere

"""RaftLog (log.py) and Progress (progress.py) in isolation: tables of small cases.

Raft paper §5.3 (log matching, conflict truncation), §5.4.1 (up to date), etcd-io/raft's
unstable log and flow control.
"""

from __future__ import annotations

import pytest

from quorumqueue.broker.raft.log import RaftLog
from quorumqueue.broker.raft.progress import Inflights, Progress, ProgressState, quorum_index
from quorumqueue.broker.raft.types import COMMAND, HardState, LogEntry

from .harness import MemoryStorage


def e(index, term, data=""):
    return LogEntry(index, term, COMMAND, data.encode())


def log_with(terms):
    return RaftLog(MemoryStorage.preloaded(("a",), terms, HardState()))


def terms(log):
    return [x.term for x in log.entries(log.first_index(), log.last_index() + 1)]


@pytest.mark.parametrize("index, term, expected", [
    (5, 3, (5, 3)),      # matches exactly
    (5, 2, (3, 2)),      # skip back over the term-3 entries
    (5, 1, (2, 1)),
    (5, 0, (0, 0)),      # nothing that old: start from the top
    (2, 9, (2, 1)),
])
def test_find_conflict_by_term(index, term, expected):
    log = log_with([1, 1, 2, 3, 3])
    assert log.find_conflict_by_term(index, term) == expected


@pytest.mark.parametrize("last_index, last_term, up_to_date", [
    (3, 2, True), (9, 2, True), (2, 2, False),   # same last term: longer or equal wins
    (1, 3, True), (9, 1, False),                 # otherwise the later last term wins
])
def test_is_up_to_date(last_index, last_term, up_to_date):
    assert log_with([1, 1, 2]).is_up_to_date(last_index, last_term) is up_to_date


def test_maybe_append_skips_what_it_has_and_truncates_at_the_first_conflict():
    log = log_with([1, 1, 1, 1])
    assert log.maybe_append(1, 2, (e(2, 1),)) is None            # prev term mismatch
    assert log.maybe_append(5, 1, ()) is None                     # prev beyond our log
    assert log.maybe_append(1, 1, (e(2, 1), e(3, 1))) == (3, [], None)   # duplicate
    assert log.maybe_append(2, 1, (e(3, 1), e(4, 2), e(5, 2))) == (
        5, [e(4, 2), e(5, 2)], 4)
    assert terms(log) == [1, 1, 1, 2, 2]
    assert log.unstable_entries() == (e(4, 2), e(5, 2))


def test_committed_entries_are_never_truncated():
    log = log_with([1, 1, 1])
    log.commit_to(3)
    with pytest.raises(AssertionError, match="conflicts with the committed log"):
        log.maybe_append(1, 1, (e(2, 2),))


def test_a_truncation_between_ready_and_advance_is_not_lost():
    storage = MemoryStorage.preloaded(("a",), [1, 1, 1, 1], HardState())
    log = RaftLog(storage)
    log.maybe_append(4, 1, (e(5, 1), e(6, 1), e(7, 1)))
    handed_out = log.unstable_entries()                          # in a Ready: [5, 6, 7]
    log.maybe_append(5, 1, (e(6, 2),))                           # meanwhile: 6 conflicts
    storage._entries.extend(handed_out)                          # the Ready is persisted
    log.stable_to(7, 1)                                          # 7@1 is gone: no-op
    assert log.unstable_entries() == (e(5, 1), e(6, 2))          # so next Ready rewrites
    assert log.last_index() == 6 and log.term_at(7) is None      # the stale 7 is unseen
    assert log.persisted_index() == 4


def test_the_leader_commits_only_its_own_terms_entries():
    log = log_with([1, 1, 2])
    assert not log.maybe_commit(2, 2)        # 2@1 counted by replicas: not committed
    assert log.maybe_commit(3, 2) and log.committed == 3


def test_quorum_index():
    assert quorum_index([5]) == 5
    assert quorum_index([5, 3, 9]) == 5
    assert quorum_index([1, 2, 3, 4]) == 2   # three of four have reached 2
    assert quorum_index([7, 7, 0, 0, 1]) == 1


def test_progress_probe_replicate_and_the_inflight_window():
    pr = Progress(match=0, next=11, inflights=Inflights(2))
    pr.sent_entries(0, 10)
    assert pr.is_paused()                                  # one probe at a time
    assert not pr.maybe_decr_to(rejected=3, hint=2)        # not the probe we sent: stale
    assert pr.maybe_decr_to(rejected=10, hint=4) and pr.next == 5 and not pr.is_paused()
    assert pr.maybe_update(4)
    pr.become_replicate()
    assert (pr.state, pr.next) == (ProgressState.REPLICATE, 5)
    pr.sent_entries(3, 7)
    pr.sent_entries(3, 10)
    assert pr.next == 11 and pr.is_paused()                # window of 2 is full
    pr.maybe_update(7)
    pr.inflights.free_le(7)
    assert not pr.is_paused()
    assert not pr.maybe_decr_to(rejected=6, hint=0)        # below match: stale
    assert pr.maybe_decr_to(rejected=10, hint=0) and pr.next == 8

"""The fault suite's short seeded subset (the long form: `make faults`, run.py).

Each test is one run of run.py's `run_one`: a fresh 3-node cluster of real
processes, the confirmed-publish + manual-ack workload, one nemesis striking and
healing for a few seconds; it passes when the checkers find nothing (every
confirmed message delivered, nothing from nowhere, no unconfirmed message twice as
new, no two leaders of one group in one term) and the workload got confirms after
every heal. The nemeses here are the ones the older fault tests
(tests/broker/cluster/test_faults.py: leader killed, follower paused, node cut
off) do not cover. Plus the checkers' own tests: they must catch what they look for.
"""

from __future__ import annotations

import pytest

from tests.faults.nemesis import NEMESES
from tests.faults.run import RunResult, leaderships, run_one, split_brain
from tests.support.history import Delivery, History, violations

pytestmark = pytest.mark.timeout(600)  # the waits inside have their own bounds

SHORT = 6.0  # seconds of faults per run


@pytest.mark.parametrize("name, seed", [("minority-leader", 11), ("bridge", 12),
                                        ("pause-long", 13), ("kill-majority", 14),
                                        ("slow-disk", 15)])
def test_a_short_run_under_the_nemesis_loses_nothing(name, seed):
    result = run_one(3, NEMESES[name], seed, SHORT)
    assert not result.error, result.error
    assert result.faults and len(result.recoveries) == len(result.faults)
    assert not result.violations, result.violations
    assert not result.split_brain, result.split_brain
    assert result.elections >= 2  # the metadata group and the queue, at least
    assert result.counts.confirmed >= 25


def test_the_split_brain_checker_sees_two_leaders_of_one_term():
    logs = ["... group g1: qq1@localhost is the leader in term 3\n",
            "... group g1: qq2@localhost is the leader in term 4\n"
            "... group g1: qq3@localhost is the leader in term 3\n"]
    assert split_brain(leaderships(logs)) == ["group g1 term 3: qq1@localhost, qq3@localhost"]
    assert split_brain(leaderships(logs[:1])) == []


def test_the_total_queue_checker_sees_a_lost_message():
    history = History(published=["m-1", "m-2"], confirmed=["m-1", "m-2"],
                      deliveries=[Delivery("m-1", False)])
    assert violations(history) == ["confirmed but never delivered (lost): 1 ids: m-2"]


def test_unavailability_windows_are_the_gaps_without_confirms():
    result = RunResult(3, "x", 0, samples=[(0.2, 1, 1, 1), (0.4, 2, 2, 2), (0.6, 3, 2, 2),
                                           (1.9, 4, 2, 2), (2.1, 5, 3, 3)])
    assert result.unavailable() == [(0.4, 2.1)]

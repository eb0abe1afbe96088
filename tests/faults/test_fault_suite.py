"""The fault suite's short seeded subset (the long form: `make faults`, run.py).

Each test is one run of run.py's `run_one`: a fresh 3-node cluster of real
processes, the confirmed-publish + manual-ack workload, one nemesis striking and
healing for a few seconds; it passes when the checkers find nothing (every
confirmed message delivered, nothing from nowhere, no unconfirmed message twice as
new, no two leaders of one group in one term) and the workload got confirms after
every heal. The nemeses here are the ones the older fault tests
(tests/broker/cluster/test_faults.py: leader killed, follower paused, node cut
off) do not cover; the two disk-full ones run on small file systems (a tmpfs per
node: every node stays up, nothing confirmed is lost); the three exposure ones
(exposure.py: silent and slow connections on every listener, a pre-auth flood on the
inter-node port, descriptor exhaustion) fail the run unless the node closed every
hostile connection itself. Two runs add extras.py's workloads: a single-active-consumer
queue under leader kills (never two consumers served at once), at-least-once dead
lettering under partitions (every rejected message in the target). One run is the Spark workload (spark_workload.py): a lease-mode
query into Delta while the leader is killed, every confirmed id exactly once in the
table. Plus the checkers' own tests: they must catch what they look for.
"""

from __future__ import annotations

import pytest

from tests.faults.nemesis import NEMESES
from tests.faults.run import RunResult, leaderships, run_one, split_brain
from tests.faults.spark_workload import diagnose_rows
from tests.support.history import Delivery, History, violations

pytestmark = pytest.mark.timeout(600)  # the waits inside have their own bounds

SHORT = 6.0  # seconds of faults per run


@pytest.mark.parametrize("name, seed", [("minority-leader", 11), ("bridge", 12),
                                        ("pause-long", 13), ("kill-majority", 14),
                                        ("slow-disk", 15), ("disk-full-leader", 18),
                                        ("disk-full-follower", 19),
                                        ("silent-connections", 22), ("preauth-flood", 23),
                                        ("fd-exhaustion", 24)])
def test_a_short_run_under_the_nemesis_loses_nothing(name, seed):
    result = run_one(3, NEMESES[name], seed, SHORT)
    assert not result.error, result.error
    assert result.faults and len(result.recoveries) == len(result.faults)
    # a failed run's diagnosis: each live node's view of the queue, its warnings,
    # the clients' last events
    assert not result.violations, result.violations + result.diagnosis + result.events
    assert not result.split_brain, result.split_brain
    assert result.elections >= 2  # the metadata group and the queue, at least
    assert result.counts.confirmed >= 25


def test_a_short_run_under_leader_kills_keeps_one_single_active_consumer():
    result = run_one(3, NEMESES["kill-leader"], 16, SHORT, extras=("sac",))
    assert not result.error, result.error
    assert result.faults and len(result.recoveries) == len(result.faults)
    assert not result.violations, result.violations + result.diagnosis + result.events
    assert not result.split_brain, result.split_brain
    assert result.sac["confirmed"] >= 25 and result.sac["lost"] == 0
    assert result.sac["sessions"] >= 1 and result.sac["fresh"] >= 25


def test_a_short_run_under_partitions_dead_letters_every_rejected_message():
    result = run_one(3, NEMESES["isolate-leader"], 17, SHORT, extras=("dlx",))
    assert not result.error, result.error
    assert result.faults and len(result.recoveries) == len(result.faults)
    assert not result.violations, result.violations + result.diagnosis + result.events
    assert not result.split_brain, result.split_brain
    assert result.dlx["confirmed"] >= 25
    assert result.dlx["rejected"] >= 8 and result.dlx["in_target"] == result.dlx["rejected"]


def test_a_short_spark_run_under_leader_kills_writes_every_confirmed_id_once_to_delta():
    result = run_one(3, NEMESES["kill-leader"], 21, SHORT, workload="spark")
    assert not result.error, result.error
    assert result.faults and len(result.recoveries) == len(result.faults)
    assert not result.violations, result.violations + result.diagnosis
    assert not result.split_brain, result.split_brain
    assert result.counts.confirmed >= 25
    assert result.counts.duplicated_new == 0
    assert result.counts.delivered >= result.counts.confirmed


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


def test_the_exactly_once_checker_sees_a_confirmed_id_in_two_rows():
    history = History(published=["m-1", "m-2"], confirmed=["m-1", "m-2"],
                      deliveries=[Delivery("m-1", False), Delivery("m-2", False),
                                  Delivery("m-2", False)])
    assert violations(history) == []  # at-least-once allows it
    assert violations(history, strict_duplicates=True) == [
        "delivered twice or more with redelivered=false: 1 ids: m-2 (x2)"]


def test_duplicated_rows_are_told_apart_by_their_lease_offsets():
    rows = [("m-1", "q", 1, 0, False), ("m-2", "q", 2, 0, False), ("m-2", "q", 2, 0, False),
            ("m-3", "q", 3, 0, False), ("m-3", "q", 7, 1, False)]
    assert diagnose_rows(rows) == [
        "m-2: 2 rows, one offset written twice (sink): q@2 delivery_count=0 "
        "redelivered=False, q@2 delivery_count=0 redelivered=False",
        "m-3: 2 rows, distinct offsets (the queue held copies): q@3 delivery_count=0 "
        "redelivered=False, q@7 delivery_count=1 redelivered=False"]


def test_unavailability_windows_are_the_gaps_without_confirms():
    result = RunResult(3, "x", 0, samples=[(0.2, 1, 1, 1), (0.4, 2, 2, 2), (0.6, 3, 2, 2),
                                           (1.9, 4, 2, 2), (2.1, 5, 3, 3)])
    assert result.unavailable() == [(0.4, 2.1)]

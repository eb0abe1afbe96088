"""Which applied entries count as a replay after a restart (queues/quorum/groups.py
replay_bound): the log a node found at start, less what a leader then replaced.

A restarted node applies its stored entries again without writing their deliveries
(their connections are gone). Entries above its commit index may be replaced by the
new leader's (truncate_from) or by a snapshot; what is applied there is new, and its
deliveries (for example to a consumer that connected after the restart) must go out.
Found by the fault suite: after kill -9 of a majority, a consumer connected to a
restarted node never received a message again.
"""

from __future__ import annotations

from dataclasses import replace

from quorumqueue.broker.queues.quorum.groups import replay_bound
from quorumqueue.broker.raft.log import Snapshot
from quorumqueue.broker.raft.types import SnapshotMeta
from tests.broker.groups.test_driver import make_ready


def test_a_ready_that_keeps_the_stored_log_keeps_the_bound():
    assert replay_bound(40, make_ready()) == 40


def test_a_truncated_tail_is_no_longer_a_replay():
    assert replay_bound(40, replace(make_ready(), truncate_from=31)) == 30
    assert replay_bound(40, replace(make_ready(), truncate_from=45)) == 40


def test_a_snapshot_replaces_the_log_up_to_its_index():
    snapshot = Snapshot(SnapshotMeta(25, 3, ("n1",)), b"")
    assert replay_bound(40, replace(make_ready(), snapshot=snapshot)) == 25

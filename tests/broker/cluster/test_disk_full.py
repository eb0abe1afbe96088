"""A full disk on one node of a 3-node cluster leaves every node running and loses
nothing confirmed (issue 30): the node whose data directory's file system is full
raises its disk alarm and holds its writes until space returns (server.py `_stall`),
its queues' other members go on as a majority (a leader that cannot write stops
being heard, and another is elected), and it catches up once space returns. Each
node's data directory is a tmpfs of its own (LocalCluster small_disks); the victim's
is kept full, whatever it frees taken at once, so nothing at all is written there
during the fault (tests/support/small_fs.py)."""

from __future__ import annotations

import pytest

from tests.broker.cluster.test_cluster import leader_of, status
from tests.support.cluster import CONVERGE_TIMEOUT, LocalCluster, wait_for
from tests.support.history import Workload, check
from tests.support.small_fs import mount_refusal

pytestmark = pytest.mark.timeout(600)  # the waits inside have their own bounds

QUEUE = "disk-full"
# the writes, not the free-space check, meet the full disk; a small WAL rolls over
# into segments while the disk fills and after it is freed
CONFIG = ("disk_free_limit.absolute = 1\n"
          'storage.disk_reserve = "4MiB"\n'
          'raft.wal_max_size_bytes = "1MiB"\n')
DISK = 96 * 1024 * 1024


def confirmed(workload: Workload) -> int:
    with workload.history.lock:
        return len(workload.history.confirmed)


@pytest.mark.parametrize("victim", ["leader", "follower"])
def test_a_disk_kept_full_on_one_node_leaves_every_node_running_and_loses_nothing(victim):
    refusal = mount_refusal()
    if refusal:
        pytest.skip(refusal)
    with LocalCluster(3, extra_config=CONFIG, small_disks=DISK) as cluster:
        wait_for("a metadata leader", lambda: all(status(uri)["metadata_leader"]
                                                  for uri in cluster.uris()))
        with Workload(cluster.live_uris, QUEUE, interval=0.002) as workload:
            leader = wait_for("a leader", lambda: leader_of(cluster.uris()[0], QUEUE))
            wait_for("50 confirms", lambda: confirmed(workload) >= 50)
            node = leader if victim == "leader" else next(
                name for name in cluster.names if name != leader)
            others = [uri for name, uri in zip(cluster.names, cluster.uris()) if name != node]
            cluster.fill_disk(node, keep_full=True)
            wait_for(f"{node}'s disk alarm", lambda: "disk alarm set" in cluster.log(node))
            at_fill = confirmed(workload)
            wait_for("50 confirms with the disk full",
                     lambda: confirmed(workload) >= at_fill + 50)
            if victim == "leader":
                wait_for("another leader", lambda: leader_of(others[0], QUEUE)
                         not in (None, node))
            assert cluster.exited() == {}
            cluster.free_disk(node)
            wait_for(f"{node} writing again",
                     lambda: "succeed again after a full disk" in cluster.log(node))
            after = confirmed(workload)
            wait_for("50 confirms after", lambda: confirmed(workload) >= after + 50)
            history = workload.finish(drain_timeout=CONVERGE_TIMEOUT)
        report = check(history)
        print(report)
        assert cluster.exited() == {}
        for name in cluster.names:
            assert "CRITICAL" not in cluster.log(name, tail=10**7), name

"""Leader placement of new quorum queues on a real 3-node cluster: `client-local` (the
default; the quorum queues guide, "Leader Placement") puts the leader on the node the
declaring client is connected to, whichever node that is — the one leading the
metadata group included.

Why it could fail: the chosen member campaigns as soon as it applies the declaration,
and the other members drop its vote requests if they have not applied it yet; it then
waited for its next election timeout, which another member's timer could beat. Now it
asks again every heartbeat (tests/broker/raft/test_elections.py
test_a_candidate_asks_again_members_that_did_not_answer, the deterministic form). How
often the requests arrive too early depends on the nodes' timing: this end-to-end
check is what a user sees, the Raft test is the one that pins the cause."""

from __future__ import annotations

import pytest

from tests.broker.cluster.test_cluster import connect, leader_of, status
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(300)  # the waits inside have their own bounds

PER_NODE = 8


def test_client_local_gives_every_new_queue_a_leader_on_the_declaring_node():
    with LocalCluster(3) as cluster:
        wait_for("a metadata leader all nodes agree on", lambda: len(
            {status(uri)["metadata_leader"] for uri in cluster.uris()} - {None}) == 1
            and all(status(uri)["metadata_leader"] for uri in cluster.uris()))
        declared = {}
        for node in cluster.names:
            with connect(cluster.uri(node)) as connection:
                channel = connection.channel()
                for n in range(PER_NODE):
                    name = f"local-{node.partition('@')[0]}-{n}"
                    channel.queue_declare(name, durable=True,
                                          arguments={"x-queue-type": "quorum"})
                    declared[name] = node
        uri = cluster.uri(0)
        leaders = {name: wait_for(f"a leader of {name}",
                                  lambda name=name: leader_of(uri, name))
                   for name in declared}
        elsewhere = {name: (declared[name], leader) for name, leader in leaders.items()
                     if leader != declared[name]}
        assert not elsewhere, f"{len(elsewhere)} of {len(declared)} queues not led by the " \
            f"declaring node (declared through, leader): {elsewhere}"

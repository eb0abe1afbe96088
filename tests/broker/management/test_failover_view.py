"""After a quorum queue's leader is killed, the management API of the surviving nodes
follows the cluster: the dead node shows offline as soon as its links close, and the
queue's leader in /api/queues is the one the node's Raft member follows when the
answer leaves (views.py reads leaders and members after it waited for the other
nodes' counters and clients; cluster/replica_rpc.py answers a lost node's queries at
once). Before, a request that came just after the kill waited 5 s for the dead node
and then named it as leader."""

from __future__ import annotations

import pytest

from tests.support.cluster import LocalCluster

from .support import call, wait_for, wait_until_serving

pytestmark = pytest.mark.timeout(300)


def test_the_api_follows_a_leader_killed(tmp_path):
    with LocalCluster(3, proxied=False) as cluster:
        for name in cluster.names:
            wait_until_serving(cluster.management_url(name))
        first = cluster.management_url(cluster.names[0])
        assert call(first, "PUT", "/api/queues/%2F/failover",
                    {"durable": True, "arguments": {"x-queue-type": "quorum"}})[0] == 201
        row = wait_for(lambda: (lambda r: r if r.get("leader") and len(r["online"]) == 3
                                else None)(call(first, "GET", "/api/queues/%2F/failover")[1]),
                       "a leader with three members online")
        dead = row["leader"]
        survivors = [name for name in cluster.names if name != dead]
        cluster.kill(dead)

        def offline_everywhere():
            for name in survivors:
                url = cluster.management_url(name)
                raft = call(url, "GET", "/api/queues/%2F/failover/raft")[1]
                if {m["node"]: m["online"] for m in raft["members"]}[dead]:
                    return None
                if dead in call(url, "GET", "/api/queues/%2F/failover")[1]["online"]:
                    return None
                nodes = {n["name"]: n["running"] for n in call(url, "GET", "/api/nodes")[1]}
                if nodes[dead]:
                    return None
            return True

        wait_for(offline_everywhere, f"{dead} offline on every survivor's API")

        def new_leader():
            leaders = set()
            for name in survivors:
                url = cluster.management_url(name)
                raft = call(url, "GET", "/api/queues/%2F/failover/raft")[1]
                leaders.add(raft["leader"])
            return leaders.pop() if len(leaders) == 1 and None not in leaders \
                and dead not in leaders else None

        leader = wait_for(new_leader, "the survivors' members agree on a new leader")
        for name in survivors:  # read after every wait: the leader of now
            url = cluster.management_url(name)
            row = call(url, "GET", "/api/queues/%2F/failover")[1]
            assert (row["leader"], sorted(row["online"])) == (leader, survivors)
            listed = [q for q in call(url, "GET", "/api/queues/%2F")[1]
                      if q["name"] == "failover"]
            assert listed[0]["leader"] == leader

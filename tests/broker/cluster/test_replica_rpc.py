"""Management queries asked of other nodes (cluster/replica_rpc.py) when the link to
one is lost: what waits on it is answered None at once, what is asked of it meanwhile
too, until it is heard from again; other nodes' requests wait as before. Before, a
killed node's queries waited REPLY_TIMEOUT (5 s), and the management API answered
with the queue's leader as it stood when the request came: the dead node."""

from __future__ import annotations

from quorumqueue.broker.cluster import replica_rpc


class _Cluster:
    """What replica_rpc.ask needs of the cluster: reachability, the lost links, the
    request table, the clock and the outbox."""

    def __init__(self) -> None:
        self.name, self.now = "a", 100.0
        self.links_lost: set[str] = set()
        self.replica_requests: dict[int, tuple] = {}
        self._next_request = 0
        self.posted: list[tuple[str, object]] = []

    def reachable(self, name: str) -> bool:
        return True  # pinged within REACHABLE_WITHIN: a kill is not seen there yet

    def _post(self, node: str, rpc) -> None:
        self.posted.append((node, rpc))

    def link_lost(self, name: str) -> None:  # as Cluster.link_lost
        self.links_lost.add(name)
        replica_rpc.link_lost(self, name)


def test_a_lost_link_answers_what_waits_on_its_node_at_once():
    cluster, answers = _Cluster(), []
    replica_rpc.ask(cluster, "b", "", "clients", {}, lambda v: answers.append(("b", v)))
    replica_rpc.ask(cluster, "c", "", "clients", {}, lambda v: answers.append(("c", v)))
    assert [node for node, _ in cluster.posted] == ["b", "c"] and answers == []
    cluster.link_lost("b")
    assert answers == [("b", None)]          # at once, not REPLY_TIMEOUT later
    assert len(cluster.replica_requests) == 1  # c's still waits for c


def test_what_is_asked_of_a_lost_node_is_answered_at_once_until_it_is_heard_again():
    cluster, answers = _Cluster(), []
    cluster.link_lost("b")
    replica_rpc.ask(cluster, "b", "", "message_stats", {}, answers.append)
    assert answers == [None] and cluster.posted == [] and not cluster.replica_requests
    cluster.links_lost.discard("b")  # Cluster.on_message: heard from b again
    replica_rpc.ask(cluster, "b", "", "message_stats", {}, answers.append)
    assert [node for node, _ in cluster.posted] == ["b"] and answers == [None]


def test_requests_still_expire_after_reply_timeout():
    cluster, answers = _Cluster(), []
    replica_rpc.ask(cluster, "b", "", "clients", {}, answers.append)
    cluster.now += replica_rpc.REPLY_TIMEOUT
    replica_rpc.expire(cluster)
    assert answers == [None] and not cluster.replica_requests

"""Connections and channels counted across the cluster (broker/cluster/tracking.py),
without sockets: a stand-in cluster records what would be sent and says who is
reachable. The 3-node behaviour is in test_limits.py."""

from __future__ import annotations

from types import SimpleNamespace

from quorumqueue.broker.amqp.connection import ChannelQuota
from quorumqueue.broker.cluster.tracking import Tracking
from quorumqueue.broker.cluster.wire import Rpc
from quorumqueue.broker.node import limits


def session(vhost: str, user: str, closed: bool = False, opened: bool = True):
    return SimpleNamespace(vhost=SimpleNamespace(name=vhost) if opened else None,
                           user=SimpleNamespace(name=user), closed=closed)


class FakeNode:
    """What tracking.py asks of the node (cluster/host.py), as node/node.py answers it."""

    def __init__(self, cluster: "FakeCluster") -> None:
        self.cluster = cluster
        self.sessions: list = []
        self.channel_quotas: dict[str, ChannelQuota] = {}

    def connection_counts(self):
        return limits.connection_counts(self)

    def refresh_channel_quotas(self) -> None:
        limits.refresh_elsewhere(self)


class FakeCluster:
    def __init__(self) -> None:
        self.name = "a"
        self.addresses = {"a": 1, "b": 2, "c": 3}
        self.nodes = tuple(sorted(self.addresses))
        self.sent: list[tuple[str, Rpc]] = []
        self.unreachable: set[str] = set()
        self.node = FakeNode(self)
        self.tracking: Tracking | None = None   # the Tracking under test (the quotas ask it)

    def _post(self, peer, envelope) -> None:
        self.sent.append((peer, envelope))

    def reachable(self, name: str) -> bool:
        return name not in self.unreachable


def test_local_counts_are_open_connections_per_vhost_and_user_and_open_channels():
    node = SimpleNamespace(sessions=[session("/", "guest"), session("/", "alice"),
                                     session("shop", "alice"),
                                     session("shop", "alice", closed=True),
                                     session("shop", "bob", opened=False)],
                           channel_quotas={"alice": ChannelQuota("alice"),
                                           "guest": ChannelQuota("guest")})
    node.channel_quotas["alice"].open = 3
    assert limits.connection_counts(node) == ({"/": 2, "shop": 1}, {"guest": 1, "alice": 2},
                                              {"alice": 3})


def test_counts_go_to_every_peer_when_they_change_and_with_the_pings():
    cluster = FakeCluster()
    tracking = cluster.tracking = Tracking(cluster)
    tracking.tick(ping_due=False)                     # nothing sent yet: the first counts
    assert [peer for peer, _ in cluster.sent] == ["b", "c"]
    assert cluster.sent[0][1] == Rpc("connections", {"vhosts": {}, "users": {},
                                                     "channels": {}})
    cluster.sent.clear()
    tracking.tick(ping_due=False)                     # unchanged: nothing
    assert cluster.sent == []
    cluster.node.sessions.append(session("/", "guest"))
    tracking.tick(ping_due=False)                     # changed: sent at once
    assert [body.body["vhosts"] for _, body in cluster.sent] == [{"/": 1}, {"/": 1}]
    cluster.sent.clear()
    tracking.tick(ping_due=True)                      # with the pings, changed or not
    assert len(cluster.sent) == 2


def test_only_reachable_known_peers_count_and_channel_quotas_follow():
    cluster = FakeCluster()
    quota = cluster.node.channel_quotas["alice"] = ChannelQuota("alice", limit=4)
    tracking = cluster.tracking = Tracking(cluster)
    tracking.on_counts("b", {"vhosts": {"/": 2, "shop": 1}, "users": {"alice": 2},
                             "channels": {"alice": 3}})
    tracking.on_counts("c", {"vhosts": {"/": 1, 7: 5, "bad": "x", "neg": -1},
                             "users": "nonsense", "channels": {"alice": 1}})
    assert tracking.elsewhere(vhost="/") == 3 and tracking.elsewhere(vhost="shop") == 1
    assert tracking.elsewhere(user="alice") == 2 and tracking.elsewhere(vhost="neg") == 0
    assert quota.elsewhere == 4 and quota.refusal() is not None
    cluster.unreachable.add("b")                      # cut off: its counts stop counting
    tracking.refresh_quotas()
    assert tracking.elsewhere(vhost="/") == 1 and quota.elsewhere == 1
    assert quota.refusal() is None
    del cluster.addresses["c"]                        # forgotten
    assert tracking.elsewhere(vhost="/") == 0
    cluster.unreachable.clear()
    tracking.on_counts("b", {"vhosts": {}, "users": {}, "channels": {}})  # a new count
    assert tracking.elsewhere(vhost="/") == 0 and quota.elsewhere == 0

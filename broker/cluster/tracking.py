"""Connections and channels counted across the cluster, for the vhost and user limits
(node/limits.py), as RabbitMQ's rabbit_connection_tracking and rabbit_channel_tracking.

Responsibilities: take this node's open connections per vhost and per user, and its
users' open channels (the node counts them: ClusterHost.connection_counts); tell the
other nodes when those counts change, and every PING_EVERY besides (`tick`, the Rpc
"connections"); keep the last counts each node told (`on_counts`); answer how many
connections of a vhost or user, and channels of a user, are open on the other nodes
this node can reach (`elsewhere`), and have the node keep every local ChannelQuota's
`elsewhere` equal to that (ClusterHost.refresh_channel_quotas; channel.open is
checked in the AMQP core, which knows no cluster).

How it works: each node owns its own counts and is the only one that writes them
(no shared state, no consensus round per connection): a connection opened or closed
shows in the next cluster tick's counts (every raft tick, 100 ms by default), which
leave to every peer in one small Rpc if they differ from the last sent. A node keeps
the latest counts of each peer. A limit is checked against this node's live count
plus the counts of the peers that are reachable now (heard from within
REACHABLE_WITHIN: cluster.py), as RabbitMQ sums the counts of the nodes it can
reach. Why not the metadata group: a count changes with every connection, so every
connection.open would wait for a Raft commit, a minority could not open connections
at all, and a node that crashed would leave its counts behind until someone removed
them; RabbitMQ does not keep them in its metadata store either.

Invariants (eventually consistent, as RabbitMQ documents its limits): a peer's
connections count from its next tick on (two connections opened at once on two
nodes may both be let in, as in RabbitMQ); during a partition each side counts only
the connections it can see, so a vhost or user may have up to its limit on each side;
the counts of a node that stopped or was cut off stop counting REACHABLE_WITHIN
after it was last heard; a restarted node's counts are replaced by its first message.

Not here: the limits and their reply texts (node/limits.py), reachability and pings
(cluster.py), the transport (server/cluster_transport.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .wire import Rpc

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Cluster


class Counts:
    """One node's open connections per vhost and per user, and channels per user."""

    __slots__ = ("vhosts", "users", "channels")

    def __init__(self, vhosts: dict[str, int] | None = None,
                 users: dict[str, int] | None = None,
                 channels: dict[str, int] | None = None) -> None:
        self.vhosts: dict[str, int] = vhosts or {}      # only counts above 0
        self.users: dict[str, int] = users or {}
        self.channels: dict[str, int] = channels or {}

    def body(self) -> dict:
        return {"vhosts": self.vhosts, "users": self.users, "channels": self.channels}

    def __eq__(self, other) -> bool:
        return isinstance(other, Counts) and self.body() == other.body()


class Tracking:
    """The counts of the other nodes, as they last told them, and ours as last sent."""

    def __init__(self, cluster: "Cluster") -> None:
        self.cluster = cluster
        self.peers: dict[str, Counts] = {}     # node -> its counts, from its last Rpc
        self.sent: Counts | None = None         # ours, as last sent to every peer

    def tick(self, ping_due: bool) -> None:
        """Send this node's counts to every peer if they changed (or with the pings),
        and bring the local channel quotas' `elsewhere` up to date."""
        cluster = self.cluster
        counts = Counts(*cluster.node.connection_counts())
        if ping_due or counts != self.sent:
            self.sent = counts
            for name in cluster.nodes:
                if name != cluster.name:
                    cluster._post(name, Rpc("connections", counts.body()))
        self.refresh_quotas()

    def on_counts(self, sender: str, body: dict) -> None:
        self.peers[sender] = Counts(_counts(body.get("vhosts")), _counts(body.get("users")),
                                    _counts(body.get("channels")))
        self.refresh_quotas()

    def elsewhere(self, *, vhost: str | None = None, user: str | None = None,
                  channels_of: str | None = None) -> int:
        """Connections of `vhost` or `user`, or channels of user `channels_of`, open on
        the other nodes this node can reach now."""
        cluster = self.cluster
        total = 0
        for name, counts in self.peers.items():
            if name not in cluster.addresses or not cluster.reachable(name):
                continue
            if vhost is not None:
                total += counts.vhosts.get(vhost, 0)
            if user is not None:
                total += counts.users.get(user, 0)
            if channels_of is not None:
                total += counts.channels.get(channels_of, 0)
        return total

    def refresh_quotas(self) -> None:
        self.cluster.node.refresh_channel_quotas()  # (each asks `elsewhere`)


def _counts(value) -> dict[str, int]:
    """A peer's {name: count}, keeping only what is well formed."""
    if not isinstance(value, dict):
        return {}
    return {key: count for key, count in value.items()
            if isinstance(key, str) and type(count) is int and count > 0}


def handlers() -> dict:
    return {"connections": lambda cluster, sender, body:
            cluster.tracking.on_counts(sender, body)}

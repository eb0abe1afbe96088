"""What the cluster package asks of its node: the one interface it reaches up through.

node/node.py's `Node` implements it. The cluster never imports the node. It builds
the node's quorum groups (`Cluster.groups`) and its member of the metadata group,
and hands them the node whole as their host (queues/quorum/host.py `QuorumHost`,
groups/metadata.py `MetadataHost`), which is why this Protocol extends both. What
the cluster itself asks of the node is the methods below and `boot_id`, nothing
else: tests/broker/cluster/test_host.py reads every use of the node in cluster/.
Not here: what the node does with them.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol

from ..groups.metadata import MetadataHost
from ..queues.quorum.host import QuorumHost


class ClusterHost(QuorumHost, MetadataHost, Protocol):
    """The node, as the cluster sees it."""

    boot_id: str    # this run of the node (fifo identities and pings carry it)

    def queue(self, vhost: str, name: str) -> Any:
        """The queue `name` of vhost `vhost` (its record, whatever its type), or None."""

    def all_queues(self) -> Iterable[Any]:
        """Every queue of every vhost (take a list to delete while walking it)."""

    def policy_for(self, vhost: str, kind: str, name: str) -> Any:
        """The (effective) policy that applies to a queue or exchange, or None."""

    def cancel_consumer(self, queue: Any, consumer: Any) -> None:
        """A consumer's queue is gone here: cancel it (notifying the client)."""

    def consumer_removed(self, queue: Any) -> None:
        """A queue lost a consumer (auto-delete, x-expires)."""

    def has_open_channel(self, identity: str) -> bool:
        """A channel of this node whose fifo identity is `identity` is open."""

    def after_sync(self, batch_id: int, waiter: Any) -> bool:
        """Whether the message-store batch `batch_id` is still to be made durable;
        if so, `waiter.release_confirms(synced_batch_id)` is called after each fsync
        until it returns True."""

    def connection_counts(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """This node's open connections (past connection.open) per vhost and per user,
        and its users' open channels (cluster/tracking.py tells the other nodes)."""

    def refresh_channel_quotas(self) -> None:
        """The other nodes' counts changed (or may have): the channel quotas of this
        node's users take their channels open elsewhere (node/limits.py)."""

    def message_stats(self) -> dict:
        """This node's message counters and its queues' counts, for another node's
        management API (cluster/replica_rpc.py "message_stats")."""

    def shovel_rows(self) -> list:
        """The status rows of the dynamic shovels this node runs."""

    def clients(self) -> dict:
        """This node's AMQP clients' management rows: connections, channels, consumers."""

    def close_connection(self, name: str, reason: str) -> bool:
        """Close this node's client connection named `name` (320, `reason`); False
        if there is none."""

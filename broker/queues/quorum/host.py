"""What the quorum queues ask of their node and of its cluster: the two interfaces
they reach up through.

node/node.py's `Node` implements `QuorumHost`, cluster/cluster.py's `Cluster`
implements `QuorumCluster`; the cluster builds the node's `QuorumGroups` with both
(`Cluster.__init__`, when the node is built). The quorum type never imports the
node or the cluster, and never reaches the node through the cluster: what it needs
of each is named here. Not here: the Raft messages themselves and forwarding
(cluster/cluster.py).
"""

from __future__ import annotations

from typing import Any, Protocol


class QuorumHost(Protocol):
    """The node, as its quorum queues see it."""

    boot_id: str            # this run of the node: its connections' identities start with it

    def has_open_channel(self, identity: str) -> bool:
        """A channel of this node whose fifo identity is `identity` is open."""

    def dead_letters_to(self, queue: Any) -> bool:
        """Whether `queue` has a dead-letter exchange (its arguments or its policy)."""

    def dead_letter_copy(self, queue: Any, exchange: str, routing_key: str, header: bytes,
                         body: bytes, reason: str, time_ms: int,
                         blind_keys: tuple[str, ...] = ()) -> None:
        """A message the leader dropped: publish its dead-lettered copy (at most once)."""

    def route_dead_letter(self, queue: Any, exchange: str, routing_key: str, header: bytes,
                          body: bytes, reason: str, time_ms: int,
                          blind_keys: tuple[str, ...] = ()) -> Any:
        """The same for at-least-once dead lettering: where the copy goes, which the
        worker publishes with confirms (queues/dead_letter.py Routed, or Unrouted)."""

    def after_sync(self, batch_id: int, waiter: Any) -> bool:
        """Whether the message-store batch `batch_id` (a classic target's) is still to
        be made durable; if so, `waiter.release_confirms(synced_batch_id)` is called
        after each fsync until it returns True."""


class QuorumCluster(Protocol):
    """The node's cluster, as its quorum groups and queues see it (the groups'
    `cluster`, each queue's `router`)."""

    meta: Any   # this node's member of the metadata group (a queue's x-expires deletes)

    def send_raft(self, group: str, messages) -> None:
        """A group's Raft messages to the other members (after the fsync of its Ready)."""

    def forward(self, member: Any, data: bytes, waiter: Any) -> None:
        """A command for a group this member does not lead: to its leader."""

    def forwarded_to(self, group: str) -> bool:
        """Whether this run forwarded a command to `group`."""

    def leader_changed(self, member: Any) -> None:
        """The group's leader changed (forwarded commands go to the new one)."""

    def check_consumer_nodes(self, member: Any) -> None:
        """The NodeDown / NodeUp commands `member`'s consumers call for (cluster/consumer_nodes.py)."""

    def counts(self, record: Any, callback) -> None:
        """The counts of a queue with no replica here, from a member (cluster/proxy.py)."""

    def deliver_remote(self, queue: Any, owner: str, key: str, deliveries) -> None:
        """Deliveries for a consumer on `owner`, a node with no replica."""

    def tell_downed(self, queue: Any, connection: str) -> None:
        """The leader applied a Down for another node's connection."""

    def is_local_key(self, key: str) -> bool:
        """A consumer key or connection identity of this node (this run or an earlier one)."""

    def is_stale_identity(self, identity: str) -> bool:
        """A connection of an earlier run of this node."""

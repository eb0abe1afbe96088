"""What the quorum queues ask of their node: the one interface they reach up through.

node/node.py's `Node` implements it, and is handed to `QuorumGroups` when the node
is assembled (server/server.py `assemble_node`). The quorum type never imports the
node, and never reaches it through the cluster: what it needs is named here.
Not here: the Raft messages to other nodes and forwarded commands, which go through
the cluster (the groups' `cluster`, queues' `router`).
"""

from __future__ import annotations

from typing import Any, Protocol


class QuorumHost(Protocol):
    """The node, as its quorum queues see it."""

    boot_id: str            # this run of the node: its connections' identities start with it
    synced_batch_id: int    # the message-store batch last made durable
    awaiting_sync: set      # what waits for the next batch: `release_confirms(batch)`
    vhosts: dict[str, Any]  # name -> VHost: a dead letter's exchange and routing

    def has_open_channel(self, identity: str) -> bool:
        """A channel of this node whose fifo identity is `identity` is open."""

    def policy_for(self, vhost: str, kind: str, name: str) -> Any:
        """The (effective) policy of a queue, or None: its dead-letter target."""

    def dead_letters_to(self, queue: Any) -> bool:
        """Whether `queue` has a dead-letter exchange (its arguments or its policy)."""

    def dead_letter_copy(self, queue: Any, exchange: str, routing_key: str, header: bytes,
                         body: bytes, reason: str, time_ms: int,
                         blind_keys: tuple[str, ...] = ()) -> None:
        """A message the leader dropped: publish its dead-lettered copy (at most once)."""

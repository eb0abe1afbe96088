"""What the cluster package asks of its node: the one interface it reaches up through.

node/node.py's `Node` implements it. The cluster never imports the node: it carries
Raft messages to and from the node's groups (`quorum`), serves queues other nodes
use (`vhosts`), and reads the few counts and hooks below. Not here: what the node
does with them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol

from ..config import Settings
from ..queues.quorum.groups import QuorumGroups


class ClusterHost(Protocol):
    """The node, as the cluster sees it."""

    settings: Settings
    boot_id: str                  # this run of the node (fifo identities carry it)
    quorum: QuorumGroups          # every Raft group of the node, the metadata group's too
    vhosts: dict[str, Any]        # name -> VHost: its queues and exchanges (node/vhost.py)
    sessions: Iterable[Any]       # the AMQP sessions (their channels: tracking, proxies)
    channel_quotas: dict          # user -> channels open here (node/limits.py)
    counters: Any                 # node/counters.py: message_stats() for other nodes
    synced_batch_id: int          # the message-store batch last made durable
    awaiting_sync: set            # what waits for the next batch (confirms, callbacks)
    # set by the server shell: this node's shovels' and AMQP clients' rows, closing one
    shovel_status: Callable[[], list] | None
    client_rows: Callable[[], list] | None
    close_client: Callable[[str, str], bool] | None

    def policy_for(self, vhost: str, kind: str, name: str) -> Any:
        """The (effective) policy that applies to a queue or exchange, or None."""

    def cancel_consumer(self, queue: Any, consumer: Any) -> None:
        """A consumer's queue is gone here: cancel it (notifying the client)."""

    def consumer_removed(self, queue: Any) -> None:
        """A queue lost a consumer (auto-delete, x-expires)."""

"""What the cluster sends to other nodes, held until the shell hands it to a transport.

The cluster does no I/O (h11's `data_to_send()` is the model): everything it would
send — Raft messages, Rpcs, a peer learned or forgotten — goes into its `Outbox`, in
order, and the server shell takes it (`Cluster.data_to_send`) after each step and
hands it to its transport: the inter-node sockets (server/cluster_transport.py) or,
for a node alone, the loopback one (server/loopback_transport.py), which has no
peer. A message queued before the shell's transport started leaves once it has.

Invariants: items leave in the order they were queued (a peer's address before
anything sent to it); `take` empties the box.
"""

from __future__ import annotations

from typing import Any

SEND = "send"                # (SEND, peer, envelope)
ADD_PEER = "add_peer"        # (ADD_PEER, name, (host, port))
REMOVE_PEER = "remove_peer"  # (REMOVE_PEER, name, None)


class Outbox:
    __slots__ = ("items",)

    def __init__(self) -> None:
        self.items: list[tuple[str, str, Any]] = []

    def send(self, peer: str, envelope) -> None:
        self.items.append((SEND, peer, envelope))

    def add_peer(self, name: str, address: tuple[str, int]) -> None:
        self.items.append((ADD_PEER, name, address))

    def remove_peer(self, name: str) -> None:
        self.items.append((REMOVE_PEER, name, None))

    def take(self) -> list[tuple[str, str, Any]]:
        items, self.items = self.items, []
        return items

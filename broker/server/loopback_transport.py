"""The transport of a node alone: the cluster's outbox goes here, and nothing leaves.

A node started without cluster configuration has no inter-node listener and no peer:
every node is a cluster of one until others join, and this is the transport of that
one. It takes what the cluster hands it (server.py `_send_cluster_output`) the way
server/cluster_transport.py does: a message to a peer it does not know is refused
with KeyError (the shell logs and drops it), a peer added is known but never
reached. Not here: sockets (a node alone opens none for its cluster).
"""

from __future__ import annotations


class LoopbackTransport:
    def __init__(self) -> None:
        self._peers: dict[str, tuple[str, int]] = {}

    async def start(self) -> None:
        """Nothing to listen on."""

    async def stop(self, grace: float = 1.0) -> None:
        """Nothing to close."""

    def add_peer(self, name: str, address: tuple[str, int]) -> None:
        self._peers[name] = address

    def remove_peer(self, name: str) -> None:
        self._peers.pop(name, None)

    def peers(self) -> dict[str, tuple[str, int]]:
        return dict(self._peers)

    def send(self, peer: str, envelope) -> None:
        raise KeyError(f"unknown cluster peer {peer!r}: this node has no inter-node "
                       "listener (it was started without cluster configuration)")

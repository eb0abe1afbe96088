"""What the node asks of the server shell that runs it: what only the shell holds.

Responsibilities: name it (`Shell`), so that the node is built with its shell and
none is assigned to it later; and stand in where no shell runs the node
(`NO_SHELL`: a node that tests or benches drive directly).
- The dynamic shovels' status rows: the shell runs the shovels (broker/shovel/).
- This node's AMQP clients: their management rows, and closing one by name. The
  shell holds their sockets.
Another node's management API asks the node for these through the cluster
(cluster/replica_rpc.py, through `Node.shovel_rows`, `clients`, `close_connection`).

Not here: the shell (server/server.py `BrokerServer` implements `Shell`).
"""

from __future__ import annotations

from typing import Protocol


class Shell(Protocol):
    def shovel_rows(self) -> list:
        """The status rows of the dynamic shovels running here (shovel_status's)."""

    def client_rows(self) -> dict:
        """The management rows of this node's AMQP clients: connections, channels,
        consumers (management/rows.py `client_rows`)."""

    def close_client(self, name: str, reason: str) -> bool:
        """Close the client connection named `name` with 320 CONNECTION_FORCED and
        `reason`; False if there is none."""


class _NoShell:
    """A node no server runs: no shovels, no client connections over a socket."""

    def shovel_rows(self) -> list:
        return []

    def client_rows(self) -> dict:
        return {"connections": [], "channels": [], "consumers": []}

    def close_client(self, name: str, reason: str) -> bool:
        return False


NO_SHELL: Shell = _NoShell()

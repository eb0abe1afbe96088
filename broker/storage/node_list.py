"""The cluster's node list on disk: nodes that joined later, and nodes forgotten.

Format: `cluster_nodes.json` in the data directory, a JSON object
  {"nodes": {name: [host, port]}, "forgotten": [name, ...]}.
The configuration names the nodes a cluster started with; this file keeps what the
metadata group changed since (`cluster.add_node`, `cluster.forget_node`), so a
restarted node knows where its peers are before it has replayed anything. Saved
whole (tmp, fsync, rename) in the node's group commit, off the event loop
(node/group_commit.py). Not here: what the list means (cluster/cluster.py).
"""

from __future__ import annotations

import json
import os

from .metadata_store import replace_file

FILE_NAME = "cluster_nodes.json"


class NodeListFile:
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def load(self) -> tuple[dict[str, tuple[str, int]], set[str]]:
        """(nodes learned: name -> (host, port), nodes forgotten); empty when absent."""
        try:
            with open(os.path.join(self.directory, FILE_NAME)) as handle:
                document = json.load(handle)
        except FileNotFoundError:
            return {}, set()
        return ({name: (host, port) for name, (host, port) in document["nodes"].items()},
                set(document.get("forgotten", ())))

    def save(self, nodes: dict[str, tuple[str, int]], forgotten: set[str]) -> None:
        document = {"nodes": {name: list(address) for name, address in nodes.items()},
                    "forgotten": sorted(forgotten)}
        replace_file(self.directory, FILE_NAME, json.dumps(document).encode())

"""The cluster's AMQP clients for the management API: every node's connections,
channels and consumers, as RabbitMQ's management plugin lists them.

Responsibilities: `gather` (the rows of every node's clients, each row with the
`node` that holds the connection, for `/api/connections`, `/api/channels`,
`/api/consumers`, their per-vhost and per-connection forms, and the overview's
`object_totals`), and `close_remote` (`DELETE /api/connections/NAME` for a
connection another node holds).

How it works: as the message counters (rates.py), pulled when asked: the answering
node builds its own rows (rows.py `client_rows`) and asks every other node for its
own (cluster/replica_rpc.py "clients": one Rpc per node, answered from memory), and
lists them all, its own first, then the other nodes' in the cluster's order. A node
that is unreachable or does not answer within REPLY_TIMEOUT contributes nothing: its
clients are not listed and not counted until it answers again (RabbitMQ's plugin,
too, lists what it can reach). Rows carry every user's clients; views.py keeps
those the caller may see.

Not here: the rows' fields (rows.py), the endpoints (views.py, admin.py).
"""

from __future__ import annotations

import asyncio

from ..cluster import replica_rpc

KINDS = ("connections", "channels", "consumers")


async def _ask(request, node_name: str, op: str, args: dict):
    """`op` asked of `node_name` (another node) through replica_rpc; None if it
    does not answer."""
    cluster = request.node.cluster
    future = asyncio.get_running_loop().create_future()
    replica_rpc.ask(cluster, node_name, "", op, args,
                    lambda answer: None if future.done() else future.set_result(answer))
    request.api.shell.schedule_flush()
    try:
        # replica_rpc answers None after REPLY_TIMEOUT; the extra second covers a tick
        return await asyncio.wait_for(future, timeout=replica_rpc.REPLY_TIMEOUT + 1)
    except asyncio.TimeoutError:
        return None


async def gather(request) -> dict[str, list[dict]]:
    """Every reachable node's client rows: {"connections": [...], "channels": [...],
    "consumers": [...]}, every user's (see the module header)."""
    node = request.node
    result = request.api.shell.client_rows()
    others = [name for name in node.cluster.nodes if name != node.name]
    answers = await asyncio.gather(*(_ask(request, name, "clients", {}) for name in others))
    for answer in answers:
        if not isinstance(answer, dict):
            continue   # unreachable or silent: nothing from it
        for kind in KINDS:
            rows = answer.get(kind)
            if isinstance(rows, list):
                result[kind].extend(row for row in rows if isinstance(row, dict))
    return result


async def close_remote(request, node_name: str, name: str, reason: str) -> bool:
    """Ask `node_name` to close its client connection `name`; whether it did."""
    answer = await _ask(request, node_name, "close_client", {"name": name, "reason": reason})
    return isinstance(answer, dict) and answer.get("closed") is True

"""A restarted node of a cluster serves clients once it caught up with the metadata.

RabbitMQ 3.x waits for its Mnesia tables from the running nodes before it starts its
listeners, so a client of a node that just came back finds every queue, exchange and
binding declared elsewhere while it was down. Here a node recovers its metadata from its
own log, which misses what the metadata group committed while it was gone; until it
applied that, a publish through it would route by old bindings (a message confirmed and
routed nowhere: the default exchange does not know a queue declared meanwhile).

`catch_up_metadata` passes a no-op through the metadata group (node/ordering.py
`BARRIER`): once this node applied it, it applied everything committed before. The
server opens its AMQP listeners after that (server.py `start`). Bounded as RabbitMQ's
wait is: a node that hears from no majority of the group within REACHABLE_WITHIN (peers
ping every second) serves at once with what it has, as one that does not pass the
barrier within metadata_store.operation_timeout does; both say so in the log.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..cluster.cluster import REACHABLE_WITHIN
from ..node.ordering import BARRIER
from ..raft.membership import quorum

log = logging.getLogger("quorumqueue.broker")

POLL_S = 0.05  # how often the wait looks at the barrier and at the peers heard from


async def catch_up_metadata(server) -> None:
    """Return once this node applied what the metadata group committed before now, or
    once waiting is pointless (no majority heard from) or took too long."""
    node = server.node
    cluster = node.cluster
    group = cluster.meta
    raft = group.raft
    if raft is None or len(raft.members) < 2:
        return  # a node of its own: nothing committed elsewhere
    passed: list[object] = []
    timed_out = object()
    server.pass_time()
    group.propose_data(BARRIER, group.bounded(passed.append, node.now, timed_out))
    server.schedule_flush()
    started = time.monotonic()
    log.info("waiting for the metadata group to catch this node up before serving "
             "clients (members %s)", ", ".join(sorted(raft.members)))
    while not passed:
        await asyncio.sleep(POLL_S)
        if passed:
            break
        heard = sum(1 for member in raft.members if cluster.reachable(member))
        if time.monotonic() - started >= REACHABLE_WITHIN and heard < quorum(len(raft.members)):
            log.warning("metadata group: %d of %d members reachable, no majority: serving "
                        "clients with the metadata this node recovered (what the others "
                        "committed meanwhile comes once a majority is back)",
                        heard, len(raft.members))
            return
    if passed[0] is timed_out:
        log.warning("metadata group: no barrier passed within metadata_store."
                    "operation_timeout; serving clients with the metadata this node has")
        return
    log.info("metadata group: caught up in %.2f s", time.monotonic() - started)

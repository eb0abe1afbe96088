"""A quorum queue leader's view of its consumers' nodes, as log commands.

Responsibilities: on every queue this node leads, turn what the transport says about
the other nodes into the fifo machine's NodeDown and NodeUp commands
(broker/fifo/nodes.py), as rabbit_fifo's leader turns Erlang's `noconnection` and
`nodeup` into `{down, Pid, noconnection}` and `{nodeup, Node}`; and remove the
consumers of nodes forgotten by the cluster (a Down per connection).

How it works: a node is *live* when one of its pings (every second, carrying its boot
id) came within NODE_DOWN_AFTER (5 s); this node is always live, in its own run.
`fifo.nodes.node_commands` compares that with the consumers in the leader's state: a
suspected consumer or one of an earlier run of a live node asks for a NodeUp, a
consumer of a node not live and not yet suspected for a NodeDown (one for all such
nodes, after the NodeUps). Checked on every ping tick for the led queues with
consumers or proposals (the groups' `watched` set), when
this node becomes a queue's leader, and when a restarted leader has applied its old
log (queues/quorum/groups.py, before the restart's own `stale_downs`): a node not heard from
since this node started is not live, so after every node was killed (kill-all) the
first leader suspects the consumers of the nodes it has not heard from yet at once,
before any of them can be made the single active consumer or be handed a message,
and reinstates the live ones with the NodeUp that follows their first ping.

Invariants: only a leader proposes them; a command is proposed again only after
RESEND_AFTER_S (it may have been lost with a leadership), and a repeat applied twice
changes nothing (the machine's commands are idempotent). The decision rests on pings
alone, never on Raft traffic: a node restarted quickly may send Raft messages before
its first ping, and its old boot id must not reinstate its dead consumers.

Not here: what the commands do (broker/fifo/nodes.py); a restarted node's own earlier
consumers, which it removes itself where it has a replica (`stale_downs`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..fifo.commands import Down, NodeDown, NodeUp
from ..fifo.nodes import node_commands, node_of

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Cluster

log = logging.getLogger("quorumqueue.cluster")

RESEND_AFTER_S = 5.0   # a NodeDown/NodeUp still wanted this long after it was proposed


def live_boots(cluster: "Cluster", now: float | None = None) -> dict[str, str]:
    """node -> boot id of every node pinged within NODE_DOWN_AFTER, this one included
    (`now`: cluster.now unless given)."""
    from .cluster import NODE_DOWN_AFTER

    now = cluster.now if now is None else now
    live = {cluster.name: cluster.node.boot_id}
    for name, boot in cluster.boots.items():
        pinged = cluster.pinged.get(name)
        if (name not in cluster.forgotten and pinged is not None
                and now - pinged <= NODE_DOWN_AFTER):
            live[name] = boot
    return live


def check(cluster: "Cluster", member, now: float | None = None,
          live: dict[str, str] | None = None) -> None:
    """Propose what `member`'s consumers' nodes call for, if this node leads it
    (`live`: live_boots(cluster, now) unless given)."""
    if not member.is_leader or member.deleted:
        return
    now = cluster.now if now is None else now
    state = member.state
    proposed = member.node_proposals
    for command, at in list(proposed.items()):
        if now - at >= RESEND_AFTER_S:
            del proposed[command]
    commands: list = []
    for consumer in state.consumers.values():
        if node_of(consumer.connection) in cluster.forgotten:
            commands.append(Down(consumer.connection))
    commands += node_commands(state, live_boots(cluster, now) if live is None else live)
    for command in commands:
        if command in proposed:
            continue
        proposed[command] = now
        match command:
            case NodeDown(nodes):
                log.warning("quorum queue '%s' in vhost '%s': %s not heard from: their "
                            "consumers are suspected down, their messages return",
                            member.name, member.vhost, ", ".join(nodes))
            case NodeUp(node, boot):
                log.info("quorum queue '%s' in vhost '%s': node %s is up (run %s): its "
                         "consumers of that run are back, those of earlier runs removed",
                         member.name, member.vhost, node, boot)
            case Down(connection):
                log.warning("quorum queue '%s' in vhost '%s': node of connection %s was "
                            "forgotten: its messages return", member.name, member.vhost,
                            connection)
        member.propose(command, 0)  # at the node clock


def tick(cluster: "Cluster") -> None:
    """Every queue this node leads that has consumers or proposed commands (a ping
    tick): the groups' `watched` set, which a queue enters after a Ready
    (queues/quorum/groups.py `_watch`) and leaves here. A queue without consumers
    calls for no command, so an idle one costs nothing here."""
    now = cluster.now
    live = live_boots(cluster, now)
    for member in cluster.groups.members_of(cluster.groups.watched, _watched):
        check(cluster, member, now, live)


def _watched(member) -> bool:
    return (member.is_leader and not member.deleted
            and bool(member.state.consumers or member.node_proposals))

"""Consumers of a node that is gone: suspected down (NodeDown), back (NodeUp).

As rabbit_fifo's `{down, Pid, noconnection}` and `{nodeup, Node}` (RabbitMQ's quorum
queues; the 4.2 guide's "Poison Message Handling" counts *unsuccessful* delivery
attempts): a node the leader no longer hears from may be dead or only cut off, so its
consumers are not removed but *suspected*, and only a connection known to be dead (a
Down, or an earlier run of a node that came back) removes its consumers.

- NodeDown(nodes): every consumer of these nodes (any run, cancelled and basic.get
  holders included) is suspected, all in one command: its unacked messages go back to the queue (to the returns,
  as any return) with their delivery count unchanged — the consumer may well have
  received and be processing them, no delivery failed — but redelivered
  (`Delivery.returned`: they were handed out); it gets nothing and is never the
  single active consumer, so the next one takes over in the same command (a
  cancelled one left holding nothing is removed). A consumer registered later from
  that node is not suspected (its Checkout came through, so the node was reachable).
- NodeUp(node, boot): the node is heard from again, in its run `boot`. That run's
  suspected consumers are reinstated: they wait behind the active one in their
  registration order (single active consumer), or are served again. Consumers of the
  node's other (earlier) runs died with those runs: they are removed in this one
  command, as a Down removes them (what they still hold comes back, delivery count
  + 1; a suspected one holds nothing), so none of them is made active or served while
  the others go.
- Who proposes them: the leader, from its transport's view (broker/cluster/cluster.py):
  `node_commands` turns "these nodes are live, in these runs" into the commands the
  state needs; a command already in force changes nothing, so a repeat is harmless.

The machine knows a consumer's node from its connection identity
`<node>:<run>.<connection>.<channel>` (broker/node/channel.py `quorum_identity`;
`boot` is `<node>:<run>`): NodeDown takes the identities starting `<node>:`, NodeUp
keeps those starting `<boot>.`. An identity without ':' (written before nodes named
themselves in it) belongs to no node here.

Differences from RabbitMQ: 4.0-4.2 return a noconnection consumer's messages with
both counters raised (x-delivery-count and the acquired count the delivery limit
reads); 4.3 keeps them with the suspected consumer for up to 60 s
(consumer_disconnected_timeout), then returns them with x-delivery-count unchanged
and the acquired count raised. Here they come back at once and count nowhere: a
node that disappears says nothing about the consumer's handling of a message (a
poison message kills client processes, not broker nodes), and counting it let
messages no client had received pass the delivery limit after repeated crashes of
every node (the fault suite's kill-all runs).

Not here: when a node counts as silent (the cluster's pings), the own node's earlier
runs after a restart (machine.py `stale_downs`, proposed by that node itself).
"""

from __future__ import annotations

from typing import Mapping

from .commands import Command, Effect, NodeDown, NodeUp
from .state import FifoState


def node_of(connection: str) -> str | None:
    """The node of a connection identity `<node>:<run>.<...>`, None without one."""
    head, colon, _rest = connection.partition(".")[0].partition(":")
    return head if colon else None


def node_down(down: tuple[str, ...], state: FifoState, effects: list[Effect]) -> None:
    """NodeDown (see the module header)."""
    from .machine import requeue  # machine imports this module

    prefixes = tuple(node + ":" for node in down)
    for key in [k for k, c in state.consumers.items() if c.connection.startswith(prefixes)]:
        consumer = state.consumers[key]
        for msg_id in sorted(consumer.checked):
            index, packed, count = consumer.checked[msg_id]
            requeue(index, packed, count, state, effects, counted=False)
        consumer.checked.clear()
        if consumer.cancelled:
            del state.consumers[key]
        else:
            consumer.suspected = True


def node_up(node: str, boot: str, state: FifoState, effects: list[Effect]) -> None:
    """NodeUp (see the module header)."""
    from .machine import requeue

    prefix, live = node + ":", boot + "."
    for key in [k for k, c in state.consumers.items() if c.connection.startswith(prefix)]:
        consumer = state.consumers[key]
        if consumer.connection.startswith(live):
            consumer.suspected = False
            continue
        del state.consumers[key]
        for msg_id in sorted(consumer.checked):
            index, packed, count = consumer.checked[msg_id]
            requeue(index, packed, count + 1, state, effects)


def node_commands(state: FifoState, live: Mapping[str, str]) -> list[Command]:
    """What the leader proposes for the consumers' nodes, given the nodes it hears
    from and their runs (`live`: node -> boot; the leader's own node included): a
    NodeUp for each node in `live` with a suspected consumer or one of another run,
    then one NodeDown for the nodes not in `live` with a consumer not yet suspected.
    NodeUps first: what a NodeUp removes comes back counted (a delivery made before the
    crash), and must not be counted again, as it would be if the NodeDown's returns
    (uncounted) had been handed to a consumer of an earlier run that the NodeUp then
    removes. What a NodeUp hands to a consumer of a node that is gone (a wasted
    delivery) the NodeDown returns, uncounted."""
    downs: set[str] = set()
    ups: set[str] = set()
    for consumer in state.consumers.values():
        node = node_of(consumer.connection)
        if node is None:
            continue
        boot = live.get(node)
        if boot is None:
            if not consumer.suspected or consumer.checked:  # (a basic.get since)
                downs.add(node)
        elif consumer.suspected or not consumer.connection.startswith(boot + "."):
            ups.add(node)
    commands: list[Command] = [NodeUp(node, live[node]) for node in sorted(ups)]
    if downs:
        commands.append(NodeDown(tuple(sorted(downs))))
    return commands

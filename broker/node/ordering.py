"""A channel's methods act in order, also across the metadata log.

Responsibilities: proposing a metadata command for a channel's method and answering
once this node applied it (`replicate`), and holding the methods that arrive on that
channel meanwhile (`hold`), to run them after it, in order (`resume`): a publish
right after a declare sent with nowait finds what it declared, as on RabbitMQ.

A second use of the same hold: a method that finds no queue or exchange on a node
of a cluster (`may_be_unapplied`) runs again once the node passed a no-op command
through the metadata group (`after_barrier`). RabbitMQ 3.x replicates a declaration
to every node before its declare-ok; here a declare-ok waits for the declaring
node's own apply, so another node may not have applied it yet when a client that saw
the declare-ok uses the queue there. After the barrier the node has applied every
change committed before it, so a 404 then is the answer. A node that does not reach
a majority of the metadata group answers the 404 at once (no barrier could pass).

Invariants: while `channel.held` is a list, every method the channel receives is
appended to it (session.py asks `hold` first), the client's channel.close and
connection.close too (their close-ok follows what was held); a failed change closes
the channel (or the connection) as the method would have, and drops what was held;
a method runs again after at most one barrier.

Not here: the commands (groups/metadata.py), what they do (metadata.py).
"""

from __future__ import annotations

from typing import Callable

from ..amqp import spec
from ..amqp.channel import ChannelState
from ..amqp.errors import AMQPError
from ..groups import metadata as meta
from ..raft.membership import quorum
from .channel import Channel

BARRIER = meta.encode("barrier")  # a metadata command that changes nothing
_MISSING = ("no queue '", "no exchange '")  # the 404s a lagging node may give


def replicate(session, channel: Channel, method: tuple[int, int], data: bytes,
              then: Callable[[object], None] | None) -> None:
    """Propose a metadata command (broker/groups/metadata.py); once this node applied it,
    call `then(reply)`, or fail the channel as RabbitMQ would if it could not be
    applied (another node changed the same thing first), or the connection with 541
    if it was not applied within metadata_store.operation_timeout. Until then the channel
    holds the methods that follow (`hold`): a channel's methods act in order, so a
    publish right after a declare with nowait finds the exchange, as on RabbitMQ."""
    def applied(reply) -> None:
        if channel.state != ChannelState.OPEN:
            return
        if isinstance(reply, meta.MetadataTimeout):  # RabbitMQ 4: 541, the connection
            channel.held = None
            session.fail_later(AMQPError(spec.INTERNAL_ERROR, meta.timed_out_text(
                reply.command, session.node.settings.node_name), *method), channel)
            return
        if isinstance(reply, (tuple, list)) and reply and reply[0] == "error":
            channel.held = None
            session.fail_later(AMQPError(reply[1], reply[2], *method), channel)
            return
        if then is not None:
            then(reply)
        resume(session, channel)

    if channel.held is None:
        channel.held = []
    group = session.node.cluster.meta
    group.propose_data(data, group.bounded(applied, session.node.now,
                                           meta.MetadataTimeout(data)))


def hold(session, channel: Channel, call: Callable[[], None], method: tuple[int, int]) -> bool:
    """Keep `call` (a method's handling) for after the metadata change the channel
    waits for; False when it waits for none (then the caller runs it now)."""
    if channel.held is None:
        return False
    channel.held.append((call, method))
    return True


def resume(session, channel: Channel) -> None:
    """Run the methods a channel held, in order, until one waits for the metadata
    again (the rest wait with it) or fails (the channel or connection closes)."""
    held, channel.held = channel.held or [], None
    while held:
        call, method = held.pop(0)
        try:
            call()
        except AMQPError as error:
            session.fail_later(error.at(*method), channel)
            return
        if channel.held is not None:
            channel.held.extend(held)
            return


def may_be_unapplied(session, error: AMQPError | None = None) -> bool:
    """Whether a 404 for a queue or exchange (`error`; None: a mandatory publish that
    routed nowhere) may only mean this node has not applied a declaration committed
    elsewhere yet: so in a cluster of more than one node, when this node reaches a
    majority of the metadata group (else no barrier could pass: answer now)."""
    if error is not None and (error.code != spec.NOT_FOUND
                              or not error.detail.startswith(_MISSING)):
        return False
    cluster = session.node.cluster
    raft = cluster.meta.raft
    if raft is None or len(raft.members) < 2:
        return False
    reached = sum(1 for member in raft.members if cluster.reachable(member))
    return reached >= quorum(len(raft.members))


def after_barrier(session, channel: Channel, call: Callable[[], None],
                  method: tuple[int, int]) -> None:
    """Run `call` (a method that found no queue or exchange) again once this node
    applied a no-op command passed through the metadata group, so everything the group
    committed before now; the channel holds what arrives meanwhile, run after it in
    order. If `call` fails again, that is the answer (`resume` fails the channel). A
    barrier the group cannot commit within metadata_store.operation_timeout (the
    majority went meanwhile) runs `call` then, with what this node has."""
    def passed(_reply) -> None:
        if channel.state == ChannelState.OPEN:
            resume(session, channel)

    channel.held = [(call, method)]
    group = session.node.cluster.meta
    group.propose_data(BARRIER, group.bounded(passed, session.node.now, None))

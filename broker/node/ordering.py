"""A channel's methods act in order, also across the metadata log.

Responsibilities: proposing a metadata command for a channel's method and answering
once this node applied it (`replicate`), and holding the methods that arrive on that
channel meanwhile (`hold`), to run them after it, in order (`resume`): a publish
right after a declare sent with nowait finds what it declared, as on RabbitMQ.

Invariants: while `channel.held` is a list, every method the channel receives is
appended to it (session.py asks `hold` first); a failed change closes the channel
(or the connection) as the method would have, and drops what was held.

Not here: the commands (cluster/meta.py), what they do (metadata.py).
"""

from __future__ import annotations

from typing import Callable

from ..amqp import spec
from ..amqp.channel import ChannelState
from ..amqp.errors import AMQPError
from ..cluster import meta
from .channel import Channel


def replicate(session, channel: Channel, method: tuple[int, int], data: bytes,
              then: Callable[[object], None] | None) -> None:
    """Propose a metadata command (broker/cluster/meta.py); once this node applied it,
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

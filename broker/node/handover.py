"""A connection handed to its queue's worker (broker.workers, docs/design/workers.md).

Responsibilities: on worker 0 of a node of broker.workers, the one that accepts every
client, decide whether a connection goes to another worker (`placing`, `quiet`), what
it takes with it (`capture`), and on that worker rebuild it (`adopt`). No sockets:
the shell moves the socket and these bytes (server/handover_link.py).

How it works: a connection is placed at the first event that names a queue
(`placing`): a published message, basic.consume, basic.get, or queue.declare, bind,
unbind, purge or delete of a queue that exists. A message published to an exchange
other than the default one places the connection where it is (its queues are known
only by routing). If the queue has one member and it is on another worker, and the
session is quiet (`quiet`), the session reads that event's frames again from their
start (the connection's mark, `Connection.rewind_to_mark`) and waits: the shell sends
what it wrote, then hands the socket over with `capture(session)` and the bytes not
handled.
The worker adopts it in the state it had: open, its user and vhost, the negotiated
frame-max, channel-max and heartbeat, the client's properties, each open channel's
confirm mode and next publish sequence number, qos, flow and last declared queue;
then it handles those bytes as its own, once it has applied the metadata the first
worker had (a queue declared there a moment ago).

Invariants:
- A session is quiet when nothing of it is in flight on this worker: no consumer, no
  unacked delivery, no unconfirmed publish, no transaction, no method held behind a
  metadata change, no stream, no exclusive queue it owns, no queue it got from, no
  channel closing, no resource alarm in force, no TLS. So nothing confirmed or
  delivered depends on where it is, and the methods it sent earlier have all been
  answered: moving it changes no order (one channel's commands to one queue take
  one path).
- Placed once: a connection not handed over at its first queue-naming event (its
  queue is here, the session is not quiet, the bytes cannot be read again) stays
  here; its methods on other workers' queues are forwarded (cluster/).

Not here: the socket and its transfer (server/handover_link.py, server/server.py);
moving a connection again later (design: not planned).
"""

from __future__ import annotations

from pamqp import commands

from ..amqp.channel import ChannelState
from ..amqp.events import ContentReceived, MethodReceived

_QUEUE_METHODS = (commands.Queue.Declare, commands.Queue.Bind, commands.Queue.Unbind,
                  commands.Queue.Purge, commands.Queue.Delete)
_READ_METHODS = (commands.Basic.Consume, commands.Basic.Get)
NOT_PLACING = object()  # an event that names no queue: the connection is not placed yet


def enabled(settings) -> bool:
    """Whether this node hands connections to other workers: worker 0 of several."""
    return settings.worker == 0 and settings.workers > 1


def placing(session, event):
    """NOT_PLACING for an event that names no queue; else the name of the node (a
    worker) holding the one member of the queue it names, or None (here, several
    members, no such queue, or an exchange's routing)."""
    if type(event) is ContentReceived:
        publish = event.method
        if publish.exchange:
            return None
        return _owner(session, publish.routing_key)
    if type(event) is not MethodReceived:
        return NOT_PLACING
    method = event.method
    if isinstance(method, _READ_METHODS):
        return _owner(session, method.queue)
    if isinstance(method, _QUEUE_METHODS):
        if session.vhost is None or session.vhost.queues.get(method.queue) is None:
            return NOT_PLACING  # a new queue: declared (placed) here, then used
        return _owner(session, method.queue)
    return NOT_PLACING


def _owner(session, name: str) -> str | None:
    vhost = session.vhost
    queue = vhost.queues.get(name) if vhost is not None and name else None
    if queue is None:
        return None
    record = queue.metadata_record()
    members = record.get("members") or ([record["host"]] if record.get("host") else [])
    if len(members) != 1 or members[0] == session.node.name:
        return None
    return members[0]


def quiet(session) -> bool:
    """Nothing of `session` is in flight here (module docstring)."""
    connection = session.connection
    if (session.streaming or session.ssl_protocol is not None or connection.blocked
            or session.vhost is None or len(connection.channels) != len(session.channels)):
        return False
    for machine in connection.channels.values():
        if machine.state is not ChannelState.OPEN:
            return False
    node = session.node
    for channel in session.channels.values():
        if (channel.consumers or channel.unacked or channel.pending_confirms
                or channel.tx_mode or channel.held is not None or channel.deleting is not None
                or channel.lease_ranges or channel.reply_to_consumer is not None
                or channel.queues_used or node.reply_to_name(channel) is not None):
            return False
    identity = session.identity
    return not any(queue.exclusive_owner == identity
                   for queue in session.vhost.queues.values())


def capture(session, metadata_index: int) -> dict:
    """What the adopting worker needs of `session` (plain values; the bytes not
    handled travel beside it)."""
    connection = session.connection
    return {
        "peer_host": session.peer_host, "peer": session.peer,
        "user": session.user.name, "vhost": session.vhost.name,
        "frame_max": connection.frame_max, "channel_max": connection.channel_max,
        "heartbeat": connection.heartbeat, "mechanism": connection.mechanism,
        "client_properties": connection.client_properties,
        "capabilities": connection.capabilities,
        "has_published": session.has_published,
        "metadata_index": metadata_index,
        "channels": [{"number": channel.number, "confirm": channel.confirm_mode,
                      "next_publish_seq": channel.next_publish_seq,
                      "consumer_prefetch": channel.consumer_prefetch,
                      "global_prefetch": channel.global_prefetch,
                      "flow_active": channel.flow_active,
                      "last_queue_name": channel.last_queue_name,
                      "published": channel.published}
                     for channel in session.channels.values()],
    }


class AdoptError(Exception):
    """The state names a user or vhost this worker does not know."""


def adopt(node, state: dict, unread: bytes, now: float):
    """A Session of `node` for a connection handed over in `state`, its `unread`
    bytes received and not handled yet (take_input handles them)."""
    from .session import Session  # not at the top: session.py imports this module

    user = node.users.users.get(state["user"])
    vhost = node.vhost(state["vhost"])
    if user is None or vhost is None:
        raise AdoptError(f"user {state['user']!r} or vhost {state['vhost']!r} unknown here")
    return Session.adopted(node, state, user, vhost, unread, now)

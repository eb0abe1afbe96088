"""Dead lettering, the node's part: publishing a dead-lettered copy through the
queue's dead-letter exchange. Shared by every queue type that dead-letters (classic
queues, and quorum queues' leaders).

Responsibilities: find the queue's dead-letter target (its arguments, else its
policy: queues/settings.py `dead_letter_target`), build the copy
(queues/dead_letter.py: x-death, x-first-death-*, x-last-death-*, routing keys),
route it through the vhost's exchanges and publish it to every queue it reaches,
except a queue the message would return to in an automatic cycle (RabbitMQ's
`is_cycle`, dropped for that queue with a warning).

How it works: at most once (the dead letter exchanges guide; the quorum queues
guide's default strategy): the copy is published with no confirm awaited; a
missing dead-letter exchange, no route, or a content header that cannot be read
drops it (logged). The copy is published to the dead-letter exchange with the first
of its routing keys, so dying again records that exchange in x-death, as RabbitMQ
does; routed by its own keys, it keeps its BCC keys too (not in its headers), so
that dying again routes it by them once more. A queue with no dead-letter exchange
drops the message silently.

Not here: when a message dies (broker/fifo/machine.py for quorum queues,
queues/classic.py for classic ones), the header rules (queues/dead_letter.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..amqp.errors import AMQPError
from ..queues import dead_letter
from ..queues.actions import carry_out
from ..queues.message import Message
from ..queues.settings import dead_letter_target

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

log = logging.getLogger("quorumqueue.broker")


def has_target(node: "Node", queue) -> bool:
    """Does `queue` dead-letter (a dead-letter exchange from its arguments or policy)?"""
    return dead_letter_target(queue.arguments, node.policy_for(
        queue.vhost, queue.type_name, queue.name)) is not None


def publish(node: "Node", queue, exchange: str, routing_key: str, header: bytes,
            body: bytes, reason: str, time_ms: int, blind_keys: tuple[str, ...] = ()) -> None:
    """`queue` dropped a message (published to `exchange` with `routing_key`, with
    the content header `header` and the BCC keys `blind_keys`) for `reason` at
    `time_ms`: publish its dead-lettered copy (see the module header)."""
    target = dead_letter_target(queue.arguments,
                                node.policy_for(queue.vhost, queue.type_name, queue.name))
    vhost = node.vhosts.get(queue.vhost)
    if target is None or vhost is None:
        return
    exchange_name, dead_letter_key = target
    dlx = vhost.exchanges.get(exchange_name)
    what = f"{queue.type_name} queue '{queue.name}' in vhost '{queue.vhost}'"
    if dlx is None:
        log.warning("%s: dead-letter exchange '%s' does not exist; a message (%s) was "
                    "dropped", what, exchange_name, reason)
        return
    try:
        keys = dead_letter.routing_keys(routing_key, header, dead_letter_key, blind_keys)
        header, deaths = dead_letter.dead_lettered(header, exchange, routing_key, queue.name,
                                                   reason, time_ms, dead_letter_key)
    except (AMQPError, ValueError) as error:
        log.warning("%s: a message (%s) not dead-lettered: %s", what, reason, error)
        return
    properties = dead_letter.copy_properties(header, dead_letter_key, blind_keys)
    targets: dict[str, object] = {}
    for key in keys:
        for found in vhost.route(dlx, key, lambda: properties.decoded().get("headers")):
            targets.setdefault(found.name, found)
    for name, found in targets.items():
        if dead_letter.is_cycle(name, reason, deaths):
            log.warning("%s: dead-letter cycle to queue '%s' (%s): message dropped for it",
                        what, name, reason)
            continue
        carry_out(found.publish(Message(exchange_name, keys[0], properties, body), None,
                                None))

"""Dead lettering, the node's part: publishing a dead-lettered copy through the
queue's dead-letter exchange. Shared by every queue type that dead-letters (classic
queues, and quorum queues' leaders).

Responsibilities: find the queue's dead-letter target (its arguments, else its
policy: queues/settings.py `dead_letter_target`), build the copy
(queues/dead_letter.py: x-death, x-first-death-*, x-last-death-*, routing keys),
route it through the vhost's exchanges and publish it to every queue it reaches,
except a queue the message would return to in an automatic cycle (RabbitMQ's
`is_cycle`, dropped for that queue with a warning).

How it works: `route` finds where the copy goes (queues/dead_letter.py `Routed`) or
why nowhere (`Unrouted`); the at-least-once dead-letter worker of a quorum queue
takes that (queues/quorum/dead_letter_worker.py, through Node.route_dead_letter) and
publishes with confirms itself. `publish` is at most once (the dead letter exchanges
guide; the quorum queues guide's default strategy): the copy is published with no
confirm awaited; a missing dead-letter exchange, no route, or a content header that
cannot be read drops it (logged). The copy is published to the dead-letter exchange with the first
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
from ..queues.dead_letter import Routed, Unrouted
from ..queues.message import Message
from ..queues.settings import dead_letter_target

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

log = logging.getLogger("quorumqueue.broker")


def has_target(node: "Node", queue) -> bool:
    """Does `queue` dead-letter (a dead-letter exchange from its arguments or policy)?"""
    return dead_letter_target(queue.arguments, node.policy_for(
        queue.vhost, queue.type_name, queue.name)) is not None


def route(node: "Node", queue, exchange: str, routing_key: str, header: bytes, body: bytes,
          reason: str, time_ms: int, blind_keys: tuple[str, ...] = ()) -> Routed | Unrouted:
    """`queue` dropped a message (published to `exchange` with `routing_key`, with
    the content header `header` and the BCC keys `blind_keys`) for `reason` at
    `time_ms`: its dead-lettered copy and the queues it reaches, or why none."""
    target = dead_letter_target(queue.arguments,
                                node.policy_for(queue.vhost, queue.type_name, queue.name))
    vhost = node.vhosts.get(queue.vhost)
    if target is None or vhost is None:
        return Unrouted("exchange")
    exchange_name, dead_letter_key = target
    dlx = vhost.exchanges.get(exchange_name)
    if dlx is None:
        return Unrouted("exchange", exchange_name)
    try:
        keys = dead_letter.routing_keys(routing_key, header, dead_letter_key, blind_keys)
        header, deaths = dead_letter.dead_lettered(header, exchange, routing_key, queue.name,
                                                   reason, time_ms, dead_letter_key)
    except (AMQPError, ValueError) as error:
        return Unrouted("header", exchange_name, error)
    properties = dead_letter.copy_properties(header, dead_letter_key, blind_keys)
    targets: dict[str, object] = {}
    for key in keys:
        for found in vhost.route(dlx, key, lambda: properties.decoded().get("headers")):
            targets.setdefault(found.name, found)
    return Routed(exchange_name, keys, Message(exchange_name, keys[0], properties, body),
                  deaths, targets)


def publish(node: "Node", queue, exchange: str, routing_key: str, header: bytes,
            body: bytes, reason: str, time_ms: int, blind_keys: tuple[str, ...] = ()) -> None:
    """Publish the dead-lettered copy of what `queue` dropped (`route`'s arguments),
    at most once (see the module header)."""
    routed = route(node, queue, exchange, routing_key, header, body, reason, time_ms,
                   blind_keys)
    what = f"{queue.type_name} queue '{queue.name}' in vhost '{queue.vhost}'"
    if isinstance(routed, Unrouted):
        if routed.why == "header":
            log.warning("%s: a message (%s) not dead-lettered: %s", what, reason, routed.error)
        elif routed.exchange is not None:
            log.warning("%s: dead-letter exchange '%s' does not exist; a message (%s) was "
                        "dropped", what, routed.exchange, reason)
        return
    for name, found in routed.queues.items():
        if dead_letter.is_cycle(name, reason, routed.deaths):
            log.warning("%s: dead-letter cycle to queue '%s' (%s): message dropped for it",
                        what, name, reason)
            continue
        carry_out(found.publish(routed.message, None, None))

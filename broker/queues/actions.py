"""What a queue type asks its callers to do: actions, as data.

RabbitMQ's `rabbit_queue_type` returns `{State, Actions}`; a queue type here does
the same. A command changes the queue and returns a list of actions. The caller
(node/channel.py, node/handlers.py, cluster/classic_link.py) carries them out with
`carry_out`, in order, before anything else happens. So a queue never calls a
channel.

A quorum queue answers most commands later, once its log applied them (as
rabbit_quorum_queue answers in `handle_event`). Its driver (queues/quorum/groups.py)
carries out what the applied entries return. A command's answer (a get-ok, a
declare-ok, a purge-ok) is what the queue's `handle_event` returns for the data its
waiter holds (queues/quorum/answers.py). A remote classic
queue's host answers later too: the link (cluster/classic_link.py) carries out what
the host sent.

The actions:
- `Deliver`: basic.deliver of one message to `consumer`, on its channel.
- `DeliverBatch`: basic.deliver of several messages to `consumer`, as one run of
  frames (a quorum queue's Deliver effect).
- `GetOk`, `GetEmpty`: basic.get's answer, to the channel that asked (`to`).
- `DeclareOk`: queue.declare-ok's counts. `PurgeOk`: how many were purged. Both
  go to who asked (`to`: queues/base.py `Asker`: a method handler, the management
  API, another node's request), which the queue passes on and never calls.
- `Refused`: what `to` asked (a purge, or a channel's basic.get) failed with an
  AMQP error (the queue's host could not be asked).

Capacity: a queue hands a message to a consumer that `has_capacity()`. It then
calls `consumer.charge()`, which counts the delivery against the prefetch limits at
once, as rabbit_limiter counts a delivery when it allows it. The `Deliver` is
carried out later with `charged=True`, so it is not counted twice.

Invariants: an action names everything it needs, its addressee included; none
holds a callback. The actions of one command are carried out in the order
returned.

Not here: the frames themselves (node/channel.py); which messages a quorum
consumer gets (broker/fifo) and how they are read from the log
(queues/quorum/deliveries.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, assert_never

from ..amqp.errors import AMQPError
from .base import Asker, Channel, Consumer


@dataclass(frozen=True, slots=True)
class Deliver:
    """basic.deliver of one message to `consumer`; `token` comes back when settled."""

    consumer: Consumer
    queue: Any          # the Queue delivering (its counts, its settle)
    token: Any
    redelivered: bool
    exchange: str
    routing_key: str
    header: bytes       # the content header, as published
    body: bytes


@dataclass(frozen=True, slots=True)
class DeliverBatch:
    """basic.deliver of each of `messages` to `consumer`, in order, as one run of
    frames. A message is (redelivered, names, content header, body), as
    `codec.deliveries` takes it. `tokens[i]` comes back when message i is settled
    (none for a no-ack consumer). The channel counts them (no `charge()`)."""

    consumer: Consumer
    queue: Any
    tokens: list
    messages: list


@dataclass(frozen=True, slots=True)
class GetOk:
    """basic.get-ok with one message, to the channel `to` that asked."""

    to: Channel
    queue: Any
    token: Any
    no_ack: bool
    redelivered: bool
    exchange: str
    routing_key: str
    remaining: int      # ready messages left in the queue
    header: bytes
    body: bytes


@dataclass(frozen=True, slots=True)
class GetEmpty:
    """basic.get-empty, to the channel `to` that asked."""

    to: Channel


@dataclass(frozen=True, slots=True)
class DeclareOk:
    """queue.declare-ok's counts, ready messages and consumers, to `to` that asked."""

    to: Asker
    ready: int
    consumers: int


@dataclass(frozen=True, slots=True)
class PurgeOk:
    """queue.purge-ok's count, the ready messages dropped, to `to` that asked."""

    to: Asker
    count: int


@dataclass(frozen=True, slots=True)
class Refused:
    """What `to` asked (a purge; a channel's basic.get) failed with `error`."""

    to: Asker | Channel
    error: AMQPError


Action = Deliver | DeliverBatch | GetOk | GetEmpty | DeclareOk | PurgeOk | Refused


def carry_out(actions: Iterable[Action] | None) -> None:
    """Do what a queue's command returned, in order. None: nothing to do."""
    if not actions:
        return
    for action in actions:
        match action:
            case Deliver():
                action.consumer.channel.deliver(
                    action.consumer, action.queue, action.token, action.redelivered,
                    action.exchange, action.routing_key, action.header, action.body,
                    charged=True)
            case DeliverBatch():
                action.consumer.channel.deliver_batch(action.consumer, action.queue,
                                                      action.tokens, action.messages)
            case GetOk():
                action.to.get_ok(action.queue, action.token, action.no_ack,
                                 action.redelivered, action.exchange, action.routing_key,
                                 action.remaining, action.header, action.body)
            case GetEmpty():
                action.to.get_empty()
            case DeclareOk():
                action.to.declare_ok(action.ready, action.consumers)
            case PurgeOk():
                action.to.purge_ok(action.count)
            case Refused():
                action.to.refused(action.error)
            case _:
                assert_never(action)

"""What a quorum queue's command waits for, as data, and how its answer is made.

A command whose answer the log gives later (basic.get's Dequeue, a Purge, the
barrier a declare-ok waits behind) leaves an `Answer` in the log's waiters: the
queue and an event naming who asked (`GetAsked`, `PurgeAsked`, `DeclareAsked`).
When the entry is applied, the reply and the event go to
`QuorumQueue.handle_event`, which returns the actions (queues/actions.py), as
rabbit_quorum_queue's `handle_event` turns a Ra event into actions; the Answer
carries them out. So nothing waiting holds a closure over a channel, and the
answer is a function of data that tests call directly.

Not here: publisher confirms (queues/base.py `Confirm`), whose waiter is the
confirm's own bound method, one per publish and allocation-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..actions import carry_out

if TYPE_CHECKING:  # pragma: no cover
    from ..base import Asker, Channel
    from .queue import QuorumQueue


@dataclass(frozen=True, slots=True)
class GetAsked:
    """A basic.get's Dequeue: its get-ok or get-empty goes to `channel`."""

    channel: "Channel"
    key: str        # the channel's fifo key for gets ("<identity>/")
    no_ack: bool


@dataclass(frozen=True, slots=True)
class PurgeAsked:
    """A Purge: its count goes to `to`."""

    to: "Asker"


@dataclass(frozen=True, slots=True)
class DeclareAsked:
    """A declare-ok waiting for what was proposed before it: its counts go to `to`."""

    to: "Asker"


Event = GetAsked | PurgeAsked | DeclareAsked


class Answer:
    """A waiter in the log (groups/replicated.py): called once with the machine's
    reply (None: a barrier, or the queue went), it carries out what the queue's
    `handle_event` returns."""

    __slots__ = ("queue", "event")

    def __init__(self, queue: "QuorumQueue", event: Event) -> None:
        self.queue, self.event = queue, event

    def __call__(self, reply: Any) -> None:
        carry_out(self.queue.handle_event(self.event, reply))

    def __repr__(self) -> str:
        return f"Answer({self.event!r})"

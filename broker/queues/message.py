"""A published message: what routing hands every queue it reaches.

One `Message` is shared by all the queues a publish was routed to; none changes it.
It keeps the content header as received (`properties.raw`), so a queue that stores
or forwards it copies bytes, not fields. Not here: a message's place in a queue
(classic.py `Entry`, a quorum queue's log index), its encoding in a log or store.
"""

from __future__ import annotations

from typing import Any


class Message:
    """An immutable published message; shared by every queue it was routed to."""

    __slots__ = ("exchange", "routing_key", "properties", "body", "persistent", "priority")

    def __init__(self, exchange: str, routing_key: str, properties: Any, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties = properties  # amqp.codec.Properties (raw header kept)
        self.body = body
        self.persistent = properties.delivery_mode == 2
        self.priority = properties.priority

    @property
    def size(self) -> int:
        return len(self.body)

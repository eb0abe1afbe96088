"""One received message, whichever way it was read: the client's delivery type.

Responsibilities
    `Delivery` is what every read hands a client: a lease range read
    (lease_client.py, one per message or built from packed records), a basic.get
    (the connector's batch reads) and a manual-ack consumer (the connector's consume
    mode). `header_delivery_count` reads the delivery count a broker reports.

Invariants
    - `seq` numbers a reader's messages from 1 in the order it was given them: the
      lease sequence for a lease read, the reader's own count otherwise.
    - `tag` is the AMQP delivery tag to settle with, valid on its channel only; None
      where nothing is settled by tag (lease reads, settled through the lease).
    - `properties` may be shared between deliveries (packed reads decode a property
      block once): do not mutate it.

Not here
    The column-wise form of many deliveries (lease_records.PackedRecords).
"""

from __future__ import annotations

from dataclasses import dataclass

import pika


@dataclass(frozen=True, slots=True)
class Delivery:
    seq: int
    body: bytes
    exchange: str
    routing_key: str
    redelivered: bool
    properties: pika.BasicProperties
    tag: int | None = None

    @property
    def delivery_count(self) -> int:
        return header_delivery_count(self.properties)


def header_delivery_count(properties: pika.BasicProperties) -> int:
    """Earlier deliveries of a message, from its `x-delivery-count` header (0 if none),
    as quorum queues report it (the quorum queues guide, "Poison Message Handling").

    The broker writes the header as an integer, and only once it has counted a
    delivery; before that the header is whatever the publisher put there. A value
    that is not an integer is not the broker's count, so it counts as 0, and the
    message still reads (with its headers as published)."""
    count = (properties.headers or {}).get("x-delivery-count", 0)
    # pika decodes a long field as its int subclass `long`; a bool is no count
    return count if isinstance(count, int) and not isinstance(count, bool) else 0

"""Quorum queues filled with order-like messages, for the connector tests."""

from __future__ import annotations

import json
import uuid

import pika


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def order_properties(number: int) -> pika.BasicProperties:
    return pika.BasicProperties(
        content_type="application/json", delivery_mode=2, priority=number % 2,
        message_id=f"order-{number}", correlation_id=f"cart-{number // 3}",
        timestamp=1_700_000_000 + number, type="order.created", app_id="shop",
        headers={"tenant": "acme" if number % 2 else "globex", "n": number})


def order_body(number: int, padding: int = 0) -> bytes:
    return json.dumps({"order": number, "pad": "x" * padding}).encode()


def publish_orders(uri: str, queue: str, numbers, padding: int = 0,
                   declare: bool = True) -> None:
    """Publish orders `numbers` to `queue` (a quorum queue, declared if asked),
    waiting for every publisher confirm."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        if declare:
            channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        for number in numbers:
            channel.basic_publish("", queue, order_body(number, padding),
                                  order_properties(number))
    finally:
        connection.close()


def quorum_queue(uri: str, count: int, prefix: str = "orders", padding: int = 0) -> str:
    name = unique(prefix)
    publish_orders(uri, name, range(count), padding)
    return name


def order_numbers(batches) -> list[int]:
    """The order numbers in Arrow batches read by the source, in order."""
    return [json.loads(row["body"])["order"] for batch in batches for row in batch.to_pylist()]


def ready(uri: str, queue: str) -> int:
    """The ready messages of `queue` (a passive queue.declare)."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()

"""The main job's sample workload: shop orders as JSON messages in a quorum queue.

Responsibilities
    - `order_message`: order number -> (body, AMQP properties, routing key), the way
      a shop's checkout service would publish it: a JSON body, `message_id` (the
      business key the Delta table is checked on), `content_type`, `timestamp`,
      `app_id`, `type`, `correlation_id` (the cart), `priority` (express orders are
      high priority: > 4, quorum queues have two levels) and headers (tenant, region,
      schema version).
    - `publish_orders`: publish them to a durable quorum queue with publisher confirms,
      so every order counted as published is in the queue's Raft log.
    - `ORDER_SCHEMA`, `order_rows`: the table the job writes, from the source's
      columns (message properties as columns, the JSON body parsed).

Invariants
    Deterministic: order n always has the same body and properties (its timestamp
    too, derived from n), so a test can rebuild what was published.

Not here
    The streaming query (orders_to_delta.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import pika

from ..client.tls import connection_parameters

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

REGIONS = ("eu-west", "us-east", "ap-south")
TENANTS = ("acme", "globex", "initech", "umbrella")
EPOCH = 1_764_000_000  # 2025-11-24T16:00:00Z; order n was placed n seconds later

ORDER_SCHEMA = ("order_id LONG, customer STRING, sku STRING, quantity INT, "
                "unit_price DECIMAL(10,2), currency STRING, express BOOLEAN")


def order_message(number: int) -> tuple[bytes, pika.BasicProperties, str]:
    region = REGIONS[number % len(REGIONS)]
    express = number % 10 == 0
    body = {"order_id": number, "customer": f"C{number % 997:04d}",
            "sku": f"SKU-{number % 89:03d}", "quantity": 1 + number % 4,
            "unit_price": f"{4.99 + (number % 25) * 2.5:.2f}", "currency": "EUR",
            "express": express}
    properties = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", delivery_mode=2,
        message_id=f"order-{number:07d}", correlation_id=f"cart-{number // 3:07d}",
        timestamp=EPOCH + number, type="order.created", app_id="checkout",
        priority=8 if express else 0,
        headers={"tenant": TENANTS[number % len(TENANTS)], "region": region,
                 "schema-version": 2})
    return json.dumps(body).encode(), properties, f"order.created.{region}"


def publish_orders(uri: str, queue: str, numbers: Iterable[int],
                   progress: Callable[[int], None] | None = None) -> int:
    """Publish orders `numbers` to `queue` (declared as a durable quorum queue), waiting
    for each publisher confirm; returns how many were confirmed."""
    connection = pika.BlockingConnection(connection_parameters(uri))
    confirmed = 0
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()  # basic_publish now raises on a nack or a return
        for number in numbers:
            body, properties, _routing_key = order_message(number)
            channel.basic_publish("", queue, body, properties, mandatory=True)
            confirmed += 1
            if progress is not None:
                progress(confirmed)
    finally:
        connection.close()
    return confirmed


def order_rows(messages: DataFrame) -> DataFrame:
    """The Delta table's columns from the source's: one row per order message."""
    from pyspark.sql import functions as F

    order = F.from_json(F.col("body").cast("string"), ORDER_SCHEMA)
    return messages.select(
        F.col("message_id"), order["order_id"].alias("order_id"),
        order["customer"].alias("customer"), order["sku"].alias("sku"),
        order["quantity"].alias("quantity"), order["unit_price"].alias("unit_price"),
        order["currency"].alias("currency"), order["express"].alias("express"),
        F.col("headers")["tenant"].alias("tenant"), F.col("headers")["region"].alias("region"),
        F.col("priority"), F.col("app_id"), F.col("timestamp").alias("placed_at"),
        F.col("queue"), F.col("offset").alias("lease_seq"),
        F.col("delivery_count"))

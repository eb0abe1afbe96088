"""A peeked message as `rabbitmq-queues peek` shows it: (key, value) rows.

RabbitMQ (rabbit_basic:peek_fmt_message) lists the properties that are set, in the
order app_id, user_id, type, timestamp, message_id, expiration, reply_to,
correlation_id, priority, delivery_mode, content_encoding, content_type; then
routing_keys, exchange, `payload (max 64 bytes)` and one `header.NAME` row per
header, `header.x-delivery-count` last (a quorum queue's delivery count, 0 for a
message never delivered). These are the same rows, checked against RabbitMQ 3.10.8
(tests/differential/test_queue_commands_against_rabbitmq.py). Values are JSON-able: strings and
integers (the timestamp in seconds, as AMQP carries it); a payload or header that is
not UTF-8 shows its bytes as Python escapes.

Not here: finding the message (fifo/peek.py), reading it from the log (queues/quorum/groups.py).
"""

from __future__ import annotations

import calendar
import datetime
from typing import Any

from ...amqp.properties import Properties, decode_properties

PAYLOAD_SHOWN = 64  # bytes of the body shown, as RabbitMQ

# RabbitMQ's order; pamqp's name for the `type` property is message_type
_PROPERTIES = (("app_id", "app_id"), ("user_id", "user_id"), ("type", "message_type"),
               ("timestamp", "timestamp"), ("message_id", "message_id"),
               ("expiration", "expiration"), ("reply_to", "reply_to"),
               ("correlation_id", "correlation_id"), ("priority", "priority"),
               ("delivery_mode", "delivery_mode"), ("content_encoding", "content_encoding"),
               ("content_type", "content_type"))


def _text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return repr(value)[2:-1]


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return _text(value)
    if isinstance(value, datetime.datetime):
        return calendar.timegm(value.utctimetuple())
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def rows(exchange: str, routing_key: str, header: bytes, body: bytes,
         delivery_count: int) -> list[list]:
    """[[key, value], ...] of a message, in RabbitMQ's order."""
    _class_id, properties = decode_properties(header)
    decoded = Properties.decoded(properties)
    shown = []
    for key, name in _PROPERTIES:
        value = decoded.get(name)
        if value is not None and value != "":
            shown.append([key, _plain(value)])
    shown += [["routing_keys", [routing_key]], ["exchange", exchange],
              [f"payload (max {PAYLOAD_SHOWN} bytes)", _text(body[:PAYLOAD_SHOWN])]]
    headers = decoded.get("headers") or {}
    shown += [[f"header.{name}", _plain(value)] for name, value in headers.items()
              if name != "x-delivery-count"]
    shown.append(["header.x-delivery-count", delivery_count])
    return shown

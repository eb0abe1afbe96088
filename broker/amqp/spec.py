"""AMQP 0-9-1 constants: frame types, reply codes, class and method ids.

Responsibilities: the numbers of the protocol and their RabbitMQ names, nothing else.
Invariant: every reply code has exactly one name, as RabbitMQ spells it in reply texts
(`NOT_FOUND - no queue 'q' in vhost '/'`).
"""

from __future__ import annotations

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_HEADER_SIZE = 7
# frame overhead: 7-byte header + 1 end octet
FRAME_OVERHEAD = 8

FRAME_MIN_SIZE = 8192  # what RabbitMQ 3.13+ requires of tune-ok frame_max

REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_NAMES: dict[int, str] = {
    REPLY_SUCCESS: "OK",
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}

# Codes that close the channel only ("soft" errors); every other error code closes
# the whole connection.
CHANNEL_LEVEL_CODES = frozenset(
    {CONTENT_TOO_LARGE, NO_ROUTE, NO_CONSUMERS, ACCESS_REFUSED, NOT_FOUND,
     RESOURCE_LOCKED, PRECONDITION_FAILED}
)

# class ids
CONNECTION = 10
CHANNEL = 20
EXCHANGE = 40
QUEUE = 50
BASIC = 60
CONFIRM = 85
TX = 90

# (class, method) ids used on the hot path or by the session state machine
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_SECURE_OK = (10, 21)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CONNECTION_BLOCKED = (10, 60)
CONNECTION_UNBLOCKED = (10, 61)
CONNECTION_UPDATE_SECRET = (10, 70)

CHANNEL_OPEN = (20, 10)
CHANNEL_FLOW = (20, 20)
CHANNEL_FLOW_OK = (20, 21)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)

EXCHANGE_DECLARE = (40, 10)
EXCHANGE_DELETE = (40, 20)
EXCHANGE_BIND = (40, 30)
EXCHANGE_UNBIND = (40, 40)
QUEUE_DECLARE = (50, 10)
QUEUE_BIND = (50, 20)
QUEUE_PURGE = (50, 30)
QUEUE_DELETE = (50, 40)
QUEUE_UNBIND = (50, 50)

BASIC_PUBLISH = (60, 40)
BASIC_DELIVER = (60, 60)
BASIC_ACK = (60, 80)
BASIC_REJECT = (60, 90)
BASIC_NACK = (60, 120)

TX_COMMIT = (90, 20)

# Methods that carry content (a header frame and body frames follow).
CONTENT_METHODS = frozenset({(60, 40), (60, 50), (60, 60), (60, 71)})


def method_name(class_id: int, method_id: int) -> str:
    """`queue.declare` style name, as RabbitMQ prints it in errors."""
    from pamqp import commands

    index = (class_id << 16) | method_id
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        return f"unknown method {class_id}/{method_id}"
    klass, method = cls.name.split(".")
    method = "".join("_" + c.lower() if c.isupper() else c for c in method).lstrip("_")
    return f"{klass.lower()}.{method}"

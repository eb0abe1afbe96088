"""A dynamic shovel's definition: the runtime parameter of component `shovel`, checked.

Responsibilities: `check(value)` refuses what RabbitMQ's shovel plugin refuses
(rabbit_shovel_parameters: a missing source or destination, both a queue and an
exchange on one side, a bad value), and every key this broker does not implement,
naming it, and returns the `Definition` a shovel runs from. Nothing else in the
broker reads the keys.

The keys (RabbitMQ's dynamic-shovel keys, AMQP 0-9-1 on both sides; a legacy name
RabbitMQ 3.x still reads is accepted as the same key):
  src-uri            "amqp://..." or a list of them (tried in turn); "amqp://" without
                     a host is this node, in the shovel's vhost, as the default user
  src-queue          consume from this queue (declared durable if absent)
  src-exchange       or: bind a server-named queue to this exchange,
  src-exchange-key   with this routing key (default "#")
  src-prefetch-count (prefetch-count) unacknowledged messages in flight, default 1000
  src-delete-after   (delete-after) "never" (default) | "queue-length" (the messages
                     the source queue held when the shovel started) | an integer;
                     then the shovel clears its own parameter
  dest-uri           as src-uri
  dest-queue         publish to this queue (through the default exchange), or
  dest-exchange      to this exchange, with
  dest-exchange-key  this routing key (default: the message's own); with neither,
                     the message's own exchange and routing key
  ack-mode           "on-confirm" (default) | "on-publish" | "no-ack"
  reconnect-delay    seconds before a failed shovel starts again, default 5
  dest-add-forward-headers (add-forward-headers) true: an `x-shovelled` header
  src-protocol, dest-protocol  "amqp091" only

Refused by name: src-consumer-args, src-predeclared, dest-predeclared,
dest-queue-args, dest-publish-properties (publish-properties), publish-fields,
dest-add-timestamp-header (add-timestamp-header), and the AMQP 1.0 keys.

Errors read as rabbitmqctl prints them: "Validation failed" and the reasons, in
RabbitMQ 3.10.8's words where it has them (values as Erlang terms: <<"x">>);
checked against it by tests/differential/test_migration_against_rabbitmq.py. Stricter
than RabbitMQ, which accepts and ignores them: a key of the other side's kind
(src-exchange-key with src-queue, dest-exchange-key without dest-exchange), a
negative count, a key given under both its names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import urlsplit

COMPONENT = "shovel"

DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5.0

# legacy name -> the key RabbitMQ 3.x reads it as
ALIASES = {"prefetch-count": "src-prefetch-count", "delete-after": "src-delete-after",
           "add-forward-headers": "dest-add-forward-headers"}

KNOWN = ("src-uri", "src-queue", "src-exchange", "src-exchange-key", "src-prefetch-count",
         "src-delete-after", "src-protocol", "dest-uri", "dest-queue", "dest-exchange",
         "dest-exchange-key", "dest-protocol", "ack-mode", "reconnect-delay",
         "dest-add-forward-headers")

NOT_SUPPORTED = ("src-consumer-args", "src-predeclared", "dest-predeclared",
                 "dest-queue-args", "dest-publish-properties", "publish-properties",
                 "publish-fields", "dest-add-timestamp-header", "add-timestamp-header",
                 "src-address", "dest-address", "dest-application-properties",
                 "dest-properties", "dest-message-annotations")

ACK_MODES = ("no-ack", "on-publish", "on-confirm")  # RabbitMQ's order, in its message


class ShovelError(ValueError):
    """A refused definition; str() is the text rabbitmqctl would print."""


@dataclass(frozen=True)
class Definition:
    src_uris: tuple[str, ...]
    src_queue: str | None
    src_exchange: str | None
    src_exchange_key: str
    prefetch: int
    delete_after: str | int  # "never" | "queue-length" | a count
    dest_uris: tuple[str, ...]
    dest_queue: str | None
    dest_exchange: str | None
    dest_exchange_key: str | None
    ack_mode: str
    reconnect_delay: float
    forward_headers: bool

    @property
    def source(self) -> str:
        return self.src_queue if self.src_queue is not None else self.src_exchange or ""

    @property
    def destination(self) -> str:
        if self.dest_queue is not None:
            return self.dest_queue
        return self.dest_exchange if self.dest_exchange is not None else ""


def parse_json(text: str) -> dict:
    """The JSON a user typed (ctl set_parameter), or ShovelError (RabbitMQ's first
    words; the reason is Python's)."""
    try:
        return json.loads(text)
    except ValueError as error:
        raise ShovelError(f"JSON decoding error. Reason: {error}") from None


def term(value) -> str:
    """A JSON value as RabbitMQ's messages print it (an Erlang term: binaries for
    strings, proplists for objects)."""
    if isinstance(value, str):
        return '<<"' + value.replace('"', '\\"') + '">>'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(term(v) for v in value) + "]"
    if isinstance(value, dict):
        return "[" + ",".join("{" + term(k) + "," + term(v) + "}"
                              for k, v in value.items()) + "]"
    return str(value)


def _uris(key: str, value) -> tuple[str, ...]:
    uris = value if isinstance(value, list) else [value]
    if not uris or not all(isinstance(u, str) for u in uris):
        raise ShovelError(f"{key} should be a string or a non-empty list of strings, "
                          f"actually was {term(value)}")
    for uri in uris:
        try:
            parts = urlsplit(uri)
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as error:
            raise ShovelError(f'"{uri}" not a valid URI: {error}') from None
        if parts.scheme not in ("amqp", "amqps"):
            raise ShovelError(f'"{uri}" not a valid URI: {{{{unexpected_uri_scheme,'
                              f'"{parts.scheme}"}},"{uri}"}} (amqp or amqps)')
    return tuple(uris)


def _name(value, key: str) -> str:
    if not isinstance(value, str):
        raise ShovelError(f"{key} should be a string, actually was {term(value)}")
    return value


def _count(value, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ShovelError(f"{key} should be a number greater than or equal to 0, "
                          f"actually was {term(value)}")
    return value


def check(value, name: str = "shovel") -> Definition:
    """The Definition of shovel `name`'s parameter value, or ShovelError (module
    header); the texts are RabbitMQ 3.10.8's where it has one."""
    if not isinstance(value, dict):
        raise ShovelError(f"Validation failed\n\nUnrecognised terms {term(value)} in {name}")
    reasons = []
    given: dict = {}
    for key, item in value.items():
        key = ALIASES.get(key, key)
        if key in given:
            reasons.append(f"{key} is given twice (under its name and its legacy name)")
        given[key] = item
    unsupported = [k for k in value if ALIASES.get(k, k) in NOT_SUPPORTED]
    if unsupported:
        reasons.append(f"{', '.join(unsupported)}: not supported by quorumqueue's shovel "
                       "(it implements " + ", ".join(KNOWN) + ")")
    unknown = [k for k in value if ALIASES.get(k, k) not in KNOWN + NOT_SUPPORTED]
    if unknown:
        reasons.append("Unrecognised terms " + term({k: value[k] for k in unknown})
                       + f" in {name}")
    for side in ("src", "dest"):
        protocol = given.get(f"{side}-protocol", "amqp091")
        if protocol != "amqp091":
            reasons.append(f"{side}-protocol {json.dumps(protocol)}: quorumqueue's shovel "
                           "speaks amqp091 only")
    for key in ("src-uri", "dest-uri"):
        if key not in given:
            reasons.append(f'Key "{key}" not found in {name}')
    if "src-queue" in given and "src-exchange" in given:
        reasons.append("Cannot specify 'src-exchange' and 'src-queue'")
    elif "src-queue" not in given and "src-exchange" not in given:
        reasons.append("Must specify 'src-exchange' or 'src-queue'")
    if "dest-queue" in given and "dest-exchange" in given:
        reasons.append("Cannot specify 'dest-exchange' and 'dest-queue'")
    if "src-exchange-key" in given and "src-exchange" not in given:
        reasons.append("src-exchange-key needs src-exchange")
    if "dest-exchange-key" in given and "dest-exchange" not in given:
        reasons.append("dest-exchange-key needs dest-exchange")
    if reasons:
        raise ShovelError("Validation failed\n\n" + "\n".join(reasons))
    try:
        ack_mode = given.get("ack-mode", "on-confirm")
        if ack_mode not in ACK_MODES:
            raise ShovelError(f"ack-mode should be one of {term(list(ACK_MODES))}, "
                              f"actually was {term(ack_mode)}")
        delete_after = given.get("src-delete-after", "never")
        if delete_after not in ("never", "queue-length"):
            delete_after = _count(delete_after, "src-delete-after") \
                if not isinstance(delete_after, str) else None
            if delete_after is None:
                raise ShovelError("src-delete-after should be a number greater than or "
                                  'equal to 0, "never" or "queue-length", actually was '
                                  f"{term(given['src-delete-after'])}")
            if ack_mode == "no-ack":
                raise ShovelError("Cannot specify 'no-ack' and numerical 'delete-after'")
        if delete_after == "queue-length" and "src-queue" not in given:
            raise ShovelError("src-delete-after \"queue-length\" needs src-queue (an "
                              "exchange source has no length)")
        delay = given.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise ShovelError(f"reconnect-delay should be a number, actually was "
                              f"{term(delay)}")
        forward = given.get("dest-add-forward-headers", False)
        if not isinstance(forward, bool):
            raise ShovelError(f"dest-add-forward-headers should be a boolean, actually was "
                              f"{term(forward)}")
        src_queue = given.get("src-queue")
        src_exchange = given.get("src-exchange")
        dest_queue = given.get("dest-queue")
        dest_exchange = given.get("dest-exchange")
        dest_key = given.get("dest-exchange-key")
        return Definition(
            src_uris=_uris("src-uri", given["src-uri"]),
            src_queue=None if src_queue is None else _name(src_queue, "src-queue"),
            src_exchange=None if src_exchange is None else _name(src_exchange,
                                                                 "src-exchange"),
            src_exchange_key=_name(given.get("src-exchange-key", "#"), "src-exchange-key"),
            prefetch=_count(given.get("src-prefetch-count", DEFAULT_PREFETCH),
                            "src-prefetch-count"),
            delete_after=delete_after,
            dest_uris=_uris("dest-uri", given["dest-uri"]),
            dest_queue=None if dest_queue is None else _name(dest_queue, "dest-queue"),
            dest_exchange=None if dest_exchange is None else _name(dest_exchange,
                                                                   "dest-exchange"),
            dest_exchange_key=None if dest_key is None else _name(dest_key,
                                                                  "dest-exchange-key"),
            ack_mode=ack_mode, reconnect_delay=float(delay), forward_headers=forward)
    except ShovelError as error:
        raise ShovelError(f"Validation failed\n\n{error}") from None

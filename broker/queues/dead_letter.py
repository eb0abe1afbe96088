"""Dead lettering: what a message becomes when its queue dead-letters it. Pure.

Responsibilities: the dead-lettered copy's content header (`dead_lettered`), the
routing keys it is published with (`routing_keys`), and RabbitMQ's dead-letter cycle
rule (`is_cycle`). The node (node/dead_letters.py, for classic and quorum queues)
calls these and routes the copy through the vhost's exchanges: `Routed` is where it
goes, `Unrouted` why nowhere.

How it works, as RabbitMQ 4.x writes an AMQP 0-9-1 message it dead-letters (the
dead letter exchanges guide, "Dead-Lettered Messages"):
- `x-death` is an array of tables, most recent first, one per (queue, reason):
  `count`, `reason`, `queue`, `time` (a timestamp, seconds), `exchange` (the one the
  message was last published to), `routing-keys` (its routing key and CC keys), and
  `original-expiration` when the message had an `expiration` property. Dying again
  in the same queue for the same reason increments `count` and moves the table to
  the front; its other fields stay those of the first death (RabbitMQ 3.10 and 4.x).
- `x-first-death-reason`, `-queue`, `-exchange` are set once, at the first death;
  `x-last-death-reason`, `-queue`, `-exchange` at every death (RabbitMQ 4.x; 3.10
  does not write them).
- the `expiration` property is removed (the copy must not expire again by it), and
  the `BCC` header with it (CC stays, unless a dead-letter routing key replaces the
  message's keys: then CC goes too), as RabbitMQ 3.10.8 does.
- routing: with a dead-letter routing key, that key alone; else the message's own
  routing key, its CC keys and its BCC keys (rabbit_dead_letter routes by the
  message's routing keys, which rabbit_basic took from all three; the BCC header
  was removed at publish, so the queue keeps its keys beside the message). x-death's
  `routing-keys` lists the routing key and CC only (read from the headers). The copy
  routed by its own keys keeps its BCC keys beside it (`copy_properties`), as
  RabbitMQ's copy keeps its routing keys: dying again routes it by them too.
- a cycle (rabbit_dead_letter's `is_cycle`): a message that would reach a queue it
  already died in, where every death since then (that one included) was automatic
  (no `rejected`), is not delivered to that queue; a rejection breaks a cycle,
  since a client decided.

Invariants: the body is never touched; a header that cannot be decoded raises
(the caller drops the message, at most once).

Not here: when messages are dropped (broker/fifo/machine.py, queues/classic.py),
routing and publishing (node/dead_letters.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..amqp import codec
from ..field_values import Timestamp

FIRST = ("x-first-death-reason", "x-first-death-queue", "x-first-death-exchange")
LAST = ("x-last-death-reason", "x-last-death-queue", "x-last-death-exchange")


def _text(value: Any) -> Any:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _keys_of(routing_key: str, headers: dict) -> list[str]:
    cc = headers.get("CC")
    extra = [_text(key) for key in cc] if isinstance(cc, list) else []
    return [routing_key] + [key for key in extra if isinstance(key, str)]


def dead_lettered(header: bytes, exchange: str, routing_key: str, queue: str, reason: str,
                  time_ms: int, dead_letter_key: str | None = None) -> tuple[bytes, list[dict]]:
    """(the copy's content header, its x-death tables) for a message published to
    `exchange` with `routing_key` that dies in `queue` for `reason` at `time_ms`,
    routed on with `dead_letter_key` if the queue has one."""
    _class_id, properties = codec.decode_properties(header)
    values = {name: value for name, value in properties.decoded().items()
              if value is not None}
    headers = dict(values.get("headers") or {})
    expiration = values.pop("expiration", None)
    keys = _keys_of(routing_key, headers)
    headers.pop("BCC", None)
    if dead_letter_key is not None:  # routed by that key alone: CC goes (rabbit_dead_letter)
        headers.pop("CC", None)
    deaths = [dict(death) for death in headers.get("x-death") or []
              if isinstance(death, dict)]
    for position, death in enumerate(deaths):
        if _text(death.get("queue")) == queue and _text(death.get("reason")) == reason:
            death["count"] = int(death.get("count") or 0) + 1
            deaths.insert(0, deaths.pop(position))
            break
    else:
        death = {"count": 1, "reason": reason, "queue": queue,
                 "time": Timestamp(time_ms // 1000),
                 "exchange": exchange, "routing-keys": keys}
        if expiration is not None:
            death["original-expiration"] = _text(expiration)
        deaths.insert(0, death)
    headers["x-death"] = deaths
    for name, value in zip(FIRST, (reason, queue, exchange)):
        headers.setdefault(name, value)
    for name, value in zip(LAST, (reason, queue, exchange)):
        headers[name] = value
    values["headers"] = headers
    return codec.encode_properties(properties.body_size, values), deaths


def routing_keys(routing_key: str, header: bytes, dead_letter_key: str | None,
                 blind_keys: tuple[str, ...] = ()) -> list[str]:
    """The keys a dead-lettered copy is routed with (see the module header): the
    message's BCC keys are `blind_keys`."""
    if dead_letter_key is not None:
        return [dead_letter_key]
    _class_id, properties = codec.decode_properties(header)
    return _keys_of(routing_key, properties.decoded().get("headers") or {}) + list(blind_keys)


def copy_properties(header: bytes, dead_letter_key: str | None,
                    blind_keys: tuple[str, ...]) -> codec.Properties:
    """The properties of the copy whose content header `dead_lettered` made: with
    the message's BCC keys beside them unless a dead-letter routing key replaced its
    keys."""
    properties = codec.decode_properties(header)[1]
    if dead_letter_key is None:
        properties.blind_keys = tuple(blind_keys)
    return properties


def is_cycle(target: str, reason: str, deaths: list[dict]) -> bool:
    """Would delivering to queue `target` close an automatic cycle? `deaths` is the
    copy's x-death, most recent first (this death included)."""
    if reason == "rejected":
        return False
    for death in deaths:
        if _text(death.get("reason")) == "rejected":
            return False
        if _text(death.get("queue")) == target:
            return True
    return False


@dataclass(frozen=True, slots=True)
class Routed:
    """A dead letter routed through its queue's dead-letter exchange (node/dead_letters.py
    `route`): `message`, the copy (x-death headers, published to `exchange` with the
    first of `keys`), reaches `queues` (name -> queue), cycles included: the caller
    skips those `is_cycle(name, reason, deaths)` names."""

    exchange: str
    keys: list[str]
    message: Any        # queues/message.py Message
    deaths: list[dict]  # the copy's x-death tables
    queues: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Unrouted:
    """Why a dead letter went nowhere: `why` "exchange", its queue names no
    dead-letter exchange (`exchange` None) or one that does not exist; "header", its
    content header cannot be read (`error`)."""

    why: str
    exchange: str | None = None
    error: Exception | None = None

"""Dead lettering of a message published with CC and BCC headers, against RabbitMQ
3.10.8 (rabbit_dead_letter; the dead letter exchanges guide, "Routing Dead-Lettered
Messages" and "Dead-Lettered Messages"; the quorum queues guide, "Dead Lettering").

A message is routed by its routing key, its CC keys and its BCC keys, and its BCC
header is removed before it is stored. When it is dead-lettered without a
dead-letter routing key, the copy is routed by all of those keys again: it reaches
the queues bound for the routing key, for the CC keys and for the BCC keys. The copy
keeps CC, has no BCC header, and its x-death `routing-keys` lists the routing key
and the CC keys, not the BCC keys. With x-dead-letter-routing-key the copy is routed
by that key alone, and CC is removed too.

The same pika scenario runs on both brokers for a classic source queue, a quorum
source queue (at-most-once dead lettering) and a quorum source queue with
at-least-once dead lettering (RabbitMQ has it since 3.10), each with and without a
dead-letter routing key. Compared: which target queues hold a copy, and what a
consumer of each sees (exchange, routing key, CC, BCC, x-death routing-keys, reason
and queue). The targets are classic queues on one node: once the first target holds
its copy, every target the copy was routed to holds it (one routing step on both
brokers), so the other targets are read then, with no wait on an absence.
"""

from __future__ import annotations

import time
import uuid

import pika
import pytest

pytestmark = pytest.mark.timeout(240)

WAIT_S = 60.0
TARGET_KEYS = ("rk", "cc", "bcc", "dlk")  # one classic target queue bound for each
SOURCES = {
    "classic": {"x-queue-type": "classic"},
    "quorum": {"x-queue-type": "quorum"},
    "quorum at-least-once": {"x-queue-type": "quorum", "x-overflow": "reject-publish",
                             "x-dead-letter-strategy": "at-least-once"},
}


def _name(prefix: str) -> str:
    return f"bcc-{prefix}-{uuid.uuid4().hex[:8]}"


def _count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def _text(value):
    if isinstance(value, list):
        return [_text(item) for item in value]
    return value.decode() if isinstance(value, bytes) else value


def dead_lettered_copies(uri: str, source_kind: str, dead_letter_key: str | None) -> dict:
    """Publish (routing key rk, CC [cc], BCC [bcc]) to a source queue bound for rk
    only, reject it without requeue, and return what each target queue holds."""
    publish_exchange, dlx, source = _name("pub"), _name("dlx"), _name("src")
    targets = {key: _name(f"to-{key}") for key in TARGET_KEYS}
    roles = {publish_exchange: "publish exchange", dlx: "dlx", source: "source"}
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        channel.exchange_declare(publish_exchange, "direct")
        channel.exchange_declare(dlx, "direct")
        for key, target in targets.items():
            channel.queue_declare(target)
            channel.queue_bind(target, dlx, key)
        arguments = {**SOURCES[source_kind], "x-dead-letter-exchange": dlx}
        if dead_letter_key is not None:
            arguments["x-dead-letter-routing-key"] = dead_letter_key
        channel.queue_declare(source, durable=True, arguments=arguments)
        channel.queue_bind(source, publish_exchange, "rk")
        channel.confirm_delivery()
        channel.basic_publish(publish_exchange, "rk", b"selected", pika.BasicProperties(
            headers={"CC": ["cc"], "BCC": ["bcc"], "app": "kept"}))
        deadline = time.monotonic() + WAIT_S
        method = None
        while method is None:
            assert time.monotonic() < deadline, f"nothing in {source_kind} source"
            method, properties, _body = channel.basic_get(source, auto_ack=False)
        source_headers = dict(properties.headers or {})
        channel.basic_reject(method.delivery_tag, requeue=False)
        first = targets[dead_letter_key or "rk"]  # a copy always reaches this one
        while _count(channel, first) == 0:
            assert time.monotonic() < deadline, f"no copy in {first} within {WAIT_S} s"
            connection.sleep(0.05)
        copies = {}
        for key, target in targets.items():
            method, properties, body = channel.basic_get(target, auto_ack=True)
            if method is None:
                continue
            headers = dict(properties.headers or {})
            copies[key] = {
                "body": body, "exchange": roles.get(method.exchange, method.exchange),
                "routing_key": method.routing_key,
                "CC": _text(headers.get("CC")), "BCC": _text(headers.get("BCC")),
                "app": _text(headers.get("app")),
                "x-death": [{"routing-keys": _text(death.get("routing-keys")),
                             "reason": _text(death.get("reason")),
                             "queue": roles.get(_text(death.get("queue"))),
                             "exchange": roles.get(_text(death.get("exchange"))),
                             "count": death.get("count")}
                            for death in headers.get("x-death", [])],
                "left": _count(channel, target)}
        return {"source saw": {"CC": _text(source_headers.get("CC")),
                               "BCC": _text(source_headers.get("BCC"))},
                "copies": copies}
    finally:
        connection.close()


@pytest.mark.parametrize("source_kind", list(SOURCES))
@pytest.mark.parametrize("dead_letter_key", [None, "dlk"])
def test_a_cc_and_bcc_message_is_dead_lettered_as_in_rabbitmq(rabbitmq, broker, source_kind,
                                                               dead_letter_key) -> None:
    expected = dead_lettered_copies(rabbitmq.uri, source_kind, dead_letter_key)
    # what RabbitMQ 3.10.8 does, as the module header says (a check of the oracle)
    assert expected["source saw"] == {"CC": ["cc"], "BCC": None}
    assert sorted(expected["copies"]) == (["dlk"] if dead_letter_key else ["bcc", "cc", "rk"])
    assert dead_lettered_copies(broker.uri, source_kind, dead_letter_key) == expected


def dead_lettered_twice(uri: str, middle_kind: str) -> dict:
    """The copy (routed by rk, cc and bcc, no dead-letter routing key) dies again: it
    is rejected from the rk target, a `middle_kind` queue whose own dead-letter
    exchange has targets bound for rk, cc and bcc. Which of them hold the second copy,
    and its CC, BCC and x-death routing-keys."""
    publish_exchange, first_dlx, second_dlx = _name("pub"), _name("dlx1"), _name("dlx2")
    source, middle = _name("src"), _name("mid")
    targets = {key: _name(f"then-{key}") for key in ("rk", "cc", "bcc")}
    roles = {source: "source", middle: "middle", first_dlx: "dlx1", second_dlx: "dlx2"}
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        for exchange in (publish_exchange, first_dlx, second_dlx):
            channel.exchange_declare(exchange, "direct")
        for key, target in targets.items():
            channel.queue_declare(target)
            channel.queue_bind(target, second_dlx, key)
        channel.queue_declare(middle, durable=True, arguments={
            "x-queue-type": middle_kind, "x-dead-letter-exchange": second_dlx})
        channel.queue_bind(middle, first_dlx, "rk")
        channel.queue_declare(source, durable=True,
                              arguments={"x-dead-letter-exchange": first_dlx})
        channel.queue_bind(source, publish_exchange, "rk")
        channel.confirm_delivery()
        channel.basic_publish(publish_exchange, "rk", b"twice", pika.BasicProperties(
            delivery_mode=2, headers={"CC": ["cc"], "BCC": ["bcc"]}))
        deadline = time.monotonic() + WAIT_S
        for queue in (source, middle):
            method = None
            while method is None:
                assert time.monotonic() < deadline, f"nothing in {queue}"
                method, _properties, _body = channel.basic_get(queue, auto_ack=False)
                if method is None:
                    connection.sleep(0.05)
            channel.basic_reject(method.delivery_tag, requeue=False)
        while _count(channel, targets["rk"]) == 0:
            assert time.monotonic() < deadline, f"no second copy within {WAIT_S} s"
            connection.sleep(0.05)
        copies = {}
        for key, target in targets.items():
            method, properties, _body = channel.basic_get(target, auto_ack=True)
            if method is not None:
                headers = dict(properties.headers or {})
                copies[key] = {
                    "CC": _text(headers.get("CC")), "BCC": _text(headers.get("BCC")),
                    "x-death": [(roles.get(_text(death.get("queue"))),
                                 _text(death.get("routing-keys")),
                                 roles.get(_text(death.get("exchange"))))
                                for death in headers.get("x-death", [])]}
        return copies
    finally:
        connection.close()


@pytest.mark.parametrize("middle_kind", ["classic", "quorum"])
def test_a_dead_lettered_copy_keeps_its_bcc_keys_when_it_dies_again_as_in_rabbitmq(
        rabbitmq, broker, middle_kind) -> None:
    expected = dead_lettered_twice(rabbitmq.uri, middle_kind)
    assert sorted(expected) == ["bcc", "cc", "rk"]  # RabbitMQ 3.10.8: routed by all three
    assert dead_lettered_twice(broker.uri, middle_kind) == expected

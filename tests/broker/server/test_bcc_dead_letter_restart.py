"""A message's BCC keys survive a restart of the broker: a durable queue's message
published with CC and BCC headers, dead-lettered after the restart without a
dead-letter routing key, still reaches the queue bound for its BCC key (the dead
letter exchanges guide, "Routing Dead-Lettered Messages"; the rule compared with
RabbitMQ 3.10.8 in tests/differential/test_bcc_dead_letter_against_rabbitmq.py).
The keys come back from the quorum queue's log (tag-21 Enqueue, FORMAT.md) and from
the classic queue's message store (ENQUEUE_BCC)."""

from __future__ import annotations

import pika
import pytest

from .pika_support import connect, unique, wait_get

pytestmark = pytest.mark.timeout(180)

WAIT_S = 60.0


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_durable_message_bcc_keys_route_its_dead_lettered_copy_after_a_restart(
        fresh_broker, kind):
    dlx, source = unique("bcc-dlx"), unique(f"bcc-src-{kind}")
    targets = {key: unique(f"bcc-to-{key}") for key in ("rk", "cc", "bcc")}
    with connect(fresh_broker) as connection:
        channel = connection.channel()
        channel.exchange_declare(dlx, "direct", durable=True)
        for key, target in targets.items():
            channel.queue_declare(target, durable=True)
            channel.queue_bind(target, dlx, key)
        channel.queue_declare(source, durable=True, arguments={
            "x-queue-type": kind, "x-dead-letter-exchange": dlx})
        channel.queue_bind(source, "amq.direct", "rk")
        channel.confirm_delivery()
        channel.basic_publish("amq.direct", "rk", b"kept", pika.BasicProperties(
            delivery_mode=2, headers={"CC": ["cc"], "BCC": ["bcc"]}))
    fresh_broker.restart(kill=True)
    with connect(fresh_broker) as connection:
        channel = connection.channel()
        method, properties, _body = wait_get(channel, source, WAIT_S, auto_ack=False)
        assert "BCC" not in properties.headers
        channel.basic_reject(method.delivery_tag, requeue=False)
        copies = {key: wait_get(channel, target, WAIT_S) for key, target in targets.items()}
    for key, (method, properties, body) in copies.items():
        assert (body, method.routing_key, properties.headers["CC"]) == (b"kept", "rk", ["cc"])
        assert "BCC" not in properties.headers, key
        assert properties.headers["x-death"][0]["routing-keys"] == ["rk", "cc"]

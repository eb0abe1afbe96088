"""Classic queues over the wire (pika): message TTL, queue TTL, dead lettering and
length limits that dead-letter, one test per feature.

Specification: the TTL guide (x-message-ttl, per-message `expiration`, TTL 0, queue
TTL x-expires), the dead letter exchanges guide (reasons rejected, expired, maxlen;
x-death, x-first-death-*, and RabbitMQ 4.x's x-last-death-*), the queue length guide
(x-max-length-bytes counts bodies; x-overflow reject-publish-dlx). The same
scenarios run against RabbitMQ 3.10.8 in
tests/differential/test_dead_letter_against_rabbitmq.py.

Every wait polls for its condition with a generous bound: expiry runs on the
node's timer (about twice a second) or at the head when a client asks.
"""

from __future__ import annotations

import time

import pika
import pytest

from .pika_support import channel_error, idle, unique, wait_get

WAIT_S = 30.0
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def wait_count(channel, queue: str, count: int, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while channel.queue_declare(queue, passive=True).method.message_count != count:
        assert time.monotonic() < deadline, f"'{queue}' never held {count} messages"
        time.sleep(0.05)


def with_dlx(channel, name: str, **arguments) -> str:
    """A classic queue `name` dead-lettering through the default exchange into
    `name`.dead; returns the dead-letter queue's name."""
    dead = f"{name}.dead"
    channel.queue_declare(dead)
    channel.queue_declare(name, arguments={"x-dead-letter-exchange": "",
                                           "x-dead-letter-routing-key": dead, **arguments})
    return dead


def test_an_expired_message_is_dead_lettered_with_x_death_headers(channel):
    name = unique("ttl")
    dead = with_dlx(channel, name, **{"x-message-ttl": 100})
    channel.basic_publish("amq.direct", "unrouted", b"x")  # nothing: no binding
    channel.queue_bind(name, "amq.direct", "rk")
    channel.basic_publish("amq.direct", "rk", b"late", pika.BasicProperties(
        expiration="60000", headers={"app": "kept", "CC": ["other"]}))
    method, properties, body = wait_get(channel, dead)
    assert body == b"late" and method.routing_key == dead and method.exchange == ""
    assert properties.expiration is None  # removed, as RabbitMQ does
    death = properties.headers["x-death"][0]
    assert {key: death[key] for key in ("count", "reason", "queue", "exchange",
                                         "routing-keys", "original-expiration")} == {
        "count": 1, "reason": "expired", "queue": name, "exchange": "amq.direct",
        "routing-keys": ["rk", "other"], "original-expiration": "60000"}
    headers = properties.headers
    # dead-lettered by x-dead-letter-routing-key, the copy loses its CC header (its
    # keys stay in x-death), as RabbitMQ's dead lettering removes it
    assert headers["app"] == "kept" and "CC" not in headers
    assert (headers["x-first-death-reason"], headers["x-first-death-queue"],
            headers["x-first-death-exchange"]) == ("expired", name, "amq.direct")
    assert (headers["x-last-death-reason"], headers["x-last-death-queue"],
            headers["x-last-death-exchange"]) == ("expired", name, "amq.direct")
    assert channel.queue_declare(name, passive=True).method.message_count == 0


def test_an_expired_message_without_dead_letter_exchange_is_never_delivered(channel):
    """Per-message expiration on a classic queue: dropped by the timer, not delivered
    to a later basic.get (it used to be delivered long after it expired)."""
    name = unique("expiration")
    channel.queue_declare(name)
    channel.basic_publish("", name, b"short", pika.BasicProperties(expiration="100"))
    channel.basic_publish("", name, b"long", pika.BasicProperties(expiration="600000"))
    wait_count(channel, name, 1)
    method, properties, body = channel.basic_get(name, auto_ack=True)
    assert body == b"long" and properties.expiration == "600000"


def test_ttl_zero_reaches_a_waiting_consumer_else_is_dead_lettered(connection, channel):
    name = unique("ttl0")
    dead = with_dlx(channel, name, **{"x-message-ttl": 0})
    channel.basic_publish("", name, b"nobody-waits")
    method, _properties, body = wait_get(channel, dead)
    assert body == b"nobody-waits"
    received = []
    channel.basic_consume(name, lambda ch, m, p, b: received.append(b), auto_ack=True)
    channel.basic_publish("", name, b"taken")
    deadline = time.monotonic() + WAIT_S
    while not received:
        assert time.monotonic() < deadline, "the consumer got nothing"
        connection.process_data_events(time_limit=0.05)
    assert received == [b"taken"]
    idle(connection)
    assert channel.basic_get(dead, auto_ack=True)[0] is None


@pytest.mark.parametrize("verb", ["reject", "nack"])
def test_a_rejected_message_is_dead_lettered_with_reason_rejected(channel, verb):
    name = unique("rejected")
    dead = with_dlx(channel, name)
    channel.basic_publish("", name, b"bad", PERSISTENT)
    method, _properties, _body = channel.basic_get(name)
    if verb == "reject":
        channel.basic_reject(method.delivery_tag, requeue=False)
    else:
        channel.basic_nack(method.delivery_tag, requeue=False)
    _method, properties, body = wait_get(channel, dead)
    assert body == b"bad" and properties.delivery_mode == 2
    assert properties.headers["x-death"][0]["reason"] == "rejected"


def test_drop_head_dead_letters_the_oldest_with_reason_maxlen_counting_body_bytes(channel):
    """x-max-length-bytes counts message bodies only (the queue length guide)."""
    name = unique("maxlen")
    dead = with_dlx(channel, name, **{"x-max-length-bytes": 10})
    for body in (b"12345", b"67890", b"abc"):
        channel.basic_publish("", name, body, pika.BasicProperties(headers={"pad": "x" * 200}))
    _method, properties, body = wait_get(channel, dead)
    assert body == b"12345" and properties.headers["x-death"][0]["reason"] == "maxlen"
    assert channel.queue_declare(name, passive=True).method.message_count == 2


def test_reject_publish_dlx_nacks_and_dead_letters_the_refused_message(channel):
    name = unique("rpdlx")
    dead = with_dlx(channel, name, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    channel.confirm_delivery()
    channel.basic_publish("", name, b"kept")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", name, b"refused")
    _method, properties, body = wait_get(channel, dead)
    assert body == b"refused" and properties.headers["x-death"][0]["reason"] == "maxlen"
    assert channel.queue_declare(name, passive=True).method.message_count == 1


def test_quorum_queues_refuse_reject_publish_dlx(channel):
    error = channel_error(lambda: channel.queue_declare(
        unique("qq"), durable=True, arguments={"x-queue-type": "quorum",
                                               "x-overflow": "reject-publish-dlx"}))
    assert error.reply_code == 406 and "reject-publish-dlx" in error.reply_text


def _exists(connection, queue: str) -> bool:
    """queue.bind answers 404 for a missing queue, and is no use of the queue (a
    passive declare would renew its x-expires)."""
    channel = connection.channel()
    try:
        channel.queue_bind(queue, "amq.direct", f"probe-{queue}")
    except pika.exceptions.ChannelClosedByBroker as error:
        assert error.reply_code == 404
        return False
    channel.close()
    return True


def test_an_unused_queue_is_deleted_after_x_expires_one_with_a_consumer_is_not(connection,
                                                                               channel):
    idle_queue, used = unique("idle"), unique("used")
    for queue in (idle_queue, used):
        channel.queue_declare(queue, arguments={"x-expires": 500})
    tag = channel.basic_consume(used, lambda *args: None)
    deadline = time.monotonic() + WAIT_S
    while _exists(connection, idle_queue):
        assert time.monotonic() < deadline, "the unused queue was not deleted"
        connection.sleep(0.1)
    connection.sleep(1.5)  # three periods with a consumer
    assert _exists(connection, used)
    channel.basic_cancel(tag)
    while _exists(connection, used):
        assert time.monotonic() < deadline + WAIT_S, "the queue was not deleted"
        connection.sleep(0.1)

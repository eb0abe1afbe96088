"""Message TTL, queue TTL and dead lettering on quorum and classic queues, against
RabbitMQ 3.10.8.

The same pika scenarios run against the RabbitMQ oracle and against quorumqueue, and
what a consumer sees is compared field by field: the dead-lettered message's body,
delivery exchange and routing key, properties (`expiration` removed, other headers
kept), and every x-death table (count, reason, queue, exchange, routing-keys,
original-expiration; `time` is compared as "a timestamp within the run"), plus
x-first-death-*. Each scenario runs on both queue types, with the same topology on
both brokers, but the delivery limit (quorum queues only) and x-overflow
reject-publish-dlx (classic queues only). Specification: the quorum queues guide
("Queue and Per-Message TTL", "Dead Lettering", "Poison Message Handling"), the dead
letter exchanges guide ("Dead-Lettered Messages"), the TTL guide, the queue length
guide.

Where RabbitMQ 3.10.8 differs from 4.2 only by age, the test follows 4.2 and says so:
- x-last-death-reason/-queue/-exchange are written by RabbitMQ 4.x only: checked on
  quorumqueue, absent on 3.10.8 (masked in the comparison).
- 3.10.8 adds `x-delivery-count: 0` to a quorum queue's first delivery; 4.x (and
  quorumqueue) only to redeliveries: the header is left out of the comparison.

Nothing here depends on speed: TTLs are short, and every wait polls for the
condition with a generous bound.
"""

from __future__ import annotations

import datetime
import time
import uuid

import pika
import pytest

pytestmark = pytest.mark.timeout(180)

WAIT_S = 30.0  # generous: expiry runs on the leader's tick (about a second)
IGNORED_HEADERS = ("x-delivery-count",) + tuple(
    f"x-last-death-{part}" for part in ("reason", "queue", "exchange"))


def _name(prefix: str) -> str:
    return f"dlx-{prefix}-{uuid.uuid4().hex[:8]}"


def _get(channel, queue: str, timeout: float = WAIT_S):
    """basic.get until a message arrives (or fail after `timeout`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return method, properties, body
        time.sleep(0.05)
    raise AssertionError(f"no message in '{queue}' within {timeout} s")


def _wait_empty(channel, queue: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if channel.queue_declare(queue, passive=True).method.message_count == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"'{queue}' still holds messages after {timeout} s")


def _seen(method, properties, body, started: float, names: dict) -> dict:
    """What a consumer sees, with run-specific names replaced by their roles and
    x-death times checked and replaced by a marker."""
    def role(value):
        if isinstance(value, list):
            return [role(item) for item in value]
        if isinstance(value, bytes):
            value = value.decode()
        return names.get(value, value)

    headers = dict(properties.headers or {})
    deaths = []
    for death in headers.pop("x-death", []):
        death = dict(death)
        stamp = death.pop("time")
        assert isinstance(stamp, datetime.datetime)
        seconds = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
        assert started - 5 <= seconds <= time.time() + 5, stamp
        deaths.append({key: role(value) for key, value in death.items()})
    last = {key: role(headers.pop(key)) for key in IGNORED_HEADERS[1:] if key in headers}
    headers.pop("x-delivery-count", None)
    return {"body": body, "exchange": role(method.exchange),
            "routing_key": role(method.routing_key), "expiration": properties.expiration,
            "delivery_mode": properties.delivery_mode,
            "headers": {key: role(value) for key, value in headers.items()},
            "x-death": deaths, "last": last}


def _rejected_to_dlx(channel, kind: dict) -> tuple[dict, dict]:
    """A message with an expiration and CC header, rejected without requeue from a
    quorum queue whose DLX (direct) routes its routing key to a target queue."""
    names = {}
    source, target, dlx = _name("src"), _name("dst"), _name("ex")
    names.update({source: "source", target: "target", dlx: "dlx"})
    channel.exchange_declare(dlx, "direct")
    channel.queue_declare(target, durable=True, arguments=kind)
    channel.queue_bind(target, dlx, "rk")
    channel.queue_declare(source, durable=True,
                          arguments={**kind, "x-dead-letter-exchange": dlx})
    channel.queue_bind(source, "amq.direct", "rk")
    channel.basic_publish("amq.direct", "rk", b"payload", pika.BasicProperties(
        delivery_mode=2, expiration="60000", headers={"app": "kept", "CC": ["other"]}))
    deadline = time.monotonic() + WAIT_S
    while True:
        method, _properties, _body = channel.basic_get(source, auto_ack=False)
        if method is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    channel.basic_reject(method.delivery_tag, requeue=False)
    return _get(channel, target), names


def _expired_to_dlx(channel, kind: dict) -> tuple[dict, dict]:
    """x-message-ttl 200 ms, no consumer: expired and dead-lettered with a
    dead-letter routing key through the default exchange."""
    source, target = _name("src"), _name("dst")
    channel.queue_declare(target, durable=True, arguments=kind)
    channel.queue_declare(source, durable=True, arguments={
        **kind, "x-message-ttl": 200, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": target})
    channel.basic_publish("", source, b"late", pika.BasicProperties(delivery_mode=2))
    return _get(channel, target), {source: "source", target: "target"}


def _delivery_limit_to_dlx(channel, kind: dict) -> tuple[dict, dict]:
    """x-delivery-limit 1: the second requeue dead-letters with reason delivery_limit."""
    source, target = _name("src"), _name("dst")
    channel.queue_declare(target, durable=True, arguments=kind)
    channel.queue_declare(source, durable=True, arguments={
        **kind, "x-delivery-limit": 1, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": target})
    channel.basic_publish("", source, b"poison", pika.BasicProperties(delivery_mode=2))
    for _ in range(2):
        deadline = time.monotonic() + WAIT_S
        method = None
        while method is None and time.monotonic() < deadline:
            method, _p, _b = channel.basic_get(source, auto_ack=False)
        channel.basic_nack(method.delivery_tag, requeue=True)
    return _get(channel, target), {source: "source", target: "target"}


def _maxlen_to_dlx(channel, kind: dict) -> tuple[dict, dict]:
    """x-max-length 1 (drop-head): the older message is dead-lettered, reason maxlen."""
    source, target = _name("src"), _name("dst")
    channel.queue_declare(target, durable=True, arguments=kind)
    channel.queue_declare(source, durable=True, arguments={
        **kind, "x-max-length": 1, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": target})
    channel.basic_publish("", source, b"first", pika.BasicProperties(delivery_mode=2))
    channel.basic_publish("", source, b"second", pika.BasicProperties(delivery_mode=2))
    return _get(channel, target), {source: "source", target: "target"}


def _retry_with_delay(channel, kind: dict) -> tuple[dict, dict]:
    """The retry-with-delay topology (docs/behaviour/ttl-and-dead-lettering.md): work -> (rejected) -> delay
    queue with a 300 ms TTL -> (expired) -> work again; rejected twice, then taken.
    x-death holds one table per (queue, reason), the latest first, with counts."""
    work, delay = _name("work"), _name("delay")
    channel.queue_declare(work, durable=True, arguments={
        **kind, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": delay})
    channel.queue_declare(delay, durable=True, arguments={
        **kind, "x-message-ttl": 300, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": work})
    channel.basic_publish("", work, b"job", pika.BasicProperties(delivery_mode=2))
    for _attempt in range(2):
        deadline = time.monotonic() + WAIT_S
        method = None
        while method is None:
            assert time.monotonic() < deadline, "the job did not come back"
            method, _p, _b = channel.basic_get(work, auto_ack=False)
            time.sleep(0.02)
        channel.basic_reject(method.delivery_tag, requeue=False)
    return _get(channel, work), {work: "work", delay: "delay"}


def _ttl_zero_to_dlx(channel, kind: dict) -> tuple[dict, dict]:
    """x-message-ttl 0 and no consumer: the message expires on reaching the queue and
    is dead-lettered (the TTL guide: delivered only if a consumer can take it at once)."""
    source, target = _name("src"), _name("dst")
    channel.queue_declare(target, durable=True, arguments=kind)
    channel.queue_declare(source, durable=True, arguments={
        **kind, "x-message-ttl": 0, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": target})
    channel.basic_publish("", source, b"now", pika.BasicProperties(delivery_mode=2,
                                                                   expiration="5000"))
    return _get(channel, target), {source: "source", target: "target"}


def _reject_publish_dlx(channel, kind: dict) -> tuple[dict, dict]:
    """x-overflow reject-publish-dlx (classic queues only): the publish over the limit
    is nacked and the refused message dead-lettered with reason maxlen."""
    source, target = _name("src"), _name("dst")
    channel.queue_declare(target, durable=True, arguments=kind)
    channel.queue_declare(source, durable=True, arguments={
        **kind, "x-max-length": 1, "x-overflow": "reject-publish-dlx",
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": target})
    channel.confirm_delivery()
    channel.basic_publish("", source, b"first", pika.BasicProperties(delivery_mode=2))
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", source, b"second", pika.BasicProperties(delivery_mode=2))
    return _get(channel, target), {source: "source", target: "target"}


SCENARIOS = {"rejected": _rejected_to_dlx, "expired": _expired_to_dlx,
             "delivery_limit": _delivery_limit_to_dlx, "maxlen": _maxlen_to_dlx,
             "retry_with_delay": _retry_with_delay, "ttl_zero": _ttl_zero_to_dlx,
             "reject_publish_dlx": _reject_publish_dlx}
# the delivery limit is quorum queues' only; reject-publish-dlx classic queues' only
NOT_FOR = {"quorum": ("reject_publish_dlx",), "classic": ("delivery_limit",)}
CASES = [pytest.param(queue_type, name, id=f"{queue_type}-{name}")
         for queue_type in ("quorum", "classic") for name in sorted(SCENARIOS)
         if name not in NOT_FOR[queue_type]]


def _kind(queue_type: str) -> dict:
    return {"x-queue-type": queue_type}


def _run(uri: str, scenario, kind: dict) -> dict:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        started = time.time()
        (method, properties, body), names = scenario(connection.channel(), kind)
        return _seen(method, properties, body, started, names)
    finally:
        connection.close()


@pytest.mark.parametrize("queue_type, name", CASES)
def test_dead_lettered_message_matches_rabbitmq(queue_type, name, rabbitmq, broker):
    expected = _run(rabbitmq.uri, SCENARIOS[name], _kind(queue_type))
    actual = _run(broker.uri, SCENARIOS[name], _kind(queue_type))
    # RabbitMQ 4.x writes x-last-death-*; 3.10.8 predates them (module docstring)
    assert expected.pop("last") == {}
    last = actual.pop("last")
    newest = actual["x-death"][0]
    assert last == {"x-last-death-reason": newest["reason"],
                    "x-last-death-queue": newest["queue"],
                    "x-last-death-exchange": newest["exchange"]}
    for field in expected:
        assert actual[field] == expected[field], field


def _automatic_cycle(uri: str, kind: dict) -> list[int]:
    """Two queues dead-letter expired messages to each other (TTL 100 ms): a cycle
    with no rejection in it, which RabbitMQ breaks by dropping the message when it
    would come back to the first queue. Returns both queues' counts once they have
    been empty for three consecutive checks a second apart."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        first, second = _name("ping"), _name("pong")
        for queue, other in ((first, second), (second, first)):
            channel.queue_declare(queue, durable=True, arguments={
                **kind, "x-message-ttl": 100, "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": other})
        channel.basic_publish("", first, b"loop", pika.BasicProperties(delivery_mode=2))
        deadline, quiet = time.monotonic() + WAIT_S, 0
        while quiet < 3:
            assert time.monotonic() < deadline, "the message kept cycling"
            counts = [channel.queue_declare(q, passive=True).method.message_count
                      for q in (first, second)]
            quiet = quiet + 1 if counts == [0, 0] else 0
            time.sleep(1.0 if quiet else 0.05)
        return counts
    finally:
        connection.close()


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_an_automatic_dead_letter_cycle_is_dropped_as_rabbitmq_does(queue_type, rabbitmq,
                                                                   broker):
    kind = _kind(queue_type)
    assert _automatic_cycle(rabbitmq.uri, kind) == [0, 0] == _automatic_cycle(broker.uri, kind)


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_retry_with_delay_headers_name_both_queues(queue_type, broker):
    """The worked example of docs/behaviour/ttl-and-dead-lettering.md end to end on quorumqueue alone: the
    job comes back to the work queue after each rejection, through the delay queue."""
    seen = _run(broker.uri, _retry_with_delay, _kind(queue_type))
    assert seen["body"] == b"job"
    assert [(d["queue"], d["reason"], d["count"]) for d in seen["x-death"]] == [
        ("delay", "expired", 2), ("work", "rejected", 2)]
    assert seen["headers"]["x-first-death-reason"] == "rejected"
    assert seen["headers"]["x-first-death-queue"] == "work"


def _never_delivered(uri: str, kind: dict) -> list:
    """Per-message expiration without a dead-letter exchange: the expired message
    is dropped by the timer, not delivered to a later basic.get. Returns what the
    client saw."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        queue = _name("ttl")
        channel.queue_declare(queue, durable=True, arguments=kind)
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"short", pika.BasicProperties(expiration="100"))
        channel.basic_publish("", queue, b"long", pika.BasicProperties(expiration="600000"))
        deadline = time.monotonic() + WAIT_S
        while channel.queue_declare(queue, passive=True).method.message_count != 1:
            assert time.monotonic() < deadline, "the expired message stayed"
            time.sleep(0.05)
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        seen = [body, properties.expiration]
        _wait_empty(channel, queue)
        return seen
    finally:
        connection.close()


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_an_expired_message_is_never_delivered_and_leaves_without_a_consumer(
        queue_type, rabbitmq, broker):
    kind = _kind(queue_type)
    assert _never_delivered(rabbitmq.uri, kind) == _never_delivered(broker.uri, kind) == [
        b"long", "600000"]


def _exists(channel_of, queue: str) -> bool:
    """queue.bind answers 404 for a missing queue and, unlike a passive declare, does
    not count as use of a classic queue (a declare renews its x-expires)."""
    channel = channel_of()
    try:
        channel.queue_bind(queue, "amq.direct", f"probe-{queue}")
    except pika.exceptions.ChannelClosedByBroker as error:
        assert error.reply_code == 404
        return False
    channel.close()
    return True


def _expiry_run(uri: str, kind: dict) -> list[str]:
    """x-expires 1000 on two queues: one never used is deleted; one with a consumer is
    not while the consumer stays (checked after 3 s, three periods), and is deleted
    after the consumer cancels. Returns what was observed, in order."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    seen = []
    try:
        channel = connection.channel()
        idle, used = _name("idle"), _name("used")
        for queue in (idle, used):
            channel.queue_declare(queue, durable=True,
                                  arguments={**kind, "x-expires": 1000})
        tag = channel.basic_consume(used, lambda *args: None)
        deadline = time.monotonic() + WAIT_S
        while _exists(connection.channel, idle):
            assert time.monotonic() < deadline, "the unused queue was not deleted"
            time.sleep(0.1)
        seen.append("unused queue deleted")
        connection.sleep(3.0)  # three periods with a consumer
        seen.append("used queue kept" if _exists(connection.channel, used) else "used deleted")
        channel.basic_cancel(tag)
        while _exists(connection.channel, used):
            assert time.monotonic() < deadline + WAIT_S, "the queue was not deleted"
            time.sleep(0.1)
        seen.append("deleted after the consumer left")
        return seen
    finally:
        connection.close()


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
def test_queue_ttl_deletes_an_unused_queue_as_rabbitmq_does(queue_type, rabbitmq, broker):
    """x-expires (the TTL guide; on quorum queues the 4.2 guide's feature matrix: queue
    TTL, partial: a redeclare does not renew it): the queue is deleted once unused for
    the period, never while it has a consumer."""
    kind = _kind(queue_type)
    assert _expiry_run(rabbitmq.uri, kind) == _expiry_run(broker.uri, kind) == [
        "unused queue deleted", "used queue kept", "deleted after the consumer left"]


def _renewed_by_declare(uri: str) -> list[str]:
    """A classic queue with x-expires 1500 redeclared every 500 ms for 4.5 s stays
    (RabbitMQ's classic queues count a declare as use); left alone, it goes."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        queue = _name("renewed")
        arguments = {"x-queue-type": "classic", "x-expires": 1500}
        channel.queue_declare(queue, durable=True, arguments=arguments)
        for _ in range(9):
            connection.sleep(0.5)
            channel.queue_declare(queue, durable=True, arguments=arguments)
        seen = ["kept while redeclared" if _exists(connection.channel, queue) else "deleted"]
        deadline = time.monotonic() + WAIT_S
        while _exists(connection.channel, queue):
            assert time.monotonic() < deadline, "the queue was not deleted"
            time.sleep(0.1)
        seen.append("deleted once left alone")
        return seen
    finally:
        connection.close()


def test_a_redeclare_renews_a_classic_queues_x_expires_as_rabbitmq_does(rabbitmq, broker):
    assert _renewed_by_declare(rabbitmq.uri) == _renewed_by_declare(broker.uri) == [
        "kept while redeclared", "deleted once left alone"]


def _expiration_refusals(uri: str) -> list:
    """What a publish with each `expiration` value gets: accepted, or the channel
    closed with its reply code and text (rabbit_channel's check_expiration_header)."""
    seen = []
    queue = _name("exp")
    for value in ("abc", "-5", "5x", "1.5", " 5", "0", "600000"):
        connection = pika.BlockingConnection(pika.URLParameters(uri))
        try:
            channel = connection.channel()
            channel.queue_declare(queue, arguments={"x-expires": 60_000})
            channel.basic_publish("", queue, b"m", pika.BasicProperties(expiration=value))
            channel.queue_declare(queue, passive=True)  # a round trip: refused by now
            seen.append((value, "accepted"))
        except pika.exceptions.ChannelClosedByBroker as error:
            seen.append((value, error.reply_code, error.reply_text))
        finally:
            if connection.is_open:
                connection.close()
    return seen


def test_an_invalid_expiration_is_refused_as_rabbitmq_does(rabbitmq, broker):
    """The TTL guide ("Per-Message TTL in Publishers"): the expiration is a string
    holding a non-negative integer of milliseconds; RabbitMQ refuses anything else
    with 406 naming the value and what is wrong with it."""
    expected = _expiration_refusals(rabbitmq.uri)
    assert ("-5", 406, "PRECONDITION_FAILED - invalid expiration '-5': "
                       "{value_negative,-5}") in expected
    assert _expiration_refusals(broker.uri) == expected

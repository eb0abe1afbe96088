"""At-least-once dead lettering on quorum queues, against RabbitMQ 3.10.8 (which has
it since 3.10, as the quorum queues guide's "Dead Lettering" says; 4.2 behaves the
same in what is compared here).

Both brokers run their dead-letter worker with a one-second retry
(`dead_letter_worker_publisher_confirm_timeout` = 1000 ms: RabbitMQ's advanced.config
key, quorumqueue's configuration key of the same name; the default is 180 s on both).
Compared: what the target's consumer sees of a dead letter (x-death and the other
headers: the comparison of test_dead_letter_against_rabbitmq.py), a dead letter kept
while its target does not exist and delivered once it does, and held dead letters
counting towards the source's length limit (the guide's Caveats).
"""

from __future__ import annotations

import time

import pika
import pytest

from tests.differential.test_dead_letter_against_rabbitmq import _get, _name, _seen
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode

pytestmark = pytest.mark.timeout(240)

WAIT_S = 30.0
QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module")
def rabbitmq_dlx():
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with RabbitMQNode(advanced_config="[{rabbit, [{dead_letter_worker_publisher_confirm_"
                                      "timeout, 1000}]}].") as node:
        yield node


@pytest.fixture(scope="module")
def broker_dlx():
    with BrokerProcess(extra_config="dead_letter_worker_publisher_confirm_timeout = 1000\n") \
            as process:
        yield process


def at_least_once(target: str, **more) -> dict:
    return {**QUORUM, "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish", "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": target, **more}


def reject(channel, queue: str, count: int) -> None:
    for _ in range(count):
        deadline, method = time.monotonic() + WAIT_S, None
        while method is None:
            assert time.monotonic() < deadline, f"no message in {queue}"
            method, _properties, _body = channel.basic_get(queue, auto_ack=False)
        channel.basic_reject(method.delivery_tag, requeue=False)


def late_target(uri: str) -> dict:
    """Three messages rejected while the target does not exist; the source keeps them
    (its ready count is 0: they are dead letters, not ready messages); the target is
    declared two seconds later and receives them."""
    source, target = _name("alo-src"), _name("alo-late")
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        channel.queue_declare(source, durable=True, arguments=at_least_once(target))
        channel.confirm_delivery()
        for number in range(3):
            channel.basic_publish("", source, b"late-%d" % number,
                                  pika.BasicProperties(delivery_mode=2))
        started = time.time()
        reject(channel, source, 3)
        connection.sleep(2.0)  # two retries with no route: nothing may be lost meanwhile
        ready = channel.queue_declare(source, passive=True).method.message_count
        channel.queue_declare(target, durable=True, arguments=QUORUM)
        seen = [_seen(*_get(channel, target), started, {source: "source", target: "target"})
                for _ in range(3)]
        return {"source ready": ready, "bodies": sorted(item.pop("body") for item in seen),
                "x-death": [item["x-death"] for item in seen]}
    finally:
        connection.close()


def test_a_dead_letter_waits_for_its_target_as_in_rabbitmq(rabbitmq_dlx, broker_dlx):
    expected = late_target(rabbitmq_dlx.uri)
    assert expected["bodies"] == [b"late-0", b"late-1", b"late-2"]
    assert late_target(broker_dlx.uri) == expected


def length_limit(uri: str) -> list[bool]:
    """x-max-length 2, reject-publish, and a dead-letter route to no queue: two
    messages rejected and held; then publishes: which were confirmed (True) or nacked."""
    source = _name("alo-limit")
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        channel.queue_declare(source, durable=True, arguments=at_least_once(
            _name("alo-absent"), **{"x-max-length": 2}))
        channel.confirm_delivery()
        for number in range(2):
            channel.basic_publish("", source, b"%d" % number)
        reject(channel, source, 2)
        deadline = time.monotonic() + WAIT_S
        while channel.queue_declare(source, passive=True).method.message_count:
            assert time.monotonic() < deadline
            connection.sleep(0.05)
        outcomes = []
        for number in range(2, 5):
            try:
                channel.basic_publish("", source, b"%d" % number)
                outcomes.append(True)
            except pika.exceptions.NackError:
                outcomes.append(False)
        return outcomes
    finally:
        connection.close()


def test_held_dead_letters_count_towards_the_length_limit_as_in_rabbitmq(rabbitmq_dlx,
                                                                          broker_dlx):
    expected = length_limit(rabbitmq_dlx.uri)
    assert expected == length_limit(broker_dlx.uri)
    assert expected[-1] is False  # refused while the dead letters are held


def headers_of(uri: str) -> dict:
    source, target, dlx = _name("alo-src"), _name("alo-dst"), _name("alo-ex")
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        channel = connection.channel()
        channel.exchange_declare(dlx, "direct")
        channel.queue_declare(target, durable=True, arguments=QUORUM)
        channel.queue_bind(target, dlx, "rk")
        channel.queue_declare(source, durable=True, arguments={
            **at_least_once(target), "x-dead-letter-exchange": dlx,
            "x-dead-letter-routing-key": "rk"})
        started = time.time()
        channel.basic_publish("", source, b"payload", pika.BasicProperties(
            delivery_mode=2, expiration="60000", headers={"app": "kept"}))
        reject(channel, source, 1)
        seen = _seen(*_get(channel, target), started,
                     {source: "source", target: "target", dlx: "dlx"})
        seen.pop("last")  # x-last-death-*: RabbitMQ 4.x only (the other module)
        return seen
    finally:
        connection.close()


def test_an_at_least_once_dead_letter_looks_as_in_rabbitmq(rabbitmq_dlx, broker_dlx):
    assert headers_of(broker_dlx.uri) == headers_of(rabbitmq_dlx.uri)

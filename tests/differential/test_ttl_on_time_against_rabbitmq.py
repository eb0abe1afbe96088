"""Message TTL and queue TTL on time, against RabbitMQ 3.10.8: expiry is driven by the
moment something expires, not by a periodic sweep.

RabbitMQ sets a timer for the moment a queue's head expires (rabbit_amqqueue_process's
ttl timer; rabbit_fifo's expire_msgs timer effect for quorum queues) and for the end
of a classic queue's x-expires period. Client test suites count on it: the Java
client's DeadLetterExchange tests publish messages with a 1 ms TTL, sleep 100 ms and
look. Dead lettering then follows the moment of death (the dead letter exchanges
guide): a message that expired while its dead-letter exchange did not exist is
dropped and stays dropped once the exchange is declared again; a message that
expires from a queue whose dead-letter exchange routes it to a queue with a TTL of
its own dies again there, and every copy reaches the last queue.

quorumqueue used to expire messages only on its half-second sweep (and a quorum
queue's leader at most once a second), so after 100 ms the messages of the first
case were still there when the exchange came back, and were delivered. To check the
moment without asserting a duration, quorumqueue runs in process here with its
periodic sweep of queue timers switched off (Node.tick_queues, QuorumGroups.tick):
whatever expires must then expire on its own deadline, as on RabbitMQ, and each
scenario waits for what it needs with a generous bound. The same pika client runs
on both brokers and what it sees is compared.

Quorum queues' x-expires stays on the sweep: RabbitMQ 3.10.8 checks it on its
quorum queue tick (5 s), quorumqueue's leader about every second (measured:
x-expires 1000 deleted after 5.0 s on RabbitMQ, 1.2-1.6 s here).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pika
import pytest

from quorumqueue.broker.config import Settings
from tests.broker.server.inprocess import running_server
from tests.broker.server.test_classic_ttl_pika import _exists

pytestmark = pytest.mark.timeout(300)

WAIT_S = 30.0  # generous: a loaded machine; nothing here depends on speed
COUNT = 5


@pytest.fixture(scope="module")
def broker_without_sweep(tmp_path_factory) -> Iterator[str]:
    """An in-process broker whose ticker no longer expires messages or queues."""
    data_dir = tmp_path_factory.mktemp("qq-ttl-on-time")
    for server in running_server(Settings(host="127.0.0.1", port=0, data_dir=str(data_dir),
                                          prometheus_port=0)):
        server.node.tick_queues = lambda: None
        server.node.quorum.tick = lambda now: None
        yield f"amqp://guest:guest@127.0.0.1:{server.port}/%2F"


def _name(role: str) -> str:
    return f"ttl-{role}-{uuid.uuid4().hex[:8]}"


def _count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def _wait_count(channel, queue: str, count: int, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while _count(channel, queue) != count:
        assert time.monotonic() < deadline, f"{what}: still not {count} after {WAIT_S} s"
        time.sleep(0.02)


def _drain(channel, queue: str, names: dict) -> list:
    """Every message of `queue`: body and x-death (queue role, reason, count), sorted."""
    seen = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return sorted(seen)
        deaths = [(names.get(d["queue"], d["queue"]), d["reason"], d["count"])
                  for d in (properties.headers or {}).get("x-death", [])]
        seen.append((body.decode(), tuple(deaths)))


def _with_channel(uri: str, scenario, kind: dict):
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        return scenario(connection.channel(), kind)
    finally:
        connection.close()


def deleted_dead_letter_exchange(channel, kind: dict) -> list:
    """The Java client's deadLetterDeletedDLX: messages with a 1 ms TTL expire while
    the dead-letter exchange is deleted; it is declared again and bound, and more
    messages expire. Only the later ones reach the dead-letter queue."""
    source, target, dlx = _name("src"), _name("dlq"), _name("dlx")
    channel.exchange_declare(dlx, "direct")
    channel.queue_declare(target, durable=True, arguments=kind)
    channel.queue_bind(target, dlx, source)  # the messages' routing key
    channel.queue_declare(source, durable=True, arguments={
        **kind, "x-message-ttl": 1, "x-dead-letter-exchange": dlx})
    channel.queue_bind(source, "amq.direct", source)
    channel.exchange_delete(dlx)
    for number in range(COUNT):
        channel.basic_publish("amq.direct", source, f"early {number}".encode())
    _wait_count(channel, source, 0, "expired with no dead-letter exchange")
    # RabbitMQ's quorum queue publishes a dead-lettered copy a moment after the
    # message left (rabbit_fifo reads its body back from the log in an effect, then
    # looks the exchange up): without this pause, an exchange declared within those
    # milliseconds still gets the early ones there. It is the Java test's 100 ms
    # sleep, made generous; quorumqueue dead-letters as the message leaves.
    time.sleep(1.0)
    channel.exchange_declare(dlx, "direct")
    channel.queue_bind(target, dlx, source)
    for number in range(COUNT):
        channel.basic_publish("amq.direct", source, f"late {number}".encode())
    _wait_count(channel, target, COUNT, "dead-lettered once the exchange was back")
    _wait_count(channel, source, 0, "the source queue empty")
    return _drain(channel, target, {source: "source"})


def dead_lettered_twice(channel, kind: dict) -> list:
    """The Java client's deadLetterTwice: the source and the dead-letter queue both
    have a 1 ms TTL and the same dead-letter exchange, which routes to the dead-letter
    queue and a second one. Each message reaches the second queue twice: dead-lettered
    from the source, and again from the first dead-letter queue (whose own copy is an
    automatic cycle, dropped)."""
    source, first, second, dlx = _name("src"), _name("dlq"), _name("dlq2"), _name("dlx")
    channel.exchange_declare(dlx, "direct")
    channel.queue_declare(source, durable=True, arguments={
        **kind, "x-message-ttl": 1, "x-dead-letter-exchange": dlx})
    channel.queue_declare(first, durable=True, arguments={
        **kind, "x-message-ttl": 1, "x-dead-letter-exchange": dlx})
    channel.queue_declare(second, durable=True, arguments=kind)
    channel.queue_bind(source, "amq.direct", source)
    for queue in (first, second):
        channel.queue_bind(queue, dlx, source)  # the messages' routing key
    for number in range(COUNT):
        channel.basic_publish("amq.direct", source, f"m {number}".encode(),
                              pika.BasicProperties(headers={}))
    _wait_count(channel, second, 2 * COUNT, "both copies in the second queue")
    return _drain(channel, second, {source: "source", first: "first dlq"})


def two_stage_chain(channel, kind: dict) -> list:
    """Queue TTL -> a fanout DLX -> two queues with a TTL of their own -> a direct DLX
    -> the last queue: every copy arrives there (two per message)."""
    source, middle_a, middle_b, last = (_name("src"), _name("mid-a"), _name("mid-b"),
                                        _name("last"))
    fanout, direct = _name("fan"), _name("dir")
    channel.exchange_declare(fanout, "fanout")
    channel.exchange_declare(direct, "direct")
    channel.queue_declare(last, durable=True, arguments=kind)
    channel.queue_bind(last, direct, "k")
    for queue in (middle_a, middle_b):
        channel.queue_declare(queue, durable=True, arguments={
            **kind, "x-message-ttl": 20, "x-dead-letter-exchange": direct,
            "x-dead-letter-routing-key": "k"})
        channel.queue_bind(queue, fanout)
    channel.queue_declare(source, durable=True, arguments={
        **kind, "x-message-ttl": 10, "x-dead-letter-exchange": fanout})
    for number in range(COUNT):
        channel.basic_publish("", source, f"m {number}".encode())
    _wait_count(channel, last, 2 * COUNT, "every copy in the last queue")
    return _drain(channel, last, {source: "source", middle_a: "middle a",
                                  middle_b: "middle b"})


SCENARIOS = {"deleted_dlx": deleted_dead_letter_exchange, "twice": dead_lettered_twice,
             "two_stage_chain": two_stage_chain}


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_messages_expire_and_die_on_time_as_in_rabbitmq(name, queue_type, rabbitmq,
                                                        broker_without_sweep) -> None:
    kind = {"x-queue-type": queue_type}
    expected = _with_channel(rabbitmq.uri, SCENARIOS[name], kind)
    if name == "deleted_dlx":
        assert [body for body, _deaths in expected] == [f"late {n}" for n in range(COUNT)]
    assert _with_channel(broker_without_sweep, SCENARIOS[name], kind) == expected


def _unused_queue_deleted(uri: str) -> str:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    try:
        queue = _name("expires")
        connection.channel().queue_declare(queue, arguments={"x-expires": 300})
        deadline = time.monotonic() + WAIT_S
        while _exists(connection, queue):
            assert time.monotonic() < deadline, "the unused queue was not deleted"
            time.sleep(0.05)
        return "deleted"
    finally:
        connection.close()


def test_an_unused_classic_queue_is_deleted_at_the_end_of_its_period_as_in_rabbitmq(
        rabbitmq, broker_without_sweep) -> None:
    assert _unused_queue_deleted(rabbitmq.uri) == _unused_queue_deleted(
        broker_without_sweep) == "deleted"

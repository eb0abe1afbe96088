"""kombu (over py-amqp) against the bundled broker, as Celery-style code uses RabbitMQ:
Producer/Consumer with JSON serialization, SimpleQueue, acks and requeues, and topic
routing through declared entities.
"""

from __future__ import annotations

import socket
import uuid

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue

pytestmark = pytest.mark.timeout(60)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def connection(broker):
    # confirm_publish: py-amqp waits for each basic.ack, so counts are exact afterwards
    with Connection(f"amqp://guest:guest@127.0.0.1:{broker.port}//",
                    transport_options={"confirm_publish": True}) as conn:
        conn.connect()
        yield conn


def drain(connection, received, count: int, timeout: float = 3.0) -> None:
    while len(received) < count:
        try:
            connection.drain_events(timeout=timeout)
        except socket.timeout:
            raise AssertionError(f"only {len(received)} of {count} messages arrived") from None


def test_producer_consumer_json_with_acks(connection):
    """kombu JSON serialization over basic.publish/basic.consume: the consumer gets the
    decoded payload with content-type application/json; acked messages are gone,
    and the queue's declare-ok shows nothing left."""
    exchange = Exchange(unique("kombu-direct"), type="direct", durable=False,
                        auto_delete=True)
    queue = Queue(unique("kombu-jobs"), exchange, routing_key="jobs")
    channel = connection.channel()
    producer = Producer(channel, exchange=exchange, serializer="json")
    received = []

    def on_message(body, message):
        received.append((body, message.content_type, message.delivery_info["routing_key"]))
        message.ack()

    with Consumer(connection.channel(), queues=[queue], callbacks=[on_message]):
        for index in range(5):
            producer.publish({"job": index, "tags": ["a", "b"], "nested": {"ok": True}},
                             routing_key="jobs", declare=[queue])
        drain(connection, received, 5)
    assert received == [({"job": i, "tags": ["a", "b"], "nested": {"ok": True}},
                         "application/json", "jobs") for i in range(5)]
    name, ready, consumers = queue(channel).queue_declare(passive=True)
    assert (name, ready, consumers) == (queue.name, 0, 0)
    queue(channel).delete()


def test_requeue_redelivers_and_reject_drops(connection):
    """basic.reject requeue=true puts the message back (redelivered=true);
    requeue=false drops it (kombu message.requeue() / message.reject())."""
    queue = Queue(unique("kombu-requeue"))
    producer = Producer(connection.channel(), serializer="json")
    producer.publish({"n": 1}, routing_key=queue.name, declare=[queue])
    producer.publish({"n": 2}, routing_key=queue.name, declare=[queue])
    seen = []

    def on_message(body, message):
        seen.append((body["n"], message.delivery_info["redelivered"]))
        if len(seen) == 1:
            message.requeue()
        elif body["n"] == 1:
            message.ack()
        else:
            message.reject()

    with Consumer(connection.channel(), queues=[queue], callbacks=[on_message],
                  prefetch_count=1):
        drain(connection, seen, 3)
    assert seen == [(1, False), (1, True), (2, False)]
    assert queue(connection.channel()).queue_declare(passive=True).message_count == 0
    queue(connection.channel()).delete()


def test_simple_queue_put_get_ack(connection):
    """kombu SimpleQueue (basic.publish + basic.get): FIFO order, qsize from the
    declare-ok message count, Empty when nothing is left."""
    name = unique("kombu-simple")
    with connection.SimpleQueue(name, queue_opts={"auto_delete": False}) as simple:
        for index in range(3):
            simple.put({"index": index})
        assert simple.qsize() == 3
        bodies = []
        for _ in range(3):
            message = simple.get(block=True, timeout=3)
            bodies.append(message.payload)
            message.ack()
        assert bodies == [{"index": 0}, {"index": 1}, {"index": 2}]
        with pytest.raises(simple.Empty):
            simple.get_nowait()
    connection.channel().queue_delete(name)


def test_topic_exchange_routing(connection):
    """Topic exchange through kombu entities: 'stock.#' and '*.eur' bindings select by
    dotted words; a key matching no binding reaches no queue."""
    exchange = Exchange(unique("kombu-topic"), type="topic", auto_delete=True)
    stocks = Queue(unique("stocks"), exchange, routing_key="stock.#", auto_delete=True)
    euro = Queue(unique("euro"), exchange, routing_key="*.eur", auto_delete=True)
    channel = connection.channel()
    for queue in (stocks, euro):
        queue(channel).declare()
    producer = Producer(channel, exchange=exchange, serializer="json")
    for key in ("stock.nyse.ibm", "fx.eur", "stock.eur", "bond.usd"):
        producer.publish({"key": key}, routing_key=key)
    got = {stocks.name: [], euro.name: []}

    def collect_into(name):
        def on_message(body, message):
            got[name].append(body["key"])
            message.ack()
        return on_message

    with Consumer(connection.channel(), queues=[stocks], callbacks=[collect_into(stocks.name)]), \
         Consumer(connection.channel(), queues=[euro], callbacks=[collect_into(euro.name)]):
        drain(connection, _Total(got), 4)
    assert got == {stocks.name: ["stock.nyse.ibm", "stock.eur"],
                   euro.name: ["fx.eur", "stock.eur"]}


class _Total:
    """len() is the number of items in all of a dict's lists (for drain())."""

    def __init__(self, lists: dict) -> None:
        self.lists = lists

    def __len__(self) -> int:
        return sum(len(items) for items in self.lists.values())

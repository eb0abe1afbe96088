"""Durability across broker restarts, observed with pika as a RabbitMQ user would.

Each test gets a broker with its own data directory (`fresh_broker`) and restarts
it either gracefully (SIGTERM) or by crashing it (SIGKILL). RabbitMQ's rules:
durable queues, exchanges and the bindings between durable ends survive; persistent
(delivery_mode 2) messages in durable queues survive once confirmed; transient queues
and exchanges, and transient messages, do not; unacked deliveries come back; acks
and purges that the broker answered for stay done.
"""

from __future__ import annotations

import signal

import pika
import pytest
from pika import exceptions as pe

from .pika_support import connect

pytestmark = pytest.mark.timeout(90)

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)
RESTARTS = [pytest.param(False, id="sigterm"), pytest.param(True, id="sigkill")]


def confirmed_channel(connection):
    channel = connection.channel()
    channel.confirm_delivery()
    return channel


def drain_bodies(channel, queue: str) -> list[tuple[bytes, bool]]:
    bodies = []
    while True:
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append((body, method.redelivered))


def exists(connection, kind: str, name: str) -> bool:
    channel = connection.channel()
    try:
        if kind == "queue":
            channel.queue_declare(name, passive=True)
        else:
            channel.exchange_declare(name, passive=True)
    except pe.ChannelClosedByBroker as error:
        assert error.reply_code == 404, error
        return False
    channel.close()
    return True


def restart(broker, kill: bool, *connections) -> None:
    """Restart while the clients are still connected: SIGKILL crashes at once; on
    SIGTERM the broker closes each connection (320) and the clients answer close-ok,
    as a running application's would."""
    if not kill:
        broker.process.send_signal(signal.SIGTERM)
        for connection in connections:
            try:
                while connection.is_open:
                    connection.process_data_events(time_limit=0.05)
            except pe.ConnectionClosedByBroker as error:
                assert error.reply_code == 320, error
    broker.restart(kill=kill)


@pytest.mark.parametrize("kill", RESTARTS)
def test_confirmed_persistent_messages_in_durable_queues_survive(fresh_broker, kill):
    """Durable queue + persistent messages, once confirmed (RabbitMQ publisher confirm
    guarantee: the message is on disk), survive both a clean stop and a crash, in order
    and with their properties; transient messages in the same queue are lost, and a
    transient queue is gone, persistent messages and all."""
    connection = connect(fresh_broker)
    channel = confirmed_channel(connection)
    channel.queue_declare("orders", durable=True)
    channel.queue_declare("scratch", durable=False)
    channel.basic_publish("", "scratch", b"persistent-but-transient-queue", PERSISTENT)
    for index in range(50):
        properties = pika.BasicProperties(delivery_mode=2, message_id=f"id-{index}",
                                          headers={"index": index})
        channel.basic_publish("", "orders", f"order-{index}".encode(), properties)
        channel.basic_publish("", "orders", f"transient-{index}".encode(), TRANSIENT)
    restart(fresh_broker, kill, connection)

    connection = connect(fresh_broker)
    channel = connection.channel()
    assert channel.queue_declare("orders", durable=True).method.message_count == 50
    for index in range(50):
        method, properties, body = channel.basic_get("orders", auto_ack=True)
        assert body == f"order-{index}".encode()
        assert (properties.delivery_mode, properties.message_id, properties.headers) == (
            2, f"id-{index}", {"index": index})
    assert channel.basic_get("orders") == (None, None, None)
    assert not exists(connection, "queue", "scratch")
    connection.close()


def test_queue_arguments_and_priorities_survive(fresh_broker):
    """A durable queue comes back from a crash with its x-arguments (a redeclare must
    still match them) and its persistent messages in priority order."""
    arguments = {"x-max-priority": 5, "x-max-length": 100}
    connection = connect(fresh_broker)
    channel = confirmed_channel(connection)
    channel.queue_declare("ranked", durable=True, arguments=arguments)
    for priority in (1, 5, 3, 0, 5):
        channel.basic_publish("", "ranked", f"p{priority}".encode(),
                              pika.BasicProperties(delivery_mode=2, priority=priority))
    restart(fresh_broker, True, connection)

    connection = connect(fresh_broker)
    channel = connection.channel()
    assert channel.queue_declare("ranked", durable=True,
                                 arguments=arguments).method.message_count == 5
    assert [body for body, _ in drain_bodies(channel, "ranked")] == [
        b"p5", b"p5", b"p3", b"p1", b"p0"]
    with pytest.raises(pe.ChannelClosedByBroker) as info:
        channel.queue_declare("ranked", durable=True, arguments={"x-max-priority": 5})
    assert info.value.reply_code == 406
    connection.close()


def test_state_survives_repeated_restarts(fresh_broker):
    """Publishes and acks made after a restart are as durable as the ones before it:
    across a crash, a clean restart and another crash, exactly the unacked persistent
    messages remain, in publish order."""
    expected = []
    for round_number, kill in enumerate((True, False, True)):
        connection = connect(fresh_broker)
        channel = confirmed_channel(connection)
        channel.queue_declare("ledger", durable=True)
        for index in range(4):
            body = f"r{round_number}-{index}".encode()
            channel.basic_publish("", "ledger", body, PERSISTENT)
            expected.append(body)
        method, _, body = channel.basic_get("ledger")
        assert body == expected[0]
        channel.basic_ack(method.delivery_tag)
        expected.pop(0)
        assert channel.queue_declare("ledger", passive=True).method.message_count == len(
            expected)
        restart(fresh_broker, kill, connection)
    connection = connect(fresh_broker)
    assert [body for body, _ in drain_bodies(connection.channel(), "ledger")] == expected
    connection.close()


@pytest.mark.parametrize("kill", RESTARTS)
def test_durable_exchanges_and_bindings_survive(fresh_broker, kill):
    """Durable exchanges and the bindings whose both ends are durable survive (queue
    and exchange-to-exchange bindings, with their arguments); transient exchanges and
    bindings to transient queues do not."""
    connection = connect(fresh_broker)
    channel = connection.channel()
    channel.exchange_declare("events", "topic", durable=True)
    channel.exchange_declare("audit", "headers", durable=True)
    channel.exchange_declare("ephemeral", "fanout", durable=False)
    channel.queue_declare("all-events", durable=True)
    channel.queue_declare("audited", durable=True)
    channel.queue_declare("temp", durable=False)
    channel.queue_bind("all-events", "events", "order.#")
    channel.queue_bind("temp", "events", "order.#")
    channel.exchange_bind("audit", "events", "#")
    channel.queue_bind("audited", "audit", arguments={"x-match": "any", "audit": True})
    restart(fresh_broker, kill, connection)

    connection = connect(fresh_broker)
    assert exists(connection, "exchange", "events")
    assert exists(connection, "exchange", "audit")
    assert not exists(connection, "exchange", "ephemeral")
    assert not exists(connection, "queue", "temp")
    channel = confirmed_channel(connection)
    channel.exchange_declare("events", "topic", durable=True)  # still equivalent
    channel.basic_publish("events", "order.created", b"bound", pika.BasicProperties(
        headers={"audit": True}))
    channel.basic_publish("events", "payment.created", b"unbound")
    assert drain_bodies(channel, "all-events") == [(b"bound", False)]
    assert drain_bodies(channel, "audited") == [(b"bound", False)]
    connection.close()


@pytest.mark.parametrize("kill", RESTARTS)
def test_unacked_messages_come_back_after_restart(fresh_broker, kill):
    """Deliveries that were never acked are not lost by a restart: every such message
    is ready again afterwards, in its original order among the others."""
    connection = connect(fresh_broker)
    channel = confirmed_channel(connection)
    channel.queue_declare("work", durable=True)
    for index in range(4):
        channel.basic_publish("", "work", f"job-{index}".encode(), PERSISTENT)
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=2)
    delivered = []
    consumer.basic_consume("work", lambda ch, method, props, body: delivered.append(body))
    while len(delivered) < 2:
        connection.process_data_events(time_limit=0.05)
    assert delivered == [b"job-0", b"job-1"]
    restart(fresh_broker, kill, connection)

    connection = connect(fresh_broker)
    channel = connection.channel()
    bodies = [body for body, _redelivered in drain_bodies(channel, "work")]
    assert bodies == [b"job-0", b"job-1", b"job-2", b"job-3"]
    connection.close()


@pytest.mark.parametrize("kill", RESTARTS)
def test_acks_purges_and_deletes_stay_done(fresh_broker, kill):
    """What the broker has answered for stays done after a restart or crash: acked
    messages do not reappear (once a later synchronous reply was received), a purged
    queue stays empty, a deleted durable queue stays deleted."""
    connection = connect(fresh_broker)
    channel = confirmed_channel(connection)
    for name in ("acked", "purged", "deleted"):
        channel.queue_declare(name, durable=True)
        for index in range(3):
            channel.basic_publish("", name, f"{name}-{index}".encode(), PERSISTENT)
    getter = connection.channel()
    method, _, body = getter.basic_get("acked")
    assert body == b"acked-0"
    getter.basic_ack(method.delivery_tag)
    assert channel.queue_purge("purged").method.message_count == 3
    channel.queue_delete("deleted")
    channel.queue_declare("acked", passive=True)   # a round trip after the ack
    restart(fresh_broker, kill, connection)

    connection = connect(fresh_broker)
    channel = connection.channel()
    assert drain_bodies(channel, "acked") == [(b"acked-1", False), (b"acked-2", False)]
    assert drain_bodies(channel, "purged") == []
    assert not exists(connection, "queue", "deleted")
    connection.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("kill", RESTARTS)
def test_unacked_messages_come_back_marked_redelivered(fresh_broker, kill, queue_type):
    """RabbitMQ records deliveries of persistent messages in its queue index, so a
    message delivered but not acked before a restart comes back with redelivered=true,
    while never-delivered ones keep redelivered=false (checked on RabbitMQ 3.10.8).
    quorumqueue writes a DELIVERED record to its message store before the delivery
    goes out (classic queues); a quorum queue's log holds the checkout, and the
    restarted node's Down for the old connection returns the message with its
    delivery count raised. So this holds after a crash of the broker process too."""
    connection = connect(fresh_broker)
    channel = confirmed_channel(connection)
    channel.queue_declare("work", durable=True, arguments={"x-queue-type": queue_type})
    for index in range(3):
        channel.basic_publish("", "work", f"job-{index}".encode(), PERSISTENT)
    method, _, body = connection.channel().basic_get("work")
    assert (body, method.redelivered) == (b"job-0", False)
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    received = []
    consumer.basic_consume("work", lambda _ch, method, _p, body: received.append(
        (body, method.redelivered)))
    while not received:
        connection.process_data_events(time_limit=0.1)
    assert received == [(b"job-1", False)]
    restart(fresh_broker, kill, connection)

    connection = connect(fresh_broker)
    observed = drain_bodies(connection.channel(), "work")
    connection.close()
    assert observed == [(b"job-0", True), (b"job-1", True), (b"job-2", False)]


def test_graceful_stop_closes_client_connections_with_320(fresh_broker):
    """On shutdown RabbitMQ closes every client connection with 320 CONNECTION_FORCED
    'broker forced connection closure with reason 'shutdown''."""
    connection = connect(fresh_broker)
    connection.channel()
    fresh_broker.process.send_signal(signal.SIGTERM)
    with pytest.raises(pe.ConnectionClosedByBroker) as info:
        for _ in range(100):
            connection.process_data_events(time_limit=0.05)
    assert (info.value.reply_code, info.value.reply_text) == (
        320, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")
    assert fresh_broker.stop() == 0
    fresh_broker.start()
    connection = connect(fresh_broker)
    assert connection.is_open
    connection.close()


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
@pytest.mark.parametrize("kill", RESTARTS)
def test_message_ttl_counts_from_the_publish_across_a_restart(fresh_broker, kill,
                                                              queue_type):
    """Message TTL across a restart: a quorum queue computes the expiry from the time
    in the message's log entry (the quorum queues guide, "Queue and Per-Message
    TTL"), a durable classic queue writes it with the persistent message (the message
    store's ENQUEUE_EXPIRING record), so a restart neither forgets it nor restarts
    it; the expired message is dead-lettered after the restart with x-death reason
    expired, and the one with a long TTL stays."""
    import time

    connection = connect(fresh_broker)
    channel = confirmed_channel(connection)
    channel.queue_declare("ttl.dead", durable=True, arguments={"x-queue-type": queue_type})
    channel.queue_declare("ttl", durable=True, arguments={
        "x-queue-type": queue_type, "x-message-ttl": 600_000,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "ttl.dead"})
    channel.basic_publish("", "ttl", b"short", pika.BasicProperties(delivery_mode=2,
                                                                     expiration="1500"))
    channel.basic_publish("", "ttl", b"long", PERSISTENT)
    restart(fresh_broker, kill, connection)

    connection = connect(fresh_broker)
    channel = connection.channel()
    deadline = time.monotonic() + 30  # expiry runs on the leader's tick (about 1 s)
    method = None
    while method is None:
        assert time.monotonic() < deadline, "the expired message was not dead-lettered"
        method, properties, body = channel.basic_get("ttl.dead", auto_ack=True)
        time.sleep(0.05)
    assert body == b"short" and properties.headers["x-death"][0]["reason"] == "expired"
    assert properties.headers["x-death"][0]["original-expiration"] == "1500"
    assert drain_bodies(channel, "ttl") == [(b"long", False)]
    connection.close()

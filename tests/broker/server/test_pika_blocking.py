"""pika's BlockingConnection against the bundled broker, as a RabbitMQ user sees it:
connecting and logging in, publishing (properties, returns, direct reply-to),
publisher confirms, transactions, framing of large bodies, heartbeats.

Every test drives a real pika client over TCP and asserts only what the client
observes: methods, reply codes and texts, deliveries, exceptions. Each docstring
names the AMQP 0-9-1 rule or RabbitMQ behaviour it checks; RabbitMQ 3.10.8 gives
the same observations. Exchanges, queues and consumers have their own files
(test_pika_blocking_*.py).
"""

from __future__ import annotations

import time
import uuid

import pika
import pytest
from pika import exceptions as pe

from .pika_support import (Collector, channel_error, connect, get_bodies, idle, publish_bodies,
                          pump, ready_count, unique)

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- connection


def test_plain_login_opens_connection_with_rabbitmq_capabilities(connection):
    """connection.start/start-ok (PLAIN), tune, open: the server's capabilities table
    advertises the RabbitMQ extensions pika keys off."""
    assert connection.is_open
    assert connection.publisher_confirms_supported
    assert connection.basic_nack_supported
    assert connection.consumer_cancel_notify_supported
    assert connection.exchange_exchange_bindings_supported


def test_bad_password_is_refused_with_403(broker):
    """RabbitMQ with authentication_failure_close: connection.close 403 ACCESS_REFUSED
    during start-ok, which pika reports as an authentication error."""
    parameters = pika.URLParameters(broker.uri)
    parameters.credentials = pika.PlainCredentials("guest", "wrong")
    with pytest.raises((pe.ProbableAuthenticationError, pe.AuthenticationError)) as info:
        pika.BlockingConnection(parameters)
    assert "403" in str(info.value)
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(
        info.value)


def test_unknown_vhost_is_refused_with_530(broker):
    """connection.open on a missing vhost: RabbitMQ closes with 530 NOT_ALLOWED
    'vhost ... not found'; pika reports a probable access-denied error."""
    parameters = pika.URLParameters(broker.uri)
    parameters.virtual_host = "no-such-vhost"
    with pytest.raises(pe.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(parameters)
    assert "530" in str(info.value)
    assert "NOT_ALLOWED - vhost no-such-vhost not found" in str(info.value)


# ---------------------------------------------------------------- publishing


def test_message_properties_round_trip(channel):
    """basic.publish content header: every basic property and nested header tables come
    back unchanged in basic.get-ok."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    sent = pika.BasicProperties(
        content_type="application/json", content_encoding="gzip",
        headers={"int": 1, "text": "s", "nested": {"list": [1, "x", True]}, "none": None,
                 "big": 2 ** 40},
        delivery_mode=2, priority=3, correlation_id="cid", reply_to="somewhere",
        expiration="60000", message_id="mid", timestamp=1700000000, type="kind",
        user_id="guest", app_id="app", cluster_id="cluster")
    channel.basic_publish("", queue, b"{}", sent)
    _, received, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"{}"
    for name in ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                 "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                 "type", "user_id", "app_id", "cluster_id"):
        assert getattr(received, name) == getattr(sent, name), name


def test_user_id_must_match_the_login_406(channel):
    """RabbitMQ validated user-id: a user_id property other than the authenticated
    user is 406."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"x", pika.BasicProperties(user_id="guest"))
    channel.basic_publish("", queue, b"x", pika.BasicProperties(user_id="mallory"))
    error = channel_error(lambda: channel.queue_declare("", exclusive=True))
    assert (error.reply_code, error.reply_text) == (
        406, "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user "
        "was 'guest'")


def test_mandatory_returns_without_confirms(connection):
    """basic.return (312 NO_ROUTE) carries the exchange, routing key and body of a
    mandatory message no queue took; pika calls the on-return callback."""
    channel = connection.channel()
    returned = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append(
        (method.reply_code, method.reply_text, method.exchange, method.routing_key, body)))
    channel.basic_publish("amq.fanout", "rk", b"x", mandatory=True)
    channel.basic_publish("", unique("no-queue"), b"y", mandatory=True)
    pump(connection, lambda: len(returned) == 2)
    assert returned[0] == (312, "NO_ROUTE", "amq.fanout", "rk", b"x")
    assert returned[1][:2] == (312, "NO_ROUTE") and returned[1][4] == b"y"


def test_mandatory_unroutable_is_returned_before_the_confirm(channel):
    """basic.publish mandatory=true with no route: basic.return (312 NO_ROUTE) arrives
    before the publisher confirm, so pika raises UnroutableError for that publish."""
    channel.confirm_delivery()
    exchange = unique("nowhere")
    channel.exchange_declare(exchange, "direct")
    with pytest.raises(pe.UnroutableError) as info:
        channel.basic_publish(exchange, "no-binding", b"bounce", mandatory=True)
    [returned] = info.value.messages
    assert (returned.method.reply_code, returned.method.reply_text) == (312, "NO_ROUTE")
    assert (returned.method.exchange, returned.method.routing_key) == (exchange, "no-binding")
    assert returned.body == b"bounce"
    channel.basic_publish(exchange, "no-binding", b"dropped-silently")  # not mandatory
    channel.exchange_delete(exchange)


def test_immediate_publish_closes_connection_540(connection):
    """basic.publish immediate=true: RabbitMQ 3 does not implement it and closes the
    connection with 540 NOT_IMPLEMENTED."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    # pika's API has no immediate flag; send the method through its channel impl
    channel._impl._send_method(  # noqa: SLF001
        pika.spec.Basic.Publish(exchange="", routing_key=queue, immediate=True),
        (pika.BasicProperties(), b"now"))
    with pytest.raises(pe.ConnectionClosedByBroker) as info:
        pump(connection, lambda: False)  # until the broker closes it
    assert info.value.reply_code == 540
    assert info.value.reply_text == "NOT_IMPLEMENTED - immediate=true"


def test_direct_reply_to_rpc_round_trip(broker, connection):
    """Direct reply-to (RabbitMQ): a client consuming amq.rabbitmq.reply-to (no-ack)
    publishes with reply_to=amq.rabbitmq.reply-to; the server sees a generated
    amq.rabbitmq.reply-to.* name and replies to it through the default exchange."""
    client = connection.channel()
    service_queue = unique("rpc-service")
    client.queue_declare(service_queue)
    replies = Collector()
    client.basic_consume("amq.rabbitmq.reply-to", replies, auto_ack=True)
    client.basic_publish("", service_queue, b"ping", pika.BasicProperties(
        reply_to="amq.rabbitmq.reply-to", correlation_id="c-1"))

    server = connect(broker)
    try:
        server_channel = server.channel()
        method, properties, body = server_channel.basic_get(service_queue, auto_ack=True)
        assert body == b"ping"
        assert properties.reply_to.startswith("amq.rabbitmq.reply-to.")
        server_channel.basic_publish("", properties.reply_to, b"pong", pika.BasicProperties(
            correlation_id=properties.correlation_id))
        pump(connection, lambda: replies)
    finally:
        server.close()
    assert replies.bodies == [b"pong"]
    client.queue_delete(service_queue)


def test_direct_reply_to_needs_the_reply_consumer(channel):
    """Direct reply-to: publishing with reply_to=amq.rabbitmq.reply-to without first
    consuming from it is 406 'fast reply consumer does not exist'."""
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.basic_publish("", queue, b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    error = channel_error(lambda: channel.queue_declare("", exclusive=True))
    assert error.reply_code == 406
    assert error.reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist"


def test_direct_reply_to_pseudo_queue_declare(channel):
    """Direct reply-to: declaring amq.rabbitmq.reply-to (passive or not) answers with
    no messages and one consumer, as RabbitMQ does; a consumer must be no-ack (406)."""
    for passive in (True, False):
        ok = channel.queue_declare("amq.rabbitmq.reply-to", passive=passive).method
        assert (ok.queue, ok.message_count, ok.consumer_count) == (
            "amq.rabbitmq.reply-to", 0, 1)
    error = channel_error(lambda: channel.basic_consume(
        "amq.rabbitmq.reply-to", lambda *a: None, auto_ack=False))
    assert (error.reply_code, error.reply_text) == (
        406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")


# ---------------------------------------------------------------- confirms and tx


def test_publisher_confirms_ack_every_publish(channel):
    """confirm.select (RabbitMQ extension): every routed or unroutable publish is
    acked; pika's blocking publish returns only after its ack."""
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True).method.queue
    for index in range(50):
        channel.basic_publish("", queue, str(index).encode())
    channel.basic_publish("", unique("no-such-queue"), b"unroutable-is-still-acked")
    assert ready_count(channel, queue) == 50


def test_publisher_confirm_nack_when_queue_rejects(channel):
    """x-overflow=reject-publish (RabbitMQ): a publish to a full queue is nacked, which
    pika's blocking channel raises as NackError."""
    channel.confirm_delivery()
    queue = channel.queue_declare("", exclusive=True, arguments={
        "x-max-length": 1, "x-overflow": "reject-publish"}).method.queue
    channel.basic_publish("", queue, b"fits")
    with pytest.raises(pe.NackError):
        channel.basic_publish("", queue, b"rejected")
    assert get_bodies(channel, queue) == [b"fits"]
    channel.basic_publish("", queue, b"fits-again")


def test_tx_commit_and_rollback(connection):
    """tx.select/commit/rollback: publishes and acks take effect at commit;
    rollback discards the publishes and acks made since the last commit."""
    tx = connection.channel()
    observer = connection.channel()
    queue = tx.queue_declare("", exclusive=True).method.queue
    tx.tx_select()
    tx.basic_publish("", queue, b"committed")
    assert ready_count(observer, queue) == 0
    tx.tx_commit()
    assert ready_count(observer, queue) == 1
    tx.basic_publish("", queue, b"rolled-back")
    tx.tx_rollback()
    assert ready_count(observer, queue) == 1

    method, _, body = tx.basic_get(queue)
    assert body == b"committed"
    tx.basic_ack(method.delivery_tag)
    tx.tx_rollback()   # the ack is undone: the delivery is unacked again
    assert ready_count(observer, queue) == 0
    tx.close()
    method, _, body = observer.basic_get(queue)
    assert (body, method.redelivered) == (b"committed", True)
    observer.basic_nack(method.delivery_tag, requeue=True)

    tx = connection.channel()
    tx.tx_select()
    method, _, _ = tx.basic_get(queue)
    tx.basic_ack(method.delivery_tag)
    tx.tx_commit()
    tx.close()   # the committed ack stands: nothing comes back
    assert ready_count(observer, queue) == 0


def test_tx_and_confirm_modes_exclude_each_other_406(connection):
    """tx.select after confirm.select and the reverse are 406 (RabbitMQ), and so is
    tx.commit on a non-transactional channel."""
    cases = [(lambda ch: (ch.tx_select(), ch.confirm_delivery()),
              "PRECONDITION_FAILED - cannot switch from tx to confirm mode"),
             (lambda ch: (ch.confirm_delivery(), ch.tx_select()),
              "PRECONDITION_FAILED - cannot switch from confirm to tx mode"),
             (lambda ch: ch.tx_commit(), "PRECONDITION_FAILED - channel is not transactional")]
    for action, text in cases:
        channel = connection.channel()
        error = channel_error(lambda: action(channel))
        assert (error.reply_code, error.reply_text) == (406, text)


def test_tx_mandatory_return_comes_at_commit(connection):
    """In a transaction a mandatory unroutable publish is returned when it is committed,
    not when it is published."""
    channel = connection.channel()
    returned = []
    channel.add_on_return_callback(lambda *args: returned.append(args[1].reply_code))
    channel.tx_select()
    channel.basic_publish("amq.direct", unique("nowhere"), b"x", mandatory=True)
    idle(connection)
    assert returned == []
    channel.tx_commit()
    pump(connection, lambda: returned)
    assert returned == [312]


# ---------------------------------------------------------------- framing and heartbeats


def test_large_message_spans_many_frames(connection):
    """A 1 MB body with frame_max 131072 is split into body frames and reassembled
    exactly (AMQP 4.2.6 content framing), both on publish and delivery."""
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    assert connection._impl.params.frame_max == 131072  # noqa: SLF001
    body = bytes(range(256)) * 4096
    channel.basic_publish("", queue, body)
    received = Collector()
    channel.basic_consume(queue, received, auto_ack=True)
    pump(connection, lambda: received)
    assert received.bodies[0] == body
    method, _, got = channel.basic_get(queue)
    assert method is None


@pytest.mark.parametrize("frame_max", [8192, 131072])
def test_bodies_at_frame_boundaries(broker, frame_max):
    """AMQP 4.2.6.2: a body frame carries at most frame_max - 8 octets; bodies of 0
    octets (no body frame), exactly one full frame, and one octet more or less
    arrive intact whatever frame_max the client negotiated."""
    conn = connect(broker, frame_max=frame_max)
    try:
        channel = conn.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        room = frame_max - 8
        sizes = [0, 1, room - 1, room, room + 1, 2 * room, 2 * room + 1, 5 * room + 3]
        bodies = [bytes([index % 251]) * size for index, size in enumerate(sizes)]
        publish_bodies(channel, queue, bodies)
        received = Collector()
        channel.basic_consume(queue, received, auto_ack=True)
        pump(conn, lambda: len(received) == len(bodies))
        assert [len(body) for body in received.bodies] == sizes
        assert received.bodies == bodies
    finally:
        conn.close()


def test_unicode_and_long_names(channel):
    """Queue and exchange names are UTF-8 short strings (up to 255 octets) and come back
    unchanged in declare-ok and deliveries."""
    queue = "очередь-キュー-" + uuid.uuid4().hex[:8]
    long_name = "q" * 255
    exchange = "обмен-" + uuid.uuid4().hex[:8]
    assert channel.queue_declare(queue, exclusive=True).method.queue == queue
    assert channel.queue_declare(long_name, exclusive=True).method.queue == long_name
    channel.exchange_declare(exchange, "topic")
    channel.queue_bind(queue, exchange, "ключ.#")
    channel.basic_publish(exchange, "ключ.один", "тело".encode())
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert (method.exchange, method.routing_key, body.decode()) == (exchange, "ключ.один",
                                                                    "тело")
    channel.exchange_delete(exchange)


def test_heartbeats_keep_an_idle_connection_alive(broker):
    """connection.tune heartbeat: pika asks for 2 s; over 5 s of idle time both sides
    exchange heartbeat frames and the connection stays usable."""
    conn = connect(broker, heartbeat=2)
    try:
        assert conn._impl.params.heartbeat == 2  # noqa: SLF001 - the negotiated value
        channel = conn.channel()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.25)
        assert conn.is_open
        checker = conn._impl._heartbeat_checker  # noqa: SLF001
        assert checker._heartbeat_frames_received >= 2  # noqa: SLF001 - broker sent some
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, b"still-alive")
        assert get_bodies(channel, queue) == [b"still-alive"]
    finally:
        conn.close()

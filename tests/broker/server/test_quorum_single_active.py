"""Single active consumer on quorum queues (x-single-active-consumer) through pika, as a
RabbitMQ user observes it. Spec: RabbitMQ's consumers guide, "Single Active Consumer"
(one consumer at a time, the others take over in registration order when it cancels
or its channel or connection goes away) and, for priorities, RabbitMQ 4.x's "Single
Active Consumer and Consumer Priorities" (a higher-priority consumer takes over once
the active one has no unacked messages). The machine's rules are in
broker/fifo/single_active.py; `queues list` names the active consumer
(`single_active_consumer_tag`, as RabbitMQ's management API does).

Every test declares its own queue; the restart test runs a broker of its own.
"""

from __future__ import annotations

import pika
import pytest
from pamqp import commands as amqp

from quorumqueue.client.management import call
from tests.differential.probe import Probe
from tests.support.broker import BrokerProcess

from .pika_support import Collector, channel_error, connect, idle, pump, unique

pytestmark = pytest.mark.timeout(120)

SAC = {"x-queue-type": "quorum", "x-single-active-consumer": True}
WAIT_S = 30.0  # generous: the machine is shared


def sac_queue(channel, prefix: str) -> str:
    name = unique(prefix)
    channel.queue_declare(name, durable=True, arguments=SAC)
    return name


def publish(connection, queue: str, bodies) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    channel.close()


def row(uri: str, name: str) -> dict:
    [found] = [r for r in call(uri, "queues.list", vhost="/") if r["name"] == name]
    return found


def consumer(connection, queue: str, tag: str, received: Collector, prefetch: int = 0,
             priority: int | None = None):
    channel = connection.channel()
    if prefetch:
        channel.basic_qos(prefetch_count=prefetch)
    arguments = {"x-priority": priority} if priority is not None else None
    channel.basic_consume(queue, received, consumer_tag=tag, arguments=arguments)
    return channel


def tags(received: Collector) -> list[str]:
    return [delivery[0] for delivery in received.deliveries]


def test_only_the_first_consumer_receives_and_the_second_takes_over_after_cancel(
        broker, connection):
    """Two consumers: every message goes to the first; `queues list` counts both and
    names the first (queue.declare-ok counts the active one, as RabbitMQ's
    rabbit_fifo query_stat). Once it cancels, the second gets what follows."""
    name = sac_queue(connection.channel(), "sac-cancel")
    received = Collector()
    first = consumer(connection, name, "first", received)
    consumer(connection, name, "second", received)
    publish(connection, name, [b"m1", b"m2", b"m3"])
    pump(connection, lambda: len(received) == 3, WAIT_S)
    idle(connection, 0.3)
    assert tags(received) == ["first"] * 3 and received.bodies == [b"m1", b"m2", b"m3"]
    listed = row(broker.uri, name)
    assert (listed["consumers"], listed["single_active_consumer_tag"]) == (2, "first")
    # declare-ok counts the active consumer only, as RabbitMQ's quorum queues do
    assert connection.channel().queue_declare(name, passive=True).method.consumer_count == 1
    for _tag, delivery_tag, _redelivered, _body in received.deliveries:
        first.basic_ack(delivery_tag)
    first.basic_cancel("first")
    publish(connection, name, [b"m4", b"m5"])
    pump(connection, lambda: len(received) == 5, WAIT_S)
    assert tags(received)[3:] == ["second", "second"]
    assert received.bodies[3:] == [b"m4", b"m5"]
    assert row(broker.uri, name)["single_active_consumer_tag"] == "second"


def test_a_dead_connection_hands_its_unacked_messages_to_the_next_consumer(
        broker, connection):
    """The active consumer's connection dies (its socket closes, no basic.cancel, no
    close handshake) holding two unacked messages: they come back (redelivered) to the
    next consumer first, then what was still queued behind them."""
    name = sac_queue(connection.channel(), "sac-dead")
    doomed = Probe.open(broker.uri, timeout=WAIT_S)
    doomed.call(1, amqp.Channel.Open())
    doomed.call(1, amqp.Basic.Qos(prefetch_count=2))
    doomed.call(1, amqp.Basic.Consume(queue=name, consumer_tag="first"))
    received = Collector()
    consumer(connection, name, "second", received, prefetch=10)
    publish(connection, name, [b"m1", b"m2", b"m3"])
    assert [(event["consumer_tag"], event["body"]) for event in doomed.collect(2)] == [
        ("first", b"m1"), ("first", b"m2")]
    idle(connection, 0.3)
    assert not received.deliveries
    doomed.sock.close()
    pump(connection, lambda: len(received) == 3, WAIT_S)
    assert [(d[0], d[2], d[3]) for d in received.deliveries] == [
        ("second", True, b"m1"), ("second", True, b"m2"), ("second", False, b"m3")]
    assert row(broker.uri, name)["single_active_consumer_tag"] == "second"


def test_a_higher_priority_consumer_takes_over_once_the_active_one_acked_everything(
        broker, connection):
    """RabbitMQ 4.x: a consumer with a higher x-priority registers while the active
    one holds unacked messages; the active one gets nothing more, and the new one
    takes over (and gets what waited) once they are acked."""
    name = sac_queue(connection.channel(), "sac-priority")
    received = Collector()
    low = consumer(connection, name, "low", received, prefetch=5, priority=1)
    publish(connection, name, [b"m1", b"m2"])
    pump(connection, lambda: len(received) == 2, WAIT_S)
    consumer(connection, name, "high", received, prefetch=5, priority=10)
    publish(connection, name, [b"m3"])
    idle(connection, 0.5)
    assert tags(received) == ["low", "low"], "the quiescing consumer got a new message"
    assert row(broker.uri, name)["single_active_consumer_tag"] == "low"
    low.basic_ack(received.deliveries[1][1], multiple=True)
    pump(connection, lambda: len(received) == 3, WAIT_S)
    assert received.deliveries[2][0] == "high" and received.deliveries[2][3] == b"m3"
    assert row(broker.uri, name)["single_active_consumer_tag"] == "high"


def test_redeclaring_without_the_argument_is_inequivalent(connection):
    """x-single-active-consumer is an equivalence-checked argument (RabbitMQ's
    rabbit_amqqueue:declare_args): a redeclare that leaves it out or changes it is 406
    with rabbit_misc's text (tests/differential checks the same against 3.10.8)."""
    name = sac_queue(connection.channel(), "sac-equiv")
    assert connection.channel().queue_declare(name, durable=True, arguments=SAC)
    channel = connection.channel()
    error = channel_error(lambda: channel.queue_declare(
        name, durable=True, arguments={"x-queue-type": "quorum"}))
    assert (error.reply_code, error.reply_text) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-single-active-consumer' for queue "
        f"'{name}' in vhost '/': received none but current is the value 'true' of type "
        "'bool'")


def test_after_kill_9_the_queue_is_still_single_active_consumer():
    """The flag and the consumers are in the queue's log: after kill -9 and a replay,
    the dead connections' consumers are gone (their unacked messages come back) and
    the queue still serves one consumer at a time, the first to register again."""
    with BrokerProcess() as broker:
        first_connection = connect(broker)
        name = sac_queue(first_connection.channel(), "sac-kill")
        received = Collector()
        consumer(first_connection, name, "before-a", received, prefetch=1)
        consumer(first_connection, name, "before-b", received, prefetch=1)
        publish(first_connection, name, [b"m1", b"m2", b"m3"])
        pump(first_connection, lambda: len(received) == 1, WAIT_S)
        broker.restart(kill=True)
        connection = connect(broker)
        after = Collector()
        consumer(connection, name, "after-a", after)
        consumer(connection, name, "after-b", after)
        pump(connection, lambda: len(after) == 3, WAIT_S)
        idle(connection, 0.3)
        assert tags(after) == ["after-a"] * 3
        assert after.bodies == [b"m1", b"m2", b"m3"] and after.deliveries[0][2]
        assert row(broker.uri, name)["single_active_consumer_tag"] == "after-a"
        connection.close()


def test_repeated_kill_9_counts_only_real_deliveries_toward_the_delivery_limit():
    """Three consumers on three connections, the active one holding 2 messages
    (prefetch 2), then kill -9, ten times. After each restart the dead consumers are
    removed without handing their messages to one another (broker/fifo/machine.py
    `stale_downs`): each crash adds 1 to the delivery count of the 2 held, nothing to
    the others. All 6 confirmed messages are still there, the 2 with
    x-delivery-count 10, under the default delivery limit (20). (Before, a restart
    made the dead consumers active one after another, each Down counting the messages
    again: the 2 were dropped after a few crashes.)"""
    with BrokerProcess() as broker:
        connection = connect(broker)
        name = sac_queue(connection.channel(), "sac-kills")
        publish(connection, name, [b"m%d" % n for n in range(6)])
        connection.close()
        for _run in range(10):
            connections, received = [], Collector()
            for n in range(3):
                run_connection = connect(broker)
                consumer(run_connection, name, f"c{n}", received, prefetch=2)
                connections.append(run_connection)
            pump(connections[0], lambda: len(received) == 2, WAIT_S)
            broker.restart(kill=True)
        connection = connect(broker)
        channel = connection.channel()
        headers = {}

        def record(channel, method, properties, body):
            headers[body] = (properties.headers or {}).get("x-delivery-count", 0)

        channel.basic_consume(name, record, auto_ack=True)
        pump(connection, lambda: len(headers) == 6, WAIT_S)
        assert headers == {b"m0": 10, b"m1": 10, b"m2": 0, b"m3": 0, b"m4": 0, b"m5": 0}
        connection.close()


def test_consumer_state_shows_the_replica_its_consumers_and_the_active_one(broker, connection):
    """`queues.consumer_state` (the fault suite's diagnosis of a failed run): this
    node's replica of the queue, its two consumers in registration order, the first
    active, nothing suspected, and a classic queue refused."""
    name = sac_queue(connection.channel(), "sac-state")
    received = Collector()
    consumer(connection, name, "first", received, prefetch=5)
    consumer(connection, name, "second", received, prefetch=5)
    publish(connection, name, [b"m1"])
    pump(connection, lambda: len(received) == 1, WAIT_S)
    state = call(broker.uri, "queues.consumer_state", vhost="/", name=name)
    assert (state["replica"], state["role"], state["ready"], state["unacked"]) == (
        True, "leader", 0, 1)
    keys = [c["key"] for c in state["consumers"]]
    assert [key.rpartition("/")[2] for key in keys] == ["first", "second"]
    assert state["active"] == keys[0]
    assert [(c["unacked"], c["prefetch"], c["suspected"], c["cancelled"])
            for c in state["consumers"]] == [(1, 5, False, False), (0, 5, False, False)]
    assert state["node"] in state["live"]
    connection.channel().queue_declare("classic-" + name)
    with pytest.raises(Exception, match="PRECONDITION_FAILED - Cannot get the consumer "
                                        "state of a classic queue"):
        call(broker.uri, "queues.consumer_state", vhost="/", name="classic-" + name)

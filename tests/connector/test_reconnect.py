"""Queries that ride out a broker restart (option reconnectTimeout, connector/reconnect.py).

Real processes: the bundled broker (support/broker.py) killed with SIGKILL and started
again on its data directory, a 3-node cluster (support/cluster.py) losing the node
the query is connected to and the queue's leader. A query reads a quorum queue in
lease mode and writes every message into a second queue with the quorumqueue sink,
so both sides retry; the second queue must then hold every message exactly once
(message ids compared). Kafka's source survives a broker restart the same way; a
broker that stays down past reconnectTimeout fails the query saying what to do.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Callable

import pika
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.datasource import ReadMaxRows

from quorumqueue.client.management import call
from quorumqueue.connector.lease_reader import LeaseStreamReader
from quorumqueue.connector.options import OptionError, parse_sink_options, parse_source_options
from quorumqueue.connector.publisher import ConfirmedPublisher, PublishError
from quorumqueue.connector.reconnect import BrokerLost
from quorumqueue.connector.sink_rows import returned_row
from tests.support.cluster import LocalCluster, wait_for

from .queues import order_numbers, publish_orders, unique
from .test_sink import bodies, outgoing

pytestmark = pytest.mark.timeout(300)

PER_TRIGGER = "40"


def declare(uri: str, *queues: str) -> None:
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        channel = connection.channel()
        for queue in queues:
            channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})


def ready(uri: str, queue: str) -> int:
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        return connection.channel().queue_declare(queue, passive=True).method.message_count


def message_ids(uri: str, queue: str) -> list[str]:
    """Every message of `queue`, taken (basic.get, auto-ack), by message id."""
    ids = []
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        channel = connection.channel()
        while True:
            method, properties, _body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return ids
            ids.append(properties.message_id)


def copy_query(spark, uri: str, source: str, target: str, checkpoint: str,
               reconnect_timeout: str = "60s"):
    """source -> the quorumqueue sink -> target, both retrying a lost broker."""
    return (spark.readStream.format("quorumqueue").option("uri", uri).option("queue", source)
            .option("maxMessagesPerTrigger", PER_TRIGGER)
            .option("reconnectTimeout", reconnect_timeout).load()
            .select("body", "message_id")
            .writeStream.format("quorumqueue").option("uri", uri).option("routingKey", target)
            .option("reconnectTimeout", reconnect_timeout)
            .option("checkpointLocation", checkpoint).start())


def wait_copied(query, count, uri_of, target: str, at_least: int,
                explain: Callable[[], str] | None = None) -> None:
    """Until `target` holds `at_least` messages; on a stall the error carries
    `explain()` (the query's progress, the queues and leases of every node...)."""
    def copied() -> bool:
        assert query.exception() is None, query.exception()
        return count(uri_of(), target) >= at_least
    try:
        wait_for(f"{at_least} messages in {target}", copied, timeout=180)
    except AssertionError as stalled:
        if explain is None:
            raise
        raise AssertionError(f"{stalled}\n{explain()}") from None


# ------------------------------------------------------------------ options (pure)


def test_reconnect_timeout_is_a_spark_duration_with_a_60s_default():
    base = {"uri": "amqp://h/%2F", "queue": "q"}
    assert parse_source_options(base).reconnect_timeout_ms == 60_000
    assert parse_source_options({**base, "reconnectTimeout": "5m"}).reconnect_timeout_ms \
        == 300_000
    assert parse_source_options({**base, "RECONNECTTIMEOUT": "0"}).reconnect_timeout_ms == 0
    assert parse_sink_options({"uri": "amqp://h/%2F", "routingKey": "q"}) \
        .reconnect_timeout_ms == 60_000
    assert parse_sink_options({"uri": "amqp://h/%2F", "routingKey": "q",
                               "reconnectTimeout": "90s"}).reconnect_timeout_ms == 90_000


@pytest.mark.parametrize("value", ["soon", "-1s", "never", "10 parsecs"])
def test_a_bad_reconnect_timeout_is_refused_naming_it(value):
    for parse, options in ((parse_source_options, {"queue": "q"}),
                           (parse_sink_options, {"routingKey": "q"})):
        with pytest.raises(OptionError, match=r"option 'reconnectTimeout' must be a duration"):
            parse({"uri": "amqp://h/%2F", "reconnectTimeout": value, **options})


# ------------------------------------------------------------------ the reader, in Spark's order


def test_the_driver_retries_a_killed_broker_and_logs_which_node_and_why(fresh_broker, caplog):
    queue = unique("orders")
    publish_orders(fresh_broker.uri, queue, range(12))
    reader = LeaseStreamReader(parse_source_options(
        {"uri": fresh_broker.uri, "queue": queue, "reconnectTimeout": "120s"}))
    start = reader.initialOffset()
    end1 = reader.latestOffset(start, ReadMaxRows(6))
    reader.commit(start)
    fresh_broker.stop(kill=True)
    restarted = threading.Event()

    def restart_once_retrying() -> None:
        # the broker comes back once the driver has said it is retrying
        wait_for("the driver's retry", lambda: "retrying every node" in caplog.text)
        fresh_broker.start()
        restarted.set()

    helper = threading.Thread(target=restart_once_retrying, daemon=True)
    with caplog.at_level(logging.WARNING, logger="quorumqueue.connector.reconnect"):
        helper.start()
        reader.commit(end1)                 # settles batch 0 once the broker is back
        end2 = reader.latestOffset(end1, ReadMaxRows(6))
    helper.join(120)
    assert restarted.is_set()
    node = f"amqp://guest:***@127.0.0.1:{fresh_broker.port}/%2F"
    assert f"lost the broker at {node}" in caplog.text or \
        f"lost the broker at every node" in caplog.text
    assert "option 'reconnectTimeout'" in caplog.text and "the broker is back" in caplog.text
    numbers = order_numbers(batch for part in reader.partitions(end1, end2)
                            for batch in reader.read(part))
    assert numbers == list(range(6, 12))
    reader.commit(end2)
    reader.stop()


def test_a_broker_down_past_reconnect_timeout_fails_the_read_saying_what_to_do(fresh_broker):
    queue = unique("orders")
    publish_orders(fresh_broker.uri, queue, range(4))
    reader = LeaseStreamReader(parse_source_options(
        {"uri": fresh_broker.uri, "queue": queue, "reconnectTimeout": "2s"}))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(2))
    fresh_broker.stop(kill=True)
    with pytest.raises(BrokerLost, match=r"stayed unreachable for 2s \(option "
                                         r"'reconnectTimeout'\).*Start the broker.*restart the "
                                         r"query from its checkpoint") as error:
        reader.latestOffset(end, ReadMaxRows(2))
    assert "guest:guest" not in str(error.value)
    reader.stop()


def test_a_sink_task_reconnects_and_publishes_its_unconfirmed_messages_once(
        fresh_broker, caplog):
    # The broker is killed after 300 of 1,000 rows were handed over; it comes back
    # once the task says it is retrying; the task publishes what was unconfirmed
    # again and the rest, and the queue holds every row once (idempotency keys).
    queue = unique("sink")
    declare(fresh_broker.uri, queue)
    pid = fresh_broker.process.pid
    kill_at_300 = lambda row: row == 300 and os.kill(pid, signal.SIGKILL)  # noqa: E731

    def restart_once_retrying() -> None:
        wait_for("the task's retry", lambda: "publishing its" in caplog.text)
        fresh_broker.stop()              # reap the killed process
        fresh_broker.start()

    options = parse_sink_options({"uri": fresh_broker.uri, "routingKey": queue})
    helper = threading.Thread(target=restart_once_retrying, daemon=True)
    with caplog.at_level(logging.WARNING, logger="quorumqueue.connector.reconnect"):
        helper.start()
        published = ConfirmedPublisher(options.addresses, False, 30.0, returned_row,
                                       reconnect_timeout_s=120.0).run(
            outgoing(queue, 1000, after=kill_at_300))
    helper.join(120)
    assert published == 1000
    assert "quorumqueue sink (executor task): lost the broker at amqp://guest:***@" in caplog.text
    assert bodies(fresh_broker.uri, queue) == [b"%d" % n for n in range(1000)]


def test_a_sink_task_gives_up_after_reconnect_timeout_saying_what_to_do():
    options = parse_sink_options({"uri": "amqp://guest:secret@127.0.0.1:1/%2F",
                                  "routingKey": "q", "reconnectTimeout": "1s"})
    publisher = ConfirmedPublisher(options.addresses, False, 5.0, returned_row,
                                   options.reconnect_timeout_ms / 1000)
    with pytest.raises(PublishError, match=r"cannot connect to the broker \(option 'uri'\): "
                                           r"amqp://guest:\*\*\*@127.0.0.1:1/%2F.*retried "
                                           r"every node for 1s, option 'reconnectTimeout': "
                                           r"start the broker"):
        publisher.run(outgoing("q", 3))


# ------------------------------------------------------------------ real queries


def test_a_query_rides_out_kill_9_and_restart_of_its_broker_exactly_once(
        spark, fresh_broker, tmp_path):
    source, target = unique("orders"), unique("copy")
    uri = fresh_broker.uri
    declare(uri, source, target)
    publish_orders(uri, source, range(200), declare=False)
    query = copy_query(spark, uri, source, target, str(tmp_path / "checkpoint"))
    try:
        wait_copied(query, ready, lambda: uri, target, 40)
        fresh_broker.restart(kill=True)    # SIGKILL mid-stream, same data directory
        publish_orders(uri, source, range(200, 400), declare=False)
        wait_copied(query, ready, lambda: uri, target, 400)
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    ids = message_ids(uri, target)
    assert sorted(ids) == sorted(f"order-{n}" for n in range(400))   # each exactly once


def test_a_broker_down_past_reconnect_timeout_fails_the_query_saying_what_to_do(
        spark, fresh_broker, tmp_path):
    source, target = unique("orders"), unique("copy")
    declare(fresh_broker.uri, source, target)
    publish_orders(fresh_broker.uri, source, range(40), declare=False)
    query = copy_query(spark, fresh_broker.uri, source, target, str(tmp_path / "checkpoint"),
                       reconnect_timeout="3s")
    # the text Spark logs: the query's error with the JVM causes, where Python's is
    spark.conf.set("spark.sql.pyspark.jvmStacktrace.enabled", "true")
    try:
        wait_copied(query, ready, lambda: fresh_broker.uri, target, 40)
        fresh_broker.stop(kill=True)
        with pytest.raises(StreamingQueryException) as failure:
            query.awaitTermination(120)
        error = str(failure.value)
    finally:
        spark.conf.unset("spark.sql.pyspark.jvmStacktrace.enabled")
        query.stop()
    assert "BrokerLost" in error
    assert "the broker stayed unreachable for 3s (option 'reconnectTimeout')" in error
    assert "restart the query from its checkpoint" in error


def queue_ready_on_any_node(cluster):
    def count(_uri, queue) -> int:
        for uri in cluster.live_uris():
            try:
                for row in call(uri, "queues.list", vhost="/"):
                    if row["name"] == queue:
                        return row["ready"]
            except Exception:  # noqa: BLE001 - a node that is going down
                continue
        return -1
    return count


def leader_of(cluster, queue: str) -> str | None:
    for uri in cluster.live_uris():
        try:
            for row in call(uri, "cluster.status")["queues"]:
                if row["name"] == queue and row["leader"]:
                    return row["leader"]
        except Exception:  # noqa: BLE001 - a node that is going down
            continue
    return None


def stall_report(query, cluster, queues: tuple[str, ...]) -> str:
    """What a stalled cluster query's failure shows: the query's progress, then per
    node the queues' counts and leaders, its leases and the tail of its log."""
    lines = [f"query: active={query.isActive} status={query.status}"]
    for progress in (query.recentProgress or [])[-3:]:
        lines.append(f"progress: {json.dumps(progress, default=str)[:1500]}")
    for name in cluster.names:
        lines.append(f"--- {name}: {'running' if cluster.running(name) else 'down'}")
        if not cluster.running(name):
            continue
        uri = cluster.uri(name)
        for op, arguments in (("queues.list", {"vhost": "/"}), ("lease.list", {}),
                              ("cluster.status", {})):
            try:
                answer = call(uri, op, **arguments)
            except Exception as error:  # noqa: BLE001 - a report, whatever the node says
                answer = f"{type(error).__name__}: {error}"
            if op == "cluster.status" and isinstance(answer, dict):
                answer = {**answer, "queues": [row for row in answer.get("queues", [])
                                               if row.get("name") in queues]}
            elif isinstance(answer, list):
                answer = [row for row in answer if row.get("name", row.get("queue")) in queues]
            lines.append(f"{op}: {json.dumps(answer, default=str)[:3000]}")
        lines.append(f"log tail:\n{cluster.log(name, tail=6000)}")
    try:  # the query is stuck: taking the target's messages changes nothing
        ids = set(message_ids(cluster.live_uris()[0], queues[1]))
        lines.append(f"target {queues[1]}: {len(ids)} distinct messages, missing: "
                     f"{sorted(n for n in range(600) if f'order-{n}' not in ids)[:200]}")
    except Exception as error:  # noqa: BLE001
        lines.append(f"target not read: {error!r}")
    return "\n".join(lines)


def test_a_query_over_a_cluster_rides_out_kill_9_of_its_node_and_of_the_leader(
        spark, tmp_path):
    with LocalCluster(3, proxied=False) as cluster:
        wait_for("a metadata leader on every node", lambda: all(
            call(uri, "cluster.status")["metadata_leader"] for uri in cluster.uris()))
        source, target = unique("orders"), unique("copy")
        declare(cluster.uri(0), source, target)
        wait_for("leaders for both queues", lambda: leader_of(cluster, source)
                 and leader_of(cluster, target))
        leader = leader_of(cluster, source)
        connected = next(name for name in cluster.names if name != leader)
        # the query connects to a follower first; the leader is next in `uri`
        order = [connected, leader] + [n for n in cluster.names if n not in (connected, leader)]
        uri = ",".join(cluster.uris(order))
        publish_orders(cluster.uri(leader), source, range(200), declare=False)
        count = queue_ready_on_any_node(cluster)
        live = lambda: cluster.live_uris()[0]  # noqa: E731
        explain = lambda: stall_report(query, cluster, (source, target))  # noqa: E731
        query = copy_query(spark, uri, source, target, str(tmp_path / "checkpoint"))
        try:
            wait_copied(query, count, live, target, 40, explain)
            cluster.kill(connected)           # the node the driver and tasks talk to
            publish_orders(cluster.uri(leader), source, range(200, 400), declare=False)
            wait_copied(query, count, live, target, 240, explain)
            cluster.restart(connected)
            leader = leader_of(cluster, source)
            cluster.kill(leader)              # the queue's leader, now also connected
            publish_orders(live(), source, range(400, 600), declare=False)
            wait_copied(query, count, live, target, 600, explain)
            assert query.isActive and query.exception() is None
        finally:
            query.stop()
        ids = message_ids(live(), target)
        assert sorted(ids) == sorted(f"order-{n}" for n in range(600))

"""The Prometheus endpoint (broker/metrics/) of a running broker, read as a Prometheus
server reads it: the exposition text parsed with prometheus_client's parser, after
publishing and consuming with pika.

What an operator checks: a quorum queue's ready and unacked counts per queue
(/metrics/per-object, labels vhost and queue) and summed (/metrics), the publish,
confirm, deliver and ack counters (rabbitmq_global_*), connections and channels, the
Raft indexes moving as messages are committed, the node's memory and disk. The names
are rabbitmq_prometheus's (tests/differential/test_prometheus_against_rabbitmq.py
checks them against RabbitMQ 3.10.8).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from types import SimpleNamespace

import pika
import pytest

from quorumqueue.broker.config import ConfigError, Settings, load_settings
from quorumqueue.broker.metrics import http as metrics_http
from quorumqueue.broker.metrics.http import MetricsListener
from tests.broker.server.pika_support import pump, unique
from tests.support.prometheus import (broker_with_metrics, dashboard_queries, fetch,
                                      metrics_and_labels, scrape, value, wait_for)

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture(scope="module")
def metrics_broker():
    process, port = broker_with_metrics()
    with process:
        process.metrics_port = port
        yield process


@pytest.fixture
def channel(metrics_broker):
    connection = pika.BlockingConnection(pika.URLParameters(metrics_broker.uri))
    channel = connection.channel()
    channel.confirm_delivery()
    yield channel
    if connection.is_open:
        connection.close()


def publish(channel, queue: str, count: int) -> None:
    for n in range(count):
        channel.basic_publish("", queue, f"m{n}".encode())  # confirmed: waits for the ack


def test_ready_count_of_a_quorum_queue_after_publishing(metrics_broker, channel):
    queue = unique("qq-ready")
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    publish(channel, queue, 7)
    port = metrics_broker.metrics_port
    per_object = scrape(port, "/metrics/per-object")
    assert value(per_object, "rabbitmq_queue_messages_ready", vhost="/", queue=queue) == 7
    assert value(per_object, "rabbitmq_queue_messages_unacked", vhost="/", queue=queue) == 0
    assert value(per_object, "rabbitmq_queue_messages", vhost="/", queue=queue) == 7
    assert value(per_object, "rabbitmq_queue_messages_ready_bytes", vhost="/",
                 queue=queue) == len(b"m0") * 7
    # the aggregated endpoint sums the queues, without labels
    aggregated = scrape(port, "/metrics")
    assert value(aggregated, "rabbitmq_queue_messages_ready") >= 7
    assert all(labels == {} for labels, _v, _t in aggregated["rabbitmq_queue_messages_ready"])


def test_a_classic_queue_has_no_unacked_bytes_rather_than_a_wrong_zero(metrics_broker,
                                                                        channel):
    queue = unique("cq-bytes")
    channel.queue_declare(queue, durable=True)
    publish(channel, queue, 3)
    channel.basic_get(queue)  # one unacknowledged
    samples = scrape(metrics_broker.metrics_port, "/metrics/per-object")
    assert value(samples, "rabbitmq_queue_messages_unacked", vhost="/", queue=queue) == 1
    assert value(samples, "rabbitmq_queue_messages_ready_bytes", vhost="/", queue=queue) == 4
    for name in ("rabbitmq_queue_messages_unacked_bytes", "rabbitmq_queue_messages_bytes"):
        assert not [labels for labels, _v, _t in samples.get(name, ())
                    if labels["queue"] == queue]
    aggregated = scrape(metrics_broker.metrics_port, "/metrics")
    assert "rabbitmq_queue_messages_bytes" not in aggregated


def test_confirmed_and_received_totals_count_each_message(metrics_broker, channel):
    queue = unique("qq-confirm")
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    port = metrics_broker.metrics_port
    before = scrape(port, "/metrics")
    publish(channel, queue, 5)
    channel.basic_publish("", unique("nowhere"), b"dropped")  # routed to no queue
    after = scrape(port, "/metrics")

    def grew(name):
        return (value(after, name, protocol="amqp091")
                - value(before, name, protocol="amqp091"))

    assert grew("rabbitmq_global_messages_received_total") == 6
    assert grew("rabbitmq_global_messages_received_confirm_total") == 6
    assert grew("rabbitmq_global_messages_confirmed_total") == 6
    assert grew("rabbitmq_global_messages_routed_total") == 5
    assert grew("rabbitmq_global_messages_unroutable_dropped_total") == 1
    assert value(after, "rabbitmq_global_publishers", protocol="amqp091") >= 1


def test_deliveries_unacked_and_acks_of_a_consumer(metrics_broker, channel):
    queue = unique("qq-consume")
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    publish(channel, queue, 4)
    port = metrics_broker.metrics_port
    before = scrape(port, "/metrics")
    received = []
    channel.basic_qos(prefetch_count=10)
    tag = channel.basic_consume(queue, lambda ch, method, props, body: received.append(method))
    pump(channel.connection, lambda: len(received) == 4, timeout=30)
    held = scrape(port, "/metrics/per-object")
    assert value(held, "rabbitmq_queue_messages_unacked", vhost="/", queue=queue) == 4
    assert value(held, "rabbitmq_queue_messages_ready", vhost="/", queue=queue) == 0
    assert value(held, "rabbitmq_queue_consumers", vhost="/", queue=queue) == 1
    assert value(held, "rabbitmq_queue_messages_unacked_bytes", vhost="/", queue=queue) == 8
    assert value(held, "rabbitmq_queue_messages_bytes", vhost="/", queue=queue) == 8
    channel.basic_ack(received[-1].delivery_tag, multiple=True)
    after = wait_for(port, "/metrics/per-object", lambda s: value(
        s, "rabbitmq_queue_messages_unacked", vhost="/", queue=queue) == 0, timeout=30)
    quorum = dict(protocol="amqp091", queue_type="rabbit_quorum_queue")

    def grew(name):
        return value(after, name, **quorum) - value(before, name, **quorum)

    assert grew("rabbitmq_global_messages_delivered_total") == 4
    assert grew("rabbitmq_global_messages_delivered_consume_manual_ack_total") == 4
    assert grew("rabbitmq_global_messages_acknowledged_total") == 4
    assert value(after, "rabbitmq_queue_messages", vhost="/", queue=queue) == 0
    channel.basic_cancel(tag)
    channel.basic_publish("", queue, b"again")
    method, _props, _body = channel.basic_get(queue, auto_ack=True)
    assert method is not None
    got = scrape(port, "/metrics")
    assert (value(got, "rabbitmq_global_messages_delivered_get_auto_ack_total", **quorum)
            - value(before, "rabbitmq_global_messages_delivered_get_auto_ack_total",
                    **quorum)) == 1


def test_returned_and_redelivered_messages(metrics_broker, channel):
    queue = unique("qq-redeliver")
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    publish(channel, queue, 1)
    port = metrics_broker.metrics_port
    before = scrape(port, "/metrics")
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("", unique("nowhere"), b"back", mandatory=True)
    method, _props, _body = channel.basic_get(queue)
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _props, _body = channel.basic_get(queue, auto_ack=True)
    assert method.redelivered
    after = scrape(port, "/metrics")
    quorum = dict(protocol="amqp091", queue_type="rabbit_quorum_queue")
    assert (value(after, "rabbitmq_global_messages_unroutable_returned_total",
                  protocol="amqp091")
            - value(before, "rabbitmq_global_messages_unroutable_returned_total",
                    protocol="amqp091")) == 1
    assert (value(after, "rabbitmq_global_messages_redelivered_total", **quorum)
            - value(before, "rabbitmq_global_messages_redelivered_total", **quorum)) == 1
    assert (value(after, "rabbitmq_global_messages_delivered_total", **quorum)
            - value(before, "rabbitmq_global_messages_delivered_total", **quorum)) == 2
    # a nack is no acknowledgement
    assert (value(after, "rabbitmq_global_messages_acknowledged_total", **quorum)
            == value(before, "rabbitmq_global_messages_acknowledged_total", **quorum))


def test_raft_indexes_move_as_messages_are_committed(metrics_broker, channel):
    queue = unique("qq-raft")
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    port = metrics_broker.metrics_port
    labels = dict(vhost="/", queue=queue)
    before = scrape(port, "/metrics/per-object")
    publish(channel, queue, 10)
    after = scrape(port, "/metrics/per-object")
    commit = value(after, "rabbitmq_raft_log_commit_index", **labels)
    # every confirmed publish is a committed entry of the queue's log
    assert commit >= value(before, "rabbitmq_raft_log_commit_index", **labels) + 10
    assert value(after, "rabbitmq_raft_log_last_applied_index", **labels) == commit
    assert value(after, "rabbitmq_raft_log_last_written_index", **labels) >= commit
    assert value(after, "rabbitmq_raft_term_total", **labels) >= 1
    assert value(after, "rabbitmq_raft_log_snapshot_index", **labels) <= commit
    assert value(after, "rabbitmq_raft_entry_commit_latency_seconds", **labels) > 0
    types = {name: kind for name, rows in after.items() for _l, _v, kind in rows}
    assert types["rabbitmq_raft_term_total"] == "counter"
    assert types["rabbitmq_raft_log_commit_index"] == "gauge"


def test_connections_channels_and_the_node(metrics_broker):
    port = metrics_broker.metrics_port
    before = scrape(port, "/metrics")
    connection = pika.BlockingConnection(pika.URLParameters(metrics_broker.uri))
    try:
        connection.channel()
        connection.channel()
        during = scrape(port, "/metrics")
        assert value(during, "rabbitmq_connections") == value(before, "rabbitmq_connections") + 1
        assert value(during, "rabbitmq_channels") == value(before, "rabbitmq_channels") + 2
        assert (value(during, "rabbitmq_connections_opened_total")
                == value(before, "rabbitmq_connections_opened_total") + 1)
        assert (value(during, "rabbitmq_channels_opened_total")
                == value(before, "rabbitmq_channels_opened_total") + 2)
    finally:
        connection.close()
    after = wait_for(port, "/metrics", lambda s: value(s, "rabbitmq_connections")
                     == value(before, "rabbitmq_connections"), timeout=30)
    assert (value(after, "rabbitmq_connections_closed_total")
            == value(before, "rabbitmq_connections_closed_total") + 1)
    assert value(after, "rabbitmq_process_resident_memory_bytes") > 10 * 2 ** 20
    assert value(after, "rabbitmq_resident_memory_limit_bytes") > 0
    assert value(after, "rabbitmq_disk_space_available_bytes") > 0
    assert value(after, "rabbitmq_alarms_memory_used_watermark") == 0
    assert value(after, "rabbitmq_alarms_free_disk_space_watermark") == 0
    identity = after["rabbitmq_identity_info"][0][0]
    assert identity["rabbitmq_node"].startswith("quorumqueue@")
    assert identity["rabbitmq_cluster"] == "quorumqueue"


def test_detailed_endpoint_returns_the_families_asked_for(metrics_broker, channel):
    queue = unique("qq-detailed")
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    publish(channel, queue, 3)
    port = metrics_broker.metrics_port
    samples = scrape(port, "/metrics/detailed?family=queue_coarse_metrics&vhost=/")
    assert value(samples, "rabbitmq_detailed_queue_messages_ready", vhost="/",
                 queue=queue) == 3
    assert "rabbitmq_detailed_queue_consumers" not in samples
    assert "rabbitmq_queue_messages_ready" not in samples
    other = scrape(port, "/metrics/detailed?family=queue_coarse_metrics&vhost=other")
    assert "rabbitmq_detailed_queue_messages_ready" not in other or not any(
        labels.get("queue") == queue
        for labels, _v, _t in other["rabbitmq_detailed_queue_messages_ready"])


def test_openmetrics_when_the_scraper_asks_for_it(metrics_broker):
    body, content_type = fetch(metrics_broker.metrics_port, "/metrics",
                               accept="application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith("# EOF\n")
    text, text_type = fetch(metrics_broker.metrics_port, "/metrics")
    assert text_type.startswith("text/plain; version=0.0.4")


# ---------------------------------------------------------------- the listener's port


def test_port_key_is_validated(tmp_path):
    config = tmp_path / "broker.toml"
    config.write_text("prometheus.tcp.port = 70000\n")
    with pytest.raises(ConfigError, match="prometheus.tcp.port"):
        load_settings(str(config))


def _held_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def _listener(settings: Settings) -> MetricsListener:
    return MetricsListener(SimpleNamespace(settings=settings))


def test_a_configured_port_that_is_taken_stops_the_start(tmp_path):
    with _held_port() as holder:
        port = holder.getsockname()[1]
        settings = Settings(data_dir=str(tmp_path), prometheus_port=port,
                            configured_keys=frozenset({"prometheus.tcp.port"}))
        with pytest.raises(ConfigError, match=f"prometheus.tcp.port: cannot listen on "
                                              f"127.0.0.1:{port}"):
            asyncio.run(_listener(settings).start())


def test_another_port_given_on_the_command_line_must_be_free(tmp_path):
    with _held_port() as holder:
        port = holder.getsockname()[1]
        settings = load_settings(None, data_dir=str(tmp_path), prometheus_port=port)
        with pytest.raises(ConfigError, match="prometheus.tcp.port: cannot listen"):
            asyncio.run(_listener(settings).start())


def test_the_default_port_taken_is_logged_and_skipped(tmp_path, caplog, monkeypatch):
    """Several nodes of one host (tests) cannot all have 15692: a node that did not ask
    for the port runs without metrics, and says so. (The port held here plays the
    default one: 15692 itself may be free or not on a test machine.)"""
    with _held_port() as holder:
        port = holder.getsockname()[1]
        monkeypatch.setattr(metrics_http, "DEFAULT_PORT", port)
        listener = _listener(Settings(data_dir=str(tmp_path), prometheus_port=port))
        with caplog.at_level(logging.WARNING, logger="quorumqueue.broker"):
            asyncio.run(listener.start())
    assert listener.port is None
    assert "Prometheus metrics are off" in caplog.text
    assert "prometheus.tcp.port" in caplog.text


# ---------------------------------------------------------------- the Grafana dashboard

def test_every_metric_the_dashboard_queries_is_exported(metrics_broker, channel):
    """The dashboard reads /metrics/per-object (its description says so): each metric
    name in its PromQL is a sample of that endpoint once a quorum queue has messages,
    and each label it filters or groups by is on a sample of the metrics it names."""
    queue = unique("qq-dashboard")
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    publish(channel, queue, 2)
    channel.basic_get(queue, auto_ack=False)
    samples = scrape(metrics_broker.metrics_port, "/metrics/per-object")
    queries = dashboard_queries()
    assert len(queries) >= 15
    used = set()
    for query in queries:
        names, wanted = metrics_and_labels(query)
        assert names, f"no rabbitmq_ metric in {query!r}"
        missing = names - set(samples)
        assert not missing, f"{query!r} queries {missing}, which are not exported"
        labels = set().union(*({k for labels, _v, _t in samples[n] for k in labels}
                               for n in names))
        assert wanted <= labels, f"{query!r} uses labels {wanted - labels} no sample has"
        used |= names
    # the quorum-queue panels the dashboard is for
    assert {"rabbitmq_queue_messages_ready", "rabbitmq_queue_messages_unacked",
            "rabbitmq_global_messages_received_total",
            "rabbitmq_global_messages_confirmed_total",
            "rabbitmq_global_messages_delivered_total",
            "rabbitmq_raft_entry_commit_latency_seconds", "rabbitmq_raft_term_total",
            "rabbitmq_raft_log_commit_index", "rabbitmq_raft_log_snapshot_index",
            "rabbitmq_process_resident_memory_bytes"} <= used

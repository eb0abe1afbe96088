"""Differential test of the Prometheus endpoint against RabbitMQ 3.10.8's rabbitmq_prometheus.

The same state is built on both brokers with pika — a quorum queue and a classic
queue, five confirmed publishes to each, one unacknowledged basic.get from the quorum
queue, a consumer of the classic queue that acked two of its five deliveries — and both
endpoints are scraped while that state holds. Then:

- every sample name quorumqueue exports on /metrics and on /metrics/per-object is
  exported by RabbitMQ on the same endpoint, with the same type and the same label
  names (except DELIBERATE_DIFFERENCES), so dashboards and alerts written for RabbitMQ
  find them; none of them is 4.x-only: all exist in 3.10.8. quorumqueue's own
  families (the event loop's lag) are named `quorumqueue_*`, a prefix RabbitMQ does
  not use;
- the values a user reads for that state (queue depths per queue, consumers, publish,
  confirm and deliver totals per queue type, channels, consumers, Raft term) are equal;
- conf/grafana's dashboard queries nothing RabbitMQ lacks.

RabbitMQ refreshes its queue metrics every few seconds (collect_statistics_interval):
its endpoint is scraped until it shows the state, within a generous bound.
"""

from __future__ import annotations

import pika
import pytest

from tests.support.prometheus import (RabbitMQWithPrometheus, broker_with_metrics,
                                      dashboard_queries, metrics_and_labels, scrape, value,
                                      wait_for)

QQ, CQ = "prometheus-qq", "prometheus-cq"

# (sample name, what differs) -> why
DELIBERATE_DIFFERENCES = {
    ("rabbitmq_build_info", "labels"):
        "quorumqueue has no Erlang: python_version in place of erlang_version "
        "(rabbitmq_version and prometheus_plugin_version carry quorumqueue's version, "
        "prometheus_client_version the Python client's)",
}

# quorumqueue's own families: RabbitMQ has nothing like them (broker/metrics/README.md)
OWN_PREFIX = "quorumqueue_"

# the samples whose values must be equal for the scenario's state: (endpoint, name,
# labels)
EQUAL_VALUES = [
    ("/metrics/per-object", "rabbitmq_queue_messages_ready", {"queue": QQ}),
    ("/metrics/per-object", "rabbitmq_queue_messages_ready", {"queue": CQ}),
    ("/metrics/per-object", "rabbitmq_queue_messages_unacked", {"queue": QQ}),
    ("/metrics/per-object", "rabbitmq_queue_messages_unacked", {"queue": CQ}),
    ("/metrics/per-object", "rabbitmq_queue_messages", {"queue": QQ}),
    ("/metrics/per-object", "rabbitmq_queue_messages", {"queue": CQ}),
    ("/metrics/per-object", "rabbitmq_queue_consumers", {"queue": CQ}),
    ("/metrics/per-object", "rabbitmq_raft_term_total", {"queue": QQ}),
    ("/metrics", "rabbitmq_queue_messages_ready", {}),
    ("/metrics", "rabbitmq_queue_messages_unacked", {}),
    ("/metrics", "rabbitmq_queue_messages", {}),
    ("/metrics", "rabbitmq_queues", {}),
    ("/metrics", "rabbitmq_connections", {}),
    ("/metrics", "rabbitmq_channels", {}),
    ("/metrics", "rabbitmq_consumers", {}),
    ("/metrics", "rabbitmq_global_publishers", {"protocol": "amqp091"}),
    ("/metrics", "rabbitmq_global_consumers", {"protocol": "amqp091"}),
    ("/metrics", "rabbitmq_global_messages_received_total", {"protocol": "amqp091"}),
    ("/metrics", "rabbitmq_global_messages_received_confirm_total", {"protocol": "amqp091"}),
    ("/metrics", "rabbitmq_global_messages_routed_total", {"protocol": "amqp091"}),
    ("/metrics", "rabbitmq_global_messages_confirmed_total", {"protocol": "amqp091"}),
    *[("/metrics", f"rabbitmq_global_messages_{name}_total",
       {"protocol": "amqp091", "queue_type": queue_type})
      for name in ("delivered", "delivered_consume_manual_ack", "delivered_get_manual_ack",
                   "acknowledged")
      for queue_type in ("rabbit_classic_queue", "rabbit_quorum_queue")],
    ("/metrics", "rabbitmq_alarms_memory_used_watermark", {}),
    ("/metrics", "rabbitmq_alarms_free_disk_space_watermark", {}),
]


def build_state(uri: str) -> pika.BlockingConnection:
    """The scenario's state, held by the returned connection."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    publisher = connection.channel()
    publisher.confirm_delivery()
    publisher.queue_declare(QQ, durable=True, arguments={"x-queue-type": "quorum"})
    publisher.queue_declare(CQ, durable=True)
    for n in range(5):
        publisher.basic_publish("", QQ, f"q{n}".encode())
        publisher.basic_publish("", CQ, f"c{n}".encode())
    method, _properties, _body = publisher.basic_get(QQ)  # held, unacknowledged
    assert method is not None
    consumer = connection.channel()
    received = []
    consumer.basic_consume(CQ, lambda ch, m, p, b: received.append(m))
    while len(received) < 5:
        connection.process_data_events(time_limit=0.1)
    consumer.basic_ack(received[1].delivery_tag, multiple=True)  # two acked, three held
    publisher.queue_declare(CQ, passive=True)  # a round trip: the acks are in
    return connection


def shows_state(samples: dict) -> bool:
    return (value(samples, "rabbitmq_queue_messages_ready", queue=QQ) == 4
            and value(samples, "rabbitmq_queue_messages_unacked", queue=QQ) == 1
            and value(samples, "rabbitmq_queue_messages_unacked", queue=CQ) == 3
            and value(samples, "rabbitmq_queue_consumers", queue=CQ) == 1)


@pytest.fixture(scope="module")
def scrapes():
    """{"rabbitmq"|"quorumqueue": {endpoint: samples}} for the scenario's state."""
    if not RabbitMQWithPrometheus.available():
        pytest.skip(RabbitMQWithPrometheus.skip_reason)
    result = {}
    with RabbitMQWithPrometheus() as rabbitmq:
        connection = build_state(rabbitmq.uri)
        try:
            port = rabbitmq.prometheus_port
            per_object = wait_for(port, "/metrics/per-object", shows_state, timeout=90)
            result["rabbitmq"] = {"/metrics/per-object": per_object,
                                  "/metrics": scrape(port, "/metrics")}
        finally:
            connection.close()
    broker, port = broker_with_metrics()
    with broker:
        connection = build_state(broker.uri)
        try:
            per_object = wait_for(port, "/metrics/per-object", shows_state, timeout=30)
            result["quorumqueue"] = {"/metrics/per-object": per_object,
                                     "/metrics": scrape(port, "/metrics")}
        finally:
            connection.close()
    return result


def _shapes(samples: dict) -> dict:
    """{sample name: (family type, {label name sets})}."""
    return {name: (rows[0][2], {frozenset(labels) for labels, _v, _t in rows})
            for name, rows in samples.items()}


@pytest.mark.parametrize("endpoint", ["/metrics", "/metrics/per-object"])
def test_every_exported_name_exists_in_rabbitmq_with_its_type_and_labels(scrapes, endpoint):
    ours = _shapes(scrapes["quorumqueue"][endpoint])
    theirs = _shapes(scrapes["rabbitmq"][endpoint])
    assert not any(name.startswith(OWN_PREFIX) for name in theirs)
    own = {name for name in ours if name.startswith(OWN_PREFIX)}
    assert "quorumqueue_event_loop_lag_seconds_count" in own
    ours = {name: shape for name, shape in ours.items() if name not in own}
    missing = sorted(set(ours) - set(theirs))
    assert not missing, f"not exported by RabbitMQ 3.10.8 on {endpoint}: {missing}"
    wrong_type = {name: (kind, theirs[name][0]) for name, (kind, _l) in ours.items()
                  if kind != theirs[name][0]}
    assert not wrong_type, f"types differ (ours, RabbitMQ's): {wrong_type}"
    wrong_labels = {name: (labels, theirs[name][1]) for name, (_k, labels) in ours.items()
                    if labels != theirs[name][1]}
    for name, what in DELIBERATE_DIFFERENCES:
        assert what == "labels"
        assert name in wrong_labels, f"{name}: no longer differs, drop its entry"
        del wrong_labels[name]
    assert not wrong_labels, f"label names differ (ours, RabbitMQ's): {wrong_labels}"


@pytest.mark.parametrize("endpoint,name,labels", EQUAL_VALUES,
                         ids=[f"{e}:{n}{sorted(l.values())}" for e, n, l in EQUAL_VALUES])
def test_values_for_the_same_state_are_rabbitmqs(scrapes, endpoint, name, labels):
    expected = value(scrapes["rabbitmq"][endpoint], name, **labels)
    assert value(scrapes["quorumqueue"][endpoint], name, **labels) == expected


def test_the_dashboard_works_against_rabbitmq_too(scrapes):
    """conf/grafana's dashboard queries only names and labels RabbitMQ's per-object
    endpoint has as well: it shows a RabbitMQ cluster's quorum queues unchanged."""
    samples = scrapes["rabbitmq"]["/metrics/per-object"]
    for query in dashboard_queries():
        names, wanted = metrics_and_labels(query)
        assert names <= set(samples), f"{query!r}: {names - set(samples)} not in RabbitMQ's"
        labels = set().union(*({k for labels, _v, _t in samples[n] for k in labels}
                               for n in names))
        assert wanted <= labels, f"{query!r}: labels {wanted - labels} not in RabbitMQ's"

"""The main job's embedded broker (jobs/embedded_broker.py) binds no fixed port: its
AMQP listener, management API and Prometheus endpoint all take free ports, so `make
main` runs beside a local RabbitMQ (15672, 15692) or a second `make main`."""

from __future__ import annotations

import re

import pika

from quorumqueue.jobs.embedded_broker import EmbeddedBroker

RABBITMQ_PORTS = {5672, 15672, 15692}


def test_the_embedded_broker_listens_on_free_ports_only(tmp_path):
    with EmbeddedBroker(tmp_path / "broker") as broker:
        pika.BlockingConnection(pika.URLParameters(broker.uri)).close()
        log = broker.log_path.read_text(errors="replace")
    management = re.search(r"HTTP \(non-TLS\) listener started on 127\.0\.0\.1:(\d+)", log)
    prometheus = re.search(r"Prometheus metrics listener on 127\.0\.0\.1:(\d+)", log)
    assert management and prometheus, log[-2000:]
    ports = {broker.port, int(management.group(1)), int(prometheus.group(1))}
    assert len(ports) == 3 and not ports & RABBITMQ_PORTS, ports

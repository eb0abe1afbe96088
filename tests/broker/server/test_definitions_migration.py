"""Blue-green migration on a running node: a RabbitMQ 3.13-shaped export with
mirroring policies is refused by import_definitions (naming the deprecated-feature
switch, nothing applied), and imports once transformed (`ctl transform_definitions`),
its mirrored classic queues then quorum queues and its policies free of ha-* keys."""

from __future__ import annotations

import json

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main

from tests.cli.test_definitions_transform import FULL, rabbitmq_313_export

from .test_definitions import ctl, ctl_error

pytestmark = pytest.mark.timeout(180)


def test_a_313_export_imports_only_after_the_transformations(fresh_broker, tmp_path):
    broker = fresh_broker
    raw = tmp_path / "rabbitmq-3.13.json"
    raw.write_text(json.dumps(rabbitmq_313_export()))
    refused = ctl_error(broker, "import_definitions", str(raw))
    assert "ha-mode" in refused
    assert "deprecated_features.permit.classic_queue_mirroring" in refused
    assert "orders" not in json.dumps(json.loads(ctl(broker, "export_definitions", "-")))

    ready = tmp_path / "ready.json"
    transformed = CliRunner().invoke(main, ["ctl", "transform_definitions",
                                            "--transformations", ",".join(FULL), str(raw),
                                            str(ready)])  # offline: no --uri
    assert transformed.exit_code == 0, transformed.output
    ctl(broker, "import_definitions", str(ready))

    exported = json.loads(ctl(broker, "export_definitions", "-"))
    queues = {(q["vhost"], q["name"]): q for q in exported["queues"]}
    for key in (("/", "orders"), ("/", "audit-log"), ("shop", "carts"), ("/", "orders-qq")):
        assert queues[key]["type"] == "quorum", key
    assert queues[("/", "orders-scratch")]["type"] == "classic"
    assert queues[("/", "plain")]["type"] == "classic"
    assert sorted(p["name"] for p in exported["policies"]) == ["ha-and-limit", "ttl"]
    for policy in exported["policies"]:
        assert not [k for k in policy["definition"] if k.startswith("ha-")]

    # a client sees a quorum queue: redeclaring it as classic is refused
    connection = pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{broker.port}/%2F"))
    try:
        channel = connection.channel()
        channel.queue_declare("orders", durable=True,
                              arguments={"x-queue-type": "quorum", "x-max-length": 7})
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
            connection.channel().queue_declare("orders", durable=True)
        assert error.value.reply_code == 406
    finally:
        connection.close()


def test_export_definitions_applies_transformations(broker):
    ctl(broker, "set_policy", "mig-ttl", "^mig-", '{"message-ttl": 5000}')
    plain = json.loads(ctl(broker, "export_definitions", "-"))
    moved = json.loads(ctl(broker, "export_definitions", "--transformations",
                           ",".join(FULL), "-"))
    assert moved == plain  # nothing of mirroring on a quorumqueue node: no change
    bad = ctl_error(broker, "export_definitions", "--transformations", "bogus", "-")
    assert "unknown transformation(s) bogus" in bad

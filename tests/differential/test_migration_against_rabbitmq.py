"""Blue-green migration from RabbitMQ 3.10.8's mirrored classic queues into quorumqueue.

On a RabbitMQ 3.10.8 node of this module's own, mirroring policies are set with
rabbitmqctl (`ha-mode all` is allowed on a single node there) and classic queues
declared by a client; `rabbitmqctl export_definitions` writes the export. quorumqueue
refuses that file as it is (its ha-* keys, naming the deprecated-feature switch); after
`quorumqueue ctl transform_definitions --transformations
prepare_for_quorum_queue_migration,strip_cmq_keys_from_policies,drop_empty_policies`
it imports, and the mirrored queues are quorum queues, the policies hold no ha-* key.
(Moving the messages, RabbitMQ's shovel, is not built: not covered here.)
"""

from __future__ import annotations

import json

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.broker.cli import main
from tests.support.broker import BrokerProcess

from .test_definitions_against_rabbitmq import qqctl, rabbitmq_node, rabbitmqctl  # noqa: F401

pytestmark = pytest.mark.timeout(400)

CHAIN = "prepare_for_quorum_queue_migration,strip_cmq_keys_from_policies,drop_empty_policies"


def test_a_rabbitmq_3108_export_with_mirroring_migrates(rabbitmq_node, tmp_path):  # noqa: F811
    node = rabbitmq_node
    rabbitmqctl(node, "add_vhost", "mig")
    rabbitmqctl(node, "set_permissions", "-p", "mig", "guest", ".*", ".*", ".*")
    rabbitmqctl(node, "set_policy", "-p", "mig", "--apply-to", "queues", "ha-orders",
                "^orders", '{"ha-mode": "all", "ha-sync-mode": "automatic"}')
    rabbitmqctl(node, "set_policy", "-p", "mig", "--apply-to", "queues", "--priority", "1",
                "ha-audit", "^audit", '{"ha-mode": "exactly", "ha-params": 2, '
                '"max-length": 100}')
    connection = pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{node.port}/mig"))
    channel = connection.channel()
    channel.queue_declare("orders", durable=True,
                          arguments={"x-queue-mode": "lazy", "x-max-length": 50})
    channel.queue_declare("audit-log", durable=True, arguments={"x-max-priority": 3})
    channel.queue_declare("plain", durable=True)
    connection.close()
    listed = rabbitmqctl(node, "list_queues", "-p", "mig", "name", "policy")
    assert "ha-orders" in listed and "ha-audit" in listed  # mirroring applied there

    raw = tmp_path / "rabbitmq.json"
    rabbitmqctl(node, "export_definitions", str(raw))
    exported = json.loads(raw.read_text())
    assert any("ha-mode" in p["definition"] for p in exported["policies"])

    ready = tmp_path / "ready.json"
    result = CliRunner().invoke(main, ["ctl", "transform_definitions", "--transformations",
                                       CHAIN, str(raw), str(ready)])
    assert result.exit_code == 0, result.output

    with BrokerProcess(data_dir=str(tmp_path / "qq")) as broker:
        refused = CliRunner().invoke(main, ["ctl", "import_definitions", str(raw),
                                            "--base-uri", broker.management_url])
        assert refused.exit_code != 0
        assert "deprecated_features.permit.classic_queue_mirroring" in refused.output
        qqctl(broker, "import_definitions", str(ready))
        after = json.loads(qqctl(broker, "export_definitions", "-p", "mig", "-"))
        queues = {q["name"]: q for q in after["queues"]}
        assert queues["orders"]["type"] == "quorum"
        assert queues["orders"]["arguments"] == {"x-queue-type": "quorum",
                                                 "x-max-length": 50}
        assert queues["audit-log"]["type"] == "quorum"
        assert "x-max-priority" not in queues["audit-log"]["arguments"]
        assert queues["plain"]["type"] == "classic"
        assert [(p["name"], p["definition"]) for p in after["policies"]] == [
            ("ha-audit", {"max-length": 100})]

"""RabbitMQ's own HTTP API client, unchanged, against quorumqueue: the `rabbitmqadmin`
script Debian's rabbitmq-server package installs (/usr/bin/rabbitmqadmin, 3.10.8)
lists, declares, deletes, publishes, gets and exports through the management API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess

from .support import wait_until_serving

RABBITMQADMIN = Path("/usr/bin/rabbitmqadmin")

pytestmark = pytest.mark.skipif(
    not RABBITMQADMIN.is_file() or not RABBITMQADMIN.read_text(errors="replace")
    .startswith("#!") or "python" not in RABBITMQADMIN.read_text(errors="replace")[:40],
    reason="Debian's rabbitmq-server package (rabbitmqadmin) is not installed; run "
           ".ci/install-rabbitmq")


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess() as process:
        wait_until_serving(process.management_url)
        yield process


def admin(broker, *arguments: str, check: bool = True) -> str:
    """Run the script with the system's python3, as an operator would."""
    result = subprocess.run(
        ["/usr/bin/python3", str(RABBITMQADMIN), "-H", "127.0.0.1", "-P",
         str(broker.management_port), "-u", "guest", "-p", "guest", *arguments],
        capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def rows(broker, *arguments: str) -> list[dict]:
    return json.loads(admin(broker, "-f", "raw_json", *arguments))


def test_declare_list_publish_get_delete(broker):
    assert "queue declared" in admin(broker, "declare", "queue", "name=adm-qq",
                                     "queue_type=quorum")
    assert "queue declared" in admin(broker, "declare", "queue", "name=adm-cq",
                                     "durable=false")
    assert "exchange declared" in admin(broker, "declare", "exchange", "name=adm-x",
                                        "type=fanout")
    assert "binding declared" in admin(broker, "declare", "binding", "source=adm-x",
                                       "destination=adm-qq", "routing_key=k")
    queues = {row["name"]: row for row in rows(broker, "list", "queues")}
    assert queues["adm-qq"]["type"] == "quorum" and queues["adm-cq"]["durable"] is False
    table = admin(broker, "list", "queues")
    assert "name" in table and "| messages |" in table and "| adm-qq | 0 " in table
    assert "adm-x" in admin(broker, "list", "exchanges")
    assert {"source": "adm-x", "destination": "adm-qq", "routing_key": "k"} in [
        {key: row[key] for key in ("source", "destination", "routing_key")}
        for row in rows(broker, "list", "bindings")]

    assert "Message published" in admin(broker, "publish", "exchange=adm-x",
                                        "routing_key=k", "payload=hello")
    assert "NOT routed" in admin(broker, "publish", "exchange=amq.direct",
                                 "routing_key=nowhere", "payload=x")
    got = rows(broker, "get", "queue=adm-qq", "ackmode=ack_requeue_true")
    assert [(row["payload"], row["exchange"], row["routing_key"]) for row in got] == [
        ("hello", "adm-x", "k")]
    got = rows(broker, "get", "queue=adm-qq", "ackmode=ack_requeue_false")
    assert got[0]["redelivered"] is True
    assert rows(broker, "get", "queue=adm-qq") == []  # acked: gone

    assert "binding deleted" in admin(broker, "delete", "binding", "source=adm-x",
                                      "destination_type=queue", "destination=adm-qq",
                                      "properties_key=k")
    assert "queue deleted" in admin(broker, "delete", "queue", "name=adm-cq")
    assert "exchange deleted" in admin(broker, "delete", "exchange", "name=adm-x")
    names = [row["name"] for row in rows(broker, "list", "queues")]
    assert "adm-cq" not in names and "adm-qq" in names
    assert "adm-x" not in [row["name"] for row in rows(broker, "list", "exchanges")]


def test_users_vhosts_permissions_policies(broker):
    assert "vhost declared" in admin(broker, "declare", "vhost", "name=adm-v")
    assert "user declared" in admin(broker, "declare", "user", "name=adm-u", "password=p",
                                    "tags=monitoring")
    assert "permission declared" in admin(broker, "declare", "permission", "vhost=adm-v",
                                          "user=adm-u", "configure=.*", "write=.*",
                                          "read=.*")
    assert "policy declared" in admin(broker, "declare", "policy", "-V", "adm-v",
                                      "name=adm-p", "pattern=^a",
                                      'definition={"max-length": 5}', "apply-to=queues")
    assert {"name": "adm-u", "tags": ["monitoring"]}.items() <= next(
        row for row in rows(broker, "list", "users") if row["name"] == "adm-u").items()
    assert "adm-v" in [row["name"] for row in rows(broker, "list", "vhosts")]
    assert {"user": "adm-u", "vhost": "adm-v", "configure": ".*", "write": ".*",
            "read": ".*"} in rows(broker, "list", "permissions")
    assert [(row["name"], row["definition"]) for row in rows(broker, "list", "policies")
            if row["vhost"] == "adm-v"] == [("adm-p", {"max-length": 5})]
    assert "operator_policy declared" in admin(broker, "declare", "operator_policy", "-V",
                                               "adm-v", "name=adm-op", "pattern=^a",
                                               'definition={"max-length": 3}',
                                               "apply-to=queues")
    assert [(row["name"], row["definition"]) for row in rows(broker, "list",
                                                            "operator_policies")
            if row["vhost"] == "adm-v"] == [("adm-op", {"max-length": 3})]
    assert "operator_policy deleted" in admin(broker, "delete", "operator_policy", "-V",
                                              "adm-v", "name=adm-op")
    assert [row for row in rows(broker, "list", "operator_policies")
            if row["vhost"] == "adm-v"] == []
    # a monitoring user is no administrator: rabbitmqadmin shows the 401 as refused
    refused = subprocess.run(
        ["/usr/bin/python3", str(RABBITMQADMIN), "-P", str(broker.management_port),
         "-u", "adm-u", "-p", "p", "list", "users"], capture_output=True, text=True,
        timeout=60)
    assert refused.returncode != 0 and "Access refused: /api/users" in refused.stdout + refused.stderr
    assert "policy deleted" in admin(broker, "delete", "policy", "-V", "adm-v", "name=adm-p")
    assert "user deleted" in admin(broker, "delete", "user", "name=adm-u")
    assert "vhost deleted" in admin(broker, "delete", "vhost", "name=adm-v")


def test_show_overview_list_nodes_and_export(broker, tmp_path):
    overview = admin(broker, "show", "overview")
    assert "rabbitmq_version" in overview and "cluster_name" in overview
    assert rows(broker, "list", "nodes")[0]["running"] is True
    admin(broker, "declare", "queue", "name=adm-export", "queue_type=quorum")
    target = tmp_path / "definitions.json"
    admin(broker, "export", str(target))
    document = json.loads(target.read_text())
    assert "adm-export" in [queue["name"] for queue in document["queues"]]
    assert [user["name"] for user in document["users"]] == ["guest"]


def test_the_script_is_the_unchanged_python_one():
    text = RABBITMQADMIN.read_text()
    assert text.startswith("#! /usr/bin/python3") or text.startswith("#!/usr/bin/python3")
    assert "VERSION = '3.10.8'" in text
    assert sys.version_info >= (3, 8)


def test_export_then_import_into_a_fresh_broker(broker, tmp_path):
    admin(broker, "declare", "vhost", "name=adm-roundtrip")
    admin(broker, "declare", "user", "name=adm-carol", "password=secret", "tags=management")
    admin(broker, "declare", "permission", "vhost=adm-roundtrip", "user=adm-carol",
          "configure=.*", "write=.*", "read=.*")
    admin(broker, "-V", "adm-roundtrip", "declare", "exchange", "name=rt-x", "type=direct")
    admin(broker, "-V", "adm-roundtrip", "declare", "queue", "name=rt-q", "queue_type=quorum")
    admin(broker, "-V", "adm-roundtrip", "declare", "binding", "source=rt-x",
          "destination=rt-q", "routing_key=rt")
    admin(broker, "declare", "policy", "-V", "adm-roundtrip", "name=rt-p", "pattern=^rt",
          'definition={"max-length": 7}', "apply-to=queues")
    target = tmp_path / "definitions.json"
    admin(broker, "export", str(target))
    with BrokerProcess() as fresh:
        wait_until_serving(fresh.management_url)
        assert "Uploaded definitions" in admin(fresh, "import", str(target))
        assert [row["name"] for row in rows(fresh, "-V", "adm-roundtrip", "list", "queues")] \
            == ["rt-q"]
        assert {"source": "rt-x", "destination": "rt-q", "routing_key": "rt"} in [
            {key: row[key] for key in ("source", "destination", "routing_key")}
            for row in rows(fresh, "-V", "adm-roundtrip", "list", "bindings")]
        assert [row["name"] for row in rows(fresh, "list", "policies")] == ["rt-p"]
        # the password hash travelled: carol logs in with her password
        whoami = subprocess.run(
            ["/usr/bin/python3", str(RABBITMQADMIN), "-P", str(fresh.management_port),
             "-u", "adm-carol", "-p", "secret", "-f", "raw_json", "list", "vhosts"],
            capture_output=True, text=True, timeout=60)
        assert whoami.returncode == 0, whoami.stdout + whoami.stderr
        assert [row["name"] for row in json.loads(whoami.stdout)] == ["adm-roundtrip"]

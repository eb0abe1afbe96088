"""Definitions move between RabbitMQ 3.10.8 and quorumqueue unchanged, both ways.

RabbitMQ -> quorumqueue: users (with limits and RabbitMQ's sha256 password hashes),
a vhost with limits, permissions, a policy, an operator policy, classic and quorum
queues, exchanges and bindings (queue and exchange destinations) are made with
rabbitmqctl and a client on a RabbitMQ node of this module's own (a fresh one: the
session's oracle holds other tests' leftovers), exported with `rabbitmqctl
export_definitions`, and imported as they are with `quorumqueue ctl
import_definitions`. quorumqueue's own export then holds the same objects, a client
logs in with the RabbitMQ user's password and its messages are routed the same way.

quorumqueue -> RabbitMQ: the same kinds of objects made on quorumqueue, exported with
`quorumqueue ctl export_definitions` and imported with `rabbitmqctl
import_definitions`: RabbitMQ's export then holds them, and the user logs in to
RabbitMQ with the password set on quorumqueue. (apply-to `quorum_queues` is left out
of this direction: RabbitMQ 3.10.8 predates it, 4.x accepts it.)
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import MARKER_VARIABLE, RabbitMQNode

pytestmark = pytest.mark.timeout(400)

RABBITMQCTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")


def rabbitmqctl(node: RabbitMQNode, *arguments: str) -> str:
    """rabbitmqctl against the node (its cookie under the node's HOME, its epmd)."""
    base = node.base_dir
    environment = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "TMPDIR")
                   if name in os.environ}
    environment.update(HOME=str(base / "home"), ERL_EPMD_PORT=str(node.epmd_port),
                       ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_USE_LONGNAME="false",
                       RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"))
    environment[MARKER_VARIABLE] = node.node_name
    done = subprocess.run([str(RABBITMQCTL), "-n", node.node_name, *arguments],
                          env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"rabbitmqctl {arguments}: {done.stdout}{done.stderr}"
    return done.stdout


def qqctl(broker, *arguments: str) -> str:
    result = CliRunner().invoke(main, ["ctl", *arguments, "--base-uri", broker.management_url])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def rabbitmq_node() -> Iterator[RabbitMQNode]:
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with RabbitMQNode() as node:
        yield node


def vhost_uri(port: int, user: str, password: str, vhost: str) -> str:
    return f"amqp://{user}:{password}@127.0.0.1:{port}/{vhost}"


def declare_topology(uri: str) -> None:
    """Exchanges, a classic and a quorum queue and bindings, through a client."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    channel.exchange_declare("events", "topic", durable=True)
    channel.exchange_declare("audit", "fanout", durable=True)
    channel.exchange_declare("by-kind", "headers", durable=True,
                             arguments={"alternate-exchange": "audit"})
    channel.queue_declare("orders", durable=True, arguments={"x-queue-type": "quorum",
                                                             "x-delivery-limit": 10})
    channel.queue_declare("audit-log", durable=True, arguments={"x-max-length": 500})
    channel.queue_bind("orders", "events", "order.#")
    channel.queue_bind("audit-log", "audit")
    channel.exchange_bind("audit", "events", "#")
    channel.queue_bind("audit-log", "by-kind", "", arguments={"x-match": "any", "kind": "a"})
    connection.close()


def check_routing(uri: str) -> None:
    """What a client of either broker sees of that topology."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    channel.queue_declare("orders", passive=True)
    channel.confirm_delivery()
    channel.basic_publish("events", "order.paid", b"o1", pika.BasicProperties(delivery_mode=2))
    channel.basic_publish("events", "stock.low", b"s1", pika.BasicProperties(delivery_mode=2))
    got = {}
    for queue in ("orders", "audit-log"):
        bodies = []
        while True:
            method, _properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            bodies.append(body)
        got[queue] = bodies
    assert got == {"orders": [b"o1"], "audit-log": [b"o1", b"s1"]}
    connection.close()


def section(document: dict, name: str, vhost: str) -> list:
    """A section's items of one vhost, in a comparable form: what both brokers write
    alike (RabbitMQ 3.10.8 leaves `internal` out of exchanges and keeps operator
    policies' definitions as lists of pairs)."""
    items = []
    for item in document[name]:
        if item.get("vhost") != vhost:
            continue
        item = dict(item)
        if name == "exchanges":
            item.pop("internal", None)
        if name == "parameters" and item["component"] == "operator_policy":
            value = dict(item["value"])
            if isinstance(value["definition"], list):
                value["definition"] = dict(value["definition"])
            item["value"] = value
        items.append(item)
    return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))


def user(document: dict, name: str) -> dict:
    return next(u for u in document["users"] if u["name"] == name)


SECTIONS = ("permissions", "policies", "parameters", "queues", "exchanges", "bindings")


def test_rabbitmq_definitions_import_into_quorumqueue_unchanged(rabbitmq_node, tmp_path):
    node = rabbitmq_node
    rabbitmqctl(node, "add_user", "alice", "alice-secret")
    rabbitmqctl(node, "set_user_tags", "alice", "management")
    rabbitmqctl(node, "set_user_limits", "alice", '{"max-connections": 5}')
    rabbitmqctl(node, "add_vhost", "shop")
    rabbitmqctl(node, "set_vhost_limits", "-p", "shop", '{"max-queues": 20}')
    rabbitmqctl(node, "set_permissions", "-p", "shop", "alice", "^alice-", ".*", ".*")
    rabbitmqctl(node, "set_permissions", "-p", "shop", "guest", ".*", ".*", ".*")
    rabbitmqctl(node, "set_policy", "-p", "shop", "--priority", "3", "--apply-to", "queues",
                "cap", "^audit", '{"max-length": 100, "overflow": "reject-publish"}')
    rabbitmqctl(node, "set_operator_policy", "-p", "shop", "--apply-to", "queues",
                "opcap", ".*", '{"max-length": 50}')
    declare_topology(vhost_uri(node.port, "guest", "guest", "shop"))
    path = tmp_path / "from-rabbitmq.json"
    rabbitmqctl(node, "export_definitions", str(path))
    theirs = json.loads(path.read_text())
    assert theirs["rabbitmq_version"] == "3.10.8"

    with BrokerProcess() as broker:
        out = qqctl(broker, "import_definitions", str(path))
        # what quorumqueue does not keep is said, not dropped silently
        assert "note: vhost '/': its description and tags are not kept" in out
        ours = json.loads(qqctl(broker, "export_definitions", "-"))
        for name in SECTIONS:
            assert section(ours, name, "shop") == section(theirs, name, "shop") != [], name
        for key in ("password_hash", "hashing_algorithm", "tags", "limits"):
            assert user(ours, "alice")[key] == user(theirs, "alice")[key], key
        # the RabbitMQ user logs in with its RabbitMQ password, within its permissions
        connection = pika.BlockingConnection(pika.URLParameters(
            vhost_uri(broker.port, "alice", "alice-secret", "shop")))
        connection.channel().queue_declare("alice-own", exclusive=True)
        connection.close()
        check_routing(vhost_uri(broker.port, "guest", "guest", "shop"))
    check_routing(vhost_uri(node.port, "guest", "guest", "shop"))  # the same there


def test_quorumqueue_definitions_import_into_rabbitmq(rabbitmq_node, tmp_path):
    node = rabbitmq_node
    with BrokerProcess() as broker:
        qqctl(broker, "add_user", "bob", "bob-secret")
        qqctl(broker, "set_user_tags", "bob", "monitoring")
        qqctl(broker, "set_user_limits", "bob", '{"max-channels": 9}')
        qqctl(broker, "add_vhost", "depot")
        qqctl(broker, "set_vhost_limits", "-p", "depot", '{"max-connections": 30}')
        qqctl(broker, "set_permissions", "-p", "depot", "bob", "^bob-", "", ".*")
        qqctl(broker, "set_permissions", "-p", "depot", "guest", ".*", ".*", ".*")
        qqctl(broker, "set_policy", "-p", "depot", "--apply-to", "queues", "--priority", "1",
              "cap", "^audit", '{"max-length-bytes": 100000}')
        qqctl(broker, "set_operator_policy", "-p", "depot", "--apply-to", "queues",
              "opcap", "^orders", '{"delivery-limit": 5, "max-length": 70}')
        declare_topology(vhost_uri(broker.port, "guest", "guest", "depot"))
        path = tmp_path / "from-quorumqueue.json"
        qqctl(broker, "export_definitions", str(path))
        ours = json.loads(path.read_text())
        check_routing(vhost_uri(broker.port, "guest", "guest", "depot"))

    rabbitmqctl(node, "import_definitions", str(path))
    exported = tmp_path / "back.json"
    rabbitmqctl(node, "export_definitions", str(exported))
    theirs = json.loads(exported.read_text())
    for name in SECTIONS:
        assert section(theirs, name, "depot") == section(ours, name, "depot") != [], name
    for key in ("password_hash", "hashing_algorithm", "tags", "limits"):
        assert user(theirs, "bob")[key] == user(ours, "bob")[key], key
    assert "opcap" in rabbitmqctl(node, "list_operator_policies", "-p", "depot")
    # the quorumqueue user logs in to RabbitMQ with the password set on quorumqueue
    pika.BlockingConnection(pika.URLParameters(
        vhost_uri(node.port, "bob", "bob-secret", "depot"))).close()
    check_routing(vhost_uri(node.port, "guest", "guest", "depot"))


def test_an_operator_policy_caps_a_queue_alike_on_both_brokers(rabbitmq_node):
    """The lowest of argument (50), policy (10) and operator policy (4) is the limit,
    on a classic and a quorum queue, on RabbitMQ 3.10.8 as on quorumqueue; clearing
    the operator policy leaves the policy's 10. (3.10.8's list_queues has no
    operator_policy column yet; 4.x's has, as quorumqueue's.)"""
    def run(uri: str, ctl) -> list[int]:
        ctl("add_vhost", "capped")
        ctl("set_permissions", "-p", "capped", "guest", ".*", ".*", ".*")
        ctl("set_policy", "-p", "capped", "--apply-to", "queues", "p", "^c-",
            '{"max-length": 10}')
        ctl("set_operator_policy", "-p", "capped", "--apply-to", "queues", "op", "^c-",
            '{"max-length": 4}')
        connection = pika.BlockingConnection(pika.URLParameters(uri))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("c-classic", durable=True, arguments={"x-max-length": 50})
        channel.queue_declare("c-quorum", durable=True, arguments={"x-queue-type": "quorum",
                                                                   "x-max-length": 50})
        counts = []
        for bodies in (range(12), range(12, 30)):
            for queue in ("c-classic", "c-quorum"):
                for n in bodies:
                    channel.basic_publish("", queue, b"%d" % n,
                                          pika.BasicProperties(delivery_mode=2))
            counts += [channel.queue_declare(q, passive=True).method.message_count
                       for q in ("c-classic", "c-quorum")]
            if len(counts) == 2:
                ctl("clear_operator_policy", "-p", "capped", "op")
        connection.close()
        return counts

    theirs = run(vhost_uri(rabbitmq_node.port, "guest", "guest", "capped"),
                 lambda *a: rabbitmqctl(rabbitmq_node, *a))
    with BrokerProcess() as broker:
        ours = run(vhost_uri(broker.port, "guest", "guest", "capped"),
                   lambda *a: qqctl(broker, *a))
    assert ours == theirs == [4, 4, 10, 10]

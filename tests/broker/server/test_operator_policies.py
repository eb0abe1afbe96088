"""Operator policies on a running node (`quorumqueue ctl set_operator_policy ...`, as
rabbitmqctl's; node/operator_policies.py): RabbitMQ's precedence between a queue's
argument, its policy and its operator policy (the lowest limit wins), what
`list_queues` shows of them, the keys refused, and that they survive a restart."""

from __future__ import annotations

import time

import pika
import pytest

from quorumqueue.client.management import call

from .pika_support import connect, publish_bodies, unique
from .test_definitions import ctl, ctl_error

pytestmark = pytest.mark.timeout(120)


def wait_for_count(channel, queue: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while channel.queue_declare(queue, passive=True).method.message_count != count:
        assert time.monotonic() < deadline, f"{queue} never held {count} messages"
        time.sleep(0.05)


def queue_row(broker, name: str) -> dict:
    return next(row for row in call(broker.uri, "queues.list", vhost="/")
                if row["name"] == name)


def test_the_lowest_of_argument_policy_and_operator_policy_wins(broker):
    """Parameters and policies guide, "Operator Policies": a limit set by an operator
    policy caps the user's policy and the queue's own argument; clearing it gives the
    queue back its policy's limit."""
    name = unique("opq")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum",
                                                         "x-max-length": 50})
    channel.confirm_delivery()
    ctl(broker, "set_policy", "--apply-to", "quorum_queues", f"p-{name}", f"^{name}$",
        '{"max-length": 10, "delivery-limit": 5}')
    out = ctl(broker, "set_operator_policy", "--apply-to", "quorum_queues",
              f"op-{name}", f"^{name}$", '{"max-length": 4, "delivery-limit": 8}')
    assert f'Setting operator policy override "op-{name}"' in out
    publish_bodies(channel, name, [b"%d" % n for n in range(12)], delivery_mode=2)
    wait_for_count(channel, name, 4)  # drop-head down to the operator's 4
    row = queue_row(broker, name)
    assert row["policy"] == f"p-{name}" and row["operator_policy"] == f"op-{name}"
    # max-length: the lower (4); delivery-limit: the lower (5), as RabbitMQ merges them
    assert row["effective_policy_definition"] == {"max-length": 4, "delivery-limit": 5}
    listed = ctl(broker, "list_queues", "name", "policy", "operator_policy",
                 "effective_policy_definition")
    assert (f"{name}\tp-{name}\top-{name}\t"
            '{"delivery-limit":5,"max-length":4}') in listed.splitlines()
    from quorumqueue.cli.main import main
    from click.testing import CliRunner

    table = CliRunner().invoke(main, ["queues", "list", "--base-uri", broker.management_url, "name", "policy",
                                      "operator_policy", "effective_policy_definition"])
    assert [name, f"p-{name}", f"op-{name}", '{"delivery-limit":5,"max-length":4}'] in [
        line.split() for line in table.output.splitlines()], table.output
    ctl(broker, "clear_operator_policy", f"op-{name}")
    publish_bodies(channel, name, [b"%d" % n for n in range(12, 30)], delivery_mode=2)
    wait_for_count(channel, name, 10)  # the policy's 10 again, below the argument's 50
    assert queue_row(broker, name)["operator_policy"] == ""
    connection.close()


def test_an_operator_policy_alone_caps_a_classic_queues_argument(broker):
    name = unique("opc")
    connection = connect(broker)
    channel = connection.channel()
    channel.queue_declare(name, arguments={"x-max-length": 3})
    ctl(broker, "set_operator_policy", f"op-{name}", f"^{name}$", '{"max-length": 2}')
    publish_bodies(channel, name, [b"a", b"b", b"c"])
    wait_for_count(channel, name, 2)
    ctl(broker, "set_operator_policy", f"op-{name}", f"^{name}$", '{"max-length": 7}')
    publish_bodies(channel, name, [b"d", b"e", b"f"])
    wait_for_count(channel, name, 3)  # the argument's 3 is now the lower
    row = queue_row(broker, name)
    assert row["policy"] == "" and row["effective_policy_definition"] == {"max-length": 7}
    assert [f"op-{name}", f"^{name}$", "all", '{"max-length":7}', "0"] == next(
        line.split()[1:] for line in ctl(broker, "list_operator_policies").splitlines()
        if f"op-{name}" in line)
    ctl(broker, "clear_operator_policy", f"op-{name}")
    connection.close()


def test_operator_policies_refuse_what_rabbitmq_refuses(broker):
    # not a key RabbitMQ lets an operator policy set (rabbit_policies' validators)
    assert ("operator policy 'op-ae' in vhost '/': 'alternate-exchange' is not a recognised "
            "operator policy setting") in ctl_error(
        broker, "set_operator_policy", "op-ae", ".*", '{"alternate-exchange": "x"}')
    # an operator-policy key that quorumqueue refuses in any policy
    assert "key 'max-in-memory-length' is not supported by quorumqueue" in ctl_error(
        broker, "set_operator_policy", "op-mem", ".*", '{"max-in-memory-length": 5}')
    assert "must be a non-negative integer" in ctl_error(
        broker, "set_operator_policy", "op-neg", ".*", '{"max-length": -1}')
    assert "no operator policy 'none' in vhost '/'" in ctl_error(
        broker, "clear_operator_policy", "none")
    assert "no vhost 'nowhere'" in ctl_error(
        broker, "set_operator_policy", "-p", "nowhere", "op", ".*", '{"max-length": 1}')
    # apply-to exchanges: no operator-policy key acts on an exchange
    from quorumqueue.client.management import ManagementError

    with pytest.raises(ManagementError, match="operator policies act on queues only"):
        call(broker.uri, "operator_policies.set", vhost="/", name="op-x", pattern=".*",
             definition={"max-length": 1}, apply_to="exchanges")
    assert "op-ae" not in ctl(broker, "list_operator_policies")


def test_operator_policies_survive_a_restart(fresh_broker):
    broker = fresh_broker
    ctl(broker, "add_vhost", "ops")
    ctl(broker, "set_operator_policy", "-p", "ops", "--priority", "2", "--apply-to",
        "queues", "cap", "^capped", '{"max-length": 2, "max-length-bytes": 600000}')
    broker.restart()
    assert call(broker.uri, "operator_policies.list", vhost="ops") == [
        {"vhost": "ops", "name": "cap", "pattern": "^capped",
         "definition": {"max-length": 2, "max-length-bytes": 600000}, "priority": 2,
         "apply_to": "queues"}]
    ctl(broker, "set_permissions", "-p", "ops", "guest", ".*", ".*", ".*")
    connection = pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{broker.port}/ops"))
    channel = connection.channel()
    channel.queue_declare("capped-q")
    publish_bodies(channel, "capped-q", [b"1", b"2", b"3"])
    wait_for_count(channel, "capped-q", 2)
    connection.close()

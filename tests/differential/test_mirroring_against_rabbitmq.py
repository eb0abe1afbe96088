"""Mirrored classic queues against RabbitMQ 3.10.8 on one node (the "Classic Queue
Mirroring" guide's "How to Check if a Queue is Mirrored?" and "Unsynchronised
Mirrors"): the same ha-* policies, set with rabbitmqctl there and with `quorumqueue ctl`
here (with deprecated_features.permit.classic_queue_mirroring = true, as RabbitMQ
3.13 requires), give the same `list_queues name policy pid slave_pids
synchronised_slave_pids` picture (process ids aside: quorumqueue shows a node where
RabbitMQ shows an Erlang pid), and `sync_queue` / `cancel_sync_queue` answer alike.
RabbitMQ's export of those policies imports here unchanged with the switch on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import MARKER_VARIABLE

from .test_definitions_against_rabbitmq import (RABBITMQCTL, rabbitmq_node,  # noqa: F401
                                                rabbitmqctl)

CONFIG = "deprecated_features.permit.classic_queue_mirroring = true\n"
POLICIES = [("ha-all", r"^ha\.", '{"ha-mode":"all","ha-sync-mode":"automatic"}'),
            ("ha-two", r"^two\.", '{"ha-mode":"exactly","ha-params":2}'),
            ("ha-nodes", r"^nodes\.", '{"ha-mode":"nodes","ha-params":["rabbit@nowhere"]}')]
QUEUES = ["ha.one", "two.replicas", "nodes.q", "plain"]
COLUMNS = ["name", "policy", "pid", "slave_pids", "synchronised_slave_pids"]


def declare(uri: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    for name in QUEUES:
        channel.queue_declare(name, durable=True)
    channel.queue_declare("quorum", durable=True, arguments={"x-queue-type": "quorum"})
    connection.close()


def picture(output: str) -> list[str]:
    """The table from its header on, pids anonymous, rows sorted."""
    lines = output.splitlines()
    start = lines.index("\t".join(COLUMNS))
    return [lines[start]] + sorted(re.sub(r"<[^>]*>", "<pid>", line)
                                   for line in lines[start + 1:])


def theirs(node, *arguments: str) -> subprocess.CompletedProcess:
    base = node.base_dir
    environment = {name: os.environ[name] for name in ("PATH", "LANG", "LC_ALL", "TMPDIR")
                   if name in os.environ}
    environment.update(HOME=str(base / "home"), ERL_EPMD_PORT=str(node.epmd_port),
                       ERL_EPMD_ADDRESS="127.0.0.1", RABBITMQ_USE_LONGNAME="false",
                       RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"))
    environment[MARKER_VARIABLE] = node.node_name
    return subprocess.run([str(RABBITMQCTL), "-n", node.node_name, *arguments],
                          env=environment, capture_output=True, text=True, timeout=120)


def mine(broker, *arguments: str):
    return CliRunner().invoke(main, ["ctl", *arguments, "--base-uri", broker.management_url])


def test_the_same_policies_give_the_same_list_queues_picture(rabbitmq_node, tmp_path):  # noqa: F811
    for name, pattern, definition in POLICIES:
        rabbitmqctl(rabbitmq_node, "set_policy", "--apply-to", "queues", name, pattern,
                    definition)
    declare(rabbitmq_node.uri)
    expected = picture(rabbitmqctl(rabbitmq_node, "list_queues", *COLUMNS))
    exported = tmp_path / "rabbitmq.json"
    rabbitmqctl(rabbitmq_node, "export_definitions", str(exported))

    with BrokerProcess(data_dir=str(tmp_path / "qq"), extra_config=CONFIG) as broker:
        for name, pattern, definition in POLICIES:
            result = mine(broker, "set_policy", "--apply-to", "queues", name, pattern,
                          definition)
            assert result.exit_code == 0, result.output
        declare(broker.uri)
        listed = mine(broker, "list_queues", *COLUMNS)
        assert picture(listed.stdout) == expected
        # a mirrored queue without mirrors ([]), an unmirrored one (empty): as there
        assert "ha.one\tha-all\t<pid>\t[]\t[]" in expected

        for arguments in (["sync_queue", "ha.one"], ["sync_queue", "plain"],
                          ["sync_queue", "missing"], ["cancel_sync_queue", "ha.one"],
                          ["cancel_sync_queue", "plain"], ["cancel_sync_queue", "missing"]):
            want, got = theirs(rabbitmq_node, *arguments), mine(broker, *arguments)
            assert (got.exit_code, got.stdout, got.stderr) == (
                want.returncode, want.stdout, want.stderr), arguments

    # RabbitMQ's export, its ha-* policies untransformed, imports with the switch on
    with BrokerProcess(data_dir=str(tmp_path / "qq2"), extra_config=CONFIG) as broker:
        result = mine(broker, "import_definitions", str(exported))
        assert result.exit_code == 0, result.output + result.stderr
        policies = {p["name"]: p["definition"] for p in json.loads(
            mine(broker, "export_definitions", "-").stdout)["policies"]}
        assert policies == {name: json.loads(definition)
                            for name, _pattern, definition in POLICIES}
        assert picture(mine(broker, "list_queues", *COLUMNS).stdout) == expected

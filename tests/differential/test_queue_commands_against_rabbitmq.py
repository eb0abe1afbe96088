"""`quorumqueue queues peek | reclaim_quorum_memory | quorum_status |
check_if_node_is_*_critical` against `rabbitmq-queues` 3.10.8 on the same messages.

The same quorum queue contents on both (a message with every property and a header,
one through amq.direct, one whose body is longer than the 64 bytes shown): the rows
of `peek` (keys, order and values; RabbitMQ's json formatter gives them as a map,
its table in this order), the error texts of a position beyond the ready messages,
a classic queue and a missing queue, and the single-node answers of the two health
checks are the same. quorum_status is compared by its Raft State only: 3.10.8 has
the older columns (Log Index, ...), this broker 4.x's (Last Log Index, Last Written,
...), and RabbitMQ's Machine Version has no counterpart here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pika
import pytest

from quorumqueue.client.management import call
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode

pytestmark = pytest.mark.timeout(240)

RABBITMQ_QUEUES = "/usr/lib/rabbitmq/bin/rabbitmq-queues"
OURS = [sys.executable, "-m", "quorumqueue.cli", "queues"]
PROPERTIES = pika.BasicProperties(
    content_type="text/plain", content_encoding="gzip", delivery_mode=2,
    headers={"h": "v", "n": 7}, priority=3, correlation_id="c1", reply_to="r",
    expiration="600000", message_id="m1", timestamp=1700000000, type="t",
    user_id="guest", app_id="a")


@pytest.fixture(scope="module")
def rabbitmq():
    if not RabbitMQNode.available() or not os.access(RABBITMQ_QUEUES, os.X_OK):
        pytest.skip(RabbitMQNode.skip_reason)
    with RabbitMQNode() as node:
        yield node


@pytest.fixture(scope="module")
def ours():
    with BrokerProcess() as process:
        yield process


def fill(uri: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    channel.queue_declare("peeked", durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_declare("peeked-classic", durable=True)
    channel.queue_bind("peeked", "amq.direct", "peek-key")
    channel.confirm_delivery()
    channel.basic_publish("", "peeked", b"hello", PROPERTIES)
    channel.basic_publish("amq.direct", "peek-key", b"second")
    channel.basic_publish("", "peeked", bytes(range(48, 48 + 70)))
    connection.close()


def theirs(node: RabbitMQNode, *arguments: str) -> subprocess.CompletedProcess:
    cookie = (node.base_dir / "home" / ".erlang.cookie").read_text().strip()
    environment = dict(os.environ, HOME=str(node.base_dir / "home"),
                       ERL_EPMD_PORT=str(node.epmd_port))
    return subprocess.run([RABBITMQ_QUEUES, "-n", node.node_name, "--erlang-cookie", cookie,
                           *arguments], env=environment, capture_output=True, text=True,
                          timeout=120)


def mine(broker: BrokerProcess, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(OURS + list(arguments) + ["--base-uri", broker.management_url],
                          capture_output=True, text=True, timeout=60)


def our_rows(output: str) -> list[tuple[str, str]]:
    lines = output.splitlines()[1:]  # the banner
    width = lines[0].index("values")
    return [(line[:width].strip(), line[width:].strip()) for line in lines[1:]]


def their_rows(output: str) -> dict[str, str]:
    message = json.loads(output)["message"]
    return {key: ",".join(value) if isinstance(value, list) else str(value)
            for key, value in message.items()}


# the pretty table's vertical rule: "x" in the terminal's line-drawing character set
RULE = "\x1b(0x\x1b(B"


def their_order(table: str) -> list[str]:
    """The first column of RabbitMQ's pretty table, top to bottom (header included)."""
    return [re.sub(r"\x1b\[[0-9;]*m", "", line.split(RULE)[1]).strip()
            for line in table.splitlines() if line.startswith(RULE)]


def anonymous(output: str, node: str) -> list[str]:
    return [line.replace(node, "NODE") for line in output.splitlines()]


def test_peek_rows_errors_and_health_checks_match(rabbitmq, ours):
    fill(rabbitmq.uri)
    fill(ours.uri)
    our_node = call(ours.uri, "cluster.status")["node"]
    for position in ("1", "2", "3"):
        expected = theirs(rabbitmq, "peek", "peeked", position, "--formatter", "json")
        assert expected.returncode == 0, expected.stderr
        got = mine(ours, "peek", "peeked", position)
        assert got.returncode == 0, got.stderr
        rows = our_rows(got.stdout)
        assert dict(rows) == their_rows(expected.stdout), position
        table = theirs(rabbitmq, "-q", "peek", "peeked", position)  # its pretty table
        assert [key for key, _ in rows] == their_order(table.stdout)[1:]  # its header
    for arguments in (["peek", "peeked", "4"], ["peek", "peeked-classic", "1"],
                      ["peek", "missing", "1"], ["reclaim_quorum_memory", "peeked-classic"],
                      ["reclaim_quorum_memory", "missing"],
                      ["quorum_status", "peeked-classic"]):
        expected, got = theirs(rabbitmq, *arguments), mine(ours, *arguments)
        assert (got.returncode, got.stderr) == (expected.returncode, expected.stderr), \
            arguments
    zero_expected = theirs(rabbitmq, "peek", "peeked", "0")
    zero = mine(ours, "peek", "peeked", "0")
    assert zero.returncode == zero_expected.returncode == 64
    assert zero.stderr.splitlines()[0] == zero_expected.stderr.splitlines()[0]
    for arguments in (["reclaim_quorum_memory", "peeked"],
                      ["check_if_node_is_quorum_critical"],
                      ["check_if_node_is_mirror_sync_critical"]):
        expected, got = theirs(rabbitmq, *arguments), mine(ours, *arguments)
        assert got.returncode == expected.returncode == 0, (arguments, got.stderr)
        # banner and answer, node names aside (reclaim: ours adds what each node did)
        their_lines = anonymous(expected.stdout, rabbitmq.node_name)
        assert anonymous(got.stdout, our_node)[:len(their_lines)] == their_lines
    expected = theirs(rabbitmq, "quorum_status", "peeked", "--formatter", "json")
    assert [row["Raft State"] for row in json.loads(expected.stdout)] == ["leader"]
    got = mine(ours, "quorum_status", "peeked")
    assert got.stdout.splitlines()[2].split()[1] == "leader"

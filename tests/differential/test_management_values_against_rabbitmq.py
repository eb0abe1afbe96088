"""The management API's quorum-queue figures that hold state, against RabbitMQ 3.10.8:
the dead letters at-least-once dead lettering holds (`messages_dlx`,
`message_bytes_dlx`: the quorum queues guide's "Dead Lettering"; they count in
`messages` and `message_bytes`, and with reject-publish they block publishes) and the
single active consumer's tag (`single_active_consumer_ctag`, the consumers guide's
"Single Active Consumer"), in /api/queues and /api/queues/VHOST/NAME, with the state
made the same on both brokers. The command line's `queues list` shows them too (read
from the same API).

Not compared: key sets (test_management_against_rabbitmq.py does that).
"""

from __future__ import annotations

import subprocess
import sys

import pika
import pytest

from tests.differential.test_management_against_rabbitmq import _get, wait_for
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode, management_node

pytestmark = pytest.mark.timeout(300)

SOURCE, SAC, PLAIN = "mv-dlx-source", "mv-sac", "mv-plain"
FIELDS = ("messages", "messages_ready", "messages_unacknowledged", "message_bytes",
          "messages_dlx", "message_bytes_dlx", "single_active_consumer_ctag", "consumers")


@pytest.fixture(scope="module")
def rabbitmq():
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with management_node("collect_statistics_interval = 1000\n") as node:
        yield node


@pytest.fixture(scope="module")
def quorumqueue():
    with BrokerProcess() as process:
        yield process


def make_state(uri: str) -> pika.BlockingConnection:
    """Two dead letters held by a source whose target does not exist; a single-active
    queue with two consumers; a plain quorum queue. Returns the consumers' connection
    (kept open while the figures are read)."""
    connection = pika.BlockingConnection(pika.URLParameters(uri))
    channel = connection.channel()
    channel.queue_declare(SOURCE, durable=True, arguments={
        "x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish", "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "mv-nowhere"})
    channel.queue_declare(SAC, durable=True, arguments={"x-queue-type": "quorum",
                                                        "x-single-active-consumer": True})
    channel.queue_declare(PLAIN, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    for body in (b"abc", b"defgh"):
        channel.basic_publish("", SOURCE, body)
    for _ in range(2):
        method = None
        while method is None:
            method, _properties, _body = channel.basic_get(SOURCE)
        channel.basic_reject(method.delivery_tag, requeue=False)
    consumers = pika.BlockingConnection(pika.URLParameters(uri))
    consuming = consumers.channel()
    consuming.basic_consume(SAC, lambda *_: None, consumer_tag="mv-first")
    consuming.basic_consume(SAC, lambda *_: None, consumer_tag="mv-second")
    connection.close()
    return consumers


def figures(base: str) -> dict | None:
    """{queue: {field: value}} from /api/queues and each /api/queues/%2F/NAME, once
    the list carries the statistics (RabbitMQ emits them every second here) and the
    dead letters are counted."""
    listed = {row["name"]: row for row in _get(base, "/api/queues") or []}
    if set(listed) < {SOURCE, SAC, PLAIN} or not all(
            "messages" in listed[name] for name in (SOURCE, SAC, PLAIN)) or not (
            listed[SOURCE].get("messages_dlx")):
        return None
    found = {}
    for name in (SOURCE, SAC, PLAIN):
        one = _get(base, f"/api/queues/%2F/{name}")
        found[name] = {"list": {field: listed[name].get(field) for field in FIELDS},
                       "one": {field: one.get(field) for field in FIELDS}}
    return found


def test_held_dead_letters_and_the_single_active_consumer_are_reported_as_rabbitmq_does(
        rabbitmq, quorumqueue):
    theirs_consumers = make_state(rabbitmq.uri)
    ours_consumers = make_state(quorumqueue.uri)
    try:
        theirs = wait_for(lambda: figures(rabbitmq.management_url), "RabbitMQ's figures")
        ours = wait_for(lambda: figures(quorumqueue.management_url), "quorumqueue's figures")
        assert theirs[SOURCE]["one"]["messages_dlx"] == 2   # the state is what it says
        assert theirs[SAC]["one"]["single_active_consumer_ctag"] == "mv-first"
        assert ours == theirs
        listed = subprocess.run(
            [sys.executable, "-m", "quorumqueue.cli", "queues", "list", "--port",
             str(quorumqueue.management_port), "name", "messages_dlx",
             "single_active_consumer_tag"], capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[0]: line.split()[1:] for line in listed.stdout.splitlines()[1:]}
        assert rows[SOURCE] == ["2"] and rows[SAC] == ["0", "mv-first"]
    finally:
        theirs_consumers.close()
        ours_consumers.close()

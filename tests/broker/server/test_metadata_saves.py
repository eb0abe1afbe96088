"""What an exchange or binding operation writes, and what a kill -9 leaves of it.

Exchange declare and delete, bind and unbind go through the metadata log (one
fdatasync, durable before the -ok) and no longer rewrite metadata.json: a restart
applies the log after the last snapshot on top of the file (broker/groups/metadata.py,
"Snapshots"), so every exchange and binding a client was answered for comes back. The
file keeps what a restart needs before that replay, the queue records (their messages
and Raft groups are recovered from it): a declare or delete is a line of the file's
journal (broker/storage/metadata_journal.py), not a rewrite of the whole file. Issue
32 item 10, issue 31 Build 2.
"""

from __future__ import annotations

import json
import os

import pika
import pytest

from tests.support.broker import BrokerProcess

from .test_definitions import ctl

pytestmark = pytest.mark.timeout(180)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def metadata_file(broker) -> tuple[int, int, int]:
    """What changes when metadata.json is replaced (inode, mtime, size: an inode
    number may be reused by the replacement)."""
    found = os.stat(os.path.join(broker.data_dir, "metadata.json"))
    return found.st_ino, found.st_mtime_ns, found.st_size


def topology(broker) -> tuple[list, list]:
    """(exchanges, bindings) of the node's definitions export, sorted."""
    exported = json.loads(ctl(broker, "export_definitions", "-"))
    key = lambda item: json.dumps(item, sort_keys=True)  # noqa: E731
    return (sorted(exported["exchanges"], key=key), sorted(exported["bindings"], key=key))


def churn(channel, rounds: int) -> None:
    """Exchange and binding operations of every kind; what stays is some of each."""
    for number in range(rounds):
        channel.exchange_declare(f"x{number}", "topic", durable=True)
        channel.exchange_declare(f"h{number}", "headers", durable=True,
                                 arguments={"alternate-exchange": "ae"})
        channel.queue_bind("orders", f"x{number}", routing_key=f"order.{number}.#")
        channel.queue_bind("orders", f"h{number}",
                           arguments={"x-match": "any", "n": number, "tag": b"\x00\xff"})
        channel.exchange_bind(f"h{number}", f"x{number}", routing_key="#")
        if number % 3 == 0:
            channel.queue_unbind("orders", f"x{number}", routing_key=f"order.{number}.#")
        if number % 4 == 1:
            channel.exchange_delete(f"h{number}")
        if number % 5 == 2:
            channel.exchange_unbind(f"h{number}", f"x{number}", routing_key="#")
            channel.exchange_delete(f"x{number}")


def test_exchange_and_binding_operations_leave_the_metadata_file_alone(fresh_broker):
    """Before, each of them replaced metadata.json (a temporary file, two fsyncs and a
    rename: the file's inode changed with every operation)."""
    connection = pika.BlockingConnection(pika.URLParameters(fresh_broker.uri))
    channel = connection.channel()
    channel.queue_declare("orders", durable=True)
    channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
    before = metadata_file(fresh_broker)
    churn(channel, 12)
    assert metadata_file(fresh_broker) == before
    ctl(fresh_broker, "add_vhost", "v2")  # what is saved whole still is
    assert metadata_file(fresh_broker) != before
    connection.close()


@pytest.mark.parametrize("interval", [4096, 7], ids=["no-snapshot", "snapshot-every-7"])
def test_kill_9_after_exchange_and_binding_operations_restores_every_one(interval):
    """Whatever a client was answered for before a kill -9 is there after the restart,
    and nothing else: the exchanges and bindings of the definitions export are the
    same (every durable one, with arguments of every field type), messages route by
    them, and a confirmed message waits in its quorum queue. With a snapshot every 7
    entries the log is released below each snapshot, so the restart also starts from
    a file the snapshots saved."""
    with BrokerProcess(extra_config=f"metadata_store.snapshot_interval = {interval}\n") \
            as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare("ae", "fanout", durable=True)
        channel.queue_declare("orders", durable=True, arguments={"x-queue-type": "quorum"})
        channel.basic_publish("", "orders", b"confirmed", PERSISTENT)
        churn(channel, 20)
        expected = topology(broker)
        broker.restart(kill=True)

        assert topology(broker) == expected
        connection = pika.BlockingConnection(pika.URLParameters(broker.uri))
        channel = connection.channel()
        channel.confirm_delivery()
        # x3 -> orders was unbound; x4 -> orders stays; h0 (any n=0) stays bound
        channel.basic_publish("x3", "order.3.new", b"unbound", PERSISTENT)
        channel.basic_publish("x4", "order.4.new", b"bound", PERSISTENT)
        channel.basic_publish("h0", "", b"headers", pika.BasicProperties(
            delivery_mode=2, headers={"n": 0}))
        bodies = []
        while True:
            method, _properties, body = channel.basic_get("orders", auto_ack=True)
            if method is None:
                break
            bodies.append(body)
        # x3 still reaches orders through h3 (x3 -> h3 -> orders, n absent: no match)
        assert bodies == [b"confirmed", b"bound", b"headers"]
        connection.close()


def test_declares_and_deletes_are_journal_lines_and_a_kill_9_keeps_every_one(fresh_broker):
    """A queue record is durable before its declare-ok (a restart drops the messages
    of a queue the metadata does not name), but a declare or delete appends a line to
    metadata.journal instead of rewriting metadata.json, which cost time in proportion
    to the queues there were. After a kill -9: every queue declared is there with its
    confirmed messages, every deleted one gone, bindings to it too."""
    connection = pika.BlockingConnection(pika.URLParameters(fresh_broker.uri))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare("x", "direct", durable=True)
    channel.queue_declare("first", durable=True)  # the file's first save
    before = metadata_file(fresh_broker)
    for number in range(30):
        kind = "quorum" if number % 2 else "classic"
        channel.queue_declare(f"q{number}", durable=True, arguments={"x-queue-type": kind})
        channel.queue_bind(f"q{number}", "x", routing_key=f"k{number}")
        channel.basic_publish("", f"q{number}", f"m{number}".encode(), PERSISTENT)
        if number % 3 == 0:
            channel.queue_delete(f"q{number}")
    assert metadata_file(fresh_broker) == before
    assert os.path.getsize(os.path.join(fresh_broker.data_dir, "metadata.journal")) > 0
    fresh_broker.restart(kill=True)

    connection = pika.BlockingConnection(pika.URLParameters(fresh_broker.uri))
    for number in range(30):
        channel = connection.channel()
        if number % 3 == 0:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
                channel.queue_declare(f"q{number}", passive=True)
            assert gone.value.reply_code == 404
            continue
        method, _properties, body = channel.basic_get(f"q{number}", auto_ack=True)
        assert body == f"m{number}".encode(), number
        channel.confirm_delivery()
        channel.basic_publish("x", f"k{number}", b"routed", PERSISTENT)
        assert channel.basic_get(f"q{number}", auto_ack=True)[2] == b"routed"
        channel.close()
    exported = json.loads(ctl(fresh_broker, "export_definitions", "-"))
    assert sorted(b["destination"] for b in exported["bindings"]) == sorted(
        f"q{n}" for n in range(30) if n % 3)
    connection.close()

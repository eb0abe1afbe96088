"""A node's slow file work does not hold its event loop (issue 31, "nothing stops the
loop"; ARCHITECTURE.md: "nothing blocks the event loop for more than a few
milliseconds (WAL rollover, snapshots, compaction run beside it)"). A quorum queue's
snapshot file (and the segment files its release cursor frees) is written by the
writer thread with the next group commit (broker/raft/storage/deferred.py): while
that write is held, the node still answers its metrics endpoint, its lag sampler
keeps sampling, and a new client connects and is answered; once the write goes on,
the publishes waiting for it are confirmed, and a restart finds the snapshot and
every message."""

from __future__ import annotations

import threading

import pika
import pytest

from quorumqueue.broker.config import Settings
from quorumqueue.broker.raft.storage import snapshots
from tests.support.prometheus import scrape, value

from .inprocess import WAIT, call, running_server, wait_until

pytestmark = pytest.mark.timeout(180)

QUEUE = "background-files-qq"
LAG_COUNT = "quorumqueue_event_loop_lag_seconds_count"


def settings(data_dir: str) -> Settings:
    return Settings(host="127.0.0.1", port=0, data_dir=data_dir, prometheus_port=0)


def connect(server) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.port))


def publish(server, bodies: list[bytes]) -> None:
    connection = connect(server)
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
    connection.close()


def drain(server, count: int, got: list[bytes]) -> None:
    """basic.get `count` messages with acks (the last one empties the queue: its
    release cursor takes the queue's first snapshot)."""
    connection = connect(server)
    channel = connection.channel()
    while len(got) < count:
        method, _properties, body = channel.basic_get(QUEUE)
        if method is not None:
            got.append(body)
            channel.basic_ack(method.delivery_tag)
    try:
        channel.basic_get(QUEUE)   # a synchronous method: the acks are in by its reply
        connection.close()
    except pika.exceptions.AMQPError:
        pass                       # the test may stop the node first


def test_the_loop_answers_while_a_snapshot_file_is_being_written(tmp_path, monkeypatch):
    reached, opened = threading.Event(), threading.Event()
    real = snapshots.prepare_snapshot_file

    def held(*args, **kwargs):
        reached.set()
        assert opened.wait(3 * WAIT), "the test never let the snapshot write go on"
        return real(*args, **kwargs)

    monkeypatch.setattr(snapshots, "prepare_snapshot_file", held)
    data_dir = str(tmp_path / "node")
    first = [b"first-%d" % n for n in range(200)]
    later = [b"later-%d" % n for n in range(20)]
    runner = running_server(settings(data_dir))
    server = next(runner)
    try:
        connection = connect(server)
        connection.channel().queue_declare(QUEUE, durable=True,
                                           arguments={"x-queue-type": "quorum"})
        connection.close()
        publish(server, first)
        got: list[bytes] = []
        drainer = threading.Thread(target=drain, args=(server, len(first), got), daemon=True)
        drainer.start()
        assert reached.wait(WAIT), "no snapshot was taken once the queue was empty"

        # the snapshot's write is held: the loop goes on
        port = server.metrics.port
        before = value(scrape(port), LAG_COUNT)
        wait_until(lambda: value(scrape(port), LAG_COUNT) > before + 20,
                   "the lag sampler to run while the snapshot write is held")
        assert call(server, lambda: server._sync is not None)   # on the loop: answered
        assert not opened.is_set()

        opened.set()                                     # the write goes on
        publish(server, later)                           # confirmed: returns
        drainer.join(WAIT)
        assert got == first
    finally:
        opened.set()
        next(runner, None)                               # stops the node

    again = running_server(settings(data_dir))
    server = next(again)
    try:
        store = server.node.quorum.store
        uid = next(g for g in store.groups() if f"/{QUEUE}/" in g)
        assert store.snapshot_meta(uid) is not None     # the held write landed
        connection = connect(server)
        channel = connection.channel()
        bodies = []
        while (message := channel.basic_get(QUEUE, auto_ack=True))[0] is not None:
            bodies.append(message[2])
        assert bodies == later
        connection.close()
    finally:
        next(again, None)

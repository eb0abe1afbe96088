"""When a quorum queue's release cursor takes a snapshot (queues/quorum/groups.py
`_snapshot_due`, Ra's rule): a queue drained as fast as it is filled is empty after
nearly every round, and a snapshot each time made PerfTest's 1 producer + 1 consumer
pay for a state file per round. A snapshot is taken once 4,096 entries passed since
the last one (or a segment file can go); the state a restart recovers is the same.
"""

from __future__ import annotations

from pamqp import commands as methods

from quorumqueue.broker.queues.quorum.groups import MIN_SNAPSHOT_INTERVAL
from tests.broker.node.harness import Client, Delivery, content_frames, properties
from tests.broker.node.test_forwarded_apply import start

QUORUM = {"x-queue-type": "quorum"}


def consumer(node) -> Client:
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    client.declare_queue(1, "q", durable=True, arguments=QUORUM)
    client.call(1, methods.Basic.Qos(prefetch_count=10), "Basic.QosOk")
    client.call(1, methods.Basic.Consume(queue="q", consumer_tag="c"), "Basic.ConsumeOk")
    return client


def publish_and_consume_one(client: Client, body: bytes) -> None:
    """One message published, delivered and acked, each in its own round: the queue
    is empty again at the end (a release cursor)."""
    client.send(1, methods.Basic.Publish(exchange="", routing_key="q"))
    client.send_bytes(content_frames(1, body, properties(delivery_mode=2), client.frame_max))
    deliveries = [d for d in client.read_deliveries() if isinstance(d, Delivery)]
    assert [d.body for d in deliveries] == [body]
    client.send(1, methods.Basic.Ack(delivery_tag=deliveries[0].method.delivery_tag))
    client.read()


def test_a_queue_drained_message_by_message_snapshots_every_4096_entries_and_restarts_empty(tmp_path):
    node = start(tmp_path)
    client = consumer(node)
    queue = node.vhosts["/"].queues["q"]
    publish_and_consume_one(client, b"first")
    first = node.quorum.store.snapshot_meta(queue.group)
    assert first is not None  # the queue's first empty state is snapshotted

    for n in range(50):
        publish_and_consume_one(client, b"m%d" % n)
    assert node.quorum.store.snapshot_meta(queue.group).index == first.index  # none per drain

    n = 0
    while queue.raft.applied_index < first.index + MIN_SNAPSHOT_INTERVAL + 10:
        publish_and_consume_one(client, b"more%d" % n)
        n += 1
    later = node.quorum.store.snapshot_meta(queue.group)
    assert first.index + MIN_SNAPSHOT_INTERVAL <= later.index <= queue.raft.applied_index

    for n in range(5):  # released since the last snapshot, and not snapshotted yet
        publish_and_consume_one(client, b"tail%d" % n)
    node.quorum.store.close()

    node = start(tmp_path)  # a restart: the snapshot, then the log after it replayed
    for _ in range(5):
        node.flush()
    queue = node.vhosts["/"].queues["q"]
    assert (queue.ready_count, queue.state.consumers) == (0, {})
    client = Client(node)
    client.handshake()
    client.open_channel(1)
    client.send(1, methods.Basic.Publish(exchange="", routing_key="q"))
    client.send_bytes(content_frames(1, b"after", properties(delivery_mode=2), client.frame_max))
    client.read()
    client.send(1, methods.Basic.Get(queue="q", no_ack=True))
    got = [d for d in client.read_deliveries() if isinstance(d, Delivery)]
    assert [d.body for d in got] == [b"after"]

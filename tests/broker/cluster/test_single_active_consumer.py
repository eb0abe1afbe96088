"""Single active consumer on a quorum queue across a leader failover (3 real nodes).

The consumers guide ("Single Active Consumer"): one consumer at a time gets
messages; when it dies, the next registered one takes over. The active consumer
and the waiting order are fifo machine state (broker/fifo/single_active.py), in
every replica's log, so a new leader knows them. Two queues, both led by the node
that is then killed with SIGKILL:
- on `lost`, the active consumer was connected to that node: its connection dies
  with it; once the new leader returns that connection's messages (a Down), the
  waiting consumer on another node takes over, with the unacked messages first;
- on `kept`, the active consumer is on a surviving node: it stays active through
  the failover and gets what is published after it; the waiting one gets nothing.
"""

from __future__ import annotations

import time

import pika
import pytest

from quorumqueue.client.management import call
from tests.support.cluster import CONVERGE_TIMEOUT, LocalCluster, wait_for

pytestmark = pytest.mark.timeout(400)  # the waits inside have their own bounds

SAC = {"x-queue-type": "quorum", "x-single-active-consumer": True,
       "x-queue-leader-locator": "client-local"}


def queue_row(uri: str, name: str) -> dict | None:
    for row in call(uri, "queues.list", vhost="/"):
        if row["name"] == name:
            return row
    return None


def leader_of(uri: str, name: str) -> str | None:
    row = queue_row(uri, name)
    return row and row["leader"]


def active_tag(uri: str, name: str) -> str | None:
    row = queue_row(uri, name)
    return row and row["single_active_consumer_tag"]


class Consumer:
    """A pika consumer on one node: manual acks, records (tag, redelivered, body)."""

    def __init__(self, uri: str, queue: str, tag: str) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(uri))
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=50)
        self.received: list[tuple[str, bool, bytes]] = []
        self.tags: list[int] = []
        self.channel.basic_consume(queue, self._on_message, consumer_tag=tag)

    def _on_message(self, _channel, method, _properties, body) -> None:
        self.received.append((method.consumer_tag, method.redelivered, body))
        self.tags.append(method.delivery_tag)

    def pump(self) -> None:
        self.connection.process_data_events(time_limit=0.05)

    def ack_all(self) -> None:
        self.channel.basic_ack(self.tags[-1], multiple=True)

    def bodies(self) -> list[bytes]:
        return [body for _tag, _redelivered, body in self.received]


def pump_until(what: str, consumers: list[Consumer], predicate) -> None:
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {CONVERGE_TIMEOUT:g}s"
        for consumer in consumers:
            consumer.pump()


def publish(uri: str, queue: str, bodies: list[bytes]) -> None:
    with pika.BlockingConnection(pika.URLParameters(uri)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def test_the_waiting_consumer_takes_over_when_the_leader_dies_with_the_active_one():
    with LocalCluster(3, proxied=False) as cluster:
        first = cluster.uris()[0]
        wait_for("a metadata leader", lambda: call(first, "cluster.status")["metadata_leader"])
        with pika.BlockingConnection(pika.URLParameters(first)) as connection:
            connection.channel().queue_declare("lost", durable=True, arguments=SAC)
        victim = wait_for("a leader of 'lost'", lambda: leader_of(first, "lost"))
        survivor, other = [name for name in cluster.names if name != victim]
        with pika.BlockingConnection(pika.URLParameters(cluster.uri(victim))) as connection:
            connection.channel().queue_declare("kept", durable=True, arguments=SAC)
        assert wait_for("a leader of 'kept'", lambda: leader_of(first, "kept")) == victim
        wait_for("both queues known on every node", lambda: all(
            queue_row(uri, name) for uri in cluster.uris() for name in ("lost", "kept")))

        # registration order: the first consumer of each queue is registered (and
        # active) before the second consumes
        lost_active = Consumer(cluster.uri(victim), "lost", "lost-a")
        wait_for("lost-a active", lambda: active_tag(first, "lost") == "lost-a")
        lost_next = Consumer(cluster.uri(survivor), "lost", "lost-b")
        kept_active = Consumer(cluster.uri(survivor), "kept", "kept-a")
        wait_for("kept-a active", lambda: active_tag(first, "kept") == "kept-a")
        kept_next = Consumer(cluster.uri(other), "kept", "kept-b")
        everyone = [lost_active, lost_next, kept_active, kept_next]
        wait_for("both queues with two consumers", lambda: all(
            queue_row(first, name)["consumers"] == 2 for name in ("lost", "kept")))

        publish(cluster.uri(other), "lost", [b"l1", b"l2", b"l3"])
        publish(cluster.uri(other), "kept", [b"k1", b"k2"])
        pump_until("the deliveries before the kill", everyone, lambda: (
            len(lost_active.received) == 3 and len(kept_active.received) == 2))
        kept_active.ack_all()  # lost-a keeps its three unacked: they must come back

        cluster.kill(victim)
        new = wait_for("a new leader of both queues", lambda: (
            leader_of(cluster.uri(survivor), "lost") not in (None, victim)
            and leader_of(cluster.uri(survivor), "kept") not in (None, victim)))
        assert new
        survivors = [lost_next, kept_active, kept_next]
        publish(cluster.uri(other), "kept", [b"k3", b"k4"])
        # until the new leader has taken the dead node's connection for down, a message
        # may still go to lost-a (and come back redelivered with its others): publish
        # l4 once lost-b is active
        pump_until("lost-b taking over with l1-l3", survivors,
                   lambda: len(lost_next.received) == 3)
        assert active_tag(cluster.uri(survivor), "lost") == "lost-b"
        publish(cluster.uri(other), "lost", [b"l4"])
        pump_until("l4 to lost-b", survivors, lambda: len(lost_next.received) == 4)
        pump_until("kept-a getting k3 and k4", survivors,
                   lambda: len(kept_active.received) == 4)
        assert lost_next.received == [("lost-b", True, b"l1"), ("lost-b", True, b"l2"),
                                      ("lost-b", True, b"l3"), ("lost-b", False, b"l4")]
        assert kept_active.bodies() == [b"k1", b"k2", b"k3", b"k4"]
        assert kept_next.received == [], "a waiting consumer got a message"
        for uri in (cluster.uri(survivor), cluster.uri(other)):
            assert active_tag(uri, "lost") == "lost-b"
            assert active_tag(uri, "kept") == "kept-a"
        for consumer in survivors:
            consumer.connection.close()


class HeaderConsumer(Consumer):
    """A Consumer that also records each delivery's x-delivery-count (None: absent)."""

    def _on_message(self, channel, method, properties, body) -> None:
        super()._on_message(channel, method, properties, body)
        self.counts = getattr(self, "counts", [])
        self.counts.append((properties.headers or {}).get("x-delivery-count"))


def consumer_rows(uri: str, name: str) -> int:
    return queue_row(uri, name)["consumers"]


def test_a_killed_consumer_nodes_messages_go_to_the_next_consumer_uncounted():
    """The active consumer is on a node that is killed (not the queue's leader); it
    held 3 unacknowledged messages. The leader, no longer hearing from that node,
    suspects its consumers (a NodeDown: broker/fifo/nodes.py, as RabbitMQ's
    noconnection): the waiting consumer on the third node takes over and gets the 3
    redelivered but without x-delivery-count — no delivery attempt failed (the guide's
    "Poison Message Handling" counts unsuccessful ones; before, this was a Down, count
    1). When the killed node is back in a new run, its dead consumer is removed (a
    NodeUp) and the one left stays active."""
    with LocalCluster(3, proxied=False) as cluster:
        first = cluster.uris()[0]
        wait_for("a metadata leader", lambda: call(first, "cluster.status")["metadata_leader"])
        leader_node, victim, survivor = cluster.names
        leader_uri = cluster.uri(leader_node)
        with pika.BlockingConnection(pika.URLParameters(leader_uri)) as connection:
            connection.channel().queue_declare("uncounted", durable=True, arguments=SAC)
        assert wait_for("a leader of 'uncounted'",
                        lambda: leader_of(leader_uri, "uncounted")) == leader_node
        wait_for("the queue known on every node", lambda: all(
            queue_row(uri, "uncounted") for uri in cluster.uris()))
        doomed = HeaderConsumer(cluster.uri(victim), "uncounted", "doomed")
        wait_for("doomed active", lambda: active_tag(leader_uri, "uncounted") == "doomed")
        heir = HeaderConsumer(cluster.uri(survivor), "uncounted", "heir")
        wait_for("two consumers", lambda: consumer_rows(leader_uri, "uncounted") == 2)

        publish(leader_uri, "uncounted", [b"m1", b"m2", b"m3"])
        pump_until("doomed holding m1-m3", [doomed, heir], lambda: len(doomed.received) == 3)
        cluster.kill(victim)
        pump_until("heir taking over with m1-m3", [heir], lambda: len(heir.received) == 3)
        assert active_tag(leader_uri, "uncounted") == "heir"
        assert heir.received == [("heir", True, b"m1"), ("heir", True, b"m2"),
                                 ("heir", True, b"m3")]
        assert heir.counts == [None, None, None], "x-delivery-count raised by a node's loss"
        publish(leader_uri, "uncounted", [b"m4"])
        pump_until("m4 to heir", [heir], lambda: len(heir.received) == 4)
        assert heir.received[3] == ("heir", False, b"m4") and heir.counts[3] is None

        cluster.restart(victim)
        wait_for("the dead consumer removed once its node is back",
                 lambda: consumer_rows(leader_uri, "uncounted") == 1)
        assert active_tag(leader_uri, "uncounted") == "heir"
        heir.ack_all()
        heir.connection.close()

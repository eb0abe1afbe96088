"""A 3-node cluster of real processes, used the way a RabbitMQ user would.

Metadata declared on one node is seen on every node; a quorum queue has a replica on
each of the three; a message published on one node is consumed on another; killing
the queue's leader elects another and nothing confirmed is lost; a restarted node
catches up; two nodes down leave the last one refusing work (no confirm); a
consumer's messages come back when its node dies. The fault tests with a running
workload and the checker are in test_faults.py.
"""

from __future__ import annotations

import time

import pika
import pytest

from quorumqueue.client.management import call
from tests.support.cluster import CONVERGE_TIMEOUT, LocalCluster, wait_for

pytestmark = pytest.mark.timeout(300)  # the waits inside have their own bounds


def status(uri: str) -> dict:
    return call(uri, "cluster.status")


def queue_status(uri: str, name: str) -> dict | None:
    for queue in status(uri)["queues"]:
        if queue["name"] == name:
            return queue
    return None


def leader_of(uri: str, name: str) -> str | None:
    queue = queue_status(uri, name)
    return queue and queue["leader"]


def connect(uri: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(uri))


def drain(uri: str, queue: str, count: int = 0, idle: float = 1.0,
          into: list | None = None) -> list[bytes]:
    """Consume and ack: wait (up to CONVERGE_TIMEOUT) for `count` messages, then go on
    until none arrives for `idle` seconds, so that any extra message shows too. Each
    body is appended to `into` (if given) before its ack, so a caller retrying after
    an error (a connection lost at the close) keeps what was already acked."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT
    with connect(uri) as connection:
        channel = connection.channel()
        bodies = [] if into is None else into
        for method, _properties, body in channel.consume(queue, inactivity_timeout=idle):
            if method is None:
                if len(bodies) >= count:
                    break
                assert time.monotonic() < deadline, (
                    f"{len(bodies)} of {count} messages from {queue} on {uri} after "
                    f"{CONVERGE_TIMEOUT:g}s")
                continue
            bodies.append(body)
            channel.basic_ack(method.delivery_tag)
        channel.cancel()
        return bodies


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False) as running:
        wait_for("a metadata leader all nodes agree on", lambda: len(
            {status(uri)["metadata_leader"] for uri in running.uris()} - {None}) == 1
            and all(status(uri)["metadata_leader"] for uri in running.uris()))
        yield running


def test_metadata_declared_on_one_node_is_on_every_node(cluster):
    one, two, three = cluster.uris()
    with connect(two) as connection:
        channel = connection.channel()
        channel.exchange_declare("orders-x", "direct", durable=True)
        channel.queue_declare("orders", durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind("orders", "orders-x", "new")
    nodes = wait_for("every node reachable, with its AMQP address", lambda: {
        n["name"]: n for n in status(one)["nodes"] if n["reachable"] and n["amqp_uri"]}
        if all(n["reachable"] and n["amqp_uri"] for n in status(one)["nodes"]) else None)
    for plan in cluster.plans:  # every node tells where clients reach it
        port = plan.uri.rsplit(":", 1)[1].split("/")[0]
        assert nodes[plan.name]["amqp_uri"].endswith(f":{port}")
    for uri in (one, three):
        queue = wait_for("the queue on " + uri, lambda: queue_status(uri, "orders"))
        assert sorted(queue["members"]) == sorted(cluster.names)
        with connect(uri) as connection:
            channel = connection.channel()
            channel.exchange_declare("orders-x", passive=True)
            assert channel.queue_declare("orders", passive=True).method.message_count == 0
    # an inequivalent redeclaration through another node fails as in RabbitMQ
    with connect(three) as connection:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.exchange_declare("orders-x", "fanout", durable=True)
        assert refused.value.reply_code == 406
        assert "inequivalent arg 'type'" in refused.value.reply_text


def test_published_on_one_node_consumed_on_another(cluster):
    one, two, three = cluster.uris()
    with connect(one) as connection:
        channel = connection.channel()
        channel.queue_declare("relay", durable=True, arguments={"x-queue-type": "quorum"})
    wait_for("a leader", lambda: leader_of(three, "relay"))
    with connect(three) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(50):
            channel.basic_publish("", "relay", f"m{n}".encode(),
                                  pika.BasicProperties(delivery_mode=2))
    assert drain(two, "relay", 50) == [f"m{n}".encode() for n in range(50)]
    for uri in cluster.uris():
        wait_for("the queue empty on " + uri, lambda: call(uri, "queues.list", vhost="/")
                 and [q for q in call(uri, "queues.list", vhost="/")
                      if q["name"] == "relay"][0]["ready"] == 0)


def test_deleted_through_one_node_is_gone_everywhere(cluster):
    one, two, three = cluster.uris()
    with connect(one) as connection:
        connection.channel().queue_declare("doomed", durable=True,
                                           arguments={"x-queue-type": "quorum"})
    wait_for("a leader", lambda: leader_of(two, "doomed"))
    with connect(two) as connection:
        assert connection.channel().queue_delete("doomed").method.message_count == 0
    for uri in cluster.uris():
        wait_for("the queue gone on " + uri, lambda: queue_status(uri, "doomed") is None)
    with connect(three) as connection:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            connection.channel().queue_declare("doomed", passive=True)
        assert missing.value.reply_code == 404


def test_leader_killed_another_is_elected_and_the_old_one_catches_up():
    with LocalCluster(3, proxied=False) as cluster:
        first = cluster.uris()[0]
        wait_for("a metadata leader", lambda: status(first)["metadata_leader"])
        with connect(first) as connection:
            connection.channel().queue_declare("q", durable=True,
                                               arguments={"x-queue-type": "quorum"})
        leader = wait_for("a leader", lambda: leader_of(first, "q"))
        others = [name for name in cluster.names if name != leader]
        with connect(cluster.uri(others[0])) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for n in range(100):
                channel.basic_publish("", "q", b"before-%d" % n,
                                      pika.BasicProperties(delivery_mode=2))
        cluster.kill(leader)
        new = wait_for("a new leader", lambda: (leader_of(cluster.uri(others[0]), "q")
                                                not in (None, leader))
                       and leader_of(cluster.uri(others[0]), "q"))
        assert new in others
        with connect(cluster.uri(others[1])) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for n in range(100):
                channel.basic_publish("", "q", b"after-%d" % n,
                                      pika.BasicProperties(delivery_mode=2))
        cluster.restart(leader)
        cluster.wait_ready([leader])
        expected = [b"before-%d" % n for n in range(100)] + [b"after-%d" % n for n in range(100)]
        # the restarted node learns what it missed and serves it
        wait_for("the restarted node to catch up", lambda: [
            q for q in call(cluster.uri(leader), "queues.list", vhost="/")
            if q["name"] == "q"][0]["ready"] == 200)
        assert drain(cluster.uri(leader), "q", 200) == expected


def confirmed_within(uri: str, queue: str, body: bytes, seconds: float) -> bool:
    """Publish with confirms (aio-pika); True if the broker confirmed in time."""
    import asyncio

    import aio_pika

    async def publish() -> bool:
        connection = await aio_pika.connect(uri)
        try:
            channel = await connection.channel(publisher_confirms=True)
            message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            try:
                await asyncio.wait_for(channel.default_exchange.publish(message, queue),
                                       seconds)
            except asyncio.TimeoutError:
                return False
            return True
        finally:
            await connection.close()

    return asyncio.run(publish())


def test_a_minority_refuses_work_and_the_majority_comes_back():
    with LocalCluster(3, proxied=False) as cluster:
        first = cluster.uris()[0]
        wait_for("a metadata leader", lambda: status(first)["metadata_leader"])
        with connect(first) as connection:
            connection.channel().queue_declare("q", durable=True,
                                               arguments={"x-queue-type": "quorum"})
        wait_for("a leader", lambda: leader_of(first, "q"))
        survivor, *gone = cluster.names
        for name in gone:
            cluster.kill(name)
        assert not confirmed_within(cluster.uri(survivor), "q", b"in-minority", 3.0), \
            "a single node of three confirmed a publish on its own"
        for name in gone:
            cluster.restart(name)
        cluster.wait_ready(gone)
        with connect(cluster.uri(gone[0])) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", "q", b"in-majority", pika.BasicProperties(delivery_mode=2))
        bodies = []  # "in-minority" is there too if the survivor led and kept it
        try:
            wait_for("'in-majority' delivered", lambda: drain(
                cluster.uri(survivor), "q", into=bodies) and b"in-majority" in bodies)
        except AssertionError as error:  # what each node saw, for the reader
            logs = "\n".join(f"--- {name}\n{cluster.log(name, tail=3000)}"
                             for name in cluster.names)
            raise AssertionError(f"{error}\nreceived: {bodies}; queue as the survivor lists it: "
                                 f"{call(cluster.uri(survivor), 'queues.list', vhost='/')}"
                                 f"\n{logs}") from None
        assert bodies[-1] == b"in-majority"
        assert set(bodies) <= {b"in-minority", b"in-majority"}


def test_a_dead_consumers_messages_come_back():
    with LocalCluster(3, proxied=False) as cluster:
        first = cluster.uris()[0]
        wait_for("a metadata leader", lambda: status(first)["metadata_leader"])
        with connect(first) as connection:
            channel = connection.channel()
            channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
            channel.confirm_delivery()
            for n in range(10):
                channel.basic_publish("", "q", b"%d" % n, pika.BasicProperties(delivery_mode=2))
        leader = wait_for("a leader", lambda: leader_of(first, "q"))
        victim = next(name for name in cluster.names if name != leader)
        # the victim knows the queue's leader (a consume there would find "q" even
        # before: test_declare_visibility.py)
        wait_for("q known on " + victim, lambda: leader_of(cluster.uri(victim), "q"))
        doomed = connect(cluster.uri(victim))
        channel = doomed.channel()
        channel.basic_qos(prefetch_count=10)
        taken = []
        channel.basic_consume("q", lambda ch, method, props, body: taken.append(body))
        wait_for("ten deliveries on " + victim, lambda: doomed.process_data_events(
            time_limit=0.1) or len(taken) == 10)
        cluster.kill(victim)  # unacked, on a node that is gone for good
        other = next(name for name in cluster.names if name not in (leader, victim))
        bodies = sorted(drain(cluster.uri(other), "q", 10))
        assert bodies == sorted(b"%d" % n for n in range(10))


def test_the_whole_cluster_restarts_with_its_metadata_and_messages(tmp_path):
    data = str(tmp_path / "cluster")
    with LocalCluster(3, proxied=False, data_dir=data) as cluster:
        first = cluster.uris()[0]
        wait_for("a metadata leader", lambda: status(first)["metadata_leader"])
        with connect(first) as connection:
            channel = connection.channel()
            channel.exchange_declare("x", "fanout", durable=True)
            channel.queue_declare("kept", durable=True, arguments={"x-queue-type": "quorum"})
            channel.queue_bind("kept", "x")
            channel.confirm_delivery()
            for n in range(20):
                channel.basic_publish("x", "", b"%d" % n, pika.BasicProperties(delivery_mode=2))
    with LocalCluster(3, proxied=False, data_dir=data) as cluster:
        last = cluster.uris()[-1]
        wait_for("a leader for the queue", lambda: leader_of(last, "kept"))
        with connect(last) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("x", "", b"after", pika.BasicProperties(delivery_mode=2))
        assert drain(last, "kept", 21) == [b"%d" % n for n in range(20)] + [b"after"]


def test_a_node_without_a_replica_serves_the_queue_through_its_leader(cluster):
    first = cluster.uris()[0]
    with connect(first) as connection:
        connection.channel().queue_declare("pair", durable=True, arguments={
            "x-queue-type": "quorum", "x-quorum-initial-group-size": 2})
    members = wait_for("the record", lambda: queue_status(first, "pair"))["members"]
    assert len(members) == 2
    outsider = next(name for name in cluster.names if name not in members)
    uri = cluster.uri(outsider)
    wait_for("the record on the outsider", lambda: queue_status(uri, "pair"))
    with connect(uri) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(30):
            channel.basic_publish("", "pair", b"p%d" % n, pika.BasicProperties(delivery_mode=2))
        method, _properties, body = channel.basic_get("pair")
        assert body == b"p0" and not method.redelivered
        channel.basic_nack(method.delivery_tag, requeue=True)
    # the leader sends the outsider's consumer its messages
    bodies = drain(uri, "pair", 30)
    assert sorted(bodies) == sorted(b"p%d" % n for n in range(30))
    for member in members:
        wait_for("the queue empty on " + member, lambda: [
            q for q in call(cluster.uri(member), "queues.list", vhost="/")
            if q["name"] == "pair"][0]["ready"] == 0)


def test_a_follower_behind_the_leaders_snapshot_serves_the_live_messages():
    """A follower that was down while the leader snapshotted and released its log
    gets the snapshot, and still every live message's body: in a cluster no snapshot
    covers a live message."""
    with LocalCluster(3, proxied=False) as cluster:
        first = cluster.uris()[0]
        wait_for("a metadata leader", lambda: status(first)["metadata_leader"])
        with connect(first) as connection:
            connection.channel().queue_declare("behind", durable=True,
                                               arguments={"x-queue-type": "quorum"})
        leader = wait_for("a leader", lambda: leader_of(first, "behind"))
        follower = next(name for name in cluster.names if name != leader)
        cluster.kill(follower)
        with connect(cluster.uri(leader)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for n in range(3000):
                channel.basic_publish("", "behind", b"%d" % n,
                                      pika.BasicProperties(delivery_mode=2))
            channel.basic_qos(prefetch_count=500)
            taken = 0
            for method, _properties, _body in channel.consume("behind"):
                channel.basic_ack(method.delivery_tag)
                taken += 1
                if taken == 2500:
                    break
            channel.cancel()
        cluster.restart(follower)
        cluster.wait_ready([follower])
        wait_for("the follower caught up", lambda: [
            q for q in call(cluster.uri(follower), "queues.list", vhost="/")
            if q["name"] == "behind"][0]["ready"] == 500)
        # (the 500 prefetched past the 2500th came back when the channel closed)
        assert sorted(drain(cluster.uri(follower), "behind", 500), key=int) == [
            b"%d" % n for n in range(2500, 3000)]
        assert "Traceback" not in cluster.log(follower, tail=100_000)


def test_every_node_lists_every_queue_with_the_same_counts(cluster):
    """`queues list` on a node with no replica of a queue shows the counts of the
    queue's members (ready and unacked), not zeros."""
    first = cluster.uris()[0]
    with connect(first) as connection:
        connection.channel().queue_declare("listed", durable=True, arguments={
            "x-queue-type": "quorum", "x-quorum-initial-group-size": 1})
    members = wait_for("the record", lambda: queue_status(first, "listed"))["members"]
    assert len(members) == 1
    with connect(cluster.uri(members[0])) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for n in range(12):
            channel.basic_publish("", "listed", b"%d" % n, pika.BasicProperties(delivery_mode=2))
        method, _properties, _body = channel.basic_get("listed")
        assert method is not None

        def counts(uri: str):
            rows = [q for q in call(uri, "queues.list", vhost="/") if q["name"] == "listed"]
            return rows and (rows[0]["ready"], rows[0]["unacked"], rows[0]["consumers"])

        for uri in cluster.uris():
            assert wait_for(f"the counts on {uri}", lambda: counts(uri) == (11, 1, 1)), uri
        channel.basic_ack(method.delivery_tag)
        for uri in cluster.uris():
            assert wait_for(f"the counts on {uri}", lambda: counts(uri) == (11, 0, 0)), uri

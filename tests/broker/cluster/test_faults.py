"""Fault tests: a 3-node cluster of real processes under a confirmed-publish +
manual-ack workload (tests/support/history.py), with faults injected while it runs:
the queue's leader killed with SIGKILL, a follower paused (SIGSTOP/SIGCONT), a node
cut off from the others by the proxies between nodes and healed.

After each, the checker (tests/support/history.py) asserts: every confirmed message is
delivered at least once, nothing not confirmed is delivered twice as new, nothing is
delivered that was never published. Seeds pick which node gets the fault and when,
so several runs cover different placements; each run takes about ten seconds.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.broker.cluster.test_cluster import leader_of, status
from tests.support.cluster import CONVERGE_TIMEOUT, LocalCluster, wait_for
from tests.support.history import Workload, check

pytestmark = pytest.mark.timeout(400)  # the waits inside have their own bounds

QUEUE = "faults"


def started(cluster: LocalCluster) -> None:
    wait_for("a metadata leader", lambda: all(status(uri)["metadata_leader"]
                                              for uri in cluster.uris()))


def confirmed(workload: Workload) -> int:
    with workload.history.lock:
        return len(workload.history.confirmed)


def run(cluster: LocalCluster, fault, seed: int) -> None:
    """The workload runs until it has confirms, the fault strikes at a seeded moment,
    and the workload must get confirms again after it (waited for, however slow the
    machine) before it stops and its history is checked."""
    rng = random.Random(seed)
    started(cluster)
    with Workload(cluster.live_uris, QUEUE, interval=0.002) as workload:
        leader = wait_for("a leader", lambda: leader_of(cluster.uris()[0], QUEUE))
        wait_for("25 confirms before the fault", lambda: confirmed(workload) >= 25)
        time.sleep(rng.uniform(0.5, 1.5))
        fault(cluster, leader, rng)
        after_fault = confirmed(workload)
        wait_for("25 confirms after the fault", lambda: confirmed(workload) >= after_fault + 25)
        history = workload.finish(drain_timeout=CONVERGE_TIMEOUT)
    report = check(history)
    assert report.confirmed >= after_fault + 25, report  # the workload ran across the fault


def kill_the_leader(cluster: LocalCluster, leader: str, rng: random.Random) -> None:
    cluster.kill(leader)
    wait_for("a new leader", lambda: leader_of(cluster.live_uris()[0], QUEUE)
             not in (None, leader))
    time.sleep(rng.uniform(0.5, 1.5))
    cluster.restart(leader)
    cluster.wait_ready([leader])


def pause_a_follower(cluster: LocalCluster, leader: str, rng: random.Random) -> None:
    follower = rng.choice([name for name in cluster.names if name != leader])
    cluster.pause(follower)
    time.sleep(rng.uniform(1.0, 3.0))
    cluster.resume(follower)


def cut_off(role: str):
    def fault(cluster: LocalCluster, leader: str, rng: random.Random) -> None:
        victim = leader if role == "leader" else rng.choice(
            [name for name in cluster.names if name != leader])
        cluster.isolate(victim, mode=rng.choice(["drop", "stall"]))
        time.sleep(rng.uniform(1.5, 3.0))
        cluster.heal()
    return fault


@pytest.mark.parametrize("seed", [1, 2])
def test_leader_killed_during_the_workload(seed):
    with LocalCluster(3, proxied=False) as cluster:
        run(cluster, kill_the_leader, seed)


@pytest.mark.parametrize("seed", [1])
def test_follower_paused_during_the_workload(seed):
    with LocalCluster(3, proxied=False) as cluster:
        run(cluster, pause_a_follower, seed)


@pytest.mark.parametrize("role,seed", [("leader", 1), ("leader", 2), ("follower", 3)])
def test_node_cut_off_and_healed_during_the_workload(role, seed):
    with LocalCluster(3) as cluster:
        run(cluster, cut_off(role), seed)


def test_a_consumer_on_a_node_without_a_replica_consumes_again_after_a_cut():
    """The queue's leader takes a node cut off for longer than NODE_DOWN_AFTER for
    down: its consumer is suspected and its messages return (a NodeDown in the log,
    broker/fifo/nodes.py). The consumer's node has no replica; once the link heals the
    leader hears it again (a NodeUp), the consumer is reinstated and gets the returned
    and the new messages (before the suspected state, the leader's Down removed it
    and told the node to check out again; earlier still, it waited forever)."""
    import pika

    from quorumqueue.client.management import call

    with LocalCluster(3) as cluster:
        started(cluster)
        first = cluster.uris()[0]
        with pika.BlockingConnection(pika.URLParameters(first)) as connection:
            connection.channel().queue_declare("pair", durable=True, arguments={
                "x-queue-type": "quorum", "x-quorum-initial-group-size": 2})
        members = wait_for("the record", lambda: [
            q for q in call(first, "cluster.status")["queues"] if q["name"] == "pair"])[0][
            "members"]
        outsider = next(name for name in cluster.names if name not in members)
        wait_for("the record on " + outsider, lambda: [
            q for q in call(cluster.uri(outsider), "cluster.status")["queues"]
            if q["name"] == "pair"])
        consumer = pika.BlockingConnection(pika.URLParameters(cluster.uri(outsider)))
        got: list[bytes] = []
        channel = consumer.channel()
        channel.basic_qos(prefetch_count=5)
        channel.basic_consume("pair", lambda ch, method, props, body: got.append(body))

        def publish(bodies):
            with pika.BlockingConnection(pika.URLParameters(cluster.uri(members[0]))) as c:
                publisher = c.channel()
                publisher.confirm_delivery()
                for body in bodies:
                    publisher.basic_publish("", "pair", body,
                                            pika.BasicProperties(delivery_mode=2))

        def received(count):
            return lambda: consumer.process_data_events(time_limit=0.1) or len(got) >= count

        try:
            publish([b"a%d" % n for n in range(5)])
            wait_for("five deliveries on " + outsider, received(5))  # unacked: prefetch full
            cluster.isolate(outsider)
            wait_for("the leader suspecting the outsider's consumer", lambda: any(
                f"'pair' in vhost '/': {outsider} not heard from" in cluster.log(m, 1 << 30)
                for m in members))
            cluster.heal()
            publish([b"b%d" % n for n in range(5)])
            # the five returned (prefetch 5 again) and, as those are acked, the new ones
            wait_for("the returned messages again", received(10))
            assert sorted(got[5:10]) == sorted(b"a%d" % n for n in range(5))
            for tag in range(6, 11):
                channel.basic_ack(tag)
            wait_for("the new messages", received(15))
            assert sorted(got[10:15]) == sorted(b"b%d" % n for n in range(5))
        finally:
            consumer.close()


def test_a_proxied_publish_accepted_by_a_leader_that_restarts_is_confirmed():
    """A node with no replica forwards a publish; the leader appends it and says so,
    but cannot commit it (its only follower is paused), then is killed and restarted:
    the waiter that would have sent the reply died with it. The forwarding node sends
    the publish again — because the leader fell silent, or because its pings carry a
    new boot id, or because the reply is overdue (cluster.REPLY_WITHIN) — and the log
    skips it if the first append survived (its identity): one message, confirmed.
    (Here the restart takes long enough for the silence alone to trigger the resend;
    the fault suite found the case where it does not: a restart quicker than
    REACHABLE_WITHIN left the forward waiting forever before the boot-id check.)"""
    import threading

    import pika

    from quorumqueue.client.management import call

    with LocalCluster(3, proxied=False) as cluster:
        started(cluster)
        first = cluster.uris()[0]
        with pika.BlockingConnection(pika.URLParameters(first)) as connection:
            connection.channel().queue_declare("pair", durable=True, arguments={
                "x-queue-type": "quorum", "x-quorum-initial-group-size": 2})

        def record(uri, led=True):
            return next((q for q in call(uri, "cluster.status")["queues"]
                         if q["name"] == "pair" and (q["leader"] or not led)), None)

        queue = wait_for("the queue's leader", lambda: record(first))
        leader = queue["leader"]
        follower = next(m for m in queue["members"] if m != leader)
        outsider = next(n for n in cluster.names if n not in queue["members"])
        wait_for("the record on " + outsider, lambda: record(cluster.uri(outsider), False))
        cluster.pause(follower)
        confirmed = threading.Event()

        def publish():
            with pika.BlockingConnection(pika.URLParameters(cluster.uri(outsider))) as c:
                channel = c.channel()
                channel.confirm_delivery()
                channel.basic_publish("", "pair", b"once", pika.BasicProperties(
                    delivery_mode=2))
                confirmed.set()

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        try:
            wait_for("the leader's acceptance on " + outsider, lambda: call(
                cluster.uri(outsider), "cluster.status")["awaiting_reply"] == 1)
            cluster.kill(leader)
            cluster.resume(follower)
            cluster.restart(leader)
            wait_for("the publisher's confirm", confirmed.is_set)
        finally:
            if follower in cluster._paused:
                cluster.resume(follower)
            publisher.join(30)
        with pika.BlockingConnection(pika.URLParameters(cluster.uri(outsider))) as c:
            channel = c.channel()
            bodies = []
            while True:
                method, _properties, body = channel.basic_get("pair", auto_ack=True)
                if method is None:
                    break
                bodies.append(body)
        assert bodies == [b"once"]

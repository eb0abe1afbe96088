"""Idle quorum queues whose groups went quiet (Raft quiescing, broker/raft/README.md
"Quiescing") still fail over: once a group is idle its leader sends nothing and its
followers expect nothing, so only the node's failure detector tells a follower that
its leader's node is gone (broker/README.md, "Timers").

The guide's promise is the one under test (quorum queues, "Fault Tolerance and
Minimum Number of Replicas Online": a queue stays available while a majority of its
replicas is): with the groups quiet, the node leading them is killed, or paused
longer than an election; every queue must then take a confirmed publish on the
other nodes and give it back, and once the node is back every queue must work
through it too, its stale leaders having stepped down.

"Quiet" is seen from outside, on the links between the nodes: the cluster's
proxies forward a few bytes a second (the failure detector's pings) instead of
every group's heartbeats.
"""

from __future__ import annotations

import threading
import time

import pika
import pytest

from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import connect
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(600)  # the waits inside have their own bounds

QUEUES = [f"idle-{n}" for n in range(20)]
# Bytes a second on all the links together: the six links' pings came to 500-1,000
# (measured quiet, 2026-12-04); 20 groups' heartbeats (every 100 ms to each follower)
# add several KB a second.
QUIET_BYTES_PER_SECOND = 2_000
ROUND_TRIP_TIMEOUT = 20.0  # one publish's confirm and get; tried again until FAILOVER_TIMEOUT
FAILOVER_TIMEOUT = 120.0  # all queues; a busy machine: detection (3 s), then elections


def declared(cluster: LocalCluster) -> str:
    """Declare QUEUES through the first node; wait until each has a leader that every
    node knows, with every replica online. Returns the node leading the most."""
    first = cluster.uri(cluster.names[0])
    wait_for("a metadata leader on every node", lambda: all(
        call(uri, "cluster.status")["metadata_leader"] for uri in cluster.uris()))
    with connect(first) as connection:
        channel = connection.channel()
        for queue in QUEUES:
            channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})

    def leaders() -> dict[str, str] | None:
        seen = {}
        for name in cluster.names:
            rows = {row["name"]: row for row in call(cluster.uri(name), "cluster.status")["queues"]}
            for queue in QUEUES:
                row = rows.get(queue)
                if (row is None or row["leader"] is None
                        or sorted(row["online"]) != sorted(cluster.names)
                        or seen.setdefault(queue, row["leader"]) != row["leader"]):
                    return None
        return seen

    led = wait_for("every queue led, every replica online", leaders)
    return max(cluster.names, key=list(led.values()).count)


def link_bytes(cluster: LocalCluster) -> int:
    return sum(sum(proxy.bytes_forwarded.values()) for proxy in cluster.proxies.values())


def quiet(cluster: LocalCluster) -> bool:
    """Over two seconds, the links between the nodes carried only pings."""
    before = link_bytes(cluster)
    time.sleep(2.0)
    return link_bytes(cluster) - before < 2 * QUIET_BYTES_PER_SECOND


def round_trip(publish_uri: str, get_uri: str, queue: str, body: bytes) -> bool:
    """A confirmed publish through one node, then basic.get through another until the
    body comes back (copies of an earlier try are taken on the way); in a thread of
    its own, so a publish that no leader answers ends in TimeoutError."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(_round_trip(publish_uri, get_uri, queue, body))
        except Exception as error:  # noqa: BLE001 - raised below
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(ROUND_TRIP_TIMEOUT)
    if not outcome:
        raise TimeoutError(f"no confirm and get within {ROUND_TRIP_TIMEOUT:g} s")
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


def _round_trip(publish_uri: str, get_uri: str, queue: str, body: bytes) -> bool:
    with connect(publish_uri) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    with connect(get_uri) as connection:
        channel = connection.channel()
        while True:
            method, _properties, got = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return False
            if got == body:
                return True


def every_queue_works(publish_uri: str, get_uri: str, what: str) -> None:
    """Each queue round-trips a message, all within FAILOVER_TIMEOUT."""
    deadline = time.monotonic() + FAILOVER_TIMEOUT
    for queue in QUEUES:
        body = f"{what} {queue}".encode()
        wait_for(f"{queue}: {what}", lambda queue=queue, body=body: round_trip(
            publish_uri, get_uri, queue, body),
            timeout=max(1.0, deadline - time.monotonic()), interval=0.5)


def test_quiet_groups_whose_leader_was_killed_elect_and_take_it_back_when_it_returns():
    with LocalCluster(3) as cluster:
        victim = declared(cluster)
        a, b = [name for name in cluster.names if name != victim]
        wait_for("the idle groups quiet", lambda: quiet(cluster), timeout=60)
        cluster.kill(victim)
        every_queue_works(cluster.uri(a), cluster.uri(b), "after the kill")
        cluster.restart(victim)
        every_queue_works(cluster.uri(victim), cluster.uri(a), "through the restarted node")
        every_queue_works(cluster.uri(b), cluster.uri(victim), "got from the restarted node")


def test_quiet_groups_whose_leader_was_paused_elect_and_the_stale_leaders_step_down():
    with LocalCluster(3) as cluster:
        victim = declared(cluster)
        a, b = [name for name in cluster.names if name != victim]
        wait_for("the idle groups quiet", lambda: quiet(cluster), timeout=60)
        cluster.pause(victim)
        try:
            every_queue_works(cluster.uri(a), cluster.uri(b), "while the leader is paused")
            # the new leaders quiet too, so nothing tells the paused node of them but
            # its own failure detector, or a message when a group wakes
            wait_for("the new leaders quiet", lambda: quiet(cluster), timeout=60)
        finally:
            cluster.resume(victim)
        every_queue_works(cluster.uri(victim), cluster.uri(a), "through the resumed node")
        every_queue_works(cluster.uri(b), cluster.uri(victim), "got from the resumed node")

"""Classic queues' leader location on a 3-node cluster of real processes with RabbitMQ
3.13's switch `deprecated_features.permit.classic_queue_mirroring = true`, as the
"Classic Queue Mirroring" guide's "Queue Leader Location" gives it
(x-queue-master-locator): client-local puts the leader on the declaring connection's
node, min-masters on the node leading the fewest queues, random on a node at random.
The choice itself is unit-tested in tests/broker/queues/test_leader_location.py."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import connect, status
from tests.broker.cluster.test_mirrored_queues import CONFIG, started
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(600)


def leaders(uri: str) -> dict[str, str]:
    """queue name -> its leader's node, as the node at `uri` lists them."""
    return {line["name"]: line["leader"] for line in call(uri, "queues.list", vhost="/")}


def declare(uri: str, names, locator: str) -> None:
    with connect(uri) as connection:
        channel = connection.channel()
        for name in names:
            channel.queue_declare(name, durable=True,
                                  arguments={"x-queue-master-locator": locator})


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as running:
        yield started(running)


def test_client_local_min_masters_and_random(cluster):
    names = cluster.names
    uris = cluster.uris()
    # client-local: the declaring connection's node, whichever it is
    for uri, name in zip(uris, names):
        declare(uri, [f"local.{name}"], "client-local")
        assert leaders(uri)[f"local.{name}"] == name
    declare(uris[0], ["local.more.1", "local.more.2"], "client-local")  # first: 3 queues

    # min-masters: each new queue goes to a node leading the fewest, whatever node
    # the client is connected to; the first two to the nodes with one queue each
    placed = []
    for i in range(4):
        before = Counter(leaders(uris[0]).values())
        declare(uris[0], [f"min.{i}"], "min-masters")
        leader = leaders(uris[0])[f"min.{i}"]
        assert before[leader] == min(before[n] for n in names), (i, before, leader)
        placed.append(leader)
    assert set(placed[:2]) == set(names[1:])

    # random: not balanced; 30 queues are not all on one node (3 ** -29 by chance),
    # and not each on a node leading the fewest, as balanced would put them (by chance
    # about (2/9) ** 10: each round of three, 2/3 then 1/3)
    on_least = []
    for i in range(30):
        before = Counter(leaders(uris[1]).values())
        declare(uris[1], [f"random.{i}"], "random")
        on_least.append(before[leaders(uris[1])[f"random.{i}"]]
                        == min(before[n] for n in names))
    shown = leaders(uris[1])
    assert len({shown[f"random.{i}"] for i in range(30)}) > 1
    assert not all(on_least)

    # a node stopped: neither min-masters nor random places a queue there, even
    # when it leads the fewest (balanced counts every node of the cluster)
    counts = Counter(leaders(uris[0]).values())
    victim = min(names[1:], key=lambda n: counts[n])
    for uri, name in zip(uris, names):  # the others lead more than the victim
        if name != victim and counts[name] <= counts[victim]:
            declare(uri, [f"fill.{name}.{i}" for i in
                          range(counts[victim] - counts[name] + 1)], "client-local")
    counts = Counter(leaders(uris[0]).values())
    assert counts[victim] < min(counts[n] for n in names if n != victim)
    cluster.kill(victim, signal.SIGTERM)
    wait_for(f"{victim} unreachable from {names[0]}", lambda: not next(
        n for n in status(uris[0])["nodes"] if n["name"] == victim)["reachable"],
             timeout=60)
    declare(uris[0], ["min.down.1", "min.down.2"], "min-masters")
    declare(uris[0], [f"random.down.{i}" for i in range(10)], "random")
    shown = leaders(uris[0])
    assert victim not in {shown["min.down.1"], shown["min.down.2"]}
    assert victim not in {shown[f"random.down.{i}"] for i in range(10)}

"""Mirrored classic queues whose mirrors keep their copy on disk, on 3-node clusters of
real processes (queues/mirroring.py Replica, cluster/mirror_link.py, node/metadata.py
forget_node), as RabbitMQ 3.13's "Classic Queue Mirroring" guide describes them:

- a mirror keeps its own copy of a durable queue's persistent messages in its node's
  message store (acknowledged to the leader, and confirmed to the publisher, only
  once on disk): with the leader's node killed and its data gone, and every other
  node restarted, the mirror promoted still has every confirmed persistent message;
- "Loss of a Leader While All Mirrors are Stopped": mirrors started while their
  leader's node is down keep their copy and do not take over by themselves (the last
  node to stop leads when it starts again: "it may have received messages that no
  other mirror saw"); `forget_cluster_node` of the lost leader's node promotes one of
  them, with its copy, and a mirror stopped at that moment leads once it starts; of
  several candidates "the most recently stopped mirror" (the queue's
  `stopped_mirrors`, recorded as their nodes announce a controlled shutdown);
- "Stopping Nodes and Synchronisation": a mirror that rejoins its leader throws its
  stored copy away and starts empty; one back from a stop is a new, unsynchronised
  mirror, so the leader's loss (forgotten) keeps every confirmed message when a
  synchronised mirror is left, promotes nothing under ha-promote-on-failure
  when-synced, and loses what only the leader held under `always`.

Where quorumqueue differs (README "Mirrored classic queues"): forgetting a node is a
metadata command, so it needs a majority of the metadata group running, and the nodes
may start in any order.
"""

from __future__ import annotations

import shutil
import signal
import threading

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main

from tests.broker.cluster.test_cluster import connect, status
from tests.broker.cluster.test_mirrored_queues import (CONFIG, get_all, mirrored_on_every_node,
                                                       mirrors_everywhere,
                                                       publish, row, run, set_policy,
                                                       started)
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(600)

RESTARTED = "this mirror's copy dates from before its node restarted"


def restart_without(cluster: LocalCluster, nodes) -> None:
    """Start `nodes` again (stopped) and wait until they have a metadata leader."""
    for node in nodes:
        cluster.restart(node)
    for uri in cluster.uris(nodes):
        wait_for(f"a metadata leader seen from {uri}",
                 lambda uri=uri: status(uri)["metadata_leader"], timeout=60)


def unavailable(uri: str, queue: str) -> str:
    with connect(uri) as connection:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
            connection.channel().basic_get(queue)
    return f"{error.value.reply_code} {error.value}"


def test_a_leader_lost_while_every_mirror_was_down_is_replaced_by_forget_cluster_node():
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris, urls = cluster.uris(), cluster.management_urls()
        mirrored_on_every_node(cluster, "ha.kept")
        publish(uris[1], "ha.kept", [b"m%d" % n for n in range(40)])   # all confirmed
        with connect(uris[0]) as connection:  # a transient one: lost with the nodes
            connection.channel().basic_publish("", "ha.kept", b"transient")
        consumer = connect(uris[2])
        channel = consumer.channel()
        for n in range(5):   # acked: gone from every copy
            method, _props, body = channel.basic_get("ha.kept")
            assert body == b"m%d" % n
            channel.basic_ack(method.delivery_tag)
        for n in range(5, 8):  # delivered, never acked: they come back redelivered
            method, _props, body = channel.basic_get("ha.kept")
            assert body == b"m%d" % n
        wait_for("the acks applied", lambda: row(uris[2], "ha.kept")["ready"] == 33)

        # the leader's node dies and never comes back; the mirrors' nodes die too,
        # before they could take over (a node is down after 5 s of silence)
        cluster.kill(one, signal.SIGKILL)
        cluster.kill(two, signal.SIGKILL)
        cluster.kill(three, signal.SIGKILL)
        shutil.rmtree(cluster.plans[0].data_dir)
        restart_without(cluster, [two, three])
        live = cluster.uris([two, three])

        # they do not take over by themselves: the leader may hold what they never saw
        wait_for("the oldest synchronised mirror deciding to wait",
                 lambda: RESTARTED in cluster.log(two), timeout=60)
        assert row(uris[2], "ha.kept")["leader"] == one
        assert "is down or inaccessible" in unavailable(uris[1], "ha.kept")

        out = run("ctl", "forget_cluster_node", "--base-uri", urls[2], one).output
        assert f"Removing node {one} from the cluster" in out
        # the oldest synchronised mirror leads with its stored copy; the other one
        # rejoins it as a new mirror
        mirrors_everywhere(live, "ha.kept", two, [three], None)
        got = get_all(uris[2], "ha.kept")
        assert sorted(body for body, _ in got) == sorted(b"m%d" % n for n in range(5, 40))
        assert {body for body, again in got if again} == {b"m5", b"m6", b"m7"}
        assert "its leader's node " + one + " is forgotten" in cluster.log(two, tail=100_000)


def test_mirrors_started_before_their_leader_wait_for_it_and_rejoin_it_empty():
    """The guide: "the last node for a queue to shut down will become the leader, and
    we want that node to still be the leader when it starts again"; a mirror rejoining
    "throws away any durable local contents it already has and starts empty"."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris = cluster.uris()
        mirrored_on_every_node(cluster, "ha.order")
        publish(uris[1], "ha.order", [b"m%d" % n for n in range(20)])
        for node in (three, two, one):
            cluster.kill(node, signal.SIGKILL)

        restart_without(cluster, [two, three])   # the mirrors first, in any order
        wait_for("the mirror deciding to wait", lambda: RESTARTED in cluster.log(two),
                 timeout=60)
        assert "is down or inaccessible" in unavailable(uris[2], "ha.order")
        cluster.restart(one)                       # the leader leads again
        cluster.wait_ready([one])
        # they rejoin empty (their stored copies are dropped), synchronised once the
        # messages they lack are consumed
        mirrors_everywhere(uris, "ha.order", one, [two, three], [])
        got = get_all(uris[2], "ha.order")
        assert sorted(body for body, _ in got) == sorted(b"m%d" % n for n in range(20))
        mirrors_everywhere(uris, "ha.order", one, [two, three], [two, three])
        publish(uris[0], "ha.order", [b"after"])

        # two's copy holds only what it was sent since it rejoined: promoted, it serves
        # no message of its old stored copy
        cluster.kill(one, signal.SIGKILL)
        mirrors_everywhere(cluster.uris([two, three]), "ha.order", two, [three], [three])
        assert [body for body, _ in get_all(uris[1], "ha.order")] == [b"after"]
        # and stopped and started again, its store holds nothing old either
        cluster.kill(three, signal.SIGKILL)
        cluster.restart(two)
        cluster.wait_ready([two])
        cluster.restart(three)
        cluster.wait_ready([three])
        wait_for("the queue back, empty", lambda: (line := row(uris[1], "ha.order"))
                 is not None and line["leader"] == two and line["ready"] == 0, timeout=90)
        with connect(uris[1]) as connection:
            method, _props, _body = connection.channel().basic_get("ha.order")
            assert method is None


def test_forgetting_the_leaders_node_promotes_a_stopped_mirror_when_it_starts():
    """The guide: forget_cluster_node finds "a currently stopped mirror for each queue
    which has its leader on the node we are forgetting, and "promote[s]" that mirror
    to be the new leader when it starts up again". Five nodes, so that three of them
    (a majority of the metadata group) forget the leader's node while its only
    mirror's node is stopped."""
    with LocalCluster(5, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three, _four, _five = cluster.names
        uris, urls = cluster.uris(), cluster.management_urls()
        set_policy(uris[0], "ha-two", r"^ha\.", {"ha-mode": "exactly", "ha-params": 2})
        with connect(uris[0]) as connection:
            connection.channel().queue_declare("ha.stopped", durable=True)
        mirrors_everywhere(uris, "ha.stopped", one, [two], [two])
        publish(uris[3], "ha.stopped", [b"m%d" % n for n in range(25)])
        cluster.kill(one, signal.SIGKILL)
        cluster.kill(two, signal.SIGKILL)
        shutil.rmtree(cluster.plans[0].data_dir)

        # refused while the node still counts as reachable (silent for under 5 s)
        wait_for(f"{one} forgotten", lambda: CliRunner().invoke(main, [
            "ctl", "forget_cluster_node", "--base-uri", urls[2], one]).exit_code == 0,
            timeout=60)
        # the record names the stopped mirror as leader at once; it leads once started
        wait_for("the stopped mirror named leader", lambda: all(
            row(uri, "ha.stopped")["leader"] == two for uri in cluster.uris([2, 3, 4])),
            timeout=60)
        assert "is down or inaccessible" in unavailable(uris[2], "ha.stopped")
        cluster.restart(two)
        cluster.wait_ready([two])
        live = cluster.uris([1, 2, 3, 4])
        wait_for("the queue served by its new leader", lambda: all(
            (line := row(uri, "ha.stopped")) is not None and line["leader"] == two
            and line["ready"] == 25 for uri in live), timeout=90)
        got = get_all(uris[4], "ha.stopped")
        assert [body for body, _ in got] == [b"m%d" % n for n in range(25)]
        # the policy gives it a mirror again
        wait_for("a new mirror", lambda: len(row(uris[1], "ha.stopped").get("mirrors",
                                                                            [])) == 1,
                 timeout=60)


def test_a_mirror_back_from_a_stop_is_a_new_unsynchronised_mirror_when_its_leader_is_lost():
    """A mirror's node stops; its leader confirms without it once it has left the
    mirrors (and the synchronised ones: "Should a mirror fail... some bookkeeping");
    the node starts again and its mirror rejoins empty and unsynchronised ("Stopping
    Nodes and Synchronisation"); then the leader's node is lost and forgotten. With
    a synchronised mirror the queue keeps every confirmed message; with only the
    returned, unsynchronised one under ha-promote-on-failure when-synced, nothing is
    promoted ("Promotion of Unsynchronised Mirrors on Failure": a leader "removed
    from the cluster" too; the queue is unavailable) rather than serving a copy
    without the confirmed messages; under `always` (the default) it is promoted and
    the messages only the leader held are lost, as the guide says."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris, urls = cluster.uris(), cluster.management_urls()
        set_policy(uris[0], "ha-all", r"^ha\.all$", {"ha-mode": "all"})
        set_policy(uris[0], "ha-pair", r"^ha\.pair$", {
            "ha-mode": "nodes", "ha-params": [one, two],
            "ha-promote-on-failure": "when-synced"})
        set_policy(uris[0], "ha-pair-always", r"^ha\.pair\.always$", {
            "ha-mode": "nodes", "ha-params": [one, two]})
        pairs = ("ha.pair", "ha.pair.always")
        with connect(uris[0]) as connection:
            channel = connection.channel()
            for name in ("ha.all", *pairs):
                channel.queue_declare(name, durable=True)
        mirrors_everywhere(uris, "ha.all", one, [two, three], [two, three])
        for name in pairs:
            mirrors_everywhere(uris, name, one, [two], [two])

        cluster.kill(two, signal.SIGKILL)
        live = cluster.uris([one, three])
        mirrors_everywhere(live, "ha.all", one, [three], [three])
        for name in pairs:
            mirrors_everywhere(live, name, one, [], [])
        confirmed = [b"m%d" % n for n in range(20)]
        for name in ("ha.all", *pairs):
            publish(uris[2], name, confirmed)   # confirmed without two

        cluster.restart(two)
        cluster.wait_ready([two])
        mirrors_everywhere(uris, "ha.all", one, [three, two], [three])
        for name in pairs:
            mirrors_everywhere(uris, name, one, [two], [])
        cluster.kill(one, signal.SIGKILL)
        shutil.rmtree(cluster.plans[0].data_dir)
        wait_for(f"{one} forgotten", lambda: CliRunner().invoke(main, [
            "ctl", "forget_cluster_node", "--base-uri", urls[2], one]).exit_code == 0,
            timeout=90)

        live = cluster.uris([two, three])
        mirrors_everywhere(live, "ha.all", three, [two], None)
        assert sorted(body for body, _ in get_all(uris[1], "ha.all")) == sorted(confirmed)
        assert row(uris[1], "ha.pair")["leader"] == one   # two was not promoted
        assert "is down or inaccessible" in unavailable(uris[1], "ha.pair")
        wait_for("the refusal logged", lambda: "no mirror was synchronised" in
                 cluster.log(three, tail=100_000), timeout=30)
        # the documented loss: under `always` the unsynchronised mirror leads, without
        # the messages confirmed while it was away
        wait_for("ha.pair.always led by its mirror", lambda: all(
            row(uri, "ha.pair.always")["leader"] == two for uri in live), timeout=60)
        assert get_all(uris[1], "ha.pair.always") == []


def test_a_mirror_restarted_at_once_rejoins_unsynchronised_and_holds_no_confirm_back():
    """A mirror's node killed and started again at once (maybe before its leader
    counted it down): the leader knows the new run, the mirror leaves the record and
    rejoins empty and unsynchronised; the publishes confirmed meanwhile (whatever
    the dead run never acknowledged is released once it left) survive the leader's
    kill on the synchronised mirror."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris = cluster.uris()
        mirrored_on_every_node(cluster, "ha.quick")
        publish(uris[2], "ha.quick", [b"before"])

        cluster.kill(two, signal.SIGKILL)
        done: list = []
        publisher = threading.Thread(target=lambda: done.append(publish(
            uris[2], "ha.quick", [b"m%d" % n for n in range(10)])), daemon=True)
        publisher.start()
        cluster.restart(two)
        publisher.join(timeout=90)
        assert done == [None]                       # every publish confirmed
        mirrors_everywhere(uris, "ha.quick", one, [three, two], [three])
        publish(uris[2], "ha.quick", [b"after"])

        cluster.kill(one, signal.SIGKILL)
        mirrors_everywhere(cluster.uris([two, three]), "ha.quick", three, [two], None)
        got = sorted(body for body, _ in get_all(uris[1], "ha.quick"))
        assert got == sorted([b"before", b"after", *(b"m%d" % n for n in range(10))])


def test_forget_cluster_node_promotes_the_most_recently_stopped_mirror():
    """"Loss of a Leader While All Mirrors are Stopped": "If there is more than one
    candidate, the most recently stopped mirror will be chosen". The first mirror
    in join order stops first (its stop recorded: `stopped_mirrors`), the second
    one after it, then the leader is lost for good: forget_cluster_node makes the
    second one the leader, with its stored copy."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris, urls = cluster.uris(), cluster.management_urls()
        mirrored_on_every_node(cluster, "ha.order")
        publish(uris[0], "ha.order", [b"m%d" % n for n in range(10)])

        cluster.kill(two, signal.SIGTERM)  # a controlled shutdown, announced
        wait_for(f"{two}'s stop in the record", lambda: (row(uris[2], "ha.order") or {})
                 .get("stopped_mirrors") == [two], timeout=60)
        cluster.kill(three, signal.SIGTERM)  # later (the metadata group has no
        cluster.kill(one, signal.SIGKILL)    # majority left to record it)
        shutil.rmtree(cluster.plans[0].data_dir)
        restart_without(cluster, [two, three])
        live = cluster.uris([two, three])

        out = run("ctl", "forget_cluster_node", "--base-uri", urls[2], one).output
        assert f"Removing node {one} from the cluster" in out
        mirrors_everywhere(live, "ha.order", three, [two], None)
        got = get_all(uris[2], "ha.order")
        assert sorted(body for body, _ in got) == sorted(b"m%d" % n for n in range(10))

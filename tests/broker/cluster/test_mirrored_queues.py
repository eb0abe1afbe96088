"""Mirrored classic queues on 3-node clusters of real processes (queues/mirroring.py,
cluster/mirror_link.py), with RabbitMQ 3.13's switch
`deprecated_features.permit.classic_queue_mirroring = true`, as the "Classic Queue
Mirroring" guide describes them:

- "Queue Arguments that Control Mirroring": ha-mode all / exactly / nodes place the
  mirrors (unknown node names ignored); a policy change adds or removes mirrors of
  existing queues; a queue no policy mirrors has none;
- "Mirroring of Exclusive Queues": never mirrored;
- "Unsynchronised Mirrors": a mirror added to a queue holding messages starts
  unsynchronised, and is synchronised once those messages are consumed, or by
  ha-sync-mode automatic;
- "Mirrored Queue Implementation and Semantics" and "Publisher Confirms": confirmed
  messages survive the leader's node being killed when a synchronised mirror exists;
  unacknowledged ones come back redelivered; a consumer with x-cancel-on-ha-failover
  gets basic.cancel;
- "How to Check if a Queue is Mirrored?" and "Unsynchronised Mirrors":
  `ctl list_queues name policy pid slave_pids synchronised_slave_pids`, `queues
  list`'s mirrors, the management API's slave_nodes, `ctl sync_queue` / `cancel_sync_queue`, and rabbitmq-queues'
  `check_if_node_is_mirror_sync_critical`;
- "Promotion of Unsynchronised Mirrors on Failure": under ha-promote-on-failure
  "always" (the default) an unsynchronised mirror is promoted and the messages only
  the leader held are lost (asserted); under "when-synced" it is not, and the queue
  waits for its leader (its durable messages come back with it), or is deleted and
  redeclared;
- "Examples" (the guide's policies through ctl and the HTTP API), "'nodes' Policy
  and Migrating Leaders" (consumers as after a failover), ha-mode exactly 1 and
  "Non-mirrored Queue Behavior in a Cluster" (durable or not).
docs/behaviour/classic-queue-mirroring.md's "The guide, section by section" maps every section to its test.
"""

from __future__ import annotations

import signal
import threading

import pika
import pytest
from click.testing import CliRunner

from quorumqueue.cli.main import main
from quorumqueue.client.management import call
from tests.broker.cluster.test_cluster import connect, status
from tests.broker.management.support import call as management_call
from tests.broker.management.support import wait_until_serving
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(600)

PERSISTENT = pika.BasicProperties(delivery_mode=2)
CONFIG = "deprecated_features.permit.classic_queue_mirroring = true\n"


def row(uri: str, name: str) -> dict | None:
    for line in call(uri, "queues.list", vhost="/"):
        if line["name"] == name:
            return line
    return None


def set_policy(uri: str, name: str, pattern: str, definition: dict) -> None:
    call(uri, "policies.set", vhost="/", name=name, pattern=pattern,
         definition=definition, priority=0, apply_to="queues")


def clear_policy(uri: str, name: str) -> None:
    call(uri, "policies.clear", vhost="/", name=name)


def mirrors_everywhere(uris, name: str, leader: str, mirrors, synced=None) -> None:
    """Every node lists the queue with this leader and these mirrors (None: not
    mirrored), in join order, and these synchronised ones (None: any)."""
    def shown(uri):
        line = row(uri, name)
        if line is None or line["leader"] != leader:
            return False
        if mirrors is None:
            return "mirrors" not in line
        return line.get("mirrors") == list(mirrors) and (
            synced is None or sorted(line["synchronised_mirrors"]) == sorted(synced))

    for uri in uris:
        wait_for(f"{name} on {uri}: leader {leader}, mirrors {mirrors}, synced {synced}",
                 lambda: shown(uri), timeout=60)


def mirrored_on_every_node(cluster, queue: str) -> None:
    r"""Policy ha-all (`^ha\.`, ha-mode all), durable `queue` declared on the first node,
    until every node sees it led there with the other two as synchronised mirrors."""
    one, two, three = cluster.names
    uris = cluster.uris()
    set_policy(uris[0], "ha-all", r"^ha\.", {"ha-mode": "all"})
    with connect(uris[0]) as connection:
        connection.channel().queue_declare(queue, durable=True)
    mirrors_everywhere(uris, queue, one, [two, three], [two, three])


def publish(uri: str, queue: str, bodies) -> None:
    with connect(uri) as connection:
        channel = connection.channel()
        channel.confirm_delivery()  # a nack raises
        for body in bodies:
            channel.basic_publish("", queue, body, PERSISTENT)


def get_all(uri: str, queue: str) -> list[tuple[bytes, bool]]:
    """Every ready message (body, redelivered), acked."""
    out = []
    with connect(uri) as connection:
        channel = connection.channel()
        while True:
            method, _properties, body = channel.basic_get(queue)
            if method is None:
                return out
            out.append((body, method.redelivered))
            channel.basic_ack(method.delivery_tag)


def started(cluster: LocalCluster) -> LocalCluster:
    wait_for("every node reachable from every other", lambda: all(
        all(n["reachable"] for n in status(uri)["nodes"]) and status(uri)["metadata_leader"]
        for uri in cluster.uris()))
    return cluster


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as running:
        yield started(running)


def test_each_ha_mode_places_mirrors_and_policy_changes_follow(cluster):
    one, two, three = cluster.names
    uris = cluster.uris()
    with connect(uris[0]) as connection:
        channel = connection.channel()
        for name in ("ha.all", "ha.two", "ha.nodes", "plain.q"):
            channel.queue_declare(name, durable=True)
        # "Mirroring of Exclusive Queues": never mirrored, even when a policy says so
        # (nor durable, even if declared as such)
        channel.queue_declare("ha.exclusive", exclusive=True, durable=True)
        set_policy(uris[1], "ha-all", r"^ha\.(all|exclusive)$", {"ha-mode": "all"})
        set_policy(uris[1], "ha-two", r"^ha\.two$", {"ha-mode": "exactly", "ha-params": 2})
        set_policy(uris[1], "ha-nodes", r"^ha\.nodes$",
                   {"ha-mode": "nodes", "ha-params": [one, three, "rabbit@nowhere"]})
        mirrors_everywhere(uris, "ha.all", one, [two, three], [two, three])
        mirrors_everywhere(uris, "ha.two", one, [two], [two])
        mirrors_everywhere(uris, "ha.nodes", one, [three], [three])
        mirrors_everywhere(uris, "plain.q", one, None)
        mirrors_everywhere(uris, "ha.exclusive", one, None)
        # "How to Check if a Queue is Mirrored?": "When a new queue mirror is added,
        # the event is logged" (on the leader's node)
        leader_log = cluster.log(one, tail=200_000)
        for name, added in (("ha.all", (two, three)), ("ha.two", (two,)),
                            ("ha.nodes", (three,))):
            for mirror in added:
                assert (f"Mirrored queue '{name}' in vhost '/': Adding mirror on node "
                        f"{mirror}") in leader_log
        assert "Mirrored queue 'ha.exclusive'" not in leader_log

        # a policy change: all -> exactly 2 keeps the oldest mirror; cleared: unmirrored
        set_policy(uris[2], "ha-all", r"^ha\.(all|exclusive)$",
                   {"ha-mode": "exactly", "ha-params": 2})
        mirrors_everywhere(uris, "ha.all", one, [two], [two])
        clear_policy(uris[2], "ha-two")
        mirrors_everywhere(uris, "ha.two", one, None)
        # and a queue made mirrored later: "it is valid to create a non-mirrored queue,
        # and then make it mirrored at some later point"
        set_policy(uris[0], "plain", r"^plain\.q$", {"ha-mode": "all"})
        mirrors_everywhere(uris, "plain.q", one, [two, three], [two, three])
        for name in ("ha.all", "ha.two", "ha.nodes", "plain.q"):
            channel.queue_delete(name)
    for policy in ("ha-all", "ha-nodes", "plain"):
        clear_policy(uris[0], policy)


def test_a_new_mirror_starts_unsynchronised_and_synchronises_as_old_messages_drain(cluster):
    one, two, _three = cluster.names
    uris = cluster.uris()
    with connect(uris[0]) as connection:
        connection.channel().queue_declare("sync.manual", durable=True)
    publish(uris[0], "sync.manual", [b"old-%d" % n for n in range(5)])
    set_policy(uris[0], "sync-manual", r"^sync\.manual$",
               {"ha-mode": "exactly", "ha-params": 2})
    mirrors_everywhere(uris, "sync.manual", one, [two], [])   # ha-sync-mode manual
    publish(uris[1], "sync.manual", [b"new"])
    drained = get_all(uris[2], "sync.manual")
    assert [body for body, _ in drained] == [b"old-%d" % n for n in range(5)] + [b"new"]
    mirrors_everywhere(uris, "sync.manual", one, [two], [two])

    with connect(uris[0]) as connection:
        connection.channel().queue_declare("sync.auto", durable=True)
    publish(uris[0], "sync.auto", [b"old"])
    set_policy(uris[0], "sync-auto", r"^sync\.auto$",
               {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic",
                "ha-sync-batch-size": 1})
    mirrors_everywhere(uris, "sync.auto", one, [two], [two])
    assert row(uris[1], "sync.auto")["ready"] == 1
    for policy in ("sync-manual", "sync-auto"):
        clear_policy(uris[0], policy)
    with connect(uris[0]) as connection:
        channel = connection.channel()
        channel.queue_delete("sync.manual")
        channel.queue_delete("sync.auto")


def test_a_nodes_policy_without_the_leader_moves_it_once_a_mirror_is_synchronised(cluster):
    """"'nodes' Policy and Migrating Leaders": the leader stays until a listed mirror
    is synchronised, then the queue goes on there, with what it held."""
    one, two, three = cluster.names
    uris = cluster.uris()
    with connect(uris[0]) as connection:
        connection.channel().queue_declare("move.q", durable=True)
    publish(uris[0], "move.q", [b"old"])
    set_policy(uris[1], "move", r"^move\.q$", {"ha-mode": "nodes", "ha-params": [three]})
    mirrors_everywhere(uris, "move.q", one, [three], [])  # [A C]: the leader stays
    publish(uris[1], "move.q", [b"new"])
    with connect(uris[1]) as connection:
        channel = connection.channel()
        method, _properties, body = channel.basic_get("move.q")
        assert body == b"old"
        channel.basic_ack(method.delivery_tag)   # "old" drained: three is synchronised
    mirrors_everywhere(uris, "move.q", three, [], [])
    assert get_all(uris[0], "move.q") == [(b"new", False)]
    clear_policy(uris[1], "move")
    with connect(uris[0]) as connection:
        connection.channel().queue_delete("move.q")


def test_a_nodes_policy_moving_the_leader_is_a_failover_for_its_consumers(cluster):
    """"'nodes' Policy and Migrating Leaders": "once synchronisation has occurred
    things will proceed just as if the node had failed": a consumer that consumed
    with x-cancel-on-ha-failover gets basic.cancel, one that did not is consumed
    again at the new leader (what RabbitMQ's channel does when its queue's leader
    goes: it re-issues the consume unless the consumer asked to be cancelled)."""
    one, _two, three = cluster.names
    uris = cluster.uris()
    with connect(uris[0]) as connection:
        connection.channel().queue_declare("move.consumed", durable=True)
    watcher = connect(uris[1])
    try:
        plain, notified = watcher.channel(), watcher.channel()
        got = []
        plain.basic_consume("move.consumed", lambda ch, method, props, body: (
            got.append(body), ch.basic_ack(method.delivery_tag)))
        cancelled = []
        notified.add_on_cancel_callback(lambda frame: cancelled.append(frame))
        notified.basic_consume("move.consumed", lambda *args: None,
                               arguments={"x-cancel-on-ha-failover": True})
        wait_for("both consumers registered",
                 lambda: row(uris[0], "move.consumed")["consumers"] == 2)
        set_policy(uris[2], "move-c", r"^move\.consumed$",
                   {"ha-mode": "nodes", "ha-params": [three]})
        # empty: the mirror on three is synchronised at once, and the leader moves
        mirrors_everywhere(uris, "move.consumed", three, [], [])
        wait_for("basic.cancel for the x-cancel-on-ha-failover consumer",
                 lambda: watcher.process_data_events(0.2) or cancelled)
        publish(uris[0], "move.consumed", [b"after"])
        wait_for("the other consumer served by the new leader",
                 lambda: watcher.process_data_events(0.2) or got)
        assert got == [b"after"]
        assert row(uris[2], "move.consumed")["consumers"] == 1
    finally:
        watcher.close()
    clear_policy(uris[0], "move-c")
    with connect(uris[0]) as connection:
        connection.channel().queue_delete("move.consumed")


def test_the_guides_example_policies_set_through_ctl_and_the_http_api(cluster):
    """The guide's "Examples", as written (rabbitmqctl set_policy, PUT
    /api/policies): ha-two (exactly 2, automatic synchronisation), ha-all, and
    ha-nodes naming rabbit@nodeA and rabbit@nodeB — nodes not in this cluster, so
    the queue stays on the declaring client's node, without mirrors ("If none of
    the nodes in the list are online at the time when the queue is declared then
    the queue will be created on the node that the declaring client is connected
    to"; "this does not constitute an error")."""
    one, two, three = cluster.names
    uris, urls = cluster.uris(), cluster.management_urls()
    with connect(uris[0]) as connection:
        channel = connection.channel()
        channel.queue_declare("two.q", durable=True)
        channel.queue_declare("ha.q", durable=True)
    publish(uris[0], "two.q", [b"old-1", b"old-2"])
    run("ctl", "set_policy", "--base-uri", urls[0], "ha-two", r"^two\.",
        '{"ha-mode":"exactly","ha-params":2,"ha-sync-mode":"automatic"}')
    mirrors_everywhere(uris, "two.q", one, [two], [two])   # synchronised at once
    status_code, body, _ = management_call(
        urls[1], "PUT", "/api/policies/%2f/ha-all",
        {"pattern": r"^ha\.", "definition": {"ha-mode": "all"}})
    assert status_code in (201, 204), body
    mirrors_everywhere(uris, "ha.q", one, [two, three], [two, three])
    run("ctl", "set_policy", "--base-uri", urls[2], "ha-nodes", r"^nodes\.",
        '{"ha-mode":"nodes","ha-params":["rabbit@nodeA", "rabbit@nodeB"]}')
    with connect(uris[1]) as connection:
        connection.channel().queue_declare("nodes.q", durable=True)
    mirrors_everywhere(uris, "nodes.q", two, [], [])   # mirrored, with no mirror
    out = run("ctl", "list_queues", "--base-uri", urls[0], "name", "policy", "pid",
              "slave_pids").output.splitlines()
    assert f"nodes.q\tha-nodes\t<{two}>\t[]" in out
    assert f"two.q\tha-two\t<{one}>\t[<{two}>]" in out
    for policy in ("ha-two", "ha-all", "ha-nodes"):
        clear_policy(uris[0], policy)
    with connect(uris[0]) as connection:
        channel = connection.channel()
        for name in ("two.q", "ha.q", "nodes.q"):
            channel.queue_delete(name)


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == code, result.output
    return result


def test_list_queues_sync_queue_and_the_sync_critical_check(cluster):
    one, two, _three = cluster.names
    uris, urls = cluster.uris(), cluster.management_urls()
    with connect(uris[0]) as connection:
        channel = connection.channel()
        channel.queue_declare("ops.q", durable=True)
        channel.queue_declare("ops.plain", durable=True)
    publish(uris[0], "ops.q", [b"a", b"b", b"c"])
    set_policy(uris[0], "ha-ops", r"^ops\.q$", {"ha-mode": "exactly", "ha-params": 2})
    mirrors_everywhere(uris, "ops.q", one, [two], [])

    # "rabbitmqctl list_queues name policy pid slave_pids", the guide's picture
    out = run("ctl", "list_queues", "--base-uri", urls[2], "name", "policy", "pid",
              "slave_pids", "synchronised_slave_pids").output.splitlines()
    assert out[1] == "name\tpolicy\tpid\tslave_pids\tsynchronised_slave_pids"
    assert f"ops.q\tha-ops\t<{one}>\t[<{two}>]\t[]" in out
    assert f"ops.plain\t\t<{one}>\t\t" in out   # not mirrored: no mirror lists
    # the management API's queue object: RabbitMQ 3.x's slave_nodes fields
    wait_until_serving(cluster.management_url(2))
    status_code, body, _ = management_call(cluster.management_url(2), "GET",
                                           "/api/queues/%2F/ops.q")
    assert status_code == 200, body
    assert (body["node"], body["slave_nodes"], body["synchronised_slave_nodes"]) == (
        one, [two], [])
    table = run("queues", "list", "--base-uri", urls[1]).output
    assert "synchronised_mirrors" in table.splitlines()[0]
    assert any(line.split()[:2] == ["/", "ops.q"] and line.rstrip().endswith(two)
               for line in table.splitlines())

    # the leader's node alone holds a, b, c: stopping it would lose them
    critical = run("queues", "check_if_node_is_mirror_sync_critical", "--base-uri", urls[0],
                   code=69)
    assert ("queue 'ops.q' in vhost '/' would lose its only synchronised replica "
            f"(master) if node {one} is stopped") in critical.output

    synced = run("ctl", "sync_queue", "--base-uri", urls[2], "ops.q")   # from another node
    assert "Synchronising queue 'ops.q' in vhost '/' ..." in synced.output
    mirrors_everywhere(uris, "ops.q", one, [two], [two])
    assert "reported no classic mirrored queues without online synchronised mirrors" in \
        run("queues", "check_if_node_is_mirror_sync_critical", "--base-uri", urls[0]).output
    assert f"ops.q\tha-ops\t<{one}>\t[<{two}>]\t[<{two}>]" in run(
        "ctl", "list_queues", "--base-uri", urls[1], "name", "policy", "pid", "slave_pids",
        "synchronised_slave_pids").output.splitlines()
    # rabbitmqctl 3.10.8's answers (tests/differential/test_mirroring_against_rabbitmq.py)
    assert run("ctl", "cancel_sync_queue", "--base-uri", urls[1], "ops.q").output == (
        "Stopping synchronising queue 'ops.q' in vhost '/' ...\nnot_syncing\n")
    refused = run("ctl", "sync_queue", "--base-uri", urls[1], "ops.plain", code=69)
    assert refused.stderr == "Error:\nnot_mirrored\n"
    clear_policy(uris[0], "ha-ops")
    with connect(uris[0]) as connection:
        channel = connection.channel()
        channel.queue_delete("ops.q")
        channel.queue_delete("ops.plain")


def test_sync_queue_runs_in_batches_in_the_background_and_cancel_sync_queue_stops_it(
        cluster):
    """"Batch Synchronization" and "Unsynchronised Mirrors": `sync_queue` sends the
    queue's contents ha-sync-batch-size messages at a time while `list_queues`
    shows the mirror unsynchronised and the queue object `syncing` with its
    progress; the queue hands no message to consumers meanwhile ("while a queue is
    being synchronised, all other queue operations will be blocked");
    `cancel_sync_queue` stops it: the mirror stays unsynchronised, deliveries resume
    (and a basic.get that waited is answered),
    `sync_queue` returns (rabbitmqctl's waits for the end, cancelled or not)."""
    one, two, _three = cluster.names
    uris, urls = cluster.uris(), cluster.management_urls()
    total = 30_000   # one batch a round trip: long enough to be seen and cancelled
    with connect(uris[0]) as connection:
        channel = connection.channel()
        channel.queue_declare("slow.sync", durable=True)
        for n in range(total - 1):
            channel.basic_publish("", "slow.sync", b"%d" % n)
        channel.confirm_delivery()
        channel.basic_publish("", "slow.sync", b"%d" % (total - 1))  # all are in
    set_policy(uris[0], "ha-slow", r"^slow\.sync$",
               {"ha-mode": "exactly", "ha-params": 2, "ha-sync-batch-size": 1})
    mirrors_everywhere(uris, "slow.sync", one, [two], [])

    synced = {}
    syncing = threading.Thread(target=lambda: synced.update(result=CliRunner().invoke(
        main, ["ctl", "sync_queue", "--base-uri", urls[2], "slow.sync"])))
    syncing.start()

    def progress(url: str) -> int | None:
        status_code, body, _ = management_call(url, "GET", "/api/queues/%2F/slow.sync")
        return body.get("sync_messages") if body.get("state") == "syncing" else None

    started = wait_for("the sync under way", lambda: progress(urls[1]), timeout=60)
    wait_for("the sync going on", lambda: (progress(urls[0]) or 0) > started, timeout=60)
    # a consumer arriving meanwhile is not served: the leader's own snapshot shows it
    # registered, the sync running and nothing delivered
    consumer = connect(uris[2])
    consuming = consumer.channel()
    consuming.basic_qos(prefetch_count=10)
    consuming.basic_consume("slow.sync", lambda *delivery: None)
    seen = wait_for("the consumer registered", lambda: (
        lambda line: line if line["consumers"] == 1 else None)(row(uris[0], "slow.sync")))
    # (one snapshot of the leader's: every field at the same moment)
    assert "syncing" in seen and seen["unacked"] == 0, seen
    # a basic.get waits too, answered once the sync ends
    fetched = {}

    def fetch() -> None:
        with connect(uris[1]) as connection:
            method, _properties, body = connection.channel().basic_get("slow.sync",
                                                                       auto_ack=True)
            fetched["body"] = body

    getter = threading.Thread(target=fetch)
    getter.start()
    out = run("ctl", "list_queues", "--base-uri", urls[1], "name", "slave_pids",
              "synchronised_slave_pids").output.splitlines()
    assert f"slow.sync\t[<{two}>]\t[]" in out   # not synchronised while it runs
    assert getter.is_alive() and "body" not in fetched
    cancelled = run("ctl", "cancel_sync_queue", "--base-uri", urls[1], "slow.sync")
    assert cancelled.output == "Stopping synchronising queue 'slow.sync' in vhost '/' ...\n"
    syncing.join(timeout=60)
    assert not syncing.is_alive()
    assert synced["result"].exit_code == 0, synced["result"].output
    assert synced["result"].output == "Synchronising queue 'slow.sync' in vhost '/' ...\n"
    line = row(uris[1], "slow.sync")
    assert "syncing" not in line and line["synchronised_mirrors"] == []
    assert f"slow.sync\t[<{two}>]\t[]" in run(
        "ctl", "list_queues", "--base-uri", urls[2], "name", "slave_pids",
        "synchronised_slave_pids").output.splitlines()
    assert run("ctl", "cancel_sync_queue", "--base-uri", urls[0], "slow.sync").output == (
        "Stopping synchronising queue 'slow.sync' in vhost '/' ...\nnot_syncing\n")
    # deliveries resume: the consumer gets its prefetch; every message is still there
    wait_for("the consumer served", lambda: consumer.process_data_events(0.1) or (
        row(uris[0], "slow.sync")["unacked"] == 10))
    consumer.close()
    getter.join(timeout=60)
    # the head if the get reached the leader during the sync and waited (answered
    # before deliveries resume); under load it may arrive after the cancel, behind the
    # consumer's prefetch of 10 (0-9): never a message handed out twice
    assert fetched["body"] in (b"0", b"10"), fetched
    wait_for("the consumer's 10 back", lambda: row(uris[0], "slow.sync")["ready"]
             == total - 1)   # every other message still there
    clear_policy(uris[0], "ha-slow")
    with connect(uris[0]) as connection:
        connection.channel().queue_delete("slow.sync")


def test_confirmed_messages_survive_a_leader_kill_with_a_synchronised_mirror():
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris = cluster.uris()
        mirrored_on_every_node(cluster, "ha.orders")
        publish(uris[1], "ha.orders", [b"m%d" % n for n in range(30)])   # all confirmed
        publish(uris[0], "ha.orders", [b"m%d" % n for n in range(30, 40)])
        # "a tx.commit-ok will only be returned to a client when the transaction has
        # been applied across all mirrors of the queue"
        with connect(uris[0]) as connection:
            channel = connection.channel()
            channel.tx_select()
            for n in range(40, 45):
                channel.basic_publish("", "ha.orders", b"m%d" % n, PERSISTENT)
            channel.tx_commit()

        # a consumer on node three holds 3 unacked; another asked to be told of failover
        watcher = connect(uris[2])
        holder = watcher.channel()
        holder.basic_qos(prefetch_count=3)
        held = []
        holder.basic_consume("ha.orders", lambda ch, method, props, body: held.append(
            (body, method.redelivered)))
        cancelled = []
        notified = watcher.channel()
        notified.add_on_cancel_callback(lambda frame: cancelled.append(frame))
        notified.basic_qos(prefetch_count=1)
        notified.basic_consume("ha.orders", lambda *args: None,
                               arguments={"x-cancel-on-ha-failover": True})
        wait_for("3 + 1 messages delivered, unacked",
                 lambda: watcher.process_data_events(0.2) or (
                     len(held) == 3 and row(uris[2], "ha.orders")["unacked"] == 4))

        cluster.kill(one, signal.SIGKILL)
        live = cluster.uris([two, three])
        # "the oldest mirror will be promoted to the new leader as long as it's
        # synchronised": two joined first
        mirrors_everywhere(live, "ha.orders", two, [three], [three])
        wait_for("basic.cancel for the x-cancel-on-ha-failover consumer",
                 lambda: watcher.process_data_events(0.2) or cancelled)
        # the other consumer goes on with the new leader, which requeued what it held:
        # "clients that re-consume ... are likely to subsequently receive messages that
        # they have already received", marked redelivered
        wait_for("the holder served by the new leader",
                 lambda: watcher.process_data_events(0.2) or len(held) >= 6)
        assert held[3:6] == [(body, True) for body, _ in held[:3]]
        watcher.close()   # what it holds comes back

        got = get_all(uris[1], "ha.orders")
        bodies = sorted(body for body, _ in got)
        assert bodies == sorted(b"m%d" % n for n in range(45))  # none lost, none twice
        redelivered = {body for body, again in got if again}
        # "all unacknowledged messages are redelivered with the redelivered flag set"
        assert {body for body, _ in held} <= redelivered
        assert len(redelivered) >= 4   # the notified consumer's one too


# (how the leader's node goes, the policy's promotion keys, whether the unsynchronised
# mirror takes over)
PROMOTIONS = [
    ("killed", {}, True),                                        # failure: always
    ("killed", {"ha-promote-on-failure": "when-synced"}, False),
    ("stopped", {}, False),                                      # shutdown: when-synced
    ("stopped", {"ha-promote-on-shutdown": "always"}, True),
    ("stopped", {"ha-promote-on-shutdown": "always",            # failure's when-synced
                 "ha-promote-on-failure": "when-synced"}, False),  # wins
]


@pytest.mark.parametrize("how, keys, promoted", PROMOTIONS, ids=[
    "killed-default-always", "killed-when-synced", "stopped-default-when-synced",
    "stopped-always", "stopped-always-but-failure-when-synced"])
def test_unsynchronised_mirror_promotion_loses_what_only_the_leader_held(how, keys,
                                                                        promoted):
    """"Promotion of Unsynchronised Mirrors on Failure" and "Stopping Nodes Hosting
    Queue Leader with Only Unsynchronised Mirrors"."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, _three = cluster.names
        uris = cluster.uris()
        with connect(uris[0]) as connection:
            connection.channel().queue_declare("ha.lossy", durable=True)
        publish(uris[0], "ha.lossy", [b"old-%d" % n for n in range(10)])
        set_policy(uris[0], "ha-two", r"^ha\.", {"ha-mode": "exactly", "ha-params": 2,
                                                 **keys})
        mirrors_everywhere(uris, "ha.lossy", one, [two], [])  # unsynchronised
        publish(uris[1], "ha.lossy", [b"new-%d" % n for n in range(5)])
        cluster.kill(one, signal.SIGKILL if how == "killed" else signal.SIGTERM)
        live = cluster.uris([1, 2])
        if promoted:
            # "If there is no mirror that is synchronised with the leader, messages
            # that only existed on leader will be lost"
            mirrors_everywhere(live, "ha.lossy", two, [], None)
            got = get_all(uris[1], "ha.lossy")
            assert sorted(body for body, _ in got) == [b"new-%d" % n for n in range(5)]
            return
        # not promoted: the queue waits for its leader ...
        wait_for("the mirror deciding not to take over", lambda: "the queue waits for "
                 "its leader" in cluster.log(two), timeout=60)
        deciding = ("ha-promote-on-shutdown" if how == "stopped" and keys.get(
            "ha-promote-on-failure") != "when-synced" else "ha-promote-on-failure")
        assert f"({deciding} when-synced" in cluster.log(two)
        with connect(uris[1]) as connection:
            channel = connection.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
                channel.basic_get("ha.lossy")
            assert error.value.reply_code == 404 and "is down or inaccessible" in str(error.value)
        assert row(uris[2], "ha.lossy")["leader"] == one
        # ... and nothing is lost once it is back
        cluster.restart(one)
        cluster.wait_ready([one])
        wait_for("the leader back", lambda: row(uris[1], "ha.lossy")["ready"] == 15)


def test_a_queue_waiting_for_its_lost_leader_under_when_synced_is_deleted_and_redeclared():
    """"Promotion of Unsynchronised Mirrors on Failure": under when-synced, "In case
    of a permanent loss of queue leader the queue won't be available unless it is
    deleted and redeclared. Deleting a queue deletes all of its contents"."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, _three = cluster.names
        uris = cluster.uris()
        with connect(uris[0]) as connection:
            connection.channel().queue_declare("ha.lost", durable=True)
        publish(uris[0], "ha.lost", [b"old-%d" % n for n in range(3)])
        set_policy(uris[0], "ha-two", r"^ha\.", {"ha-mode": "exactly", "ha-params": 2,
                                                 "ha-promote-on-failure": "when-synced"})
        mirrors_everywhere(uris, "ha.lost", one, [two], [])  # unsynchronised
        cluster.kill(one, signal.SIGKILL)
        wait_for("the mirror deciding not to take over", lambda: "the queue waits for "
                 "its leader" in cluster.log(two), timeout=60)
        with connect(uris[1]) as connection:
            channel = connection.channel()
            channel.queue_delete("ha.lost")
            channel.queue_declare("ha.lost", durable=True)
        live = cluster.uris([1, 2])
        for uri in live:
            wait_for(f"ha.lost redeclared, led by {two}, empty, on {uri}", lambda uri=uri: (
                (line := row(uri, "ha.lost")) is not None and line["leader"] == two
                and line["ready"] == 0), timeout=60)
        publish(uris[2], "ha.lost", [b"fresh"])
        assert get_all(uris[1], "ha.lost") == [(b"fresh", False)]


def test_exactly_one_replica_depends_on_durability_and_a_transient_mirrored_queue_fails_over():
    """"Queue Arguments that Control Mirroring": exactly with count 1, "just the
    queue leader. If the node running the queue leader becomes unavailable, the
    behaviour depends on queue durability" ("Non-mirrored Queue Behavior in a
    Cluster": a durable one is unavailable until its node is back, "A non-durable
    one will be deleted"); with count 2, a non-durable queue's synchronised mirror
    is promoted as a durable one's is."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, _three = cluster.names
        uris = cluster.uris()
        set_policy(uris[0], "ha-one", r"^one\.", {"ha-mode": "exactly", "ha-params": 1})
        set_policy(uris[0], "ha-two", r"^two\.", {"ha-mode": "exactly", "ha-params": 2})
        with connect(uris[0]) as connection:
            channel = connection.channel()
            channel.queue_declare("one.durable", durable=True)
            channel.queue_declare("one.transient", durable=False)
            channel.queue_declare("two.transient", durable=False)
        mirrors_everywhere(uris, "one.durable", one, [], [])   # mirrored, no mirror
        mirrors_everywhere(uris, "one.transient", one, [], [])
        mirrors_everywhere(uris, "two.transient", one, [two], [two])
        for name in ("one.durable", "one.transient", "two.transient"):
            publish(uris[0], name, [b"kept"])
        cluster.kill(one, signal.SIGKILL)
        live = cluster.uris([1, 2])
        mirrors_everywhere(live, "two.transient", two, [], [])
        assert get_all(uris[2], "two.transient") == [(b"kept", False)]

        def refused(name: str) -> str:
            with connect(uris[1]) as connection:
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as error:
                    connection.channel().basic_get(name)
            assert error.value.reply_code == 404
            return error.value.reply_text

        wait_for("the durable queue's leader seen down", lambda: "down or inaccessible"
                 in refused("one.durable"), timeout=60)
        assert refused("one.transient") == \
            "NOT_FOUND - no queue 'one.transient' in vhost '/'"
        cluster.restart(one)
        cluster.wait_ready([one])
        for uri in uris:
            wait_for(f"one.transient gone from {uri}", lambda uri=uri: (
                row(uri, "one.transient") is None), timeout=90)
            wait_for(f"one.durable back on {uri}", lambda uri=uri: (
                (line := row(uri, "one.durable")) is not None and line["ready"] == 1),
                timeout=90)
        assert get_all(uris[1], "one.durable") == [(b"kept", False)]


def test_a_promotion_waits_for_a_metadata_majority_then_picks_the_mirror_that_kept_its_copy():
    """The leader's node and the first mirror's node killed together, the mirror's
    node restarted: the mirror that kept its copy (synchronised, never restarted) is
    promoted, with every confirmed message, not the restarted one, first in join
    order, whose copy dates from before its restart (it says so, "cm.incomplete":
    without that, both waited for the lost leader); it rejoins as a mirror. (Alone,
    the last mirror had no majority of the metadata group to be promoted by: a
    promotion is a metadata command. RabbitMQ would promote it at once; that wait is
    described, not asserted here.)"""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris = cluster.uris()
        mirrored_on_every_node(cluster, "ha.majority")
        publish(uris[2], "ha.majority", [b"m%d" % n for n in range(10)])
        cluster.kill(one, signal.SIGKILL)
        cluster.kill(two, signal.SIGKILL)
        cluster.restart(two)   # at once: often back before three saw the leader go
        cluster.wait_ready([two])
        live = cluster.uris([two, three])
        mirrors_everywhere(live, "ha.majority", three, [two], None)
        got = get_all(uris[1], "ha.majority")
        assert sorted(body for body, _ in got) == sorted(b"m%d" % n for n in range(10))


def test_a_durable_mirrored_queue_survives_stopping_and_restarting_every_node():
    """"Stopping Nodes and Synchronisation": the leader's node stopped, its synchronised
    mirror takes over; the rest stopped too, then every node started again: the
    persistent messages are there (in the store of the node that led last), and the
    mirrors rejoin empty."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris = cluster.uris()
        mirrored_on_every_node(cluster, "ha.durable")
        publish(uris[1], "ha.durable", [b"m%d" % n for n in range(20)])
        cluster.kill(one, signal.SIGTERM)
        mirrors_everywhere(cluster.uris([two, three]), "ha.durable", two, [three], [three])
        cluster.kill(three, signal.SIGTERM)
        cluster.kill(two, signal.SIGTERM)
        for node in (one, two, three):
            cluster.restart(node)
        started(cluster)
        wait_for("the queue back with its messages", lambda: all(
            (line := row(uri, "ha.durable")) is not None and line["leader"] == two
            and line["ready"] == 20 for uri in uris), timeout=90)
        got = get_all(uris[2], "ha.durable")
        assert sorted(body for body, _ in got) == sorted(b"m%d" % n for n in range(20))
        wait_for("the mirrors back, synchronised once drained", lambda: all(
            sorted(row(uri, "ha.durable").get("synchronised_mirrors", [])) == [one, three]
            for uri in uris), timeout=90)


def test_publishes_forwarded_to_a_failing_leader_are_confirmed_by_the_new_one():
    """"Mirrored Queue Implementation and Semantics", 5 and 6: a publisher on another
    node goes on through the failover; a publish its leader never answered goes to
    the promoted mirror, which confirms it once (a message the old leader had already
    replicated is recognised, not enqueued twice)."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris = cluster.uris()
        mirrored_on_every_node(cluster, "ha.stream")
        total, confirmed, failures = 400, [], []

        def publisher() -> None:
            try:
                with connect(uris[2]) as connection:
                    channel = connection.channel()
                    channel.confirm_delivery()  # a nack raises NackError
                    for n in range(total):
                        channel.basic_publish("", "ha.stream", b"%d" % n, PERSISTENT)
                        confirmed.append(n)
            except Exception as error:  # noqa: BLE001 - reported below
                failures.append(error)

        thread = threading.Thread(target=publisher)
        thread.start()
        wait_for("a first hundred confirmed", lambda: len(confirmed) >= 100 or failures)
        cluster.kill(one, signal.SIGKILL)
        thread.join(timeout=240)
        assert not thread.is_alive() and not failures, failures
        assert confirmed == list(range(total))
        # some were on their way when the leader died (else this proves nothing)
        assert "publishes wait for its next leader" in cluster.log(three, tail=100_000)
        mirrors_everywhere(cluster.uris([two, three]), "ha.stream", two, [three], None)
        got = [int(body) for body, _ in get_all(uris[2], "ha.stream")]
        assert sorted(got) == list(range(total))   # every one, once


def test_a_failed_mirror_is_replaced_and_its_confirms_do_not_stall():
    """"Mirrored Queue Implementation and Semantics": "Should a mirror fail, there is
    little to be done other than some bookkeeping: the leader remains the leader";
    and ha-mode exactly: "a node containing a mirror goes down, then a new mirror
    will be created on another node" (starting empty)."""
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris = cluster.uris()
        set_policy(uris[0], "ha-two", r"^ha\.", {"ha-mode": "exactly", "ha-params": 2})
        with connect(uris[0]) as connection:
            connection.channel().queue_declare("ha.bookkeeping", durable=True)
        mirrors_everywhere(uris, "ha.bookkeeping", one, [two], [two])
        publish(uris[0], "ha.bookkeeping", [b"before"])
        cluster.kill(two, signal.SIGKILL)
        # confirms waiting for the dead mirror are released once it leaves the record
        publish(uris[0], "ha.bookkeeping", [b"during-%d" % n for n in range(5)])
        mirrors_everywhere(cluster.uris([one, three]), "ha.bookkeeping", one, [three], [])
        publish(uris[2], "ha.bookkeeping", [b"after"])
        got = [body for body, _ in get_all(uris[2], "ha.bookkeeping")]
        assert got == [b"before"] + [b"during-%d" % n for n in range(5)] + [b"after"]
        mirrors_everywhere(cluster.uris([one, three]), "ha.bookkeeping", one, [three],
                           [three])   # drained: the new mirror is synchronised


def test_a_node_joining_the_cluster_gets_an_unsynchronised_mirror(tmp_path):
    """"Queue Arguments that Control Mirroring": ha-mode all — "When a new node is
    added to the cluster, the queue will be mirrored to that node" — and exactly
    with fewer nodes than its count ("the queue is mirrored to all nodes"); and
    "Unsynchronised Mirrors": "when a node joins a cluster, queues may add a mirror
    on the new node. At this point, the new mirror will be empty" (unsynchronised
    until `sync_queue`, or until the older messages drain)."""
    import subprocess
    import sys

    from quorumqueue.cli import launcher

    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        started(cluster)
        one, two, three = cluster.names
        uris = cluster.uris()
        set_policy(uris[0], "ha-all", r"^ha\.all$", {"ha-mode": "all"})
        set_policy(uris[0], "ha-five", r"^ha\.five$", {"ha-mode": "exactly", "ha-params": 5})
        with connect(uris[0]) as connection:
            channel = connection.channel()
            channel.queue_declare("ha.all", durable=True)
            channel.queue_declare("ha.five", durable=True)
        for name in ("ha.all", "ha.five"):
            mirrors_everywhere(uris, name, one, [two, three], [two, three])
            publish(uris[0], name, [b"old-%d" % n for n in range(5)])

        seed = cluster.plans[0]
        amqp_port, cluster_port = launcher.pick_free_ports(2)
        joiner = "qq4@localhost"
        log = open(tmp_path / "qq4.log", "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "quorumqueue.cli", "broker", "start",
             "--port", str(amqp_port), "--data-dir", str(tmp_path / "qq4"),
             "--node-name", joiner, "--cluster-port", str(cluster_port),
             "--config", cluster.config_path,
             "--join", f"{seed.name}:{seed.cluster_port}"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            joined = f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F"
            every = [*uris, joined]
            for name in ("ha.all", "ha.five"):
                # the joiner's mirror is appended (the youngest), empty: unsynchronised
                mirrors_everywhere(every, name, one, [two, three, joiner], [two, three])
            publish(joined, "ha.all", [b"new"])   # it gets what is published from now on
            with connect(joined) as connection:   # "old-0" drained, four older remain
                channel = connection.channel()
                method, _properties, body = channel.basic_get("ha.all")
                assert body == b"old-0"
                channel.basic_ack(method.delivery_tag)
            row_all = row(joined, "ha.all")
            assert joiner not in row_all["synchronised_mirrors"] and row_all["ready"] == 5
            # explicit synchronisation from the new node (its leader sends the rest)
            result = CliRunner().invoke(main, [
                "ctl", "sync_queue", "--base-uri", cluster.management_url(two), "ha.five"])
            assert result.exit_code == 0, result.output
            mirrors_everywhere(every, "ha.five", one, [two, three, joiner],
                               [two, three, joiner])
            # draining the older messages synchronises the other one naturally
            assert [body for body, _ in get_all(joined, "ha.all")] == [
                b"old-%d" % n for n in range(1, 5)] + [b"new"]
            mirrors_everywhere(every, "ha.all", one, [two, three, joiner],
                               [two, three, joiner])
            # a node that comes back ("Stopping Nodes and Synchronisation": "when a
            # mirror rejoins a mirrored queue, it throws away any durable local
            # contents it already has and starts empty") is a mirror again,
            # unsynchronised while the queue holds messages older than its return
            cluster.restart(three)
            started_again = cluster.uris([one, two])

            def rejoined(uri: str) -> bool:
                line = row(uri, "ha.five")
                return (line["leader"] == one and three in line["mirrors"]
                        and three not in line["synchronised_mirrors"]
                        and sorted(line["synchronised_mirrors"]) == sorted([two, joiner]))

            for uri in [*started_again, joined]:
                wait_for(f"three back in ha.five, unsynchronised, on {uri}",
                         lambda uri=uri: rejoined(uri), timeout=90)
            assert row(uris[0], "ha.five")["ready"] == 5
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()

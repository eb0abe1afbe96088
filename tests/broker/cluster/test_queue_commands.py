"""rabbitmq-queues' observability commands on a real 3-node cluster: `queues
quorum_status` (a row per member: the leader, the followers, a killed member as
noproc), `check_if_node_is_quorum_critical` (no node is critical while all three run;
once one is stopped, the other two are), `peek` asked on a node whose replica is not
the leader or on a node without a replica (and, with two nodes stopped, refused within
a bounded time), and
`reclaim_quorum_memory` on every member's node."""

from __future__ import annotations

import subprocess
import sys

import pika
import pytest

from tests.broker.cluster.test_cluster import connect, leader_of, status
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(400)  # the waits inside have their own bounds

CLI = [sys.executable, "-m", "quorumqueue.cli", "queues"]
COLUMNS = ["Node Name", "Raft State", "Membership", "Last Log Index", "Last Written",
           "Last Applied", "Commit Index", "Snapshot Index", "Term"]


def queues(url: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(arguments) + ["--base-uri", url], capture_output=True,
                          text=True, timeout=120)


def members_table(url: str, name: str) -> dict[str, dict[str, str]]:
    """quorum_status's table, by node name: {column: cell} (cells may be empty)."""
    result = queues(url, "quorum_status", name)
    assert result.returncode == 0, result.stderr
    banner, header, *rows = result.stdout.splitlines()
    assert banner.startswith(f"Status of queue {name} on node ")
    starts = [header.index(column) for column in COLUMNS]
    assert starts == sorted(starts)
    table = {}
    for row in rows:
        cells = [row[start:end].strip() for start, end in zip(starts, starts[1:] + [None])]
        table[cells[0]] = dict(zip(COLUMNS, cells))
    return table


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(3, proxied=False, extra_config="") as running:
        wait_for("a metadata leader", lambda: all(status(u)["metadata_leader"]
                                                  for u in running.uris()))
        yield running


def test_status_critical_peek_and_reclaim_before_and_after_a_node_stops(cluster):
    one, two, three = cluster.names
    with connect(cluster.uri(one)) as connection:
        channel = connection.channel()
        channel.queue_declare("observed", durable=True,
                              arguments={"x-queue-type": "quorum",
                                         "x-quorum-initial-group-size": 3})
        channel.confirm_delivery()
        for n in range(3):
            channel.basic_publish("", "observed", b"message %d" % n,
                                  pika.BasicProperties(delivery_mode=2, message_id=str(n)))
    leader = wait_for("a leader", lambda: leader_of(cluster.uri(one), "observed"))

    def settled(table):
        commits = {row["Commit Index"] for row in table.values()}
        return (sorted(row["Raft State"] for row in table.values())
                == ["follower", "follower", "leader"] and len(commits) == 1 and table)

    for node in (one, two, three):  # every node shows every member, its own or not
        table = wait_for("leader and followers agreeing",
                         lambda node=node: settled(members_table(cluster.management_url(node),
                                                                 "observed")), timeout=60)
        assert list(table) == sorted([one, two, three])
        assert table[leader]["Raft State"] == "leader"
        assert {row["Membership"] for row in table.values()} == {"voter"}
        assert len({row["Term"] for row in table.values()}) == 1
        assert all(int(row["Last Applied"]) >= 4 for row in table.values())  # 3 publishes

    follower = next(n for n in (one, two, three) if n != leader)
    peeked = queues(cluster.management_url(follower), "peek", "observed", "2")
    assert peeked.returncode == 0, peeked.stderr
    assert "payload (max 64 bytes)   message 1" in peeked.stdout
    assert "message_id               1" in peeked.stdout
    beyond = queues(cluster.management_url(follower), "peek", "observed", "4")
    assert (beyond.returncode, beyond.stderr) == (
        69, "Error:\nTarget queue does not have a message at that position\n")

    for node in (one, two, three):
        check = queues(cluster.management_url(node), "check_if_node_is_quorum_critical")
        assert check.returncode == 0, check.stderr
        assert check.stdout.splitlines()[1] == \
            f"Node {node} reported no quorum queues with minimum quorum"
    mirrors = queues(cluster.management_url(one), "check_if_node_is_mirror_sync_critical")
    assert mirrors.returncode == 0 and mirrors.stdout.splitlines()[1] == \
        f"Node {one} reported no classic mirrored queues without online synchronised mirrors"

    reclaimed = queues(cluster.management_url(one), "reclaim_quorum_memory", "observed")
    assert reclaimed.returncode == 0, reclaimed.stderr
    done = reclaimed.stdout.splitlines()[1:]
    assert [line.split(":")[0] for line in done] == sorted([one, two, three])
    assert all("write-ahead log rolled over" in line for line in done)

    # a node with no replica of a queue asks its member
    with connect(cluster.uri(one)) as connection:
        channel = connection.channel()
        channel.queue_declare("observed-on-one", durable=True,
                              arguments={"x-queue-type": "quorum",
                                         "x-quorum-initial-group-size": 1})
        channel.confirm_delivery()
        channel.basic_publish("", "observed-on-one", b"only here",
                              pika.BasicProperties(delivery_mode=2))
    placed = wait_for("the one-member queue's leader",
                      lambda: leader_of(cluster.uri(one), "observed-on-one"))
    elsewhere = next(n for n in (one, two, three) if n != placed)
    table = members_table(cluster.management_url(elsewhere), "observed-on-one")
    assert list(table) == [placed] and table[placed]["Raft State"] == "leader"
    remote = queues(cluster.management_url(elsewhere), "peek", "observed-on-one", "1")
    assert remote.returncode == 0, remote.stderr
    assert "payload (max 64 bytes)   only here" in remote.stdout
    assert f"on node {elsewhere} ..." in remote.stdout.splitlines()[0]

    stopped = three
    cluster.kill(stopped)
    alive = [one, two]

    def stopped_shown(table):
        return (table[stopped]["Raft State"] == "noproc"
                and sorted(table[n]["Raft State"] for n in alive) == ["follower", "leader"]
                and table)

    for node in alive:
        table = wait_for(f"{stopped} shown as not running, a leader among the others",
                         lambda node=node: stopped_shown(members_table(cluster.management_url(node),
                                                                       "observed")),
                         timeout=60)
        assert [cell for column, cell in table[stopped].items()
                if column not in ("Node Name", "Raft State")] == [""] * 7

    for node in alive:
        check = wait_for(f"{node} quorum critical",
                         lambda node=node: (lambda r: r.returncode == 69 and r)(
                             queues(cluster.management_url(node), "check_if_node_is_quorum_critical")),
                         timeout=60)
        # a queue of one member on the node is always critical there (as in RabbitMQ)
        names = ["observed"] + (["observed-on-one"] if node == placed else [])
        assert check.stderr == "".join(f"queue '{name}' in vhost '/' would lose quorum if "
                                       f"node {node} is stopped\n" for name in names)

    partial = queues(cluster.management_url(one), "reclaim_quorum_memory", "observed")
    assert partial.returncode == 69
    assert f"{stopped}: noproc" in partial.stderr
    assert len(partial.stdout.splitlines()) == 3  # banner and the two running members
    still = wait_for("a leader after the stop", lambda: (lambda r: r.returncode == 0 and r)(
        queues(cluster.management_url(two), "peek", "observed", "1")), timeout=60)
    assert "message 0" in still.stdout

    # a second node stops: the last one has no majority, but still answers
    cluster.kill(two)
    table = wait_for(f"{two} shown as not running too",
                     lambda: (lambda t: t[two]["Raft State"] == "noproc" and t)(
                         members_table(cluster.management_url(one), "observed")), timeout=60)
    assert table[three]["Raft State"] == "noproc"
    stuck = wait_for("peek refused without a leader", lambda: (
        lambda r: r.returncode == 69 and r)(queues(cluster.management_url(one), "peek", "observed", "1")),
        timeout=60)
    assert stuck.stderr == ("Error:\nqueue 'observed' in vhost '/' has no leader that "
                            "answered within 5 s (none elected, or not reachable)\n")

"""The metadata group's snapshots on a real 3-node cluster (broker/groups/metadata.py,
"Snapshots"): with `metadata_store.snapshot_interval` small, many declares and
deletes make every node snapshot its metadata and delete the log segments below the
snapshot; a node stopped meanwhile comes back through the leader's snapshot
(InstallSnapshot) and then lists the same users, exchanges, queues (a classic queue
hosted on node 1 too, which it then uses through its host) and bindings as the
others; a node restarted after its own snapshots keeps what the snapshot holds,
also what its metadata file does not (a non-durable exchange). The restore itself,
from any point of a history, is in tests/broker/node/test_metadata_snapshot.py."""

from __future__ import annotations

import os
import signal

import pika
import pytest

from quorumqueue.broker.groups.metadata import META_GROUP
from quorumqueue.client.management import call
from quorumqueue.broker.raft.storage.layout import (QUORUM_DIR, SEGMENT_SUFFIX, SEGMENTS_DIR,
                                                    SNAPSHOT_FILE, SNAPSHOTS_DIR,
                                                    group_dir_name, list_numbered)
from quorumqueue.broker.raft.storage.segments import parse_segment
from quorumqueue.broker.raft.storage.snapshots import read_snapshot_file
from quorumqueue.broker.storage.metadata_store import MetadataStore
from tests.broker.cluster.test_cluster import connect, status, wait_for
from tests.support.cluster import LocalCluster

pytestmark = pytest.mark.timeout(300)

INTERVAL = 40
CONFIG = f"""
metadata_store.snapshot_interval = {INTERVAL}
raft.wal_max_size_bytes = 2048
raft.segment_max_entries = 16
"""


def meta_files(data_dir: str) -> tuple[int, dict[int, tuple[int, int]]]:
    """(snapshot index, {segment number: (first, last)}) of the metadata group's log on
    a node, read from its files (the snapshot first: a segment listed after it and
    wholly below it was not released)."""
    directory = group_dir_name(META_GROUP)
    snapshot = os.path.join(data_dir, QUORUM_DIR, SNAPSHOTS_DIR, directory, SNAPSHOT_FILE)
    try:
        index = read_snapshot_file(snapshot, with_state=False)[1].index
    except FileNotFoundError:
        index = 0
    segments = {}
    for number, path in list_numbered(os.path.join(data_dir, QUORUM_DIR, SEGMENTS_DIR,
                                                   directory), SEGMENT_SUFFIX):
        try:
            parsed = parse_segment(path, number, tolerate_torn=True)
        except FileNotFoundError:  # released while listed
            continue
        if parsed is not None and parsed.ref.count:
            segments[number] = (parsed.ref.first, parsed.ref.last)
    return index, segments


def metadata(data_dir: str) -> dict:
    """The node's durable metadata file, members sorted (their order is not kept) and
    without password hashes (each node hashes the default user's with a salt of its
    own when it starts). Its exchanges and bindings are left out: the file holds them
    as of its last save, the metadata log the rest (`served`)."""
    document = MetadataStore(data_dir).load() or {}
    for queue in document.get("queues", ()):
        queue["members"] = sorted(queue.get("members", ()))
    for user in document.get("users", ()):
        user.pop("password_hash")
    return {key: sorted(document.get(key, ()), key=repr)
            for key in ("vhosts", "users", "policies", "queues")}


def served(cluster, node: int) -> dict:
    """The exchanges and bindings the node serves (its definitions export)."""
    from tests.broker.management.support import call as http

    status_code, exported, _ = http(cluster.management_url(node), "GET", "/api/definitions")
    assert status_code == 200, exported
    return {key: sorted(exported[key], key=repr) for key in ("exchanges", "bindings")}


def churn(uri: str, rounds: int, prefix: str, after_round=lambda: None) -> None:
    """Declares and deletes: per round an exchange, a quorum queue, two bindings, and
    the previous round's exchange deleted (five metadata entries)."""
    with connect(uri) as connection:
        channel = connection.channel()
        for n in range(rounds):
            channel.exchange_declare(f"{prefix}-x{n}", "direct", durable=True)
            channel.queue_declare(f"{prefix}-q{n % 3}", durable=True,
                                  arguments={"x-queue-type": "quorum"})
            channel.queue_bind(f"{prefix}-q{n % 3}", f"{prefix}-x{n}", f"k{n}")
            channel.queue_bind(f"{prefix}-q{n % 3}", "amq.direct", f"{prefix}-k{n}")
            if n:
                channel.exchange_delete(f"{prefix}-x{n - 1}")
            after_round()


def test_snapshots_truncate_the_log_and_a_stopped_node_catches_up_through_one():
    with LocalCluster(3, proxied=False, extra_config=CONFIG) as cluster:
        one, two, three = cluster.uris()
        wait_for("a metadata leader all nodes know", lambda: all(
            status(uri)["metadata_leader"] for uri in cluster.uris()), timeout=60)
        with connect(one) as connection:
            channel = connection.channel()
            channel.exchange_declare("transient-x", "fanout", durable=False)
            channel.exchange_declare("kept-x", "topic", durable=True)
            channel.queue_declare("kept-q", durable=True, arguments={"x-queue-type": "quorum"})
            channel.queue_bind("kept-q", "transient-x")
            channel.queue_bind("kept-q", "kept-x", "orders.#")
            channel.queue_declare("kept-cq", durable=True)  # classic, hosted on node 1
            channel.queue_bind("kept-cq", "transient-x")
        call(one, "users.add", name="early", password="pw", tags=["monitoring"])
        wait_for("node 3 has the early changes", lambda: any(
            q["name"] == "kept-q" for q in status(three)["queues"]))

        cluster.kill(2, signal.SIGTERM)  # node 3 misses what follows
        data_one = cluster.plans[0].data_dir
        seen: dict[int, tuple[int, int]] = {}
        for batch in range(6):  # the segments node 1 writes (WAL rollovers), as they come
            churn(one if batch % 2 else two, 20, f"b{batch}",
                  lambda: seen.update(meta_files(data_one)[1]))
        call(two, "users.add", name="late", password="pw", tags=[])
        call(two, "users.delete", name="early")
        call(one, "vhosts.add", name="v-late")
        with connect(two) as connection:
            connection.channel().exchange_delete("kept-x")

        def truncated():
            index, segments = meta_files(data_one)
            seen.update(segments)
            released = {n: span for n, span in seen.items() if n not in segments}
            below = {n: span for n, span in segments.items() if span[1] <= index}
            return (index >= 5 * INTERVAL and released and not below
                    and all(last <= index for _first, last in released.values())
                    and (index, released, segments))
        index, released, remaining = wait_for("node 1's metadata log truncated at its "
                                              "snapshot", truncated)
        # over 600 entries since the cluster started: the segments node 1 wrote below
        # its snapshot are gone, what it keeps is above it
        assert all(first > index - INTERVAL for first, _last in remaining.values())

        cluster.restart(2)
        wait_for("node 3 restored the leader's snapshot", lambda: "metadata group: restored "
                 "the snapshot at" in cluster.log(2, tail=200_000), timeout=60)
        data = [plan.data_dir for plan in cluster.plans]
        wait_for("every node's metadata file the same", lambda: metadata(data[0]) ==
                 metadata(data[1]) == metadata(data[2]), timeout=60)
        wait_for("every node serving the same exchanges and bindings", lambda: served(
            cluster, 0) == served(cluster, 1) == served(cluster, 2), timeout=60)
        document = metadata(data[2])
        assert {u["name"] for u in document["users"]} == {"guest", "late"}
        assert "v-late" in document["vhosts"]
        assert {e["name"] for e in served(cluster, 2)["exchanges"] if e["durable"]
                and not e["name"].startswith("amq.")} == {f"b{b}-x19" for b in range(6)}
        assert {q["name"]: q["members"] for q in document["queues"]} == {
            "kept-cq": [], **{name: sorted(cluster.names) for name in (
                "kept-q", *(f"b{b}-q{n}" for b in range(6) for n in range(3)))}}
        assert [(q["type"], q["host"]) for q in document["queues"]
                if q["name"] == "kept-cq"] == [("classic", cluster.names[0])]
        for uri in cluster.uris():
            assert {u["name"] for u in call(uri, "users.list")} == {"guest", "late"}
            with connect(uri) as connection:
                channel = connection.channel()
                channel.exchange_declare("transient-x", passive=True)  # not in the file
                channel.confirm_delivery()
                channel.basic_publish("transient-x", "", b"fanned",
                                      pika.BasicProperties(delivery_mode=2))
                channel.basic_publish("amq.direct", "b5-k19", b"direct",
                                      pika.BasicProperties(delivery_mode=2))
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
                    channel.exchange_declare("kept-x", passive=True)
                assert gone.value.reply_code == 404
        with connect(three) as connection:  # the restored record reaches its host
            wait_for("the fanned messages in kept-cq, counted through node 3", lambda: (
                connection.channel().queue_declare("kept-cq", passive=True)
                .method.message_count == 3))

        # a restart after its own snapshots: the file and the log after the snapshot,
        # plus the non-durable exchange only the snapshot holds
        before = metadata(data[0])
        cluster.restart(0)
        wait_for("node 1 back in the cluster", lambda: status(one)["metadata_leader"])
        assert metadata(data[0]) == before
        with connect(one) as connection:
            channel = connection.channel()
            channel.exchange_declare("transient-x", passive=True)
            for queue in ("kept-q", "kept-cq", "b5-q1"):  # one published through each node
                wait_for(f"{queue}'s messages on node 1", lambda: channel.queue_declare(
                    queue, passive=True).method.message_count == 3)

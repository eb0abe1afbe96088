"""The metadata group's snapshot on a node of its own (broker/node/metadata_snapshot.py):
restoring the snapshot of any point of a command history makes a node's metadata
equal to a node that applied that history, from behind (creations) and from ahead
(deletions), classic queue records (on their host a queue, elsewhere a remote one)
and their bindings included; at start (MetaGroup.recover) the snapshot is restored only over a metadata
file older than it; `cluster.forget_node` takes a node out of the node list and the
queues' members, for good. Multi-process: test_metadata_snapshots.py,
test_forget_node.py."""

from __future__ import annotations

import json
import os

import pytest

from quorumqueue.broker.groups import metadata as meta
from quorumqueue.broker.node import group_commit, metadata
from quorumqueue.broker.node import metadata_snapshot as meta_snapshot
from quorumqueue.broker.cluster.cluster import Cluster
from quorumqueue.broker.config import Settings
from quorumqueue.broker.node.node import Node
from quorumqueue.broker.auth.users import UserStore
from quorumqueue.broker.queues.types import validate_declaration
from quorumqueue.broker.raft import SnapshotMeta
from quorumqueue.broker.raft.storage import LogStore, StorageConfig
from quorumqueue.broker.routing.exchanges import QUEUE, Destination
from quorumqueue.broker.server.server import assemble_node
from quorumqueue.broker.storage.metadata_store import (APPLIED_FILE, MetadataStore,
                                                       decode_arguments)

ME = "qq1@localhost"
QUORUM = {"x-queue-type": "quorum"}


def exchange(name: str, type_: str = "direct", durable: bool = True, auto_delete=False,
             vhost: str = "/", **arguments) -> tuple:
    return ("exchange.declare", dict(vhost=vhost, name=name, type=type_, durable=durable,
                                     auto_delete=auto_delete, internal=False,
                                     arguments=arguments))


def queue(name: str, group: str, members: list[str], vhost: str = "/") -> tuple:
    return ("queue.declare", dict(vhost=vhost, name=name, arguments=dict(QUORUM), group=group,
                                  members=members, leader=members[0]))


def classic(name: str, group: str, host: str, durable: bool = True, vhost: str = "/") -> tuple:
    return ("queue.declare", dict(vhost=vhost, name=name, type="classic", arguments={},
                                  group=group, host=host, durable=durable,
                                  auto_delete=False, exclusive_owner=None))


def bind(source: str, kind: str, destination: str, key: str = "", vhost: str = "/",
         **arguments) -> tuple:
    return ("bind", dict(vhost=vhost, source=source, kind=kind, destination=destination,
                         routing_key=key, arguments=arguments))


HISTORY = [
    ("vhost.add", dict(name="v2")),
    ("user.put", dict(name="alice", password_hash="hash-1", tags=["administrator"])),
    ("permissions.set", dict(user="alice", vhost="v2", patterns=[".*", "", ".*"])),
    ("policy.set", dict(policy=dict(vhost="/", name="cap", pattern="^orders",
                                    definition={"max-length": 10}, priority=1,
                                    apply_to="queues"))),
    exchange("x1"),
    exchange("x-transient", "fanout", durable=False),
    exchange("x-gone", "topic"),
    exchange("x-auto", "headers", auto_delete=True, **{"alternate-exchange": "x1"}),
    queue("orders", "g-orders", [ME, "qq2@localhost"]),
    queue("remote", "g-remote", ["qq2@localhost", "qq3@localhost"]),
    queue("in-v2", "g-in-v2", [ME], vhost="v2"),
    bind("x1", QUEUE, "orders", "new"),
    bind("amq.topic", "exchange", "x1", "#", level=1),
    bind("x-transient", QUEUE, "remote"),
    bind("x-gone", QUEUE, "orders", "a.*"),
    bind("x-auto", QUEUE, "remote", **{"x-match": "any", "colour": b"raw"}),
    ("queue.members", dict(vhost="/", name="orders", group="g-orders",
                           members=[ME, "qq2@localhost", "qq3@localhost"])),
    ("exchange.delete", dict(vhost="/", name="x-gone", if_unused=False)),
    queue("short", "g-short-1", [ME]),
    ("queue.delete", dict(vhost="/", name="short", group="g-short-1")),
    queue("short", "g-short-2", ["qq2@localhost"]),
    ("user.put", dict(name="bob", password_hash="hash-2", tags=[])),
    ("permissions.set", dict(user="bob", vhost="/", patterns=["", "", ".*"])),
    ("user.put", dict(name="alice", password_hash="hash-3", tags=[])),
    ("user.put", dict(name="bob", password_hash="hash-2", tags=["monitoring"])),
    ("user.put", dict(name="carol", password_hash="hash-4", tags=[],
                      hashing_algorithm="rabbit_password_hashing_sha512")),
    ("operator_policy.set", dict(policy=dict(vhost="/", name="op", pattern="^orders",
                                             definition={"max-length": 5}, priority=0,
                                             apply_to="queues"))),
    ("operator_policy.set", dict(policy=dict(vhost="v2", name="op2", pattern=".*",
                                             definition={"delivery-limit": 2}, priority=0,
                                             apply_to="quorum_queues"))),
    ("operator_policy.set", dict(policy=dict(vhost="/", name="op3", pattern="^x",
                                             definition={"max-length-bytes": 9},
                                             priority=4, apply_to="all"))),
    ("operator_policy.clear", dict(vhost="/", name="op3")),
    ("parameter.set", dict(component="shovel", vhost="/", name="s1",
                           value={"src-uri": "amqp://", "src-queue": "a",
                                  "dest-uri": "amqp://", "dest-queue": "b"})),
    ("parameter.set", dict(component="shovel", vhost="v2", name="s2",
                           value={"src-uri": "amqp://", "src-queue": "c",
                                  "dest-uri": "amqp://h", "dest-queue": "d"})),
    ("parameter.set", dict(component="shovel", vhost="/", name="s3",
                           value={"src-uri": "amqp://", "src-queue": "e",
                                  "dest-uri": "amqp://", "dest-queue": "f"})),
    ("parameter.clear", dict(component="shovel", vhost="/", name="s3")),
    ("unbind", bind("x1", QUEUE, "orders", "new")[1]),
    ("policy.clear", dict(vhost="/", name="cap")),
    ("policy.set", dict(policy=dict(vhost="v2", name="all", pattern=".*",
                                    definition={"delivery-limit": 3}, priority=0,
                                    apply_to="all"))),
    ("vhost.add", dict(name="v3")),
    exchange("x-v3", vhost="v3"),
    ("vhost.delete", dict(name="v2")),
    ("user.delete", dict(name="bob")),
    classic("local", "g-local", ME),
    classic("elsewhere", "g-elsewhere", "qq2@localhost", durable=False),
    bind("x1", QUEUE, "local", "mine"),
    bind("x-transient", QUEUE, "elsewhere"),
]


def new_node(tmp_path, name: str, **settings) -> Node:
    settings = Settings(node_name=ME, data_dir=str(tmp_path / name), **settings)
    return assemble_node(settings, UserStore.with_default_user(),
                         LogStore(settings.data_dir, StorageConfig(fsync=False)),
                         metadata_store=MetadataStore(settings.data_dir))


def apply(node: Node, history) -> None:
    """As MetaGroup.apply does with each entry's bytes."""
    for op, fields in history:
        command = json.loads(meta.encode(op, **dict(fields)))
        if "arguments" in command:
            command["arguments"] = decode_arguments(command["arguments"])
        metadata.APPLY[command["op"]](node, command)


def snapshot_of(node: Node) -> dict:
    return meta_snapshot.decode(meta_snapshot.encode(node))


@pytest.mark.parametrize("point", range(len(HISTORY) + 1))
def test_restoring_the_snapshot_of_any_point_equals_applying_the_history(tmp_path, point):
    full = new_node(tmp_path, "full")
    apply(full, HISTORY)
    at_point = new_node(tmp_path, "point")
    apply(at_point, HISTORY[:point])
    expected_full, expected_point = snapshot_of(full), snapshot_of(at_point)

    behind = new_node(tmp_path, "behind")  # a follower that missed the rest
    apply(behind, HISTORY[:point])
    meta_snapshot.restore(behind, expected_full)
    assert snapshot_of(behind) == expected_full

    ahead = new_node(tmp_path, "ahead")  # restored back to an earlier point
    apply(ahead, HISTORY)
    meta_snapshot.restore(ahead, expected_point)
    assert snapshot_of(ahead) == expected_point

    fresh = new_node(tmp_path, "fresh")
    meta_snapshot.restore(fresh, expected_full)
    assert snapshot_of(fresh) == expected_full


def test_the_snapshot_holds_what_the_group_replicates_and_nothing_else(tmp_path):
    node = new_node(tmp_path, "n")
    apply(node, HISTORY)
    snapshot = snapshot_of(node)
    assert sorted((q["vhost"], q["name"], q["type"], q["group"], q.get("members"),
                   q.get("host"), q["durable"]) for q in snapshot["queues"]) == [
        ("/", "elsewhere", "classic", "g-elsewhere", None, "qq2@localhost", False),
        ("/", "local", "classic", "g-local", None, ME, True),
        ("/", "orders", "quorum", "g-orders", [ME, "qq2@localhost", "qq3@localhost"], None,
         True),
        ("/", "remote", "quorum", "g-remote", ["qq2@localhost", "qq3@localhost"], None, True),
        ("/", "short", "quorum", "g-short-2", ["qq2@localhost"], None, True)]
    assert sorted((e["vhost"], e["name"], e["durable"]) for e in snapshot["exchanges"]) == [
        ("/", "x-auto", True), ("/", "x-transient", False), ("/", "x1", True),
        ("v3", "x-v3", True)]
    assert sorted((b["source"], b["destination"]) for b in snapshot["bindings"]) == [
        ("amq.topic", "x1"), ("x-auto", "remote"), ("x-transient", "elsewhere"),
        ("x-transient", "remote"), ("x1", "local")]
    assert snapshot["vhosts"] == ["/", "v3"]
    assert {u["name"]: u["tags"] for u in snapshot["users"]} == {
        "alice": [], "carol": [], "guest": ["administrator"]}
    assert [u.get("hashing_algorithm") for u in snapshot["users"]
            if u["name"] == "carol"] == ["rabbit_password_hashing_sha512"]
    # v2's operator policy went with its vhost; op3 was cleared
    assert [(p["vhost"], p["name"]) for p in snapshot["operator_policies"]] == [("/", "op")]


def test_a_version_1_snapshot_is_read_without_operator_policies(tmp_path):
    node = new_node(tmp_path, "n")
    apply(node, HISTORY)
    older = snapshot_of(node)
    older["version"] = 1
    del older["operator_policies"]
    for user in older["users"]:
        user.pop("hashing_algorithm", None)
    restored = new_node(tmp_path, "restored")
    meta_snapshot.restore(restored, meta_snapshot.decode(json.dumps(older).encode()))
    assert restored.operator_policies == {}
    assert {u.name: u.hashing for u in restored.users.users.values()}["carol"] == \
        "rabbit_password_hashing_sha256"


def test_a_restore_records_classic_queues_on_their_host_and_remote_elsewhere(tmp_path):
    leader = new_node(tmp_path, "leader")
    apply(leader, HISTORY)
    follower = new_node(tmp_path, "follower")
    apply(follower, HISTORY[:8])
    meta_snapshot.restore(follower, snapshot_of(leader))
    vhost = follower.vhosts["/"]
    local, elsewhere = vhost.queues["local"], vhost.queues["elsewhere"]
    assert (type(local).__name__, local.host, local.group, local.durable) == (
        "ClassicQueue", ME, "g-local", True)
    assert (type(elsewhere).__name__, elsewhere.host, elsewhere.durable) == (
        "RemoteClassicQueue", "qq2@localhost", False)
    # the restored binding routes to the queue this node holds
    assert [q.name for q in vhost.route(vhost.exchanges["x1"], "mine", lambda: None)] == \
        ["local"]
    # and a restore back to before their declaration deletes them with their bindings
    meta_snapshot.restore(follower, snapshot_of(new_node(tmp_path, "empty")))
    assert "local" not in vhost.queues and "elsewhere" not in vhost.queues


def test_a_restore_starts_the_replicas_of_queues_this_node_is_a_member_of(tmp_path):
    leader = new_node(tmp_path, "leader")
    apply(leader, HISTORY)
    follower = new_node(tmp_path, "follower")
    apply(follower, HISTORY[:7])
    meta_snapshot.restore(follower, snapshot_of(leader))
    orders = follower.vhosts["/"].queues["orders"]
    remote = follower.vhosts["/"].queues["remote"]
    assert orders.raft is not None and orders.group in follower.quorum.queues
    assert remote.raft is None and remote.group not in follower.quorum.queues
    # and a restore back drops the replica and its log, as queue.delete does
    meta_snapshot.restore(follower, snapshot_of(new_node(tmp_path, "empty")))
    assert "orders" not in follower.vhosts["/"].queues
    assert "g-orders" not in follower.quorum.queues
    assert "g-orders" not in follower.quorum.store.groups()


def test_a_restore_reopens_a_replica_whose_log_this_node_still_has(tmp_path):
    """A node that restarted over a metadata file older than the snapshot: a queue
    declared in between is missing from the file, but its group is in the log store:
    it is opened as after a restart (its log replayed, deliveries not sent again)."""
    leader = new_node(tmp_path, "leader")
    apply(leader, HISTORY)
    node = new_node(tmp_path, "restarted")
    apply(node, HISTORY[:11])  # in-v2: this node its only member, so it leads
    node.quorum.flush()
    group = node.vhosts["v2"].queues["in-v2"].group
    kept = node.quorum.store.last_index(group)
    del node.vhosts["v2"].queues["in-v2"], node.quorum.queues[group]  # not in the file
    at_eleven = new_node(tmp_path, "at-eleven")
    apply(at_eleven, HISTORY[:11])
    meta_snapshot.restore(node, snapshot_of(at_eleven))
    queue = node.vhosts["v2"].queues["in-v2"]
    assert node.quorum.queues[group] is queue and kept > 0
    assert queue.replay_until == kept  # recovered over its log, not declared afresh
    assert queue.raft.log.term_at(kept) == node.quorum.store.group_log(group).term_at(kept)
    assert snapshot_of(node) == snapshot_of(at_eleven)


def stored_snapshot(node: Node, snapshot: bytes, index: int) -> meta.MetaGroup:
    """The metadata group's snapshot at `index` in the node's log store, as a leader's
    InstallSnapshot leaves it."""
    store = node.quorum.store
    store.set_initial_members(meta.META_GROUP, [ME])
    store.install_snapshot(meta.META_GROUP, SnapshotMeta(index, 1, (ME,)), snapshot)
    return meta.MetaGroup(node, None, store, node.cluster)


def test_a_start_over_an_older_metadata_file_restores_the_snapshot(tmp_path):
    leader = new_node(tmp_path, "leader")
    apply(leader, HISTORY)
    node = new_node(tmp_path, "restarted")  # its metadata file: before the snapshot
    apply(node, HISTORY[:10])
    group = stored_snapshot(node, meta_snapshot.encode(leader), 40)
    group.recover()
    assert snapshot_of(node) == snapshot_of(leader)
    document, applied = group_commit.take_metadata(node)  # what the group commit saves
    assert applied == 40
    node.metadata.save(document)
    node.metadata.save_applied(applied)
    with open(os.path.join(node.settings.data_dir, APPLIED_FILE)) as handle:
        assert json.load(handle) == {"index": 40}
    saved = MetadataStore(node.settings.data_dir).load()
    assert sorted(q["name"] for q in saved["queues"]) == ["elsewhere", "local", "orders",
                                                          "remote", "short"]


def test_a_start_over_a_newer_metadata_file_only_adds_what_the_file_cannot_hold(tmp_path):
    at_snapshot = new_node(tmp_path, "leader")
    apply(at_snapshot, HISTORY[:14])  # up to the binding of x-transient
    node = new_node(tmp_path, "restarted")
    apply(node, HISTORY)  # saved after entries the snapshot does not hold
    node.vhosts["/"].exchanges.pop("x-transient")  # not durable: not in the file
    group = stored_snapshot(node, meta_snapshot.encode(at_snapshot), 14)
    node.metadata.save(node.metadata_document())
    with open(os.path.join(node.settings.data_dir, APPLIED_FILE), "w") as handle:
        json.dump({"index": 30}, handle)
    group.recover()
    vhost = node.vhosts["/"]
    assert vhost.exchanges["x-transient"].durable is False
    assert [b.destination.name for b in vhost.exchanges["x-transient"].bindings] == ["remote"]
    assert "x-gone" not in vhost.exchanges  # deleted after the snapshot: the file is right
    assert "short" in vhost.queues and "v3" in node.vhosts


def test_a_snapshot_of_another_version_is_refused():
    with pytest.raises(ValueError, match="metadata snapshot version 3: this node reads "
                                         "versions 1, 2"):
        meta_snapshot.decode(b'{"version": 3}')


def clustered_node(tmp_path, name: str) -> Node:
    return new_node(tmp_path, name, cluster_nodes=(
        f"{ME}:25672", "qq2@localhost:25673", "qq3@localhost:25674"))


def test_forget_node_leaves_the_node_list_and_the_queues_members_and_a_restore_follows(
        tmp_path):
    leader = clustered_node(tmp_path, "leader")
    history = [queue("three", "g-three", [ME, "qq2@localhost", "qq3@localhost"]),
               queue("only-on-two", "g-two", ["qq2@localhost"]),
               ("cluster.add_node", dict(name="qq4@localhost", address=["10.0.0.4", 25672])),
               ("cluster.forget_node", dict(name="qq2@localhost"))]
    apply(leader, history)
    assert leader.cluster.nodes == (ME, "qq3@localhost", "qq4@localhost")
    queues = leader.vhosts["/"].queues
    assert queues["three"].members == (ME, "qq3@localhost")
    assert queues["only-on-two"].members == ("qq2@localhost",)  # its last member stays
    apply(leader, history[-1:])  # applied again (a retry): nothing changes
    assert leader.cluster.nodes == (ME, "qq3@localhost", "qq4@localhost")

    follower = clustered_node(tmp_path, "follower")
    meta_snapshot.restore(follower, snapshot_of(leader))
    assert follower.cluster.nodes == leader.cluster.nodes
    assert snapshot_of(follower) == snapshot_of(leader)
    # forgotten for good: once the group commit saved the list, a restart over the
    # same data directory, configured as before
    assert Cluster(follower, follower.settings, follower.quorum.store).forgotten == set()  # not saved yet
    follower.flush()
    again = Cluster(follower, follower.settings, follower.quorum.store)
    assert again.nodes == (ME, "qq3@localhost", "qq4@localhost")
    assert again.forgotten == {"qq2@localhost"}


def test_a_balanced_classic_queue_goes_to_the_node_hosting_fewest_and_an_exclusive_one_stays(
        tmp_path):
    """queue-leader-locator "balanced" (RabbitMQ's guides, "Queue Leader Location"):
    the node hosting the fewest classic queues; an exclusive queue always lives on its
    connection's node (the queues guide, "Exclusive Queues")."""
    from quorumqueue.broker.queues.classic import ClassicQueue

    node = clustered_node(tmp_path, "placing")
    apply(node, [classic("a", "g-a", ME), classic("b", "g-b", ME),
                 classic("c", "g-c", "qq2@localhost")])
    balanced = {"x-queue-leader-locator": "balanced"}
    place = lambda exclusive: ClassicQueue.place(  # noqa: E731
        "/", "new", balanced, None, node.settings, node.cluster, exclusive=exclusive)
    assert place(False)["host"] == "qq3@localhost"
    assert place(True)["host"] == ME
    assert ClassicQueue.place("/", "new", {}, None, node.settings, node.cluster)["host"] == ME

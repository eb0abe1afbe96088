"""cluster/mirror_link.py without processes.

The mirror's side: a mirror acknowledges a persistent message of a durable queue to
its leader only once its own message store has it on disk (the guide's "Publisher
Confirms and Transactions": a confirm means every mirror has the message; here, as
on the leader, "has" means fsynced), and at once a message it keeps in memory; the
last batch of a synchronisation likewise (it is synchronised only then); a copy its
leader has not reset in its node's current run takes nothing and tells the leader.

The leader's side: a mirror whose node restarted leaves the record (its mirrors and
synchronised ones) before it is reset, and rejoins as a new mirror (the guide's
"Stopping Nodes and Synchronisation"; a confirm never goes out without a mirror the
record still calls synchronised).

The cluster tests are test_mirrored_queues.py and test_mirrored_queues_on_disk.py.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from quorumqueue.broker.amqp.codec import decode_properties
from quorumqueue.broker.amqp.properties import encode_properties
from quorumqueue.broker.cluster.classic_link import _SyncedReplies
from quorumqueue.broker.cluster.mirror_link import MirrorLink
from quorumqueue.broker.queues.classic import ClassicQueue
from quorumqueue.broker.queues.message import Message
from quorumqueue.broker.queues.mirroring import Mirroring, leader_record_changed
from quorumqueue.broker.queues.remote import RemoteClassicQueue
from quorumqueue.broker.storage.message_store import MessageStore


class Node:
    """What MirrorLink uses of the node (cluster/host.py ClusterHost): its queue "q"
    of vhost "/", its run, the policy, its fsync progress (as node/node.py keeps it)."""

    def __init__(self, queue, boot_id: str | None = None, policy=None) -> None:
        self.queues = {("/", "q"): queue}
        self.boot_id = boot_id
        self.policy = policy
        self.synced_batch_id = 0
        self.awaiting_sync: set = set()

    def queue(self, vhost: str, name: str):
        return self.queues.get((vhost, name))

    def all_queues(self):
        return list(self.queues.values())

    def policy_for(self, vhost: str, kind: str, name: str):
        return self.policy

    def after_sync(self, batch_id: int, waiter) -> bool:  # as Node.after_sync
        if batch_id <= self.synced_batch_id:
            return False
        self.awaiting_sync.add(waiter)
        return True


class Cluster:
    """What MirrorLink's mirror side uses of the cluster: its name, the node (its
    queue, its fsync progress), the posts to other nodes."""

    def __init__(self, queue) -> None:
        self.name = "b"
        self.node = Node(queue, boot_id="b-run-2")
        self.classic = SimpleNamespace(synced=_SyncedReplies())
        self.posted: list = []
        self.now = 0.0  # the clock, as Node.set_clock passes it to the cluster

    def _post(self, node, rpc) -> None:
        self.posted.append((node, rpc.kind, rpc.body))

    def synced(self, batch_id: int) -> None:  # as Node.synced
        self.node.synced_batch_id = batch_id
        for waiter in list(self.node.awaiting_sync):
            if waiter.release_confirms(batch_id):
                self.node.awaiting_sync.discard(waiter)


def mirror(tmp_path, durable: bool = True):
    store = MessageStore(str(tmp_path))
    store.recover()
    queue = RemoteClassicQueue("/", "q", durable, None, False, {}, "uid", "a",
                               SimpleNamespace(node_name="b"), store)
    queue.record_changed({"host": "a", "mirrors": ["b"], "synced": ["b"]})
    cluster = Cluster(queue)
    return queue, cluster, MirrorLink(cluster)


def op(kind_and_args: list) -> dict:
    return {"q": "uid", "v": "/", "n": "q", "o": kind_and_args}


def publish(seq: int, persistent: bool, ask: int) -> list:
    header = encode_properties(1, {"delivery_mode": 2 if persistent else 1})
    return ["p", seq, "", "q", header, b"x", 0, None, ask]


def test_a_persistent_message_is_acknowledged_once_the_mirrors_store_has_it(tmp_path):
    queue, cluster, link = mirror(tmp_path)
    link._on_op("a", op(["x"]))
    link._on_op("a", op(publish(1, persistent=True, ask=5)))
    assert cluster.posted == []            # not on disk yet
    cluster.synced(queue.store.flush())    # the node's group commit: write + fsync
    assert cluster.posted == [("a", "cm.ack", {"r": [5]})]
    link._on_op("a", op(publish(2, persistent=False, ask=6)))   # kept in memory
    assert cluster.posted[-1] == ("a", "cm.ack", {"r": [6]})


def test_a_non_durable_queues_mirror_acknowledges_at_once(tmp_path):
    queue, cluster, link = mirror(tmp_path, durable=False)
    link._on_op("a", op(["x"]))
    link._on_op("a", op(publish(1, persistent=True, ask=5)))
    assert cluster.posted == [("a", "cm.ack", {"r": [5]})]
    assert not queue.store.has_pending


def test_a_sync_batch_is_acknowledged_once_the_mirrors_store_has_it(tmp_path):
    queue, cluster, link = mirror(tmp_path)
    link._on_op("a", op(["x"]))
    header = encode_properties(1, {"delivery_mode": 2})
    link._on_op("a", op(["s", [[1, "", "q", header, b"x", 0, False]], 7]))
    assert cluster.posted == []            # the leader counts it synchronised only...
    cluster.synced(queue.store.flush())
    assert cluster.posted == [("a", "cm.ack", {"r": [7]})]   # ...once on disk


def test_a_copy_not_reset_in_this_run_takes_nothing_and_tells_its_leader(tmp_path):
    """The mirror's node restarted (its copy recovered from its store, or new) and
    its leader did not notice: what it sends is neither applied nor acknowledged,
    so no confirm goes out on this mirror's word until the leader detached it."""
    queue, cluster, link = mirror(tmp_path)
    link._on_op("a", op(publish(1, persistent=False, ask=5)))
    link._on_op("a", op(publish(2, persistent=False, ask=6)))
    assert len(queue.replica) == 0
    assert cluster.posted == [("a", "cm.stale", {"q": "uid", "v": "/", "n": "q",
                                                 "boot": "b-run-2"})]  # once
    link._on_op("a", op(["x"]))            # its leader reset it: a mirror again
    link._on_op("a", op(publish(3, persistent=False, ask=7)))
    assert cluster.posted[-1] == ("a", "cm.ack", {"r": [7]})
    assert list(queue.replica.entries) == [3]


class LeaderCluster:
    """What MirrorLink's placement uses: the cluster's nodes and their runs, the
    policies, the metadata group's proposals."""

    def __init__(self, queue) -> None:
        self.name = "a"
        self.nodes = ["a", "b", "c"]
        self.boots = {"b": "b-run-1", "c": "c-run-1"}
        self.node = Node(queue, policy=SimpleNamespace(definition={"ha-mode": "all"}))
        self.proposed: list[dict] = []
        self.meta = SimpleNamespace(
            propose_data=lambda data: self.proposed.append(json.loads(data)))
        self.now = 0.0  # the clock, as Node.set_clock passes it to the cluster


class Link:
    """The leader's MirrorLink as queues/mirroring.py sees it, holds kept."""

    sync_batch_size = 4096

    def __init__(self, boots) -> None:
        self.boots = boots
        self.holds: list = []

    def send(self, node, queue, op) -> None:
        pass

    def ask(self, node, queue, op, answer) -> None:
        self.holds.append((node, answer))

    def release(self, node, queue) -> None:
        for item in [h for h in self.holds if h[0] == node]:
            self.holds.remove(item)
            item[1](True)

    def boot(self, node):
        return self.boots.get(node)

    def carry_out(self, actions) -> None:
        assert not actions


def leader():
    queue = ClassicQueue("/", "q", False, None, False, {})
    queue.group, queue.host = "uid", "a"
    cluster = LeaderCluster(queue)
    queue.mirroring = Mirroring(queue, Link(cluster.boots), None)
    queue.mirrors, queue.synced = ("b", "c"), ("b", "c")
    for node in queue.mirrors:
        queue.mirroring.attach(node, cluster.boots[node])
    return queue, cluster, MirrorLink(cluster)


def test_a_restarted_mirror_leaves_the_record_before_its_confirms_go_out():
    queue, cluster, link = leader()
    confirms = []
    queue.mirroring.published(SimpleNamespace(seq=1, message=Message(
        "", "q", decode_properties(encode_properties(1, {}))[1], b"m"), expires=0),
        lambda: confirms.append)
    cluster.boots["b"] = "b-run-2"        # b's node restarted (c acknowledged)
    queue.mirroring.link.release("c", queue)
    link._place("/", queue, set())
    # not reset here while the record still calls it synchronised: it leaves first
    assert cluster.proposed[-1]["record"] == {"host": "a", "mirrors": ["c"],
                                              "synced": ["c"]}
    assert queue.mirroring.mirrors["b"].boot == "b-run-1" and confirms == [True]
    leader_record_changed(queue, cluster.proposed[-1]["record"])   # committed
    assert confirms == [True, True]       # released only now
    link._place("/", queue, set())        # and it rejoins as a new mirror
    assert cluster.proposed[-1]["record"] == {"host": "a", "mirrors": ["c", "b"],
                                              "synced": ["c"]}


def test_a_mirror_attached_before_its_run_was_heard_is_reset_when_it_reports():
    queue, cluster, link = leader()
    queue.mirroring.mirrors["b"].boot = None   # attached before b's run was heard
    link._on_stale("b", {"q": "uid", "v": "/", "n": "q", "boot": "b-run-2"})
    link._place("/", queue, set())
    assert cluster.proposed[-1]["record"]["mirrors"] == ["c"]
    # one attached in the run it reports got operations meant for an earlier
    # attachment (crossing its reset): it stays
    queue, cluster, link = leader()
    link._on_stale("b", {"q": "uid", "v": "/", "n": "q", "boot": "b-run-1"})
    link._place("/", queue, set())
    assert cluster.proposed == []


def test_a_mirror_kept_across_a_promotion_whose_copy_is_stale_is_reset_when_it_reports():
    """A mirror adopted by a promoted leader (not reset by it) whose node restarted
    before the promotion: its report is believed even from the run the new leader
    knows (no earlier attachment of this leader's could have crossed a reset)."""
    queue, cluster, link = leader()
    queue.mirroring.adopt("b", "b-run-1")
    link._on_stale("b", {"q": "uid", "v": "/", "n": "q", "boot": "b-run-1"})
    link._place("/", queue, set())
    assert cluster.proposed[-1]["record"]["mirrors"] == ["c"]


def test_a_policy_without_ha_sync_batch_size_syncs_in_the_configured_batches():
    """The mirroring guide's "Batch Synchronization": without ha-sync-batch-size
    the node's mirroring_sync_batch_size applies; the policy's key wins."""
    queue, cluster, link = leader()
    cluster.settings = SimpleNamespace(mirroring_sync_batch_size=7)
    assert Mirroring(queue, link, link.settings(queue)).batch_size == 7
    queue.policy_changed(SimpleNamespace(definition={"ha-mode": "all",
                                                     "ha-sync-batch-size": 3}))
    assert Mirroring(queue, link, queue.mirroring.settings).batch_size == 3


def test_a_mirror_whose_copy_predates_its_restart_is_passed_over_for_promotion(tmp_path):
    """The leader's node (a) and the first mirror's (b) went down together and b
    came back: b's copy (recovered from its store) may lack what a received since,
    so b does not propose itself and says so ("cm.incomplete"); c, which kept its
    copy, then proposes itself instead of waiting for b, and its record does not
    call b synchronised."""
    queue = RemoteClassicQueue("/", "q", True, None, False, {}, "uid", "a",
                               SimpleNamespace(node_name="c"))
    queue.record_changed({"host": "a", "mirrors": ["b", "c"], "synced": ["b", "c"]})
    queue.replica.complete = True   # reset by its leader in this node's run ("x")
    cluster = LeaderCluster(queue)
    cluster.name = "c"
    cluster.boots = {"b": "b-run-2"}
    cluster.node.boot_id = "c-run-1"
    cluster.settings = SimpleNamespace(permit_classic_queue_mirroring=True)
    cluster.posted = []
    cluster._post = lambda node, rpc: cluster.posted.append((node, rpc.kind, rpc.body))
    link = MirrorLink(cluster)
    link._promote("/", queue, {"a"})
    assert cluster.proposed == []          # b is the oldest synchronised: c waits
    link._on_incomplete("b", {"q": "uid", "boot": "b-run-1"})   # an earlier run's word
    link._promote("/", queue, {"a"})
    assert cluster.proposed == []
    link._on_incomplete("b", {"q": "uid", "boot": "b-run-2"})
    link._promote("/", queue, {"a"})
    assert cluster.proposed[-1]["record"] == {"host": "c", "mirrors": ["b"], "synced": []}

    # on b: its copy is incomplete, it proposes nothing and tells the others
    b_queue = RemoteClassicQueue("/", "q", True, None, False, {}, "uid", "a",
                                 SimpleNamespace(node_name="b"))
    b_queue.record_changed({"host": "a", "mirrors": ["b", "c"], "synced": ["b", "c"]})
    b_cluster = LeaderCluster(b_queue)
    b_cluster.name = "b"
    b_cluster.boots = {"c": "c-run-1"}
    b_cluster.node.boot_id = "b-run-2"
    b_cluster.posted = []
    b_cluster._post = lambda node, rpc: b_cluster.posted.append((node, rpc.kind, rpc.body))
    MirrorLink(b_cluster)._promote("/", b_queue, {"a"})
    assert b_cluster.proposed == []
    assert ("c", "cm.incomplete", {"q": "uid", "boot": "b-run-2"}) in b_cluster.posted

"""cluster/mirror_link.py's mirror side without processes: a mirror acknowledges a
persistent message of a durable queue to its leader only once its own message store
has it on disk (the guide's "Publisher Confirms and Transactions": a confirm means
every mirror has the message; here, as on the leader, "has" means fsynced), and at
once a message it keeps in memory. The cluster test is test_mirrored_queues_on_disk.py.
"""

from __future__ import annotations

from types import SimpleNamespace

from quorumqueue.broker.amqp.properties import encode_properties
from quorumqueue.broker.cluster.classic_link import _SyncedReplies
from quorumqueue.broker.cluster.mirror_link import MirrorLink
from quorumqueue.broker.queues.remote import RemoteClassicQueue
from quorumqueue.broker.storage.message_store import MessageStore


class Cluster:
    """What MirrorLink's mirror side uses of the cluster: its name, the node (its
    vhosts, its fsync progress), the posts to other nodes."""

    def __init__(self, queue) -> None:
        self.name = "b"
        self.node = SimpleNamespace(vhosts={"/": SimpleNamespace(queues={"q": queue})},
                                    synced_batch_id=0, awaiting_sync=set())
        self.classic = SimpleNamespace(synced=_SyncedReplies())
        self.posted: list = []

    def _post(self, node, rpc) -> None:
        self.posted.append((node, rpc.kind, rpc.body))

    def synced(self, batch_id: int) -> None:  # as Node.synced
        self.node.synced_batch_id = batch_id
        for waiter in list(self.node.awaiting_sync):
            if waiter.release_confirms(batch_id):
                self.node.awaiting_sync.discard(waiter)


def mirror(tmp_path, durable: bool = True):
    queue = RemoteClassicQueue("/", "q", durable, None, False, {}, "uid", "a",
                               SimpleNamespace(node_name="b"))
    queue.store = MessageStore(str(tmp_path))
    queue.store.recover()
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

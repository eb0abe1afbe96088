"""The cluster's metadata: a Raft group on every node replicating exchanges, bindings,
quorum-queue records, users, vhosts, permissions, policies and the cluster's nodes.

Responsibilities: the metadata commands (JSON objects, one per log entry) and their
application to a node's vhosts; the group's snapshots. Every node applies the same
commands in the same order, so every node routes the same way and knows every quorum
queue (its group uid and members). The node a client talks to checks what it can at
once (names, types, equivalence with what it already knows), proposes the command,
and answers the client when its own replica has applied it (replicated.py): an answer
leaves only once the change is committed and visible on that node.

Commands (field "op"):
  exchange.declare  vhost name type durable auto_delete internal arguments
  exchange.delete   vhost name if_unused
  queue.declare     vhost name type arguments group members leader   (quorum queues)
  queue.delete      vhost name group
  queue.members     vhost name group members   (the replicas asked for: membership.py)
  bind / unbind     vhost source kind destination routing_key arguments
  cluster.add_node  name address                 (a node joined: broker start --join)
  cluster.forget_node name                       (`ctl forget_cluster_node`: the node
                    leaves the node list and every quorum queue's members)
  user.put          name password_hash tags       (add_user, change_password, tags)
  user.delete       name
  vhost.add / vhost.delete  name
  permissions.set   user vhost patterns [configure, write, read]
  permissions.clear user vhost
  policy.set        policy {vhost name pattern definition priority apply_to}
  policy.clear      vhost name
  (node/definitions.py checks these on the proposing node and applies them)
Arguments are encoded as in the metadata file (storage/metadata_store.py).
Application is idempotent where a retry can repeat a command: declaring what exists
with the same definition, deleting what is gone, binding twice.

A reply is the command's result (a message count for queue.delete, None otherwise) or
`("error", reply_code, reply_text)` when it cannot be applied (another node declared
the same name differently first): the proposing node raises that as the channel
error RabbitMQ would have sent.

Snapshots: every `metadata_store.snapshot_interval` applied entries (4096, Khepri's
default) a member snapshots the whole replicated state (meta_snapshot.py) and
releases its log below it, as a quorum queue's member does at its release cursor; a
follower too far behind gets that snapshot (InstallSnapshot) and `restore`s it. The
node's metadata file (metadata.json, written by the node) is what a restart starts
from, and the log after the snapshot is applied again on top of it (application is
idempotent). So before a snapshot at index i is written, the metadata file is saved
with everything applied up to i, and `DATA_DIR/metadata_group_applied` records i:
a restart whose metadata file is older than the snapshot (a crash between installing
a leader's snapshot and saving it) restores the snapshot first (`recover`).

Not here: classic queues, which live on the node that declared them (and are
reachable only through it).
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING

from ..amqp.errors import AMQPError, precondition
from ..node.definitions import COMMANDS as DEFINITION_COMMANDS, apply_command
from ..queues.replicated import ReplicatedGroup
from ..raft import RaftNode
from ..routing.exchanges import EXCHANGE, QUEUE, Destination
from ..storage.metadata_store import decode_arguments, encode_arguments
from . import meta_snapshot

if TYPE_CHECKING:  # pragma: no cover
    from ..node.node import Node

log = logging.getLogger("quorumqueue.cluster")

META_GROUP = "_cluster/metadata"
APPLIED_FILE = "metadata_group_applied"  # {"index": i}: metadata.json holds every entry <= i


def encode(op: str, **fields) -> bytes:
    if "arguments" in fields:
        fields["arguments"] = encode_arguments(fields["arguments"])
    return json.dumps({"op": op, **fields}, separators=(",", ":")).encode()


class MetaGroup(ReplicatedGroup):
    """This node's member of the metadata group."""

    def __init__(self, node: "Node", raft: RaftNode) -> None:
        super().__init__(META_GROUP, raft)
        self.node = node
        # entries up to here were applied before a restart: replayed now
        self.replay_until = raft.log.last_index() if raft is not None else 0

    def apply(self, index: int, term: int, data: bytes):
        command = json.loads(data)
        if "arguments" in command:
            command["arguments"] = decode_arguments(command["arguments"])
        try:
            return APPLY[command["op"]](self.node, command)
        except AMQPError as error:
            return ("error", error.code, error.detail)

    def after_apply(self) -> None:
        """After a restart's replay, the node's say on what did not survive it; then a
        snapshot once `metadata_store.snapshot_interval` entries were applied since the
        last one, and the log released below it."""
        if self.replay_until and self.raft.applied_index >= self.replay_until:
            self.replay_until = 0
            self.node.metadata_replayed()
        store = self.node.quorum.store
        current = store.snapshot_meta(META_GROUP)
        applied = self.raft.applied_index
        interval = self.node.settings.metadata_snapshot_interval
        if applied - (current.index if current else 0) < interval:
            return
        data = meta_snapshot.encode(self.node)
        self._save_metadata(applied)
        store.write_snapshot(META_GROUP, self.raft.compact(applied), data)
        store.release(META_GROUP, applied + 1)
        log.debug("metadata group: snapshot at %d (%d bytes)", applied, len(data))

    def restore(self, data: bytes) -> None:
        """The leader's snapshot replaced this member's log (it was too far behind)."""
        meta_snapshot.restore(self.node, meta_snapshot.decode(data))
        installed = self.node.quorum.store.snapshot_meta(META_GROUP)
        self._save_metadata(installed.index if installed else 0)
        log.info("metadata group: restored the snapshot at %d",
                 installed.index if installed else 0)

    def recover(self) -> None:
        """At start, after the node loaded its metadata file: restore the group's
        snapshot if that file is older than it, else add what the file does not hold
        (non-durable exchanges and their bindings); the log after the snapshot is
        then applied on top, as after any restart."""
        stored = self.node.quorum.store.read_snapshot(META_GROUP)
        if stored is None:
            return
        if self._saved_index() >= stored[0].index:
            meta_snapshot.add_transient(self.node, meta_snapshot.decode(stored[1]))
            return
        log.info("metadata group: the metadata file is older than the snapshot at %d: "
                 "restoring it", stored[0].index)
        meta_snapshot.restore(self.node, meta_snapshot.decode(stored[1]))
        self._save_metadata(stored[0].index)

    def _applied_path(self) -> str:
        return os.path.join(self.node.settings.data_dir, APPLIED_FILE)

    def _saved_index(self) -> int:
        try:
            with open(self._applied_path()) as handle:
                return int(json.load(handle)["index"])
        except FileNotFoundError:
            return 0

    def _save_metadata(self, index: int) -> None:
        """The node's metadata file now, then the record that it holds entry `index`."""
        node = self.node
        if node.metadata is None:
            return
        node.metadata.save(node.metadata_document())
        node.metadata_dirty = False
        path = self._applied_path()
        with open(path + ".tmp", "w") as handle:
            json.dump({"index": index}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(path + ".tmp", path)


def _vhost(node: "Node", name: str):
    vhost = node.vhosts.get(name)
    if vhost is None:
        from ..node.vhost import VHost

        vhost = node.vhosts[name] = VHost(name)
    return vhost


def _exchange_declare(node: "Node", c: dict):
    _exchange, created = _vhost(node, c["vhost"]).declare_exchange(
        c["name"], c["type"], False, c["durable"], c["auto_delete"], c["internal"],
        c["arguments"])
    if created:
        node.metadata_dirty = True
    return None


def _exchange_delete(node: "Node", c: dict):
    if _vhost(node, c["vhost"]).delete_exchange(c["name"], c["if_unused"]) is not None:
        node.metadata_dirty = True
    return None


def _queue_declare(node: "Node", c: dict):
    from ..node.vhost import check_arguments_equivalent
    from ..queues.types import validate_declaration

    vhost = _vhost(node, c["vhost"])
    existing = vhost.queues.get(c["name"])
    if existing is not None:  # declared meanwhile through another node: the same?
        where = f"queue '{c['name']}' in vhost '{vhost.name}'"
        declared = c.get("type", "quorum")  # records before types were written: quorum
        if existing.type_name != declared:
            raise precondition(f"inequivalent arg 'x-queue-type' for {where}: received "
                               f"'{declared}' but current is '{existing.type_name}'")
        check_arguments_equivalent(*existing.equivalence_arguments(c["arguments"]), where,
                                   existing.EQUIVALENCE_KEYS)
        return None
    spec = validate_declaration(c["name"], vhost.name, True, False, False, c["arguments"])
    node.create_replicated_queue(vhost, c["name"], spec, c["group"], tuple(c["members"]),
                                 c["leader"])
    return None


def _queue_delete(node: "Node", c: dict):
    vhost = node.vhosts.get(c["vhost"])
    queue = vhost.queues.get(c["name"]) if vhost is not None else None
    if queue is None or getattr(queue, "group", None) != c["group"]:
        return 0  # gone already (a retry, or deleted through another node first)
    return node.delete_queue(vhost, queue)


def _queue_members(node: "Node", c: dict):
    """The members asked for (membership.py makes the Raft groups follow)."""
    vhost = node.vhosts.get(c["vhost"])
    queue = vhost.queues.get(c["name"]) if vhost is not None else None
    if queue is None or getattr(queue, "group", None) != c["group"]:
        return None
    queue.members = tuple(c["members"])
    node.metadata_dirty = True
    return None


def _bind(node: "Node", c: dict):
    vhost = _vhost(node, c["vhost"])
    destination = Destination(QUEUE if c["kind"] == QUEUE else EXCHANGE, c["destination"])
    if c["op"] == "unbind":
        vhost.unbind(c["source"], destination, c["routing_key"], c["arguments"])
    else:
        vhost.bind(c["source"], destination, c["routing_key"], c["arguments"])
    node.metadata_dirty = True
    return None


def _add_node(node: "Node", c: dict):
    node.cluster.add_node(c["name"], tuple(c["address"]))
    return None


def _forget_node(node: "Node", c: dict):
    """The node leaves the cluster's list and every quorum queue's members (their
    leaders then remove it from their Raft groups: membership.reconcile); a queue
    whose only member it was keeps it (it can only be deleted)."""
    name = c["name"]
    node.cluster.forget_node(name)
    for vhost in node.vhosts.values():
        for queue in vhost.queues.values():
            if queue.REPLICATED and name in queue.members and len(queue.members) > 1:
                queue.members = tuple(m for m in queue.members if m != name)
                node.metadata_dirty = True
    return None


def _definition(node: "Node", c: dict):
    apply_command(node, c)  # users, vhosts, permissions, policies: node/definitions.py
    return None


APPLY = {
    "cluster.add_node": _add_node,
    "cluster.forget_node": _forget_node,
    "exchange.declare": _exchange_declare,
    "exchange.delete": _exchange_delete,
    "queue.declare": _queue_declare,
    "queue.delete": _queue_delete,
    "queue.members": _queue_members,
    "bind": _bind,
    "unbind": _bind,
    **{op: _definition for op in DEFINITION_COMMANDS},
}

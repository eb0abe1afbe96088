"""The cluster's metadata: a Raft group on every node replicating exchanges, bindings,
queue records (every type), users, vhosts, permissions, policies and the cluster's nodes.

Responsibilities: the metadata commands (JSON objects, one per log entry), this
node's member of the group, and when it snapshots. What a command does to a node is
the node's own (node/metadata.py, `Node.apply_metadata`). So is the snapshot's
content (node/metadata_snapshot.py). This package never imports the node. Every
node applies the same commands in the same order. So every node routes the same
way, and knows every quorum queue (its group uid and members). The node a client
talks to checks what it can at once: names, types, equivalence with what it
already knows. It proposes the command. It answers the client when its own replica
has applied it (replicated.py). So an answer leaves only once the change is
committed and visible on that node.

Commands (field "op"):
  exchange.declare  vhost name type durable auto_delete internal arguments
  exchange.delete   vhost name if_unused
  queue.declare     vhost name type arguments group, and members leader (quorum
                    queues) or host durable auto_delete exclusive_owner (classic)
  queue.delete      vhost name group
  queue.members     vhost name group members   (the replicas asked for: membership.py)
  queue.record      vhost name group expect_host record {host mirrors synced}
                    (a mirrored classic queue: cluster/mirror_link.py)
  bind / unbind     vhost source kind destination routing_key arguments
  cluster.add_node  name address                 (a node joined: broker start --join)
  cluster.forget_node name                       (`ctl forget_cluster_node`: the node
                    leaves the node list and every quorum queue's members)
  user.put          name password_hash tags hashing_algorithm? (add_user,
                    change_password, tags, an imported user; absent: sha256)
  user.delete       name
  vhost.add / vhost.delete  name
  permissions.set   user vhost patterns [configure, write, read]
  permissions.clear user vhost
  policy.set        policy {vhost name pattern definition priority apply_to}
  policy.clear      vhost name
  operator_policy.set   policy {as policy.set}   (set_operator_policy)
  operator_policy.clear vhost name
  vhost.limits      vhost limits {max-connections, max-queues}   (empty: cleared)
  user.limits       name limits {max-connections, max-channels}  (node/limits.py)
  parameter.set     component vhost name value   (set_parameter: a dynamic shovel)
  parameter.clear   component vhost name
  barrier           (no fields; changes nothing: once a node applied it, it applied
                    everything committed before it: node/ordering.py `after_barrier`)
  (node/metadata.py applies every command to a node; node/definitions.py checks
  the definitions on the proposing node)
Arguments are encoded as in the metadata file (storage/metadata_store.py).
Application is idempotent where a retry can repeat a command. That is declaring
what exists with the same definition, deleting what is gone, binding twice.

A reply is the command's result: a message count for queue.delete, None otherwise.
It is `("error", reply_code, reply_text)` when the command cannot be applied:
another node declared the same name differently first. The proposing node raises
that as the channel error RabbitMQ would have sent.

A command forwarded by a node that does not lead the group carries its identity
(broker/raft/forwarded.py). It is applied once on every member. That holds even
when a leader crash made the next leader append it again (groups/replicated.py
`admit`). The duplicate's waiter gets the first application's reply (an error
tuple, a count).

Snapshots: every `metadata_store.snapshot_interval` applied entries (4096, Khepri's
default), a member snapshots the whole replicated state (node/metadata_snapshot.py).
It is wrapped with the identities of the forwarded commands applied
(forwarded.py). The member then releases its log below it, as a quorum queue's
member does at its release cursor. A follower too far behind gets that snapshot
(InstallSnapshot) and `restore`s it. A restart starts from the node's metadata
file (metadata.json, written by the node). The log after the snapshot is applied
again on top of it; application is idempotent. So a snapshot at index i asks the
node to save two things: the metadata file with everything applied up to i, and
the record of i (storage/metadata_store.py `save_applied`). Its next group commit
does so, off the event loop. A restart may find the metadata file older than the
snapshot: a crash before that commit. It then restores the snapshot first
(`recover`).

Not here: how a classic queue is reached from the nodes that do not host it
(classic_link.py).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from ..config import Settings
from ..raft import RaftNode
from ..raft.forwarded import dump_snapshot, load_snapshot
from ..raft.storage import LogStore
from ..raft.storage.errors import is_disk_full
from ..storage.metadata_store import MetadataStore, decode_arguments, encode_arguments
from .replicated import ReplicatedGroup, Router

log = logging.getLogger("quorumqueue.cluster")

META_GROUP = "_cluster/metadata"


def encode_reply(reply):
    """A command's reply as a JSON value: an error tuple as a list. It is kept in
    snapshots for forwarded commands."""
    return list(reply) if isinstance(reply, tuple) else reply


def decode_reply(value):
    return tuple(value) if isinstance(value, list) else value


class MetadataTimeout:
    """The reply a bounded wait gets when the metadata group did not apply its
    command within `metadata_store.operation_timeout`. (No majority online, say.)
    The command may still be applied later, once the group can commit it. A timeout
    says the answer did not come, not that the change did not happen. So do
    RabbitMQ 4's Khepri timeouts."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data  # the command, encoded

    @property
    def command(self) -> dict:
        return json.loads(self.data)


def timed_out_text(command: dict, node: str) -> str:
    """RabbitMQ 4's reply text (541 INTERNAL_ERROR) for a metadata change that
    timed out. It is verbatim where RabbitMQ has one:
    - queue declarations (rabbit_quorum_queue's and rabbit_amqqueue_process's);
    - exchange declarations and deletions (rabbit_channel's).
    Queue deletions and bindings take the exchange deletion's form."""
    op, vhost = command.get("op", ""), command.get("vhost", "/")
    name = command.get("name", "")
    if op == "queue.declare":
        kind = "quorum queue" if command.get("type", "quorum") == "quorum" else "queue"
        return (f"Could not declare {kind} '{name}' in vhost '{vhost}' on node '{node}' "
                "because the metadata store operation timed out")
    if op == "exchange.declare":
        return (f"failed to declare exchange '{name}' in vhost '{vhost}' because the "
                "operation timed out")
    if op in ("queue.delete", "exchange.delete"):
        kind = op.partition(".")[0]
        return f"failed to delete {kind} '{name}' in vhost '{vhost}' due to a timeout"
    if op in ("bind", "unbind"):
        action = "add" if op == "bind" else "remove"
        return (f"failed to {action} binding from exchange '{command.get('source')}' in "
                f"vhost '{vhost}' to {command.get('kind')} '{command.get('destination')}' "
                f"in vhost '{vhost}' due to a timeout")
    return f"failed to apply '{op}' due to a timeout (the metadata store operation timed out)"


class _Bounded:
    """A waiter answered at most once, whichever comes first. That is its command's
    reply, or `timed_out` once `deadline` passed (MetaGroup.expire)."""

    __slots__ = ("waiter", "deadline", "timed_out", "answered")

    def __init__(self, waiter, deadline: float, timed_out) -> None:
        self.waiter = waiter
        self.deadline = deadline
        self.timed_out = timed_out
        self.answered = False

    def __call__(self, reply) -> None:
        if not self.answered:
            self.answered = True
            self.waiter(reply)


def encode(op: str, **fields) -> bytes:
    if "arguments" in fields:
        fields["arguments"] = encode_arguments(fields["arguments"])
    return json.dumps({"op": op, **fields}, separators=(",", ":")).encode()


class MetadataHost(Protocol):
    """What the metadata group asks of its node (node/node.py implements it).
    That is: apply a command, take and restore a snapshot, save the metadata file."""

    settings: Settings
    metadata: MetadataStore | None   # the metadata file (None: nothing is saved)
    metadata_dirty: bool             # the file is to be saved (by the group commit)
    metadata_applied_index: int | None   # and, with it, the group's entry it holds

    def apply_metadata(self, command: dict) -> Any:
        """One command, applied to this node as on every node; returns its reply."""

    def metadata_replayed(self) -> None:
        """The log a restart found was applied again."""

    def metadata_snapshot(self) -> bytes:
        """Everything the group replicates, as its snapshot."""

    def restore_metadata(self, data: bytes, transient_only: bool = False) -> None:
        """Make the node's metadata equal to a snapshot."""



class MetaGroup(ReplicatedGroup):
    """This node's member of the metadata group."""

    def __init__(self, node: MetadataHost, raft: RaftNode | None, store: LogStore,
                 router: Router) -> None:
        super().__init__(META_GROUP, raft, router)
        self.node = node
        self.store = store  # the node's log store: snapshots of this group
        # entries up to here were applied before a restart: replayed now
        self.replay_until = raft.log.last_index() if raft is not None else 0
        self._bounded: list[_Bounded] = []  # waiters with a deadline (bounded, expire)

    def bounded(self, waiter, now: float, timed_out):
        """`waiter` answered within `metadata_store.operation_timeout` of `now`.
        It gets the command's reply, else `timed_out`. So a client waiting on a change
        the group cannot commit gets an error in bounded time, not silence."""
        call = _Bounded(waiter, now + self.node.settings.metadata_timeout_ms / 1000,
                        timed_out)
        self._bounded.append(call)
        return call

    def expire(self, now: float) -> None:
        """Answer the bounded waiters whose deadline passed (the server's tick)."""
        live = []
        for call in self._bounded:
            if call.answered:
                continue
            if now >= call.deadline:
                call(call.timed_out)
            else:
                live.append(call)
        self._bounded = live

    def apply(self, index: int, term: int, data: bytes):
        command = json.loads(data)
        if "arguments" in command:
            command["arguments"] = decode_arguments(command["arguments"])
        return self.node.apply_metadata(command)  # node/metadata.py

    def after_apply(self) -> None:
        """After a restart's replay: the node's say on what did not survive it.
        Then a snapshot, once `metadata_store.snapshot_interval` entries were applied
        since the last one. The log is released below it."""
        if self.replay_until and self.raft.applied_index >= self.replay_until:
            self.replay_until = 0
            self.node.metadata_replayed()
        if self.raft.log.unstable_snapshot() is not None:
            return  # the leader's snapshot, received meanwhile, replaces this state next
        store = self.store
        current = store.snapshot_meta(META_GROUP)
        applied = self.raft.applied_index
        interval = self.node.settings.metadata_snapshot_interval
        if applied - (current.index if current else 0) < interval:
            return
        data = dump_snapshot(self.applied, self.node.metadata_snapshot(), encode_reply)
        try:
            self._save_metadata(applied)
            store.write_snapshot(META_GROUP, self.raft.compact(applied), data)
        except OSError as error:
            if not is_disk_full(error):
                raise
            # the log keeps its entries; the next entry applied tries again
            log.warning("metadata group: snapshot at %d postponed: %s", applied, error)
            return
        store.release(META_GROUP, applied + 1)
        log.debug("metadata group: snapshot at %d (%d bytes)", applied, len(data))

    def restore(self, data: bytes) -> None:
        """The leader's snapshot replaced this member's log (it was too far behind)."""
        self.applied, data = load_snapshot(data, decode_reply)
        self.node.restore_metadata(data)
        installed = self.store.snapshot_meta(META_GROUP)
        try:
            self._save_metadata(installed.index if installed else 0)
        except OSError as error:
            if not is_disk_full(error):
                raise
            # the metadata file stays older than the snapshot: a restart restores it
            log.warning("metadata group: metadata file not saved: %s", error)
        log.info("metadata group: restored the snapshot at %d",
                 installed.index if installed else 0)

    def recover(self) -> None:
        """At start, after the node loaded its metadata file. Restore the group's
        snapshot if that file is older than it. Else add what the file does not hold:
        non-durable exchanges and their bindings. The log after the snapshot is then
        applied on top, as after any restart."""
        stored = self.store.read_snapshot(META_GROUP)
        if stored is None:
            return
        self.applied, data = load_snapshot(stored[1], decode_reply)  # the log replays on it
        if self._saved_index() >= stored[0].index:
            self.node.restore_metadata(data, transient_only=True)
            return
        log.info("metadata group: the metadata file is older than the snapshot at %d: "
                 "restoring it", stored[0].index)
        self.node.restore_metadata(data)
        self._save_metadata(stored[0].index)

    def _saved_index(self) -> int:
        return self.node.metadata.applied_index() if self.node.metadata is not None else 0

    def _save_metadata(self, index: int) -> None:
        """The node's metadata file, then the record that it holds entry `index`.
        The node's next group commit writes both, off the event loop. A crash before
        that finds the file older than the snapshot, and restores it."""
        if self.node.metadata is None:
            return
        self.node.metadata_dirty = True
        self.node.metadata_applied_index = index

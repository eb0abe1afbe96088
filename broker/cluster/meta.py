"""The cluster's metadata: a Raft group on every node replicating exchanges, bindings,
quorum-queue records, users, vhosts, permissions and policies.

Responsibilities: the metadata commands (JSON objects, one per log entry) and their
application to a node's vhosts. Every node applies the same commands in the same
order, so every node routes the same way and knows every quorum queue (its group uid
and members). The node a client talks to checks what it can at once (names, types,
equivalence with what it already knows), proposes the command, and answers the
client when its own replica has applied it (replicated.py): an answer leaves only
once the change is committed and visible on that node.

Commands (field "op"):
  exchange.declare  vhost name type durable auto_delete internal arguments
  exchange.delete   vhost name if_unused
  queue.declare     vhost name arguments group members leader   (quorum queues)
  queue.delete      vhost name group
  queue.members     vhost name group members   (the replicas asked for: membership.py)
  bind / unbind     vhost source kind destination routing_key arguments
  cluster.add_node  name address                 (a node joined: broker start --join)
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

Not here (yet): classic queues, which live on the node that declared them (and are
reachable only through it); snapshots of this group (its log holds only metadata
changes).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..amqp.errors import AMQPError, precondition
from ..node.definitions import COMMANDS as DEFINITION_COMMANDS, apply_command
from ..queues.replicated import ReplicatedGroup
from ..raft import RaftNode
from ..routing.exchanges import EXCHANGE, QUEUE, Destination
from ..storage.metadata_store import decode_arguments, encode_arguments

if TYPE_CHECKING:  # pragma: no cover
    from ..node.node import Node

META_GROUP = "_cluster/metadata"


def encode(op: str, **fields) -> bytes:
    if "arguments" in fields:
        fields["arguments"] = encode_arguments(fields["arguments"])
    return json.dumps({"op": op, **fields}, separators=(",", ":")).encode()


class MetaGroup(ReplicatedGroup):
    """This node's member of the metadata group."""

    def __init__(self, node: "Node", raft: RaftNode) -> None:
        super().__init__(META_GROUP, raft)
        self.node = node

    def apply(self, index: int, term: int, data: bytes):
        command = json.loads(data)
        if "arguments" in command:
            command["arguments"] = decode_arguments(command["arguments"])
        try:
            return APPLY[command["op"]](self.node, command)
        except AMQPError as error:
            return ("error", error.code, error.detail)

    def after_apply(self) -> None:
        pass

    def restore(self, data: bytes) -> None:  # pragma: no cover - never snapshotted
        raise RuntimeError("the metadata group takes no snapshots (broker/cluster/meta.py)")


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
    from ..queues.types import EQUIVALENCE_KEYS_BY_TYPE, validate_declaration

    vhost = _vhost(node, c["vhost"])
    existing = vhost.queues.get(c["name"])
    if existing is not None:  # declared meanwhile through another node: the same?
        where = f"queue '{c['name']}' in vhost '{vhost.name}'"
        if existing.type_name != "quorum":
            raise precondition(f"inequivalent arg 'x-queue-type' for {where}: received "
                               f"'quorum' but current is '{existing.type_name}'")
        check_arguments_equivalent(c["arguments"], existing.arguments, where,
                                   EQUIVALENCE_KEYS_BY_TYPE["quorum"])
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


def _definition(node: "Node", c: dict):
    apply_command(node, c)  # users, vhosts, permissions, policies: node/definitions.py
    return None


APPLY = {
    "cluster.add_node": _add_node,
    "exchange.declare": _exchange_declare,
    "exchange.delete": _exchange_delete,
    "queue.declare": _queue_declare,
    "queue.delete": _queue_delete,
    "queue.members": _queue_members,
    "bind": _bind,
    "unbind": _bind,
    **{op: _definition for op in DEFINITION_COMMANDS},
}

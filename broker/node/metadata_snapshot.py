"""The metadata group's snapshot: everything the group replicates, as one JSON document,
and making a node's metadata equal to one.

Responsibilities: `document(node)` builds the snapshot of what the metadata
commands (groups/metadata.py) replicate:
- the cluster's nodes, vhosts, users with their permissions, policies;
- exchanges, all but the default and `amq.*` ones, which every vhost has;
- queue records (quorum: group and members; classic: uid and host);
- the bindings whose destination is replicated. That is every exchange and queue:
  quorum queues and classic ones, with their host.
`restore(node, document)` changes a node until `document(node)` equals the
snapshot. It does what applying every command up to the snapshot's index would:
- Nodes the snapshot lacks are forgotten (`cluster.forget_node`). Those this node
  lacks are added (`cluster.add_node`).
- Vhosts, users, permissions, policies and operator policies are replaced, with
  node/definitions.py's `apply_*`. Deleting a vhost deletes its queues and closes
  its connections. Deleting a user closes its connections. So do the commands.
- A quorum queue the node has and the snapshot lacks is deleted, as `queue.delete`
  does. (So is one the snapshot holds under another group uid: it is deleted and
  declared again.) One it lacks is recorded as `queue.declare` does. That is a
  replica started where this node is a member, else a record that proxies to the
  leader. Or it is reopened from this node's log store when its group is already
  there (a node that restarted). A kept one takes the snapshot's members
  (`queue.members`).
- A classic queue is recorded the same way. On its host it is a queue, empty: a
  snapshot restores records, not messages. Elsewhere it is a remote one.
- Exchanges and bindings are replaced. An exchange whose definition did not change
  stays the same object.

`add_transient(node, document)` is the restart's half-way. It works over a
metadata file at least as new as the snapshot. It only adds what that file cannot
hold: non-durable exchanges and their bindings.

Format (version 2, JSON, keys sorted):
  {"version": 2, "nodes": {name: [host, port]}, "vhosts": [...],
   "users": [{name, password_hash, tags, permissions: {vhost: [configure, write, read]},
              limits?, hashing_algorithm? (absent: rabbit_password_hashing_sha256)}],
   "vhost_limits": {vhost: {max-connections?, max-queues?}} (optional: none),
   "policies": [{vhost, name, pattern, definition, priority, apply_to}],
   "operator_policies": [the same fields] (new in version 2),
   "parameters": [{vhost, component, name, value}] (runtime parameters: shovels;
                 optional, absent when there are none, so a node that predates it
                 reads every snapshot without one),
   "exchanges": [{vhost, name, type, durable, auto_delete, internal, arguments}],
   "queues": [{vhost, name, type, durable, auto_delete, arguments, group,
               members (quorum) | host, exclusive_owner (classic)}],
   "bindings": [{vhost, source, kind, destination, routing_key, arguments}]}
Arguments are encoded as in the metadata file (storage/metadata_store.py).
Version 1 (before operator policies and hashing algorithms) is still read: it has
no operator policies and sha256 hashes only.

Invariants:
- `restore` touches the disk only where the commands would: a deleted queue's
  group, cluster_nodes.json.
- The exchange and binding removals it makes do not auto-delete exchanges. The
  snapshot says which exist.
- An auto-delete exchange a deleted queue took along is declared again when the
  snapshot has it.

Not here: when snapshots are taken and restored (groups/metadata.py), the log
(broker/raft).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..auth.users import SHA256, Permissions, User
from . import definitions, limits
from .operator_policies import parse_operator_policy
from .policies import parse_policy
from ..queues.types import validate_declaration
from ..routing.exchanges import EXCHANGE, QUEUE, Binding, Destination, freeze
from ..storage.metadata_store import decode_arguments, encode_arguments

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node
    from .vhost import VHost

VERSION = 2
READABLE = (1, 2)  # version 1: no operator policies, no hashing algorithms


def _replicated_exchange(name: str) -> bool:
    return bool(name) and not name.startswith("amq.")


def _replicated_binding(vhost: "VHost", binding: Binding) -> bool:
    if binding.destination.kind == EXCHANGE:
        return True
    return binding.destination.name in vhost.queues


def document(node: "Node") -> dict:
    cluster = node.cluster
    exchanges, queues, bindings = [], [], []
    for vhost in node.vhosts.values():
        for exchange in vhost.exchanges.values():
            if _replicated_exchange(exchange.name):
                exchanges.append(_exchange_item(vhost.name, exchange))
        for queue in vhost.queues.values():
            queues.append(_queue_item(vhost.name, queue))
        for binding in vhost.bindings():
            if _replicated_binding(vhost, binding):
                bindings.append(_binding_item(vhost.name, binding))
    users = [{"name": u.name, "password_hash": u.password_hash, "tags": list(u.tags),
              "permissions": {v: p.as_list() for v, p in sorted(u.permissions.items())},
              **({"limits": dict(u.limits)} if u.limits else {}),
              **({"hashing_algorithm": u.hashing} if u.hashing != SHA256 else {})}
             for u in node.users.users.values()]
    policies = [policy.as_dict() for vhost in node.policies.values()
                for policy in vhost.values()]
    operator_policies = [policy.as_dict() for vhost in node.operator_policies.values()
                         for policy in vhost.values()]
    nodes = {n: list(a) for n, a in cluster.addresses.items()}
    key = lambda item: json.dumps(item, sort_keys=True)  # noqa: E731 - one sort order
    return {"version": VERSION, "nodes": dict(sorted(nodes.items())),
            "vhosts": sorted(node.vhosts), "users": sorted(users, key=key),
            "vhost_limits": limits.document(node),
            "policies": sorted(policies, key=key),
            "operator_policies": sorted(operator_policies, key=key),
            **({"parameters": node.parameter_items()} if node.parameters else {}),
            "exchanges": sorted(exchanges, key=key),
            "queues": sorted(queues, key=key), "bindings": sorted(bindings, key=key)}


def encode(node: "Node") -> bytes:
    return json.dumps(document(node), sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes) -> dict:
    snapshot = json.loads(data)
    if snapshot.get("version") not in READABLE:
        raise ValueError(f"metadata snapshot version {snapshot.get('version')!r}: this node "
                         f"reads versions {', '.join(map(str, READABLE))}")
    return snapshot


def _queue_item(vhost: str, queue) -> dict:
    item = {"vhost": vhost, "name": queue.name, "type": queue.type_name,
            "durable": queue.durable, "auto_delete": queue.auto_delete,
            "arguments": encode_arguments(queue.arguments), **queue.metadata_record()}
    if "members" in item:
        item["members"] = sorted(item["members"])
    return item


def _spec(vhost: str, name: str, item: dict):
    """The declaration a snapshot's (or metadata file's) queue record stands for."""
    return validate_declaration(name, vhost, item.get("durable", True),
                                item.get("exclusive_owner") is not None,
                                item.get("auto_delete", False),
                                decode_arguments(item["arguments"]), recorded=True)


def _exchange_item(vhost: str, exchange) -> dict:
    return {"vhost": vhost, "name": exchange.name, "type": exchange.type,
            "durable": exchange.durable, "auto_delete": exchange.auto_delete,
            "internal": exchange.internal, "arguments": encode_arguments(exchange.arguments)}


def _binding_item(vhost: str, binding: Binding) -> dict:
    return {"vhost": vhost, "source": binding.source, "kind": binding.destination.kind,
            "destination": binding.destination.name, "routing_key": binding.routing_key,
            "arguments": encode_arguments(binding.arguments_dict)}


# ---------------------------------------------------------------- restore


def restore(node: "Node", snapshot: dict) -> None:
    """Make the node's replicated metadata equal to `snapshot` (a decoded document)."""
    _restore_nodes(node, snapshot["nodes"])
    _restore_vhosts(node, snapshot["vhosts"])
    limits.restore(node, snapshot.get("vhost_limits", {}))
    _restore_users(node, snapshot["users"])
    _restore_policies(node, snapshot["policies"])
    _restore_policies(node, snapshot.get("operator_policies", []), operator=True)
    node.parameters = {(p["component"], p["vhost"], p["name"]): p["value"]
                       for p in snapshot.get("parameters", ()) if p["vhost"] in node.vhosts}
    _restore_queues(node, snapshot["queues"])
    _restore_exchanges(node, snapshot["exchanges"])
    _restore_bindings(node, snapshot["bindings"])
    for vhost in list(node.vhosts):
        node.apply_policies(vhost)  # new exchanges and queues take theirs too
    node.metadata_dirty = True


def add_transient(node: "Node", snapshot: dict) -> None:
    """At start, over a metadata file at least as new as the snapshot. Add what
    the snapshot has, the node lacks and the file does not hold. That is non-durable
    exchanges, and bindings with one end not durable. The log after the snapshot,
    applied next, deletes again what was deleted after it."""
    exchanges = {(item["vhost"], item["name"]): item for item in snapshot["exchanges"]}
    for (vhost_name, name), item in sorted(exchanges.items()):
        vhost = node.vhosts.get(vhost_name)
        if vhost is not None and not item["durable"] and name not in vhost.exchanges:
            vhost.declare_exchange(name, item["type"], False, False, item["auto_delete"],
                                   item["internal"], decode_arguments(item["arguments"]))

    def durable(vhost: str, name: str) -> bool:
        return not _replicated_exchange(name) or exchanges[(vhost, name)]["durable"]

    for item in snapshot["bindings"]:
        vhost = node.vhosts.get(item["vhost"])
        if vhost is None or (durable(item["vhost"], item["source"]) and (
                item["kind"] == QUEUE or durable(item["vhost"], item["destination"]))):
            continue
        kind = QUEUE if item["kind"] == QUEUE else EXCHANGE
        source = vhost.exchanges.get(item["source"])
        targets = vhost.queues if kind == QUEUE else vhost.exchanges
        if source is not None and item["destination"] in targets:
            source.add_binding(Binding(item["source"], Destination(kind, item["destination"]),
                                       item["routing_key"],
                                       freeze(decode_arguments(item["arguments"]))))


def _restore_nodes(node: "Node", nodes: dict) -> None:
    """Nodes this one knows keep the address it reaches them at. Its configuration
    may name a different route than the snapshot's author's."""
    cluster = node.cluster
    for name in [n for n in cluster.addresses if n not in nodes and n != cluster.name]:
        cluster.forget_node(name)
    for name, address in nodes.items():
        if name not in cluster.addresses:
            cluster.add_node(name, tuple(address))


def _restore_vhosts(node: "Node", names: list[str]) -> None:
    for name in [n for n in node.vhosts if n not in names]:
        definitions.apply_delete_vhost(node, name)
    for name in names:
        definitions.apply_vhost(node, name)


def _restore_users(node: "Node", users: list[dict]) -> None:
    wanted = {item["name"]: User(item["name"], item["password_hash"], tuple(item["tags"]),
                                 {vhost: Permissions(*patterns)
                                  for vhost, patterns in item["permissions"].items()},
                                 dict(item.get("limits", {})),
                                 item.get("hashing_algorithm", SHA256))
              for item in users}
    for name in [n for n in node.users.users if n not in wanted]:
        definitions.apply_delete_user(node, name)
    for name, user in wanted.items():
        current = node.users.users.get(name)
        if current is None:
            node.users.users[name] = user
        elif current != user:  # in place: sessions hold their user
            current.password_hash, current.tags = user.password_hash, user.tags
            current.hashing = user.hashing
            current.permissions.clear()
            current.permissions.update(user.permissions)
            current.limits = user.limits
        limits.refresh_quota(node, name)


def _restore_policies(node: "Node", policies: list[dict], operator: bool = False) -> None:
    store = node.operator_policies if operator else node.policies
    parse = parse_operator_policy if operator else parse_policy
    wanted: dict[str, dict] = {}
    for item in policies:
        policy = parse(item["vhost"], item["name"], item["pattern"],
                       item["definition"], item["priority"], item["apply_to"],
                       **({} if operator else {"permit_mirroring": bool(getattr(
                           node.settings, "permit_classic_queue_mirroring", False))}))
        wanted.setdefault(policy.vhost, {})[policy.name] = policy
    for vhost in set(wanted) | set(store):
        current = store.get(vhost, {})
        target = wanted.get(vhost, {})
        if ({n: p.as_dict() for n, p in current.items()}
                == {n: p.as_dict() for n, p in target.items()}):
            continue
        if target:
            store[vhost] = dict(target)
        else:
            store.pop(vhost, None)


def _restore_queues(node: "Node", queues: list[dict]) -> None:
    wanted = {(item["vhost"], item["name"]): item for item in queues}
    for vhost in list(node.vhosts.values()):
        for queue in list(vhost.queues.values()):
            item = wanted.get((vhost.name, queue.name))
            if item is None or item["group"] != queue.group:
                node.delete_queue(vhost, queue)  # as queue.delete
            elif queue.REPLICATED and tuple(sorted(queue.members)) != tuple(item["members"]):
                queue.members = tuple(item["members"])  # as queue.members
            elif _mirroring_changed(queue.metadata_record(), item):  # as queue.record
                node.queue_record_changed(vhost, queue, {
                    key: item.get(key) for key in ("host", "mirrors", "synced",
                                                   "stopped")})
    quorum = node.quorum
    for (vhost_name, name), item in sorted(wanted.items()):
        vhost = node.vhosts[vhost_name]
        if name in vhost.queues:
            continue
        # a quorum queue's replica this node still has (from before a restart) is
        # reopened over its log; anything else is recorded as queue.declare does (a
        # quorum group's leader was elected long ago)
        reopen = bool(item.get("members")) and item["group"] in quorum.store.groups()
        node.create_recorded_queue(vhost, name, _spec(vhost_name, name, item), item,
                                     recover=reopen)


def _mirroring_changed(current: dict, item: dict) -> bool:
    """A mirrored classic queue's leader, mirrors, synchronised or stopped mirrors differ."""
    return ("mirrors" in current or "mirrors" in item) and any(
        current.get(key) != item.get(key)
        for key in ("host", "mirrors", "synced", "stopped"))


def _restore_exchanges(node: "Node", exchanges: list[dict]) -> None:
    wanted = {(item["vhost"], item["name"]): item for item in exchanges}
    for vhost in node.vhosts.values():
        for exchange in list(vhost.exchanges.values()):
            if not _replicated_exchange(exchange.name):
                continue
            item = wanted.get((vhost.name, exchange.name))
            if item is None or item != _exchange_item(vhost.name, exchange):
                _remove_exchange(vhost, exchange.name)
    for (vhost_name, name), item in sorted(wanted.items()):
        vhost = node.vhosts[vhost_name]
        if name not in vhost.exchanges:
            vhost.declare_exchange(name, item["type"], False, item["durable"],
                                   item["auto_delete"], item["internal"],
                                   decode_arguments(item["arguments"]))


def _remove_exchange(vhost: "VHost", name: str) -> None:
    """Delete an exchange and the bindings to it. Exchanges that lose their last
    binding are not auto-deleted: the snapshot says which exchanges exist."""
    del vhost.exchanges[name]
    gone = Destination(EXCHANGE, name)
    for exchange in vhost.exchanges.values():
        for binding in exchange.bindings_to(gone):
            exchange.remove_binding(binding)


def _restore_bindings(node: "Node", bindings: list[dict]) -> None:
    wanted: dict[str, set[Binding]] = {}
    for item in bindings:
        kind = QUEUE if item["kind"] == QUEUE else EXCHANGE
        wanted.setdefault(item["vhost"], set()).add(Binding(
            item["source"], Destination(kind, item["destination"]), item["routing_key"],
            freeze(decode_arguments(item["arguments"]))))
    for vhost in node.vhosts.values():
        target = wanted.get(vhost.name, set())
        for binding in list(vhost.bindings()):
            if _replicated_binding(vhost, binding) and binding not in target:
                vhost.exchanges[binding.source].remove_binding(binding)
        for binding in target:
            vhost.exchanges[binding.source].add_binding(binding)  # a no-op if bound

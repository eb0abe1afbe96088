"""The queue types a node can create, by the name `x-queue-type` gives.

`create_recorded` builds a queue of the type a validated declaration names (types.py
`validate_declaration`) from its metadata record (a `queue.declare` applied, a
snapshot restored, the metadata file at start), with what that type needs from the
node (`host`: its message store and name for classic queues, the link to other
nodes for classic queues held elsewhere, its quorum groups for quorum queues): a
quorum queue's replica or proxy, a classic queue on its host and a remote one
(remote.py) elsewhere; a mirrored classic queue (record fields `mirrors`, `synced`:
mirroring.py) is a classic queue on its leader replicating to its mirrors, and a
remote one elsewhere, with a copy on each mirror. `type_of` names the class (its `place` gives the record).
Adding a type means a module in this package and a line here. The node, the channel
and the method handlers only ever see `base.Queue`.

Not here: validation (types.py), replication of the queue record (groups/metadata.py).
"""

from __future__ import annotations

from typing import Any, Protocol

from ..amqp import spec as amqp_spec
from ..amqp.errors import AMQPError
from .base import Queue
from .classic import ClassicQueue
from .mirroring import Mirroring, stopped_of
from .remote import RemoteClassicQueue
from .types import QueueSpec


class QueueHost(Protocol):
    store: Any    # storage.message_store.MessageStore | None
    quorum: Any   # queues/quorum/groups.py QuorumGroups
    name: str     # this node's name
    classic_link: Any  # remote.ClassicLink: classic queues hosted elsewhere
    mirror_link: Any   # mirroring.MirrorLink: a mirrored classic queue's mirrors
    clock_ms: int      # and the rest of classic.ClassicHost: dead letters, queue expiry


def type_of(name: str) -> type[Queue]:
    """The class implementing queue type `name` (a name validate_declaration accepted)."""
    from .quorum.queue import QuorumQueue

    return {"classic": ClassicQueue, "quorum": QuorumQueue}[name]


def create_recorded(host: QueueHost, vhost: str, name: str, spec: QueueSpec,
                    record: dict, recover: bool = False) -> Queue:
    """A queue from its metadata record (`group`, and `members`/`leader` or `host`,
    `exclusive_owner`); `recover`: a quorum queue's replica reopened over its log."""
    arguments = dict(spec.arguments)
    match spec.type:
        case "quorum":
            members = tuple(record["members"])
            if recover:
                return host.quorum.recover(vhost, name, arguments, record["group"], members)
            return host.quorum.create(vhost, name, arguments, record["group"], members,
                                      campaign=record.get("leader") == host.quorum.member)
        case "classic":
            owner = record.get("exclusive_owner")
            where = record.get("host") or host.name  # records written before hosts: here
            mirrors = record.get("mirrors")
            if where != host.name:
                remote = RemoteClassicQueue(vhost, name, spec.durable, owner, spec.auto_delete,
                                            arguments, record["group"], where,
                                            host.classic_link, host.store)
                remote.record_changed(record)  # a mirror here: its (empty) copy
                return remote
            queue = ClassicQueue(vhost, name, spec.durable, owner, spec.auto_delete, arguments,
                                 max_priority=spec.max_priority,
                                 single_active_consumer=spec.single_active_consumer,
                                 store=host.store, group=record.get("group") or "",
                                 host=where, node=host)
            if mirrors is not None:  # the leader of a mirrored queue (mirroring.py)
                queue.mirrors = tuple(mirrors)
                queue.synced = tuple(record.get("synced") or ())
                queue.stopped = stopped_of(record, queue.mirrors)
                queue.mirroring = Mirroring(queue, host.mirror_link,
                                            host.mirror_link.settings(queue))
                for mirror in queue.mirrors:
                    if record.get("promoted"):  # take_over sets what each one holds
                        queue.mirroring.adopt(mirror, host.mirror_link.boot(mirror))
                    else:  # declared, or its leader restarted: they start empty
                        queue.mirroring.attach(mirror, host.mirror_link.boot(mirror))
            return queue
        case other:  # pragma: no cover - validate_declaration refuses unknown types
            raise AMQPError(amqp_spec.PRECONDITION_FAILED, f"unsupported queue type '{other}'")

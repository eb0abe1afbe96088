"""A classic queue hosted on another node of the cluster: the queue type as a client.

Responsibilities: on every node but a classic queue's host, the queue as the
node's channels and handlers see it (queues/base.py). Every operation goes to the
host through a `ClassicLink` the cluster layer provides. (cluster/classic_link.py:
Rpc messages over the inter-node transport.) This package never imports the
cluster, so the link is a Protocol here. RabbitMQ does the same. A classic queue
lives on its home node, and its record is in the metadata store on every node. A
channel on any node talks to the queue process on the home node.

As a queue type it calls no channel: every operation returns no actions now, and
the link carries out the host's answers when they come (a `GetOk` or `GetEmpty`,
the `Deliver` of each message sent, a `DeclareOk` and a `PurgeOk` to who asked:
queues/actions.py).

How it works: publishes are forwarded with the confirm's answer (`Confirm.hold`).
The host answers once it holds the message: for a persistent message in a durable
queue, after the fsync of its message store. Or it is a nack: the host refused it,
or is unreachable. A consumer here becomes a proxy consumer on the host. That one
sends its deliveries with the bodies. An unacked delivery's token is the host's
entry sequence number. Settling sends those numbers back, by this channel's
identity. Counts (declare-ok, `queues list`, queue.delete's answer) are asked of
the host and cached in `counts`.

Invariants:
- `consumers` are this node's AMQP consumers of the queue only. The host counts
  everyone's.
- Nothing here is stored, except a mirror's copy of a mirrored queue (`replica`).
  That is a durable queue's persistent messages in this node's store, under the
  queue's key. It is dropped when this node stops being a mirror, or the queue goes.
- The host answers for what it holds. So a confirm is never an ack unless the host
  has the message.

Not here: the wire and the host's side (cluster/classic_link.py), the local queue
(classic.py).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from ..amqp import spec
from ..amqp.errors import AMQPError, not_found, precondition
from ..storage.message_store import queue_key
from .actions import Action, DeclareOk, carry_out
from .base import Asker, Channel, Confirm, Consumer, MessageCounts, Queue
from .classic import _without_default_type
from .mirroring import Replica, stopped_of
from .types import EQUIVALENCE_KEYS_BY_TYPE

# sac: the single active consumer's tag (None: none)
NO_COUNTS = {"ready": 0, "unacked": 0, "consumers": 0, "bytes": 0, "sac": None,
             "syncing": None}


class ClassicLink(Protocol):
    """What a remote classic queue asks of the cluster (cluster/classic_link.py)."""

    def reachable(self, host: str) -> bool: ...

    def publish(self, queue: "RemoteClassicQueue", message,
                answer: Callable[[bool], None] | None) -> None: ...

    def consume(self, queue: "RemoteClassicQueue", channel: "Channel",
                consumer: "Consumer") -> None: ...

    def cancel(self, queue: "RemoteClassicQueue", channel: "Channel",
               consumer: "Consumer") -> None: ...

    def get(self, queue: "RemoteClassicQueue", channel: "Channel", no_ack: bool) -> None: ...

    def settle(self, queue: "RemoteClassicQueue", channel: "Channel", seqs: list[int],
               requeue: bool | None) -> None: ...

    def channel_closed(self, queue: "RemoteClassicQueue", channel: "Channel") -> None: ...

    def purge(self, queue: "RemoteClassicQueue", to: "Asker") -> None:
        """Ask the host to purge; the answer, a `PurgeOk` or a `Refused`, goes to
        `to` when it comes."""

    def counts(self, queue: "RemoteClassicQueue", done: Callable[[dict], None],
               use: bool = False) -> None: ...

    def forget(self, queue: "RemoteClassicQueue") -> None: ...

    node_name: str  # this node's name


class RemoteClassicQueue(Queue):
    type_name = "classic"
    EQUIVALENCE_KEYS = EQUIVALENCE_KEYS_BY_TYPE["classic"]
    REPLICATED = False
    POLICY_ON_TICK = False
    served_here = False  # its host serves it

    def __init__(self, vhost: str, name: str, durable: bool, exclusive_owner: str | None,
                 auto_delete: bool, arguments: dict, group: str, host: str,
                 link: ClassicLink, store: Any = None) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner  # the owning connection's identity
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.group = group          # the record's uid (queue.delete names it)
        self.host = host            # the node that holds the queue
        self.link = link
        self.consumers: list = []   # this node's AMQP consumers of the queue
        self.message_counts = MessageCounts()  # this node's (queues/base.py)
        self.exclusive_consumer = None
        self.had_consumers = False
        self.deleted = False
        self.counts = dict(NO_COUNTS)  # the host's, when last asked
        # classic queue mirroring (mirroring.py): the record's ordered mirrors (None:
        # not mirrored), the synchronised ones, and this node's copy if it is a mirror
        self.mirrors: tuple | None = None
        self.synced: tuple = ()
        self.stopped: tuple = ()  # mirrors whose node announced its shutdown, in order
        self.replica: Replica | None = None
        self.store = store  # the node's message store (a durable mirror's copy)

    # ------------------------------------------------------------ counts (the host's)

    @property
    def ready_count(self) -> int:
        return self.counts["ready"]

    @property
    def ready_bytes(self) -> int:
        return self.counts["bytes"]

    @property
    def unacked_count(self) -> int:
        return self.counts["unacked"]

    @property
    def consumer_count(self) -> int:
        return self.counts["consumers"]

    @property
    def message_bytes(self) -> int:
        return self.counts["bytes"]

    @property
    def single_active_consumer_tag(self) -> str | None:
        return self.counts.get("sac")

    def _host_down(self) -> AMQPError:
        """RabbitMQ's answer when a classic queue's home node is not reachable
        (rabbit_amqqueue). A durable queue's record stays; a transient one's is
        gone."""
        if not self.durable:
            return not_found("queue", self.name, self.vhost)
        return AMQPError(spec.NOT_FOUND, f"home node '{self.host}' of durable queue "
                         f"'{self.name}' in vhost '{self.vhost}' is down or inaccessible")

    def check_reachable(self) -> None:
        if not self.link.reachable(self.host):
            raise self._host_down()

    def check_available(self, deleting: bool = False) -> None:
        """queues/base.py: declare, bind, delete... fail while the host is down.
        A mirrored queue may be deleted: the mirroring guide's "Promotion of
        Unsynchronised Mirrors on Failure" has it deleted and redeclared."""
        if not (deleting and self.mirrors):
            self.check_reachable()

    # ------------------------------------------------------------ declaring

    def equivalence_arguments(self, arguments: dict) -> tuple[dict, dict]:
        return _without_default_type(arguments), _without_default_type(self.arguments)

    def check_delete(self, if_unused: bool, if_empty: bool) -> None:
        """With the host's counts (`refresh` first): RabbitMQ's checks."""
        where = f"queue '{self.name}' in vhost '{self.vhost}'"
        if if_unused and (self.consumer_count or self.consumers):
            raise precondition(f"{where} in use")
        if if_empty and self.ready_count:
            raise precondition(f"{where} not empty")

    def refresh(self, done: Callable[[], None]) -> None:
        """Ask the host's counts, then `done()`."""
        self.link.counts(self, lambda _counts: done())

    def declare_ok(self, to: "Asker") -> list[Action]:
        """The host's counts, a `DeclareOk` to `to` carried out once they come; a
        declare renews the queue's x-expires (`use`)."""
        self.link.counts(self, lambda counts: carry_out(
            [DeclareOk(to, counts["ready"], counts["consumers"])]), use=True)
        return []

    # ------------------------------------------------------------ messages

    def publish(self, message, channel: "Channel | None",
                confirm: Confirm | None) -> list[Action]:
        self.link.publish(self, message, None if confirm is None else confirm.hold())
        return []

    def check_consume(self, channel: "Channel", exclusive: bool) -> bool:
        self.check_reachable()
        return exclusive

    def consume(self, channel: "Channel", consumer: "Consumer") -> list[Action]:
        """A proxy consumer on the host; the link carries out its deliveries."""
        self.consumers.append(consumer)
        self.had_consumers = True
        if consumer.exclusive:
            self.exclusive_consumer = consumer
        self.link.consume(self, channel, consumer)
        return []

    def remove_consumer(self, consumer: "Consumer") -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if self.exclusive_consumer is consumer:
            self.exclusive_consumer = None

    def cancel(self, channel: "Channel", consumer: "Consumer") -> list[Action]:
        self.remove_consumer(consumer)
        if not self.deleted:
            self.link.cancel(self, channel, consumer)
        return []  # the host hands the others what this one no longer takes

    def is_unused_for_auto_delete(self) -> bool:
        return False  # the host decides: it sees every node's consumers

    def basic_get(self, channel: "Channel", no_ack: bool) -> list[Action]:
        """Asked of the host; the link carries out its `GetOk` or `GetEmpty`."""
        self.check_reachable()
        self.link.get(self, channel, no_ack)
        return []

    def settle(self, channel: "Channel", tokens: list, requeue: bool | None) -> list[Action]:
        if not self.deleted:
            self.link.settle(self, channel, list(tokens), requeue)
        return []

    def channel_closed(self, channel: "Channel", tokens: list) -> list[Action]:
        if not self.deleted:
            self.link.channel_closed(self, channel)
        return []

    def purge(self, to: "Asker") -> list[Action]:
        """Asked of the host; the link carries out its `PurgeOk` to `to`, or a
        `Refused` if the host could not be asked (unreachable meanwhile)."""
        self.check_reachable()
        self.link.purge(self, to)
        return []

    def delete(self) -> None:
        self.deleted = True
        self.link.forget(self)
        if self.replica is not None:
            self.replica.discard()

    def replaced(self) -> None:
        """Rebuilt from a changed record: the copy stays for the successor."""
        self.deleted = True
        self.link.forget(self)

    def recover_stored(self, items) -> int:
        """A mirror's copy after its node restarted (mirroring.Replica.recover).
        Not a mirror here (any more): 0, and the store forgets them."""
        return self.replica.recover(items) if self.replica is not None else 0

    # ------------------------------------------------------------ listing

    def stats_later(self, node_name: str, done: Callable[[dict[str, Any]], None]) -> None:
        self.link.counts(self, lambda _counts: done(self.stats(node_name)))

    @property
    def sync_progress(self) -> int | None:
        return self.counts.get("syncing")

    def stats(self, node_name: str) -> dict[str, Any]:
        row = super().stats(node_name)
        row.update(leader=self.host, members=[self.host, *(self.mirrors or ())])
        return row

    def metadata_record(self) -> dict[str, Any]:
        record = {"group": self.group, "host": self.host,
                  "exclusive_owner": self.exclusive_owner}
        if self.mirrors is not None:
            record.update(mirrors=list(self.mirrors), synced=list(self.synced))
            if self.stopped:
                record["stopped"] = list(self.stopped)
        return record

    def take_over(self, previous: Queue) -> None:
        """Another leader now (a promotion): a mirror here keeps its copy."""
        replica = getattr(previous, "replica", None)
        if self.replica is not None and replica is not None:
            self.replica = replica
        elif replica is not None:  # no longer a mirror here
            replica.discard()

    def record_changed(self, record: dict) -> bool:
        """A new record. With the same leader, the mirrors change in place. (A copy
        is kept here while this node is one, starting empty.) Another leader: False."""
        if record.get("host") != self.host:
            return False
        mirrors = record.get("mirrors")
        self.mirrors = None if mirrors is None else tuple(mirrors)
        self.synced = tuple(record.get("synced") or ())
        self.stopped = stopped_of(record, self.mirrors)
        mirror_here = self.mirrors is not None and self.link.node_name in self.mirrors
        if not mirror_here:
            if self.replica is not None:
                self.replica.discard()
            self.replica = None
        elif self.replica is None:
            self.replica = Replica(self.store, queue_key(self.vhost, self.name),
                                   self.durable)
        return True

"""Classic queue mirroring (RabbitMQ 3.13's, behind its deprecated-feature switch):
the policy keys, where mirrors go, and both replicas' state. Pure, no I/O.

Responsibilities:
- `validate_ha(definition)`: the ha-* keys of a policy, checked as RabbitMQ 3.13's
  rabbit_mirror_queue_misc:validate_policy checks them (its messages);
- `ha_settings(policy)`: a policy's mirroring settings, None for a queue the policy
  does not mirror (then the queue is a plain classic queue: no mirroring machinery,
  as the guide's "Queue Arguments that Control Mirroring" distinguishes);
- `desired_mirrors`: the ordered mirror list a policy asks for, keeping existing
  mirrors first ("it will endeavour to keep its existing mirrors as far as this fits
  with the new policy"), new ones appended, so the list is the join order ("the
  oldest mirror" = the first);
- `promotion_candidate`: which mirror takes over when the leader's node failed
  (the guide's "Mirrored Queue Implementation and Semantics", 1, and "Promotion of
  Unsynchronised Mirrors on Failure");
- `Mirroring`: the leader's side, attached to the leader's ClassicQueue: every change
  of the queue's contents is sent to every mirror in order (publish with the message,
  first delivery, removal), a publisher confirm holds until every current mirror
  acknowledged the message; a mirror added later starts empty and unsynchronised
  (`first_seq`: the first message it has) and is synchronised once no message older
  than that is left, or once a synchronisation (`sync`, in the background) sent it
  the older messages;
- `Replica`: a mirror's copy of the contents (sequence -> message, delivered flag),
  for a durable queue's persistent messages also in the mirror node's message store
  (the classic queue's records under the queue's key: the copy survives the node's
  restart, `recover`), which becomes the leader's queue on promotion (`promote`,
  ClassicQueue.take_over): every message comes back ready, a delivered one marked
  redelivered (the guide: unacknowledged messages are requeued with the redelivered
  flag);
- `forget_leader`: which mirror leads when the leader's node is forgotten (the
  guide's "Loss of a Leader While All Mirrors are Stopped");
- `leader_record_changed` (ClassicQueue.record_changed): the leader's side of a new
  record, mirrors attached or detached.

How it works: the replication operations go through a `MirrorLink` (the cluster
layer's cluster/mirror_link.py: Rpc messages over the ordered inter-node transport),
as lists: ["p", seq, exchange, routing key, header, body, expires, publish id, ack
request] (the publish id: a publish forwarded from another node, re-sent to a new
leader after a failover, is recognised and confirmed, not enqueued twice; a message
with BCC keys has them, a list, before the ack request, and as an eighth item of
a synchronisation batch's message: its dead-lettered copy is routed by them),
["v", [seq...]] first deliveries, ["d", [seq...]] removals, ["x"] start empty,
["s", [[seq, exchange, key, header, body, expires, delivered]...], ack request]
a synchronisation batch (up to ha-sync-batch-size messages the mirror lacks; the
leader sends the next one once every mirror acknowledged it: `sync` runs in the
background, `cancel_sync` stops it between two batches, and the queue delivers to
no consumer and answers no basic.get meanwhile), ["k", [seq...]] keep only
these (a new leader's contents, sent to the other mirrors after a promotion).

Invariants: `live` holds every message of the queue (ready or unacked) in sequence
order (except one delivered and unacked when the queue became mirrored: the leader
does not track its consumers' deliveries, so it is not in `live`, and if requeued
no mirror gets it until its node's mirror is reset); a mirror whose `first_seq` is at
or below the lowest live sequence holds every message the leader holds (it is
synchronised); a Replica's `stored` are exactly the live messages its node's store
holds for the queue, and a publish or sync batch it stored is acknowledged only once
that batch is on disk (`apply` returns the batch); a confirm's hold for a mirror is
answered exactly once (acknowledged, or the mirror left: the remaining mirrors hold
the message, as RabbitMQ confirms).

Not here: the transport and the failure detection (cluster/mirror_link.py), the
record in the metadata (node/metadata.py `queue.record`), the queue (classic.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

HA_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size",
           "ha-promote-on-shutdown", "ha-promote-on-failure")
MODES = ("all", "exactly", "nodes")
# RabbitMQ's mirroring_sync_batch_size default (the configuration's key: config.py)
DEFAULT_SYNC_BATCH_SIZE = 4096


def _term(value: Any) -> str:
    """How RabbitMQ's ~tp shows a JSON value."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, list):
        return "[" + ",".join(_term(v) for v in value) + "]"
    return "none" if value is None else json.dumps(value)


def validate_ha(definition: dict) -> str | None:
    """RabbitMQ 3.13's validation of the ha-* keys (None: valid)."""
    mode = definition.get("ha-mode")
    given = [k for k in HA_KEYS if k in definition]
    if not given:
        return None
    if mode is None:
        return ("ha-mode must be specified to specify ha-params, ha-sync-mode or "
                "ha-promote-on-shutdown")
    if mode not in MODES:
        return f"{_term(mode)} is not a valid ha-mode value"
    params = definition.get("ha-params")
    if mode == "all" and "ha-params" in definition:
        return 'ha-mode="all" does not take parameters'
    if mode == "exactly" and (isinstance(params, bool) or not isinstance(params, int)
                              or params <= 0):
        return f'ha-mode="exactly" takes an integer, {_term(params)} given'
    if mode == "nodes":
        if params == []:
            return 'ha-mode="nodes" list must be non-empty'
        if not isinstance(params, list):
            return f'ha-mode="nodes" takes a list, {_term(params)} given'
        invalid = [p for p in params if not isinstance(p, str)]
        if invalid:
            return f'ha-mode="nodes" takes a list of strings, {_term(invalid)} given'
    sync = definition.get("ha-sync-mode", "manual")
    if sync not in ("manual", "automatic"):
        return f'ha-sync-mode must be "manual" or "automatic", got {_term(sync)}'
    batch = definition.get("ha-sync-batch-size", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        return f"ha-sync-batch-size takes an integer greater than 0, {_term(batch)} given"
    for key in ("ha-promote-on-shutdown", "ha-promote-on-failure"):
        value = definition.get(key, "always")
        if value not in ("always", "when-synced"):
            return f'{key} must be "always" or "when-synced", got {_term(value)}'
    return None


@dataclass(frozen=True, slots=True)
class HaSettings:
    mode: str                       # all | exactly | nodes
    params: Any                     # exactly: the replica count; nodes: node names
    sync_mode: str = "manual"       # the guide's default
    sync_batch_size: int | None = None  # None: the configured mirroring_sync_batch_size
    promote_on_failure: str = "always"       # the guide's defaults
    promote_on_shutdown: str = "when-synced"


def ha_settings(policy) -> HaSettings | None:
    """The mirroring a (valid) policy asks for; None: not mirrored."""
    definition = getattr(policy, "definition", None) or {}
    mode = definition.get("ha-mode")
    if mode is None:
        return None
    return HaSettings(mode, definition.get("ha-params"),
                      definition.get("ha-sync-mode", "manual"),
                      definition.get("ha-sync-batch-size"),
                      definition.get("ha-promote-on-failure", "always"),
                      definition.get("ha-promote-on-shutdown", "when-synced"))


def desired_mirrors(settings: HaSettings, leader: str, nodes: Iterable[str],
                    down: Iterable[str], current: Iterable[str]) -> tuple[str, ...]:
    """The mirrors (leader excluded) `settings` asks for among the cluster's `nodes`
    that are not `down`, existing ones first in their order, new ones after (sorted:
    every node computes the same). `nodes` mode ignores names not in the cluster (the
    guide: "this does not constitute an error"); a leader it does not list stays
    until a mirror is synchronised (leader_must_move)."""
    down = set(down)
    live = [n for n in sorted(nodes) if n not in down and n != leader]
    kept = [n for n in current if n in live]
    if settings.mode == "all":
        wanted = live
    elif settings.mode == "exactly":
        count = max(0, settings.params - 1)
        wanted = kept[:count] + [n for n in live if n not in kept][:max(0, count - len(kept))]
    else:
        listed = set(settings.params)
        wanted = [n for n in live if n in listed]
    return tuple([n for n in kept if n in wanted] + [n for n in wanted if n not in kept])


def leader_must_move(settings: HaSettings | None, leader: str, nodes: Iterable[str]) -> bool:
    """A `nodes` policy that does not list the leader (but lists a cluster node): the
    guide's "'nodes' Policy and Migrating Leaders"."""
    return (settings is not None and settings.mode == "nodes"
            and leader not in settings.params and any(n in settings.params for n in nodes))


def promotion_candidate(mirrors: Iterable[str], synced: Iterable[str], down: Iterable[str],
                        promote_on_failure: str) -> str | None:
    """The mirror promoted when the leader's node failed: the oldest one running that
    is synchronised, or under ha-promote-on-failure "always" (the default) the oldest
    one running if none is (whatever only the leader held is lost, as the guide says);
    None: the queue waits for its leader."""
    down, synced = set(down), set(synced)
    running = [m for m in mirrors if m not in down]
    for mirror in running:
        if mirror in synced:
            return mirror
    if promote_on_failure == "always" and running:
        return running[0]
    return None


class MirrorLink(Protocol):
    """What the leader's side asks of the cluster (cluster/mirror_link.py)."""

    def send(self, node: str, queue: Any, op: list) -> None: ...

    def ask(self, node: str, queue: Any, op: list,
            answer: Callable[[bool], None]) -> None:
        """Send `op` with an acknowledgement request (its last element is set);
        `answer(True)` once the mirror acknowledged it or left."""

    def release(self, node: str, queue: Any) -> None:
        """`node` is no longer a mirror of `queue`: answer what waits for it."""

    def boot(self, node: str) -> str | None:
        """The run of `node` last heard of (a mirror attached in an earlier run of its
        node holds nothing any more)."""

    def settings(self, queue: Any) -> HaSettings | None:
        """The mirroring settings of `queue`'s policy now."""

    def carry_out(self, actions: list) -> None:
        """Do what the queue returned when a synchronisation ended (the gets it held,
        the deliveries it held back: queues/actions.py's `carry_out`)."""

    @property
    def sync_batch_size(self) -> int:
        """The configuration's mirroring_sync_batch_size: the batch size of a queue
        whose policy sets no ha-sync-batch-size (the guide's "Batch
        Synchronization")."""


class _Mirror:
    __slots__ = ("node", "first_seq", "boot", "reset")

    def __init__(self, node: str, first_seq: int, boot: str | None,
                 reset: bool = True) -> None:
        self.node = node
        self.first_seq = first_seq  # the first message this mirror received
        self.boot = boot            # the mirror node's run it was attached in
        self.reset = reset          # this leader reset its copy ("x"); False: adopted


class _Sync:
    """A synchronisation in progress (Mirroring.sync)."""
    __slots__ = ("targets", "seqs", "position", "waiting", "sent")

    def __init__(self, targets: dict[str, int], seqs: list[int]) -> None:
        self.targets = targets  # mirror -> its first_seq at the start: it lacks the older
        self.seqs = seqs        # the messages it may lack, oldest first
        self.position = 0       # seqs[:position] are sent
        self.waiting = 0        # acknowledgements of the last batch still due
        self.sent = 0           # messages sent: the progress ({syncing, N} in RabbitMQ)


class Mirroring:
    """The leader's side (see the module header)."""

    def __init__(self, queue, link: MirrorLink, settings: HaSettings | None) -> None:
        self.queue = queue
        self.link = link
        self.settings = settings
        self.mirrors: dict[str, _Mirror] = {}
        self.live: dict[int, Any] = {}  # seq -> Entry, every message the queue holds
        # ids of forwarded publishes taken (the last SEEN_IDS), and the id of the one
        # being published now (set by the cluster's link around queue.publish)
        self.seen: dict[str, None] = {}
        self.publish_id: str | None = None
        self.syncing: _Sync | None = None  # the synchronisation in progress
        self.sync_again = False  # a mirror attached during it: another one follows

    # ------------------------------------------------------------ membership

    def attach(self, node: str, boot: str | None) -> None:
        """A new mirror (or one whose node restarted): it starts empty."""
        self.mirrors[node] = _Mirror(node, self.queue.next_seq, boot)
        self.link.send(node, self.queue, ["x"])
        if self.settings is not None and self.settings.sync_mode == "automatic":
            self.sync(node)

    def adopt(self, node: str, boot: str | None) -> None:
        """A mirror kept across a promotion (take_over sets what it holds)."""
        self.mirrors[node] = _Mirror(node, self.queue.next_seq, boot, reset=False)

    def detach(self, node: str) -> None:
        """A mirror left: the confirms waiting for it wait for the others only."""
        if self.mirrors.pop(node, None) is not None:
            self.link.release(node, self.queue)

    def stop(self) -> None:
        """The queue is deleted (or no longer led here): nothing waits for its mirrors
        (a synchronisation in progress ends: what it held back is served)."""
        if self.syncing is not None:
            self.syncing = None
            self.link.carry_out(self.queue.sync_ended())
        for node in list(self.mirrors):
            self.detach(node)

    def synchronised(self) -> list[str]:
        lowest = next(iter(self.live), None)
        return [m.node for m in self.mirrors.values()
                if lowest is None or m.first_seq <= lowest]

    def sync(self, node: str | None = None) -> int:
        """Start synchronising one mirror (or every unsynchronised one) in the
        background (the guide's "Batch Synchronization"): batches of
        ha-sync-batch-size messages, the next one sent once every target acknowledged
        the last, holding only what each target lacks (the messages older than its
        first one); a target is synchronised once the last batch is acknowledged.
        While it runs, the queue hands no message to consumers and holds basic.gets
        ("while a queue is being synchronised, all other queue operations will be
        blocked"; ClassicQueue.sync_ended serves them). Returns how
        many mirrors are being synchronised (0: none needed it); a sync already
        running goes on, and another follows it for the mirrors it did not cover."""
        if self.syncing is not None:
            self.sync_again = True
            return len(self.syncing.targets)
        synced = set(self.synchronised())
        targets = {m.node: m.first_seq for m in self.mirrors.values()
                   if (m.node == node if node is not None else m.node not in synced)}
        if not targets:
            return 0
        oldest_missing = max(targets.values())
        run = _Sync(targets, [seq for seq in self.live if seq < oldest_missing])
        self.syncing = run
        self._send_batch(run)
        return len(targets)

    def cancel_sync(self) -> bool:
        """`cancel_sync_queue`: stop the synchronisation in progress; its targets stay
        unsynchronised, holding what they got. False: none was running."""
        run = self.syncing
        if run is None:
            return False
        self.syncing = None
        self.sync_again = False
        self.link.carry_out(self.queue.sync_ended())
        return True

    @property
    def batch_size(self) -> int:
        size = self.settings.sync_batch_size if self.settings else None
        return size or self.link.sync_batch_size

    def _send_batch(self, run: "_Sync") -> None:
        size = self.batch_size
        while run.position < len(run.seqs):
            chunk = run.seqs[run.position:run.position + size]
            run.position += len(chunk)
            entries = [self.live[seq] for seq in chunk if seq in self.live]  # not removed since
            sent = 0
            for target, first_seq in run.targets.items():
                items = [[e.seq, e.message.exchange, e.message.routing_key,
                          e.message.properties.raw, e.message.body, e.expires, e.redelivered,
                          *_bcc(e.message)]
                         for e in entries if e.seq < first_seq]
                if items and target in self.mirrors:
                    run.waiting += 1
                    sent = max(sent, len(items))
                    self.link.ask(target, self.queue, ["s", items, 0],
                                  lambda _ok, run=run: self._batch_acknowledged(run))
            run.sent += sent
            if run.waiting:
                return
        self._finish(run)

    def _batch_acknowledged(self, run: "_Sync") -> None:
        if run is not self.syncing:
            return  # cancelled (or another run): late acknowledgements
        run.waiting -= 1
        if run.waiting == 0:
            self._send_batch(run)

    def _finish(self, run: "_Sync") -> None:
        for node, first_seq in run.targets.items():
            mirror = self.mirrors.get(node)
            if mirror is not None and mirror.first_seq == first_seq:  # not reset since
                mirror.first_seq = 0
        self.syncing = None
        self.link.carry_out(self.queue.sync_ended())
        if self.sync_again:
            self.sync_again = False
            self.sync()

    # ------------------------------------------------------------ contents

    def published(self, entry, hold: Callable[[], Callable[[bool], None]] | None) -> None:
        self.live[entry.seq] = entry
        message = entry.message
        publish_id = self.publish_id
        if publish_id is not None:
            remember(self.seen, publish_id)
        for node in self.mirrors:
            op = ["p", entry.seq, message.exchange, message.routing_key,
                  message.properties.raw, message.body, entry.expires, publish_id,
                  *_bcc(message), 0]
            if hold is None:
                self.link.send(node, self.queue, op)
            else:
                self.link.ask(node, self.queue, op, hold())

    def recovered(self, entry) -> None:
        """A message the leader recovered (its store after a restart): no mirror has
        it (they were reset when the leader started)."""
        self.live[entry.seq] = entry
        for mirror in self.mirrors.values():
            mirror.first_seq = max(mirror.first_seq, entry.seq + 1)

    def delivered(self, entry) -> None:
        for node in self.mirrors:
            self.link.send(node, self.queue, ["v", [entry.seq]])

    def removed(self, entry) -> None:
        if self.live.pop(entry.seq, None) is None:
            return
        for node in self.mirrors:
            self.link.send(node, self.queue, ["d", [entry.seq]])

    def keep_only(self) -> None:
        """After a promotion: the other mirrors drop what this leader does not hold."""
        for node in self.mirrors:
            self.link.send(node, self.queue, ["k", list(self.live)])


SEEN_IDS = 65536  # forwarded publishes remembered per queue (re-sent after a failover)


def _bcc(message) -> list:
    """What a replication operation carries of a message's BCC keys: nothing for a
    message without any, else [the keys]."""
    keys = message.properties.blind_keys
    return [list(keys)] if keys else []


def remember(seen: dict, publish_id: str) -> None:
    seen[publish_id] = None
    if len(seen) > SEEN_IDS:
        del seen[next(iter(seen))]


class Replica:
    """A mirror's copy of the queue (see the module header). For a durable queue the
    persistent messages are also written to the mirror node's message store, under
    the queue's own key (the same records the queue writes as a leader: so the copy
    survives its node's restart, and a promoted mirror's store already holds them).
    `apply` returns the store batch a publish's acknowledgement must wait for."""

    def __init__(self, store: Any = None, key: bytes = b"", durable: bool = False) -> None:
        # seq -> [exchange, routing key, header, body, expires, delivered, BCC keys]
        self.entries: dict[int, list] = {}
        self.seen: dict[str, None] = {}  # forwarded publishes' ids (Mirroring.seen)
        # the leader reset it ("x") in this run of the node: a copy made (or recovered
        # from the store) before a restart of the mirror's node may lack what its
        # leader received since, so it is not promoted on its own (mirror_link.py)
        self.complete = False
        self.store = store if durable else None  # None: the copy is in memory only
        self.key = key
        self.stored: set[int] = set()  # seqs whose ENQUEUE is in the store (live)

    def _store(self, seq: int, item: list) -> int:
        """The message (exchange, key, header, body, expires, delivered, BCC keys) into
        the store if it is persistent; returns the batch holding it (0: not stored)."""
        from ..amqp.codec import decode_properties

        if self.store is None or seq in self.stored:
            return 0
        exchange, key, header, body, expires, delivered, blind_keys = item
        if decode_properties(header)[1].delivery_mode != 2:
            return 0
        batch = self.store.append_enqueue(self.key, seq, exchange, key, header, body,
                                          expires, blind_keys)
        self.stored.add(seq)
        if delivered:
            self.store.append_delivered(self.key, seq)
        return batch

    def _unstore(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            if seq in self.stored:
                self.stored.discard(seq)
                self.store.append_ack(self.key, seq)

    def apply(self, op: list) -> int:
        """One replication operation; returns the message-store batch that must be
        on disk before a publish is acknowledged (0: none)."""
        batch = 0
        match op[0]:
            case "p":
                _kind, seq, exchange, key, header, body, expires, publish_id, *bcc, _ask = op
                item = self.entries[seq] = [exchange, key, header, body, expires, False,
                                            tuple(bcc[0]) if bcc else ()]
                batch = self._store(seq, item)
                if publish_id is not None:
                    remember(self.seen, publish_id)
            case "v":
                for seq in op[1]:
                    item = self.entries.get(seq)
                    if item is not None:
                        item[5] = True
                        if seq in self.stored:
                            self.store.append_delivered(self.key, seq)
            case "d":
                for seq in op[1]:
                    self.entries.pop(seq, None)
                self._unstore(op[1])
            case "x":
                self.entries.clear()
                self.discard()
                self.complete = True
            case "s":
                for seq, exchange, key, header, body, expires, delivered, *bcc in op[1]:
                    item = self.entries[seq] = [exchange, key, header, body, expires,
                                                delivered, tuple(bcc[0]) if bcc else ()]
                    batch = max(batch, self._store(seq, item))
                # (older than what the mirror held: promote() takes them in seq order)
            case "k":
                keep = set(op[1])
                self._unstore([s for s in self.entries if s not in keep])
                self.entries = {s: e for s, e in self.entries.items() if s in keep}
            case other:
                raise ValueError(f"unknown mirror operation {other!r}")
        return batch

    def recover(self, items) -> int:
        """The store's records of this queue after the node restarted (storage/
        message_store.py RecoveredMessage, in order): the copy as it was on disk,
        not `complete` (the leader may have received more since)."""
        for item in items:
            self.entries[item.seq] = [item.exchange, item.routing_key, item.header,
                                      item.body, item.expires, item.delivered,
                                      item.blind_keys]
            self.stored.add(item.seq)
        self.entries = dict(sorted(self.entries.items()))
        return len(items)

    def discard(self) -> None:
        """This node holds no copy any more (reset, no longer a mirror): the store
        forgets the queue's records."""
        if self.stored:
            self.store.append_delete(self.key)
            self.stored.clear()

    def __len__(self) -> int:
        return len(self.entries)


def stopped_of(record: dict, mirrors) -> tuple:
    """The record's mirrors whose nodes announced a controlled shutdown, in the order
    they did (oldest first): its "stopped" list, kept to the mirrors it still has (a
    mirror that left the record and joined again is a new one)."""
    return tuple(m for m in record.get("stopped") or () if m in (mirrors or ()))


def forget_leader(record: dict, forgotten: str,
                  promote_on_failure: str = "always") -> dict | None:
    """`forget_cluster_node` of a mirrored queue's leader's node (the guide's "Loss of
    a Leader While All Mirrors are Stopped"): the record with a mirror as leader, or
    None (not led there, or no mirror it may promote). The mirrors in the record are
    the ones that were running with the leader when it was lost (one that stopped or
    restarted earlier left the record once the leader noticed, before a confirm went
    out without it). "If there is more than one candidate, the most recently stopped
    mirror will be chosen": the record's "stopped" list orders the mirrors whose
    nodes announced a controlled shutdown while the leader ran (MirrorLink
    `cm.stopping`); one not in it stopped later than all of those (or without
    announcing it, or runs still), so the candidates rank: not in the list (in
    join order), then the list from its end. The chosen one is the first
    synchronised candidate in that rank, else, under ha-promote-on-failure "always"
    (the guide's "Promotion of Unsynchronised Mirrors on Failure": a leader "removed
    from the cluster" too), the first candidate. It leads with its copy (in its
    store, when it is stopped now: it leads once it starts); the others rejoin it
    empty, as any mirror joining a leader."""
    mirrors = [m for m in record.get("mirrors") or () if m != forgotten]
    if record.get("host") != forgotten or not mirrors:
        return None
    stopped = stopped_of(record, mirrors)
    ranked = [m for m in mirrors if m not in stopped] + list(reversed(stopped))
    synced = set(record.get("synced") or ())
    chosen = next((m for m in ranked if m in synced),
                  ranked[0] if promote_on_failure == "always" else None)
    if chosen is None:
        return None
    return {"host": chosen, "mirrors": [], "synced": []}


# ---------------------------------------------------------------- the leader's queue


def leader_record_changed(queue, record: dict) -> bool:
    """ClassicQueue.record_changed: still the leader here, the mirrors are attached
    (starting empty) or detached in place; another leader: False (the node rebuilds
    the queue from the record)."""
    if record.get("host") != queue.host:
        return False
    mirrors = record.get("mirrors")
    queue.mirrors = None if mirrors is None else tuple(mirrors)
    queue.synced = tuple(record.get("synced") or ())
    queue.stopped = stopped_of(record, queue.mirrors)
    if queue.mirrors is None:
        if queue.mirroring is not None:
            queue.mirroring.stop()
        queue.mirroring = None
        return True
    if queue.mirroring is None:
        # the policy's settings from the start: ha-sync-mode automatic and the batch
        # size apply to the mirrors attached just below
        link = queue.node.mirror_link
        queue.mirroring = Mirroring(queue, link, link.settings(queue))
        # a queue that becomes mirrored: what it holds already is what a mirror
        # attached now lacks (so it is unsynchronised, and sync_queue sends it)
        for entry in sorted(queue.ready_entries(), key=lambda e: e.seq):
            queue.mirroring.live[entry.seq] = entry
    for gone in [m for m in queue.mirroring.mirrors if m not in queue.mirrors]:
        queue.mirroring.detach(gone)
    for added in [m for m in queue.mirrors if m not in queue.mirroring.mirrors]:
        queue.mirroring.attach(added, queue.node.mirror_link.boot(added))
    return True


def promote(queue, previous) -> None:
    """ClassicQueue.take_over: promoted from mirror to leader (the guide's "Mirrored
    Queue Implementation and Semantics"), the mirror's copy (`previous.replica`)
    becomes the queue, every message ready again in its order, a delivered one marked
    redelivered (a durable queue's store gets the persistent ones); the other mirrors
    keep only what this leader holds."""
    from ..amqp.codec import decode_properties
    from ..storage.message_store import queue_key
    from .classic import Entry
    from .message import Message

    replica = getattr(previous, "replica", None)
    key_of_queue = queue_key(queue.vhost, queue.name)
    for seq, (exchange, key, header, body, expires, delivered, blind_keys) in (
            sorted(replica.entries.items()) if replica is not None else ()):
        _class_id, properties = decode_properties(header)
        properties.blind_keys = blind_keys
        message = Message(exchange, key, properties, body)
        stored = queue.durable and message.persistent and queue.store is not None
        entry = Entry(message, seq, stored, redelivered=delivered, expires=expires)
        if stored and seq not in replica.stored:  # (a mirror's store holds its copy)
            queue.store.append_enqueue(key_of_queue, seq, exchange, key, header, body,
                                       expires, blind_keys)
            if delivered:
                queue.store.append_delivered(key_of_queue, seq)
        queue.next_seq = max(queue.next_seq, seq + 1)
        queue.expiring = queue.expiring or bool(expires)
        queue.push(entry)
        if queue.mirroring is not None:
            queue.mirroring.recovered(entry)
    if queue.mirroring is not None:
        if replica is not None:
            queue.mirroring.seen = dict(replica.seen)
        for mirror in queue.mirroring.mirrors.values():
            mirror.first_seq = 0 if mirror.node in queue.synced else queue.next_seq
        queue.mirroring.keep_only()

"""Classic queue mirroring across the cluster: replication to mirrors, placement
following the policy, and promotion when a leader's node fails.

Responsibilities (RabbitMQ 3.13's mirrored classic queues, its "Classic Queue
Mirroring" guide; behind `deprecated_features.permit.classic_queue_mirroring`):
- the transport of queues/mirroring.py's operations: the leader's node sends them
  to each mirror's node in order ("cm.op" {q, v, n, o: op}); a mirror's node applies
  them to its copy (the RemoteClassicQueue's `replica`; a durable queue's persistent
  messages also go to this node's message store) and acknowledges a publish that
  asked for it ("cm.ack" {r}) once the store's batch holding it is fsynced (at once
  for a message not stored), which answers the publisher confirm's hold for that
  mirror, and likewise the last batch of a synchronisation (its acknowledgement
  marks the mirror synchronised); a copy its leader has not reset ("x") in this
  node's run takes no operation and the leader is told ("cm.stale" {q, v, n, boot});
- placement (on the leader's node, every tick and so after every policy change): the
  mirrors the policy asks for (mirroring.desired_mirrors, among the nodes not silent
  for cluster.NODE_DOWN_AFTER) and the synchronised ones are compared with the
  record, and a `queue.record` metadata command proposed when they differ (a mirror
  added starts empty, one removed drops its copy); a mirror whose node restarted
  (a new run heard of, or "cm.stale") leaves the record first and rejoins as a new
  mirror, so the record never calls synchronised a mirror whose copy was reset or
  lacks a confirmed message; exclusive queues are never mirrored; a `nodes` policy that does
  not list the leader moves it to a listed mirror once one is synchronised;
- promotion (on each mirror's node, every tick): when the leader's node is silent,
  the mirror mirroring.promotion_candidate names (the oldest synchronised one, or the
  oldest running one under ha-promote-on-failure "always"; after a controlled
  shutdown of the leader's node, announced by "cm.stopping" {boot},
  ha-promote-on-shutdown, default "when-synced", decides) proposes itself as
  leader (`queue.record` with `expect_host`: only the first proposal applies); every
  node then rebuilds the queue (node/metadata.py record_changed): the new leader's queue
  is its copy with every message ready, delivered ones redelivered. A mirror whose
  node restarted since its leader last reset its copy ("x") does not propose itself:
  its copy (recovered from its store) may lack what the leader received after it
  stopped; it tells the other nodes ("cm.incomplete" {q, boot}, every tick while
  the leader is down), which pass it over, so a mirror that kept its copy is
  promoted rather than the queue waiting for this one; `forget_cluster_node` of the leader's node promotes it instead
  (node/metadata.py, queues/mirroring.py forget_leader), the most recently stopped
  candidate: the leader appends each mirror whose node announces its shutdown
  ("cm.stopping") to the record's "stopped" list;

- synchronisation (`ctl sync_queue`, `cancel_sync_queue`): asked of the leader's
  node ("cm.sync"), which starts or stops its background sync
  (queues/mirroring.py Mirroring.sync); a mirror acknowledges each batch ("cm.ack"),
  which lets the leader send the next; a sync with no batch acknowledged for
  SYNC_STALL seconds is cancelled (its consumers are held while it runs);

- publishes across a failover: a confirmed publish forwarded to a mirrored queue's
  leader that cannot answer (classic_link.py) is `park`ed here until the record names
  another leader, then sent there with its id (queues/mirroring.py `seen`).

How it works: operations to a mirror whose queue record this node has not applied
yet wait (up to EARLY_FOR seconds) in order. Proposals are repeated at most every
PROPOSE_EVERY seconds until the record shows them.

Invariants: a confirm's hold for a mirror is answered once: by its "cm.ack" (sent
only after the mirror's fsync of a stored message, by a copy reset in its node's
current run), or when the mirror leaves the committed record (`release`); a mirror
holds every message published since it was attached, in the leader's order (the
transport per peer is ordered); so a mirror the record calls synchronised holds
every confirmed message (in its store, for a durable queue's persistent ones).

Not here: the replicas' state and the policy's rules (queues/mirroring.py), what a
record change does to a node (node/metadata.py record_changed).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Callable

from ..queues.actions import carry_out
from ..queues.classic import ClassicQueue
from ..queues.mirroring import (desired_mirrors, ha_settings, leader_must_move,
                                promotion_candidate)
from ..queues.remote import RemoteClassicQueue
from ..groups.metadata import encode
from .wire import Rpc

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Cluster

log = logging.getLogger("quorumqueue.cluster")

EARLY_FOR = 5.0       # seconds an operation waits for its queue's record to arrive
PROPOSE_EVERY = 3.0   # seconds between two proposals of the same record
PARK_FOR = 60.0       # seconds a forwarded publish waits for a promotion (then nacked)
SYNC_TIMEOUT = 30.0   # seconds a sync_queue waits for the leader's answer
SYNC_STALL = 60.0     # seconds without a batch acknowledged before a sync is cancelled


class MirrorLink:
    def __init__(self, cluster: "Cluster") -> None:
        self.cluster = cluster
        self.pending: dict[int, tuple[str, str, Callable[[bool], None]]] = {}
        self.early: dict[str, deque[tuple[float, str, dict]]] = {}
        self.proposed: dict[str, tuple[str, float]] = {}  # uid -> (record, when)
        # forwarded publishes whose leader failed before answering, waiting for the
        # promoted mirror: (vhost, name, group, old leader, message, answer, id, deadline)
        self.parked: list[tuple] = []
        # sync_queue asked of another node: request -> (leader, deadline, done)
        self.syncs: dict[int, tuple[str, float, Callable[[int | None], None]]] = {}
        self.waiting: set[tuple] = set()  # (uid, [why,] leader's run) logged
        # node -> the run of it that announced a controlled shutdown ("cm.stopping")
        self.stopped: dict[str, str] = {}
        # queue uid -> (its sync run, messages sent, since when): stalls (_watch_sync)
        self.sync_progress: dict[str, tuple] = {}
        # leader's side: queue uid -> its mirrors known to have restarted since they
        # were attached (they leave the record first: _restarted)
        self.stale: dict[str, set[str]] = {}
        # mirror's side: queue uid -> when this node last reported its copy stale
        self.reported: dict[str, float] = {}
        # queue uid whose leader is down -> {mirror: its run} for the mirrors that
        # said their copy dates from before their node restarted ("cm.incomplete"):
        # never promoted, so the next one in the record may be (_promote)
        self.incomplete: dict[str, dict[str, str]] = {}

    @property
    def node(self):
        return self.cluster.node

    # ================================================= the leader's side

    def _post(self, node: str, queue, op: list) -> None:
        # in order, also while the node starts (the outbox holds it: outbox.py)
        self.cluster._post(node, Rpc("cm.op", {"q": queue.group, "v": queue.vhost,
                                               "n": queue.name, "o": op}))

    def send(self, node: str, queue, op: list) -> None:
        self._post(node, queue, op)

    def carry_out(self, actions: list) -> None:
        """What the queue returned when its synchronisation ended."""
        carry_out(actions)

    def ask(self, node: str, queue, op: list, answer: Callable[[bool], None]) -> None:
        cluster = self.cluster
        cluster._next_request += 1
        request = cluster._next_request
        self.pending[request] = (node, queue.group, answer)
        op[-1] = request
        self._post(node, queue, op)

    def release(self, node: str, queue) -> None:
        for request, (mirror, uid, answer) in list(self.pending.items()):
            if mirror == node and uid == queue.group:
                del self.pending[request]
                answer(True)

    def boot(self, node: str) -> str | None:
        return self.cluster.boots.get(node)

    def settings(self, queue):
        return self._settings(queue.vhost, queue)

    @property
    def sync_batch_size(self) -> int:
        return self.cluster.settings.mirroring_sync_batch_size

    def _on_ack(self, sender: str, body: dict) -> None:
        for request in body["r"]:
            item = self.pending.pop(request, None)
            if item is not None:
                item[2](True)

    # ================================================= the mirror's side

    def _on_op(self, sender: str, body: dict) -> None:
        uid = body["q"]
        if uid in self.early or self._mirror_queue(body, sender) is None:
            self.early.setdefault(uid, deque()).append(
                (self.cluster.now + EARLY_FOR, sender, body))
            self._serve_early(self.cluster.now)
            return
        self._apply(sender, body)

    def _mirror_queue(self, body: dict, sender: str):
        """The queue `body` is for, if this node is its mirror and `sender` its leader
        in the record applied here (a leader restarted over an older record, whose
        promotion it has not replayed yet, is not heard)."""
        queue = self.node.queue(body["v"], body["n"])
        if isinstance(queue, RemoteClassicQueue) and queue.group == body["q"] \
                and queue.host == sender and queue.mirrors is not None \
                and self.cluster.name in queue.mirrors:
            return queue
        return None

    def _apply(self, sender: str, body: dict) -> None:
        queue = self._mirror_queue(body, sender)
        op = body["o"]
        if queue is None or queue.replica is None:
            return  # no longer a mirror here (the leader detaches it: no ack needed)
        if not queue.replica.complete and op[0] != "x":
            # a copy the leader has not reset in this node's run: made before a
            # restart, or new and waiting for its reset; nothing is applied or
            # acknowledged (the confirms wait until the leader detaches this mirror)
            now = self.cluster.now
            last = self.reported.get(queue.group)
            if last is None or now - last >= PROPOSE_EVERY:
                self.reported[queue.group] = now
                self.cluster._post(sender, Rpc("cm.stale", {
                    "q": queue.group, "v": queue.vhost, "n": queue.name,
                    "boot": self.node.boot_id}))
            return
        batch = queue.replica.apply(op)
        if op[0] in ("p", "s") and op[-1]:  # a publish's confirm, a sync batch's next
            request = op[-1]

            def ack(_ok: bool) -> None:
                self.cluster._post(sender, Rpc("cm.ack", {"r": [request]}))

            synced = self.cluster.classic.synced
            if self.node.after_sync(batch, synced):  # persistent messages: once on disk
                synced.waiting.append((ack, batch))
            else:
                ack(True)

    def _serve_early(self, now: float) -> None:
        for uid, waiting in list(self.early.items()):
            while waiting:
                deadline, sender, body = waiting[0]
                if self._mirror_queue(body, sender) is None and now < deadline:
                    break
                waiting.popleft()
                self._apply(sender, body)
            if not waiting:
                del self.early[uid]

    # ================================================= publishes across a failover

    def park(self, queue, message, answer: Callable[[bool], None], publish_id: str) -> None:
        """A forwarded publish to a mirrored queue whose leader is unreachable or
        restarted before it answered: it waits for the queue's next leader and goes
        there with its id (taken already: confirmed, not enqueued twice), or is
        nacked after PARK_FOR seconds or if the queue goes."""
        if not any(item[2] == queue.group for item in self.parked):
            log.warning("mirrored queue '%s' in vhost '%s': leader %s did not answer: "
                        "publishes wait for its next leader", queue.name, queue.vhost,
                        queue.host)
        self.parked.append((queue.vhost, queue.name, queue.group, queue.host, message,
                            answer, publish_id, self.cluster.now + PARK_FOR))

    def _resend_parked(self) -> None:
        if not self.parked:
            return
        parked, self.parked = self.parked, []
        now = self.cluster.now
        for item in parked:
            vhost_name, name, group, old_host, message, answer, publish_id, deadline = item
            queue = self.node.queue(vhost_name, name)
            if queue is None or queue.group != group or now >= deadline:
                answer(False)
            elif queue.metadata_record().get("host") == old_host:
                if self.cluster.reachable(old_host):  # back (a restart, a cut healed)
                    self.cluster.classic.publish(queue, message, answer, publish_id)
                else:
                    self.parked.append(item)  # no new leader yet
            elif isinstance(queue, ClassicQueue):  # promoted here
                self.cluster.classic.publish_here(queue, message, publish_id, answer)
            else:
                self.cluster.classic.publish(queue, message, answer, publish_id)

    # ================================================= placement and promotion

    def tick(self, silent: set[str]) -> None:
        """Every second or so: mirrors follow the policies and the nodes' liveness;
        a mirror whose leader's node went silent may take over."""
        self._serve_early(self.cluster.now)
        self._expire_syncs()
        self._resend_parked()
        now = self.cluster.now
        for uid in [u for u, (_key, when) in self.proposed.items()
                    if now - when >= PROPOSE_EVERY]:
            del self.proposed[uid]  # (deleted queues' too)
        if not self.cluster.settings.permit_classic_queue_mirroring:
            return
        leaderless = set()
        for queue in list(self.node.all_queues()):
            if isinstance(queue, ClassicQueue) and not queue.deleted:
                self._place(queue.vhost, queue, silent)
                self._watch_sync(queue, now)
            elif isinstance(queue, RemoteClassicQueue) and queue.replica is not None \
                    and queue.host in silent:
                leaderless.add(queue.group)
                self._promote(queue.vhost, queue, silent)
        for uid in [u for u in self.incomplete if u not in leaderless]:
            del self.incomplete[uid]   # (a mirror still waiting says so again)

    def _watch_sync(self, queue: ClassicQueue, now: float) -> None:
        """A synchronisation whose batch no mirror acknowledged for SYNC_STALL seconds
        (a mirror that cannot apply it, and whose node is not silent) is cancelled:
        the queue's consumers are not held for ever."""
        run = queue.mirroring.syncing if queue.mirroring is not None else None
        if run is None:
            self.sync_progress.pop(queue.group, None)
            return
        last = self.sync_progress.get(queue.group)
        if last is None or last[0] is not run or last[1] != run.sent:
            self.sync_progress[queue.group] = (run, run.sent, now)
        elif now - last[2] >= SYNC_STALL:
            log.warning("mirrored queue '%s' in vhost '%s': synchronisation stalled (no "
                        "batch acknowledged for %gs): cancelled", queue.name, queue.vhost,
                        SYNC_STALL)
            queue.mirroring.cancel_sync()
            self.sync_progress.pop(queue.group, None)

    def _settings(self, vhost: str, queue):
        if queue.exclusive_owner is not None:
            return None  # never mirrored (the guide's "Mirroring of Exclusive Queues")
        return ha_settings(self.node.policy_for(vhost, "classic", queue.name))

    def _place(self, vhost: str, queue: ClassicQueue, silent: set[str]) -> None:
        me = self.cluster.name
        settings = self._settings(vhost, queue)
        mirroring = queue.mirroring
        restarted = self._restarted(vhost, queue)
        if settings is None:
            mirrors, synced = None, ()
        else:
            mirrors = desired_mirrors(settings, me, self.cluster.nodes,
                                      set(silent) | restarted, queue.mirrors or ())
            synced = tuple(m for m in (mirroring.synchronised() if mirroring else ())
                           if m in mirrors)
        host = me
        if mirrors is not None and leader_must_move(settings, me, self.cluster.nodes):
            ready = [m for m in mirrors if m in synced and queue.mirrors
                     and m in queue.mirrors]
            if ready:  # "'nodes' Policy and Migrating Leaders": once one is synchronised
                host = ready[0]
                mirrors = tuple(m for m in mirrors if m != host)
                synced = tuple(m for m in synced if m != host)
        if host == me and mirrors == queue.mirrors and synced == queue.synced:
            return
        record = {"host": host, "mirrors": None if mirrors is None else list(mirrors),
                  "synced": list(synced)}
        self._propose(vhost, queue, me, record)

    def _restarted(self, vhost: str, queue: ClassicQueue) -> set[str]:
        """The mirrors whose node restarted since they were attached (a new run
        heard of, or a mirror's report that its copy was not reset in its node's
        run: "cm.stale"). They leave the record (mirrors and synchronised ones)
        before anything else: its commit detaches them, which releases the confirms
        that waited for them, and the next placement adds them again as new,
        unsynchronised mirrors that start empty (the guide's "Stopping Nodes and
        Synchronisation"). Reset here at once instead, a restarted mirror would stay
        synchronised in the record until the next one, and a promotion meanwhile
        would make its empty copy the queue."""
        mirroring = queue.mirroring
        stale = self.stale.get(queue.group)
        if mirroring is None:
            self.stale.pop(queue.group, None)
            return set()
        if stale:
            stale &= set(mirroring.mirrors)  # the ones detached since rejoin anew
        restarted = set(stale or ())
        for name, mirror in mirroring.mirrors.items():
            boot = self.boot(name)
            if boot is not None and mirror.boot is not None and boot != mirror.boot:
                restarted.add(name)
        for name in restarted - (stale or set()):
            log.info("mirrored queue '%s' in vhost '%s': mirror on %s restarted: it "
                     "leaves the mirrors and rejoins empty", queue.name, vhost, name)
            self.stale.setdefault(queue.group, set()).add(name)
        if not self.stale.get(queue.group, True):
            del self.stale[queue.group]
        return restarted

    def _on_stale(self, sender: str, body: dict) -> None:
        """A mirror received operations for a copy its leader did not reset in its
        node's current run (its node restarted unnoticed: the leader attached it
        before hearing its run, or has not heard the new one yet; or a mirror kept
        across a promotion whose node restarted before it). Ignored when this leader
        attached it, resetting it, in the run it reports (the operations were sent
        to an earlier attachment of it, and crossed its reset)."""
        queue = self.node.queue(body["v"], body["n"])
        if not isinstance(queue, ClassicQueue) or queue.group != body["q"] \
                or queue.mirroring is None:
            return
        mirror = queue.mirroring.mirrors.get(sender)
        if mirror is not None and (not mirror.reset or mirror.boot != body["boot"]):
            self.stale.setdefault(queue.group, set()).add(sender)

    def _promote(self, vhost: str, queue: RemoteClassicQueue, silent: set[str]) -> None:
        me = self.cluster.name
        settings = self._settings(vhost, queue)
        rule = settings.promote_on_failure if settings is not None else "always"
        boot = self.boot(queue.host)
        deciding = "ha-promote-on-failure"
        if boot is not None and self.stopped.get(queue.host) == boot and rule == "always":
            deciding = "ha-promote-on-shutdown"
            # a controlled shutdown: ha-promote-on-shutdown (default when-synced) decides,
            # unless ha-promote-on-failure is when-synced (the guide's "Stopping Nodes
            # Hosting Queue Leader with Only Unsynchronised Mirrors")
            rule = settings.promote_on_shutdown if settings is not None else "when-synced"
        incomplete = {m for m, run in self.incomplete.get(queue.group, {}).items()
                      if self.boot(m) == run}
        down = set(silent) | {queue.host} | incomplete
        candidate = promotion_candidate(queue.mirrors or (), queue.synced, down, rule)
        if candidate is None and (queue.group, boot) not in self.waiting:
            self.waiting.add((queue.group, boot))
            log.warning("mirrored queue '%s' in vhost '%s': leader %s is down and no "
                        "mirror may be promoted (%s when-synced, no synchronised mirror "
                        "running): "
                        "the queue waits for its leader", queue.name, vhost, queue.host,
                        deciding)
        if candidate != me:
            return
        if not queue.replica.complete:
            # this node restarted since the leader last reset its copy: what it holds
            # (its store's copy of a durable queue) may lack what the leader received
            # since ("Loss of a Leader While All Mirrors are Stopped": the last node
            # to stop leads when it starts again), whatever the record says. The
            # other mirrors are told (every tick while it lasts), so that the next
            # one, which may have kept its copy, is promoted instead of waiting for
            # this one
            for name in self.cluster.nodes:
                if name not in (me, queue.host):
                    self.cluster._post(name, Rpc("cm.incomplete", {
                        "q": queue.group, "boot": self.node.boot_id}))
            if (queue.group, "restarted", boot) not in self.waiting:
                self.waiting.add((queue.group, "restarted", boot))
                log.warning("mirrored queue '%s' in vhost '%s': leader %s is down and "
                            "this mirror's copy dates from before its node restarted: "
                            "the queue waits for its leader (or for "
                            "`forget_cluster_node %s`, which promotes a mirror)",
                            queue.name, vhost, queue.host, queue.host)
            return
        record = {"host": me, "mirrors": [m for m in queue.mirrors if m != me],
                  "synced": [m for m in queue.synced if m != me and m not in incomplete]}
        if self._propose(vhost, queue, queue.host, record):
            log.warning("mirrored queue '%s' in vhost '%s': leader %s is down: promoting "
                        "the %s mirror on %s", queue.name, vhost, queue.host,
                        "synchronised" if me in queue.synced else "unsynchronised", me)

    def _propose(self, vhost: str, queue, expect_host: str, record: dict) -> bool:
        key = repr(sorted(record.items()))
        last = self.proposed.get(queue.group)
        now = self.cluster.now
        if last is not None and last[0] == key and now - last[1] < PROPOSE_EVERY:
            return False
        self.proposed[queue.group] = (key, now)
        self.cluster.meta.propose_data(encode(
            "queue.record", vhost=vhost, name=queue.name, group=queue.group,
            expect_host=expect_host, record=record))
        return True

    def stopping(self) -> None:
        """This node stops (SIGTERM): tell the others, so that its mirrored queues'
        mirrors apply ha-promote-on-shutdown rather than ha-promote-on-failure."""
        for name in self.cluster.nodes:
            if name != self.cluster.name:
                self.cluster._post(name, Rpc("cm.stopping", {"boot": self.node.boot_id}))

    def _on_incomplete(self, sender: str, body: dict) -> None:
        """A mirror whose node restarted since its leader last reset its copy, the
        leader being down: not a candidate for promotion in that run (_promote)."""
        self.incomplete.setdefault(body["q"], {})[sender] = body["boot"]

    def _on_stopping(self, sender: str, body: dict) -> None:
        """A node announced its controlled shutdown: remembered here (promotion
        under ha-promote-on-shutdown), and, in the record of each mirrored queue led
        here that it mirrors, appended to the mirrors stopped in order (the record's
        "stopped": `forget_cluster_node` of this node promotes the most recently
        stopped one, mirroring.forget_leader)."""
        self.stopped[sender] = body["boot"]
        for queue in list(self.node.all_queues()):
            if not isinstance(queue, ClassicQueue) or queue.deleted \
                    or sender not in (queue.mirrors or ()):
                continue
            stopped = [m for m in queue.stopped if m != sender] + [sender]
            self._propose(queue.vhost, queue, queue.host, {
                "host": queue.host, "mirrors": list(queue.mirrors),
                "synced": list(queue.synced), "stopped": stopped})

    # ================================================= operations

    def sync(self, queue, done: Callable[[int | None], None], cancel: bool = False) -> None:
        """`ctl sync_queue`: the leader starts sending its contents to its
        unsynchronised mirrors, in the background (queues/mirroring.py
        Mirroring.sync); `done(count)` once started (count: the mirrors being
        synchronised). With `cancel` (`ctl cancel_sync_queue`): the synchronisation
        in progress stops; done(1), or done(0) when none was running. done(None):
        the leader cannot be asked. Elsewhere the leader is asked ("cm.sync" {r, v,
        n, c} -> "cm.synced" {r, count})."""
        if isinstance(queue, ClassicQueue):
            done(_sync_here(queue, cancel))
            return
        host = queue.host
        if not self.cluster.reachable(host):
            done(None)
            return
        cluster = self.cluster
        cluster._next_request += 1
        request = cluster._next_request
        self.syncs[request] = (host, self.cluster.now + SYNC_TIMEOUT, done)
        cluster._post(host, Rpc("cm.sync", {"r": request, "v": queue.vhost,
                                            "n": queue.name, "c": cancel}))

    def _on_sync(self, sender: str, body: dict) -> None:
        queue = self.node.queue(body["v"], body["n"])
        count = (_sync_here(queue, bool(body.get("c"))) if isinstance(queue, ClassicQueue)
                 else None)
        self.cluster._post(sender, Rpc("cm.synced", {"r": body["r"], "count": count}))

    def _on_synced(self, sender: str, body: dict) -> None:
        waiting = self.syncs.pop(body["r"], None)
        if waiting is not None:
            waiting[2](body["count"])

    def _expire_syncs(self) -> None:
        now = self.cluster.now
        for request, (host, deadline, done) in list(self.syncs.items()):
            if now >= deadline or not self.cluster.reachable(host):
                del self.syncs[request]
                done(None)


def _sync_here(queue: ClassicQueue, cancel: bool) -> int:
    mirroring = queue.mirroring
    if mirroring is None:
        return 0
    if cancel:
        stopped = mirroring.cancel_sync()
        if stopped:
            log.info("mirrored queue '%s' in vhost '%s': synchronisation cancelled",
                     queue.name, queue.vhost)
        return int(stopped)
    running = mirroring.syncing is not None
    count = mirroring.sync()
    if not running and mirroring.syncing is not None:
        log.info("mirrored queue '%s' in vhost '%s': synchronising %d mirror(s), %d "
                 "messages in batches of %d", queue.name, queue.vhost, count,
                 len(mirroring.syncing.seqs), mirroring.batch_size)
    return count


def handlers() -> dict[str, Callable[["Cluster", str, dict], None]]:
    """The Rpc kinds of this module, for the cluster's dispatch table."""
    return {
        "cm.op": lambda cluster, sender, body: cluster.mirrors._on_op(sender, body),
        "cm.ack": lambda cluster, sender, body: cluster.mirrors._on_ack(sender, body),
        "cm.sync": lambda cluster, sender, body: cluster.mirrors._on_sync(sender, body),
        "cm.synced": lambda cluster, sender, body: cluster.mirrors._on_synced(sender, body),
        "cm.stopping": lambda cluster, sender, body: cluster.mirrors._on_stopping(sender,
                                                                                  body),
        "cm.stale": lambda cluster, sender, body: cluster.mirrors._on_stale(sender, body),
        "cm.incomplete": lambda cluster, sender, body: cluster.mirrors._on_incomplete(
            sender, body),
    }


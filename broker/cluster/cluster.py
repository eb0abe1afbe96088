"""A node's place in its cluster: Raft traffic between nodes, and commands forwarded
to the leaders of the groups they are for.

Responsibilities: carry the Raft messages of every group this node is a member of
(the metadata group and its quorum queues' groups) to the other members, and step
the ones that arrive into their group; forward a command proposed on a member that
does not lead its group to the leader, and tie the leader's answer — the (index,
term) it appended the command at — back to the waiter (groups/replicated.py);
choose the members of new quorum queues; tell this node's own connections from
other nodes' (fifo consumer keys carry the node's name); keep the cluster's node
list (nodes that joined, nodes forgotten: cluster_nodes.json).

How it works: a forwarded command is a (group, request id, data) in an Rpc "propose";
the commands forwarded to one leader in one event-loop iteration travel in one
propose (a publisher's pipelined messages: one Rpc, not one each). The leader
appends each and answers, in one Rpc per kind, "accepted" {request ids, indexes,
terms} or "redirect" {request ids, leaders} for those whose group it no longer leads. Until accepted, the request stays
pending and is sent again when the group's leader changes, on a redirect, and after
a second without an answer; the leader remembers the requests it appended recently,
so a repeat of one it already appended is answered with the same (index, term)
instead of being appended twice. What a leader appended and then lost with its
leadership is caught by the waiter's term check, and proposed again.

A leader that appended a forwarded command and crashed before its "accepted" left
cannot answer the repeat: the next leader appends the command again. So the data
itself carries the command's identity (broker/raft/forwarded.py): `origin`, 64 bits
drawn when this node starts, and a sequence number per group counting this run's
forwards to it. Every member's apply skips an entry whose identity it applied
before and answers its waiter with the first application's reply
(groups/replicated.py `admit`): the command takes effect once. Commands proposed on
the leader itself carry no identity (nobody resends them to another leader).

Invariants: a Raft message leaves only after the Ready that produced it is durable
(QuorumGroups.flush calls `send_raft` after the fsync); this node's fifo identities
are `<node name>:<boot id>.<connection>.<channel>`, so every node recognises its
own and its previous runs' consumers and leaves other nodes' alone; a forwarded
command keeps one identity through every resend and re-proposal (`forward` wraps
only data not wrapped yet), and a run never gives a sequence number twice in a group.

Not here: the transport (server/cluster_transport.py), the wire format (wire.py), consensus
(broker/raft), the identity's bytes and the window of identities applied
(broker/raft/forwarded.py), skipping a duplicate (groups/replicated.py), what
commands mean (broker/fifo, groups/metadata.py).
"""

from __future__ import annotations

import logging
import os
import random
from collections import OrderedDict

from ..config import Settings
from ..groups.metadata import META_GROUP, MetaGroup
from ..groups.metadata import encode as encode_meta
from ..groups.replicated import UNANSWERED, ReplicatedGroup, Waiter
from ..raft.forwarded import FORWARDED, Identity, wrap
from ..queues.quorum.groups import QuorumGroups
from ..raft.messages import InstallSnapshot
from ..raft.storage import LogStore
from ..storage.node_list import NodeListFile
from . import classic_link, consumer_nodes, mirror_link, proxy, replica_rpc, tracking
from .host import ClusterHost
from .outbox import Outbox
from .wire import RaftEnvelope, Rpc


log = logging.getLogger("quorumqueue.cluster")

RESEND_AFTER = 1.0          # seconds without an answer before a forward is sent again
# a node not heard from (not pinged, for its consumers) for this long is down for the
# queues it consumes from: the leaders suspect its consumers (consumer_nodes.py), as
# RabbitMQ's do on noconnection
NODE_DOWN_AFTER = 5.0
PING_EVERY = 1.0            # every node pings every other (Erlang's net ticks)
REACHABLE_WITHIN = 3.0      # heard from this recently: reachable (cluster status)
REMEMBERED_REQUESTS = 100_000
# a proxied command accepted by a leader whose reply has not come this long after is
# sent again (the leader may have lost its place in the log or its waiter with a
# restart; a repeat applied already is skipped by its identity: raft/forwarded.py)
REPLY_WITHIN = 5.0


class _Pending:
    __slots__ = ("member", "data", "waiter", "sent_to", "sent_at", "accepted",
                 "accepted_at", "accepted_by_boot")

    def __init__(self, member: ReplicatedGroup, data: bytes, waiter: Waiter | None) -> None:
        self.member = member
        self.data = data
        self.waiter = waiter
        self.sent_to: str | None = None
        self.sent_at = 0.0
        self.accepted = False  # a proxied command: appended, its reply still to come
        self.accepted_at = 0.0
        self.accepted_by_boot: str | None = None  # the accepting node's run (its pings)



class _PendingRequests:
    """The forwarded requests waiting for a leader's answer: by request id, and by
    group member, so a leader change visits only its group's requests (with 100
    groups forwarding at once, a walk over all of them per change was 14% of a
    node's samples). Ids are kept in the order they were last sent (`sent` moves
    one to the end), so `overdue` stops at the first one sent recently instead of
    walking every request on every tick."""

    __slots__ = ("_by_id", "_by_member")

    def __init__(self) -> None:
        self._by_id: dict[int, _Pending] = {}
        self._by_member: dict[int, dict[int, None]] = {}   # id(member) -> request ids

    def add(self, request: int, pending: _Pending) -> None:
        self._by_id[request] = pending
        self._by_member.setdefault(id(pending.member), {})[request] = None

    def get(self, request: int) -> _Pending | None:
        return self._by_id.get(request)

    def __getitem__(self, request: int) -> _Pending:
        return self._by_id[request]

    def pop(self, request: int, default=None) -> _Pending | None:
        pending = self._by_id.pop(request, None)
        if pending is None:
            return default
        key = id(pending.member)
        requests = self._by_member[key]
        del requests[request]
        if not requests:
            del self._by_member[key]
        return pending

    def __delitem__(self, request: int) -> None:
        if self.pop(request) is None:
            raise KeyError(request)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request: int) -> bool:
        return request in self._by_id

    def values(self):
        return self._by_id.values()

    def sent(self, request: int, pending: _Pending, now: float) -> None:
        """`pending` (request `request`) was sent again at `now`: last in send order."""
        pending.sent_at = now
        by_id = self._by_id
        del by_id[request]
        by_id[request] = pending

    def of_member(self, member: ReplicatedGroup) -> list[int]:
        return list(self._by_member.get(id(member), ()))

    def overdue(self, deadline: float) -> list[int]:
        """The requests last sent before `deadline`, oldest first."""
        overdue = []
        for request, pending in self._by_id.items():
            if pending.sent_at >= deadline:
                break
            overdue.append(request)
        return overdue


class Cluster:
    def __init__(self, node: ClusterHost, settings: Settings, log_store: LogStore) -> None:
        self.node = node
        self.name = settings.node_name
        self.settings = settings
        # every Raft group of the node, the metadata group's too, over `log_store`:
        # their messages go through this cluster, their node's part through `node`
        self.groups = QuorumGroups(
            log_store, settings.node_name, node, self,
            snapshot_over_live=not settings.clustered,
            dead_letter_prefetch=settings.dead_letter_worker_consumer_prefetch,
            dead_letter_confirm_timeout_ms=(
                settings.dead_letter_worker_publisher_confirm_timeout_ms))
        # every node of the cluster, this one included (a node of its own: just it)
        self.addresses = settings.cluster_peers() or {
            self.name: (settings.host, settings.cluster_port)}
        self.node_file = NodeListFile(settings.data_dir)  # read here, saved by the Sync
        joined, self.forgotten = self.node_file.load()
        self.nodes_changed = False  # the list changed: the next group commit saves it
        for name, address in joined.items():  # nodes that joined later
            self.addresses.setdefault(name, address)
        for name in self.forgotten - {self.name}:  # forgotten, even if configured
            self.addresses.pop(name, None)
        self.joining = bool(settings.cluster_join)
        # what this node sends to others, until the server shell takes it for its
        # transport (outbox.py; a node alone: the loopback transport, no peer)
        self.outbox = Outbox()
        self.pending = _PendingRequests()
        # counts asked of other nodes (proxy.counts): request -> (callback, deadline)
        self.stats: dict[int, tuple] = {}
        # requests to other nodes' members (replica_rpc.ask): request -> (done, deadline)
        self.replica_requests: dict[int, tuple] = {}
        # nodes whose link the transport reported lost and not heard from since:
        # replica_rpc answers what is asked of them at once (replica_rpc.link_lost)
        self.links_lost: set[str] = set()
        # nodes the failure detector last found down (not `seen_up`), each reported to
        # the quorum groups once (QuorumGroups.member_lost) until heard from again
        self.suspected: set[str] = set()
        # request ids: unique across this node's runs too (a leader remembers requests
        # by (node, id); a restarted node counting from 0 again would be "remembered")
        self._next_request = int.from_bytes(os.urandom(7), "big") << 8
        self._appended: OrderedDict[tuple[str, int], tuple[int, int]] = OrderedDict()
        # the identity of forwarded commands (forwarded.py): this run's origin, and per
        # group the last sequence number given (a new run starts again from 1)
        self.origin = int.from_bytes(os.urandom(8), "big")
        self._forwarded: dict[str, int] = {}
        self._random = random.Random()
        self.classic = classic_link.ClassicLink(self)  # classic queues on other nodes
        # every node's open connections and channels, for the limits (tracking.py)
        self.tracking = tracking.Tracking(self)
        self.mirrors = mirror_link.MirrorLink(self)    # mirrored classic queues
        # monotonic seconds as the shell last told the node (Node.set_clock: before
        # it hands this node input, peers' messages and timers); the cluster reads no
        # clock. `started`: the first time it was told (nodes not heard from since
        # then are silent NODE_DOWN_AFTER later)
        self.now = 0.0
        self.started: float | None = None
        self.last_heard: dict[str, float] = {}  # node -> when it last sent us anything
        self._next_ping = 0.0
        self.amqp_uris: dict[str, str] = {}     # node -> where clients reach it (pings)
        self.amqp_uri: str | None = None        # this node's, set by the server shell
        self.boots: dict[str, str] = {}         # node -> its boot id (pings)
        self.pinged: dict[str, float] = {}      # node -> when its last ping came
        # forwarded commands not yet handed to the transport, per leader: parallel
        # lists (groups, request ids, data, reply awaited), sent as one "propose"
        self._proposals: dict[str, tuple[list, list, list, list]] = {}
        # this node's member of the metadata group (every node is one), driven with
        # the quorum queues' groups
        self.meta = self._metadata_member()
        self.groups.add_group(self.meta)

    def set_clock(self, now: float) -> None:
        """The time, passed in (Node.set_clock)."""
        if self.started is None:
            self.started = now
        self.now = now

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted(self.addresses))

    # ------------------------------------------------------------ setup

    def take_node_list(self) -> tuple[dict, set] | None:
        """The node list to save (joined nodes' addresses, forgotten nodes) if it
        changed since the last call: the group commit writes it off the event loop
        (storage/node_list.py)."""
        if not self.nodes_changed:
            return None
        self.nodes_changed = False
        return dict(self.addresses), set(self.forgotten)

    def add_node(self, name: str, address: tuple[str, int]) -> None:
        """A node joined (the metadata group's `cluster.add_node`, or a welcome)."""
        address = (address[0], int(address[1]))
        if self.addresses.get(name) == address:
            return
        self.addresses[name] = address
        self.forgotten.discard(name)  # forgotten, then joined again (with a fresh node)
        if name != self.name:
            self.outbox.add_peer(name, address)
        self.nodes_changed = True
        log.info("cluster %s: node %s at %s:%d", self.settings.cluster_name, name, *address)

    def forget_node(self, name: str) -> None:
        """A node was removed for good (the metadata group's `cluster.forget_node`):
        no longer listed, reached or waited for; kept out of the list after restarts
        (cluster_nodes.json), even though the configuration still names it."""
        if name == self.name or (name not in self.addresses and name in self.forgotten):
            return
        self.addresses.pop(name, None)
        self.forgotten.add(name)
        for known in (self.last_heard, self.amqp_uris, self.boots, self.pinged):
            known.pop(name, None)
        self.outbox.remove_peer(name)
        self.nodes_changed = True
        log.info("cluster %s: node %s forgotten", self.settings.cluster_name, name)

    def _metadata_member(self) -> MetaGroup:
        """This node's member of the metadata group, over the log store: as recorded,
        else a new group of the configured nodes (none for a joining node, which
        learns the group from its leader)."""
        quorum = self.groups
        store = quorum.store
        fresh = META_GROUP not in store.groups()
        if fresh and not self.joining:  # a joining node learns the group from its leader
            store.set_initial_members(META_GROUP, list(self.nodes))
        raft = quorum.new_core(META_GROUP)
        if raft.members == (self.name,) or (fresh and not self.joining
                                            and self.name == self.nodes[0]):
            # a group of one elects itself at once; a new cluster: the first node asks
            # first (the others time out)
            raft.campaign()
        return MetaGroup(self.node, raft, store, self)

    # ------------------------------------------------------------ identities

    def is_local_key(self, key: str) -> bool:
        """A fifo consumer key or connection identity of this node (this run or an
        earlier one)."""
        identity = key.partition("/")[0]
        return identity.startswith(self.name + ":") or ":" not in identity  # or single-node

    def is_stale_identity(self, identity: str) -> bool:
        """A connection of an earlier run of this node."""
        return self.is_local_key(identity) and not identity.startswith(self.node.boot_id + ".")

    # ------------------------------------------------------------ placement

    def place(self, size: int, locator: str) -> tuple[tuple[str, ...], str]:
        """(members, intended leader) of a new quorum queue: `size` nodes (capped at
        the cluster's size) including this one; the leader here (client-local) or on
        the member leading the fewest groups (balanced). On a worker of a node of
        broker.workers (server/workers.py) the cluster is one node: one member, on the
        worker holding the fewest quorum queues (this one on a tie)."""
        if self.settings.worker >= 0:
            held = {n: 0 for n in self.nodes}
            for queue in self.node.all_queues():
                for member in queue.metadata_record().get("members", ()):
                    if member in held:
                        held[member] += 1
            owner = min(held, key=lambda n: (held[n], n != self.name, n))
            return (owner,), owner
        size = max(1, min(size, len(self.nodes)))
        others = [n for n in self.nodes if n != self.name]
        members = tuple(sorted([self.name] + self._random.sample(others, size - 1)))
        if locator != "balanced":
            return members, self.name
        counts = {n: 0 for n in members}
        for member in self.groups.queues.values():
            if member.group != META_GROUP and member.leader_id in counts:
                counts[member.leader_id] += 1
        return members, min(members, key=lambda n: (counts[n], n != self.name, n))

    def least_hosting(self, running_only: bool = False) -> str:
        """The node hosting the fewest classic queues (this one on a tie): where
        queue-leader-locator "balanced" puts a new classic queue; with
        `running_only` (RabbitMQ 3.13's min-masters) only the nodes reachable now."""
        nodes = self.nodes
        if running_only:
            nodes = [n for n in nodes if self.reachable(n)]
        counts = {n: 0 for n in nodes}
        for queue in self.node.all_queues():
            host = queue.metadata_record().get("host")
            if host in counts:
                counts[host] += 1
        return min(counts, key=lambda n: (counts[n], n != self.name, n))

    def random_running(self) -> str:
        """A node reachable now, at random (RabbitMQ 3.13's queue-master-locator
        "random")."""
        return self._random.choice([n for n in self.nodes if self.reachable(n)])

    # ------------------------------------------------------------ Raft traffic

    def _post(self, peer: str, envelope) -> None:
        self.outbox.send(peer, envelope)

    def data_to_send(self) -> list:
        """What to hand to the transport now, in order (outbox.py): the forwarded
        commands gathered this loop iteration first become their "propose" Rpcs."""
        if self._proposals:
            self._send_proposals()
        return self.outbox.take()

    def send_raft(self, group: str, messages) -> None:
        for message in messages:
            if isinstance(message, InstallSnapshot) and message.data is None:
                stored = self.groups.store.read_snapshot(group)
                if stored is None or stored[0].index != message.meta.index:
                    member = self.groups.queues.get(group)
                    if member is not None and member.raft is not None:
                        member.raft.report_snapshot(message.to, False)
                    continue
                message = message.with_data(stored[1])
            self._post(message.to, RaftEnvelope(group, message))

    def link_lost(self, name: str) -> None:
        """From the transport: the connection to `name` closed (a killed node's at
        once). Only the queries waiting on it learn it (replica_rpc's, and the counts of
        proxy.py, asked of another member);
        liveness stays `reachable`'s (pings), so a dropped link alone moves nothing."""
        self.links_lost.add(name)
        replica_rpc.link_lost(self, name)
        proxy.link_lost(self, name)   # the counts asked of it: another member

    def on_message(self, sender: str, envelope) -> None:
        """From the transport, in the event loop."""
        if sender in self.forgotten and not (isinstance(envelope, Rpc)
                                             and envelope.kind == "join"):
            return  # removed from the cluster: only a join (of a reset node) is heard
        self.last_heard[sender] = self.now
        self.links_lost.discard(sender)
        if sender in self.suspected:
            self.suspected.discard(sender)
        if isinstance(envelope, RaftEnvelope):
            member = self.groups.queues.get(envelope.group)
            if member is None or member.raft is None:
                return  # not (yet) a member here: the leader will retry
            member.raft.step(envelope.message)
        elif isinstance(envelope, Rpc):
            handler = _RPCS.get(envelope.kind)
            if handler is None:
                log.warning("unknown cluster request '%s' from %s", envelope.kind, sender)
                return
            handler(self, sender, envelope.body)

    # ------------------------------------------------------------ forwarding

    def forward(self, member: ReplicatedGroup, data: bytes, waiter: Waiter | None) -> None:
        """Send a command to its group's leader, wrapped with its identity (a command
        proposed again after a lost append already has one, and keeps it)."""
        if data[0] != FORWARDED:
            seq = self._forwarded.get(member.group, 0) + 1
            self._forwarded[member.group] = seq
            data = wrap(Identity(self.origin, seq, waiter is not None), data)
        self._next_request += 1
        request = self._next_request
        self.pending.add(request, _Pending(member, data, waiter))
        self._send(request)

    def forwarded_to(self, group: str) -> bool:
        """Whether this run forwarded a command to `group` (then it numbers every
        later one too, also while this node leads the group: ReplicatedGroup.propose_run)."""
        return group in self._forwarded

    def _send(self, request: int) -> None:
        pending = self.pending[request]
        member = pending.member
        if member.deleted:
            del self.pending[request]
            if pending.waiter is not None:
                pending.waiter(None)
            return
        if member.raft is None:  # no replica here: the leader answers (proxying)
            leader = member.leader_hint if member.leader_hint in self.addresses else \
                self._some_member(member, pending.sent_to)
            pending.sent_to = leader
            self.pending.sent(request, pending, self.now)
            pending.accepted = False
            if leader is not None:
                self._propose_to(leader, member.group, request, pending.data, True)
            return
        leader = member.leader_id
        if leader == self.name and member.is_leader:
            del self.pending[request]
            member.propose_data(pending.data, pending.waiter)
            return
        pending.sent_to = leader
        self.pending.sent(request, pending, self.now)
        if leader is not None:
            self._propose_to(leader, member.group, request, pending.data, False)

    def _propose_to(self, leader: str, group: str, request: int, data: bytes,
                    reply: bool) -> None:
        """Queue a forwarded command for `leader`; every command queued until the
        shell next takes this node's output leaves in one "propose" (`data_to_send`)."""
        batch = self._proposals.get(leader)
        if batch is None:
            batch = self._proposals[leader] = ([], [], [], [])
        batch[0].append(group)
        batch[1].append(request)
        batch[2].append(data)
        batch[3].append(reply)

    def _send_proposals(self) -> None:
        proposals, self._proposals = self._proposals, {}
        for leader, (groups, requests, datas, replies) in proposals.items():
            self._post(leader, Rpc("propose", {"g": groups, "r": requests, "d": datas,
                                               "reply": replies}))

    def _some_member(self, record, previous: str | None) -> str | None:
        """A reachable member of a queue with no replica here, other than the last one
        tried (it redirects to its leader)."""
        members = [m for m in record.members if m != self.name and self.reachable(m)]
        if not members:
            return None
        if previous in members and len(members) > 1:
            members.remove(previous)
        return self._random.choice(members)

    def leader_changed(self, member: ReplicatedGroup) -> None:
        pendings = self.pending
        for request in pendings.of_member(member):  # this group's requests only
            pending = pendings.get(request)
            if pending is not None and pending.sent_to != member.leader_id:
                self._send(request)
        from ..queues.quorum.queue import QuorumQueue

        if isinstance(member, QuorumQueue) and not member.replay_until:
            consumer_nodes.check(self, member)  # a quorum queue this node now leads

    def check_consumer_nodes(self, member) -> None:
        """The NodeDown / NodeUp commands `member`'s consumers call for, if this node
        leads it (consumer_nodes.py; a node alone hears only from itself)."""
        consumer_nodes.check(self, member)

    def tick(self) -> None:
        """Send again what no leader answered within RESEND_AFTER; return the messages
        of consumers on nodes that went silent."""
        now = self.now
        ping_due = now >= self._next_ping
        self.tracking.tick(ping_due)
        if ping_due:
            self._next_ping = now + PING_EVERY
            joined = self.name in self.meta.raft.members
            for name in self.nodes:
                if name != self.name:
                    self._post(name, Rpc("ping", {"amqp": self.amqp_uri,
                                                  "boot": self.node.boot_id}))
                    if self.joining and not joined:  # until the metadata group has us
                        host, port = self.addresses[self.name]
                        self._post(name, Rpc("join", {"name": self.name,
                                                      "address": [host, port]}))
            silent = {n for n in self.nodes if n != self.name
                      and now - self.last_heard.get(n, now if self.started is None
                                                    else self.started) > NODE_DOWN_AFTER}
            self._detect_failures()
            consumer_nodes.tick(self)
            self.classic.tick(silent)
            self.mirrors.tick(silent)
        elif self.classic.pending or self.classic.early:
            self.classic.tick(None)
        proxy.expire_stats(self)
        replica_rpc.expire(self)
        deadline = now - RESEND_AFTER
        pendings = self.pending
        for request in pendings.overdue(deadline):  # in send order: stops at a recent one
            pending = pendings.get(request)
            if pending is not None and not self._reply_coming(pending, now):
                self._send(request)

    def _reply_coming(self, pending: _Pending, now: float) -> bool:
        """A proxied command's leader accepted it and can still answer: it is
        reachable, has not restarted since (its waiter would be gone), and the
        answer is not overdue (REPLY_WITHIN)."""
        return (pending.accepted and self.reachable(pending.sent_to)
                and self.boots.get(pending.sent_to) == pending.accepted_by_boot
                and now - pending.accepted_at < REPLY_WITHIN)

    def _on_propose(self, sender: str, body: dict) -> None:
        accepted: tuple[list, list, list] = ([], [], [])     # requests, indexes, terms
        redirected: tuple[list, list] = ([], [])              # requests, leaders
        queues = self.groups.queues
        remembered = self._appended
        for group, request, data, reply in zip(body["g"], body["r"], body["d"],
                                               body["reply"]):
            key = (sender, request)
            appended = remembered.get(key)
            member = queues.get(group)
            if appended is None and member is not None and member.is_leader:
                try:
                    index = member.raft.propose(data)
                except Exception:  # noqa: BLE001 - a transfer in progress: redirect below
                    index = 0
                if index:
                    appended = (index, member.raft.term)
                    remembered[key] = appended
                    if len(remembered) > REMEMBERED_REQUESTS:
                        remembered.popitem(last=False)
                    if reply:  # a node with no replica: answer it after apply
                        member.wait_at(index, appended[1], data,
                                       self._proxied_reply(sender, request, member))
            if appended is not None:
                accepted[0].append(request)
                accepted[1].append(appended[0])
                accepted[2].append(appended[1])
            else:
                redirected[0].append(request)
                redirected[1].append(None if member is None else member.leader_id)
        if accepted[0]:
            self._post(sender, Rpc("accepted", {"r": accepted[0], "i": accepted[1],
                                                "t": accepted[2]}))
        if redirected[0]:
            self._post(sender, Rpc("redirect", {"r": redirected[0], "l": redirected[1]}))

    def _proxied_reply(self, sender: str, request: int, member) -> Waiter:
        return lambda reply: self._post(sender, Rpc("reply", {
            "r": request, "v": proxy.encode_reply(self, member, reply)}))

    def _on_accepted(self, sender: str, body: dict) -> None:
        pendings = self.pending
        for request, index, term in zip(body["r"], body["i"], body["t"]):
            pending = pendings.get(request)
            if pending is None:
                continue
            member = pending.member
            if member.raft is None:
                member.leader_hint = sender  # proxied: the reply follows the apply
                pending.accepted = True
                pending.accepted_at = self.now
                pending.accepted_by_boot = self.boots.get(sender)
                pending.sent_to = sender
                continue
            del pendings[request]
            # watched until applied even when no one waits for its reply: an append
            # lost with this leader would leave a gap of seqs (groups/replicated.py)
            waiter = pending.waiter or UNANSWERED
            if member.deleted:
                waiter(None)
            elif member.raft.applied_index >= index:
                # applied here already (from a snapshot): its reply is gone; proposed
                # again, the entry is known by its identity and answered with the
                # reply kept for it
                member.propose_data(pending.data, waiter)
            else:
                member.wait_at(index, term, pending.data, waiter)

    def _on_redirect(self, sender: str, body: dict) -> None:
        for request, hint in zip(body["r"], body["l"]):
            pending = self.pending.get(request)
            if pending is None:
                continue
            if pending.member.raft is None:
                pending.member.leader_hint = hint if hint != sender else None
                if hint is not None and hint != sender:
                    self._send(request)
                else:
                    pending.sent_to = None
                continue
            if hint is not None and hint != sender and hint != pending.sent_to:
                pending.sent_to = hint
                self.pending.sent(request, pending, self.now)
                self._propose_to(hint, pending.member.group, request, pending.data, False)
            else:
                pending.sent_to = None  # wait for a leader change, or RESEND_AFTER

    def _detect_failures(self) -> None:
        """Once a second: a node newly found down (its link lost, or not heard from
        within REACHABLE_WITHIN) is reported to the quorum groups: the quiet followers
        of its leaders campaign, the quiet leaders counting it check their quorum
        (idle groups send no heartbeats: raft/config.py `quiesce`). As Ra leaves
        failure detection to aten, one detector per node, not one per group."""
        down = {name for name in self.nodes if name != self.name and not self.seen_up(name)}
        for name in sorted(down - self.suspected):
            self.groups.member_lost(name)
        self.suspected = down

    def seen_up(self, name: str) -> bool:
        """What the management API shows as running/online (and the health checks,
        quorum_status and check_if_node_is_quorum_critical count): reachable, and the
        link to it not lost since it was last heard from (a killed node shows down at
        once, not REACHABLE_WITHIN later). `cluster status`, placement and the
        membership refusals keep `reachable`, the cluster's own liveness."""
        return self.reachable(name) and name not in self.links_lost

    def reachable(self, name: str) -> bool:
        """This node, or one heard from within REACHABLE_WITHIN (pings every second)."""
        return name == self.name or (
            self.now - self.last_heard.get(name, -REACHABLE_WITHIN) < REACHABLE_WITHIN)

    def transfer_leadership(self, member: ReplicatedGroup, to: str) -> None:
        """Ask the group's leader (here or elsewhere) to hand leadership to `to`."""
        if member.is_leader:
            try:
                member.raft.transfer_leadership(to)
            except Exception as error:  # noqa: BLE001 - not leader any more, not a member
                log.warning("leadership transfer of %s to %s: %s", member.group, to, error)
        elif member.leader_id is not None:
            self._post(member.leader_id, Rpc("transfer", {"g": member.group, "to": to}))

    def _on_ping(self, sender: str, body: dict) -> None:
        self.amqp_uris[sender] = body.get("amqp")
        if body.get("boot"):
            self.boots[sender] = body["boot"]
            self.pinged[sender] = self.now

    def _on_join(self, sender: str, body: dict) -> None:
        """A node asks to join: tell it every node's address; the metadata leader
        records it (`cluster.add_node`), and then adds it to the metadata group
        (membership.reconcile_metadata)."""
        name, address = body["name"], tuple(body["address"])
        if name not in self.addresses:
            self.outbox.add_peer(name, address)  # to answer; recorded when committed
        self._post(name, Rpc("welcome", {"nodes": {n: list(a)
                                                    for n, a in self.addresses.items()}}))
        meta = self.meta
        if meta.is_leader:
            if self.addresses.get(name) != address:
                meta.propose_data(encode_meta("cluster.add_node", name=name,
                                              address=list(address)))
        elif meta.leader_id is not None and meta.leader_id != sender:
            self._post(meta.leader_id, Rpc("join", body))

    def _on_welcome(self, sender: str, body: dict) -> None:
        for name, address in body["nodes"].items():
            if name != self.name:
                self.add_node(name, tuple(address))

    def _on_transfer(self, sender: str, body: dict) -> None:
        member = self.groups.queues.get(body["g"])
        if member is not None and member.raft is not None and member.is_leader:
            self.transfer_leadership(member, body["to"])

    def counts(self, record, callback) -> None:
        """The counts of a quorum queue with no replica here, from a member (proxy.py)."""
        proxy.counts(self, record, callback)

    def deliver_remote(self, queue, owner: str, key: str, deliveries) -> None:
        proxy.deliver_remote(self, queue, owner, key, deliveries)

    def tell_downed(self, queue, connection: str) -> None:
        """The leader applied a Down for another node's connection (proxy.py)."""
        proxy.tell_downed(self, queue, connection)

    # ------------------------------------------------------------ status

    def status(self) -> dict:
        nodes = []
        for name in self.nodes:
            host, port = self.addresses[name]
            reachable = self.reachable(name)  # the liveness placement and refusals use
            uri = self.amqp_uri if name == self.name else self.amqp_uris.get(name)
            nodes.append({"name": name, "reachable": reachable, "amqp_uri": uri,
                          # a node of its own has no inter-node listener
                          "address": f"{host}:{port}" if self.settings.clustered
                          else None})
        queues = []
        for queue in self.node.all_queues():
            members = queue.metadata_record().get("members")
            if members is None:
                continue  # a queue with no replicas (classic): not the cluster's
            queues.append({"vhost": queue.vhost, "name": queue.name,
                           "leader": queue.leader_id, "members": list(members),
                           "online": [n for n in members if self.reachable(n)]})
        return {"cluster_name": self.settings.cluster_name, "node": self.name,
                "metadata_leader": self.meta.leader_id,
                "metadata_members": sorted(self.meta.raft.members),
                "nodes": nodes, "queues": queues,
                # commands waiting for a leader's answer (forwarded, not yet appended),
                # and of those proxied ones a leader accepted: their reply to come
                "forwarding": len(self.pending),
                "awaiting_reply": sum(1 for p in self.pending.values() if p.accepted)}


_RPCS = {
    "propose": Cluster._on_propose,
    "accepted": Cluster._on_accepted,
    "redirect": Cluster._on_redirect,
    "transfer": Cluster._on_transfer,
    "ping": Cluster._on_ping,
    "reply": proxy.on_reply,
    "deliver": proxy.on_deliver,
    "stat": proxy.on_stat,
    "stat_reply": proxy.on_stat_reply,
    "downed": proxy.on_downed,
    "join": Cluster._on_join,
    "welcome": Cluster._on_welcome,
    **classic_link.handlers(),
    **mirror_link.handlers(),
    **replica_rpc.handlers(),
    **tracking.handlers(),
}

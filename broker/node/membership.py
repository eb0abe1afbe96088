"""Quorum-queue replicas: which nodes hold one, and moving toward what was asked.

Responsibilities: the replica-management operations of `rabbitmq-queues`, as
management RPCs (`quorumqueue queues add_member|delete_member|grow|shrink|rebalance`),
and removing a node from the cluster (`quorumqueue ctl forget_cluster_node`);
their refusals, in plain words, of anything that would leave a queue without a
majority of its members online; continuous membership reconciliation (the 4.2
guide's CMR); and, on every node, the loop that makes each group's Raft
configuration follow the queue record.

How it works: a queue record's `members` (replicated by the metadata group,
`queue.members`) is the membership asked for. Every node applies it: a node newly
named starts an empty replica as it applies the record (`named`), which learns the
log (or a snapshot) from the leader; a node no longer named drops its replica once
it does not lead and its group cannot need it (`_still_needed`: the leader no longer
replicates to it, or it never heard from one within JOIN_GRACE). The queue's leader
`reconcile`s about twice a second: one Raft configuration change at a time (thesis
§4.1), adds before removals, so a replacement never passes through a smaller group.
`rebalance` moves leaders only (Raft leadership transfer), never membership.

Invariant: a replica named in its group's Raft configuration is not dropped while
the leader replicates to it, so a change 'add X' the leader proposed is always
acknowledged by X (an 'add' followed at once by a 'remove' completes both), and X's
log and vote are not forgotten while they may count.

Not here: the Raft membership mechanics (broker/raft/membership.py), placement of new
queues (cluster.py `place`).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from ..amqp import spec
from ..amqp.errors import AMQPError
from ..groups import metadata as meta
from ..queues.settings import target_group_size
from ..raft.errors import NotLeader, ProposalRejected

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

log = logging.getLogger("quorumqueue.cluster")


def _refuse(detail: str) -> AMQPError:
    return AMQPError(spec.PRECONDITION_FAILED, detail)


def _quorum_queue(node: "Node", vhost: str, name: str):
    queues = node.vhosts.get(vhost).queues if vhost in node.vhosts else {}
    queue = queues.get(name)
    if queue is None:
        raise AMQPError(spec.NOT_FOUND, f"no queue '{name}' in vhost '{vhost}'")
    if not queue.REPLICATED:
        raise _refuse(f"queue '{name}' in vhost '{vhost}' is a {queue.type_name} queue: "
                      "only quorum queues have members")
    return queue


def _cluster(node: "Node"):
    if not node.settings.clustered:
        raise _refuse(f"node {node.settings.node_name} is not clustered: its quorum queues "
                      "have one member each (start it with cluster_formation.classic_config"
                      ".nodes)")
    return node.cluster


def _online(node: "Node", name: str) -> bool:
    """Running as `cluster status` shows it (the cluster's liveness)."""
    return node.cluster.reachable(name)


def _check_node(node: "Node", name: str) -> None:
    cluster = _cluster(node)
    if name not in cluster.nodes:
        raise _refuse(f"node {name} is not a member of this cluster (nodes: "
                      f"{', '.join(cluster.nodes)})")
    if not _online(node, name):
        raise _refuse(f"node {name} is not running or not reachable from "
                      f"{cluster.name}: a replica cannot be added there")


def _set_members(node: "Node", queue, members: list[str], done) -> None:
    data = meta.encode("queue.members", vhost=queue.vhost, name=queue.name,
                       group=queue.group, members=sorted(members))
    node.cluster.meta.propose_data(data, done)


def _majority_online(node: "Node", members: list[str]) -> bool:
    online = sum(1 for m in members if _online(node, m))
    return online > len(members) // 2


# ---------------------------------------------------------------- operations


def add_member(node: "Node", vhost: str, name: str, member: str, done) -> None:
    queue = _quorum_queue(node, vhost, name)
    _check_node(node, member)
    if member in queue.members:
        raise _refuse(f"{member} is already a member of quorum queue '{name}' in vhost "
                      f"'{vhost}'")
    if not _majority_online(node, list(queue.members)):
        raise _refuse(f"quorum queue '{name}' in vhost '{vhost}' has no majority of its "
                      "members online: membership cannot change until it has")
    _set_members(node, queue, [*queue.members, member],
                 lambda _reply: done({"vhost": vhost, "name": name,
                                      "members": sorted([*queue.members])}))


def delete_member(node: "Node", vhost: str, name: str, member: str, done) -> None:
    queue = _quorum_queue(node, vhost, name)
    _cluster(node)
    if member not in queue.members:
        raise _refuse(f"{member} is not a member of quorum queue '{name}' in vhost "
                      f"'{vhost}' (members: {', '.join(queue.members)})")
    remaining = [m for m in queue.members if m != member]
    if not remaining:
        raise _refuse(f"{member} is the last member of quorum queue '{name}' in vhost "
                      f"'{vhost}': delete the queue instead")
    if not _majority_online(node, remaining):
        online = [m for m in remaining if _online(node, m)]
        raise _refuse(f"deleting {member} would leave quorum queue '{name}' in vhost "
                      f"'{vhost}' with {len(online)} of {len(remaining)} members online, "
                      "less than a majority: it would become unavailable")
    _set_members(node, queue, remaining,
                 lambda _reply: done({"vhost": vhost, "name": name,
                                      "members": sorted(queue.members)}))


def _matching(node: "Node", vhost_pattern: str, queue_pattern: str):
    """Quorum queues whose vhost and name match the patterns (regular expressions
    found anywhere in the name, as rabbitmq-queues' --vhost-pattern/--queue-pattern)."""
    try:
        vhost_re, queue_re = re.compile(vhost_pattern), re.compile(queue_pattern)
    except re.error as error:
        raise _refuse(f"bad pattern: {error}") from None
    for vhost in sorted(node.vhosts):
        if not vhost_re.search(vhost):
            continue
        for name, queue in sorted(node.vhosts[vhost].queues.items()):
            if queue.REPLICATED and queue_re.search(name):
                yield queue


def grow(node: "Node", member: str, strategy: str, vhost_pattern: str, queue_pattern: str,
         done) -> None:
    """Add `member` to every matching queue (`all`), or to those with an even number
    of members (`even`), as `rabbitmq-queues grow` does."""
    if strategy not in ("all", "even"):
        raise _refuse(f"grow: strategy must be 'all' or 'even', got {strategy!r}")
    _check_node(node, member)
    results = []
    for queue in _matching(node, vhost_pattern, queue_pattern):
        size = len(queue.members)
        if member in queue.members or (strategy == "even" and size % 2):
            continue
        if not _majority_online(node, list(queue.members)):
            results.append({"vhost": queue.vhost, "name": queue.name, "size": size,
                            "result": "error: no majority of members online"})
            continue
        _set_members(node, queue, [*queue.members, member], lambda _reply: None)
        results.append({"vhost": queue.vhost, "name": queue.name, "size": size + 1,
                        "result": "ok"})
    done(results)


def shrink(node: "Node", member: str, errors_only: bool, done,
           vhost_pattern: str = ".*", queue_pattern: str = ".*") -> None:
    """Remove `member` from every queue it is a member of (`--errors-only`: only where
    its replica is not reachable), never below one member or a majority online. The
    patterns (not in rabbitmq-queues shrink) let the command line shrink one queue at
    a time to show its progress."""
    _cluster(node)
    results = []
    for queue in _matching(node, vhost_pattern, queue_pattern):
        if member not in queue.members:
            continue
        if errors_only and _online(node, member):
            continue
        remaining = [m for m in queue.members if m != member]
        if not remaining:
            result = "error: last member (delete the queue instead)"
        elif not _majority_online(node, remaining):
            result = "error: would leave less than a majority of members online"
        else:
            _set_members(node, queue, remaining, lambda _reply: None)
            result = "ok"
        results.append({"vhost": queue.vhost, "name": queue.name,
                        "size": len(remaining) if result == "ok" else len(queue.members),
                        "result": result})
    done(results)


def rebalance(node: "Node", vhost_pattern: str, queue_pattern: str, done) -> None:
    """Move queue leaders so every node leads about as many (leadership transfer to a
    caught-up member); membership is left as it is."""
    cluster = _cluster(node)
    queues = [q for q in _matching(node, vhost_pattern, queue_pattern) if q.leader_id]
    online = [n for n in cluster.nodes if _online(node, n)]
    counts = {n: 0 for n in online}
    for queue in queues:
        if queue.leader_id in counts:
            counts[queue.leader_id] += 1
    target = -(-len(queues) // max(1, len(online)))  # ceil
    moves = []
    for queue in queues:
        leader = queue.leader_id
        if counts.get(leader, 0) <= target:
            continue
        candidates = [m for m in queue.members if m in counts and counts[m] < target]
        if not candidates:
            continue
        to = min(candidates, key=lambda m: (counts[m], m))
        counts[leader] -= 1
        counts[to] += 1
        cluster.transfer_leadership(queue, to)
        moves.append({"vhost": queue.vhost, "name": queue.name, "from": leader, "to": to})
    done({"moves": moves, "leaders": counts})


def forget_node(node: "Node", name: str, done) -> None:
    """Remove a stopped node from the cluster for good (`rabbitmqctl
    forget_cluster_node`): the metadata group's `cluster.forget_node`, applied on every
    node; the metadata leader and the queues' leaders then drop it from their groups.
    Refused for the node this runs on, a node still running or reachable, and while
    the metadata group has no majority of its members online."""
    cluster = _cluster(node)
    if name == cluster.name:
        raise _refuse(f"cannot forget {name}: it is the node this command talks to; run "
                      "it against another node of the cluster")
    if name not in cluster.nodes:
        raise AMQPError(spec.NOT_FOUND, f"node {name} is not a member of this cluster "
                        f"(nodes: {', '.join(cluster.nodes)})")
    if _online(node, name):
        raise _refuse(f"node {name} is running (reachable from {cluster.name}): stop it "
                      "before forgetting it")
    if not _majority_online(node, list(cluster.meta.raft.members)):
        raise _refuse("the metadata group has no majority of its members online: the "
                      "cluster cannot change until it has")
    cluster.meta.propose_data(meta.encode("cluster.forget_node", name=name),
                              lambda _reply: done({"forgotten": name,
                                                   "nodes": list(cluster.nodes)}))


# ---------------------------------------------------------------- reconciliation


# a replica that joined and has heard from no leader is kept this long although the
# record no longer names its node: the leader may be about to propose adding it
JOIN_GRACE = 30.0


def named(node: "Node", queue) -> None:
    """The queue's record was applied naming this node a member (`queue.members`):
    its replica starts now, before any later record can be applied, not at the next
    `reconcile` (the record may no longer name it by then, while the leader, at its
    own tick, proposes adding it: a change no one would ever acknowledge). Not during
    a restart's replay, and never over a group this node still stores (`reconcile`
    decides those, as before)."""
    if (queue.REPLICATED and not queue.deleted and queue.raft is None
            and node.settings.node_name in queue.members
            and not node.cluster.meta.replay_until
            and queue.group not in node.quorum.store.groups()):
        node.quorum.join(queue)


def _still_needed(queue, me: str, now: float) -> bool:
    """Whether a replica the record no longer names may still be needed by its group:
    while its Raft configuration names it and the leader replicates to it (its
    acknowledgements may count until the leader's removal is appended, and its log
    and vote must not be forgotten while they may), and, for a replica that has heard
    from no leader yet, for JOIN_GRACE after it joined (an 'add' may be coming). A
    quiet follower (Raft quiescing: its group idle) hears nothing whether the leader
    still counts it or not: its timer runs again (`listen`), so its lease ends an
    election timeout later unless the leader replicates to it."""
    raft = queue.raft
    if me in raft.members:
        if not raft.needs_tick and raft.leader_id != me:
            raft.listen()
            queue.groups.ticking[queue.group] = None
        return raft.hears_leader
    return not raft.members and now - queue.joined_at < JOIN_GRACE


def reconcile(node: "Node") -> None:
    """On every node, about twice a second: leaders step their group's Raft
    configuration toward the record's members (one change at a time, adds first);
    replicas on nodes the record no longer names go away once they do not lead.
    Only the quorum queues in the groups' `membership_due` are looked at: a queue
    enters it when its record is applied or changes (Node.create_recorded_queue,
    Node.queue_changed) and after a Ready of its group as leader or as a member the
    record does not name (queues/quorum/groups.py `_watch`), and leaves it here once
    nothing is left to do; so an idle queue costs nothing per tick."""
    quorum = node.quorum
    _reconcile_metadata(node)
    due = quorum.membership_due
    for key in list(due):
        vhost = node.vhosts.get(key[0])
        queue = vhost.queues.get(key[1]) if vhost is not None else None
        if queue is None or not queue.REPLICATED or queue.deleted \
                or not _reconcile_queue(node, queue):
            due.pop(key, None)


def _reconcile_queue(node: "Node", queue) -> bool:
    """One step of `reconcile` for one queue; whether a later tick is to look again
    (a change to propose or in flight, a replica waiting to be dropped)."""
    quorum = node.quorum
    me = quorum.member
    wanted = set(queue.members)
    if queue.raft is None:
        if me in wanted:
            quorum.join(queue)
        return False  # a replica started here: its Readies bring it back
    if me not in wanted and not queue.is_leader:
        if not _still_needed(queue, me, quorum.now):
            node.drop_replica(queue)
            return False
        return True
    if not queue.is_leader:
        return False  # a leadership of its own comes with a Ready
    current = set(queue.raft.members)
    change = ({"add": sorted(wanted - current)[0]} if wanted - current
              else {"remove": sorted(current - wanted)[0]} if current - wanted
              else None)
    if change is None:
        return False
    try:
        queue.raft.propose_membership(**change)
    except (NotLeader, ProposalRejected):
        return True  # a change in flight, or no entry of this term committed yet
    log.info("quorum queue '%s' in vhost '%s': %s member %s", queue.name,
             queue.vhost, "adding" if "add" in change else "removing",
             change.get("add") or change.get("remove"))
    return True


def _reconcile_metadata(node: "Node") -> None:
    """The metadata group's members follow the cluster's nodes (a node that joined is
    added once its `cluster.add_node` is applied, a forgotten one removed once its
    `cluster.forget_node` is), one change at a time, adds first."""
    cluster = node.cluster
    meta_group = cluster.meta
    if not meta_group.is_leader:
        return
    members = set(meta_group.raft.members)
    missing = sorted(set(cluster.nodes) - members)
    extra = sorted(members & cluster.forgotten)
    if missing and cluster.reachable(missing[0]):
        change = {"add": missing[0]}
    elif extra:
        change = {"remove": extra[0]}
    else:
        return
    try:
        meta_group.raft.propose_membership(**change)
    except (NotLeader, ProposalRejected):
        return
    log.info("metadata group: %s %s", "adding" if "add" in change else "removing",
             missing[0] if "add" in change else extra[0])


def continuous_reconciliation(node: "Node", target_default: int | None,
                              auto_remove: bool) -> None:
    """The metadata leader grows queues below their target group size onto online
    nodes without a replica (CMR); with auto_remove, drops members on nodes no longer
    in the cluster. The server runs it periodically and a trigger_interval after each
    trigger event (node/node.py CMR_TRIGGERS: policy changes, nodes joining or
    forgotten)."""
    cluster = node.cluster
    if not cluster.meta.is_leader:
        return
    for queue in _matching(node, ".*", ".*"):
        # the argument, else a policy's target-group-size, else the configuration
        target = target_group_size(queue.arguments, node.policy_for(queue.vhost, "quorum",
                                                                    queue.name),
                                   target_default)
        members = list(queue.members)
        if auto_remove:
            members = [m for m in members if m in cluster.nodes] or members
        if target and len(members) < target:
            candidates = [n for n in cluster.nodes if n not in members and _online(node, n)]
            members += candidates[:target - len(members)]
        if sorted(members) != sorted(queue.members) and _majority_online(node, members):
            log.info("continuous membership reconciliation: quorum queue '%s' in vhost "
                     "'%s' members %s -> %s", queue.name, queue.vhost,
                     ",".join(queue.members), ",".join(sorted(members)))
            _set_members(node, queue, members, lambda _reply: None)


# ---------------------------------------------------------------- answered once visible

MEMBERSHIP_TIMEOUT = 30.0   # seconds a membership change has to show (request "timeout")


class NotVisible(AMQPError):
    """A membership change committed but not shown within its timeout."""

    @property
    def reply_text(self) -> str:
        return f"TIMEOUT - {self.detail}"


_PENDING = object()   # a membership change not committed yet


class Visible:
    """A membership command's answer, held until this node shows the change: made
    before the command runs, `watch`ed once it proposed without a refusal,
    `committed` with the command's result. The commit has metadata_store's
    operation_timeout (then `done(timed_out)`), the change `timeout` seconds from the
    commit to show (then `done(NotVisible)`), as the HTTP API waited before."""

    __slots__ = ("node", "member", "added", "deadline", "timeout", "timed_out", "_done",
                 "queues", "result", "watched", "answered")

    def __init__(self, node: "Node", member: str, added: bool, timeout: float,
                 timed_out: AMQPError, done) -> None:
        self.node = node
        self.member = member
        self.added = added
        self.timeout = timeout
        self.deadline = node.now + node.settings.metadata_timeout_ms / 1000  # the commit
        self.timed_out = timed_out
        self._done = done
        self.queues: list = []      # (vhost, name) still to show the change
        self.result = _PENDING
        self.watched = False
        self.answered = False       # done was called: it never is again

    def done(self, value) -> None:
        if not self.answered:
            self.answered = True
            self._done(value)

    def watch(self) -> None:
        if not self.watched:
            self.watched = True
            self.node.membership_waits.append(self)

    def committed(self, queues, result) -> None:
        self.queues, self.result = list(queues), result
        self.deadline = self.node.now + self.timeout
        self.watch()
        check_visible(self.node, self.node.now)


def shown_members(node: "Node", vhost: str, name: str):
    """(the queue's members as this node's API lists them, as its record asks for
    them), or None once the queue is gone. Where this node holds a replica, its Raft
    member's configuration: a replica just started knows no members until the
    leader sends it the configuration, which must then hold the change."""
    space = node.vhosts.get(vhost)
    queue = space.queues.get(name) if space is not None else None
    if queue is None:
        return None
    asked = sorted(queue.members)
    if node.settings.node_name in asked and getattr(queue, "raft", None) is None:
        return [], asked   # its replica here is not started yet: it shows none
    return sorted(queue.stats(node.settings.node_name)["members"]), asked


def check_visible(node: "Node", now: float) -> None:
    """Answer the membership commands whose change shows, or whose time ran out."""
    waits = node.membership_waits
    if not waits:
        return
    node.membership_waits = []
    for wait in waits:
        if wait.answered:
            continue
        if wait.result is _PENDING:
            if now >= wait.deadline:
                wait.done(wait.timed_out)
            else:
                node.membership_waits.append(wait)
            continue
        shown: dict = {}
        for key in list(wait.queues):
            found = shown_members(node, *key)
            if found is None:
                wait.queues.remove(key)   # deleted meanwhile: nothing left to show
                continue
            shown[key], asked = found
            if shown[key] == asked and (wait.member in asked) == wait.added:
                wait.queues.remove(key)
        if not wait.queues:
            result = wait.result
            if isinstance(result, dict) and "members" in result:
                key = (result["vhost"], result["name"])
                result = {**result, "members": shown.get(key, result["members"])}
            wait.done(result)
        elif now >= wait.deadline:
            vhost, name = wait.queues[0]
            did = "added to" if wait.added else "removed from"
            wait.done(NotVisible(spec.INTERNAL_ERROR, (
                f"{wait.member} was not {did} quorum queue '{name}' in vhost '{vhost}' "
                f"within {wait.timeout:g}s (members: {', '.join(shown[vhost, name])}); "
                "the change is committed and may still come: see quorumqueue cluster "
                "status")))
        else:
            node.membership_waits.append(wait)

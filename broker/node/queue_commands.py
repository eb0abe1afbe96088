"""Management RPC operations behind rabbitmq-queues' observability commands
(`quorumqueue queues quorum_status | check_if_node_is_quorum_critical | peek |
reclaim_quorum_memory`; the CLI is cli/main.py).

Operations (request fields -> result):
  queues.quorum_status  {vhost, name}  -> {node (this one), members: [row per member,
        sorted by node: Node Name, Raft State, Membership, Last Log Index, Last
        Written, Last Applied, Commit Index, Snapshot Index, Term]}; an unreachable
        member: Raft State "noproc", the rest empty (cluster/replica_rpc.py)
  queues.quorum_critical {}            -> {node, single_node, queues: [{vhost, name,
        readable_name}]}: the quorum queues with a member on this node whose running
        members are no more than a majority (stopping this node would lose it)
  queues.peek  {vhost, name, position} -> {node, message: [[key, value], ...]}
        (queues/quorum/peeked.py)
  queues.reclaim_quorum_memory {vhost, name} -> [{node, before, after} | {node,
        error}]: every member's node rolls its write-ahead log over
  queues.sync_mirrors {vhost, name, cancel} -> {synchronised: the mirrors whose
        synchronisation started, in the background} (rabbitmqctl sync_queue; errors
        `not_found`, `not_mirrored`); cancel (cancel_sync_queue) -> {synchronised: 0,
        answer: "ok" (the synchronisation in progress stopped) or "not_syncing"}
  queues.consumer_state {vhost, name} -> {node, replica (False: none here, the rest
        absent), role, term, leader, commit_index, applied_index, ready, unacked,
        active (the single active consumer's key or None), consumers: [{key,
        connection, order, priority, prefetch, unacked, suspected, cancelled,
        pull_only}], live: {node: boot} (the nodes this node hears pings from, as
        a leader proposes NodeDown/NodeUp by them: cluster/consumer_nodes.py)}: this
        node's replica as it is, not asked of the leader (a diagnosis: the fault
        suite prints it for every node when a run lost messages)
Errors carry RabbitMQ's texts (rabbitmq-queues 3.10.8 and 4.x) after the reply-code
name, e.g. `NOT_FOUND - Target queue was not found in virtual host '/'`.
All need a user tagged `administrator`.

A member counts as running for quorum_critical when it is this node's own replica
(present and started) or on a node this node heard from within
cluster.REACHABLE_WITHIN; RabbitMQ asks each running node for its members' Raft
states, which also catches a replica that crashed on a running node.

Not here: asking the members (cluster/replica_rpc.py), a member's row
(QuorumQueue.member_status) and a peeked message's rows (queues/quorum/peeked.py), the
banners and exit codes (cli/main.py).
"""

from __future__ import annotations

from typing import Any, Callable

from ..amqp import spec
from ..amqp.errors import AMQPError, not_found
from .management import Later, _require_administrator, _vhost


def _quorum_queue(node, session, request, missing: str | None, classic: str):
    """The quorum queue asked for; `missing`: RabbitMQ's text when it does not exist
    (None: ours), `classic`: its text for a classic queue."""
    _require_administrator(session)
    vhost = _vhost(node, session, request.get("vhost") or "/")
    queue = vhost.queues.get(request["name"])
    if queue is None:
        if missing is None:
            raise not_found("queue", request["name"], vhost.name)
        raise AMQPError(spec.NOT_FOUND, missing.format(vhost=vhost.name))
    if not queue.REPLICATED:  # a type with Raft members (queues/base.py)
        raise AMQPError(spec.PRECONDITION_FAILED, classic)
    return queue


def _members(queue) -> list[str]:
    return sorted(queue.raft.members if queue.raft is not None else queue.members)


def _gather(node, queue, op: str, args: dict, shape: Callable[[str, Any], Any]):
    """Ask every member for `op`; the answers, shaped, in member order."""
    from ..cluster import replica_rpc

    members = _members(queue)

    def start(done) -> None:
        answers: list = [None] * len(members)
        waiting = [len(members)]

        def answered(position: int, answer) -> None:
            answers[position] = shape(members[position], answer)
            waiting[0] -= 1
            if not waiting[0]:
                done(answers)

        for position, member in enumerate(members):
            replica_rpc.ask(node.cluster, member, queue.group, op, args,
                            lambda answer, position=position: answered(position, answer))

    return Later(start)


def _quorum_status(node, session, request):
    from ..cluster.replica_rpc import noproc

    queue = _quorum_queue(node, session, request, None,
                          "Cannot get quorum status of a classic queue")
    gathered = _gather(node, queue, "status", {},
                       lambda member, answer: answer if answer is not None
                       else noproc(member))
    return Later(lambda done: gathered.start(
        lambda rows: done({"node": node.cluster.name, "members": rows})))


def _reclaim(node, session, request):
    queue = _quorum_queue(node, session, request,
                          "Target queue was not found in virtual host '{vhost}'",
                          "This operation is not applicable to classic queues")
    return _gather(node, queue, "reclaim", {},
                   lambda member, answer: answer if answer is not None
                   else {"node": member, "error": "noproc"})


NO_MESSAGE = "Target queue does not have a message at that position"
BAD_POSITION = "position value must be a positive integer"


def _peek(node, session, request):
    from ..cluster import replica_rpc

    position = request.get("position")
    if isinstance(position, bool) or not isinstance(position, int) or position < 1:
        raise AMQPError(spec.PRECONDITION_FAILED, BAD_POSITION)
    queue = _quorum_queue(node, session, request,
                          "Target queue was not found in virtual host '{vhost}'",
                          "Cannot peek into a classic queue")
    cluster = node.cluster
    # only the leader answers (RabbitMQ asks it too); a node with no replica may not
    # have heard who leads: it asks the members in turn (the others decline)
    leader = queue.leader_id
    if leader is not None:
        candidates = [leader]
    elif queue.raft is None:
        candidates = [m for m in _members(queue) if cluster.seen_up(m)]
    else:
        candidates = []  # this member knows of no leader: none is elected

    def start(done) -> None:
        def answered(answer) -> None:
            if answer is None:
                done(AMQPError(spec.INTERNAL_ERROR, f"queue '{queue.name}' in vhost "
                               f"'{queue.vhost}' has no leader that answered within "
                               f"{replica_rpc.REPLY_TIMEOUT:g} s (none elected, or "
                               "not reachable)"))
            elif answer["message"] is None:
                done(AMQPError(spec.NOT_FOUND, NO_MESSAGE))
            else:
                done({"node": cluster.name, "message": answer["message"]})

        def ask(remaining: list[str]) -> None:
            if not remaining:
                answered(None)
                return
            replica_rpc.ask(cluster, remaining[0], queue.group, "peek",
                            {"position": position},
                            lambda answer: answered(answer) if answer is not None
                            else ask(remaining[1:]))

        ask(candidates)

    return Later(start)


def _quorum_critical(node, session, request) -> dict:
    _require_administrator(session)
    cluster = node.cluster
    me = cluster.name
    critical = []
    for vhost_name in sorted(node.vhosts):
        vhost = node.vhost(vhost_name)
        for queue in sorted(vhost.queues.values(), key=lambda q: q.name):
            if not queue.REPLICATED:
                continue
            members = _members(queue)
            if me not in members:
                continue  # RabbitMQ checks the node's local quorum queues
            local = node.quorum.queues.get(queue.group)
            here = local is not None and local.raft is not None and not local.deleted
            running = [m for m in members if (here if m == me else cluster.seen_up(m))]
            if len(running) <= len(members) // 2 + 1:
                critical.append({"vhost": vhost.name, "name": queue.name,
                                 "readable_name": f"queue '{queue.name}' in vhost "
                                                  f"'{vhost.name}'"})
    return {"node": me, "single_node": len(cluster.nodes) == 1, "queues": critical}


def _sync_mirrors(node, session, request):
    """rabbitmqctl sync_queue / cancel_sync_queue, answered by the queue's leader, with
    RabbitMQ 3.10.8's answers: not_found, not_mirrored, not_syncing."""
    _require_administrator(session)
    vhost = _vhost(node, session, request.get("vhost") or "/")
    queue = vhost.queues.get(request["name"])
    if queue is None:
        raise AMQPError(spec.NOT_FOUND, "not_found")
    cancel = bool(request.get("cancel"))
    if cancel and queue.mirrors is None:  # RabbitMQ answers {ok, not_syncing}
        return {"synchronised": 0, "answer": "not_syncing"}
    if queue.mirrors is None:  # rabbit_mirror_queue_misc: {error, not_mirrored}
        raise AMQPError(spec.PRECONDITION_FAILED, "not_mirrored")

    def answer(count: int | None):
        if count is None:
            return AMQPError(spec.NOT_FOUND, f"home node '{queue.metadata_record().get('host')}'"
                             f" of durable queue '{queue.name}' in vhost '{vhost.name}' is "
                             "down or inaccessible")
        if cancel:  # the synchronisation in progress stopped: ok; else {ok, not_syncing}
            return {"synchronised": 0, "answer": "ok" if count else "not_syncing"}
        return {"synchronised": count}

    return Later(lambda done: node.cluster.mirrors.sync(
        queue, lambda count: done(answer(count)), cancel=cancel))


def _consumer_state(node, session, request) -> dict:
    from ..cluster.consumer_nodes import live_boots

    queue = _quorum_queue(node, session, request, None,
                          "Cannot get the consumer state of a classic queue")
    cluster = node.cluster
    answer: dict[str, Any] = {"node": cluster.name, "replica": False}
    local = node.quorum.queues.get(queue.group)
    if local is None or local.raft is None:
        return answer
    raft, state = local.raft, local.state
    answer.update(
        replica=True, role=raft.role.value,
        term=raft.term, leader=raft.leader_id, commit_index=raft.commit_index,
        applied_index=raft.applied_index, ready=state.ready_count,
        unacked=sum(len(c.checked) for c in state.consumers.values()),
        active=state.active,
        consumers=[{"key": key, "connection": c.connection, "order": c.order,
                    "priority": c.priority, "prefetch": c.prefetch,
                    "unacked": len(c.checked), "suspected": c.suspected,
                    "cancelled": c.cancelled, "pull_only": c.pull_only}
                   for key, c in state.consumers.items()],
        live=live_boots(cluster))
    return answer


OPERATIONS: dict[str, Callable[..., Any]] = {
    "queues.consumer_state": _consumer_state,
    "queues.sync_mirrors": _sync_mirrors,
    "queues.quorum_status": _quorum_status,
    "queues.quorum_critical": _quorum_critical,
    "queues.peek": _peek,
    "queues.reclaim_quorum_memory": _reclaim,
}

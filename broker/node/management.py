"""The management operations, and the management RPC carrying them as JSON requests
over AMQP 0-9-1 (for the connector's leases, the jobs and other AMQP clients). The
management HTTP API runs the same operations for its users (management/changes.py
`operation`), and the command line reaches them only through that API.

Wire form (documented in docs/behaviour/management-rpc.md): a client publishes to the default
exchange with routing key `amq.quorumqueue.management`, `reply_to` set (direct
reply-to `amq.rabbitmq.reply-to` is the usual choice), a `correlation_id`, and a
JSON body `{"op": ..., ...arguments}`. The broker answers on `reply_to` with the same
correlation id and a JSON body `{"ok": true, "result": ...}` or
`{"ok": false, "error": "NAME - detail"}`.

Operations:
  queues.list    {vhost?}              -> [{vhost, name, type, durable, ready, unacked,
                                            consumers, bytes, leader, members, arguments,
                                            auto_delete, policy, operator_policy,
                                            effective_policy_definition,
                                            single_active_consumer_tag}]
                 (policy, operator_policy: the names of those that apply, "" for none;
                  effective_policy_definition: their merged definition, {} for none;
                  single_active_consumer_tag: None unless the queue has one)
  queues.purge   {vhost, name}         -> {"purged": n}
  queues.delete  {vhost, name, if_unused?, if_empty?} -> {"deleted": n}
  queues.add_member | queues.delete_member {vhost, name, node, timeout?}
  queues.grow    {node, strategy: all|even, vhost_pattern?, queue_pattern?, timeout?}
  queues.shrink  {node, errors_only?, vhost_pattern?, queue_pattern?, timeout?}
                 (answered once this node shows the change, as rabbitmq-queues
                  returns once it is applied; past `timeout` seconds, 30 by default:
                  "TIMEOUT - NODE was not added to ...", the change still committed)
  queues.rebalance {vhost_pattern?, queue_pattern?}   (broker/node/membership.py)
  queues.quorum_status | quorum_critical | peek | reclaim_quorum_memory |
                 consumer_state: see node/queue_commands.py
  cluster.status {}                    -> {cluster_name, node, metadata_leader,
                                            metadata_members,
                                            nodes: [{name, address, reachable, amqp_uri}],
                                            queues: [{vhost, name, leader, members, online}]}
  cluster.forget_node {node}           -> {forgotten, nodes}  (membership.forget_node)
  lease.grow | lease.settle | lease.release | lease.info: see node/leases.py
  users.* | vhosts.* | permissions.* | policies.* | operator_policies.*: see
                 node/definition_ops.py
  definitions.export | definitions.import: see node/definitions_json.py
Queue operations need a user tagged `administrator`, like rabbitmqctl.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from ..amqp import spec
from ..amqp.errors import AMQPError, not_found

if TYPE_CHECKING:  # pragma: no cover
    from .session import Session

ROUTING_KEY = "amq.quorumqueue.management"


class Later:
    """An operation's result that arrives once a log entry is applied: `start(done)`
    proposes it and arranges for `done(result)` to be called. A change of the metadata
    (`metadata`) is answered within metadata_store.operation_timeout, with an error
    if the metadata group did not apply it by then (groups/metadata.py)."""

    __slots__ = ("start", "metadata")

    def __init__(self, start: Callable[[Callable[[Any], None]], None],
                 metadata: bool = False) -> None:
        self.start = start
        self.metadata = metadata


def handle(node, session: "Session", body: bytes, respond: Callable[[dict], None]) -> None:
    """Run one request; `respond(document)` is called once, now or after the log
    entries the operation needs are applied."""
    try:
        request = json.loads(body)
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            raise ValueError("the body must be a JSON object with a string 'op'")
    except ValueError as error:
        respond({"ok": False, "error": f"SYNTAX_ERROR - {error}"})
        return
    operation = OPERATIONS.get(request["op"])
    if operation is None:
        respond({"ok": False, "error": f"NOT_IMPLEMENTED - unknown op '{request['op']}' "
                                       f"(known: {', '.join(sorted(OPERATIONS))})"})
        return
    try:
        result = operation(node, session, request)
        if isinstance(result, Later):
            answer = lambda value: respond(_outcome(value))  # noqa: E731
            if result.metadata:
                answer = node.cluster.meta.bounded(answer, node.now, _timed_out(node, request))
            result.start(answer)
            return
        respond({"ok": True, "result": result})
    except AMQPError as error:
        respond({"ok": False, "error": error.reply_text})
    except (KeyError, TypeError, ValueError) as error:
        respond({"ok": False, "error": f"PRECONDITION_FAILED - bad arguments for "
                                       f"'{request['op']}': {error!r}"})


def _timed_out(node, request: dict) -> AMQPError:
    if request["op"] == "queues.delete":
        command = {"op": "queue.delete", "vhost": request.get("vhost", "/"),
                   "name": request.get("name")}
    else:
        command = {"op": request["op"]}
    from ..groups.metadata import timed_out_text

    return AMQPError(spec.INTERNAL_ERROR, timed_out_text(command, node.settings.node_name))


def _outcome(value) -> dict:
    if isinstance(value, AMQPError):
        return {"ok": False, "error": value.reply_text}
    return {"ok": True, "result": value}


def _require_administrator(session: "Session") -> None:
    if "administrator" not in session.user.tags:
        raise AMQPError(spec.ACCESS_REFUSED, f"user '{session.user.name}' is not an "
                        "administrator")


def _vhost(node, session: "Session", name: str):
    vhost = node.vhost(name)
    if vhost is None or name not in session.user.vhosts:
        raise AMQPError(spec.NOT_FOUND, f"no vhost '{name}' for user '{session.user.name}'")
    return vhost


def queue_row(node, queue) -> dict[str, Any]:
    """One line of `queues list` (queues/base.py `stats`). bytes: message bodies still
    in the queue (ready and unacked, like RabbitMQ's message_bytes); a queue without
    a Raft group has this node as its leader and only member."""
    return queue.stats(node.settings.node_name)


def policy_columns(node, queue) -> dict[str, Any]:
    """rabbitmqctl list_queues' policy, operator_policy and effective_policy_definition
    of a queue (node/operator_policies.py), and its arguments as JSON values."""
    from ..field_values import plain
    from ..storage.metadata_store import encode_arguments
    from .operator_policies import merged_definition

    policy, operator = node.policies_for(queue.vhost, queue.type_name, queue.name)
    return {"policy": policy.name if policy is not None else "",
            "operator_policy": operator.name if operator is not None else "",
            "effective_policy_definition": merged_definition(policy, operator) or {},
            "auto_delete": queue.auto_delete,
            # as numbers: the file's {"$byte": 10} is how metadata.json keeps a type
            "arguments": encode_arguments({key: plain(value)
                                           for key, value in queue.arguments.items()})}


def _queues(node, session, request) -> list:
    _require_administrator(session)
    if request.get("vhost"):
        names = [_vhost(node, session, request["vhost"]).name]
    else:
        names = sorted(session.user.vhosts)
    queues = []
    for name in names:
        vhost = node.vhost(name)
        if vhost is not None:
            queues += sorted(vhost.queues.values(), key=lambda q: q.name)
    return queues


def _list(node, session, request):
    """Every queue of the vhosts asked for, with the counts of the node that serves it
    (a queue with no replica here asks a member), so every node lists the same."""
    queues = _queues(node, session, request)
    rows: list = [None] * len(queues)
    waiting = [len(queues)]

    def start(done) -> None:
        if not queues:
            done([])
        for position, queue in enumerate(queues):
            queue.stats_later(node.settings.node_name,
                              lambda row, position=position: answered(position, row, done))

    def answered(position: int, row: dict, done) -> None:
        rows[position] = {**row, **policy_columns(node, queues[position])}
        waiting[0] -= 1
        if not waiting[0]:
            done(rows)

    return Later(start)


def _purge(node, session, request) -> dict:
    _require_administrator(session)
    vhost = _vhost(node, session, request.get("vhost", "/"))
    queue = vhost.queues.get(request["name"])
    if queue is None:
        raise not_found("queue", request["name"], vhost.name)
    return Later(lambda done: node.purge_queue(queue, _PurgeAsker(done)))


class _PurgeAsker:
    """A management purge waiting for its count (queues/base.py Asker)."""

    __slots__ = ("done",)

    def __init__(self, done) -> None:
        self.done = done

    def purge_ok(self, count: int) -> None:
        self.done({"purged": count})

    def refused(self, error: AMQPError) -> None:
        self.done(error)


def _delete(node, session, request) -> dict:
    _require_administrator(session)
    vhost = _vhost(node, session, request.get("vhost", "/"))
    queue = vhost.queues.get(request["name"])
    if queue is None:
        raise not_found("queue", request["name"], vhost.name)
    def start(done) -> None:
        def refreshed() -> None:  # with the counts of the queue's host
            try:
                queue.check_delete(bool(request.get("if_unused")),
                                   bool(request.get("if_empty")))
            except AMQPError as error:
                done(error)
                return
            node.propose_delete(vhost, queue, lambda count: done({"deleted": count or 0}))

        queue.refresh(refreshed)

    return Later(start, metadata=True)


def _cluster_status(node, session, request) -> dict:
    _require_administrator(session)
    return node.cluster.status()


def _members_op(name: str):
    """queues.add_member | delete_member | grow | shrink | rebalance (membership.py)."""
    def operation(node, session, request):
        from . import membership

        _require_administrator(session)
        vhost, queue = request.get("vhost", "/"), request.get("name")
        vhost_pattern = request.get("vhost_pattern") or ".*"
        queue_pattern = request.get("queue_pattern") or ".*"
        calls = {
            "add_member": lambda done: membership.add_member(node, vhost, queue,
                                                             request["node"], done),
            "delete_member": lambda done: membership.delete_member(node, vhost, queue,
                                                                   request["node"], done),
            "grow": lambda done: membership.grow(node, request["node"],
                                                 request.get("strategy", "all"),
                                                 vhost_pattern, queue_pattern, done),
            "shrink": lambda done: membership.shrink(node, request["node"],
                                                     bool(request.get("errors_only")), done,
                                                     vhost_pattern, queue_pattern),
            "rebalance": lambda done: membership.rebalance(node, vhost_pattern,
                                                           queue_pattern, done),
        }
        timeout = request.get("timeout", membership.MEMBERSHIP_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError("timeout: expected a number of seconds >= 0")
        answered: dict = {}
        waiting: list = []

        def answer(result) -> None:
            if waiting:
                waiting[0](result)
            else:
                answered["result"] = result

        visible = membership.Visible(node, request.get("node"),
                                     name in ("add_member", "grow"), timeout,
                                     _timed_out(node, request), answer)

        def done(result) -> None:
            # committed (add, delete) or proposed (grow, shrink): answered once this
            # node shows the change, as rabbitmq-queues returns once it is applied
            if name == "rebalance" or isinstance(result, AMQPError):
                visible.done(result)
            elif name in ("add_member", "delete_member"):
                visible.committed([(vhost, queue)], result)
            else:
                visible.committed([(row["vhost"], row["name"]) for row in result
                                   if row["result"] == "ok"], result)

        calls[name](done)  # refusals raise now
        if "result" in answered:
            return answered["result"]
        if name != "rebalance":
            visible.watch()   # its commit, bounded by the timeout
        return Later(waiting.append, metadata=name == "rebalance")

    return operation


def _forget_node(node, session, request):
    from . import membership

    _require_administrator(session)
    return Later(lambda done: membership.forget_node(node, request["node"], done),
                 metadata=True)


OPERATIONS = {"queues.list": _list, "queues.purge": _purge, "queues.delete": _delete,
              "cluster.status": _cluster_status, "cluster.forget_node": _forget_node,
              **{f"queues.{name}": _members_op(name)
                 for name in ("add_member", "delete_member", "grow", "shrink", "rebalance")}}


def _register() -> None:
    from . import definition_ops, definitions_json, leases, queue_commands

    OPERATIONS.update(leases.OPERATIONS)
    OPERATIONS.update(definition_ops.OPERATIONS)
    OPERATIONS.update(definitions_json.OPERATIONS)
    OPERATIONS.update(queue_commands.OPERATIONS)


_register()

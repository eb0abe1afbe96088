"""The management API's operator commands: quorum queue membership and observability,
the cluster's status and forgetting a node, and the definitions import the command
line drives (`quorumqueue queues|ctl|cluster status`, which talk to a node only
over this API).

Endpoints (each one management operation of node/management.py, run as the HTTP
user: the same checks, texts and answers as before, answered once applied):
- RabbitMQ's own paths (its 3.13/4.x management API) where it has one:
  `POST /api/queues/quorum/V/NAME/replicas/add` `{"node"}` and
  `DELETE /api/queues/quorum/V/NAME/replicas/delete` `{"node"}` (rabbitmq-queues
  add_member, delete_member) -> `{"members": [...]}`;
  `POST /api/queues/quorum/replicas/on/NODE/grow` `{"strategy": "all"|"even",
  "vhost_pattern", "queue_pattern"}` and `DELETE
  /api/queues/quorum/replicas/on/NODE/shrink` `{"errors_only", "vhost_pattern",
  "queue_pattern"}` -> one row per queue `{vhost, name, size, result}` (RabbitMQ
  answers 204; the rows are quorumqueue's addition);
  `POST /api/rebalance/queues` `{"type": "quorum"|"all", "vhost_pattern",
  "queue_pattern"}` -> `{moves, leaders}`;
  `GET /api/queues/quorum/V/NAME/status` (rabbitmq-queues quorum_status) ->
  `{node, members: [one row per member]}`;
  `POST /api/queues/V/NAME/actions` `{"action": "sync"|"cancel_sync"}` -> 204, the
  leader's answer (`ok`, `not_syncing`) in the `X-Quorumqueue-Sync` header
  (rabbitmqctl sync_queue, cancel_sync_queue on a mirrored classic queue; as RabbitMQ
  3.x's plugin: 204 for a queue not mirrored too, 404 for a queue not there, 400
  `{unknown,<<"NAME">>}` for another action).
- quorumqueue's own, under `/api/quorumqueue/` (RabbitMQ's API has none):
  `GET .../cluster-status` (nodes, metadata leader, every quorum queue's leader,
  members and online members); `DELETE .../cluster-nodes/NODE` (rabbitmqctl
  forget_cluster_node); `GET .../queues/V/NAME/peek/POSITION` (rabbitmq-queues
  peek); `POST .../queues/V/NAME/reclaim-memory` (reclaim_quorum_memory);
  `GET .../quorum-critical` (check_if_node_is_quorum_critical's queues and this
  node's name); `POST .../definitions/import` `{"definitions", "vhost"?, "check"?}`
  -> `{commands, notes}` (RabbitMQ's `POST /api/definitions` answers 204 with
  neither; `check` builds the plan and applies nothing).
Membership commands (add, delete, grow, shrink) answer once the change is visible
(node/membership.py `Visible`, the same wait as the AMQP management RPC's): the
queue's members as this node's API lists them (its Raft member's configuration
where it holds a replica) include the added node or no longer the removed one, as
rabbitmq-queues returns once ra applied the change; a body's `timeout` (seconds,
default MEMBERSHIP_TIMEOUT) bounds the wait, after which the answer is 503 naming
the queue, the node and the members shown (the change is committed and may still
come).
All need the administrator tag (as rabbitmq-queues and rabbitmqctl need an
administrator here). Refusals are RabbitMQ's bodies with the operation's AMQP text
in the `X-Quorumqueue-Error` header (app.py).

Not here: the operations themselves (node/management.py, node/queue_commands.py,
node/membership.py, node/definitions_json.py).
"""

from __future__ import annotations

from .access import require
from .app import Answer, Request, bad_request, not_found, route
from .changes import operation

SYNC_HEADER = "X-Quorumqueue-Sync"  # a queue action's answer from the leader
MEMBERSHIP_TIMEOUT = 30.0  # seconds a membership change has to show (body "timeout")


def _timeout(body: dict) -> float:
    value = body.get("timeout", MEMBERSHIP_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise bad_request("timeout: expected a number of seconds >= 0")
    return float(value)


async def _body(request: Request, *required: str) -> dict:
    body = await request.json()
    for key in required:
        if key not in body:
            raise bad_request(f"[{{key_missing,{key}}}]")
    return body


def _patterns(body: dict) -> dict:
    return {"vhost_pattern": body.get("vhost_pattern") or ".*",
            "queue_pattern": body.get("queue_pattern") or ".*"}


@route("POST", "/api/queues/quorum/replicas/on/{node}/grow")
async def grow(request: Request):
    require(request.user, "administrator")
    body = await _body(request)
    return await operation(request, "queues.grow", node=request.captures["node"],
                           strategy=body.get("strategy", "all"), timeout=_timeout(body),
                           **_patterns(body))


@route("DELETE", "/api/queues/quorum/replicas/on/{node}/shrink")
async def shrink(request: Request):
    require(request.user, "administrator")
    body = await _body(request)
    return await operation(request, "queues.shrink", node=request.captures["node"],
                           errors_only=bool(body.get("errors_only")),
                           timeout=_timeout(body), **_patterns(body))


@route("POST", "/api/rebalance/queues")
async def rebalance(request: Request):
    require(request.user, "administrator")
    body = await _body(request)
    if body.get("type", "quorum") not in ("quorum", "all"):
        raise bad_request("type: expected quorum or all")
    return await operation(request, "queues.rebalance", **_patterns(body))


@route("POST", "/api/queues/quorum/{vhost}/{name}/replicas/add")
async def add_member(request: Request):
    require(request.user, "administrator")
    body = await _body(request, "node")
    return await operation(request, "queues.add_member", vhost=request.captures["vhost"],
                           name=request.captures["name"], node=body["node"],
                           timeout=_timeout(body))


@route("DELETE", "/api/queues/quorum/{vhost}/{name}/replicas/delete")
async def delete_member(request: Request):
    require(request.user, "administrator")
    body = await _body(request, "node")
    return await operation(request, "queues.delete_member",
                           vhost=request.captures["vhost"], name=request.captures["name"],
                           node=body["node"], timeout=_timeout(body))


@route("GET", "/api/queues/quorum/{vhost}/{name}/status")
async def quorum_status(request: Request):
    require(request.user, "administrator")
    return await operation(request, "queues.quorum_status", vhost=request.captures["vhost"],
                           name=request.captures["name"])


@route("POST", "/api/queues/{vhost}/{name}/actions")
async def queue_actions(request: Request):
    """RabbitMQ 3.x's queue actions (rabbit_mgmt_wm_queue_actions): `sync` answers once
    the leader started synchronising its mirrors (in the background, as RabbitMQ: the
    queue object's `state` is `syncing` with `sync_messages` until it ends);
    `cancel_sync` stops it. Both 204; the `X-Quorumqueue-Sync` header says what the
    leader answered (rabbitmqctl prints it): `ok`, or `not_syncing` for a
    cancel_sync with no synchronisation running."""
    require(request.user, "administrator")
    vhost, name = request.captures["vhost"], request.captures["name"]
    queues = getattr(request.node.vhosts.get(vhost), "queues", {})
    if name not in queues:
        raise not_found()
    body = await _body(request, "action")
    action = body["action"]
    if action not in ("sync", "cancel_sync"):
        raise bad_request(f'{{unknown,<<"{action}">>}}')
    answer = "ok" if action == "sync" else "not_syncing"
    if queues[name].mirrors is not None:
        result = await operation(request, "queues.sync_mirrors", vhost=vhost, name=name,
                                 cancel=action == "cancel_sync")
        answer = result.get("answer", "ok")
    return Answer(204, headers={SYNC_HEADER: answer})


@route("GET", "/api/quorumqueue/cluster-status")
async def cluster_status(request: Request):
    require(request.user, "administrator")
    return await operation(request, "cluster.status")


@route("DELETE", "/api/quorumqueue/cluster-nodes/{node}")
async def forget_node(request: Request):
    require(request.user, "administrator")
    return await operation(request, "cluster.forget_node", node=request.captures["node"])


@route("GET", "/api/quorumqueue/queues/{vhost}/{name}/peek/{position}")
async def peek(request: Request):
    require(request.user, "administrator")
    try:
        position = int(request.captures["position"])
    except ValueError:
        position = 0  # refused by the operation with rabbitmq-queues' text
    return await operation(request, "queues.peek", vhost=request.captures["vhost"],
                           name=request.captures["name"], position=position)


@route("POST", "/api/quorumqueue/queues/{vhost}/{name}/reclaim-memory")
async def reclaim_memory(request: Request):
    require(request.user, "administrator")
    return await operation(request, "queues.reclaim_quorum_memory",
                           vhost=request.captures["vhost"], name=request.captures["name"])


@route("GET", "/api/quorumqueue/quorum-critical")
async def quorum_critical(request: Request):
    require(request.user, "administrator")
    return await operation(request, "queues.quorum_critical")


@route("POST", "/api/quorumqueue/definitions/import")
async def import_definitions(request: Request):
    require(request.user, "administrator")
    body = await _body(request, "definitions")
    return await operation(request, "definitions.import", definitions=body["definitions"],
                           vhost=body.get("vhost"), check=bool(body.get("check")))

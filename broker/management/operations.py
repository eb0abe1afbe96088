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
Membership commands (add, delete, grow, shrink) answer once the change is visible:
the queue's members as this node's API lists them (its Raft member's configuration
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

import asyncio

from .access import require
from .app import Answer, Refused, Request, bad_request, not_found, route
from .changes import operation

SYNC_HEADER = "X-Quorumqueue-Sync"  # a queue action's answer from the leader
MEMBERSHIP_TIMEOUT = 30.0  # seconds a membership change has to show (body "timeout")
VISIBLE_POLL = 0.05  # seconds between two looks at the queue's members


def _timeout(body: dict) -> float:
    value = body.get("timeout", MEMBERSHIP_TIMEOUT)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise bad_request("timeout: expected a number of seconds >= 0")
    return float(value)


async def _members_shown(request: Request, vhost: str, name: str):
    """(the queue's members as this node's /api/queues shows them, as its record
    asks for them), or None once the queue is gone."""
    queue = getattr(request.node.vhosts.get(vhost), "queues", {}).get(name)
    if queue is None:
        return None
    [stats] = await request.api.later(lambda done: queue.stats_later(
        request.node.name, lambda row: done([row])))
    return sorted(stats["members"]), sorted(queue.members)


async def _visible(request: Request, changes: list[tuple[str, str]], member: str,
                   added: bool, timeout: float) -> dict[tuple[str, str], list[str]]:
    """Wait until each (vhost, name) shows `member` added (or removed), and its
    members as its record asks; the members shown, per queue. A queue deleted
    meanwhile is done; past `timeout`, a 503."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    shown: dict[tuple[str, str], list[str]] = {}
    waiting = list(changes)
    while True:
        for key in list(waiting):
            found = await _members_shown(request, *key)
            if found is None:
                waiting.remove(key)
                continue
            # shown as asked: a replica started here knows no members until the
            # leader sends it the configuration, which must then hold the change
            shown[key], asked = found
            if shown[key] == asked and (member in asked) == added:
                waiting.remove(key)
        if not waiting:
            return shown
        if loop.time() >= deadline:
            vhost, name = waiting[0]
            did = "added to" if added else "removed from"
            detail = (f"{member} was not {did} quorum queue '{name}' in vhost '{vhost}' "
                      f"within {timeout:g}s (members: {', '.join(shown[waiting[0]])}); "
                      "the change is committed and may still come: see quorumqueue "
                      "cluster status")
            raise Refused("timeout", detail, 503, amqp_text=f"TIMEOUT - {detail}")
        await asyncio.sleep(VISIBLE_POLL)


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
    timeout, node = _timeout(body), request.captures["node"]
    rows = await operation(request, "queues.grow", node=node,
                           strategy=body.get("strategy", "all"), **_patterns(body))
    await _visible(request, [(r["vhost"], r["name"]) for r in rows if r["result"] == "ok"],
                   node, True, timeout)
    return rows


@route("DELETE", "/api/queues/quorum/replicas/on/{node}/shrink")
async def shrink(request: Request):
    require(request.user, "administrator")
    body = await _body(request)
    timeout, node = _timeout(body), request.captures["node"]
    rows = await operation(request, "queues.shrink", node=node,
                           errors_only=bool(body.get("errors_only")), **_patterns(body))
    await _visible(request, [(r["vhost"], r["name"]) for r in rows if r["result"] == "ok"],
                   node, False, timeout)
    return rows


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
    timeout, vhost, name = _timeout(body), request.captures["vhost"], request.captures["name"]
    result = await operation(request, "queues.add_member", vhost=vhost, name=name,
                             node=body["node"])
    shown = await _visible(request, [(vhost, name)], body["node"], True, timeout)
    return {**result, "members": shown.get((vhost, name), result["members"])}


@route("DELETE", "/api/queues/quorum/{vhost}/{name}/replicas/delete")
async def delete_member(request: Request):
    require(request.user, "administrator")
    body = await _body(request, "node")
    timeout, vhost, name = _timeout(body), request.captures["vhost"], request.captures["name"]
    result = await operation(request, "queues.delete_member", vhost=vhost, name=name,
                             node=body["node"])
    shown = await _visible(request, [(vhost, name)], body["node"], False, timeout)
    return {**result, "members": shown.get((vhost, name), result["members"])}


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

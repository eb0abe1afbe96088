"""The management API's operator endpoints: vhost and user limits, closing a
connection, the aliveness test, the (empty) global parameters and topic
permissions.

- `/api/vhost-limits[/V]` GET, `/api/vhost-limits/V/NAME` PUT `{"value": N}` and
  DELETE: RabbitMQ's rows `{"vhost", "value": {name: n}}`, through the management
  operations of node/limits.py (`vhosts.set_limits` replaces a vhost's limits, so
  one name is set or removed by writing the others back); `/api/user-limits[/U]`,
  `/api/user-limits/U/NAME` likewise (`{"user", "value"}` rows).
- `DELETE /api/connections/NAME`: the connection is closed with `320
  CONNECTION_FORCED - Closed via management plugin` (or the `X-Reason` header's
  text), as RabbitMQ does; its own user or an administrator may. A connection on
  another node is closed by that node (clients.py `close_remote`); 404 if that node
  does not answer.
- `GET /api/aliveness-test/V`: declare the queue `aliveness-test`, publish a message
  to it and get it back through a direct connection; `{"status": "ok"}`.
- `/api/global-parameters`: quorumqueue has no global runtime parameters: an empty
  list, as a RabbitMQ without them. (`/api/parameters`, the shovels' runtime
  parameters, are in views.py and changes.py.)
"""

from __future__ import annotations

import time

from pamqp import commands

from ..amqp import spec
from . import clients
from .access import has, require, require_vhost
from .app import Answer, Request, bad_request, not_found, route
from .changes import _direct, operation


def _limit_rows(request: Request, vhost: str | None = None) -> list[dict]:
    node = request.node
    return [{"vhost": name, "value": dict(node.vhosts[name].limits)}
            for name in sorted(node.vhosts)
            if (vhost is None or name == vhost) and node.vhosts[name].limits]


@route("GET", "/api/vhost-limits")
async def vhost_limits(request: Request):
    require(request.user, "administrator")
    return _limit_rows(request)


@route("GET", "/api/vhost-limits/{vhost}")
async def one_vhost_limits(request: Request):
    require(request.user, "administrator")
    require_vhost(request.node, request.user, request.captures["vhost"])
    return _limit_rows(request, request.captures["vhost"])


@route("PUT", "/api/vhost-limits/{vhost}/{name}")
async def put_vhost_limit(request: Request):
    require(request.user, "administrator")
    vhost, name = request.captures["vhost"], request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    body = await request.json()
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    limits = {**request.node.vhosts[vhost].limits, name: body["value"]}
    await operation(request, "vhosts.set_limits", vhost=vhost, limits=limits)
    return Answer(204)


@route("DELETE", "/api/vhost-limits/{vhost}/{name}")
async def delete_vhost_limit(request: Request):
    require(request.user, "administrator")
    vhost, name = request.captures["vhost"], request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    current = request.node.vhosts[vhost].limits
    if name not in current:
        raise not_found()
    rest = {key: value for key, value in current.items() if key != name}
    if rest:
        await operation(request, "vhosts.set_limits", vhost=vhost, limits=rest)
    else:
        await operation(request, "vhosts.clear_limits", vhost=vhost)
    return Answer(204)


def _user_limit_rows(request: Request, user: str | None = None) -> list[dict]:
    return [{"user": account.name, "value": dict(account.limits)}
            for _key, account in sorted(request.node.users.users.items())
            if (user is None or account.name == user) and account.limits]


@route("GET", "/api/user-limits")
async def user_limits(request: Request):
    require(request.user, "administrator")
    return _user_limit_rows(request)


@route("GET", "/api/user-limits/{user}")
async def one_user_limits(request: Request):
    require(request.user, "administrator")
    if request.captures["user"] not in request.node.users.users:
        raise not_found()
    return _user_limit_rows(request, request.captures["user"])


@route("PUT", "/api/user-limits/{user}/{name}")
async def put_user_limit(request: Request):
    require(request.user, "administrator")
    user, name = request.captures["user"], request.captures["name"]
    if user not in request.node.users.users:
        raise not_found()
    body = await request.json()
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    await operation(request, "users.set_limits", name=user, limits={name: body["value"]})
    return Answer(204)


@route("DELETE", "/api/user-limits/{user}/{name}")
async def delete_user_limit(request: Request):
    require(request.user, "administrator")
    user, name = request.captures["user"], request.captures["name"]
    account = request.node.users.users.get(user)
    if account is None or name not in account.limits:
        raise not_found()
    await operation(request, "users.clear_limits", name=user, limit=name)
    return Answer(204)


@route("GET", "/api/topic-permissions")
async def topic_permissions(request: Request):
    require(request.user, "administrator")
    return []  # quorumqueue has no topic permissions


@route("DELETE", "/api/connections/{name}")
async def close_connection(request: Request):
    for session, peer, local in request.api.shell.client_connections():
        if f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}" != request.captures["name"]:
            continue
        if session.user is None or (session.user.name != request.user.name
                                    and not has(request.user, "administrator")):
            raise not_found()  # RabbitMQ hides others' connections
        reason = request.http.headers.get("X-Reason") or "Closed via management plugin"
        session.server_close(spec.CONNECTION_FORCED, reason, time.monotonic())
        request.node.dirty.add(session)
        request.api.shell.schedule_flush()
        return Answer(204)
    # another node's connection (management/clients.py): that node closes it
    name = request.captures["name"]
    for row in (await clients.gather(request))["connections"]:
        if row["name"] != name or row["node"] == request.node.name:
            continue
        if row["user"] != request.user.name and not has(request.user, "administrator"):
            raise not_found()  # RabbitMQ hides others' connections
        reason = request.http.headers.get("X-Reason") or "Closed via management plugin"
        if await clients.close_remote(request, row["node"], name, reason):
            return Answer(204)
    raise not_found()


@route("GET", "/api/aliveness-test/{vhost}")
async def aliveness_test(request: Request):
    vhost = request.captures["vhost"]
    require_vhost(request.node, request.user, vhost)
    async with _direct(request, vhost) as direct:
        await direct.call(commands.Queue.Declare(queue="aliveness-test"),
                          commands.Queue.DeclareOk)
        await direct.publish("", "aliveness-test", commands.Basic.Properties(),
                             b"test_message")
        got = await direct.get("aliveness-test")
        if got is not None:
            direct.cast(commands.Basic.Ack(delivery_tag=got.method.delivery_tag))
    if got is None or got.body != b"test_message":
        return Answer(503, {"status": "failed", "reason": "the message did not come back"})
    return {"status": "ok"}


@route("GET", "/api/global-parameters")
async def global_parameters(request: Request):
    require(request.user, "administrator")
    return []

"""The management API's changes (PUT, DELETE, POST), as RabbitMQ 3.10 answers them.

Responsibilities: declare and delete queues and exchanges, bind and unbind, purge,
publish and get (through a direct AMQP connection as the requesting user:
direct.py, so the vhost permissions and every AMQP check apply, as in RabbitMQ's
plugin); add and delete vhosts, users, permissions and policies (through the
management operations of node/management.py, the ones `quorumqueue ctl` uses, which
go through the metadata group and answer once applied).

Answers, checked against RabbitMQ 3.10.8: 201 for a PUT that created, 204 for one
that changed an existing object and for DELETE; 400 `bad_request` with the AMQP
reply text's detail for a refusal (`inequivalent arg 'durable' for queue 'q' in
vhost '/': received 'false' but current is 'true'`), 404 for what does not exist,
401 `not_authorised` for ACCESS_REFUSED.

Policies and operator policies share one PUT and one DELETE handler (the same body
and answers); an operator policy refuses the keys RabbitMQ does not let it set
(node/operator_policies.py).

Not here: reading (views.py), HTTP plumbing (app.py).
"""

from __future__ import annotations

import base64
import json
from types import SimpleNamespace
from urllib.parse import quote

from pamqp import commands

from ..amqp.errors import AMQPError
from ..field_values import Timestamp
from ..node import management
from . import rows
from .access import require, require_vhost
from .app import Answer, Refused, Request, bad_request, not_found, refusal_of, route
from .direct import DirectConnection, method

TRUE, FALSE = ("true", True), ("false", False)
PROPERTY_NAMES = {"content_type": "content_type", "content_encoding": "content_encoding",
                  "headers": "headers", "delivery_mode": "delivery_mode",
                  "priority": "priority", "correlation_id": "correlation_id",
                  "reply_to": "reply_to", "expiration": "expiration",
                  "message_id": "message_id", "timestamp": "timestamp",
                  "type": "message_type", "user_id": "user_id", "app_id": "app_id",
                  "cluster_id": "cluster_id"}
ACK_MODES = {"ack_requeue_true": ("reject", True), "ack_requeue_false": ("ack", None),
             "reject_requeue_true": ("nack", True), "reject_requeue_false": ("reject", False)}


def _flag(body: dict, key: str, default: bool) -> bool:
    """A boolean field: JSON true/false or rabbitmqadmin's "true"/"false"."""
    value = body.get(key, default)
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise bad_request(f"{key}: expected true or false, got {value!r}")


def _arguments(body: dict) -> dict:
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise bad_request(f"arguments: expected a JSON object, got {arguments!r}")
    return arguments


def _direct(request: Request, vhost: str) -> DirectConnection:
    require_vhost(request.node, request.user, vhost)
    return DirectConnection(request.api.shell, request.user.name, request.password, vhost,
                            request.peer_host)


# ---------------------------------------------------------------- queues


@route("PUT", "/api/queues/{vhost}/{name}")
async def put_queue(request: Request):
    vhost, name = request.captures["vhost"], request.captures["name"]
    body = await request.json()
    arguments = _arguments(body)
    if body.get("queue_type"):
        arguments["x-queue-type"] = body["queue_type"]
    durable = _flag(body, "durable", True)
    auto_delete = _flag(body, "auto_delete", False)
    existed = vhost in request.node.vhosts and name in request.node.vhosts[vhost].queues
    async with _direct(request, vhost) as direct:
        await direct.call(method(commands.Queue.Declare, queue=name, durable=durable,
                                 auto_delete=auto_delete, arguments=arguments),
                          commands.Queue.DeclareOk)
    return Answer(204 if existed else 201)


@route("DELETE", "/api/queues/{vhost}/{name}")
async def delete_queue(request: Request):
    vhost, name = request.captures["vhost"], request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    if name not in request.node.vhosts[vhost].queues:
        raise not_found()
    async with _direct(request, vhost) as direct:
        deleted = await direct.call(method(commands.Queue.Delete,
            queue=name, if_unused=request.query.get("if-unused") == "true",
            if_empty=request.query.get("if-empty") == "true"), commands.Queue.DeleteOk)
    return Answer(204, headers=_count(deleted))


# delete-ok's and purge-ok's message_count, for `quorumqueue queues purge|delete`
# (RabbitMQ's 204 has no body; the header adds the count without changing it)
COUNT_HEADER = "X-Quorumqueue-Message-Count"


def _count(reply) -> dict:
    count = getattr(reply, "message_count", None)
    return {COUNT_HEADER: str(count)} if isinstance(count, int) else {}


@route("DELETE", "/api/queues/{vhost}/{name}/contents")
async def purge_queue(request: Request):
    vhost, name = request.captures["vhost"], request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    if name not in request.node.vhosts[vhost].queues:
        raise not_found()
    async with _direct(request, vhost) as direct:
        purged = await direct.call(method(commands.Queue.Purge, queue=name),
                                   commands.Queue.PurgeOk)
    return Answer(204, headers=_count(purged))


@route("POST", "/api/queues/{vhost}/{name}/get")
async def get_messages(request: Request):
    """RabbitMQ's "get messages": `count` basic.gets, then each message settled as
    `ackmode` says; payloads as UTF-8 text when they are (`encoding` auto) else
    base64, cut to `truncate` bytes. All gets come first, then the settlements, so
    one call never returns the same message twice."""
    vhost, name = request.captures["vhost"], request.captures["name"]
    body = await request.json()
    try:
        count = int(body.get("count", 1))
        truncate = int(body["truncate"]) if body.get("truncate") not in (None, "") else None
    except (TypeError, ValueError):
        raise bad_request("count and truncate must be integers") from None
    mode = ACK_MODES.get(body.get("ackmode", "ack_requeue_true"))
    if mode is None:
        raise bad_request(f"ackmode: expected one of {', '.join(ACK_MODES)}")
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise bad_request("encoding: expected auto or base64")
    require_vhost(request.node, request.user, vhost)
    if name not in request.node.vhosts[vhost].queues:
        raise not_found()
    answer = []
    async with _direct(request, vhost) as direct:
        got = []
        for _ in range(count):
            message = await direct.get(name)
            if message is None:
                break
            got.append(message)
        settle, requeue = mode
        for message in got:
            tag = message.method.delivery_tag
            if settle == "ack":
                direct.cast(commands.Basic.Ack(delivery_tag=tag))
            elif settle == "nack":
                direct.cast(commands.Basic.Nack(delivery_tag=tag, requeue=requeue))
            else:
                direct.cast(commands.Basic.Reject(delivery_tag=tag, requeue=requeue))
        for message in got:
            answer.append(_message_row(message, encoding, truncate))
    return answer


def _message_row(message, encoding: str, truncate: int | None) -> dict:
    payload = message.body
    shown = payload[:truncate] if truncate is not None else payload
    text = None
    if encoding == "auto":
        try:
            text = shown.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    properties = {}
    for field, attribute in PROPERTY_NAMES.items():
        value = getattr(message.properties, attribute, None)
        if value not in (None, "") and not (field == "headers" and value == {}):
            properties[field] = rows.json_value(value)
    method = message.method
    return {"payload_bytes": len(payload), "redelivered": method.redelivered,
            "exchange": method.exchange, "routing_key": method.routing_key,
            "message_count": method.message_count, "properties": properties,
            "payload": text if text is not None else base64.b64encode(shown).decode(),
            "payload_encoding": "string" if text is not None else "base64"}


# ---------------------------------------------------------------- exchanges


@route("PUT", "/api/exchanges/{vhost}/{name}")
async def put_exchange(request: Request):
    vhost, name = request.captures["vhost"], request.captures["name"]
    body = await request.json()
    if "type" not in body:
        raise bad_request("[{key_missing,type}]")  # RabbitMQ's words
    existed = vhost in request.node.vhosts and name in request.node.vhosts[vhost].exchanges
    async with _direct(request, vhost) as direct:
        await direct.call(method(commands.Exchange.Declare,
            exchange=name, exchange_type=str(body["type"]),
            durable=_flag(body, "durable", True), auto_delete=_flag(body, "auto_delete", False),
            internal=_flag(body, "internal", False), arguments=_arguments(body)),
            commands.Exchange.DeclareOk)
    return Answer(204 if existed else 201)


@route("DELETE", "/api/exchanges/{vhost}/{name}")
async def delete_exchange(request: Request):
    vhost, name = request.captures["vhost"], request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    if name not in request.node.vhosts[vhost].exchanges:
        raise not_found()
    async with _direct(request, vhost) as direct:
        await direct.call(method(commands.Exchange.Delete,
            exchange=name, if_unused=request.query.get("if-unused") == "true"),
            commands.Exchange.DeleteOk)
    return Answer(204)


@route("POST", "/api/exchanges/{vhost}/{name}/publish")
async def publish(request: Request):
    vhost, name = request.captures["vhost"], request.captures["name"]
    body = await request.json()
    for key in ("routing_key", "payload", "payload_encoding", "properties"):
        if key not in body:
            raise bad_request(f"[{{key_missing,{key}}}]")
    payload = body["payload"]
    if body["payload_encoding"] == "string":
        data = str(payload).encode("utf-8")
    elif body["payload_encoding"] == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except (ValueError, TypeError):
            raise bad_request("payload is not valid base64") from None
    else:
        raise bad_request(f"payload_encoding: expected string or base64, got "
                          f"{body['payload_encoding']!r}")
    properties = _properties(body["properties"])
    exchange = "" if name == "amq.default" else name
    require_vhost(request.node, request.user, vhost)
    if exchange not in request.node.vhosts[vhost].exchanges:
        raise not_found()
    async with _direct(request, vhost) as direct:
        routed = await direct.publish(exchange, str(body["routing_key"]), properties, data)
    return {"routed": routed}


def _properties(given) -> commands.Basic.Properties:
    if not isinstance(given, dict):
        raise bad_request("properties: expected a JSON object")
    values = {}
    for key, value in given.items():
        attribute = PROPERTY_NAMES.get(key)
        if attribute is None:
            raise bad_request(f"properties: unknown property '{key}'")
        if key in ("delivery_mode", "priority"):
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad_request(f"properties: {key} must be an integer")
        elif key == "timestamp":
            if not isinstance(value, int) or isinstance(value, bool) \
                    or not 0 <= value < 2 ** 64:
                raise bad_request("properties: timestamp must be an integer")
            value = Timestamp(value)
        elif key == "headers":
            if not isinstance(value, dict):
                raise bad_request("properties: headers must be a JSON object")
        elif not isinstance(value, str):
            raise bad_request(f"properties: {key} must be a string")
        values[attribute] = value
    return commands.Basic.Properties(**values)


# ---------------------------------------------------------------- bindings


_KINDS = {"q": "queue", "e": "exchange"}


@route("POST", "/api/bindings/{vhost}/e/{source}/{kind}/{destination}")
async def post_binding(request: Request):
    captures = request.captures
    vhost, kind = captures["vhost"], _KINDS.get(captures["kind"])
    if kind is None:
        raise not_found()
    body = await request.json()
    routing_key = str(body.get("routing_key", ""))
    arguments = _arguments(body)
    async with _direct(request, vhost) as direct:
        if kind == "queue":
            await direct.call(method(commands.Queue.Bind,
                queue=captures["destination"], exchange=captures["source"],
                routing_key=routing_key, arguments=arguments), commands.Queue.BindOk)
        else:
            await direct.call(method(commands.Exchange.Bind,
                destination=captures["destination"], source=captures["source"],
                routing_key=routing_key, arguments=arguments), commands.Exchange.BindOk)
    key = rows.properties_key(routing_key, arguments)
    location = "/api/bindings/{}/e/{}/{}/{}/{}".format(
        *(quote(part, safe="") for part in (vhost, captures["source"], captures["kind"],
                                            captures["destination"], key)))
    return Answer(201, None, {"Location": location})


@route("DELETE", "/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}")
async def delete_binding(request: Request):
    from .views import between

    captures = request.captures
    # the key as the URL carries it once unquoted; a client that did not quote `%`
    # (curl .../a.%23 for the key a.%23) is understood too
    wanted = {captures["props"], quote(captures["props"], safe="~")}
    found = [row for row in between(request) if row["properties_key"] in wanted]
    if not found:
        raise not_found()
    row = found[0]
    vhost = captures["vhost"]
    space = request.node.vhosts[vhost]
    arguments = next((b.arguments_dict for b in space.bindings()
                      if b.source == row["source"] and b.destination.name == row["destination"]
                      and b.destination.kind == row["destination_type"]
                      and b.routing_key == row["routing_key"]
                      and rows.properties_key(b.routing_key, b.arguments_dict)
                      == row["properties_key"]), {})
    async with _direct(request, vhost) as direct:
        if row["destination_type"] == "queue":
            await direct.call(method(commands.Queue.Unbind,
                queue=row["destination"], exchange=row["source"],
                routing_key=row["routing_key"], arguments=arguments), commands.Queue.UnbindOk)
        else:
            await direct.call(method(commands.Exchange.Unbind,
                destination=row["destination"], source=row["source"],
                routing_key=row["routing_key"], arguments=arguments),
                commands.Exchange.UnbindOk)
    return Answer(204)


# ---------------------------------------------------------------- definitions


async def operation(request: Request, op: str, **fields):
    """One management operation (node/management.py) as the requesting user; its
    result, or the refusal as an HTTP answer (a membership change not shown within
    its `timeout`: 503)."""
    document = json.dumps({"op": op, **fields}).encode()
    caller = SimpleNamespace(user=request.user)
    outcome = await request.api.later(
        lambda done: management.handle(request.node, caller, document, done),
        timeout=max(60.0, fields.get("timeout", 0) + 30.0))
    if not outcome["ok"]:
        name, _separator, _detail = outcome["error"].partition(" - ")
        if name == "TIMEOUT":
            raise Refused("timeout", _detail, 503, amqp_text=outcome["error"])
        code = {"NOT_FOUND": 404, "ACCESS_REFUSED": 403}.get(name, 406)
        refusal = refusal_of(AMQPError(code, _detail or outcome["error"]))
        refusal.amqp_text = outcome["error"]
        raise refusal
    return outcome["result"]


@route("PUT", "/api/vhosts/{vhost}")
async def put_vhost(request: Request):
    require(request.user, "administrator")
    name = request.captures["vhost"]
    await request.json()
    if name in request.node.vhosts:
        return Answer(204)
    await operation(request, "vhosts.add", name=name)
    # as RabbitMQ's PUT /api/vhosts: the creating user gets full permissions in it
    await operation(request, "permissions.set", vhost=name, user=request.user.name,
                    configure=".*", write=".*", read=".*")
    return Answer(201)


@route("DELETE", "/api/vhosts/{vhost}")
async def delete_vhost(request: Request):
    require(request.user, "administrator")
    name = request.captures["vhost"]
    if name not in request.node.vhosts:
        raise not_found()
    await operation(request, "vhosts.delete", name=name)
    return Answer(204)


def _tags(body: dict) -> list[str]:
    tags = body.get("tags", [])
    if isinstance(tags, str):
        return [tag.strip() for tag in tags.split(",") if tag.strip()]
    if isinstance(tags, list) and all(isinstance(tag, str) for tag in tags):
        return tags
    raise bad_request("tags: expected a list or a comma-separated string")


@route("PUT", "/api/users/{name}")
async def put_user(request: Request):
    require(request.user, "administrator")
    name = request.captures["name"]
    body = await request.json()
    if "tags" not in body:
        raise bad_request("[{key_missing,tags}]")
    tags = _tags(body)
    if "password_hash" in body and "password" not in body:
        raise bad_request("password_hash: quorumqueue takes a password (hashed on the "
                          "node); importing hashes is not supported yet")
    exists = name in request.node.users.users
    if exists:
        if "password" in body:
            await operation(request, "users.change_password", name=name,
                            password=body["password"])
        await operation(request, "users.set_tags", name=name, tags=tags)
        return Answer(204)
    if "password" not in body:
        raise bad_request("[{key_missing,password}]")
    await operation(request, "users.add", name=name, password=body["password"], tags=tags)
    return Answer(201)


@route("DELETE", "/api/users/{name}")
async def delete_user(request: Request):
    require(request.user, "administrator")
    name = request.captures["name"]
    if name not in request.node.users.users:
        raise not_found()
    await operation(request, "users.delete", name=name)
    return Answer(204)


@route("PUT", "/api/permissions/{vhost}/{user}")
async def put_permissions(request: Request):
    require(request.user, "administrator")
    vhost, user = request.captures["vhost"], request.captures["user"]
    body = await request.json()
    for key in ("configure", "write", "read"):
        if key not in body:
            raise bad_request(f"[{{key_missing,{key}}}]")
    account = request.node.users.users.get(user)
    if account is None or vhost not in request.node.vhosts:
        raise not_found()
    existed = vhost in account.permissions
    await operation(request, "permissions.set", vhost=vhost, user=user,
                    configure=body["configure"], write=body["write"], read=body["read"])
    return Answer(204 if existed else 201)


@route("DELETE", "/api/permissions/{vhost}/{user}")
async def delete_permissions(request: Request):
    require(request.user, "administrator")
    vhost, user = request.captures["vhost"], request.captures["user"]
    account = request.node.users.users.get(user)
    if account is None or vhost not in account.permissions:
        raise not_found()
    await operation(request, "permissions.clear", vhost=vhost, user=user)
    return Answer(204)


# a policy and an operator policy: the same body and answers (rabbit_mgmt_wm_policy,
# rabbit_mgmt_wm_operator_policy), a management operation and a tag of their own each
_POLICY_KINDS = {"policies": ("policymaker", "policies"),
                 "operator-policies": ("administrator", "operator_policies")}


async def _put_any_policy(request: Request, kind: str) -> Answer:
    tag, operations = _POLICY_KINDS[kind]
    require(request.user, tag)
    vhost, name = request.captures["vhost"], request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    body = await request.json()
    for key in ("pattern", "definition"):
        if key not in body:
            raise bad_request(f"[{{key_missing,{key}}}]")
    try:
        priority = int(body.get("priority", 0) or 0)
    except (TypeError, ValueError):
        raise bad_request("priority: expected an integer") from None
    existed = name in getattr(request.node, operations).get(vhost, {})
    await operation(request, f"{operations}.set", vhost=vhost, name=name,
                    pattern=body["pattern"], definition=body["definition"],
                    priority=priority, apply_to=body.get("apply-to") or "all")
    return Answer(204 if existed else 201)


async def _delete_any_policy(request: Request, kind: str) -> Answer:
    tag, operations = _POLICY_KINDS[kind]
    require(request.user, tag)
    vhost, name = request.captures["vhost"], request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    if name not in getattr(request.node, operations).get(vhost, {}):
        raise not_found()
    await operation(request, f"{operations}.clear", vhost=vhost, name=name)
    return Answer(204)


@route("PUT", "/api/policies/{vhost}/{name}")
async def put_policy(request: Request):
    return await _put_any_policy(request, "policies")


@route("DELETE", "/api/policies/{vhost}/{name}")
async def delete_policy(request: Request):
    return await _delete_any_policy(request, "policies")


@route("PUT", "/api/operator-policies/{vhost}/{name}")
async def put_operator_policy(request: Request):
    """rabbitmqctl set_operator_policy over HTTP (node/operator_policies.py): the
    body of a policy; keys an operator policy may not set are refused."""
    return await _put_any_policy(request, "operator-policies")


@route("DELETE", "/api/operator-policies/{vhost}/{name}")
async def delete_operator_policy(request: Request):
    return await _delete_any_policy(request, "operator-policies")


# ---------------------------------------------------------------- runtime parameters


@route("PUT", "/api/parameters/{component}/{vhost}/{name}")
async def put_parameter(request: Request):
    """rabbitmqctl set_parameter over HTTP (rabbit_mgmt_wm_parameter): the body's
    `value` (a shovel's keys: broker/shovel/); a refused value is a 400 with the
    text set_parameter prints."""
    require(request.user, "policymaker")
    component, vhost = request.captures["component"], request.captures["vhost"]
    name = request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    body = await request.json()
    if not isinstance(body, dict) or "value" not in body:
        raise bad_request("[{key_missing,value}]")
    existed = (component, vhost, name) in request.node.parameters
    await operation(request, "parameters.set", vhost=vhost, component=component, name=name,
                    value=body["value"])
    return Answer(204 if existed else 201)


@route("DELETE", "/api/parameters/{component}/{vhost}/{name}")
async def delete_parameter(request: Request):
    require(request.user, "policymaker")
    component, vhost = request.captures["component"], request.captures["vhost"]
    name = request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    if (component, vhost, name) not in request.node.parameters:
        raise not_found()
    await operation(request, "parameters.clear", vhost=vhost, component=component,
                    name=name)
    return Answer(204)

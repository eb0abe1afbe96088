"""The management API's read endpoints (GET), RabbitMQ 3.10's paths and fields.

Responsibilities: overview, nodes, connections, channels, consumers, queues,
exchanges, bindings, vhosts, users, permissions, policies, operator policies,
whoami, extensions, health checks and the definitions export; and quorumqueue's own
`/api/queues/V/NAME/raft` (a quorum queue's Raft members, for the web UI). Each handler checks
the caller's tag (access.py), reads the node and returns rows (rows.py).

How it works: a queue's counts come through the queue-type interface's
`stats_later`, which asks the member that serves a quorum queue when this node holds
no replica, so every node of a cluster answers the same for the same queue; the
message_stats (the overview's and each queue's) are every node's counters summed
(rates.py `gather`); the connections, channels and consumers (their lists and the
overview's object_totals) are every reachable node's (clients.py `gather`).

Not here: changes (changes.py), HTTP plumbing (app.py).
"""

from __future__ import annotations

import shutil

from . import clients, rows
from .access import has, login_vhosts, require, require_vhost, visible_vhosts
from .app import Answer, Request, bad_request, not_found, route
from .rates import Totals

# ---------------------------------------------------------------- helpers


def _vhost_names(request: Request) -> list[str]:
    """The vhost in the URL (checked), else every vhost the user logs in to."""
    vhost = request.captures.get("vhost")
    if vhost is not None:
        require_vhost(request.node, request.user, vhost)
        return [vhost]
    return login_vhosts(request.node, request.user)


async def queue_rows(request: Request, vhosts: list[str], name: str | None = None,
                     totals=None) -> list:
    """The rows of the queues of `vhosts` (or the one named), with the cluster's
    message_stats (`totals` from rates.gather, gathered here if not given)."""
    node = request.node
    queues = [queue for vhost in vhosts
              for queue in sorted(node.vhosts[vhost].queues.values(), key=lambda q: q.name)
              if name is None or queue.name == name]
    if not queues:
        return []
    found: list = [None] * len(queues)
    waiting = [len(queues)]

    def start(done) -> None:
        for position, queue in enumerate(queues):
            queue.stats_later(node.name, lambda stats, position=position: counted(
                position, stats, done))

    def counted(position: int, stats: dict, done) -> None:
        found[position] = stats
        waiting[0] -= 1
        if not waiting[0]:
            done(found)

    if totals is None:  # first: a silent node may hold it up to REPLY_TIMEOUT
        totals = await request.api.rates.gather()
    # then the queues' leaders and members, as they stand when the answer leaves
    stats = await request.api.later(start)
    online = [name for name in node.cluster.nodes if node.cluster.seen_up(name)]
    rates = request.api.rates
    return [{**rows.queue_row(node, queue, row, online), **rates.details(queue.vhost, queue.name),
             "message_stats": rates.queue_message_stats(queue, totals)}
            for queue, row in zip(queues, stats)]


async def _clients(request: Request) -> dict[str, list[dict]]:
    """The cluster's client rows (clients.py `gather`) this user may see: every
    user's connections and channels for a monitoring user, else the user's own; the
    consumers on the vhosts the user logs in to."""
    found = await clients.gather(request)
    everyone = has(request.user, "monitoring")
    vhosts = set(login_vhosts(request.node, request.user))
    return {
        "connections": [row for row in found["connections"]
                        if everyone or row["user"] == request.user.name],
        "channels": [row for row in found["channels"]
                     if everyone or row["user"] == request.user.name],
        "consumers": [row for row in found["consumers"] if row["queue"]["vhost"] in vhosts],
    }


# ---------------------------------------------------------------- overview, nodes


@route("GET", "/api/overview")
async def overview(request: Request):
    node = request.node
    shell = request.api.shell
    message_totals = await request.api.rates.gather()   # the cluster's counters
    all_rows = await queue_rows(request, login_vhosts(node, request.user),
                                totals=message_totals)
    totals = {key: sum(row[key] for row in all_rows)
              for key in ("messages", "messages_ready", "messages_unacknowledged")}
    if all_rows and all("messages_details" in row for row in all_rows):
        totals.update({f"{key}_details": {"rate": round(sum(
            row[f"{key}_details"]["rate"] for row in all_rows), 1)}
            for key in ("messages", "messages_ready", "messages_unacknowledged")})
    found = await _clients(request)   # the cluster's clients (clients.py)
    vhosts = login_vhosts(node, request.user)
    object_totals = {
        "connections": len(found["connections"]),
        "channels": len(found["channels"]),
        "consumers": len(found["consumers"]),
        "exchanges": sum(len(node.vhosts[name].exchanges) for name in vhosts),
        "queues": len(all_rows),
    }
    listeners = [{"node": node.name, "protocol": "amqp",
                  "ip_address": node.settings.host, "port": shell.port},
                 {"node": node.name, "protocol": "http",
                  "ip_address": request.api.host, "port": request.api.port}]
    if shell.ssl_port is not None:   # RabbitMQ names its TLS AMQP listener amqp/ssl
        listeners.append({"node": node.name, "protocol": "amqp/ssl",
                          "ip_address": node.settings.host, "port": shell.ssl_port})
    if request.api.ssl_port is not None:   # RabbitMQ names its TLS HTTP listener https
        listeners.append({"node": node.name, "protocol": "https",
                          "ip_address": node.settings.management_ssl_ip or request.api.host,
                          "port": request.api.ssl_port})
    if node.settings.clustered:  # the inter-node listener
        host, port = node.cluster.addresses[node.name]
        listeners.append({"node": node.name, "protocol": "clustering",
                          "ip_address": host, "port": port})
    body = rows.overview(node, request.user, listeners, totals, object_totals)
    body["message_stats"] = request.api.rates.message_stats(message_totals)
    return body


def _node_rows(request: Request) -> list[dict]:
    node, shell = request.node, request.api.shell
    free = shutil.disk_usage(node.settings.data_dir).free
    result = []
    for name in node.cluster.nodes:
        result.append(rows.node_row(node, shell.memory_used(), shell.memory_limit(), free,
                                    shell.disk_free_limit(), name,
                                    node.cluster.seen_up(name)))
    return result


@route("GET", "/api/nodes")
async def nodes(request: Request):
    require(request.user, "monitoring")
    return _node_rows(request)


@route("GET", "/api/nodes/{name}")
async def one_node(request: Request):
    require(request.user, "monitoring")
    for row in _node_rows(request):
        if row["name"] == request.captures["name"]:
            return row
    raise not_found()


@route("GET", "/api/cluster-name")
async def cluster_name(request: Request):
    return {"name": request.node.settings.cluster_name}


@route("GET", "/api/whoami")
async def whoami(request: Request):
    return {"name": request.user.name, "tags": list(request.user.tags)}


@route("GET", "/api/extensions")
async def extensions(request: Request):
    return []  # no UI extensions (RabbitMQ lists its plugins' dispatcher.js files)


# ---------------------------------------------------------------- connections


@route("GET", "/api/connections")
async def connections(request: Request):
    return (await _clients(request))["connections"]


@route("GET", "/api/vhosts/{vhost}/connections")
async def vhost_connections(request: Request):
    require_vhost(request.node, request.user, request.captures["vhost"])
    return [row for row in (await _clients(request))["connections"]
            if row["vhost"] == request.captures["vhost"]]


@route("GET", "/api/connections/{name}")
async def one_connection(request: Request):
    for row in (await _clients(request))["connections"]:
        if row["name"] == request.captures["name"]:
            return row
    raise not_found()


@route("GET", "/api/channels")
async def channels(request: Request):
    return (await _clients(request))["channels"]


@route("GET", "/api/vhosts/{vhost}/channels")
async def vhost_channels(request: Request):
    require_vhost(request.node, request.user, request.captures["vhost"])
    return [row for row in (await _clients(request))["channels"]
            if row["vhost"] == request.captures["vhost"]]


@route("GET", "/api/connections/{name}/channels")
async def connection_channels(request: Request):
    return [row for row in (await _clients(request))["channels"]
            if row["connection_details"]["name"] == request.captures["name"]]


@route("GET", "/api/consumers")
async def consumers(request: Request):
    return (await _clients(request))["consumers"]


@route("GET", "/api/consumers/{vhost}")
async def vhost_consumers(request: Request):
    vhosts = _vhost_names(request)
    return [row for row in (await _clients(request))["consumers"]
            if row["queue"]["vhost"] in vhosts]


# ---------------------------------------------------------------- queues


@route("GET", "/api/queues")
async def queues(request: Request):
    return await queue_rows(request, _vhost_names(request))


@route("GET", "/api/queues/{vhost}")
async def vhost_queues(request: Request):
    return await queue_rows(request, _vhost_names(request))


@route("GET", "/api/queues/{vhost}/{name}")
async def one_queue(request: Request):
    vhosts = _vhost_names(request)
    # the queue's consumers on every reachable node (clients.py), asked before the
    # row is read, so its leader and members are those of the answer's time
    consumers = (await _clients(request))["consumers"]
    found = await queue_rows(request, vhosts, request.captures["name"])
    if not found:
        raise not_found()
    row = found[0]
    queue = request.node.vhosts[row["vhost"]].queues[row["name"]]
    row["consumer_details"] = [consumer for consumer in consumers
                               if consumer["queue"] == {"name": queue.name,
                                                        "vhost": queue.vhost}]
    row["incoming"], row["deliveries"] = [], []
    return row


@route("GET", "/api/queues/{vhost}/{name}/raft")
async def queue_raft_status(request: Request):
    """quorumqueue's own (RabbitMQ's API has none; `rabbitmq-queues quorum_status`
    shows the like): the Raft members of a quorum queue as this node sees them. With
    a replica here: its role, term and log indexes; when it leads, each follower's
    match and next index and flow-control state. Other members' own figures live on
    their nodes: they are listed with what the leader knows of them."""
    vhost, name = request.captures["vhost"], request.captures["name"]
    require_vhost(request.node, request.user, vhost)
    node = request.node
    queue = node.vhosts[vhost].queues.get(name)
    if queue is None:
        raise not_found()
    if not queue.REPLICATED:
        raise bad_request(f"queue '{name}' in vhost '{vhost}' is not a quorum queue")
    [stats] = await request.api.later(lambda done: queue.stats_later(
        node.name, lambda row: done([row])))
    raft = getattr(queue, "raft", None)
    progress = raft.follower_progress() if raft is not None else {}
    members = []
    for member in stats["members"]:
        row = {"node": member, "online": node.cluster.seen_up(member),
               "raft_state": "leader" if member == stats["leader"] else "follower"}
        if member == node.name and raft is not None:
            snapshot = raft.log.snapshot_meta()
            row.update(raft_state=raft.role.value, term=raft.term,
                       commit_index=raft.commit_index, last_applied=raft.applied_index,
                       last_log_index=raft.log.last_index(),
                       last_written=raft.log.persisted_index(),
                       snapshot_index=snapshot.index if snapshot is not None else 0)
        if member in progress:
            match, next_index, flow = progress[member]
            row.update(match_index=match, next_index=next_index, replication=flow)
        members.append(row)
    return {"name": name, "vhost": vhost, "leader": stats["leader"],
            "reporting_node": node.name, "members": members}


@route("GET", "/api/queues/{vhost}/{name}/bindings")
async def queue_bindings(request: Request):
    vhost = _vhost_names(request)[0]
    name = request.captures["name"]
    if name not in request.node.vhosts[vhost].queues:
        raise not_found()
    return [row for row in rows.binding_rows(request.node.vhosts[vhost])
            if row["destination_type"] == "queue" and row["destination"] == name]


# ---------------------------------------------------------------- exchanges


def _exchange_rows(request: Request, vhosts: list[str]) -> list[dict]:
    node = request.node
    return [rows.exchange_row(node, name, exchange) for name in vhosts
            for _key, exchange in sorted(node.vhosts[name].exchanges.items())]


@route("GET", "/api/exchanges")
async def exchanges(request: Request):
    return _exchange_rows(request, _vhost_names(request))


@route("GET", "/api/exchanges/{vhost}")
async def vhost_exchanges(request: Request):
    return _exchange_rows(request, _vhost_names(request))


def _exchange(request: Request):
    vhost = _vhost_names(request)[0]
    name = request.captures["name"]
    name = "" if name == "amq.default" else name
    exchange = request.node.vhosts[vhost].exchanges.get(name)
    if exchange is None:
        raise not_found()
    return vhost, exchange


@route("GET", "/api/exchanges/{vhost}/{name}")
async def one_exchange(request: Request):
    vhost, exchange = _exchange(request)
    row = rows.exchange_row(request.node, vhost, exchange)
    row["incoming"], row["outgoing"] = [], []
    return row


@route("GET", "/api/exchanges/{vhost}/{name}/bindings/source")
async def exchange_source_bindings(request: Request):
    vhost, exchange = _exchange(request)
    return [row for row in rows.binding_rows(request.node.vhosts[vhost])
            if row["source"] == exchange.name]


@route("GET", "/api/exchanges/{vhost}/{name}/bindings/destination")
async def exchange_destination_bindings(request: Request):
    vhost, exchange = _exchange(request)
    return [row for row in rows.binding_rows(request.node.vhosts[vhost])
            if row["destination_type"] == "exchange" and row["destination"] == exchange.name]


# ---------------------------------------------------------------- bindings


def _binding_rows(request: Request, vhosts: list[str]) -> list[dict]:
    return [row for name in vhosts for row in rows.binding_rows(request.node.vhosts[name])]


@route("GET", "/api/bindings")
async def bindings(request: Request):
    return _binding_rows(request, _vhost_names(request))


@route("GET", "/api/bindings/{vhost}")
async def vhost_bindings(request: Request):
    return _binding_rows(request, _vhost_names(request))


def between(request: Request) -> list[dict]:
    """The bindings from exchange `source` to `destination` (kind "q" or "e")."""
    vhost = _vhost_names(request)[0]
    captures = request.captures
    kind = {"q": "queue", "e": "exchange"}.get(captures["kind"])
    node_vhost = request.node.vhosts[vhost]
    if kind is None or captures["source"] not in node_vhost.exchanges:
        raise not_found()
    if kind == "queue" and captures["destination"] not in node_vhost.queues:
        raise not_found()
    if kind == "exchange" and captures["destination"] not in node_vhost.exchanges:
        raise not_found()
    return [row for row in rows.binding_rows(node_vhost)
            if row["source"] == captures["source"] and row["destination_type"] == kind
            and row["destination"] == captures["destination"]]


@route("GET", "/api/bindings/{vhost}/e/{source}/{kind}/{destination}")
async def bindings_between(request: Request):
    return between(request)


@route("GET", "/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}")
async def one_binding(request: Request):
    for row in between(request):
        if row["properties_key"] == request.captures["props"]:
            return row
    raise not_found()


# ---------------------------------------------------------------- vhosts, users


async def _vhost_rows(request: Request, names: list[str]) -> list[dict]:
    node = request.node
    result = []
    for name in names:
        counts = None
        if name in node.vhosts and name in request.user.permissions:
            # only the lengths: no need to gather the cluster's message counters
            found = await queue_rows(request, [name], totals=Totals([]))
            counts = {key: sum(row[key] for row in found)
                      for key in ("messages", "messages_ready", "messages_unacknowledged")}
        result.append(rows.vhost_row(node, name, counts))
    return result


@route("GET", "/api/vhosts")
async def vhosts(request: Request):
    return await _vhost_rows(request, visible_vhosts(request.node, request.user))


@route("GET", "/api/vhosts/{vhost}")
async def one_vhost(request: Request):
    name = request.captures["vhost"]
    if name not in visible_vhosts(request.node, request.user):
        raise not_found()
    return (await _vhost_rows(request, [name]))[0]


@route("GET", "/api/users")
async def users(request: Request):
    require(request.user, "administrator")
    return [rows.user_row(user) for _name, user in sorted(request.node.users.users.items())]


@route("GET", "/api/users/{name}")
async def one_user(request: Request):
    require(request.user, "administrator")
    user = request.node.users.users.get(request.captures["name"])
    if user is None:
        raise not_found()
    return rows.user_row(user)


def _permission_rows(request: Request, vhost: str | None = None,
                     user: str | None = None) -> list[dict]:
    return [rows.permission_row(account.name, name, rights)
            for _key, account in sorted(request.node.users.users.items())
            if user is None or account.name == user
            for name, rights in sorted(account.permissions.items())
            if vhost is None or name == vhost]


@route("GET", "/api/permissions")
async def permissions(request: Request):
    require(request.user, "administrator")
    return _permission_rows(request)


@route("GET", "/api/permissions/{vhost}/{user}")
async def one_permission(request: Request):
    require(request.user, "administrator")
    found = _permission_rows(request, request.captures["vhost"], request.captures["user"])
    if not found:
        raise not_found()
    return found[0]


@route("GET", "/api/vhosts/{vhost}/permissions")
async def vhost_permissions(request: Request):
    require(request.user, "administrator")
    require_vhost(request.node, request.user, request.captures["vhost"])
    return _permission_rows(request, vhost=request.captures["vhost"])


@route("GET", "/api/users/{name}/permissions")
async def user_permissions(request: Request):
    require(request.user, "administrator")
    if request.captures["name"] not in request.node.users.users:
        raise not_found()
    return _permission_rows(request, user=request.captures["name"])


# ---------------------------------------------------------------- policies


def _policy_rows(request: Request, vhosts: list[str]) -> list[dict]:
    node = request.node
    return [rows.policy_row(policy) for name in vhosts
            for _key, policy in sorted(node.policies.get(name, {}).items())]


def _listing(list_path: str, vhost_path: str, one_path: str, rows_of,
             tag: str | None = None) -> None:
    """RabbitMQ's three GETs of a kind of definition: every vhost's rows, one vhost's,
    and the one row named by `{name}` (404 if absent); `rows_of(request, vhosts)` gives
    the rows (a coroutine function or a plain one), `tag` the user tag each requires."""
    async def rows(request: Request) -> list[dict]:
        if tag is not None:
            require(request.user, tag)
        found = rows_of(request, _vhost_names(request))
        return await found if hasattr(found, "__await__") else found

    async def one(request: Request):
        for row in await rows(request):
            if row["name"] == request.captures["name"]:
                return row
        raise not_found()

    route("GET", list_path)(rows)
    route("GET", vhost_path)(rows)
    route("GET", one_path)(one)


_listing("/api/policies", "/api/policies/{vhost}", "/api/policies/{vhost}/{name}",
         _policy_rows)


def _operator_policy_rows(request: Request, vhosts: list[str]) -> list[dict]:
    node = request.node
    return [rows.policy_row(policy) for name in vhosts
            for _key, policy in sorted(node.operator_policies.get(name, {}).items())]


# RabbitMQ's rabbit_mgmt_wm_operator_policies: administrators only
_listing("/api/operator-policies", "/api/operator-policies/{vhost}",
         "/api/operator-policies/{vhost}/{name}", _operator_policy_rows, tag="administrator")


# ---------------------------------------------------------------- health checks


def _alarm_answer(request: Request, alarms: list[dict]):
    if not alarms:
        return {"status": "ok"}
    return Answer(503, {"status": "failed",
                        "reason": "resource alarm(s) in effect in the cluster",
                        "alarms": alarms})


@route("GET", "/api/health/checks/alarms")
async def health_alarms(request: Request):
    # this node's alarms: other nodes' are not gossiped (docs/behaviour/alarms.md: an
    # alarm blocks the publishers of its own node only)
    return _alarm_answer(request, [{"node": request.node.name, "resource": resource}
                                   for resource in sorted(request.node.alarms)])


@route("GET", "/api/health/checks/local-alarms")
async def health_local_alarms(request: Request):
    answer = _alarm_answer(request, [{"node": request.node.name, "resource": resource}
                                     for resource in sorted(request.node.alarms)])
    if isinstance(answer, Answer):
        answer.body["reason"] = "resource alarm(s) in effect on the node"
    return answer


@route("GET", "/api/health/checks/node-is-quorum-critical")
async def health_quorum_critical(request: Request):
    node = request.node
    cluster = node.cluster
    if len(cluster.nodes) <= 1:
        return {"status": "ok", "reason": "single node cluster"}
    critical = []
    for vhost in node.vhosts.values():
        for queue in vhost.queues.values():
            members = queue.metadata_record().get("members")
            if not members or node.name not in members:
                continue
            online = [m for m in members if m != node.name and cluster.seen_up(m)]
            if len(online) < len(members) // 2 + 1:
                critical.append({"name": queue.name, "virtual_host": vhost.name,
                                 "readable_name": f"queue '{queue.name}' in vhost "
                                                  f"'{vhost.name}'", "type": "quorum"})
    if critical:
        return Answer(503, {"status": "failed",
                            "reason": "There are quorum queues that would lose their "
                                      "quorum if the target node is shut down",
                            "queues": critical})
    return {"status": "ok"}


@route("GET", "/api/health/checks/node-is-mirror-sync-critical")
async def health_mirror_sync_critical(request: Request):
    """RabbitMQ 3.x's check: the mirrored classic queues led here with no synchronised
    mirror on a reachable node, which stopping this node would lose."""
    node = request.node
    cluster = node.cluster
    if len(cluster.nodes) <= 1:
        return {"status": "ok", "reason": "single node cluster"}
    critical = []
    for vhost in node.vhosts.values():
        for queue in vhost.queues.values():
            if queue.mirrors is None or queue.metadata_record().get("host") != node.name:
                continue
            if not any(m != node.name and cluster.seen_up(m) for m in queue.synced):
                critical.append({"name": queue.name, "virtual_host": vhost.name,
                                 "readable_name": f"queue '{queue.name}' in vhost "
                                                  f"'{vhost.name}'", "type": "classic"})
    if critical:
        return Answer(503, {"status": "failed",
                            "reason": "There are mirrored classic queues without online "
                                      "synchronised mirrors",
                            "queues": critical})
    return {"status": "ok"}


@route("GET", "/api/health/checks/port-listener/{port}")
async def health_port_listener(request: Request):
    try:
        port = int(request.captures["port"])
    except ValueError:
        raise not_found() from None
    ports = [request.api.port, request.api.shell.port]
    if request.node.settings.clustered:  # the inter-node listener
        ports.append(request.node.cluster.addresses[request.node.name][1])
    if port in ports:
        return {"status": "ok", "port": port}
    return Answer(503, {"status": "failed", "reason": "No active listener",
                        "missing": port, "ports": ports})


@route("GET", "/api/health/checks/virtual-hosts")
async def health_virtual_hosts(request: Request):
    return {"status": "ok"}  # every vhost is served by the node's one process


# ---------------------------------------------------------------- definitions


@route("GET", "/api/definitions")
async def definitions(request: Request):
    """The node's definitions in RabbitMQ's export format: the same document as
    `quorumqueue ctl export_definitions` (broker/node/definitions_json.py)."""
    require(request.user, "administrator")
    from .changes import operation

    return await operation(request, "definitions.export")


@route("POST", "/api/definitions")
async def post_definitions(request: Request):
    """RabbitMQ's import: the whole document is checked first and nothing is applied
    if any of it is refused (a 400 naming the item), as `ctl import_definitions`."""
    require(request.user, "administrator")
    from .changes import operation

    await operation(request, "definitions.import", definitions=await request.json())
    return Answer(204)


@route("GET", "/api/definitions/{vhost}")
async def vhost_definitions(request: Request):
    require(request.user, "administrator")
    from .changes import operation

    return await operation(request, "definitions.export", vhost=_vhost_names(request)[0])


# ---------------------------------------------------------------- runtime parameters


def _parameter_rows(request: Request, vhosts: list[str]) -> list[dict]:
    require(request.user, "policymaker")
    component = request.captures.get("component")
    return [{"vhost": vhost, "component": c, "name": name, "value": value}
            for (c, vhost, name), value in sorted(request.node.parameters.items(),
                                                  key=lambda item: (item[0][1], item[0][0],
                                                                    item[0][2]))
            if vhost in vhosts and (component is None or c == component)]


@route("GET", "/api/parameters")
async def parameters(request: Request):
    return _parameter_rows(request, _vhost_names(request))


_listing("/api/parameters/{component}", "/api/parameters/{component}/{vhost}",
         "/api/parameters/{component}/{vhost}/{name}", _parameter_rows)


async def _shovel_rows(request: Request, vhosts: list[str]) -> list[dict]:
    """The shovel plugin's /api/shovels rows (rabbitmq_shovel_management), from the
    node that runs the shovels (the management operation shovels.status)."""
    from .changes import operation  # changes imports this module's neighbours only

    require(request.user, "policymaker")
    return [row for row in await operation(request, "shovels.status")
            if row["vhost"] in vhosts]


_listing("/api/shovels", "/api/shovels/{vhost}", "/api/shovels/vhost/{vhost}/{name}",
         _shovel_rows)

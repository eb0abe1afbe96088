"""/api/definitions: the node's definitions in RabbitMQ's export format (GET), and a
thin import of that format (POST).

Kept thin on purpose: the document is built from the same rows the API lists
(rows.py), in the layout of RabbitMQ 3.10's export (rabbit_version, users, vhosts,
permissions, topic_permissions, parameters, global_parameters, policies, queues,
exchanges, bindings). When the broker's own definitions export/import
(`quorumqueue ctl export_definitions`) lands, this module should call it instead.

What is exported, as RabbitMQ: durable, non-exclusive queues; exchanges other than
the default and `amq.*` ones; bindings other than the default exchange's. Users
carry their password hash (`rabbit_password_hashing_sha256`, the hash RabbitMQ's
default algorithm produces, which quorumqueue uses too).
"""

from __future__ import annotations

from .. import __version__
from . import rows


def export(node, vhost: str | None = None) -> dict:
    names = [vhost] if vhost is not None else sorted(node.vhosts)
    queues, exchanges, bindings, policies = [], [], [], []
    for name in names:
        space = node.vhosts[name]
        for queue in sorted(space.queues.values(), key=lambda q: q.name):
            if queue.durable and queue.exclusive_owner is None:
                queues.append({"name": queue.name, "vhost": name, "durable": True,
                               "auto_delete": queue.auto_delete,
                               "arguments": rows.json_value(queue.arguments)})
        for key, exchange in sorted(space.exchanges.items()):
            if key and not key.startswith("amq."):
                exchanges.append({"name": key, "vhost": name, "type": exchange.type,
                                  "durable": exchange.durable,
                                  "auto_delete": exchange.auto_delete,
                                  "internal": exchange.internal,
                                  "arguments": rows.json_value(exchange.arguments)})
        for binding in space.bindings():
            bindings.append({"source": binding.source, "vhost": name,
                             "destination": binding.destination.name,
                             "destination_type": binding.destination.kind,
                             "routing_key": binding.routing_key,
                             "arguments": rows.json_value(binding.arguments_dict)})
        for _key, policy in sorted(node.policies.get(name, {}).items()):
            policies.append(rows.policy_row(policy))
    document = {"rabbit_version": rows.MANAGEMENT_VERSION,
                "rabbitmq_version": rows.MANAGEMENT_VERSION,
                "product_name": "quorumqueue", "product_version": __version__}
    if vhost is None:
        users = sorted(node.users.users.values(), key=lambda u: u.name)
        document.update(
            users=[{key: value for key, value in rows.user_row(user).items()}
                   for user in users],
            vhosts=[{"name": name} for name in names],
            permissions=[rows.permission_row(user.name, name, rights)
                         for user in users for name, rights in sorted(user.permissions.items())],
            topic_permissions=[], parameters=[], global_parameters=[])
    else:
        document["parameters"] = []
    document.update(policies=policies, queues=queues, exchanges=exchanges,
                    bindings=bindings)
    return document


SUPPORTED_HASHING = ("rabbit_password_hashing_sha256", None)


async def import_document(request, document: dict) -> None:
    """POST /api/definitions: RabbitMQ's import, in its order (vhosts, users,
    permissions, policies, exchanges, queues, bindings), each through the same
    paths as the API's own PUTs (node/management.py's operations, the direct
    connection), so every check applies; it stops at the first refusal, which is
    the answer. What exists already and is equal is left alone. Sections quorumqueue
    has nothing for (parameters, global parameters, topic permissions) must be
    empty (RabbitMQ's `internal_cluster_id` global parameter aside). Thin on purpose: the broker's own definitions import
    (`ctl import_definitions`) is meant to replace this once it exists."""
    from pamqp import commands

    from ..cluster import meta
    from .app import bad_request
    from .changes import _arguments, _flag, operation
    from .direct import DirectConnection

    node = request.node
    # RabbitMQ's own cluster identity is in every export it makes: not a setting
    document = {**document, "global_parameters": [
        item for item in document.get("global_parameters", [])
        if item.get("name") != "internal_cluster_id"]}
    for section in ("parameters", "global_parameters", "topic_permissions"):
        if document.get(section):
            raise bad_request(f"{section}: quorumqueue has none of these; remove them "
                              "from the definitions to import the rest")
    for item in document.get("vhosts", []):
        if item["name"] not in node.vhosts:
            await operation(request, "vhosts.add", name=item["name"])
    for item in document.get("users", []):
        algorithm = item.get("hashing_algorithm")
        if algorithm not in SUPPORTED_HASHING:
            raise bad_request(f"user '{item['name']}': hashing_algorithm {algorithm} is not "
                              "supported (rabbit_password_hashing_sha256 is)")
        tags = item.get("tags", [])
        tags = [t for t in tags.split(",") if t] if isinstance(tags, str) else list(tags)
        current = node.users.users.get(item["name"])
        if current is not None and current.password_hash == item.get("password_hash") \
                and list(current.tags) == tags:
            continue
        if "password_hash" in item:
            data = meta.encode("user.put", name=item["name"],
                               password_hash=item["password_hash"], tags=tags)
            await request.api.later(lambda done, data=data: node.cluster.meta.propose_data(
                data, lambda _reply: done({})))
        elif current is None:
            await operation(request, "users.add", name=item["name"],
                            password=item["password"], tags=tags)
    for item in document.get("permissions", []):
        await operation(request, "permissions.set", vhost=item["vhost"], user=item["user"],
                        configure=item["configure"], write=item["write"], read=item["read"])
    for item in document.get("policies", []):
        await operation(request, "policies.set", vhost=item["vhost"], name=item["name"],
                        pattern=item["pattern"], definition=item["definition"],
                        priority=int(item.get("priority", 0)),
                        apply_to=item.get("apply-to") or "all")
    by_vhost: dict[str, list] = {}
    for kind in ("exchanges", "queues", "bindings"):
        for item in document.get(kind, []):
            by_vhost.setdefault(item["vhost"], []).append((kind, item))
    for vhost, items in by_vhost.items():
        if vhost not in node.vhosts:
            raise bad_request(f"vhost '{vhost}' is neither defined nor in the definitions")
        async with DirectConnection(request.api.shell, request.user.name, request.password,
                                    vhost, request.peer_host) as direct:
            for kind, item in sorted(items, key=lambda pair: ("exchanges", "queues",
                                                              "bindings").index(pair[0])):
                if kind == "exchanges":
                    await direct.call(commands.Exchange.Declare(
                        exchange=item["name"], exchange_type=item["type"],
                        durable=_flag(item, "durable", True),
                        auto_delete=_flag(item, "auto_delete", False),
                        internal=_flag(item, "internal", False),
                        arguments=_arguments(item)), commands.Exchange.DeclareOk)
                elif kind == "queues":
                    await direct.call(commands.Queue.Declare(
                        queue=item["name"], durable=_flag(item, "durable", True),
                        auto_delete=_flag(item, "auto_delete", False),
                        arguments=_arguments(item)), commands.Queue.DeclareOk)
                elif item.get("destination_type", "queue") == "queue":
                    await direct.call(commands.Queue.Bind(
                        queue=item["destination"], exchange=item["source"],
                        routing_key=item.get("routing_key", ""),
                        arguments=_arguments(item)), commands.Queue.BindOk)
                else:
                    await direct.call(commands.Exchange.Bind(
                        destination=item["destination"], source=item["source"],
                        routing_key=item.get("routing_key", ""),
                        arguments=_arguments(item)), commands.Exchange.BindOk)

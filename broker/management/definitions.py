"""GET /api/definitions: the node's definitions in RabbitMQ's export format.

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

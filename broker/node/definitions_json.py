"""Definitions in RabbitMQ's JSON format (`rabbitmqctl export_definitions` /
`import_definitions`, the management API's /api/definitions): a node's users,
vhosts, permissions, policies, operator policies, exchanges, queues and bindings as
one document, and such a document as the metadata commands that create them.

Responsibilities
    `export_document(node)` -> dict: the document, as RabbitMQ 4.2 writes it
    (rabbit_definitions:all_definitions plus the management API's product_name and
    product_version). `import_plan(node, document)` -> Plan: every metadata command
    (groups/metadata.py) the document stands for, in RabbitMQ's import order, and the
    notes on what was kept as it was; or DefinitionsError naming the first thing
    that is wrong (its section, index and name), before anything is changed. Both
    are pure over the node's state; `apply_plan(node, plan, done)` proposes the
    plan's commands and calls `done` once they are applied. With `vhost=`, both
    work on one vhost's definitions, as RabbitMQ's /api/definitions/VHOST does
    (format "single_virtual_host": no users, vhosts or permissions, items without a
    `vhost` key). The management RPC (`definitions.export`, `definitions.import`,
    OPERATIONS below; `check: true` builds the plan and applies nothing) and an HTTP
    API call them alike.

The format, section by section (what RabbitMQ 3.10.8 and 4.2 write and read)
    users              {name, password_hash, hashing_algorithm, tags, limits}: the
                       hash is kept as it is (auth/users.py reads RabbitMQ's sha256,
                       sha512 and md5 hashes); `password` instead of a hash is hashed
                       here; neither: a user who cannot log in with a password.
                       tags: a list or RabbitMQ's older comma-separated string.
    vhosts             {name, limits, metadata{description, tags, default_queue_type}}
    permissions        {user, vhost, configure, write, read}
    topic_permissions  refused when not empty: quorumqueue has no topic permissions
    parameters         {vhost, component, name, value}: component operator_policy
                       (RabbitMQ keeps operator policies there, `value` holding
                       pattern, definition, priority, apply-to; 3.10.8 writes the
                       definition as a list of pairs, 4.2 as an object: both read)
                       and vhost-limits, and shovel (a dynamic shovel: `value` its
                       keys, checked as set_parameter checks them, broker/shovel/);
                       any other component (federation) is refused by name
    global_parameters  {name, value}: cluster_name is noted, not applied (a node's
                       cluster name is its configuration's); others refused
    policies           {vhost, name, pattern, apply-to, priority, definition}
    queues             {vhost, name, type, durable, auto_delete, arguments}
    exchanges          {vhost, name, type, durable, auto_delete, internal, arguments}
    bindings           {vhost, source, destination, destination_type, routing_key,
                       arguments}
    As RabbitMQ does: a queue or exchange that exists already is kept as it is, the
    default and `amq.*` exchanges and `amq.*` queues are skipped, exclusive queues
    are not exported; things named in the document may refer to each other
    (a permission to a user and vhost created by the same import).

Invariants: an import either proposes nothing (a DefinitionsError) or every command;
each command is then checked again where it is applied, so an import that races
another change fails on that item with the reply RabbitMQ would send.

Not here: checking a document and building its plan (definitions_import.py, whose
`import_plan` this module re-exports), reading and writing files (cli/ctl.py), the
transformations of a blue-green migration.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from typing import TYPE_CHECKING

from ..amqp.errors import AMQPError
from ..routing.exchanges import QUEUE
from .definitions_import import DefinitionsError, Plan, import_plan

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

# the RabbitMQ edition whose definitions format this follows (RabbitMQ's import
# reads the version only to guess the hashing of users that name none)
RABBITMQ_VERSION = "4.2.0"
PRODUCT_NAME = "quorumqueue"


# ================================================================= export


def _product_version() -> str:
    try:
        from importlib.metadata import version

        return version("quorumqueue")
    except Exception:  # noqa: BLE001 - running from a source tree
        return "0"


def json_value(value):
    """An AMQP field value as RabbitMQ's rabbit_mgmt_format writes it into JSON: a
    long string or byte array as text when it is UTF-8, else "Not UTF-8, base64 is:
    ..."; void as "undefined"; a timestamp as epoch seconds; a decimal as its number
    (RabbitMQ 3.10.8 writes scale.value, 3.14 as 2.314: docs/behaviour/differences.md)."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "Not UTF-8, base64 is: " + base64.b64encode(value).decode("ascii")
    if value is None:
        return "undefined"
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, dict):
        return {k: json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return value


def _arguments(arguments) -> dict:
    return {k: json_value(v) for k, v in dict(arguments).items()}


def _policy_item(policy) -> dict:
    return {"vhost": policy.vhost, "name": policy.name, "pattern": policy.pattern,
            "apply-to": policy.apply_to, "priority": policy.priority,
            "definition": dict(policy.definition)}


def export_document(node: "Node") -> dict:
    """Every definition of the node, in RabbitMQ's format (module header)."""
    users, permissions = [], []
    for user in sorted(node.users.users.values(), key=lambda u: u.name):
        users.append({"name": user.name, "password_hash": user.password_hash,
                      "hashing_algorithm": user.hashing, "tags": list(user.tags),
                      "limits": dict(user.limits)})
        for vhost, rights in sorted(user.permissions.items()):
            permissions.append({"user": user.name, "vhost": vhost,
                                "configure": rights.configure, "write": rights.write,
                                "read": rights.read})
    vhosts, parameters, policies, queues, exchanges, bindings = [], [], [], [], [], []
    for name in sorted(node.vhosts):
        vhost = node.vhosts[name]
        vhosts.append({"name": name, "limits": [[k, v] for k, v in sorted(vhost.limits.items())],
                       "metadata": {"description": "", "tags": []}})
        if vhost.limits:
            parameters.append({"vhost": name, "component": "vhost-limits", "name": "limits",
                               "value": dict(sorted(vhost.limits.items()))})
        for policy in sorted(node.operator_policies.get(name, {}).values(),
                             key=lambda p: p.name):
            item = _policy_item(policy)
            parameters.append({"vhost": name, "component": "operator_policy",
                               "name": policy.name,
                               "value": {k: item[k] for k in ("pattern", "definition",
                                                              "priority", "apply-to")}})
        parameters += [{"vhost": v, "component": c, "name": n, "value": value}
                       for (c, v, n), value in sorted(node.parameters.items()) if v == name]
        policies += [_policy_item(p) for p in sorted(node.policies.get(name, {}).values(),
                                                      key=lambda p: p.name)]
        for queue in sorted(vhost.queues.values(), key=lambda q: q.name):
            if queue.exclusive_owner is None:  # exclusive queues cannot be restored
                queues.append({"vhost": name, "name": queue.name, "type": queue.type_name,
                               "durable": queue.durable, "auto_delete": queue.auto_delete,
                               "arguments": _arguments(queue.arguments)})
        for exchange in sorted(vhost.exchanges.values(), key=lambda x: x.name):
            if exchange.name and not exchange.name.startswith("amq."):
                exchanges.append({"vhost": name, "name": exchange.name,
                                  "type": exchange.type, "durable": exchange.durable,
                                  "auto_delete": exchange.auto_delete,
                                  "internal": exchange.internal,
                                  "arguments": _arguments(exchange.arguments)})
        for binding in vhost.bindings():
            target = vhost.queues.get(binding.destination.name)
            if binding.destination.kind == QUEUE and (target is None
                                                      or target.exclusive_owner is not None):
                continue
            bindings.append({"vhost": name, "source": binding.source,
                             "destination": binding.destination.name,
                             "destination_type": binding.destination.kind,
                             "routing_key": binding.routing_key,
                             "arguments": _arguments(binding.arguments_dict)})
    key = lambda item: json.dumps(item, sort_keys=True)  # noqa: E731 - one stable order
    return {"rabbit_version": RABBITMQ_VERSION, "rabbitmq_version": RABBITMQ_VERSION,
            "product_name": PRODUCT_NAME, "product_version": _product_version(),
            "users": users, "vhosts": vhosts, "permissions": permissions,
            "topic_permissions": [], "parameters": parameters,
            "global_parameters": [{"name": "cluster_name",
                                   "value": node.settings.cluster_name}],
            "policies": policies, "queues": queues, "exchanges": exchanges,
            "bindings": sorted(bindings, key=key)}


def export_vhost_document(node: "Node", vhost: str) -> dict:
    """One vhost's definitions, as RabbitMQ 4.2's /api/definitions/VHOST writes them;
    DefinitionsError if there is no such vhost."""
    if vhost not in node.vhosts:
        raise DefinitionsError(f"no vhost '{vhost}'")
    full = export_document(node)

    def keep(items: list[dict]) -> list[dict]:
        return [{k: v for k, v in item.items() if k != "vhost"} for item in items
                if item.get("vhost") == vhost]

    return {**{key: full[key] for key in ("rabbit_version", "rabbitmq_version",
                                          "product_name", "product_version")},
            "rabbitmq_definition_format": "single_virtual_host",
            "original_vhost_name": vhost,
            "explanation": f"Definitions of virtual host '{vhost}'",
            "metadata": {"description": "", "tags": []}, "description": "",
            "limits": dict(sorted(node.vhosts[vhost].limits.items())),
            **{section: keep(full[section])
               for section in ("parameters", "policies", "queues", "exchanges", "bindings")}}

def apply_plan(node: "Node", plan: Plan, done) -> None:
    """Propose every command of `plan` to the metadata group, in order; `done` is
    called once all were applied on this node: with {"commands": n, "notes": [...]},
    or with an AMQPError listing the commands refused where they were applied (an
    object changed meanwhile through another node)."""
    from ..amqp import spec
    from ..groups import metadata as meta

    if not plan.commands:
        done({"commands": 0, "notes": plan.notes})
        return
    waiting = [len(plan.commands)]
    failures: list[str] = []

    def applied(command: dict, reply) -> None:
        if isinstance(reply, tuple) and reply and reply[0] == "error":
            failures.append(f"{command['op']} {command.get('vhost', '')}/"
                            f"{command.get('name', command.get('destination', ''))}: "
                            f"{reply[2]}")
        waiting[0] -= 1
        if waiting[0]:
            return
        if failures:
            done(AMQPError(spec.PRECONDITION_FAILED, "definitions imported except: "
                           + "; ".join(failures)))
        else:
            done({"commands": len(plan.commands), "notes": plan.notes})

    for command in plan.commands:
        fields = {k: v for k, v in command.items() if k != "op"}
        node.cluster.meta.propose_data(meta.encode(command["op"], **fields),
                                       lambda reply, c=command: applied(c, reply))

# ================================================================= management RPC


def _export(node, session, request) -> dict:
    """{vhost?} -> the whole node's definitions, or one vhost's."""
    from ..amqp import spec
    from .management import _require_administrator

    _require_administrator(session)
    if request.get("vhost") is None:
        return export_document(node)
    try:
        return export_vhost_document(node, request["vhost"])
    except DefinitionsError as error:
        raise AMQPError(spec.NOT_FOUND, str(error)) from None


def _import(node, session, request):
    """{definitions, vhost?, check?} -> {"commands": n, "notes": [...]} once applied
    here; with `check: true` the same answer, or the same refusal, and nothing applied
    (the command line checks the whole file first, then imports it section by section
    to show its progress: cli/ctl.py)."""
    from ..amqp import spec
    from .management import Later, _require_administrator

    _require_administrator(session)
    try:
        plan = import_plan(node, request.get("definitions"), request.get("vhost"))
    except DefinitionsError as error:
        raise AMQPError(spec.PRECONDITION_FAILED, f"invalid definitions: {error}") from None
    if request.get("check"):
        return {"commands": len(plan.commands), "notes": plan.notes}
    return Later(lambda done: apply_plan(node, plan, done), metadata=True)


OPERATIONS = {"definitions.export": _export, "definitions.import": _import}


__all__ = ["export_document", "export_vhost_document", "import_plan", "apply_plan",
           "DefinitionsError", "Plan", "json_value", "OPERATIONS"]

"""Importing definitions in RabbitMQ's JSON format: a document checked against the
node and against itself, and turned into the metadata commands that create what it
holds (the format and what is kept, noted or refused: definitions_json.py). Pure.

Responsibilities: `import_plan(node, document, vhost=None)` -> Plan (the commands,
in RabbitMQ's import order: vhosts, users, permissions, parameters, global
parameters, policies, exchanges, queues, bindings; and notes), or DefinitionsError
naming the section, index, name and problem of the first thing that is wrong.

How it works: one pass per section, each item checked as the command that makes
it would be (policies.py, operator_policies.py, queues/types.py, limits.py), with
the names the document itself creates counted as existing for the items after
them; a new queue is placed now by its type (members and leader, or host), as a
declaration through a channel is.

Invariants: nothing is proposed here; a document with any error gives no plan.

Not here: exporting, proposing the plan (definitions_json.py).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..amqp.errors import AMQPError
from ..auth.users import HASHING_ALGORITHMS, SHA256, InvalidPattern, Permissions, hash_password
from ..queues import registry
from ..queues.types import validate_declaration
from ..routing.exchanges import EXCHANGE, EXCHANGE_TYPES, QUEUE
from ..shovel.parameters import COMPONENT as SHOVEL, ShovelError, check as check_shovel
from . import limits
from .operator_policies import parse_operator_policy
from .policies import PolicyError, parse_policy

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

SECTIONS = ("users", "vhosts", "permissions", "topic_permissions", "parameters",
            "global_parameters", "policies", "queues", "exchanges", "bindings")
_DIGEST_SIZES = {SHA256: 32, "rabbit_password_hashing_sha512": 64,
                 "rabbit_password_hashing_md5": 16}


class DefinitionsError(ValueError):
    """A definitions document that cannot be imported; the message names the part."""


@dataclass
class Plan:
    commands: list[dict] = field(default_factory=list)  # {"op": ..., fields}, in order
    notes: list[str] = field(default_factory=list)      # what was kept as it was


def _items(document: dict, section: str) -> list[tuple[str, dict]]:
    """The section's items, each with how a message names it ("users[2]")."""
    items = document.get(section, [])
    if items is None:
        return []
    if not isinstance(items, list):
        raise DefinitionsError(f"'{section}' must be a list, got {type(items).__name__}")
    named = []
    for index, item in enumerate(items):
        where = f"{section}[{index}]"
        if not isinstance(item, dict):
            raise DefinitionsError(f"{where} must be an object, got {item!r}")
        if isinstance(item.get("name"), str):
            where += f" ('{item['name']}')"
        named.append((where, item))
    return named


def _text(where: str, item: dict, key: str, default: Any = None, empty: bool = False) -> str:
    value = item.get(key, default)
    if not isinstance(value, str) or (not value and not empty):
        raise DefinitionsError(f"{where}: '{key}' must be a {'' if empty else 'non-empty '}"
                               f"string, got {value!r}")
    return value


def _flag(where: str, item: dict, key: str, default: bool) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise DefinitionsError(f"{where}: '{key}' must be true or false, got {value!r}")
    return value


def _table(where: str, item: dict, key: str = "arguments") -> dict:
    value = item.get(key, {})
    if value is None or value == []:  # an empty Erlang proplist
        return {}
    if not isinstance(value, dict):
        raise DefinitionsError(f"{where}: '{key}' must be an object, got {value!r}")
    return value


def _pairs(where: str, value, key: str) -> dict:
    """An object, or RabbitMQ 3.10's list of [key, value] pairs, as a dict."""
    if isinstance(value, dict):
        return value
    if value is None or value == "":
        return {}
    if isinstance(value, list) and all(isinstance(p, list) and len(p) == 2
                                       and isinstance(p[0], str) for p in value):
        return {k: v for k, v in value}
    raise DefinitionsError(f"{where}: '{key}' must be an object, got {value!r}")


class _Importer:
    """Checks a document against the node and itself, building the plan."""

    def __init__(self, node: "Node", document: dict) -> None:
        self.node = node
        self.document = document
        self.plan = Plan()
        self.vhosts = set(node.vhosts)
        self.users = set(node.users.users)
        self.version = str(document.get("rabbitmq_version",
                                        document.get("rabbit_version", "")))
        self.exchanges: dict[str, set[str]] = {
            name: set(vhost.exchanges) for name, vhost in node.vhosts.items()}
        self.queues: dict[str, set[str]] = {
            name: set(vhost.queues) for name, vhost in node.vhosts.items()}

    def add(self, op: str, **fields) -> None:
        self.plan.commands.append({"op": op, **fields})

    def vhost(self, where: str, item: dict, default: str | None = None) -> str:
        name = item.get("vhost", default)
        if not isinstance(name, str) or name not in self.vhosts:
            raise DefinitionsError(f"{where}: virtual host {name!r} does not exist and is "
                                   "not in the definitions")
        return name

    def run(self) -> Plan:
        self.check_sections()
        self.import_vhosts()
        self.import_users()
        self.import_permissions()
        self.import_parameters()
        self.import_global_parameters()
        self.import_policies()
        self.import_exchanges()
        self.import_queues()
        self.import_bindings()
        return self.plan

    def check_sections(self) -> None:
        for section in SECTIONS:
            _items(self.document, section)
        topic = self.document.get("topic_permissions") or []
        if topic:
            raise DefinitionsError(
                f"topic_permissions[0]: topic permissions (user {topic[0].get('user')!r} "
                f"in vhost {topic[0].get('vhost')!r}) are not supported by quorumqueue: "
                "remove them, or this user's topic publishes would not be restricted")

    # ---------------------------------------------------------- users, vhosts

    def import_vhosts(self) -> None:
        for where, item in _items(self.document, "vhosts"):
            name = _text(where, item, "name")
            if len(name.encode()) > 255:
                raise DefinitionsError(f"{where}: a vhost name is at most 255 bytes")
            metadata = item.get("metadata") or {}
            queue_type = item.get("default_queue_type",
                                  metadata.get("default_queue_type")
                                  if isinstance(metadata, dict) else None)
            if queue_type not in (None, "undefined", "classic"):
                raise DefinitionsError(
                    f"{where}: default queue type {queue_type!r} is not supported by "
                    "quorumqueue (its queues are classic unless declared with "
                    "x-queue-type): remove it, or declare the vhost's queues with their type")
            description = item.get("description", metadata.get("description", "")
                                   if isinstance(metadata, dict) else "")
            tags = item.get("tags", metadata.get("tags") if isinstance(metadata, dict) else [])
            if description or tags:
                self.plan.notes.append(f"vhost '{name}': its description and tags are not "
                                       "kept (quorumqueue keeps no vhost metadata)")
            if name not in self.vhosts:
                self.add("vhost.add", name=name)
                self.vhosts.add(name)
                self.exchanges[name] = {"", "amq.direct", "amq.fanout", "amq.topic",
                                        "amq.headers", "amq.match"}
                self.queues[name] = set()
            vhost_limits = _pairs(where, item.get("limits"), "limits")
            if vhost_limits:
                self.vhost_limits(where, name, vhost_limits)

    def vhost_limits(self, where: str, vhost: str, wanted) -> None:
        try:
            checked = limits.check_vhost_limits(wanted)
        except AMQPError as error:
            raise DefinitionsError(f"{where}: {error.detail}") from None
        self.add("vhost.limits", vhost=vhost, limits=checked)

    def import_users(self) -> None:
        for where, item in _items(self.document, "users"):
            name = _text(where, item, "name")
            tags = item.get("tags")
            if tags is None and "administrator" in item:  # RabbitMQ before 3.x tags
                tags = ["administrator"] if str(item["administrator"]).lower() == "true" \
                    else []
            if tags is None:
                raise DefinitionsError(f"{where}: 'tags' is missing (RabbitMQ: "
                                       "tags_not_present)")
            if isinstance(tags, str):  # RabbitMQ 3.x before 3.9: "administrator,management"
                tags = [t.strip() for t in tags.split(",") if t.strip()]
            if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
                raise DefinitionsError(f"{where}: 'tags' must be a list of strings, got "
                                       f"{tags!r}")
            password_hash, hashing = self.password(where, item)
            self.add("user.put", name=name, password_hash=password_hash,
                     tags=list(dict.fromkeys(tags)), hashing_algorithm=hashing)
            self.users.add(name)
            user_limits = _pairs(where, item.get("limits"), "limits")
            if user_limits:
                try:
                    checked = limits.check_user_limits(user_limits)
                except AMQPError as error:
                    raise DefinitionsError(f"{where}: {error.detail}") from None
                self.add("user.limits", name=name, limits=checked)

    def password(self, where: str, item: dict) -> tuple[str, str]:
        if "password" in item and "password_hash" in item:
            raise DefinitionsError(f"{where}: both 'password' and 'password_hash' are given "
                                   "(RabbitMQ: both_password_and_password_hash_are_provided)")
        if "password" in item:
            return hash_password(_text(where, item, "password")), SHA256
        password_hash = item.get("password_hash", "")
        if not isinstance(password_hash, str):
            raise DefinitionsError(f"{where}: 'password_hash' must be a base64 string")
        hashing = item.get("hashing_algorithm")
        if hashing is None:  # RabbitMQ's rule: md5 before 3.6.0, else its default
            old = self.version.startswith(("3.0.", "3.1.", "3.2.", "3.3.", "3.4.", "3.5."))
            hashing = "rabbit_password_hashing_md5" if old else SHA256
        if hashing not in HASHING_ALGORITHMS:
            raise DefinitionsError(f"{where}: hashing algorithm {hashing!r} is not supported "
                                   f"(known: {', '.join(HASHING_ALGORITHMS)})")
        if password_hash:
            try:
                raw = base64.b64decode(password_hash, validate=True)
            except (binascii.Error, ValueError):
                raise DefinitionsError(f"{where}: 'password_hash' is not base64") from None
            if len(raw) != 4 + _DIGEST_SIZES[hashing]:
                raise DefinitionsError(
                    f"{where}: 'password_hash' is {len(raw)} bytes, not a {hashing} hash "
                    f"(a 4-byte salt and a {_DIGEST_SIZES[hashing]}-byte digest)")
        return password_hash, hashing

    def import_permissions(self) -> None:
        for where, item in _items(self.document, "permissions"):
            user = _text(where, item, "user")
            if user not in self.users:
                raise DefinitionsError(f"{where}: no user '{user}' (not on the node and not "
                                       "in the definitions)")
            vhost = self.vhost(where, item)
            patterns = [_text(where, item, kind, empty=True)
                        for kind in ("configure", "write", "read")]
            try:
                Permissions(*patterns)
            except InvalidPattern as error:
                raise DefinitionsError(f"{where}: {error}") from None
            self.add("permissions.set", user=user, vhost=vhost, patterns=patterns)

    # ---------------------------------------------------------- parameters, policies

    def import_parameters(self) -> None:
        for where, item in _items(self.document, "parameters"):
            component = item.get("component")
            vhost = self.vhost(where, item)
            value = item.get("value")
            if component == "vhost-limits":
                self.vhost_limits(where, vhost, _pairs(where, value, "value"))
            elif component == "operator_policy":
                if not isinstance(value, dict):
                    raise DefinitionsError(f"{where}: an operator policy's 'value' must be "
                                           f"an object, got {value!r}")
                name = _text(where, item, "name")
                try:
                    policy = parse_operator_policy(
                        vhost, name, value.get("pattern"),
                        _pairs(where, value.get("definition"), "definition"),
                        value.get("priority", 0), value.get("apply-to", "all"))
                except PolicyError as error:
                    raise DefinitionsError(f"{where}: {error}") from None
                self.add("operator_policy.set", policy=policy.as_dict())
            elif component == SHOVEL:
                name = _text(where, item, "name")
                try:
                    check_shovel(value, name)
                except ShovelError as error:
                    raise DefinitionsError(f"{where}: shovel '{name}': {error}") from None
                self.add("parameter.set", component=SHOVEL, vhost=vhost, name=name,
                         value=value)
            else:
                raise DefinitionsError(
                    f"{where}: runtime parameters of component {component!r} are not "
                    "supported by quorumqueue (it reads operator_policy, vhost-limits "
                    "and shovel)")

    def import_global_parameters(self) -> None:
        for where, item in _items(self.document, "global_parameters"):
            name = item.get("name")
            if name == "cluster_name":
                if item.get("value") != self.node.settings.cluster_name:
                    self.plan.notes.append(
                        f"global parameter cluster_name {item.get('value')!r} is not "
                        f"applied: this node's cluster name is "
                        f"'{self.node.settings.cluster_name}', from its configuration "
                        "(cluster_name)")
            elif isinstance(name, str) and name.startswith("internal"):
                continue  # RabbitMQ's own (internal_cluster_id): never exported by it
            else:
                raise DefinitionsError(f"{where}: global parameter {name!r} is not supported "
                                       "by quorumqueue (it reads cluster_name)")

    def import_policies(self) -> None:
        for where, item in _items(self.document, "policies"):
            vhost = self.vhost(where, item)
            try:
                policy = parse_policy(vhost, _text(where, item, "name"), item.get("pattern"),
                                      _pairs(where, item.get("definition"), "definition"),
                                      item.get("priority", 0), item.get("apply-to", "all"),
                                      permit_mirroring=bool(getattr(
                                          self.node.settings,
                                          "permit_classic_queue_mirroring", False)))
            except PolicyError as error:
                raise DefinitionsError(f"{where}: {error}") from None
            self.add("policy.set", policy=policy.as_dict())

    # ---------------------------------------------------------- exchanges, queues, bindings

    def import_exchanges(self) -> None:
        for where, item in _items(self.document, "exchanges"):
            vhost = self.vhost(where, item)
            name = _text(where, item, "name", empty=True)
            if not name or name.startswith("amq."):
                self.plan.notes.append(f"exchange '{name}' in vhost '{vhost}' skipped (the "
                                       "default and amq.* exchanges exist in every vhost)")
                continue
            kind = item.get("type")
            if kind not in EXCHANGE_TYPES:
                raise DefinitionsError(f"{where}: exchange type {kind!r} is not supported "
                                       f"(known: {', '.join(EXCHANGE_TYPES)})")
            arguments = _table(where, item)
            if name in self.exchanges[vhost]:
                self.plan.notes.append(f"exchange '{name}' in vhost '{vhost}' exists: kept "
                                       "as it is")
                continue
            self.add("exchange.declare", vhost=vhost, name=name, type=kind,
                     durable=_flag(where, item, "durable", True),
                     auto_delete=_flag(where, item, "auto_delete", False),
                     internal=_flag(where, item, "internal", False), arguments=arguments)
            self.exchanges[vhost].add(name)

    def import_queues(self) -> None:
        node = self.node
        for where, item in _items(self.document, "queues"):
            vhost = self.vhost(where, item)
            name = _text(where, item, "name")
            if name.startswith("amq."):
                self.plan.notes.append(f"queue '{name}' in vhost '{vhost}' skipped (amq.* "
                                       "names are reserved)")
                continue
            arguments = dict(_table(where, item))
            kind = item.get("type", arguments.get("x-queue-type", "classic"))
            if "x-queue-type" not in arguments and kind != "classic":
                arguments["x-queue-type"] = kind
            try:
                spec = validate_declaration(name, vhost, _flag(where, item, "durable", True),
                                            False, _flag(where, item, "auto_delete", False),
                                            arguments)
            except AMQPError as error:
                raise DefinitionsError(f"{where}: {error.detail}") from None
            if spec.type != kind:
                raise DefinitionsError(f"{where}: type {kind!r} and argument x-queue-type "
                                       f"{arguments.get('x-queue-type')!r} disagree")
            if name in self.queues[vhost]:
                self.plan.notes.append(f"queue '{name}' in vhost '{vhost}' exists: kept as "
                                       "it is")
                continue
            queue_type = registry.type_of(spec.type)
            record = queue_type.place(
                vhost, name, dict(spec.arguments), node.policy_for(vhost, spec.type, name),
                node.settings, node.cluster, exclusive=False)
            record.update(queue_type.recorded_flags(spec.durable, spec.auto_delete, None))
            self.add("queue.declare", vhost=vhost, name=name, type=spec.type,
                     arguments=dict(spec.arguments), **record)
            self.queues[vhost].add(name)

    def import_bindings(self) -> None:
        for where, item in _items(self.document, "bindings"):
            vhost = self.vhost(where, item)
            source = _text(where, item, "source", empty=True)
            destination = _text(where, item, "destination")
            kind = item.get("destination_type")
            if kind not in (QUEUE, EXCHANGE):
                raise DefinitionsError(f"{where}: destination_type must be 'queue' or "
                                       f"'exchange', got {kind!r}")
            if not source:
                raise DefinitionsError(f"{where}: the default exchange cannot be bound")
            if source not in self.exchanges[vhost]:
                raise DefinitionsError(f"{where}: no exchange '{source}' in vhost '{vhost}'")
            known = self.queues[vhost] if kind == QUEUE else self.exchanges[vhost]
            if destination not in known:
                raise DefinitionsError(f"{where}: no {kind} '{destination}' in vhost "
                                       f"'{vhost}'")
            self.add("bind", vhost=vhost, source=source, kind=kind, destination=destination,
                     routing_key=_text(where, item, "routing_key", "", empty=True),
                     arguments=_table(where, item))


VHOST_SECTIONS = ("parameters", "policies", "queues", "exchanges", "bindings")


def import_plan(node: "Node", document, vhost: str | None = None) -> Plan:
    """The metadata commands that import `document` (module header) — into `vhost`
    alone, if given — or DefinitionsError naming what is wrong."""
    if not isinstance(document, dict):
        raise DefinitionsError("the definitions must be a JSON object (as "
                               f"export_definitions writes), got {type(document).__name__}")
    if vhost is None:
        return _Importer(node, document).run()
    if vhost not in node.vhosts:
        raise DefinitionsError(f"no vhost '{vhost}': create it before importing its "
                               "definitions")
    for section in ("users", "vhosts", "permissions", "topic_permissions",
                    "global_parameters"):
        if document.get(section):
            raise DefinitionsError(f"'{section}' cannot be imported into one vhost (import "
                                   "the file for the whole node instead)")
    scoped: dict = {"vhosts": [{"name": vhost, "limits": document.get("limits") or {}}]}
    for section in VHOST_SECTIONS:
        items = document.get(section) or []
        if not isinstance(items, list):
            raise DefinitionsError(f"'{section}' must be a list, got "
                                   f"{type(items).__name__}")
        scoped[section] = [{**item, "vhost": vhost} if isinstance(item, dict) else item
                           for item in items]
    return _Importer(node, scoped).run()

"""Users, vhosts, permissions, policies and operator policies: checking a change and applying it to a node
(vhost and user limits: limits.py, applied through `apply_command` too).

Responsibilities
    `check_*` functions refuse what cannot be done, with RabbitMQ's reply codes and
    a text naming the user, vhost or policy; they change nothing. `apply_*`
    functions make a checked change on this node: the management RPC calls them
    directly on a node of its own, and every node of a cluster calls them when it
    applies the same metadata command (groups/metadata.py), so every node ends up with
    the same users, vhosts, permissions and policies.

How it works
    Passwords are hashed on the node the client talks to (auth/users.py); only the
    hash travels and is stored. Deleting a user closes its connections; deleting a
    vhost deletes its queues (quorum queues' groups included) and exchanges and
    closes the connections to it (320 CONNECTION_FORCED, as RabbitMQ). Setting or
    clearing a policy re-applies the policies of its vhost (node.apply_policies):
    classic queues take their new limits at once, quorum queues through their log.

Invariants: `apply_*` are idempotent (a retried metadata command applies twice);
after any of them the node's metadata is marked dirty, so it is written out.

Not here: the policy rules themselves (policies.py), the wire (management.py, the
CLI in cli/ctl.py), replication (groups/metadata.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..amqp import spec
from ..amqp.errors import AMQPError, precondition
from ..auth.users import SHA256, InvalidPattern, Permissions, User
from . import limits
from .operator_policies import parse_operator_policy
from .policies import Policy, PolicyError, parse_policy

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

NAME_LIMIT = 255  # bytes, as AMQP short strings


# ------------------------------------------------------------------ checks


def _name(kind: str, value) -> str:
    if not isinstance(value, str) or not value or len(value.encode()) > NAME_LIMIT:
        raise precondition(f"a {kind} name must be a non-empty string of at most "
                           f"{NAME_LIMIT} bytes, got {value!r}")
    return value


def check_new_user(node: "Node", name, password) -> None:
    _name("user", name)
    check_password(name, password)
    if name in node.users.users:
        raise AMQPError(spec.PRECONDITION_FAILED, f"user '{name}' already exists")


def check_password(name: str, password) -> None:
    if not isinstance(password, str) or not password:
        raise precondition(f"user '{name}': the password must be a non-empty string")


def check_user(node: "Node", name) -> User:
    user = node.users.users.get(name) if isinstance(name, str) else None
    if user is None:
        raise AMQPError(spec.NOT_FOUND, f"no user '{name}'")
    return user


def check_tags(tags) -> tuple[str, ...]:
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) and t for t in tags):
        raise precondition(f"tags must be a list of non-empty strings, got {tags!r}")
    return tuple(dict.fromkeys(tags))


def check_vhost(node: "Node", name) -> None:
    if not isinstance(name, str) or node.vhost(name) is None:
        raise AMQPError(spec.NOT_FOUND, f"no vhost '{name}'")


def check_new_vhost(node: "Node", name) -> None:
    _name("vhost", name)
    if node.vhost(name) is not None:
        raise AMQPError(spec.PRECONDITION_FAILED, f"vhost '{name}' already exists")


def check_permissions(node: "Node", user, vhost, configure, write, read) -> Permissions:
    check_user(node, user)
    check_vhost(node, vhost)
    for kind, pattern in (("configure", configure), ("write", write), ("read", read)):
        if not isinstance(pattern, str):
            raise precondition(f"the {kind} pattern must be a string, got {pattern!r}")
    try:
        return Permissions(configure, write, read)
    except InvalidPattern as error:
        raise precondition(f"permissions of user '{user}' in vhost '{vhost}': {error}") \
            from None


def check_policy(node: "Node", vhost, name, pattern, definition, priority,
                 apply_to) -> Policy:
    check_vhost(node, vhost)
    try:
        return parse_policy(vhost, name, pattern, definition, priority, apply_to,
                            permit_mirroring=_permits_mirroring(node))
    except PolicyError as error:
        raise precondition(str(error)) from None


def check_existing_policy(node: "Node", vhost, name) -> None:
    check_vhost(node, vhost)
    if name not in node.policies.get(vhost, {}):
        raise AMQPError(spec.NOT_FOUND, f"no policy '{name}' in vhost '{vhost}'")


def check_parameter(node: "Node", component, vhost, name, value):
    """A runtime parameter's value, checked (component "shovel": broker/shovel/
    parameters.py); 406 with rabbitmqctl's text when refused."""
    from ..shovel.parameters import COMPONENT, ShovelError, check

    check_vhost(node, vhost)
    _name("parameter", name)
    if component != COMPONENT:
        raise AMQPError(spec.NOT_FOUND, f"component {component!r} not found (quorumqueue "
                        f"knows runtime parameters of component '{COMPONENT}')")
    try:
        check(value, name)
    except ShovelError as error:
        raise precondition(str(error)) from None
    return value


def check_existing_parameter(node: "Node", component, vhost, name) -> None:
    check_vhost(node, vhost)
    if (component, vhost, name) not in node.parameters:
        raise AMQPError(spec.NOT_FOUND, f"Parameter does not exist (component {component!r}, "
                        f"name {name!r} in vhost '{vhost}')")


def check_operator_policy(node: "Node", vhost, name, pattern, definition, priority,
                          apply_to) -> Policy:
    check_vhost(node, vhost)
    try:
        return parse_operator_policy(vhost, name, pattern, definition, priority, apply_to)
    except PolicyError as error:
        raise precondition(str(error)) from None


def check_existing_operator_policy(node: "Node", vhost, name) -> None:
    check_vhost(node, vhost)
    if name not in node.operator_policies.get(vhost, {}):
        raise AMQPError(spec.NOT_FOUND, f"no operator policy '{name}' in vhost '{vhost}'")


# ------------------------------------------------------------------ applying


def apply_user(node: "Node", name: str, password_hash: str, tags: tuple[str, ...],
               hashing: str = SHA256) -> None:
    """Create the user, or give an existing one this password hash (made with
    `hashing`, auth/users.py) and these tags (its permissions stay)."""
    existing = node.users.users.get(name)
    permissions = existing.permissions if existing is not None else {}
    user_limits = existing.limits if existing is not None else {}
    node.users.users[name] = User(name, password_hash, tuple(tags), permissions, user_limits,
                                  hashing)
    node.metadata_dirty = True


def apply_delete_user(node: "Node", name: str) -> None:
    if node.users.users.pop(name, None) is None:
        return
    node.metadata_dirty = True
    _close_sessions(node, lambda session: session.user is not None
                    and session.user.name == name, f"user '{name}' was deleted")


def apply_vhost(node: "Node", name: str) -> None:
    from .vhost import VHost

    if name not in node.vhosts:
        node.vhosts[name] = VHost(name)
        node.metadata_dirty = True


def apply_delete_vhost(node: "Node", name: str) -> None:
    vhost = node.vhosts.get(name)
    if vhost is None:
        return
    _close_sessions(node, lambda session: session.vhost is vhost,
                    f"vhost '{name}' is deleted")
    for queue in list(vhost.queues.values()):
        node.delete_queue(vhost, queue)
    del node.vhosts[name]
    for user in node.users.users.values():
        user.permissions.pop(name, None)
    node.policies.pop(name, None)
    node.operator_policies.pop(name, None)
    for key in [k for k in node.parameters if k[1] == name]:
        del node.parameters[key]
    node.metadata_dirty = True


def apply_permissions(node: "Node", user: str, vhost: str,
                      permissions: Permissions | None) -> None:
    """Set (or clear, with None) a user's permissions in a vhost."""
    account = node.users.users.get(user)
    if account is None or (permissions is not None and vhost not in node.vhosts):
        return  # deleted meanwhile (through another node of the cluster)
    if permissions is None:
        if account.permissions.pop(vhost, None) is None:
            return
    else:
        account.permissions[vhost] = permissions
    node.metadata_dirty = True


def apply_policy(node: "Node", policy: Policy) -> None:
    node.policies.setdefault(policy.vhost, {})[policy.name] = policy
    node.metadata_dirty = True
    node.apply_policies(policy.vhost)


def apply_clear_policy(node: "Node", vhost: str, name: str) -> None:
    if node.policies.get(vhost, {}).pop(name, None) is None:
        return
    node.metadata_dirty = True
    node.apply_policies(vhost)


def apply_operator_policy(node: "Node", policy: Policy) -> None:
    node.operator_policies.setdefault(policy.vhost, {})[policy.name] = policy
    node.metadata_dirty = True
    node.apply_policies(policy.vhost)


def apply_clear_operator_policy(node: "Node", vhost: str, name: str) -> None:
    if node.operator_policies.get(vhost, {}).pop(name, None) is None:
        return
    node.metadata_dirty = True
    node.apply_policies(vhost)


def apply_parameter(node: "Node", component: str, vhost: str, name: str, value) -> None:
    if vhost in node.vhosts:  # deleted meanwhile through another node
        node.parameters[(component, vhost, name)] = value
        node.metadata_dirty = True


def apply_clear_parameter(node: "Node", component: str, vhost: str, name: str) -> None:
    if node.parameters.pop((component, vhost, name), None) is not None:
        node.metadata_dirty = True


def apply_command(node: "Node", c: dict) -> None:
    """Apply one definition command ({"op": ..., fields}, as groups/metadata.py lists
    them): the one way a checked change reaches a node, whether the management RPC
    applies it on a node of its own or every node applies it from the metadata log."""
    match c["op"]:
        case "user.put":
            apply_user(node, c["name"], c["password_hash"], tuple(c["tags"]),
                       c.get("hashing_algorithm", SHA256))
        case "user.delete":
            apply_delete_user(node, c["name"])
        case "vhost.add":
            apply_vhost(node, c["name"])
        case "vhost.delete":
            apply_delete_vhost(node, c["name"])
        case "permissions.set":
            apply_permissions(node, c["user"], c["vhost"], Permissions(*c["patterns"]))
        case "permissions.clear":
            apply_permissions(node, c["user"], c["vhost"], None)
        case "policy.set":
            p = c["policy"]
            if p["vhost"] in node.vhosts:  # deleted meanwhile through another node
                apply_policy(node, parse_policy(p["vhost"], p["name"], p["pattern"],
                                                p["definition"], p["priority"],
                                                p["apply_to"],
                                                permit_mirroring=_permits_mirroring(node)))
        case "policy.clear":
            apply_clear_policy(node, c["vhost"], c["name"])
        case "operator_policy.set":
            p = c["policy"]
            if p["vhost"] in node.vhosts:
                apply_operator_policy(node, parse_operator_policy(
                    p["vhost"], p["name"], p["pattern"], p["definition"], p["priority"],
                    p["apply_to"]))
        case "operator_policy.clear":
            apply_clear_operator_policy(node, c["vhost"], c["name"])
        case "parameter.set":
            apply_parameter(node, c["component"], c["vhost"], c["name"], c["value"])
        case "parameter.clear":
            apply_clear_parameter(node, c["component"], c["vhost"], c["name"])
        case "vhost.limits":
            limits.apply_vhost_limits(node, c["vhost"], c["limits"])
        case "user.limits":
            limits.apply_user_limits(node, c["name"], c["limits"])
        case op:
            raise ValueError(f"not a definition command: {op!r}")


COMMANDS = ("user.put", "user.delete", "vhost.add", "vhost.delete", "permissions.set",
            "permissions.clear", "policy.set", "policy.clear", "operator_policy.set",
            "operator_policy.clear", "vhost.limits", "user.limits", "parameter.set",
            "parameter.clear")


def _close_sessions(node: "Node", which, reason: str) -> None:
    now = node.now
    for session in list(node.sessions):
        if which(session):
            session.server_close(spec.CONNECTION_FORCED, reason, now)
            node.dirty.add(session)


# ------------------------------------------------------------------ listing


def user_rows(node: "Node") -> list[dict]:
    return [{"name": user.name, "tags": list(user.tags)}
            for user in sorted(node.users.users.values(), key=lambda u: u.name)]


def permission_rows(node: "Node", vhost: str | None = None,
                    user: str | None = None) -> list[dict]:
    rows = []
    for account in sorted(node.users.users.values(), key=lambda u: u.name):
        if user is not None and account.name != user:
            continue
        for name, rights in sorted(account.permissions.items()):
            if vhost is None or name == vhost:
                rows.append({"user": account.name, "vhost": name,
                             "configure": rights.configure, "write": rights.write,
                             "read": rights.read})
    return rows


def policy_rows(node: "Node", vhost: str | None = None, operator: bool = False) -> list[dict]:
    """The policies (`operator`: the operator policies) of `vhost`, or of every vhost."""
    store = node.operator_policies if operator else node.policies
    return [policy.as_dict() for name in sorted(store)
            if vhost is None or name == vhost
            for policy in sorted(store[name].values(), key=lambda p: p.name)]


def _permits_mirroring(node: "Node") -> bool:
    """deprecated_features.permit.classic_queue_mirroring (ha-* policy keys)."""
    return bool(getattr(node.settings, "permit_classic_queue_mirroring", False))

"""Management RPC operations on users, vhosts, permissions and policies (rabbitmqctl's
add_user, add_vhost, set_permissions, set_policy and their kin; the CLI is
cli/ctl.py).

Operations (request fields -> result):
  users.add          {name, password, tags?}         -> {}
  users.delete       {name}                          -> {}
  users.change_password {name, password}             -> {}
  users.set_tags     {name, tags}                    -> {}
  users.list         {}                              -> [{name, tags}]
  vhosts.add         {name}                          -> {}
  vhosts.delete      {name}                          -> {}
  vhosts.list        {}                              -> [{name}]
  permissions.set    {vhost, user, configure, write, read} -> {}
  permissions.clear  {vhost, user}                   -> {}
  permissions.list   {vhost?, user?}                 -> [{user, vhost, configure, write, read}]
  policies.set       {vhost, name, pattern, definition, priority?, apply_to?} -> {}
  policies.clear     {vhost, name}                   -> {}
  policies.list      {vhost?}                        -> [{vhost, name, pattern, definition,
                                                          priority, apply_to}]
  operator_policies.set {vhost, name, pattern, definition, priority?, apply_to?} -> {}
  operator_policies.clear {vhost, name}              -> {}
  operator_policies.list {vhost?}                    -> [the fields of policies.list]
                     (node/operator_policies.py: rabbitmqctl set_operator_policy)
  vhosts.set_limits  {vhost, limits}                 -> {}   (replaces them all)
  vhosts.clear_limits {vhost}                        -> {}
  vhosts.list_limits {vhost?}                        -> [{vhost, limits}]
  users.set_limits   {name, limits}                  -> {}   (merged with the user's)
  users.clear_limits {name, limit: NAME | "all"}     -> {}
  users.list_limits  {name?}                         -> [{user, limits}]
  (limits: node/limits.py; rabbitmqctl's set_vhost_limits and set_user_limits)
  parameters.set     {vhost, component, name, value} -> {}   (component "shovel":
                     its value checked by broker/shovel/parameters.py)
  parameters.clear   {vhost, component, name}        -> {}
  parameters.list    {vhost?, component?}            -> [{vhost, component, name, value}]
  shovels.status     {}                              -> [the rows of the shovels, from
                     the node that runs them (broker/shovel/worker.py `status`)]
All need a user tagged `administrator`. A change is checked on the node the client
talks to (definitions.py), then proposed to the metadata group (a node of its own is
a cluster of one) and answered once this node applied it: every node then has it.
"""

from __future__ import annotations

from typing import Any, Callable

from ..auth.users import hash_password
from . import definitions as d
from . import limits


def _require_administrator(session) -> None:
    from .management import _require_administrator as required  # management imports us

    required(session)


def _change(node, op: str, fields: dict):
    """Propose the command to the metadata group (every node applies it with
    definitions.apply_command); answered once this node applied it."""
    from ..groups import metadata as meta
    from .management import Later

    data = meta.encode(op, **fields)
    return Later(lambda done: node.cluster.meta.propose_data(data, lambda _reply: done({})),
                 metadata=True)


def _users_add(node, session, request):
    _require_administrator(session)
    name, password = request.get("name"), request.get("password")
    d.check_new_user(node, name, password)
    tags = d.check_tags(request.get("tags", []))
    password_hash = hash_password(password)
    return _change(node, "user.put", {"name": name, "password_hash": password_hash,
                                      "tags": list(tags)})


def _users_change_password(node, session, request):
    _require_administrator(session)
    user = d.check_user(node, request.get("name"))
    password = request.get("password")
    d.check_password(user.name, password)
    password_hash = hash_password(password)
    return _change(node, "user.put", {"name": user.name, "password_hash": password_hash,
                                      "tags": list(user.tags)})


def _users_set_tags(node, session, request):
    _require_administrator(session)
    user = d.check_user(node, request.get("name"))
    tags = d.check_tags(request.get("tags"))
    return _change(node, "user.put", {"name": user.name, "password_hash": user.password_hash,
                                      "tags": list(tags),
                                      "hashing_algorithm": user.hashing})


def _users_delete(node, session, request):
    _require_administrator(session)
    user = d.check_user(node, request.get("name"))
    return _change(node, "user.delete", {"name": user.name})


def _users_list(node, session, request) -> list[dict]:
    _require_administrator(session)
    return d.user_rows(node)


def _vhosts_add(node, session, request):
    _require_administrator(session)
    name = request.get("name")
    d.check_new_vhost(node, name)
    return _change(node, "vhost.add", {"name": name})


def _vhosts_delete(node, session, request):
    _require_administrator(session)
    name = request.get("name")
    d.check_vhost(node, name)
    return _change(node, "vhost.delete", {"name": name})


def _vhosts_list(node, session, request) -> list[dict]:
    _require_administrator(session)
    return [{"name": name} for name in sorted(node.vhosts)]


def _permissions_set(node, session, request):
    _require_administrator(session)
    vhost, user = request.get("vhost", "/"), request.get("user")
    rights = d.check_permissions(node, user, vhost, request.get("configure"),
                                 request.get("write"), request.get("read"))
    return _change(node, "permissions.set", {"user": user, "vhost": vhost,
                                             "patterns": rights.as_list()})


def _permissions_clear(node, session, request):
    _require_administrator(session)
    vhost, user = request.get("vhost", "/"), request.get("user")
    d.check_user(node, user)
    d.check_vhost(node, vhost)
    return _change(node, "permissions.clear", {"user": user, "vhost": vhost})


def _permissions_list(node, session, request) -> list[dict]:
    _require_administrator(session)
    vhost, user = request.get("vhost"), request.get("user")
    if vhost is not None:
        d.check_vhost(node, vhost)
    if user is not None:
        d.check_user(node, user)
    return d.permission_rows(node, vhost, user)


def _policies_set(node, session, request):
    _require_administrator(session)
    policy = d.check_policy(node, request.get("vhost", "/"), request.get("name"),
                            request.get("pattern"), request.get("definition"),
                            request.get("priority", 0), request.get("apply_to", "all"))
    return _change(node, "policy.set", {"policy": policy.as_dict()})


def _policies_clear(node, session, request):
    _require_administrator(session)
    vhost, name = request.get("vhost", "/"), request.get("name")
    d.check_existing_policy(node, vhost, name)
    return _change(node, "policy.clear", {"vhost": vhost, "name": name})


def _policies_list(node, session, request) -> list[dict]:
    _require_administrator(session)
    vhost = request.get("vhost")
    if vhost is not None:
        d.check_vhost(node, vhost)
    return d.policy_rows(node, vhost)


def _operator_policies_set(node, session, request):
    _require_administrator(session)
    policy = d.check_operator_policy(node, request.get("vhost", "/"), request.get("name"),
                                     request.get("pattern"), request.get("definition"),
                                     request.get("priority", 0),
                                     request.get("apply_to", "all"))
    return _change(node, "operator_policy.set", {"policy": policy.as_dict()})


def _operator_policies_clear(node, session, request):
    _require_administrator(session)
    vhost, name = request.get("vhost", "/"), request.get("name")
    d.check_existing_operator_policy(node, vhost, name)
    return _change(node, "operator_policy.clear", {"vhost": vhost, "name": name})


def _operator_policies_list(node, session, request) -> list[dict]:
    _require_administrator(session)
    vhost = request.get("vhost")
    if vhost is not None:
        d.check_vhost(node, vhost)
    return d.policy_rows(node, vhost, operator=True)


def _vhosts_set_limits(node, session, request):
    _require_administrator(session)
    vhost = request.get("vhost", "/")
    d.check_vhost(node, vhost)
    wanted = limits.check_vhost_limits(request.get("limits"))
    return _change(node, "vhost.limits", {"vhost": vhost, "limits": wanted})


def _vhosts_clear_limits(node, session, request):
    _require_administrator(session)
    vhost = request.get("vhost", "/")
    d.check_vhost(node, vhost)
    return _change(node, "vhost.limits", {"vhost": vhost, "limits": {}})


def _vhosts_list_limits(node, session, request) -> list[dict]:
    _require_administrator(session)
    vhost = request.get("vhost")
    if vhost is not None:
        d.check_vhost(node, vhost)
    return limits.vhost_limit_rows(node, vhost)


def _users_set_limits(node, session, request):
    _require_administrator(session)
    user = d.check_user(node, request.get("name"))
    wanted = {**user.limits, **limits.check_user_limits(request.get("limits"))}
    return _change(node, "user.limits", {"name": user.name, "limits": wanted})


def _users_clear_limits(node, session, request):
    _require_administrator(session)
    user = d.check_user(node, request.get("name"))
    name = limits.check_user_limit_name(request.get("limit", "all"))
    wanted = {} if name == "all" else {k: v for k, v in user.limits.items() if k != name}
    return _change(node, "user.limits", {"name": user.name, "limits": wanted})


def _users_list_limits(node, session, request) -> list[dict]:
    _require_administrator(session)
    name = request.get("name")
    if name is not None:
        d.check_user(node, name)
    return limits.user_limit_rows(node, name)


def _parameters_set(node, session, request):
    _require_administrator(session)
    vhost, component, name = (request.get("vhost", "/"), request.get("component"),
                              request.get("name"))
    value = d.check_parameter(node, component, vhost, name, request.get("value"))
    return _change(node, "parameter.set", {"component": component, "vhost": vhost,
                                           "name": name, "value": value})


def _parameters_clear(node, session, request):
    _require_administrator(session)
    vhost, component, name = (request.get("vhost", "/"), request.get("component"),
                              request.get("name"))
    d.check_existing_parameter(node, component, vhost, name)
    return _change(node, "parameter.clear", {"component": component, "vhost": vhost,
                                             "name": name})


def _parameters_list(node, session, request) -> list[dict]:
    _require_administrator(session)
    vhost, component = request.get("vhost"), request.get("component")
    if vhost is not None:
        d.check_vhost(node, vhost)
    return [item for item in node.parameter_items()
            if (vhost is None or item["vhost"] == vhost)
            and (component is None or item["component"] == component)]


def _shovels_status(node, session, request):
    """The shovels' rows from the node that runs them (the metadata group's leader):
    this node's own, or asked over the cluster (cluster/replica_rpc.py "shovels");
    a shovel whose runner does not answer (none elected, unreachable) or that has
    not started yet has state "unknown" and the node expected to run it."""
    _require_administrator(session)
    runner = node.cluster.meta.leader_id

    def rows(answered: list[dict]) -> list[dict]:
        shown = list(answered)
        here = {(row["vhost"], row["name"]) for row in shown}
        for (vhost, name), value in sorted(node.shovel_parameters().items()):
            if (vhost, name) not in here:
                shown.append({"name": name, "vhost": vhost, "type": "dynamic",
                              "node": runner or "", "state": "unknown",
                              "source": str(value.get("src-uri", "")),
                              "destination": str(value.get("dest-uri", "")),
                              "termination_reason": ""})
        return sorted(shown, key=lambda row: (row["vhost"], row["name"]))

    if runner is None or runner == node.cluster.name:
        return rows(node.shovel_rows())
    from ..cluster import replica_rpc
    from ..groups import metadata as meta_group
    from .management import Later

    return Later(lambda done: replica_rpc.ask(
        node.cluster, runner, meta_group.META_GROUP, "shovels", {},
        lambda answer: done(rows(answer["rows"] if answer else []))))


OPERATIONS: dict[str, Callable[..., Any]] = {
    "users.add": _users_add, "users.delete": _users_delete,
    "users.change_password": _users_change_password, "users.set_tags": _users_set_tags,
    "users.list": _users_list,
    "vhosts.add": _vhosts_add, "vhosts.delete": _vhosts_delete, "vhosts.list": _vhosts_list,
    "permissions.set": _permissions_set, "permissions.clear": _permissions_clear,
    "permissions.list": _permissions_list,
    "policies.set": _policies_set, "policies.clear": _policies_clear,
    "policies.list": _policies_list,
    "operator_policies.set": _operator_policies_set,
    "operator_policies.clear": _operator_policies_clear,
    "operator_policies.list": _operator_policies_list,
    "vhosts.set_limits": _vhosts_set_limits, "vhosts.clear_limits": _vhosts_clear_limits,
    "vhosts.list_limits": _vhosts_list_limits,
    "users.set_limits": _users_set_limits, "users.clear_limits": _users_clear_limits,
    "users.list_limits": _users_list_limits,
    "parameters.set": _parameters_set, "parameters.clear": _parameters_clear,
    "parameters.list": _parameters_list, "shovels.status": _shovels_status,
}

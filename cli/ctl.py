"""`quorumqueue ctl`: users, vhosts, permissions, policies and limits of a running node, and
removing a node from its cluster, with rabbitmqctl's command names and arguments.

    quorumqueue ctl add_user NAME PASSWORD          quorumqueue ctl add_vhost NAME
    quorumqueue ctl delete_user NAME                quorumqueue ctl delete_vhost NAME
    quorumqueue ctl change_password NAME PASSWORD   quorumqueue ctl list_vhosts
    quorumqueue ctl set_user_tags NAME [TAG ...]    quorumqueue ctl list_users
    quorumqueue ctl set_permissions [-p VHOST] USER CONF WRITE READ
    quorumqueue ctl clear_permissions [-p VHOST] USER
    quorumqueue ctl list_permissions [-p VHOST]     quorumqueue ctl list_user_permissions USER
    quorumqueue ctl set_policy [-p VHOST] [--priority N] [--apply-to KIND] NAME PATTERN DEFINITION
    quorumqueue ctl clear_policy [-p VHOST] NAME    quorumqueue ctl list_policies [-p VHOST]
    quorumqueue ctl set_operator_policy [-p VHOST] [--priority N] [--apply-to KIND] NAME PATTERN DEFINITION
    quorumqueue ctl clear_operator_policy [-p VHOST] NAME
    quorumqueue ctl list_operator_policies [-p VHOST]
    quorumqueue ctl list_queues [-p VHOST] [COLUMN ...]   (name policy operator_policy
                                                        effective_policy_definition
                                                        pid slave_pids
                                                        synchronised_slave_pids ...)
    quorumqueue ctl sync_queue [-p VHOST] QUEUE
    quorumqueue ctl cancel_sync_queue [-p VHOST] QUEUE   (mirrored classic queues)
    quorumqueue ctl export_definitions [-p VHOST] [--transformations NAMES] FILE|-
    quorumqueue ctl import_definitions [-p VHOST] FILE|-
    quorumqueue ctl transform_definitions --transformations NAMES IN|- OUT|-   (offline:
        a file exported from RabbitMQ; cli/definitions_transform.py)
    quorumqueue ctl forget_cluster_node NODE        (a stopped node, removed for good)
    quorumqueue ctl set_parameter [-p VHOST] shovel NAME '{"src-uri": ..., ...}'
    quorumqueue ctl clear_parameter [-p VHOST] shovel NAME
    quorumqueue ctl list_parameters [-p VHOST]      quorumqueue ctl shovel_status
        (dynamic shovels: broker/shovel/)
    quorumqueue ctl set_vhost_limits [-p VHOST] '{"max-connections": N, "max-queues": N}'
    quorumqueue ctl clear_vhost_limits [-p VHOST]
    quorumqueue ctl list_vhost_limits [-p VHOST] [--global]
    quorumqueue ctl set_user_limits USER '{"max-connections": N, "max-channels": N}'
    quorumqueue ctl clear_user_limits USER LIMIT|all
    quorumqueue ctl list_user_limits [--user USER | --all]

Each goes to the node's management HTTP API (--host, --port (15672), --username,
--password, --ssl..., or --base-uri; client/http_management.py), as rabbitmqadmin
does, as an administrator: RabbitMQ's endpoints (/api/users, /api/vhosts,
/api/permissions, /api/policies, /api/operator-policies, /api/vhost-limits,
/api/user-limits, /api/definitions, /api/queues and RabbitMQ 3.x's
/api/queues/VHOST/NAME/actions) where they do what the command does, and
quorumqueue's (/api/quorumqueue/definitions/import, /api/quorumqueue/cluster-nodes/
NODE: broker/management/operations.py) where RabbitMQ's API has none. Behind them
are the management operations of node/definition_ops.py, node/definitions_json.py
and node/membership.py: in a cluster any node will do, and every node has the
change once the command returns. rabbitmqctl's semantics are kept where the HTTP
API's differ: add_user and add_vhost refuse an existing name (a PUT would update
it), change_password and set_user_tags keep the rest of the user, and add_vhost
gives nobody permissions (a PUT gives the creating user full ones, so the command
takes them back).
"""

from __future__ import annotations

import json

import click

from .http import call, echo_table, guarded, management_options, queue_rows
from .definitions_transform import TRANSFORMATIONS, TransformationError, parse_names, transform

vhost_option = click.option("-p", "--vhost", default="/", show_default=True,
                            help="The virtual host.")


@click.group()
def ctl() -> None:
    """Users, vhosts, permissions and policies of a running node (like rabbitmqctl)."""


@ctl.command("add_user")
@management_options
@click.argument("name")
@click.argument("password")
def add_user(api, name, password) -> None:
    """Create user NAME, with no permissions and no tags."""
    if _exists(api, "users", name):
        raise click.ClickException(f"PRECONDITION_FAILED - user '{name}' already exists")
    call(api, "PUT", "users", name, body={"password": password, "tags": ""})
    click.echo(f"Adding user \"{name}\" ...")


@ctl.command("delete_user")
@management_options
@click.argument("name")
def delete_user(api, name) -> None:
    """Delete user NAME (its connections are closed)."""
    call(api, "DELETE", "users", name, missing=_no_user(name))
    click.echo(f"Deleting user \"{name}\" ...")


@ctl.command("change_password")
@management_options
@click.argument("name")
@click.argument("password")
def change_password(api, name, password) -> None:
    """Give user NAME a new password."""
    user = call(api, "GET", "users", name, missing=_no_user(name))
    call(api, "PUT", "users", name, body={"password": password, "tags": user["tags"]})
    click.echo(f"Changing password for user \"{name}\" ...")


@ctl.command("set_user_tags")
@management_options
@click.argument("name")
@click.argument("tags", nargs=-1)
def set_user_tags(api, name, tags) -> None:
    """Replace the tags of user NAME (administrator: may use these commands)."""
    call(api, "GET", "users", name, missing=_no_user(name))
    call(api, "PUT", "users", name, body={"tags": list(tags)})  # the password stays
    click.echo(f"Setting tags for user \"{name}\" to [{', '.join(tags)}] ...")


@ctl.command("list_users")
@management_options
def list_users(api) -> None:
    """Every user and its tags."""
    rows = call(api, "GET", "users")
    echo_table(["user", "tags"], [[r["name"], f"[{', '.join(r['tags'])}]"] for r in rows])


@ctl.command("add_vhost")
@management_options
@click.argument("name")
def add_vhost(api, name) -> None:
    """Create virtual host NAME (no user has permissions in it yet)."""
    if _exists(api, "vhosts", name):
        raise click.ClickException(f"PRECONDITION_FAILED - vhost '{name}' already exists")
    call(api, "PUT", "vhosts", name)
    # RabbitMQ's PUT /api/vhosts gives the creating user full permissions in it;
    # rabbitmqctl add_vhost gives none
    call(api, "DELETE", "permissions", name, api.username, allow_missing=True)
    click.echo(f"Adding vhost \"{name}\" ...")


@ctl.command("delete_vhost")
@management_options
@click.argument("name")
def delete_vhost(api, name) -> None:
    """Delete virtual host NAME with its queues, exchanges, permissions and policies."""
    call(api, "DELETE", "vhosts", name, missing=_no_vhost(name))
    click.echo(f"Deleting vhost \"{name}\" ...")


@ctl.command("list_vhosts")
@management_options
def list_vhosts(api) -> None:
    """Every virtual host."""
    rows = call(api, "GET", "vhosts", query={"columns": "name"})
    echo_table(["name"], [[r["name"]] for r in rows])


@ctl.command("set_permissions")
@management_options
@vhost_option
@click.argument("user")
@click.argument("configure")
@click.argument("write")
@click.argument("read")
def set_permissions(api, vhost, user, configure, write, read) -> None:
    """Let USER configure, write and read the resources of VHOST whose names match
    these regular expressions ("" for none, ".*" for all)."""
    call(api, "PUT", "permissions", vhost, user,
          body={"configure": configure, "write": write, "read": read},
          missing=_no_user_or_vhost(api, user, vhost))
    click.echo(f"Setting permissions for user \"{user}\" in vhost \"{vhost}\" ...")


@ctl.command("clear_permissions")
@management_options
@vhost_option
@click.argument("user")
def clear_permissions(api, vhost, user) -> None:
    """Take away all of USER's permissions in VHOST."""
    if not _exists(api, "users", user) or not _exists(api, "vhosts", vhost):
        raise click.ClickException(_no_user_or_vhost(api, user, vhost))
    # none to clear is no error, as with rabbitmqctl
    call(api, "DELETE", "permissions", vhost, user, allow_missing=True)
    click.echo(f"Clearing permissions for user \"{user}\" in vhost \"{vhost}\" ...")


@ctl.command("list_permissions")
@management_options
@vhost_option
def list_permissions(api, vhost) -> None:
    """Every user's permissions in VHOST."""
    rows = call(api, "GET", "vhosts", vhost, "permissions", missing=_no_vhost(vhost))
    echo_table(["user", "configure", "write", "read"],
                [[r["user"], r["configure"], r["write"], r["read"]] for r in rows])


@ctl.command("list_user_permissions")
@management_options
@click.argument("user")
def list_user_permissions(api, user) -> None:
    """USER's permissions in every vhost."""
    rows = call(api, "GET", "users", user, "permissions", missing=_no_user(user))
    echo_table(["vhost", "configure", "write", "read"],
                [[r["vhost"], r["configure"], r["write"], r["read"]] for r in rows])


@ctl.command("set_policy")
@management_options
@vhost_option
@click.option("--priority", type=int, default=0, show_default=True,
              help="Of the policies matching a queue, the highest priority applies.")
@click.option("--apply-to", "apply_to", default="all", show_default=True,
              type=click.Choice(["all", "queues", "classic_queues", "quorum_queues",
                                 "exchanges"]))
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_policy(api, vhost, priority, apply_to, name, pattern, definition) -> None:
    """Set policy NAME: queues (or exchanges) whose names match PATTERN get the
    settings of DEFINITION, a JSON object, e.g. '{"max-length": 1000}'."""
    try:
        parsed = json.loads(definition)
    except ValueError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="DEFINITION") from None
    call(api, "PUT", "policies", vhost, name, missing=_no_vhost(vhost),
          body={"pattern": pattern, "definition": parsed, "priority": priority,
                "apply-to": apply_to})
    click.echo(f"Setting policy \"{name}\" for pattern \"{pattern}\" to \"{definition}\" "
               f"with priority \"{priority}\" for vhost \"{vhost}\" ...")


@ctl.command("clear_policy")
@management_options
@vhost_option
@click.argument("name")
def clear_policy(api, vhost, name) -> None:
    """Remove policy NAME from VHOST (its queues return to their own arguments)."""
    call(api, "DELETE", "policies", vhost, name,
          missing=f"NOT_FOUND - no policy '{name}' in vhost '{vhost}'")
    click.echo(f"Clearing policy \"{name}\" on vhost \"{vhost}\" ...")


@ctl.command("list_policies")
@management_options
@vhost_option
def list_policies(api, vhost) -> None:
    """The policies of VHOST."""
    _echo_policies(call(api, "GET", "policies", vhost, missing=_no_vhost(vhost)))


@ctl.command("set_operator_policy")
@management_options
@vhost_option
@click.option("--priority", type=int, default=0, show_default=True,
              help="Of the operator policies matching a queue, the highest priority applies.")
@click.option("--apply-to", "apply_to", default="all", show_default=True,
              type=click.Choice(["all", "queues", "classic_queues", "quorum_queues"]))
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_operator_policy(api, vhost, priority, apply_to, name, pattern, definition) -> None:
    """Set operator policy NAME: queues whose names match PATTERN get the settings of
    DEFINITION over their policy's, the lower value winning for limits, e.g.
    '{"max-length": 100000}' (expires, message-ttl, max-length, max-length-bytes,
    delivery-limit, overflow, target-group-size, queue-master-locator)."""
    call(api, "PUT", "operator-policies", vhost, name, missing=_no_vhost(vhost),
          body={"pattern": pattern, "definition": _definition(definition),
                "priority": priority, "apply-to": apply_to})
    click.echo(f"Setting operator policy override \"{name}\" for pattern \"{pattern}\" to "
               f"\"{definition}\" with priority \"{priority}\" for vhost \"{vhost}\" ...")


@ctl.command("clear_operator_policy")
@management_options
@vhost_option
@click.argument("name")
def clear_operator_policy(api, vhost, name) -> None:
    """Remove operator policy NAME from VHOST."""
    call(api, "DELETE", "operator-policies", vhost, name,
          missing=f"NOT_FOUND - no operator policy '{name}' in vhost '{vhost}'")
    click.echo(f"Clearing operator policy \"{name}\" on vhost \"{vhost}\" ...")


@ctl.command("list_operator_policies")
@management_options
@vhost_option
def list_operator_policies(api, vhost) -> None:
    """The operator policies of VHOST."""
    _echo_policies(call(api, "GET", "operator-policies", vhost, missing=_no_vhost(vhost)))


def _echo_policies(rows: list[dict]) -> None:
    """rabbitmqctl list_policies' (and list_operator_policies') columns."""
    echo_table(["vhost", "name", "pattern", "apply-to", "definition", "priority"],
                [[r["vhost"], r["name"], r["pattern"], r["apply-to"],
                  json.dumps(r["definition"], separators=(",", ":")), str(r["priority"])]
                 for r in rows])


# rabbitmqctl list_queues' columns -> the queues.list field they show
QUEUE_COLUMNS = {"name": "name", "type": "type", "durable": "durable",
                 "auto_delete": "auto_delete", "arguments": "arguments",
                 "messages_ready": "ready", "messages_unacknowledged": "unacked",
                 "consumers": "consumers", "message_bytes": "bytes", "leader": "leader",
                 "members": "members", "policy": "policy", "operator_policy": "operator_policy",
                 "effective_policy_definition": "effective_policy_definition"}


# mirrored classic queues' columns (docs/behaviour/classic-queue-mirroring.md), as
# RabbitMQ 3.x prints them: a process id in angle brackets, lists of them in square
# brackets; quorumqueue has no Erlang processes, so a replica shows as its node
PID_COLUMNS = {"pid": None, "slave_pids": "mirrors",
               "synchronised_slave_pids": "synchronised_mirrors"}


def _pid_cell(row: dict, column: str) -> str:
    if column == "pid":
        return f"<{row['leader']}>"
    nodes = row.get(PID_COLUMNS[column])
    if nodes is None:
        return ""  # not a mirrored queue
    return "[" + ", ".join(f"<{node}>" for node in nodes) + "]"


def _cell(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


@ctl.command("list_queues")
@management_options
@vhost_option
@click.argument("columns", nargs=-1)
def list_queues(api, vhost, columns) -> None:
    """The queues of VHOST, one per line, tab-separated, with COLUMNs as rabbitmqctl
    names them (default: name messages): name type durable auto_delete arguments
    messages messages_ready messages_unacknowledged consumers message_bytes leader
    members policy operator_policy effective_policy_definition, and for mirrored
    classic queues pid slave_pids synchronised_slave_pids (<node> per replica)."""
    columns = columns or ("name", "messages")
    unknown = [c for c in columns if c not in QUEUE_COLUMNS and c != "messages"
               and c not in PID_COLUMNS]
    if unknown:
        raise click.BadParameter(f"unknown column(s) {', '.join(unknown)} (known: messages, "
                                 f"{', '.join([*QUEUE_COLUMNS, *PID_COLUMNS])})",
                                 param_hint="COLUMN")
    rows = guarded(queue_rows, api, vhost)
    click.echo(f"Listing queues for vhost {vhost} ...")
    click.echo("\t".join(columns))
    for row in rows:
        click.echo("\t".join(_cell(row["ready"] + row["unacked"]) if column == "messages"
                             else _pid_cell(row, column) if column in PID_COLUMNS
                             else _cell(row[QUEUE_COLUMNS[column]]) for column in columns))


@ctl.command("sync_queue")
@management_options
@vhost_option
@click.argument("queue")
def sync_queue(api, vhost, queue) -> None:
    """Synchronise a mirrored classic queue's unsynchronised mirrors: its leader sends
    them its contents in batches of ha-sync-batch-size (rabbitmqctl sync_queue;
    RabbitMQ's guide, "Unsynchronised Mirrors"), through `POST
    /api/queues/VHOST/QUEUE/actions` `{"action": "sync"}`, then waits, as rabbitmqctl
    does, until the synchronisation ended (the queue's `state` no longer `syncing`:
    finished, or stopped by cancel_sync_queue). As rabbitmqctl: `Error:` and
    `not_mirrored` or `not_found` on stderr, exit 69."""
    import time

    click.echo(f"Synchronising queue '{queue}' in vhost '{vhost}' ...")
    if "slave_nodes" not in _rabbitmqctl_queue(api, vhost, queue):
        _rabbitmqctl_error("not_mirrored")  # rabbit_mirror_queue_misc's {error, not_mirrored}
    _rabbitmqctl_action(api, vhost, queue, "sync")
    while _rabbitmqctl_queue(api, vhost, queue).get("state") == "syncing":
        time.sleep(0.2)


@ctl.command("cancel_sync_queue")
@management_options
@vhost_option
@click.argument("queue")
def cancel_sync_queue(api, vhost, queue) -> None:
    """Stop a mirrored queue's synchronisation in progress (rabbitmqctl
    cancel_sync_queue), through `POST /api/queues/VHOST/QUEUE/actions` `{"action":
    "cancel_sync"}`: its mirrors stay unsynchronised. As rabbitmqctl 3.x: nothing
    more is printed when one was stopped, `not_syncing` when none was running (a
    queue not mirrored too)."""
    click.echo(f"Stopping synchronising queue '{queue}' in vhost '{vhost}' ...")
    _rabbitmqctl_queue(api, vhost, queue)
    _rabbitmqctl_action(api, vhost, queue, "cancel_sync")
    if api.last_headers.get("X-Quorumqueue-Sync", "not_syncing") == "not_syncing":
        click.echo("not_syncing")


def _rabbitmqctl_error(text: str) -> None:
    """rabbitmqctl 3.x's refusal: `Error:` and RabbitMQ's text on stderr, exit 69
    (EX_UNAVAILABLE)."""
    import sys

    click.echo("Error:", err=True)
    click.echo(text, err=True)
    sys.exit(69)


def _rabbitmqctl_queue(api, vhost: str, queue: str) -> dict:
    """The queue's /api/queues object; a queue (or vhost) not there is rabbitmqctl's
    `not_found`."""
    from ..client.errors import ManagementError

    try:
        return api.get("queues", vhost, queue, missing="not_found")
    except ManagementError as error:
        _rabbitmqctl_error(str(error))


def _rabbitmqctl_action(api, vhost: str, queue: str, action: str) -> None:
    from ..client.errors import ManagementError

    try:
        api.post("queues", vhost, queue, "actions", body={"action": action},
                 missing="not_found")
    except ManagementError as error:
        name, dash, detail = str(error).partition(" - ")
        _rabbitmqctl_error(detail if dash and name.isupper() else str(error))


transformations_option = click.option(
    "--transformations", default=None,
    help="Comma-separated, applied in order: " + ", ".join(TRANSFORMATIONS) + ".")
scope_option = click.option("-p", "--vhost", "scope", default=None,
                            help="Only this vhost's definitions (RabbitMQ's "
                                 "single_virtual_host format).")


@ctl.command("export_definitions")
@management_options
@scope_option
@transformations_option
@click.argument("path")
def export_definitions(api, scope, transformations, path) -> None:
    """Write every user, vhost, permission, policy, operator policy, exchange, queue and
    binding of the node to PATH ("-": standard output) as JSON, in RabbitMQ's
    definitions format (rabbitmqctl import_definitions reads it), transformed first by
    --transformations when given (rabbitmqadmin v2's names)."""
    names = _transformation_names(transformations)
    document = (call(api, "GET", "definitions", scope, missing=_no_vhost(scope))
                if scope is not None else call(api, "GET", "definitions"))
    if names:
        document = _transformed(document, names)
    _write_definitions(document, path)


@ctl.command("transform_definitions")
@click.option("--transformations", required=True,
              help="Comma-separated: " + ", ".join(TRANSFORMATIONS) + ".")
@click.argument("source")
@click.argument("path")
def transform_definitions(transformations, source, path) -> None:
    """Read a definitions file SOURCE ("-": standard input; e.g. one RabbitMQ 3.x's
    rabbitmqctl export_definitions wrote), apply --transformations (rabbitmqadmin v2's
    names) and write the result to PATH ("-": standard output). Needs no node."""
    names = _transformation_names(transformations)
    _write_definitions(_transformed(_read_definitions(source), names), path)


def _transformation_names(text):
    if text is None:
        return []
    try:
        return parse_names(text)
    except TransformationError as error:
        raise click.BadParameter(str(error), param_hint="--transformations") from None


def _transformed(document, names):
    try:
        document, notes = transform(document, names)
    except TransformationError as error:
        raise click.ClickException(str(error)) from None
    for note in notes:
        click.echo(f"note: {note}", err=True)
    return document


def _write_definitions(document, path) -> None:
    text = json.dumps(document, separators=(",", ":"), sort_keys=True)
    if path == "-":
        click.echo(text)
        return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    click.echo(f"Exporting definitions in JSON to a file at \"{path}\" ...")


def _read_definitions(path):
    try:
        with click.open_file(path, encoding="utf-8-sig") as handle:  # "-": stdin
            text = handle.read()
    except OSError as error:
        raise click.BadParameter(f"cannot read {path}: {error.strerror}",
                                 param_hint="PATH") from None
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError as error:
        raise click.ClickException(f"{path} is not JSON: {error}") from None


@ctl.command("import_definitions")
@management_options
@scope_option
@click.argument("path")
def import_definitions(api, scope, path) -> None:
    """Create the definitions of PATH ("-": standard input), a JSON file in RabbitMQ's
    definitions format (rabbitmqctl export_definitions writes it). Nothing is changed
    if the file has an error; what exists already is kept as it is."""
    try:
        with click.open_file(path, encoding="utf-8-sig") as handle:  # "-": stdin
            text = handle.read()
    except OSError as error:
        raise click.BadParameter(f"cannot read {path}: {error.strerror}",
                                 param_hint="PATH") from None
    try:
        document = json.loads(text) if text.strip() else {}
    except ValueError as error:
        raise click.ClickException(f"{path} is not JSON: {error}") from None
    click.echo(f"Importing definitions in JSON from a file at \"{path}\" ...")
    result = _import_in_sections(api, document, scope)
    for note in result["notes"]:
        click.echo(f"note: {note}")
    click.echo(f"Imported {result['commands']} definitions.")


# the import's own order (node/definitions_import.py, _Importer.run): each section may
# refer to what an earlier one creates
_IMPORT_ORDER = ("vhosts", "users", "permissions", "parameters", "global_parameters",
                 "policies", "exchanges", "queues", "bindings")


def _import(api, definitions, scope, check: bool = False) -> dict:
    """One import (POST /api/quorumqueue/definitions/import): {commands, notes}."""
    return call(api, "POST", "quorumqueue", "definitions", "import",
                 body={"definitions": definitions, "vhost": scope, "check": check})


def _import_in_sections(api, document, scope) -> dict:
    """Import `document` with progress on stderr (client/progress.py), one step per
    section. The whole document is checked first (`check: true`: the plan is built
    and nothing applied), so a file with an error still changes nothing and is
    refused with the same text; then each non-empty section is imported in the
    import's order, each once the previous one is applied, so a section may refer to
    what an earlier one created, as in one import. The notes are the whole
    document's. A section refused after the check (another change raced it) stops
    the import there, naming its section; the sections before it stay imported, as
    the commands applied before a refused one do in a single import."""
    from ..client.progress import Progress

    sections = [s for s in _IMPORT_ORDER
                if isinstance(document, dict) and isinstance(document.get(s), list)
                and document[s]]
    if not sections:
        return _import(api, document, scope)
    checked = _import(api, document, scope, check=True)
    rest = {k: v for k, v in document.items()
            if k not in _IMPORT_ORDER and k not in ("topic_permissions", "limits")}
    commands = 0
    with Progress("import_definitions", total=len(sections)) as progress:
        for position, section in enumerate(sections):
            chunk = {**rest, section: document[section]}
            if position == 0 and "limits" in document:  # a vhost's own limits (scope)
                chunk["limits"] = document["limits"]
            try:
                commands += _import(api, chunk, scope)["commands"]
            except click.ClickException as error:
                raise click.ClickException(
                    f"{error.message} (while importing '{section}'; the sections "
                    f"before it were imported)") from None
            progress.advance(f"{section} ({len(document[section])})")
    return {"commands": commands, "notes": checked["notes"]}


def _definition(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="DEFINITION") from None


def _json(limits: dict) -> str:
    return json.dumps(limits, separators=(",", ":"), sort_keys=True)


@ctl.command("set_vhost_limits")
@management_options
@vhost_option
@click.argument("definition")
def set_vhost_limits(api, vhost, definition) -> None:
    """Replace the limits of VHOST with DEFINITION, a JSON object of max-connections
    and max-queues (0 allows none, a negative value is no limit)."""
    limits = _definition(definition)
    if not isinstance(limits, dict):
        raise click.BadParameter("expected a JSON object", param_hint="DEFINITION")
    current = _vhost_limits(api, vhost)
    # RabbitMQ's API sets one limit a request (PUT /api/vhost-limits/V/NAME, checked
    # as a whole with the others); then the ones not in DEFINITION go
    for name, value in limits.items():
        call(api, "PUT", "vhost-limits", vhost, name, body={"value": value})
    for name in current:
        if name not in limits:
            call(api, "DELETE", "vhost-limits", vhost, name, allow_missing=True)
    click.echo(f"Setting vhost limits to \"{definition}\" for vhost \"{vhost}\" ...")


@ctl.command("clear_vhost_limits")
@management_options
@vhost_option
def clear_vhost_limits(api, vhost) -> None:
    """Remove every limit of VHOST."""
    for name in _vhost_limits(api, vhost):
        call(api, "DELETE", "vhost-limits", vhost, name, allow_missing=True)
    click.echo(f"Clearing vhost \"{vhost}\" limits ...")


@ctl.command("list_vhost_limits")
@management_options
@vhost_option
@click.option("--global", "all_vhosts", is_flag=True, help="The limits of every vhost.")
def list_vhost_limits(api, vhost, all_vhosts) -> None:
    """The limits of VHOST (or of every vhost that has some, with --global)."""
    if all_vhosts:
        rows = call(api, "GET", "vhost-limits")
        echo_table(["vhost", "limits"], [[r["vhost"], _json(r["value"])] for r in rows])
        return
    limits = _vhost_limits(api, vhost)
    if limits:
        click.echo(_json(limits))


def _vhost_limits(api, vhost) -> dict:
    rows = call(api, "GET", "vhost-limits", vhost, missing=_no_vhost(vhost))
    return rows[0]["value"] if rows else {}


def _user_limits(api, user) -> dict:
    call(api, "GET", "users", user, missing=_no_user(user))
    rows = call(api, "GET", "user-limits", user, missing=_no_user(user))
    return rows[0]["value"] if rows else {}


@ctl.command("set_user_limits")
@management_options
@click.argument("user")
@click.argument("definition")
def set_user_limits(api, user, definition) -> None:
    """Set USER's limits from DEFINITION, a JSON object of max-connections and
    max-channels (merged with the limits USER has)."""
    limits = _definition(definition)
    if not isinstance(limits, dict):
        raise click.BadParameter("expected a JSON object", param_hint="DEFINITION")
    _user_limits(api, user)
    for name, value in limits.items():  # one limit a request, as RabbitMQ's API
        call(api, "PUT", "user-limits", user, name, body={"value": value})
    click.echo(f"Setting user limits to \"{definition}\" for user \"{user}\" ...")


@ctl.command("clear_user_limits")
@management_options
@click.argument("user")
@click.argument("limit")
def clear_user_limits(api, user, limit) -> None:
    """Remove USER's LIMIT (max-connections, max-channels, or all)."""
    current = _user_limits(api, user)
    if limit != "all" and limit not in USER_LIMITS:
        raise click.ClickException(f"PRECONDITION_FAILED - no user limit '{limit}' "
                                   f"(known: {', '.join(USER_LIMITS)}, all)")
    for name in current:
        if limit in ("all", name):
            call(api, "DELETE", "user-limits", user, name, allow_missing=True)
    click.echo(f"Clearing \"{limit}\" limit for user \"{user}\" ...")


@ctl.command("list_user_limits")
@management_options
@click.option("--user", default=None, help="This user's limits.")
@click.option("--all", "all_users", is_flag=True, help="Every user's limits.")
def list_user_limits(api, user, all_users) -> None:
    """USER's limits (or every user's that has some)."""
    if user is not None and not all_users:
        limits = _user_limits(api, user)
        if limits:
            click.echo(_json(limits))
        return
    rows = call(api, "GET", "user-limits")
    echo_table(["user", "limits"], [[r["user"], _json(r["value"])] for r in rows])


@ctl.command("forget_cluster_node")
@management_options
@click.argument("node")
def forget_cluster_node(api, node) -> None:
    """Remove stopped NODE from the cluster for good: it leaves the node list, the
    metadata group and every quorum queue's members; a mirrored classic queue it led
    gets a mirror as leader, with that mirror's stored copy (a synchronised one only,
    under ha-promote-on-failure when-synced). Run it against another,
    running node of the cluster; NODE must be stopped (and reset before it joins
    again)."""
    click.echo(f"Removing node {node} from the cluster ...")
    call(api, "DELETE", "quorumqueue", "cluster-nodes", node)


USER_LIMITS = ("max-connections", "max-channels")  # node/limits.py's


def _no_user(name: str) -> str:
    return f"NOT_FOUND - no user '{name}'"


def _no_vhost(name: str) -> str:
    return f"NOT_FOUND - no vhost '{name}'"


def _no_user_or_vhost(api, user: str, vhost: str) -> str:
    """The text for a 404 on a (vhost, user) pair, as the operation names it."""
    return _no_user(user) if not _exists(api, "users", user) else _no_vhost(vhost)


def _exists(api, kind: str, name: str) -> bool:
    return call(api, "GET", kind, name, allow_missing=True) is not None


@ctl.command("set_parameter")
@management_options
@vhost_option
@click.argument("component")
@click.argument("name")
@click.argument("value")
def set_parameter(api, vhost, component, name, value) -> None:
    """Set runtime parameter NAME of COMPONENT in VHOST to VALUE, a JSON object.
    COMPONENT "shovel": a dynamic shovel (RabbitMQ's keys, broker/shovel/README.md),
    e.g. '{"src-uri": "amqp://old", "src-queue": "q", "dest-uri": "amqp://",
    "dest-queue": "q", "ack-mode": "on-confirm", "src-delete-after": "queue-length"}'.
    It runs on the node that leads the cluster's metadata group."""
    try:  # the broker checks the parameter itself: this is only its JSON, with
        parsed = json.loads(value)  # the words of the broker's own refusal
    except ValueError as error:
        raise click.ClickException(f"JSON decoding error. Reason: {error}") from None
    click.echo(f"Setting runtime parameter \"{name}\" for component \"{component}\" to "
               f"\"{value}\" in vhost \"{vhost}\" ...")
    call(api, "PUT", "parameters", component, vhost, name, missing=_no_vhost(vhost),
          body={"vhost": vhost, "component": component, "name": name, "value": parsed})


@ctl.command("clear_parameter")
@management_options
@vhost_option
@click.argument("component")
@click.argument("name")
def clear_parameter(api, vhost, component, name) -> None:
    """Remove runtime parameter NAME of COMPONENT from VHOST (a shovel stops)."""
    click.echo(f"Clearing runtime parameter \"{name}\" for component \"{component}\" on "
               f"vhost \"{vhost}\" ...")
    call(api, "DELETE", "parameters", component, vhost, name,
          missing=f"NOT_FOUND - Parameter does not exist (component {component!r}, "
                  f"name {name!r} in vhost '{vhost}')")


@ctl.command("list_parameters")
@management_options
@vhost_option
def list_parameters(api, vhost) -> None:
    """The runtime parameters of VHOST (rabbitmqctl's columns: component name value)."""
    rows = [row for row in call(api, "GET", "parameters") if row["vhost"] == vhost]
    click.echo(f"Listing runtime parameters for vhost \"{vhost}\" ...")
    echo_table(["component", "name", "value"],
                [[r["component"], r["name"], _json(r["value"])] for r in rows])


SHOVEL_COLUMNS = ("name", "vhost", "type", "node", "state", "source", "destination",
                  "termination_reason")


@ctl.command("shovel_status")
@management_options
def shovel_status(api) -> None:
    """Every dynamic shovel: name, vhost, type (dynamic), the node running it, state
    (starting, running, terminated), source and destination URIs (passwords
    hidden) and, when terminated, the reason. Any node answers: the rows come from
    the node that runs the shovels (the metadata group's leader); state unknown
    when that node does not answer or has not started the shovel yet."""
    rows = call(api, "GET", "shovels")
    click.echo("Shovel status on node ...")
    echo_table(list(SHOVEL_COLUMNS), [[str(r.get(c, "")) for c in SHOVEL_COLUMNS]
                                       for r in rows])

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
                                                        effective_policy_definition ...)
    quorumqueue ctl export_definitions [-p VHOST] [--transformations NAMES] FILE|-
    quorumqueue ctl import_definitions [-p VHOST] FILE|-
    quorumqueue ctl transform_definitions --transformations NAMES IN|- OUT|-   (offline:
        a file exported from RabbitMQ; broker/definitions_transform.py)
    quorumqueue ctl forget_cluster_node NODE        (a stopped node, removed for good)
    quorumqueue ctl set_vhost_limits [-p VHOST] '{"max-connections": N, "max-queues": N}'
    quorumqueue ctl clear_vhost_limits [-p VHOST]
    quorumqueue ctl list_vhost_limits [-p VHOST] [--global]
    quorumqueue ctl set_user_limits USER '{"max-connections": N, "max-channels": N}'
    quorumqueue ctl clear_user_limits USER LIMIT|all
    quorumqueue ctl list_user_limits [--user USER | --all]

Each is one management RPC (node/definition_ops.py; definitions:
node/definitions_json.py; forget_cluster_node: cluster/membership.py) to the node
named by --uri (an administrator's AMQP URI); in a cluster any node will do, and
every node has the change once the command returns.
"""

from __future__ import annotations

import json

import click

from ..client.cli_rpc import _call, _echo_table, uri_option
from .definitions_transform import TRANSFORMATIONS, TransformationError, parse_names, transform

vhost_option = click.option("-p", "--vhost", default="/", show_default=True,
                            help="The virtual host.")


@click.group()
def ctl() -> None:
    """Users, vhosts, permissions and policies of a running node (like rabbitmqctl)."""


@ctl.command("add_user")
@uri_option
@click.argument("name")
@click.argument("password")
def add_user(uri, name, password) -> None:
    """Create user NAME, with no permissions and no tags."""
    _call(uri, "users.add", name=name, password=password)
    click.echo(f"Adding user \"{name}\" ...")


@ctl.command("delete_user")
@uri_option
@click.argument("name")
def delete_user(uri, name) -> None:
    """Delete user NAME (its connections are closed)."""
    _call(uri, "users.delete", name=name)
    click.echo(f"Deleting user \"{name}\" ...")


@ctl.command("change_password")
@uri_option
@click.argument("name")
@click.argument("password")
def change_password(uri, name, password) -> None:
    """Give user NAME a new password."""
    _call(uri, "users.change_password", name=name, password=password)
    click.echo(f"Changing password for user \"{name}\" ...")


@ctl.command("set_user_tags")
@uri_option
@click.argument("name")
@click.argument("tags", nargs=-1)
def set_user_tags(uri, name, tags) -> None:
    """Replace the tags of user NAME (administrator: may use these commands)."""
    _call(uri, "users.set_tags", name=name, tags=list(tags))
    click.echo(f"Setting tags for user \"{name}\" to [{', '.join(tags)}] ...")


@ctl.command("list_users")
@uri_option
def list_users(uri) -> None:
    """Every user and its tags."""
    rows = _call(uri, "users.list")
    _echo_table(["user", "tags"], [[r["name"], f"[{', '.join(r['tags'])}]"] for r in rows])


@ctl.command("add_vhost")
@uri_option
@click.argument("name")
def add_vhost(uri, name) -> None:
    """Create virtual host NAME (no user has permissions in it yet)."""
    _call(uri, "vhosts.add", name=name)
    click.echo(f"Adding vhost \"{name}\" ...")


@ctl.command("delete_vhost")
@uri_option
@click.argument("name")
def delete_vhost(uri, name) -> None:
    """Delete virtual host NAME with its queues, exchanges, permissions and policies."""
    _call(uri, "vhosts.delete", name=name)
    click.echo(f"Deleting vhost \"{name}\" ...")


@ctl.command("list_vhosts")
@uri_option
def list_vhosts(uri) -> None:
    """Every virtual host."""
    rows = _call(uri, "vhosts.list")
    _echo_table(["name"], [[r["name"]] for r in rows])


@ctl.command("set_permissions")
@uri_option
@vhost_option
@click.argument("user")
@click.argument("configure")
@click.argument("write")
@click.argument("read")
def set_permissions(uri, vhost, user, configure, write, read) -> None:
    """Let USER configure, write and read the resources of VHOST whose names match
    these regular expressions ("" for none, ".*" for all)."""
    _call(uri, "permissions.set", vhost=vhost, user=user, configure=configure, write=write,
          read=read)
    click.echo(f"Setting permissions for user \"{user}\" in vhost \"{vhost}\" ...")


@ctl.command("clear_permissions")
@uri_option
@vhost_option
@click.argument("user")
def clear_permissions(uri, vhost, user) -> None:
    """Take away all of USER's permissions in VHOST."""
    _call(uri, "permissions.clear", vhost=vhost, user=user)
    click.echo(f"Clearing permissions for user \"{user}\" in vhost \"{vhost}\" ...")


@ctl.command("list_permissions")
@uri_option
@vhost_option
def list_permissions(uri, vhost) -> None:
    """Every user's permissions in VHOST."""
    rows = _call(uri, "permissions.list", vhost=vhost)
    _echo_table(["user", "configure", "write", "read"],
                [[r["user"], r["configure"], r["write"], r["read"]] for r in rows])


@ctl.command("list_user_permissions")
@uri_option
@click.argument("user")
def list_user_permissions(uri, user) -> None:
    """USER's permissions in every vhost."""
    rows = _call(uri, "permissions.list", user=user)
    _echo_table(["vhost", "configure", "write", "read"],
                [[r["vhost"], r["configure"], r["write"], r["read"]] for r in rows])


@ctl.command("set_policy")
@uri_option
@vhost_option
@click.option("--priority", type=int, default=0, show_default=True,
              help="Of the policies matching a queue, the highest priority applies.")
@click.option("--apply-to", "apply_to", default="all", show_default=True,
              type=click.Choice(["all", "queues", "classic_queues", "quorum_queues",
                                 "exchanges"]))
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_policy(uri, vhost, priority, apply_to, name, pattern, definition) -> None:
    """Set policy NAME: queues (or exchanges) whose names match PATTERN get the
    settings of DEFINITION, a JSON object, e.g. '{"max-length": 1000}'."""
    try:
        parsed = json.loads(definition)
    except ValueError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="DEFINITION") from None
    _call(uri, "policies.set", vhost=vhost, name=name, pattern=pattern, definition=parsed,
          priority=priority, apply_to=apply_to)
    click.echo(f"Setting policy \"{name}\" for pattern \"{pattern}\" to \"{definition}\" "
               f"with priority \"{priority}\" for vhost \"{vhost}\" ...")


@ctl.command("clear_policy")
@uri_option
@vhost_option
@click.argument("name")
def clear_policy(uri, vhost, name) -> None:
    """Remove policy NAME from VHOST (its queues return to their own arguments)."""
    _call(uri, "policies.clear", vhost=vhost, name=name)
    click.echo(f"Clearing policy \"{name}\" on vhost \"{vhost}\" ...")


@ctl.command("list_policies")
@uri_option
@vhost_option
def list_policies(uri, vhost) -> None:
    """The policies of VHOST."""
    _echo_policies(_call(uri, "policies.list", vhost=vhost))


@ctl.command("set_operator_policy")
@uri_option
@vhost_option
@click.option("--priority", type=int, default=0, show_default=True,
              help="Of the operator policies matching a queue, the highest priority applies.")
@click.option("--apply-to", "apply_to", default="all", show_default=True,
              type=click.Choice(["all", "queues", "classic_queues", "quorum_queues"]))
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_operator_policy(uri, vhost, priority, apply_to, name, pattern, definition) -> None:
    """Set operator policy NAME: queues whose names match PATTERN get the settings of
    DEFINITION over their policy's, the lower value winning for limits, e.g.
    '{"max-length": 100000}' (expires, message-ttl, max-length, max-length-bytes,
    delivery-limit, overflow, target-group-size, queue-master-locator)."""
    _call(uri, "operator_policies.set", vhost=vhost, name=name, pattern=pattern,
          definition=_definition(definition), priority=priority, apply_to=apply_to)
    click.echo(f"Setting operator policy override \"{name}\" for pattern \"{pattern}\" to "
               f"\"{definition}\" with priority \"{priority}\" for vhost \"{vhost}\" ...")


@ctl.command("clear_operator_policy")
@uri_option
@vhost_option
@click.argument("name")
def clear_operator_policy(uri, vhost, name) -> None:
    """Remove operator policy NAME from VHOST."""
    _call(uri, "operator_policies.clear", vhost=vhost, name=name)
    click.echo(f"Clearing operator policy \"{name}\" on vhost \"{vhost}\" ...")


@ctl.command("list_operator_policies")
@uri_option
@vhost_option
def list_operator_policies(uri, vhost) -> None:
    """The operator policies of VHOST."""
    _echo_policies(_call(uri, "operator_policies.list", vhost=vhost))


def _echo_policies(rows: list[dict]) -> None:
    """rabbitmqctl list_policies' (and list_operator_policies') columns."""
    _echo_table(["vhost", "name", "pattern", "apply-to", "definition", "priority"],
                [[r["vhost"], r["name"], r["pattern"], r["apply_to"],
                  json.dumps(r["definition"], separators=(",", ":")), str(r["priority"])]
                 for r in rows])


# rabbitmqctl list_queues' columns -> the queues.list field they show
QUEUE_COLUMNS = {"name": "name", "type": "type", "durable": "durable",
                 "auto_delete": "auto_delete", "arguments": "arguments",
                 "messages_ready": "ready", "messages_unacknowledged": "unacked",
                 "consumers": "consumers", "message_bytes": "bytes", "leader": "leader",
                 "members": "members", "policy": "policy", "operator_policy": "operator_policy",
                 "effective_policy_definition": "effective_policy_definition"}


def _cell(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


@ctl.command("list_queues")
@uri_option
@vhost_option
@click.argument("columns", nargs=-1)
def list_queues(uri, vhost, columns) -> None:
    """The queues of VHOST, one per line, tab-separated, with COLUMNs as rabbitmqctl
    names them (default: name messages): name type durable auto_delete arguments
    messages messages_ready messages_unacknowledged consumers message_bytes leader
    members policy operator_policy effective_policy_definition."""
    columns = columns or ("name", "messages")
    unknown = [c for c in columns if c not in QUEUE_COLUMNS and c != "messages"]
    if unknown:
        raise click.BadParameter(f"unknown column(s) {', '.join(unknown)} (known: messages, "
                                 f"{', '.join(QUEUE_COLUMNS)})", param_hint="COLUMN")
    rows = _call(uri, "queues.list", vhost=vhost)
    click.echo(f"Listing queues for vhost {vhost} ...")
    click.echo("\t".join(columns))
    for row in rows:
        click.echo("\t".join(_cell(row["ready"] + row["unacked"]) if column == "messages"
                             else _cell(row[QUEUE_COLUMNS[column]]) for column in columns))


transformations_option = click.option(
    "--transformations", default=None,
    help="Comma-separated, applied in order: " + ", ".join(TRANSFORMATIONS) + ".")
scope_option = click.option("-p", "--vhost", "scope", default=None,
                            help="Only this vhost's definitions (RabbitMQ's "
                                 "single_virtual_host format).")


@ctl.command("export_definitions")
@uri_option
@scope_option
@transformations_option
@click.argument("path")
def export_definitions(uri, scope, transformations, path) -> None:
    """Write every user, vhost, permission, policy, operator policy, exchange, queue and
    binding of the node to PATH ("-": standard output) as JSON, in RabbitMQ's
    definitions format (rabbitmqctl import_definitions reads it), transformed first by
    --transformations when given (rabbitmqadmin v2's names)."""
    names = _transformation_names(transformations)
    document = _call(uri, "definitions.export", vhost=scope)
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
@uri_option
@scope_option
@click.argument("path")
def import_definitions(uri, scope, path) -> None:
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
    result = _import_in_sections(uri, document, scope)
    for note in result["notes"]:
        click.echo(f"note: {note}")
    click.echo(f"Imported {result['commands']} definitions.")


# the import's own order (node/definitions_import.py, _Importer.run): each section may
# refer to what an earlier one creates
_IMPORT_ORDER = ("vhosts", "users", "permissions", "parameters", "global_parameters",
                 "policies", "exchanges", "queues", "bindings")


def _import_in_sections(uri, document, scope) -> dict:
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
        return _call(uri, "definitions.import", definitions=document, vhost=scope)
    checked = _call(uri, "definitions.import", definitions=document, vhost=scope,
                    check=True)
    rest = {k: v for k, v in document.items()
            if k not in _IMPORT_ORDER and k not in ("topic_permissions", "limits")}
    commands = 0
    with Progress("import_definitions", total=len(sections)) as progress:
        for position, section in enumerate(sections):
            chunk = {**rest, section: document[section]}
            if position == 0 and "limits" in document:  # a vhost's own limits (scope)
                chunk["limits"] = document["limits"]
            try:
                commands += _call(uri, "definitions.import", definitions=chunk,
                                  vhost=scope)["commands"]
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
@uri_option
@vhost_option
@click.argument("definition")
def set_vhost_limits(uri, vhost, definition) -> None:
    """Replace the limits of VHOST with DEFINITION, a JSON object of max-connections
    and max-queues (0 allows none, a negative value is no limit)."""
    _call(uri, "vhosts.set_limits", vhost=vhost, limits=_definition(definition))
    click.echo(f"Setting vhost limits to \"{definition}\" for vhost \"{vhost}\" ...")


@ctl.command("clear_vhost_limits")
@uri_option
@vhost_option
def clear_vhost_limits(uri, vhost) -> None:
    """Remove every limit of VHOST."""
    _call(uri, "vhosts.clear_limits", vhost=vhost)
    click.echo(f"Clearing vhost \"{vhost}\" limits ...")


@ctl.command("list_vhost_limits")
@uri_option
@vhost_option
@click.option("--global", "all_vhosts", is_flag=True, help="The limits of every vhost.")
def list_vhost_limits(uri, vhost, all_vhosts) -> None:
    """The limits of VHOST (or of every vhost that has some, with --global)."""
    if all_vhosts:
        rows = _call(uri, "vhosts.list_limits")
        _echo_table(["vhost", "limits"], [[r["vhost"], _json(r["limits"])] for r in rows])
        return
    rows = _call(uri, "vhosts.list_limits", vhost=vhost)
    for row in rows:
        if row["limits"]:
            click.echo(_json(row["limits"]))


@ctl.command("set_user_limits")
@uri_option
@click.argument("user")
@click.argument("definition")
def set_user_limits(uri, user, definition) -> None:
    """Set USER's limits from DEFINITION, a JSON object of max-connections and
    max-channels (merged with the limits USER has)."""
    _call(uri, "users.set_limits", name=user, limits=_definition(definition))
    click.echo(f"Setting user limits to \"{definition}\" for user \"{user}\" ...")


@ctl.command("clear_user_limits")
@uri_option
@click.argument("user")
@click.argument("limit")
def clear_user_limits(uri, user, limit) -> None:
    """Remove USER's LIMIT (max-connections, max-channels, or all)."""
    _call(uri, "users.clear_limits", name=user, limit=limit)
    click.echo(f"Clearing \"{limit}\" limit for user \"{user}\" ...")


@ctl.command("list_user_limits")
@uri_option
@click.option("--user", default=None, help="This user's limits.")
@click.option("--all", "all_users", is_flag=True, help="Every user's limits.")
def list_user_limits(uri, user, all_users) -> None:
    """USER's limits (or every user's that has some)."""
    if user is not None and not all_users:
        for row in _call(uri, "users.list_limits", name=user):
            if row["limits"]:
                click.echo(_json(row["limits"]))
        return
    rows = _call(uri, "users.list_limits")
    _echo_table(["user", "limits"], [[r["user"], _json(r["limits"])] for r in rows])


@ctl.command("forget_cluster_node")
@uri_option
@click.argument("node")
def forget_cluster_node(uri, node) -> None:
    """Remove stopped NODE from the cluster for good: it leaves the node list, the
    metadata group and every quorum queue's members. Run it against another, running
    node of the cluster; NODE must be stopped (and reset before it joins again)."""
    click.echo(f"Removing node {node} from the cluster ...")
    _call(uri, "cluster.forget_node", node=node)

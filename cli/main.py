"""The `quorumqueue` command line (click).

    quorumqueue broker start [--config conf/broker.toml] [--port PORT] [--data-dir DIR]
                                                 (the broker's own program, run in
                                                  this process's place: broker/__main__.py)
    quorumqueue queues list|purge|delete|quorum_status|peek|list_leases|...  (a running node,
                                                  management HTTP API; rabbitmq-queues)
    quorumqueue ctl add_user|set_policy|...       (users, vhosts, policies: ctl.py)
    quorumqueue jobs run|schedule ...             (the analytics jobs: jobs/cli.py)
    quorumqueue cluster start|status ...          (local clusters: cluster.py)

`queues`, `ctl` and `cluster status` reach a node only through its management HTTP
API (client/http_management.py; --host, --port (15672), --username, --password,
--ssl..., or --base-uri), as rabbitmqadmin does: no AMQP connection is opened.
This package imports no broker module: it is a client of the broker, through
quorumqueue.client's public names (.importlinter).
"""

from __future__ import annotations

import json
import os
import sys

import click


@click.group()
@click.version_option(package_name="quorumqueue")
def main() -> None:
    """quorumqueue: replicated queues over AMQP 0-9-1, and a Spark connector for them."""


@main.group()
def broker() -> None:
    """Run and manage the bundled broker."""


@broker.command("start", add_help_option=False,
                context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("arguments", nargs=-1, type=click.UNPROCESSED)
def broker_start(arguments) -> None:
    """Run one broker node in the foreground; logs to stderr; stops on SIGTERM/SIGINT
    (--help: its options)."""
    # the broker's own program (broker/__main__.py) in place of this process: the same
    # pid, so signals reach the node; the command line imports no broker module
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "quorumqueue.broker", "start",
                              *arguments])


from .http import (call, echo_table, guarded, management_options,  # noqa: E402
                               queue_rows)


@main.group()
def queues() -> None:
    """List, purge and delete queues on a running node (like rabbitmq-queues)."""


QUEUE_FIELDS = ("vhost", "name", "type", "durable", "auto_delete", "arguments", "ready",
                "unacked", "consumers", "leader", "members", "bytes", "policy",
                "operator_policy", "effective_policy_definition", "single_active_consumer_tag",
                "messages_dlx", "mirrors", "synchronised_mirrors")


def _queue_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value).lower() if isinstance(value, bool) else str(value)


@queues.command("list")
@management_options
@click.option("-p", "--vhost", help="Only this virtual host.")
@click.argument("columns", nargs=-1)
def queues_list(api, vhost, columns) -> None:
    """Name, type, ready, unacked, consumers, leader, members and bytes of every queue
    (and, when a queue has a single active consumer, its tag: RabbitMQ's
    single_active_consumer_tag; when a quorum queue holds dead letters for
    at-least-once dead lettering, messages_dlx); or the COLUMNs named: vhost name type
    durable auto_delete arguments ready unacked consumers leader members bytes policy
    operator_policy effective_policy_definition single_active_consumer_tag
    messages_dlx mirrors synchronised_mirrors (mirrored classic queues: shown by
    default when there are some)."""
    unknown = [c for c in columns if c not in QUEUE_FIELDS]
    if unknown:
        raise click.BadParameter(f"unknown column(s) {', '.join(unknown)} (known: "
                                 f"{', '.join(QUEUE_FIELDS)})", param_hint="COLUMNS")
    rows = guarded(queue_rows, api, vhost)
    headers = list(columns) or ["vhost", "name", "type", "ready", "unacked", "consumers",
                                "leader", "members", "bytes"]
    if not columns and any(r.get("single_active_consumer_tag") for r in rows):
        headers.append("single_active_consumer_tag")
    if not columns and any(r.get("messages_dlx") for r in rows):
        headers.append("messages_dlx")
    if not columns and any("mirrors" in r for r in rows):  # mirrored classic queues
        headers += ["mirrors", "synchronised_mirrors"]
    echo_table(headers, [[_queue_cell(r.get(h)) for h in headers] for r in rows])


@queues.command("purge")
@management_options
@click.option("-p", "--vhost", default="/", show_default=True)
@click.argument("name")
def queues_purge(api, vhost, name) -> None:
    """Drop the ready messages of a queue."""
    call(api, "DELETE", "queues", vhost, name, "contents", missing=_no_queue(name, vhost))
    click.echo(f"purged {api.message_count()} messages from '{name}' in vhost '{vhost}'")


def _no_queue(name: str, vhost: str) -> str:
    return f"NOT_FOUND - no queue '{name}' in vhost '{vhost}'"


@queues.command("delete")
@management_options
@click.option("-p", "--vhost", default="/", show_default=True)
@click.option("--if-unused", is_flag=True, help="Refuse if the queue has consumers.")
@click.option("--if-empty", is_flag=True, help="Refuse if the queue holds messages.")
@click.argument("name")
def queues_delete(api, vhost, if_unused, if_empty, name) -> None:
    """Delete a queue and its messages."""
    call(api, "DELETE", "queues", vhost, name, missing=_no_queue(name, vhost),
          query={"if-unused": "true" if if_unused else None,
                 "if-empty": "true" if if_empty else None})
    click.echo(f"deleted '{name}' in vhost '{vhost}' ({api.message_count()} messages)")


@queues.command("add_member")
@management_options
@click.option("-p", "--vhost", default="/", show_default=True)
@click.option("-t", "--timeout", type=float, default=30.0, show_default=True,
              help="Seconds the change has to show in the queue's members before the "
                   "command fails (it returns once it shows, as rabbitmq-queues).")
@click.argument("name")
@click.argument("node")
def queues_add_member(api, vhost, timeout, name, node) -> None:
    """Add a replica of quorum queue NAME on NODE (rabbitmq-queues add_member);
    returns once NODE shows among its members."""
    result = call(api, "POST", "queues", "quorum", vhost, name, "replicas", "add",
                   body={"node": node, "timeout": timeout})
    click.echo(f"added {node} to quorum queue '{name}' in vhost '{vhost}' (members: "
               f"{', '.join(result['members'])})")


@queues.command("delete_member")
@management_options
@click.option("-p", "--vhost", default="/", show_default=True)
@click.option("-t", "--timeout", type=float, default=30.0, show_default=True,
              help="Seconds the change has to show in the queue's members before the "
                   "command fails (it returns once it shows, as rabbitmq-queues).")
@click.argument("name")
@click.argument("node")
def queues_delete_member(api, vhost, timeout, name, node) -> None:
    """Remove the replica of quorum queue NAME on NODE (rabbitmq-queues delete_member);
    returns once NODE no longer shows among its members."""
    result = call(api, "DELETE", "queues", "quorum", vhost, name, "replicas", "delete",
                   body={"node": node, "timeout": timeout})
    click.echo(f"removed {node} from quorum queue '{name}' in vhost '{vhost}' (members: "
               f"{', '.join(result['members'])})")


@queues.command("grow")
@management_options
@click.argument("node")
@click.argument("strategy", type=click.Choice(["all", "even"]))
@click.option("--vhost-pattern", default=".*", show_default=True)
@click.option("--queue-pattern", default=".*", show_default=True)
@click.option("-t", "--timeout", type=float, default=30.0, show_default=True,
              help="Seconds the change has to show in the queue's members before the "
                   "command fails (it returns once it shows, as rabbitmq-queues).")
def queues_grow(api, node, strategy, vhost_pattern, queue_pattern, timeout) -> None:
    """Add NODE to every matching quorum queue (all), or to those with an even number
    of members (even), like rabbitmq-queues grow; each queue's row once NODE shows
    among its members."""
    rows = _per_queue(api, "grow", lambda q: True, vhost_pattern, queue_pattern,
                      node=node, strategy=strategy, timeout=timeout)
    echo_table(["vhost", "name", "size", "result"],
                [[r["vhost"], r["name"], str(r["size"]), r["result"]] for r in rows])


@queues.command("shrink")
@management_options
@click.argument("node")
@click.option("--errors-only", is_flag=True,
              help="Only queues whose replica on NODE is not reachable.")
@click.option("-t", "--timeout", type=float, default=30.0, show_default=True,
              help="Seconds the change has to show in the queue's members before the "
                   "command fails (it returns once it shows, as rabbitmq-queues).")
def queues_shrink(api, node, errors_only, timeout) -> None:
    """Remove NODE from every quorum queue it is a member of (rabbitmq-queues shrink);
    each queue's row once NODE no longer shows among its members."""
    rows = _per_queue(api, "shrink", lambda q: node in q["members"], ".*", ".*",
                      node=node, errors_only=errors_only, timeout=timeout)
    echo_table(["vhost", "name", "size", "result"],
                [[r["vhost"], r["name"], str(r["size"]), r["result"]] for r in rows])


@queues.command("rebalance")
@management_options
@click.argument("kind", type=click.Choice(["quorum", "all"]))
@click.option("--vhost-pattern", default=".*", show_default=True)
@click.option("--queue-pattern", default=".*", show_default=True)
def queues_rebalance(api, kind, vhost_pattern, queue_pattern) -> None:
    """Move quorum-queue leaders so each node leads about as many (membership is
    unchanged), like rabbitmq-queues rebalance."""
    result = call(api, "POST", "rebalance", "queues",
                   body={"type": kind, "vhost_pattern": vhost_pattern,
                         "queue_pattern": queue_pattern})
    echo_table(["vhost", "name", "from", "to"],
                [[m["vhost"], m["name"], m["from"], m["to"]] for m in result["moves"]])
    click.echo("leaders per node: " + ", ".join(f"{n} {c}"
                                                for n, c in sorted(result["leaders"].items())))


def _per_queue(api, op, candidate, vhost_pattern, queue_pattern, **arguments) -> list:
    """`queues grow|shrink` one queue at a time, with progress on stderr (client/
    progress.py): the quorum queues are listed first (the cluster status), those matching
    the patterns (and `candidate`) are acted on one by one, each by the same operation
    restricted to that queue by anchored patterns, and the rows concatenated in the
    server's order (vhost, then name). The server decides per queue exactly as in one
    call over all of them (grow and shrink look at each queue on its own), so the rows
    and refusals are the same; only the progress is new. A bad pattern, or nothing to
    do, goes to the server as one call, which refuses or answers [] as before."""
    import re

    from ..client.progress import Progress

    try:
        vhost_re, queue_re = re.compile(vhost_pattern), re.compile(queue_pattern)
    except re.error:
        vhost_re = queue_re = None
    queues = []
    if vhost_re is not None:
        status = call(api, "GET", "quorumqueue", "cluster-status")
        queues = sorted((q["vhost"], q["name"]) for q in status.get("queues", [])
                        if vhost_re.search(q["vhost"]) and queue_re.search(q["name"])
                        and candidate(q))
    node = arguments.pop("node")
    # RabbitMQ's paths: POST .../replicas/on/NODE/grow, DELETE .../replicas/on/NODE/shrink
    method = "POST" if op == "grow" else "DELETE"

    def one(vhost_pattern: str, queue_pattern: str) -> list:
        return call(api, method, "queues", "quorum", "replicas", "on", node, op,
                     body={"vhost_pattern": vhost_pattern, "queue_pattern": queue_pattern,
                           **arguments})

    if not queues:
        return one(vhost_pattern, queue_pattern)
    rows: list = []
    with Progress(op, total=len(queues)) as progress:
        for vhost, name in queues:
            rows += one(rf"\A{re.escape(vhost)}\Z", rf"\A{re.escape(name)}\Z")
            progress.advance(f"{vhost}/{name}")
    return rows


# rabbitmq-queues' observability commands (node/queue_commands.py): RabbitMQ's
# banners, columns, texts and exit codes (69: the check failed or the node refused,
# 64: bad arguments)
EX_UNAVAILABLE, EX_USAGE = 69, 64


def _rabbit_call(api, method: str, *segments, **kw):
    """One management API request; a refusal prints RabbitMQ's `Error:` and its text
    (without our reply-code name) on stderr and exits 69, as rabbitmq-queues does."""
    from ..client.errors import ManagementError

    try:
        return api.request(method, segments, **kw)
    except ManagementError as error:
        text = str(error)
        name, dash, detail = text.partition(" - ")
        click.echo("Error:", err=True)
        click.echo(detail if dash and name.isupper() else text, err=True)
        sys.exit(EX_UNAVAILABLE)


def _cell(value) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


quiet_option = click.option("-q", "--quiet", is_flag=True,
                            help="Do not print the informational banner line.")


@queues.command("quorum_status")
@management_options
@quiet_option
@click.option("-p", "--vhost", default="/", show_default=True)
@click.argument("name")
def queues_quorum_status(api, quiet, vhost, name) -> None:
    """Every member of quorum queue NAME: Raft state, log, commit and snapshot indexes,
    term (rabbitmq-queues quorum_status). A member not running shows as noproc."""
    result = _rabbit_call(api, "GET", "queues", "quorum", vhost, name, "status")
    if not quiet:
        click.echo(f"Status of queue {name} on node {result['node']} ...")
    rows = result["members"]
    headers = list(rows[0]) if rows else []
    echo_table(headers, [[_cell(row[h]) for h in headers] for row in rows])


@queues.command("check_if_node_is_quorum_critical")
@management_options
@quiet_option
def queues_quorum_critical(api, quiet) -> None:
    """Health check: exits with 69 if stopping this node would make some quorum queue
    lose its majority, listing those (rabbitmq-queues check_if_node_is_quorum_critical)."""
    result = _rabbit_call(api, "GET", "quorumqueue", "quorum-critical")
    node = result["node"]
    if not quiet:
        click.echo(f"Checking if node {node} is critical for quorum of any quorum queues ...")
    if result["single_node"]:
        click.echo(f"Node {node} seems to be the only one in a single node cluster, "
                   "the check does not apply")
    elif not result["queues"]:
        click.echo(f"Node {node} reported no quorum queues with minimum quorum")
    else:
        for queue in result["queues"]:
            click.echo(f"{queue['readable_name']} would lose quorum if node {node} is "
                       "stopped", err=True)
        sys.exit(EX_UNAVAILABLE)


@queues.command("check_if_node_is_mirror_sync_critical")
@management_options
@quiet_option
def queues_mirror_sync_critical(api, quiet) -> None:
    """Health check: exits with 69 if this node leads a mirrored classic queue with no
    synchronised mirror online, which stopping it would lose (rabbitmq-queues
    check_if_node_is_mirror_sync_critical), through RabbitMQ's `GET
    /api/health/checks/node-is-mirror-sync-critical` (503 and the queues when it fails)."""
    node = _rabbit_call(api, "GET", "overview")["node"]
    result = _rabbit_call(api, "GET", "health", "checks", "node-is-mirror-sync-critical",
                          answers=(503,))
    if not quiet:
        click.echo(f"Checking if node {node} is critical for data safety of any classic "
                   "mirrored queues ...")
    if result.get("reason") == "single node cluster":
        click.echo(f"Node {node} seems to be the only one in a single node cluster, "
                   "the check does not apply")
    elif not result.get("queues"):
        click.echo(f"Node {node} reported no classic mirrored queues without online "
                   "synchronised mirrors")
    else:
        for queue in result["queues"]:
            click.echo(f"{queue['readable_name']} would lose its only synchronised replica "
                       f"(master) if node {node} is stopped", err=True)
        sys.exit(EX_UNAVAILABLE)


@queues.command("peek")
@management_options
@quiet_option
@click.option("-p", "--vhost", default="/", show_default=True)
@click.argument("name")
@click.argument("position")
def queues_peek(api, quiet, vhost, name, position) -> None:
    """The ready message at POSITION (1 = the next delivered) of quorum queue NAME,
    without consuming it: its properties, routing keys, exchange, the first 64 bytes
    of its payload and its headers (rabbitmq-queues peek)."""
    try:
        number = int(position)
    except ValueError:
        number = 0
    if number < 1:
        click.echo('Error (argument validation): "position value must be a positive '
                   'integer"', err=True)
        sys.exit(EX_USAGE)
    result = _rabbit_call(api, "GET", "quorumqueue", "queues", vhost, name, "peek",
                          str(number))
    if not quiet:
        click.echo(f"Peeking at quorum queue {name} at position {number} on node "
                   f"{result['node']} ...")
    echo_table(["keys", "values"], [[key, _cell(value)] for key, value in result["message"]])


@queues.command("reclaim_quorum_memory")
@management_options
@quiet_option
@click.option("-p", "--vhost", default="/", show_default=True)
@click.argument("name")
def queues_reclaim_quorum_memory(api, quiet, vhost, name) -> None:
    """Flush the write-ahead log on every node holding a member of quorum queue NAME:
    the log entries kept in memory go to segment files and their memory is released
    (rabbitmq-queues reclaim_quorum_memory). Prints what each member's node did."""
    if not quiet:
        click.echo(f"Will flush Raft WAL of quorum queue {name} ...")
    rows = _rabbit_call(api, "POST", "quorumqueue", "queues", vhost, name, "reclaim-memory")
    failed = False
    for row in rows:
        if "error" in row:
            failed = True
            click.echo(f"{row['node']}: {row['error']} (not reachable or no replica "
                       "there): nothing done", err=True)
        else:
            click.echo(f"{row['node']}: write-ahead log rolled over; this queue's log "
                       f"entries in memory: {row['before']} bytes before, {row['after']} "
                       "after")
    if failed:
        sys.exit(EX_UNAVAILABLE)


def _add_jobs() -> None:
    # the analytics jobs' commands live with the jobs (jobs/cli.py); pyspark is imported
    # only when a job runs
    from ..jobs.cli import jobs

    main.add_command(jobs)


_add_jobs()


def _add_leases() -> None:
    # `quorumqueue queues list_leases|release_lease` (leases.py)
    from .leases import add_commands

    add_commands(queues)


_add_leases()


def _add_cluster() -> None:
    # `quorumqueue cluster start|status` (cluster.py)
    from .cluster import cluster

    main.add_command(cluster)


_add_cluster()


def _add_ctl() -> None:
    # `quorumqueue ctl add_user|add_vhost|set_permissions|set_policy|...` (ctl.py)
    from . import ctl_clients  # noqa: F401 - list_connections... on the same group
    from .ctl import ctl
    from .diagnostics import diagnostics

    main.add_command(ctl)
    # `quorumqueue diagnostics check_running|check_local_alarms|...` (diagnostics.py)
    main.add_command(diagnostics)


_add_ctl()

if __name__ == "__main__":  # pragma: no cover
    main()

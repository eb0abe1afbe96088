"""`quorumqueue queues list_leases` and `queues release_lease`: the Spark connector's
durable leases as operator objects, through the management API's /api/leases
(broker/management/leases.py; docs/behaviour/leases.md).

A lease that holds messages after its query ended (a memory or console sink, a
notebook, a checkpoint deleted to start over) keeps them unacked until its idle
timeout (the broker's lease_timeout, or the query's leaseTimeout) or an operator's
release gives them back; a released lease is fenced, so a query that comes back to
it fails at start saying which messages went back instead of losing or repeating
them.
"""

from __future__ import annotations

import click

from .http import call, echo_table, management_options

LEASE_FIELDS = ("vhost", "queue", "lease", "state", "messages", "message_bytes", "first",
                "end", "timeout_ms", "idle_ms", "expires_in_ms", "fence")
DEFAULT_FIELDS = ("vhost", "queue", "lease", "state", "messages", "first", "end",
                  "idle_ms", "expires_in_ms")


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):  # a fence: which sequences went back, why, when
        return f"{value['first']}..{value['end']} {value['reason']}"
    return str(value)


def add_commands(queues: click.Group) -> None:
    @queues.command("list_leases")
    @management_options
    @click.option("-p", "--vhost", help="Only this virtual host.")
    @click.option("-q", "--queue", "queue", help="Only this queue (needs --vhost).")
    @click.argument("columns", nargs=-1)
    def list_leases(api, vhost, queue, columns) -> None:
        """Every durable lease (the Spark connector's lease mode): its queue, state
        (holding, empty, fenced), the messages it holds (sequences first..end), how
        long it has been idle and when its timeout gives them back; or the COLUMNs
        named: vhost queue lease state messages message_bytes first end timeout_ms
        idle_ms expires_in_ms fence. Administrator tag needed."""
        unknown = [c for c in columns if c not in LEASE_FIELDS]
        if unknown:
            raise click.BadParameter(f"unknown column(s) {', '.join(unknown)} (known: "
                                     f"{', '.join(LEASE_FIELDS)})", param_hint="COLUMNS")
        if queue is not None and vhost is None:
            raise click.BadParameter("--queue needs --vhost", param_hint="--queue")
        segments = ["leases"] + ([vhost] if vhost is not None else []) + (
            [queue] if queue is not None else [])
        rows = call(api, "GET", *segments)
        headers = list(columns) or list(DEFAULT_FIELDS)
        echo_table(headers, [[_cell(row.get(h)) for h in headers] for row in rows])

    @queues.command("release_lease")
    @management_options
    @click.option("-p", "--vhost", default="/", show_default=True)
    @click.argument("queue")
    @click.argument("lease")
    def release_lease(api, vhost, queue, lease) -> None:
        """Give the messages lease LEASE on QUEUE holds back to the queue (delivery
        count + 1) and fence it: the query that held it fails at its next start,
        naming the messages that went back, instead of reading them twice."""
        result = call(api, "DELETE", "leases", vhost, queue, lease)
        click.echo(f"released lease '{lease}' on queue '{queue}' in vhost '{vhost}': "
                   f"{result['released']} messages back in the queue")

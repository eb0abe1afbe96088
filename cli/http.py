"""The command line's side of the management HTTP API: the node options, one call
turned into a click error, queue rows, and tables (used by `quorumqueue queues ...`
in main.py, `quorumqueue ctl ...` in ctl.py and `quorumqueue cluster status` in
cluster.py; the requests themselves are quorumqueue.client's HttpManagement)."""

from __future__ import annotations

from typing import Callable

import click

from ..client.http_management import HttpManagement, management_options  # noqa: F401
from ..client.errors import ManagementError


def call(api: HttpManagement, method: str, *segments, **kw):
    """One request (HttpManagement.request); a refusal becomes a click error with the
    node's text."""
    try:
        return api.request(method, segments, **kw)
    except ManagementError as error:
        raise click.ClickException(str(error)) from None


def guarded(function: Callable, *args, **kw):
    """`function(*args)` with a refusal turned into a click error, for helpers that
    make several requests."""
    try:
        return function(*args, **kw)
    except ManagementError as error:
        raise click.ClickException(str(error)) from None


def queue_rows(api: HttpManagement, vhost: str | None) -> list[dict]:
    """The queues of `vhost` (every vhost the user may see when None), from
    /api/queues, with the fields the command line shows: vhost, name, type, durable,
    auto_delete, arguments, ready, unacked, consumers, bytes, leader, members (a
    queue without a Raft group: its node is its leader and only member), policy,
    operator_policy ("" for none), effective_policy_definition,
    single_active_consumer_tag, messages_dlx (dead letters a quorum queue holds for
    at-least-once dead lettering), and for a mirrored classic queue mirrors and
    synchronised_mirrors (RabbitMQ 3.x's slave_nodes, synchronised_slave_nodes)."""
    if vhost:
        # the vhost must exist for this user, as before (404 otherwise)
        listed = api.get("queues", vhost, missing=f"NOT_FOUND - no vhost '{vhost}' for "
                                                  f"user '{api.username}'")
    else:
        listed = api.get("queues")
    rows = []
    for q in sorted(listed, key=lambda q: (q["vhost"], q["name"])):
        node = q.get("node") or ""
        rows.append({
            "vhost": q["vhost"], "name": q["name"], "type": q["type"],
            "durable": q["durable"], "auto_delete": q["auto_delete"],
            "arguments": q.get("arguments", {}), "ready": q["messages_ready"],
            "unacked": q["messages_unacknowledged"], "consumers": q["consumers"],
            "bytes": q.get("message_bytes", 0),
            "leader": q.get("leader", node) or "",
            "members": q.get("members", [node] if node else []),
            "policy": q.get("policy") or "", "operator_policy": q.get("operator_policy") or "",
            "effective_policy_definition": q.get("effective_policy_definition") or {},
            # a quorum queue's is single_active_consumer_ctag (RabbitMQ's names)
            "single_active_consumer_tag": q.get("single_active_consumer_tag",
                                                q.get("single_active_consumer_ctag")),
            "messages_dlx": q.get("messages_dlx", 0),
            **({"mirrors": q["slave_nodes"],
                "synchronised_mirrors": q.get("synchronised_slave_nodes", [])}
               if "slave_nodes" in q else {})})
    return rows


def echo_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    for row in [headers] + rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())

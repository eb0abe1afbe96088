"""`quorumqueue cluster start|status` (click), registered by main.py.

    quorumqueue cluster start --nodes 3 [--base-port 5672] [--data-dir data/cluster]
                              [--host 127.0.0.1] [--cookie C] [--config F]
    quorumqueue cluster status [--host H] [--port 15672] [--username U] [--password P]

`start` plans and supervises local nodes (launcher.py); `status` asks one running node's
management HTTP API (`GET /api/quorumqueue/cluster-status`, as an administrator;
client/http_management.py) and prints its nodes, its metadata leader and every
quorum queue's leader and members as aligned tables, like `queues list`.
"""

from __future__ import annotations

import os
import sys

import click

from .http import call, management_options


@click.group()
def cluster() -> None:
    """Run a local cluster and inspect a running one (like rabbitmqctl cluster_status)."""


@cluster.command("start")
@click.option("--nodes", "count", type=int, required=True,
              help="How many nodes: qq1@localhost..qqN@localhost.")
@click.option("--base-port", type=int, default=5672, show_default=True,
              help="AMQP port of qq1 (the others follow; inter-node ports are these "
                   "+ 20000, Prometheus ports + 10020); 0 picks free ports for every "
                   "listener, below the kernel's ephemeral range or within "
                   "QUORUMQUEUE_PICK_PORTS=low-high if set.")
@click.option("--data-dir", type=click.Path(file_okay=False), default="data/cluster",
              show_default=True, help="Parent of the nodes' data directories (DIR/qq1...).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address the nodes' AMQP listeners bind.")
@click.option("--cookie", help="The secret the nodes share (cluster.cookie); default: "
                               "the --config file's, or a newly generated one.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              help="Broker settings every node loads (TOML with RabbitMQ's key names); "
                   "the per-node flags above take precedence over it.")
@click.option("--start-timeout", type=float, default=60.0, show_default=True,
              help="Seconds every node has to accept AMQP.")
def cluster_start(count, base_port, data_dir, host, cookie, config_path,
                  start_timeout) -> None:
    """Run N nodes in the foreground; prints their URIs once all accept AMQP, prefixes
    each node's log lines with its name, and stops them all on SIGTERM/SIGINT. A node
    that dies is named on stdout and the others keep running (try a failover);
    SIGHUP starts the dead ones again."""
    from . import launcher

    try:
        extra_config = ""
        if config_path is not None:
            with open(config_path, encoding="utf-8") as handle:
                extra_config = handle.read()
        cookie = (launcher.check_cookie(cookie) if cookie is not None
                  else launcher.cookie_in_config(extra_config) or launcher.new_cookie())
        plans = launcher.plan_local_cluster(count, base_port, data_dir, host)
        config = launcher.write_cluster_config(
            os.path.join(os.path.abspath(data_dir), launcher.CONFIG_NAME), cookie,
            extra_config)
    except (ValueError, OSError) as error:
        raise click.UsageError(str(error)) from None
    nodes = launcher.cluster_nodes_option(plans)
    commands = [launcher.node_command(plan, nodes, config) for plan in plans]
    runner = launcher.Launcher(plans, commands, out=sys.stdout, err=sys.stderr,
                               start_timeout=start_timeout)
    sys.exit(runner.run())


@cluster.command("status")
@management_options
def cluster_status(api) -> None:
    """Nodes (reachable or not), the metadata leader, and each quorum queue's leader,
    members and online members, as seen by one node."""
    status = call(api, "GET", "quorumqueue", "cluster-status")
    for line in render_status(status):
        click.echo(line)


def render_status(status: dict) -> list[str]:
    """The lines `cluster status` prints for one cluster.status result."""
    lines = [f"Cluster {status.get('cluster_name') or '(unnamed)'}, as seen by "
             f"{status.get('node')}",
             f"Metadata leader: {status.get('metadata_leader') or '(none: no quorum)'}", ""]
    nodes = [[n["name"], n.get("address") or "", "yes" if n.get("reachable") else "no",
              n.get("amqp_uri") or ""] for n in status.get("nodes", [])]
    lines += table(["node", "address", "reachable", "amqp"], nodes)
    queues = [[q["vhost"], q["name"], q.get("leader") or "(none)",
               ",".join(q.get("members", [])), ",".join(q.get("online", []))]
              for q in status.get("queues", [])]
    lines.append("")
    lines += (table(["vhost", "queue", "leader", "members", "online"], queues) if queues
              else ["No quorum queues."])
    return lines


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, headers first (as `queues list`)."""
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in [headers] + rows]

"""The broker's own program: `python -m quorumqueue.broker start [options]`.

Runs one node in the foreground (logs to stderr, stops on SIGTERM/SIGINT). The
command line's `quorumqueue broker start` runs this program (quorumqueue.cli), so
the command line imports no broker module. Not here: every other command (they are
clients of a running node: quorumqueue.cli).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import click

from .config import WORKER_COOKIE_ENV, ConfigError, _nodes, load_settings


@click.group()
def main() -> None:
    """Run the bundled broker."""


@main.command("start")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Broker configuration (TOML with RabbitMQ's key names), e.g. conf/broker.toml.")
@click.option("--port", type=int, help="AMQP port (listeners.tcp.default); 0 picks a free port.")
@click.option("--host", help="Address to listen on (listeners.tcp.host), default 127.0.0.1.")
@click.option("--management-port", type=int,
              help="Management HTTP API port (management.tcp.port, default 15672); 0 "
                   "picks a free port.")
@click.option("--prometheus-port", type=int,
              help="Prometheus metrics port (prometheus.tcp.port, default 15692); 0 picks "
                   "a free port.")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Where durable queues, messages and metadata live.")
@click.option("--node-name", help="This node's name (node_name), e.g. qq1@localhost.")
@click.option("--cluster-port", type=int,
              help="Inter-node port (distribution.listener.port; default AMQP port + 20000).")
@click.option("--cluster-nodes", help="The cluster's nodes, comma-separated name@host:port, "
              "this one included (cluster_formation.classic_config.nodes).")
@click.option("--join", "join", metavar="NAME@HOST:PORT",
              help="Join the cluster of the running node NAME, whose inter-node port is "
                   "HOST:PORT (like rabbitmqctl join_cluster); this node then holds no "
                   "queue replicas until `queues grow` or `add_member`.")
@click.option("--worker", type=int, hidden=True,
              help="This process is worker K of a node of broker.workers (server/workers.py).")
def start(config_path, port, host, management_port, prometheus_port, data_dir, node_name,
          cluster_port, cluster_nodes, join, worker) -> None:
    """Run one broker node in the foreground; logs to stderr; stops on SIGTERM/SIGINT."""
    from .server.run import run

    try:
        nodes = (_nodes("--cluster-nodes", cluster_nodes) if cluster_nodes is not None
                 else None)
        settings = load_settings(config_path, port=port, host=host, data_dir=data_dir,
                                 management_port=management_port,
                                 node_name=node_name, distribution_port=cluster_port,
                                 cluster_nodes=nodes, cluster_join=join,
                                 prometheus_port=prometheus_port)
        settings = _as_worker(settings, worker)
    except ConfigError as error:
        raise click.UsageError(str(error)) from None
    try:
        if settings.workers > 1 and settings.worker < 0:
            from .server.workers import supervise
            sys.exit(supervise(settings, config_path))
        run(settings)
    except ConfigError as error:  # found while starting (e.g. a damaged cookie file)
        click.echo(f"quorumqueue: cannot start the broker: {error}", err=True)
        sys.exit(1)
    except OSError as error:
        click.echo(f"quorumqueue: cannot start the broker: {error}. Is another broker "
                   f"using port {settings.port}? Pick another with --port.", err=True)
        sys.exit(1)


def _as_worker(settings, worker: int | None):
    """The settings of worker `worker` of a node (None: this process is the node or its
    supervisor); a node of several workers is not a member of a bigger cluster yet."""
    if worker is None:
        if settings.workers > 1 and settings.clustered:
            raise ConfigError("broker.workers > 1 on a node of a cluster (cluster_formation."
                              "classic_config.nodes, --cluster-nodes, --join) is not built yet "
                              "(docs/design/workers.md)")
        return settings
    cookie = os.environ.get(WORKER_COOKIE_ENV, "")
    if worker < 0 or not cookie:
        raise ConfigError("--worker is for the processes a node of broker.workers starts")
    return dataclasses.replace(settings, worker=worker, cluster_cookie=cookie)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="quorumqueue broker")

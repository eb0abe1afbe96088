"""The `quorumqueue` command line (click).

    quorumqueue broker start [--config conf/broker.toml] [--port PORT] [--data-dir DIR]
"""

from __future__ import annotations

import sys

import click

from .config import ConfigError, load_settings


@click.group()
@click.version_option(package_name="quorumqueue")
def main() -> None:
    """quorumqueue: replicated queues over AMQP 0-9-1, and a Spark connector for them."""


@main.group()
def broker() -> None:
    """Run and manage the bundled broker."""


@broker.command("start")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="Broker configuration (TOML with RabbitMQ's key names), e.g. conf/broker.toml.")
@click.option("--port", type=int, help="AMQP port (listeners.tcp.default); 0 picks a free port.")
@click.option("--host", help="Address to listen on (listeners.tcp.host), default 127.0.0.1.")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Where durable queues, messages and metadata live.")
def broker_start(config_path, port, host, data_dir) -> None:
    """Run one broker node in the foreground; logs to stderr; stops on SIGTERM/SIGINT."""
    from .server.run import run

    try:
        settings = load_settings(config_path, port=port, host=host, data_dir=data_dir)
    except ConfigError as error:
        raise click.UsageError(str(error)) from None
    try:
        run(settings)
    except OSError as error:
        click.echo(f"quorumqueue: cannot start the broker: {error}. Is another broker "
                   f"using port {settings.port}? Pick another with --port.", err=True)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()

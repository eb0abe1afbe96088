"""The command line's side of the management RPC: the --uri option, one call, and
tables (used by `quorumqueue queues ...` in broker/cli.py and `quorumqueue ctl ...` in
broker/ctl.py, the command line being a client of the broker)."""

from __future__ import annotations

import click

DEFAULT_URI = "amqp://guest:guest@127.0.0.1:5672/%2F"
uri_option = click.option("--uri", default=DEFAULT_URI, show_default=True,
                          envvar="QUORUMQUEUE_URI",
                          help="The node to talk to (AMQP URI of an administrator; amqps:// "
                               "for TLS, with ?cacertfile=CA.pem&certfile=...&keyfile=... "
                               "as RabbitMQ's URI query parameters).")


def _call(uri: str, op: str, **arguments):
    from .management import ManagementError, call

    try:
        return call(uri, op, **arguments)
    except ManagementError as error:
        raise click.ClickException(str(error)) from None


def _echo_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(headers)]
    for row in [headers] + rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())

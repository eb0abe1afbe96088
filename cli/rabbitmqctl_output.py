"""How rabbitmqctl and rabbitmq-diagnostics 3.10 print, for the commands of
ctl_clients.py and diagnostics.py: the options every one of them takes, info-key
columns, tables, the JSON formatter and the failure exit codes.

Responsibilities: `output_options` (-q/--quiet: no banner; --silent: no banner,
no table headers (rabbitmqctl's -s is rabbitmqadmin's --ssl here); --no-table-headers; --formatter table|json), `Columns` (an
info-item list with its defaults: unknown keys are rabbitmqctl's exit 64 with its
text), `print_rows` (the banner, the tab-separated header and rows, or RabbitMQ's
JSON list: one object a line, the first after `[`, the others after `,`), `cell`
(Erlang-ish values: true/false, `[]`, `[{"k",v}]`) and `fail` (`Error:` and the
text on stderr, exit 69 EX_UNAVAILABLE; 70 EX_SOFTWARE for an answer the command
cannot read).

Checked against RabbitMQ 3.10.8's own tools (tests/differential/
test_rabbitmqctl_against_rabbitmq.py): banners, default columns, headers, JSON keys
and exit codes.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence

import click

EX_USAGE = 64        # rabbitmqctl's argument validation errors
EX_UNAVAILABLE = 69  # a check failed, the node refused, the object is not there
EX_SOFTWARE = 70     # an answer the command could not make sense of


def output_options(command: Callable) -> Callable:
    """rabbitmqctl's output flags, collapsed into one `out` argument (an Output)."""
    @click.option("-q", "--quiet", is_flag=True, help="No banner (rabbitmqctl -q).")
    @click.option("--silent", is_flag=True,
                  help="No banner and no table headers (rabbitmqctl --silent; its -s is "
                       "--ssl here, rabbitmqadmin's).")
    @click.option("--no-table-headers", is_flag=True, help="No table headers.")
    @click.option("--formatter", type=click.Choice(["table", "json"]), default="table",
                  show_default=True, help="How to print (RabbitMQ's --formatter).")
    @functools.wraps(command)
    def wrapper(*args, quiet, silent, no_table_headers, formatter, **kw):
        out = Output(banner=not (quiet or silent), headers=not (silent or no_table_headers),
                     json=formatter == "json")
        return command(*args, out=out, **kw)

    return wrapper


class Output:
    """What one command's flags ask for."""

    def __init__(self, banner: bool = True, headers: bool = True, json: bool = False):
        self.banner, self.headers, self.json = banner, headers, json

    def say(self, line: str) -> None:
        """A banner line (not with -q, -s or --formatter json)."""
        if self.banner and not self.json:
            click.echo(line)


class Columns:
    """A command's info keys in RabbitMQ's order, and the ones it shows by default."""

    def __init__(self, known: Sequence[str], default: Sequence[str], *,
                 canonical_order: bool = False) -> None:
        self.known, self.default = tuple(known), tuple(default)
        self.canonical_order = canonical_order  # list_consumers sorts what it is given

    def chosen(self, given: Sequence[str], command: str) -> tuple[str, ...]:
        if not given:
            return self.default
        wanted = [key for part in given for key in part.split(",") if key]
        unknown = [key for key in wanted if key not in self.known]
        if unknown:
            click.echo(f"Error (argument validation): Info key(s) {','.join(unknown)} are "
                       f"not supported\nValid keys: {', '.join(self.known)}", err=True)
            sys.exit(EX_USAGE)
        if self.canonical_order:
            return tuple(key for key in self.known if key in wanted)
        return tuple(wanted)


def cell(value) -> str:
    """A value as rabbitmqctl's table shows it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "[" + ", ".join(f"{{{json.dumps(k)},{_erlang(v)}}}"
                               for k, v in value.items()) + "]"
    if isinstance(value, list):
        return "[" + ", ".join(_erlang(v) for v in value) + "]"
    return str(value)


def _erlang(value) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    return cell(value)


def print_rows(out: Output, banner: str, columns: Sequence[str], rows: list[dict],
               json_value: Callable[[str, object], object] | None = None) -> None:
    """The banner, then the rows' `columns` as a tab-separated table or as RabbitMQ's
    JSON list (`json_value(column, value)` turns a value into its JSON form)."""
    if out.json:
        convert = json_value or (lambda _column, value: value)
        click.echo("[")
        for position, row in enumerate(rows):
            body = json.dumps({c: convert(c, row.get(c)) for c in columns},
                              separators=(",", ":"), ensure_ascii=False)
            click.echo(body if position == 0 else "," + body)
        click.echo("]")
        return
    out.say(banner)
    if out.headers:
        click.echo("\t".join(columns))
    for row in rows:
        click.echo("\t".join(cell(row.get(c)) for c in columns))


def fail(text: str, code: int = EX_UNAVAILABLE) -> None:
    """rabbitmqctl's refusal: `Error:` and the text on stderr, then exit `code`."""
    click.echo("Error:", err=True)
    click.echo(text, err=True)
    sys.exit(code)


def ip_tuple(host):
    """An IPv4 address as RabbitMQ's JSON shows it (Erlang's tuple: [127,0,0,1])."""
    parts = str(host).split(".") if host is not None else []
    if len(parts) == 4 and all(part.isdigit() for part in parts):
        return [int(part) for part in parts]
    return host

"""`quorumqueue ctl list_connections|list_channels|list_consumers|list_exchanges|
list_bindings|close_connection|status`: rabbitmqctl 3.10's commands of the same
names, registered on ctl.py's group by main.py.

    quorumqueue ctl list_connections [COLUMN ...]   (default: user peer_host peer_port state)
    quorumqueue ctl list_channels [COLUMN ...]      (pid user consumer_count messages_unacknowledged)
    quorumqueue ctl list_consumers [-p VHOST] [COLUMN ...]
    quorumqueue ctl list_exchanges [-p VHOST] [COLUMN ...]   (name type)
    quorumqueue ctl list_bindings [-p VHOST] [COLUMN ...]
    quorumqueue ctl close_connection CONNECTION EXPLANATION
    quorumqueue ctl status

Each takes rabbitmqctl's -q/--quiet, -s/--silent, --no-table-headers and --formatter
json (rabbitmqctl_output.py) and reads the management HTTP API (/api/connections,
/api/channels, /api/consumers/V, /api/exchanges/V, /api/bindings/V, /api/overview,
/api/nodes/N), the cluster's clients as RabbitMQ lists them. The columns are
RabbitMQ's info keys. quorumqueue has no Erlang processes: a `pid` column shows the
connection's or channel's name in angle brackets, `<127.0.0.1:50000 -> 127.0.0.1:5672>`,
and close_connection takes that (or the bare name, as `list_connections name` shows
it) where rabbitmqctl takes an Erlang pid.
"""

from __future__ import annotations

import click

from ..client.errors import ManagementError
from .ctl import ctl, vhost_option
from .http import management_options
from .rabbitmqctl_output import EX_SOFTWARE, Columns, fail, ip_tuple, output_options, print_rows

CONNECTION_COLUMNS = Columns(
    ["pid", "name", "port", "host", "peer_port", "peer_host", "ssl", "ssl_protocol",
     "ssl_key_exchange", "ssl_cipher", "ssl_hash", "peer_cert_subject", "peer_cert_issuer",
     "peer_cert_validity", "state", "channels", "protocol", "auth_mechanism", "user",
     "vhost", "timeout", "frame_max", "channel_max", "client_properties", "recv_oct",
     "recv_cnt", "send_oct", "send_cnt", "send_pend", "connected_at"],
    ["user", "peer_host", "peer_port", "state"])
CHANNEL_COLUMNS = Columns(
    ["pid", "connection", "name", "number", "user", "vhost", "transactional", "confirm",
     "consumer_count", "messages_unacknowledged", "messages_uncommitted",
     "acks_uncommitted", "messages_unconfirmed", "prefetch_count", "global_prefetch_count"],
    ["pid", "user", "consumer_count", "messages_unacknowledged"])
CONSUMER_COLUMNS = Columns(
    ["queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count",
     "active", "activity_status", "arguments"],
    ["queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count",
     "active", "arguments"], canonical_order=True)
EXCHANGE_COLUMNS = Columns(
    ["name", "type", "durable", "auto_delete", "internal", "arguments", "policy"],
    ["name", "type"])
BINDING_COLUMNS = Columns(
    ["source_name", "source_kind", "destination_name", "destination_kind", "routing_key",
     "arguments"],
    ["source_name", "source_kind", "destination_name", "destination_kind", "routing_key",
     "arguments"])


def pid(name: str) -> str:
    return f"<{name}>"


def _get(api, *segments, **kw):
    try:
        return api.get(*segments, **kw)
    except ManagementError as error:
        fail(str(error))


def _json_value(column: str, value):
    if column in ("peer_host", "host"):
        return ip_tuple(value)
    if column == "arguments" and isinstance(value, dict):
        return [[k, v] for k, v in value.items()]
    return value


@ctl.command("list_connections")
@management_options
@output_options
@click.argument("columns", nargs=-1)
def list_connections(api, out, columns) -> None:
    """The cluster's AMQP connections (rabbitmqctl list_connections), COLUMNs as
    its info keys."""
    chosen = CONNECTION_COLUMNS.chosen(columns, "list_connections")
    rows = [{**row, "pid": pid(row["name"])} for row in _get(api, "connections")]
    print_rows(out, "Listing connections ...", chosen, rows, _json_value)


@ctl.command("list_channels")
@management_options
@output_options
@click.argument("columns", nargs=-1)
def list_channels(api, out, columns) -> None:
    """The cluster's channels (rabbitmqctl list_channels), COLUMNs as its info keys."""
    chosen = CHANNEL_COLUMNS.chosen(columns, "list_channels")
    rows = [{**row, "pid": pid(row["name"]),
             "connection": pid((row.get("connection_details") or {}).get("name", ""))}
            for row in _get(api, "channels")]
    print_rows(out, "Listing channels ...", chosen, rows, _json_value)


@ctl.command("list_consumers")
@management_options
@output_options
@vhost_option
@click.argument("columns", nargs=-1)
def list_consumers(api, out, vhost, columns) -> None:
    """The consumers of VHOST's queues (rabbitmqctl list_consumers)."""
    chosen = CONSUMER_COLUMNS.chosen(columns, "list_consumers")
    rows = [{**row, "queue_name": row["queue"]["name"],
             "channel_pid": pid(row["channel_details"]["name"])}
            for row in _get(api, "consumers", vhost,
                            missing=f"NOT_FOUND - no vhost '{vhost}'")]
    print_rows(out, f"Listing consumers in vhost {vhost} ...", chosen, rows, _json_value)


@ctl.command("list_exchanges")
@management_options
@output_options
@vhost_option
@click.argument("columns", nargs=-1)
def list_exchanges(api, out, vhost, columns) -> None:
    """The exchanges of VHOST (rabbitmqctl list_exchanges)."""
    chosen = EXCHANGE_COLUMNS.chosen(columns, "list_exchanges")
    rows = _get(api, "exchanges", vhost, missing=f"NOT_FOUND - no vhost '{vhost}'")
    print_rows(out, f"Listing exchanges for vhost {vhost} ...", chosen, rows, _json_value)


@ctl.command("list_bindings")
@management_options
@output_options
@vhost_option
@click.argument("columns", nargs=-1)
def list_bindings(api, out, vhost, columns) -> None:
    """The bindings of VHOST (rabbitmqctl list_bindings), the default exchange's too."""
    chosen = BINDING_COLUMNS.chosen(columns, "list_bindings")
    rows = [{**row, "source_name": row["source"], "source_kind": "exchange",
             "destination_name": row["destination"],
             "destination_kind": row["destination_type"]}
            for row in _get(api, "bindings", vhost, missing=f"NOT_FOUND - no vhost '{vhost}'")]
    # RabbitMQ's banner has no space before its dots here
    print_rows(out, f"Listing bindings for vhost {vhost}...", chosen, rows, _json_value)


@ctl.command("close_connection")
@management_options
@output_options
@click.argument("connection")
@click.argument("explanation")
def close_connection(api, out, connection, explanation) -> None:
    """Close CONNECTION (its pid column, or its name) with 320 CONNECTION_FORCED and
    EXPLANATION (rabbitmqctl close_connection)."""
    name = connection[1:-1] if connection.startswith("<") and connection.endswith(">") \
        else connection
    out.say(f"Closing connection {connection}, reason: {explanation}...")
    try:
        api.delete("connections", name, headers={"X-Reason": explanation},
                   missing=f"no connection {connection}")
    except ManagementError as error:
        fail(str(error))


SECTION = "\x1b[1m{}\x1b[0m"  # rabbitmqctl status bolds its section titles, piped too


def _gb(value) -> str:
    return f"{round((value or 0) / 1e9, 4)} gb"


def listener_purpose(protocol: str) -> str:
    """RabbitMQ's purpose texts (rabbit_networking); this broker speaks AMQP 0-9-1 only."""
    return {"amqp": "AMQP 0-9-1", "amqp/ssl": "AMQP 0-9-1 over TLS",
            "clustering": "inter-node and CLI tool communication",
            "http": "HTTP API", "https": "HTTP API over TLS (HTTPS)"}.get(protocol, protocol)


def listeners(overview: dict) -> list[dict]:
    """This node's listeners as rabbitmq-diagnostics listeners gives them."""
    return [{"interface": item.get("ip_address"), "node": item["node"], "port": item["port"],
             "protocol": item["protocol"], "purpose": listener_purpose(item["protocol"])}
            for item in overview.get("listeners", []) if item["node"] == overview["node"]]


def listener_line(item: dict) -> str:
    return (f"Interface: {item['interface']}, port: {item['port']}, protocol: "
            f"{item['protocol']}, purpose: {item['purpose']}")


ALARM_TEXT = {"memory": "Memory alarm on node {}", "disk": "Free disk space alarm on node {}"}


@ctl.command("status")
@management_options
@output_options
def status(api, out) -> None:
    """The answering node's runtime, alarms, memory, disk, totals and listeners, in
    rabbitmqctl status' sections (or its JSON keys with --formatter json)."""
    import json

    overview = _get(api, "overview")
    name = overview.get("node")
    node = _get(api, "nodes", name)
    if not isinstance(node, dict) or "mem_used" not in node:
        fail(f"unexpected answer from the node: {node!r}", EX_SOFTWARE)
    vhosts = _get(api, "vhosts")
    alarms = [resource for resource, flag in (("memory", node.get("mem_alarm")),
                                               ("disk", node.get("disk_free_alarm"))) if flag]
    totals = {"virtual_host_count": len(vhosts),
              "connection_count": overview["object_totals"]["connections"],
              "queue_count": overview["object_totals"]["queues"]}
    found = listeners(overview)
    if out.json:
        click.echo(json.dumps({
            "alarms": [ALARM_TEXT[a].format(name) for a in alarms],
            "data_directory": node.get("db_dir"), "disk_free": node["disk_free"],
            "disk_free_limit": node["disk_free_limit"], "is_under_maintenance": False,
            "erlang_version": overview.get("erlang_full_version"), "listeners": found,
            "memory": {"strategy": "rss", "total": {"rss": node["mem_used"]}},
            "os": "Linux", "pid": int(node["os_pid"]),
            "product_name": overview.get("product_name"),
            "product_version": overview.get("product_version"),
            "rabbitmq_version": overview.get("rabbitmq_version"), "totals": totals,
            "uptime": node["uptime"] // 1000, "vm_memory_calculation_strategy": "rss",
            "vm_memory_high_watermark_limit": node["mem_limit"]},
            separators=(",", ":"), sort_keys=True))
        return
    out.say(f"Status of node {name} ...")
    lines = [SECTION.format("Runtime"), "", f"OS PID: {node['os_pid']}", "OS: Linux",
             f"Uptime (seconds): {node['uptime'] // 1000}", "Is under maintenance?: false",
             f"RabbitMQ version: {overview.get('rabbitmq_version')}",
             f"Node name: {name}",
             f"Erlang configuration: {overview.get('erlang_full_version')}",
             f"Product name: {overview.get('product_name')}",
             f"Product version: {overview.get('product_version')}", "",
             SECTION.format("Data directory"), "", f"Node data directory: {node.get('db_dir')}",
             "", SECTION.format("Alarms"), "",
             *([ALARM_TEXT[a].format(name) for a in alarms] or ["(none)"]), "",
             SECTION.format("Memory"), "", f"Total memory used: {_gb(node['mem_used'])}",
             "Calculation strategy: rss",
             f"Memory high watermark setting: computed to: {_gb(node['mem_limit'])}", "",
             SECTION.format("Free Disk Space"), "",
             f"Low free disk space watermark: {_gb(node['disk_free_limit'])}",
             f"Free disk space: {_gb(node['disk_free'])}", "",
             SECTION.format("Totals"), "",
             f"Connection count: {totals['connection_count']}",
             f"Queue count: {totals['queue_count']}",
             f"Virtual host count: {totals['virtual_host_count']}", "",
             SECTION.format("Listeners"), "", *[listener_line(item) for item in found]]
    for line in lines:
        click.echo(line, color=True)  # the titles' bold even when piped, as rabbitmqctl


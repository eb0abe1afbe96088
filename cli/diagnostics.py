"""`quorumqueue diagnostics check_running|check_local_alarms|listeners|
check_port_connectivity`: rabbitmq-diagnostics 3.10's commands of the same names,
with its texts, JSON and exit codes (0; 69 when the check fails or the node cannot be
reached; 70 for an answer the command cannot read), registered by main.py.

They ask the node's management HTTP API (/api/overview, /api/health/checks/
local-alarms); check_port_connectivity then connects to every listener the node
reports from where the command runs, as rabbitmq-diagnostics does.
"""

from __future__ import annotations

import json
import socket

import click

from ..client.errors import ManagementError
from .ctl_clients import ALARM_TEXT, listener_line, listeners
from .http import management_options
from .rabbitmqctl_output import EX_SOFTWARE, EX_UNAVAILABLE, fail, output_options


@click.group()
def diagnostics() -> None:
    """Health checks of a running node (like rabbitmq-diagnostics)."""


def _overview(api, failure: str | None = None) -> dict:
    try:
        overview = api.get("overview")
    except ManagementError as error:
        fail(failure or str(error))
    if not isinstance(overview, dict) or "node" not in overview:
        fail(f"unexpected answer from the node: {overview!r}", EX_SOFTWARE)
    return overview


def _json(document: dict) -> str:
    return json.dumps(document, separators=(",", ":"), sort_keys=True)


@diagnostics.command("check_running")
@management_options
@output_options
def check_running(api, out) -> None:
    """Whether the node is fully booted and running (its API answers)."""
    try:
        overview = api.get("overview")
    except ManagementError:
        out.say(f"Checking if RabbitMQ is running on node {api.base} ...")
        fail(f"RabbitMQ on {api.base} is not running or has not fully booted yet (its "
             "management API does not answer)")
    if not isinstance(overview, dict) or "node" not in overview:
        fail(f"unexpected answer from the node: {overview!r}", EX_SOFTWARE)
    out.say(f"Checking if RabbitMQ is running on node {overview['node']} ...")
    message = f"RabbitMQ on node {overview['node']} is fully booted and running"
    click.echo(_json({"message": message}) if out.json else message)


@diagnostics.command("check_local_alarms")
@management_options
@output_options
def check_local_alarms(api, out) -> None:
    """Fails (69) while a memory or disk alarm is in effect on the node."""
    name = _overview(api)["node"]
    out.say(f"Asking node {name} to report any local resource alarms ...")
    try:
        answer = api.get("health", "checks", "local-alarms", answers=(503,))
    except ManagementError as error:
        fail(str(error))
    alarms = [ALARM_TEXT.get(alarm.get("resource"), "{} alarm on node {{}}".format(
        alarm.get("resource"))).format(name) for alarm in (answer or {}).get("alarms", [])]
    if not alarms:
        click.echo(_json({"result": "ok"}) if out.json
                   else f"Node {name} reported no local alarms")
        return
    if out.json:
        click.echo(_json({"local": alarms, "message": f"Node {name} reported local alarms",
                          "result": "error"}), err=True)
        raise SystemExit(EX_UNAVAILABLE)
    fail("\n".join(alarms))


@diagnostics.command("listeners")
@management_options
@output_options
def listeners_command(api, out) -> None:
    """The node's listeners: interface, port, protocol and purpose."""
    overview = _overview(api)
    name = overview["node"]
    found = listeners(overview)
    if out.json:
        click.echo(_json({"listeners": found, "node": name, "result": "ok"}))
        return
    out.say(f"Asking node {name} to report its protocol listeners ...")
    for item in found:
        click.echo(listener_line(item))


def _connects(item: dict, timeout: float = 5.0) -> bool:
    host = item["interface"]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1", None: "127.0.0.1"}.get(
        host, host)
    try:
        with socket.create_connection((host, item["port"]), timeout=timeout):
            return True
    except OSError:
        return False


@diagnostics.command("check_port_connectivity")
@management_options
@output_options
def check_port_connectivity(api, out) -> None:
    """Connects to every listener the node reports; fails (69) naming those refused."""
    overview = _overview(api)
    name = overview["node"]
    found = listeners(overview)
    out.say(f"Testing TCP connections to all active listeners on node {name} ...")
    failed = [item for item in found if not _connects(item)]
    if failed:
        if out.json:
            click.echo(_json({"failures": failed, "node": name, "result": "error"}),
                       err=True)
            raise SystemExit(EX_UNAVAILABLE)
        fail("\n".join([f"Connection to ports of the following listeners on node {name} "
                        "failed: ", *[listener_line(item) for item in failed]]))
    if out.json:
        click.echo(_json({"listeners": found, "node": name, "result": "ok"}))
        return
    ports = ", ".join(str(port) for port in sorted(item["port"] for item in found))
    click.echo(f"Successfully connected to ports {ports} on node {name}.")

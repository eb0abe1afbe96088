"""Leases as operator objects (broker/management/leases.py, cli/leases.py,
docs/behaviour/leases.md): a lease that holds messages after its query ended is
listed by the management API (`/api/leases`, per vhost and per queue), by
`quorumqueue queues list_leases` and in Prometheus (quorumqueue_leases,
quorumqueue_leased_messages, quorumqueue_lease_idle_seconds_max), and an operator's
release (API `DELETE /api/leases/V/Q/L`, `queues release_lease`) gives its messages
back to the queue and fences it. One broker for the module; each test its queues."""

from __future__ import annotations

import subprocess
import sys
import urllib.parse

import pika
import pytest

from quorumqueue.client.lease_client import LeaseClient
from quorumqueue.client.management import ManagementError

from tests.support.broker import BrokerProcess, free_port
from tests.support.prometheus import scrape, value

from .support import call, wait_until_serving

CLI = [sys.executable, "-m", "quorumqueue.cli"]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def node():
    port = free_port()
    with BrokerProcess(extra_config=f"prometheus.tcp.port = {port}\n") as process:
        process.metrics_port = port
        wait_until_serving(process.management_url)
        yield process


def stranded(node, queue: str, lease: str, count: int) -> None:
    """`count` messages in quorum queue `queue`, all held by `lease` (what a lease-mode
    query with a memory sink leaves when it ends)."""
    connection = pika.BlockingConnection(pika.URLParameters(node.uri))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    channel.confirm_delivery()
    for number in range(count):
        channel.basic_publish("", queue, b"m%d" % number)
    connection.close()
    with LeaseClient(node.uri) as client:
        assert client.grow(queue, lease, max_messages=count) == (1, count)


def ready(node, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(node.uri))
    count = connection.channel().queue_declare(queue, passive=True).method.message_count
    connection.close()
    return count


def test_the_api_lists_a_stranded_lease_and_an_operator_release_fences_it(node):
    stranded(node, "api-orders", "spark-api", 5)
    status, rows, _ = call(node.management_url, "GET", "/api/leases")
    assert status == 200
    row, = [r for r in rows if r["queue"] == "api-orders"]
    assert row["vhost"] == "/" and row["lease"] == "spark-api" and row["state"] == "holding"
    assert (row["messages"], row["message_bytes"], row["first"], row["end"]) == (5, 10, 1, 5)
    assert row["timeout_ms"] == 1_800_000 and 0 < row["expires_in_ms"] <= 1_800_000
    assert row["idle_ms"] >= 0 and row["fence"] is None
    def names(rows):  # what identifies a row; idle_ms moves on between two calls
        return [(r["vhost"], r["queue"], r["lease"], r["state"], r["end"]) for r in rows]

    assert names(call(node.management_url, "GET", "/api/leases/%2F")[1]) == names(
        r for r in rows if r["vhost"] == "/")
    assert names(call(node.management_url, "GET", "/api/leases/%2F/api-orders")[1]) == names(
        [row])
    assert call(node.management_url, "GET", "/api/leases/%2F/nope")[0] == 404

    status, body, _ = call(node.management_url, "DELETE", "/api/leases/%2F/api-orders/spark-api")
    assert (status, body) == (200, {"released": 5})
    assert ready(node, "api-orders") == 5
    row, = call(node.management_url, "GET", "/api/leases/%2F/api-orders")[1]
    assert row["state"] == "fenced" and row["messages"] == 0
    assert {k: row["fence"][k] for k in ("first", "end", "reason")} == {
        "first": 1, "end": 5, "reason": "released"}
    with LeaseClient(node.uri) as client, pytest.raises(ManagementError, match=(
            "lease 'spark-api' on queue 'api-orders' in vhost '/' is fenced: it was "
            "released by an operator")):
        client.settle("api-orders", "spark-api", 5)  # the query's late settle
    status, _body, headers = call(node.management_url, "DELETE",
                                  "/api/leases/%2F/api-orders/ghost")
    assert status == 404 and "no lease 'ghost'" in urllib.parse.unquote(
        headers.get("X-Quorumqueue-Error", ""))


def test_leases_need_the_administrator_tag(node):
    management = node.management_url
    assert call(management, "PUT", "/api/users/lease-watcher",
                {"password": "pw", "tags": "monitoring"})[0] in (201, 204)
    assert call(management, "PUT", "/api/permissions/%2F/lease-watcher",
                {"configure": ".*", "write": ".*", "read": ".*"})[0] in (201, 204)
    for method, path in (("GET", "/api/leases"), ("DELETE", "/api/leases/%2F/q/l")):
        # RabbitMQ answers a user without the tag 401 not_authorized, so does this API
        assert call(management, method, path, user="lease-watcher", password="pw")[0] == 401


def run_cli(node, *arguments) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + ["queues", *arguments, "--base-uri", node.management_url],
                          capture_output=True, text=True, timeout=60)


def test_the_command_line_lists_and_releases_a_lease(node):
    stranded(node, "cli-orders", "spark-cli", 3)
    listed = run_cli(node, "list_leases", "--vhost", "/", "--queue", "cli-orders")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split() == ["vhost", "queue", "lease", "state", "messages", "first", "end",
                              "idle_ms", "expires_in_ms"]
    assert row.split()[:7] == ["/", "cli-orders", "spark-cli", "holding", "3", "1", "3"]

    released = run_cli(node, "release_lease", "cli-orders", "spark-cli")
    assert released.returncode == 0, released.stderr
    assert released.stdout == ("released lease 'spark-cli' on queue 'cli-orders' in vhost "
                               "'/': 3 messages back in the queue\n")
    assert ready(node, "cli-orders") == 3
    listed = run_cli(node, "list_leases", "lease", "state", "fence")
    assert "spark-cli  fenced  1..3 released" in listed.stdout
    missing = run_cli(node, "release_lease", "cli-orders", "ghost")
    assert missing.returncode != 0
    assert "no lease 'ghost' on queue 'cli-orders' in vhost '/'" in missing.stderr


def test_prometheus_shows_the_leases_and_what_they_hold(node):
    stranded(node, "prom-orders", "spark-prom", 4)
    per_queue = scrape(node.metrics_port, "/metrics/per-object")
    assert value(per_queue, "quorumqueue_leased_messages", queue="prom-orders") == 4
    assert value(per_queue, "quorumqueue_leases", queue="prom-orders", state="holding") == 1
    assert value(per_queue, "quorumqueue_lease_idle_seconds_max", queue="prom-orders") >= 0
    summed = scrape(node.metrics_port)
    assert value(summed, "quorumqueue_leased_messages") >= 4
    assert value(summed, "quorumqueue_leases", state="holding") >= 1
    call(node.management_url, "DELETE", "/api/leases/%2F/prom-orders/spark-prom")
    per_queue = scrape(node.metrics_port, "/metrics/per-object")
    assert value(per_queue, "quorumqueue_leased_messages", queue="prom-orders") == 0
    assert value(per_queue, "quorumqueue_leases", queue="prom-orders", state="fenced") == 1

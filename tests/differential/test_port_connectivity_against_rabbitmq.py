"""`quorumqueue diagnostics check_port_connectivity` failing as RabbitMQ 3.10.8's
rabbitmq-diagnostics fails it (issue 30): a listener the node reports and the check
cannot reach. rabbitmq-diagnostics connects to each listener at the node's host name,
whatever the listener's interface, so a management listener on 127.0.0.2 fails it
there; quorumqueue's check connects at the interface, so its real listeners are
always reached from the node's host and its failure is shown against a stand-in API
(docs/behaviour/command-line.md says why the two differ). Compared: exit code, the
banner, `Error:`, RabbitMQ's sentence, one line per listener, the JSON object, -q.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.differential.test_management_against_rabbitmq import _get
from tests.differential.test_rabbitmqctl_against_rabbitmq import ours_node_name
from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode, _reserve_loopback_ports, management_node

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def quorumqueue():
    with BrokerProcess() as process:
        yield process


@pytest.fixture(scope="module")
def rabbitmq_unreachable_listener():
    """RabbitMQ with its management listener on 127.0.0.2: rabbitmq-diagnostics
    connects to each listener at the node's host name (localhost: 127.0.0.1, ::1),
    not at the listener's interface, so it cannot reach this one (and RabbitMQ 3.10.8
    reports its interface as [::])."""
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with management_node(ip="127.0.0.2") as node:
        yield node


def _overview_with_a_closed_listener(broker: BrokerProcess):
    """A stand-in for `broker`'s API whose /api/overview is the broker's own, its
    management listener's port replaced by one nothing listens on: quorumqueue's
    check connects to each listener's interface, so a real listener it reports is
    always reached from the node's host (no firewall here to cut one off)."""
    import http.server
    import threading

    overview = _get(broker.management_url, "/api/overview")
    closed, = _reserve_loopback_ports(1)   # released: nothing listens there
    for listener in overview["listeners"]:
        if listener["protocol"] == "http":
            listener["port"] = closed
    body = json.dumps(overview).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if self.path.startswith("/api/overview") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, closed


def test_check_port_connectivity_fails_as_rabbitmq_diagnostics_fails(
        rabbitmq_unreachable_listener, quorumqueue):
    """A listener reported and not reached: exit 69, the banner on stdout, `Error:`,
    RabbitMQ's sentence and one line per listener on stderr; with --formatter json the
    failures object on stderr. RabbitMQ's failure is its own (the listener on
    127.0.0.2); quorumqueue's is its command against a stand-in API (see above)."""
    server, closed = _overview_with_a_closed_listener(quorumqueue)
    try:
        base = f"http://guest:guest@127.0.0.1:{server.server_address[1]}"

        def ours_(*arguments):
            return subprocess.run([sys.executable, "-m", "quorumqueue.cli", "diagnostics",
                                   "check_port_connectivity", *arguments, "--base-uri", base],
                                  capture_output=True, text=True, timeout=120)

        node = rabbitmq_unreachable_listener
        their = node.ctl("check_port_connectivity", tool="rabbitmq-diagnostics")
        our = ours_()
        assert their.returncode == our.returncode == 69, (their, our)
        names = (node.node_name, ours_node_name(quorumqueue))
        for result, name, port in ((their, names[0], node.management_port),
                                   (our, names[1], closed)):
            assert result.stdout == (f"Testing TCP connections to all active listeners on "
                                     f"node {name} ...\n")
            lines = result.stderr.splitlines()
            assert lines[:2] == ["Error:", "Connection to ports of the following listeners "
                                           f"on node {name} failed: "]
            [line] = lines[2:]
            fields = dict(part.split(": ", 1) for part in line.split(", "))
            assert (fields["port"], fields["protocol"], fields["purpose"]) == (
                str(port), "http", "HTTP API")
        their, our = (node.ctl("check_port_connectivity", "--formatter", "json",
                               tool="rabbitmq-diagnostics"), ours_("--formatter", "json"))
        assert their.returncode == our.returncode == 69
        assert their.stdout == our.stdout == ""
        their_json, our_json = json.loads(their.stderr), json.loads(our.stderr)
        assert set(our_json) == set(their_json) == {"failures", "node", "result"}
        assert our_json["result"] == their_json["result"] == "error"
        assert [set(f) for f in our_json["failures"]] == [set(f) for f in
                                                           their_json["failures"]]
        their, our = (node.ctl("check_port_connectivity", "-q", tool="rabbitmq-diagnostics"),
                      ours_("-q"))
        assert their.returncode == our.returncode == 69
        assert their.stdout == our.stdout == ""
    finally:
        server.shutdown()

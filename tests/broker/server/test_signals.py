"""SIGTERM and SIGINT stop a node cleanly at any moment once one of its ports answers,
as rabbitmqctl stop or a service manager expects: the handlers are in place before
the first listener, so a signal during the start is acted on once the start is done,
never by the signal's default action (the process killed, exit -15)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.broker import ROOT, free_port

# a node whose management listener sends the node SIGTERM the moment it listens: the
# earliest time a client (or BrokerProcess.start) can see the node up
_NODE = textwrap.dedent("""
    import os, signal, sys
    from quorumqueue.broker.config import Settings
    from quorumqueue.broker.server import run, server

    started = server.BrokerServer.start_management

    async def start_management(self):
        await started(self)
        os.kill(os.getpid(), signal.SIGTERM)

    server.BrokerServer.start_management = start_management
    run.run(Settings(port=int(sys.argv[1]), management_port=int(sys.argv[2]),
                     prometheus_port=int(sys.argv[3]), data_dir=sys.argv[4]))
""")


def test_a_sigterm_as_the_management_port_starts_listening_stops_the_node_cleanly(tmp_path):
    node = subprocess.run(
        [sys.executable, "-c", _NODE, str(free_port()), str(free_port()), str(free_port()),
         str(tmp_path / "node")],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert node.returncode == 0, node.stderr[-3000:]
    assert "shutdown requested, closing connections" in node.stderr
    assert "stopped" in node.stderr.splitlines()[-1]

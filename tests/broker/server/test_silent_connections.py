"""Clients that connect and never finish speaking (issue 30, item 2): every listener
closes them after its timeout, RabbitMQ's keys, while other clients are served.

- AMQP: handshake_timeout (tests/broker/amqp/test_connection.py for each step,
  tests/differential/test_handshake_against_rabbitmq.py against RabbitMQ);
- the management API and the Prometheus endpoint: management.tcp.request_timeout and
  prometheus.tcp.request_timeout (Cowboy's request_timeout: RabbitMQ 3.10.8 closes a
  silent connection, and one stopped inside its headers, after 5 s).

Timeouts are lowered so the tests take seconds; waits are for the socket's close, with
bounds far above the timeouts (a busy machine makes them later, never sooner).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from tests.support.broker import BrokerProcess, free_port

pytestmark = pytest.mark.timeout(240)

TIMEOUT_MS = 1000
BOUND = 30.0   # seconds a close may take on a loaded machine; on the old code: never


def closed_after(port: int, data: bytes, bound: float = BOUND) -> float | None:
    """Connect, send `data`, read until the peer closes: the seconds it took, or None
    if it was still open after `bound`."""
    with socket.create_connection(("127.0.0.1", port), timeout=bound) as sock:
        began = time.monotonic()
        if data:
            sock.sendall(data)
        try:
            while sock.recv(65536):
                if time.monotonic() - began > bound:
                    return None
        except ConnectionResetError:
            pass
        except TimeoutError:
            return None
        return time.monotonic() - began


@pytest.fixture(scope="module")
def broker():
    prometheus = free_port()
    with BrokerProcess(extra_config=f"management.tcp.request_timeout = {TIMEOUT_MS}\n"
                                    f"prometheus.tcp.request_timeout = {TIMEOUT_MS}\n"
                                    f"prometheus.tcp.port = {prometheus}\n") as process:
        process.prometheus_port = prometheus
        yield process


def test_http_connections_that_never_finish_their_headers_are_closed(broker):
    """Silent, or stopped inside the request's headers, on both HTTP listeners: each
    closed after request_timeout (before, kept open for aiohttp's 3,630 s), while a
    whole request is answered meanwhile."""
    cases = []
    for port, path in ((broker.management_port, "/api/overview"),
                       (broker.prometheus_port, "/metrics")):
        cases += [(port, b""), (port, f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode())]
    results: dict[int, float | None] = {}
    threads = [threading.Thread(target=lambda i=i, c=c: results.__setitem__(
        i, closed_after(*c))) for i, c in enumerate(cases)]
    for thread in threads:
        thread.start()
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.prometheus_port}/metrics",
                                timeout=60) as response:
        assert response.status == 200
    for thread in threads:
        thread.join()
    assert all(results[i] is not None for i in range(len(cases))), results
    assert min(results.values()) >= TIMEOUT_MS / 1000 - 0.3


def test_a_keep_alive_connection_gets_a_whole_request_time_after_each_response(broker):
    """The timer starts again after a response: a client that sends its requests
    within request_timeout of each other keeps its connection."""
    with socket.create_connection(("127.0.0.1", broker.prometheus_port), timeout=60) as sock:
        for _ in range(3):
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n\r\n")
            received = b""
            while b"\r\n\r\n" not in received:
                received += sock.recv(65536)
            assert received.startswith(b"HTTP/1.1 200")
            head, _, body = received.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += sock.recv(65536)
            time.sleep(0.3)

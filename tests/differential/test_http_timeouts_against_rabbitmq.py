"""The management listener's timers against RabbitMQ 3.10.8's (Cowboy 2.8), issue 30:
management.tcp.request_timeout, idle_timeout and inactivity_timeout set alike on
both, five clients that stop speaking at different places, on both at once. What
each client receives before the close (nothing, a 408, or the answer to its one
request) must agree, and each is closed by the timer RabbitMQ closes it with:
request_timeout before the first request's headers end, idle_timeout once they
have (a body stopped part-way, a keep-alive connection idle after an answer).

Times have lower bounds only (each timer is that long at least; a busy machine
makes them later) and a generous upper one (closed at all).
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode, management_node

pytestmark = pytest.mark.timeout(240)

REQUEST_MS, IDLE_MS, INACTIVITY_MS = 2000, 4000, 60000
TIMERS = (f"management.tcp.request_timeout = {REQUEST_MS}\n"
          f"management.tcp.idle_timeout = {IDLE_MS}\n"
          f"management.tcp.inactivity_timeout = {INACTIVITY_MS}\n")
BOUND = 50.0
AUTH = b"Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n"

# name -> (bytes sent, the timer that closes it)
CASES = {
    "silent": (b"", REQUEST_MS),
    "inside the request line": (b"GET /api/overview HT", REQUEST_MS),
    "inside the headers": (b"GET /api/overview HTTP/1.1\r\nHost: x\r\n", REQUEST_MS),
    "inside the body": (b"PUT /api/vhosts/x HTTP/1.1\r\nHost: x\r\n" + AUTH
                        + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                        b'{"a":', IDLE_MS),
    "keep-alive after an answer": (b"GET /api/whoami HTTP/1.1\r\nHost: x\r\n" + AUTH
                                   + b"\r\n", IDLE_MS),
}


def probe(port: int, data: bytes) -> tuple[bytes, float | None]:
    """Send `data`, read until the close: the status line received (b"" for none)
    and the seconds until the close (None: still open after BOUND)."""
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND) as sock:
        began, received = time.monotonic(), b""
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            return received.split(b"\r\n")[0], None
        return received.split(b"\r\n")[0], time.monotonic() - began


@pytest.fixture(scope="module")
def rabbitmq_timers():
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    with management_node(TIMERS) as node:
        yield node


@pytest.fixture(scope="module")
def quorumqueue_timers():
    with BrokerProcess(extra_config=TIMERS) as process:
        yield process


def test_clients_that_stop_speaking_are_closed_as_rabbitmq_closes_them(
        rabbitmq_timers, quorumqueue_timers):
    ports = {"rabbitmq": rabbitmq_timers.management_port,
             "quorumqueue": quorumqueue_timers.management_port}
    jobs = [(broker, name) for broker in ports for name in CASES]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = dict(zip(jobs, pool.map(
            lambda job: probe(ports[job[0]], CASES[job[1]][0]), jobs)))
    for name, (_data, timer_ms) in CASES.items():
        (theirs, their_time), (ours, our_time) = (results["rabbitmq", name],
                                                  results["quorumqueue", name])
        assert their_time is not None and our_time is not None, (name, results)
        # the same answer before the close: none, the 408, or the request's own
        # (an authenticated whoami: 200)
        assert theirs == ours, (name, theirs, ours)
        assert min(their_time, our_time) >= timer_ms / 1000 - 0.3, (name, results)
    assert results["rabbitmq", "inside the headers"][0] == b"HTTP/1.1 408 Request Timeout"

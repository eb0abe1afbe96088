"""Clients that connect and never finish speaking (issue 30, item 2): every listener
closes them after its timeout, RabbitMQ's keys, while other clients are served.

- AMQP: handshake_timeout (tests/broker/amqp/test_connection.py for each step,
  tests/differential/test_handshake_against_rabbitmq.py against RabbitMQ);
- the management API and the Prometheus endpoint: management.tcp.request_timeout and
  prometheus.tcp.request_timeout (Cowboy's request_timeout: RabbitMQ 3.10.8 closes a
  silent connection, and one stopped inside its headers with a 408, after 5 s), and
  their idle_timeout (a body never finished, a keep-alive connection idle after an
  answer); tests/differential/test_http_timeouts_against_rabbitmq.py compares them.

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
IDLE_MS = 2000
BOUND = 30.0   # seconds a close may take on a loaded machine; on the old code: never


def closed_after(port: int, data: bytes, bound: float = BOUND,
                 received: list | None = None) -> float | None:
    """Connect, send `data`, read until the peer closes: the seconds it took, or None
    if it was still open after `bound` (what it sent in `received`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=bound) as sock:
        began = time.monotonic()
        if data:
            sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                if received is not None:
                    received.append(chunk)
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
                                    f"management.tcp.idle_timeout = {IDLE_MS}\n"
                                    f"prometheus.tcp.idle_timeout = {IDLE_MS}\n"
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


def test_a_request_stopped_inside_its_headers_gets_a_408_as_cowboy_answers(broker):
    """RabbitMQ 3.10.8 (Cowboy) answers 408 Request Timeout before it closes a
    connection stopped inside its headers; one stopped inside its request line is
    closed without a word (before, both without a word)."""
    for port in (broker.management_port, broker.prometheus_port):
        inside_headers: list = []
        assert closed_after(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n",
                            received=inside_headers) is not None
        assert b"".join(inside_headers).startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        inside_line: list = []
        assert closed_after(port, b"GET /metr", received=inside_line) is not None
        assert inside_line == []


AUTH = b"Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n"


def test_a_request_whose_body_never_ends_and_an_idle_keep_alive_are_closed(broker):
    """idle_timeout (Cowboy's, RabbitMQ's management.tcp.idle_timeout): a body
    announced and stopped part-way, and a keep-alive connection silent after an
    answer, closed once nothing came for IDLE_MS (before: the body kept its connection
    for good, the keep-alive one was closed after request_timeout, where RabbitMQ
    waits for idle_timeout)."""
    cases = [
        (broker.management_port,
         b"PUT /api/vhosts/v HTTP/1.1\r\nHost: x\r\n" + AUTH
         + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":"),
        (broker.management_port, b"GET /api/overview HTTP/1.1\r\nHost: x\r\n" + AUTH
         + b"\r\n"),
        (broker.prometheus_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
    ]
    results: dict[int, float | None] = {}
    threads = [threading.Thread(target=lambda i=i, c=c: results.__setitem__(
        i, closed_after(*c))) for i, c in enumerate(cases)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results[i] is not None for i in range(len(cases))), results
    assert min(results.values()) >= IDLE_MS / 1000 - 0.3, results


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


# ---------------------------------------------------------------- descriptor exhaustion

DESCRIPTORS = 2048
SILENT = 2100
HANDSHAKE_MS = 3000


def _closed(sock: socket.socket) -> bool:
    """Whether the peer has closed `sock` (non-blocking look)."""
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:   # a reset
        return True


def _amqp_round_trip(port: int) -> None:
    import pika

    parameters = pika.ConnectionParameters("127.0.0.1", port, socket_timeout=10,
                                           blocked_connection_timeout=30)
    connection = pika.BlockingConnection(parameters)
    try:
        channel = connection.channel()
        channel.queue_declare("silent-neighbours")
        channel.basic_publish("", "silent-neighbours", b"through")
        assert channel.basic_get("silent-neighbours", auto_ack=True)[2] == b"through"
    finally:
        connection.close()


class ConfirmedPublisher(threading.Thread):
    """A client connected before the flood: persistent messages into a quorum queue,
    one confirm at a time, until stopped; `confirmed` counts them, `error` is why it
    stopped early."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        import pika

        self.connection = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, socket_timeout=30, blocked_connection_timeout=60))
        self.channel = self.connection.channel()
        self.channel.queue_declare("flood-survivor", durable=True,
                                   arguments={"x-queue-type": "quorum"})
        self.channel.confirm_delivery()
        self.confirmed = 0
        self.error: BaseException | None = None
        self.running = True

    def run(self) -> None:
        import pika

        body = b"x" * 4096
        try:
            while self.running:
                self.channel.basic_publish("", "flood-survivor", body,
                                           pika.BasicProperties(delivery_mode=2))
                self.confirmed += 1
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def stop(self) -> None:
        self.running = False
        self.join(60)
        if self.error is None:
            self.connection.close()


def test_2100_silent_connections_against_2048_descriptors_are_closed_and_others_served():
    """Issue 30's acceptance: a node allowed 2,048 descriptors, 2,100 connections that
    send nothing. Client sockets may hold sockets_limit (1,751) of them; the others are
    refused at once with a line in the log (a few lines, not one per socket); the held
    ones are closed after handshake_timeout; a normal AMQP client and the management
    API get through meanwhile (once a silent one made room), and the node logs no
    traceback. Before, the silent sockets held every descriptor for good and every
    client was locked out."""
    import resource
    import urllib.error

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < SILENT + 200:
        pytest.skip(f"this test opens {SILENT} sockets; RLIMIT_NOFILE allows {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, SILENT + 200), hard))
    silent: list[socket.socket] = []
    # the WAL rolls over every 256 KB and segments hold 16 entries: the node opens
    # files all through the flood
    with BrokerProcess(nofile=DESCRIPTORS,
                       extra_config=f"handshake_timeout = {HANDSHAKE_MS}\n"
                                    "[raft]\nwal_max_size_bytes = 262144\n"
                                    "segment_max_entries = 16\n") as broker:
        publisher = ConfirmedPublisher(broker.port)
        publisher.start()
        try:
            began = time.monotonic()
            before = publisher.confirmed
            for _ in range(SILENT):
                sock = socket.socket()
                sock.settimeout(30)
                try:
                    sock.connect(("127.0.0.1", broker.port))
                except OSError:   # refused while connecting: closed already
                    sock.close()
                    continue
                sock.setblocking(False)
                silent.append(sock)
            served = {"amqp": False, "http": False}
            deadline = time.monotonic() + 120
            while not all(served.values()) and time.monotonic() < deadline:
                if not served["amqp"]:
                    try:
                        _amqp_round_trip(broker.port)
                        served["amqp"] = True
                    except Exception:  # noqa: BLE001 - refused while the limit is full
                        pass
                if not served["http"]:
                    try:
                        with urllib.request.urlopen(f"{broker.management_url}/api/overview",
                                                    timeout=10) as response:
                            served["http"] = response.status == 401  # no credentials
                    except urllib.error.HTTPError as error:
                        served["http"] = error.code == 401
                    except OSError:
                        pass
                time.sleep(0.2)
            assert served == {"amqp": True, "http": True}, broker.log()
            open_ones = silent
            while open_ones and time.monotonic() < began + 120:
                open_ones = [sock for sock in open_ones if not _closed(sock)]
                time.sleep(0.2)
            assert not open_ones, f"{len(open_ones)} silent connections still open"
            during = publisher.confirmed
            deadline = time.monotonic() + 60
            while publisher.confirmed < during + 50 and publisher.error is None \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
            assert publisher.error is None, repr(publisher.error)
            assert publisher.confirmed >= during + 50 and during > before
            assert broker.process.poll() is None
            log = open(broker.log_path).read()
            assert "Too many open files" not in log
            refusals = log.count("refused a TCP connection from")
            assert 1 <= refusals <= 30, refusals
            assert "{handshake_timeout,handshake}" in log
            assert "Traceback" not in log
            _amqp_round_trip(broker.port)   # and after it all
        finally:
            publisher.stop()
            for sock in silent:
                sock.close()

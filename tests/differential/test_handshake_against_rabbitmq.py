"""The AMQP handshake's refusals against RabbitMQ 3.10.8 (issue 30): PLAIN with an
authorization identity other than the user, and connections that never finish the
handshake. Each case goes to a private RabbitMQ node and to quorumqueue; what the
client receives after the probe and whether the socket is closed must agree. Times
have lower bounds (a busy machine makes them longer, never shorter) and generous
upper ones (what matters is that the socket closes at all).

Deliberate difference: PLAIN's `guest NUL guest NUL guest` (the identity equal to the
user) logs in on quorumqueue (RFC 4616: the user acting as itself); RabbitMQ 3.10.8
refuses any identity that is not empty. Not compared: no client sends it.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from pamqp import commands, frame

pytestmark = pytest.mark.timeout(180)

SILENT_CLOSE_DELAY = 3.0


def _frames(data: bytes) -> list:
    found = []
    while len(data) >= 8:
        try:
            used, _channel, value = frame.unmarshal(data)
        except Exception:  # noqa: BLE001 - a partial frame ends the list
            break
        found.append(type(value).__name__)
        data = data[used:]
    return found


def probe(port: int, steps: list[bytes], wait: float = 60.0) -> tuple[list[str], float]:
    """Connect, send `steps`, then read until the broker closes: the names of the
    frames it sent after the last step, and the seconds until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        received = b""
        for step in steps:
            sock.sendall(step)
            if step.startswith(b"AMQP"):
                received += sock.recv(65536)   # connection.start
        began, after = time.monotonic(), b""
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                data = b""
            if not data:
                return _frames(after), time.monotonic() - began
            after += data


def start_ok(response: str, close_on_refusal: bool = True) -> bytes:
    ok = commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close":
                                            close_on_refusal}},
        mechanism="PLAIN", response="x", locale="en_US")
    ok.response = response
    return frame.marshal(ok, 0)


HEADER = b"AMQP\x00\x00\x09\x01"


@pytest.mark.parametrize("response", ["alice\0guest\0guest", "guest\0guest"],
                         ids=["another identity", "two parts"])
def test_a_foreign_authorization_identity_is_refused_as_rabbitmq_refuses_it(
        response, rabbitmq, broker):
    """RabbitMQ: a syntax error in the starting state; nothing sent (even to a
    client that asks for connection.close on a refused login), the socket closed
    after SILENT_CLOSE_DELAY."""
    with ThreadPoolExecutor(2) as pool:
        theirs, ours = pool.map(lambda port: probe(port, [HEADER, start_ok(response)]),
                                (rabbitmq.port, broker.port))
    assert theirs[0] == ours[0] == []
    assert theirs[1] >= SILENT_CLOSE_DELAY - 0.5 and ours[1] >= SILENT_CLOSE_DELAY - 0.5


# handshake_timeout, lowered on both brokers so the cases take seconds (RabbitMQ's
# default is 10 s; quorumqueue's too)
HANDSHAKE_TIMEOUT_MS = 2000
TUNE_OK = frame.marshal(commands.Connection.TuneOk(channel_max=0, frame_max=131072,
                                                    heartbeat=0), 0)


@pytest.fixture(scope="module")
def patient_brokers():
    """A RabbitMQ node and a quorumqueue node, each with handshake_timeout 2 s."""
    from tests.support.broker import BrokerProcess
    from tests.support.rabbitmq import RabbitMQNode

    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    setting = f"handshake_timeout = {HANDSHAKE_TIMEOUT_MS}\n"
    with RabbitMQNode(extra_config=setting) as theirs, \
            BrokerProcess(extra_config=setting) as ours:
        yield theirs, ours


STALLED = {
    "nothing": [],
    "AMQ": [b"AMQ"],
    "the protocol header": [HEADER],
    "start-ok, no tune-ok": [HEADER, start_ok("\0guest\0guest")],
    "tune-ok, no open": [HEADER, start_ok("\0guest\0guest") + TUNE_OK],
}


@pytest.mark.parametrize("steps", STALLED.values(), ids=STALLED.keys())
def test_a_handshake_that_stops_is_closed_after_handshake_timeout(steps, patient_brokers):
    """rabbit_reader: a connection not open handshake_timeout after its accept is
    closed without a word, wherever it stopped; logged as {handshake_timeout,...}.
    Before, quorumqueue kept such connections open for good."""
    rabbitmq, broker = patient_brokers
    with ThreadPoolExecutor(2) as pool:
        theirs, ours = pool.map(lambda port: probe(port, steps),
                                (rabbitmq.port, broker.port))
    assert theirs[0] == ours[0]   # what came after the last step (tune, or nothing)
    least = HANDSHAKE_TIMEOUT_MS / 1000 - 0.5
    assert theirs[1] >= least and ours[1] >= least
    waited_for = "handshake" if not steps or steps == [b"AMQ"] else "frame_header"
    assert f"{{handshake_timeout,{waited_for}}}" in broker.log()

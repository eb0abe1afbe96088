"""Heartbeat enforcement against RabbitMQ 3.10.8 (the heartbeats guide, "Heartbeat
Timeout Value" and "Disabling Heartbeats"; AMQP 0-9-1 spec 4.2.7).

The interval a client sends in connection.tune-ok is the one both sides use (RabbitMQ
takes the client's value, 0 included). A client that then sends nothing gets the
server's heartbeat frames and, once two intervals passed without a frame from it, its
socket closed without a connection.close (rabbit_heartbeat stops the reader: "missed
heartbeats from client"). With 0 no heartbeats are sent and a silent client is kept.
The unit tests of the timing itself are in tests/broker/amqp/test_connection.py.
"""

from __future__ import annotations

import time

import pytest

from tests.differential.probe import Probe

pytestmark = pytest.mark.timeout(120)

CONNECTION_CLOSE = b"\x00\x0a\x00\x32"  # class 10, method 50
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def silent_client(uri: str, heartbeat: int, wait: float) -> dict:
    """Handshake with `heartbeat`, then send nothing for up to `wait` seconds."""
    probe = Probe(uri)
    try:
        probe.handshake(heartbeat=heartbeat)
        began = time.monotonic()
        data = probe.read_until_closed(timeout=wait)
        elapsed = time.monotonic() - began
    finally:
        probe.sock.close()
    still_open = data.endswith(b"<timeout: socket still open>")
    return {"closed by the server": not still_open,
            "connection.close sent": CONNECTION_CLOSE in data,
            "heartbeats received": HEARTBEAT_FRAME in data,
            "elapsed": elapsed}


@pytest.mark.parametrize("target", ["rabbitmq", "broker"])
def test_a_silent_client_is_closed_after_two_intervals(target, request):
    uri = request.getfixturevalue(target).uri
    outcome = silent_client(uri, heartbeat=1, wait=15.0)
    assert {key: value for key, value in outcome.items() if key != "elapsed"} == {
        "closed by the server": True, "connection.close sent": False,
        "heartbeats received": True}
    # not before the interval has passed (RabbitMQ's receive check runs once per
    # interval, so it may close anywhere after the first; the spec's two intervals
    # are quorumqueue's bound, tests/broker/amqp/test_connection.py)
    assert outcome["elapsed"] >= 1.0, outcome


@pytest.mark.parametrize("target", ["rabbitmq", "broker"])
def test_heartbeat_zero_disables_them(target, request):
    uri = request.getfixturevalue(target).uri
    outcome = silent_client(uri, heartbeat=0, wait=4.0)
    assert {key: value for key, value in outcome.items() if key != "elapsed"} == {
        "closed by the server": False, "connection.close sent": False,
        "heartbeats received": False}


def test_the_broker_logs_missed_heartbeats_as_rabbitmq(broker):
    """RabbitMQ logs the closure with 'missed heartbeats from client, timeout: 1s'."""
    silent_client(broker.uri, heartbeat=1, wait=15.0)
    deadline = time.monotonic() + 10.0
    while "missed heartbeats from client, timeout: 1s" not in broker.log():
        assert time.monotonic() < deadline, broker.log()
        time.sleep(0.1)

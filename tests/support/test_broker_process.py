"""BrokerProcess, the bundled broker the tests start: a port it picked free but that
another process took before the broker bound it (another pytest-xdist worker's broker)
costs a retry on new ports, not a failed test; a port the test chose is kept."""

from __future__ import annotations

import socket

import pytest

from tests.support.broker import BrokerProcess


def hold(port: int) -> socket.socket:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def test_a_picked_port_taken_before_the_start_is_replaced():
    broker = BrokerProcess()
    taken = broker.port
    with hold(taken):
        try:
            broker.start()
            assert broker.port != taken
            with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                assert sock.recv(1) == b"\x01"  # connection.start's frame type
        finally:
            broker.cleanup()


def test_a_port_the_test_chose_is_not_replaced():
    with hold(0) as holder:
        port = holder.getsockname()[1]
        broker = BrokerProcess(port=port)
        try:
            with pytest.raises(RuntimeError, match="address already in use"):
                broker.start(timeout=30)
            assert broker.port == port
        finally:
            broker.cleanup()

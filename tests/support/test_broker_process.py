"""BrokerProcess, the bundled broker the tests start: a port it picked free but that
another process took before the broker bound it (another pytest-xdist worker's broker)
costs a retry on new ports, not a failed test; a port the test chose is kept; a broker
ends with the process that started it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.broker import ROOT, BrokerProcess


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


def test_a_broker_ends_when_the_process_that_started_it_is_killed(tmp_path):
    # a pytest worker killed by a timeout runs no cleanup: the broker must not outlive it
    starter = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from tests.support.broker import BrokerProcess\n"
         f"broker = BrokerProcess(data_dir={str(tmp_path)!r}).start()\n"
         "print(broker.process.pid, flush=True)\n"
         "time.sleep(600)\n"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        broker_pid = int(starter.stdout.readline())
    finally:
        starter.kill()
        starter.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _running(broker_pid):
        time.sleep(0.2)
    if _running(broker_pid):
        os.kill(broker_pid, signal.SIGKILL)
        raise AssertionError(f"broker {broker_pid} outlived the process that started it")


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may be slow to collect it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

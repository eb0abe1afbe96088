"""The server's ticker outlives a failing round (issue 30, "no periodic task dies
silently"): heartbeats, queue expiry and the resource alarms run twice a second
(broker/server/server.py `_tick_forever`), and a step that raises is logged and
skipped for that round while the others, and the next rounds, go on
(broker/server/periodic.py). Before, one exception ended the ticker task for good
without a word: under `ulimit -n 256` the alarm check's read of /proc/self/statm
failed with EMFILE and from then on no heartbeat left and no alarm was ever set."""

from __future__ import annotations

import errno
import logging
import socket
import struct
import time

import pytest
from pamqp import commands, frame

from quorumqueue.broker.config import Settings
from quorumqueue.broker.server import server as server_module

from .inprocess import WAIT, running_server, wait_until

pytestmark = pytest.mark.timeout(120)

HEARTBEAT_FRAME_TYPE = 8


@pytest.fixture
def server(tmp_path):
    yield from running_server(Settings(host="127.0.0.1", port=0,
                                       data_dir=str(tmp_path / "node"), prometheus_port=0))


def _read_frame(sock: socket.socket, buffer: bytearray):
    while True:
        if len(buffer) >= 7:
            size = struct.unpack_from(">I", buffer, 3)[0]
            if len(buffer) >= size + 8:
                kind = buffer[0]
                used, _channel, value = frame.unmarshal(bytes(buffer[:size + 8]))
                del buffer[:used]
                return kind, value
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the broker closed the connection")
        buffer += data


def open_with_heartbeat(port: int, heartbeat: int) -> tuple[socket.socket, bytearray]:
    """An AMQP connection that negotiated `heartbeat` seconds, opened on vhost /."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    buffer = bytearray()
    sock.sendall(b"AMQP\x00\x00\x09\x01")
    _read_frame(sock, buffer)  # connection.start
    sock.sendall(frame.marshal(commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\0guest\0guest",
        locale="en_US"), 0))
    _kind, tune = _read_frame(sock, buffer)
    sock.sendall(frame.marshal(commands.Connection.TuneOk(
        tune.channel_max, tune.frame_max, heartbeat), 0))
    sock.sendall(frame.marshal(commands.Connection.Open("/"), 0))
    _kind, open_ok = _read_frame(sock, buffer)
    assert isinstance(open_ok, commands.Connection.OpenOk)
    return sock, buffer


def test_a_round_that_raises_is_logged_and_heartbeats_go_on(server, caplog):
    caplog.set_level(logging.ERROR, logger="quorumqueue.broker")
    planted = []
    tick_queues = server.node.tick_queues

    def fails_once():
        if not planted:
            planted.append(time.monotonic())
            raise RuntimeError("planted failure in one round")
        tick_queues()

    server.node.tick_queues = fails_once
    sock, buffer = open_with_heartbeat(server.port, heartbeat=1)
    try:
        wait_until(lambda: planted, "the planted failure")
        # the client keeps sending heartbeats, so the broker keeps it; the broker's
        # own heartbeats come from the ticker, every half interval
        heartbeats = 0
        deadline = time.monotonic() + WAIT
        while heartbeats < 4:
            assert time.monotonic() < deadline, "no heartbeats after the failed round"
            sock.sendall(b"\x08\x00\x00\x00\x00\x00\x00\xce")
            kind, _value = _read_frame(sock, buffer)
            if kind == HEARTBEAT_FRAME_TYPE:
                heartbeats += 1
    finally:
        sock.close()
    failures = [record for record in caplog.records
                if "planted failure in one round" in (record.exc_text or "")
                or (record.exc_info and "planted failure" in str(record.exc_info[1]))]
    assert len(failures) == 1, [record.getMessage() for record in caplog.records]
    assert "queue expiry" in failures[0].getMessage()


def test_exhausted_descriptors_in_the_alarm_check_do_not_end_the_alarms(server, monkeypatch,
                                                                         caplog):
    """Three seconds of EMFILE reading the memory figure, then memory over the
    watermark: the memory alarm is set (a publisher would be blocked)."""
    caplog.set_level(logging.WARNING, logger="quorumqueue.broker")
    began = time.monotonic()

    def resident_memory_bytes() -> int:
        if time.monotonic() - began < 3.0:
            raise OSError(errno.EMFILE, "Too many open files")
        return 10 ** 15

    monkeypatch.setattr(server_module, "resident_memory_bytes", resident_memory_bytes)
    wait_until(lambda: "memory" in server.node.alarms, "the memory alarm")
    text = caplog.text
    assert "Too many open files" in text
    assert text.count("Traceback") <= 1, "a failing step's traceback is logged once"

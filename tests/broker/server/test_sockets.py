"""The file-descriptor reserve (broker/server/sockets.py): RabbitMQ's sockets_limit,
refusals over it, and their log lines at most every LOG_INTERVAL."""

from __future__ import annotations

import logging

import pytest

from quorumqueue.broker.server import sockets
from quorumqueue.broker.server.sockets import SocketLimit, sockets_limit


@pytest.mark.parametrize("descriptors, limit", [(1_048_576, 943_626), (2048, 1751),
                                                (1024, 829), (256, 138), (50, 1)])
def test_sockets_limit_is_rabbitmq_s(descriptors, limit):
    """file_handle_cache: 100 kept for others, 90 % of the rest less 2 (RabbitMQ's
    /api/nodes shows sockets_limit 943626 under the usual 1,048,576)."""
    assert sockets_limit(descriptors) == limit


class Transport:
    def __init__(self, port: int) -> None:
        self.port, self.aborted = port, False

    def get_extra_info(self, name):
        return ("127.0.0.1", self.port) if name == "peername" else None

    def abort(self) -> None:
        self.aborted = True


class Protocol:
    def __init__(self) -> None:
        self.events = []

    def connection_made(self, transport) -> None:
        self.events.append("made")

    def connection_lost(self, exc) -> None:
        self.events.append("lost")


def test_sockets_over_the_limit_are_refused_and_logged_once_per_interval(monkeypatch,
                                                                           caplog):
    clock = [100.0]
    monkeypatch.setattr(sockets.time, "monotonic", lambda: clock[0])
    limit = SocketLimit(descriptors=104)      # (104 - 100) * 0.9 - 2 -> 1 socket
    made: list[Protocol] = []
    factory = limit.guard(lambda: made.append(Protocol()) or made[-1], "AMQP")
    with caplog.at_level(logging.WARNING, logger="quorumqueue.broker"):
        first = factory()
        first.connection_made(Transport(1))
        refused = [factory() for _ in range(5)]
        transports = [Transport(2 + i) for i in range(5)]
        for protocol, transport in zip(refused, transports):
            protocol.connection_made(transport)
            protocol.data_received(b"AMQP")
            protocol.connection_lost(None)
        clock[0] += sockets.LOG_INTERVAL
        late = factory()
        late.connection_made(Transport(9))
    assert len(made) == 1 and made[0].events == ["made"]
    assert all(transport.aborted for transport in transports)
    assert (limit.open, limit.refused) == (1, 6)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("refused a TCP connection from 127.0.0.1:2 on the AMQP "
                               "listener: 1 sockets are open, the node's limit "
                               "(sockets_limit 1 of 104 file descriptors)")
    assert lines[1].endswith("(4 more since the last such line)")
    first.connection_lost(None)
    assert limit.open == 0 and made[0].events == ["made", "lost"]

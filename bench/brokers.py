"""The brokers under test: start one on loopback, hand out host/port, stop it.

Responsibilities
    ``quorumqueue``: the bundled broker, run as a subprocess by the test
    suite's ``tests.support.broker.BrokerProcess`` (one launcher for both).
    ``rabbitmq``: a private RabbitMQ node from ``tests.support.rabbitmq``.
    ``uri``: a broker someone else runs; nothing is started or stopped.

Invariants
    - Each started broker gets a fresh data directory, removed on stop.
    - A broker that dies or never opens its port fails with the tail of its
      own log in the message.

Not here
    The load (``bench.amqp_loadgen``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import unquote, urlsplit

from tests.support.broker import BrokerProcess
from tests.support.rabbitmq import RabbitMQNode


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    host: str
    port: int
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    startup_s: float | None = None  # None when we did not start it
    pid: int | None = None  # the broker's process, when we started it

    @classmethod
    def from_uri(cls, uri: str) -> BrokerAddress:
        parts = urlsplit(uri)
        if parts.scheme != "amqp":
            raise ValueError(f"--uri must be amqp://user:password@host:port/vhost, not {uri!r}")
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5672,
            user=unquote(parts.username or "guest"),
            password=unquote(parts.password or "guest"),
            vhost=unquote(path) if path else "/",
        )


@contextmanager
def rabbitmq_broker() -> Iterator[BrokerAddress]:
    with RabbitMQNode() as node:
        yield BrokerAddress("127.0.0.1", node.port, startup_s=node.startup_seconds)


@contextmanager
def quorumqueue_broker(startup_timeout: float = 60.0,
                       new_session: bool = False) -> Iterator[BrokerAddress]:
    """The bundled broker through the test suite's launcher (tests.support.broker); with
    `new_session`, in a process session of its own (setsid)."""
    began = time.monotonic()
    broker = BrokerProcess(new_session=new_session)
    try:
        broker.start(timeout=startup_timeout)
        yield BrokerAddress("127.0.0.1", broker.port, startup_s=time.monotonic() - began,
                            pid=broker.process.pid)
    finally:
        broker.cleanup()

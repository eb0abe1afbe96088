"""Fixtures of the client conformance suite: a pika BlockingConnection to the
module's bundled broker, and a channel on it (closed with the connection)."""

from __future__ import annotations

import pytest

from .pika_support import connect


@pytest.fixture
def connection(broker):
    conn = connect(broker)
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def channel(connection):
    return connection.channel()

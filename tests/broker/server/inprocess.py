"""A BrokerServer on an event loop of its own, in a thread of this process: for tests
that reach into the running node (plant a failure, read its state) while real
clients talk to it over loopback sockets."""

from __future__ import annotations

import asyncio
import threading

from quorumqueue.broker.config import Settings
from quorumqueue.broker.server.server import BrokerServer

from tests.support import waiting

WAIT = 30.0  # generous: the suite runs beside other CPU-heavy work


def running_server(settings: Settings):
    """Yield a started BrokerServer; stop it and its loop afterwards."""
    started = threading.Event()
    holder: dict = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        holder["loop"] = loop
        try:
            server = BrokerServer(settings)
            holder["server"] = server
            loop.run_until_complete(server.start())
        except BaseException as error:  # reported to the test below
            holder["error"] = error
            started.set()
            loop.close()
            return
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(WAIT), "the broker did not start"
    if "error" in holder:
        raise holder["error"]
    try:
        yield holder["server"]
    finally:
        holder["loop"].call_soon_threadsafe(holder["loop"].stop)
        thread.join(WAIT)


def call(server: BrokerServer, function, *args):
    """Run `function(*args)` on the server's loop and return its result."""
    loop = server._loop
    future = asyncio.run_coroutine_threadsafe(_call(function, args), loop)
    return future.result(WAIT)


async def _call(function, args):
    return function(*args)


def wait_until(condition, what: str, timeout: float = WAIT) -> None:
    waiting.wait_until(condition, what, timeout, interval=0.02)

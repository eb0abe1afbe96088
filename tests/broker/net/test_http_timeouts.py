"""The HTTP listeners' three timers (broker/net/http_timeouts.py), as Cowboy 2.8 runs
them in RabbitMQ 3.10.8 (its cowboy_http: request_timeout until the first request's
headers end, 408 if the client stopped inside them; idle_timeout from a request's
headers, restarted by its body, going on after the answer; inactivity_timeout over
everything). The live comparison is tests/differential/test_http_timeouts_against_rabbitmq.py.

First a table against the pure core, then one in-process aiohttp server for what
only a socket shows (a client that never reads its answer).
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web

from quorumqueue.broker.net.http_timeouts import (
    REQUEST_TIMEOUT_RESPONSE, Ending, HttpTimeouts, HttpTimer, TimedServer, backstop,
    middleware)

T = HttpTimeouts(request=5.0, idle=60.0, inactivity=300.0)

# (what happens, at which second) ... -> (deadline, ending)
CASES = [
    ("silent", [], (5.0, Ending.SILENT)),
    ("part of the request line", [("data", 1, b"GET / HT")], (5.0, Ending.SILENT)),
    ("empty lines only", [("data", 1, b"\r\n\r\n")], (5.0, Ending.SILENT)),
    ("inside the headers: 408", [("data", 1, b"GET / HTTP/1.1\r\nHo")],
     (5.0, Ending.REQUEST_TIMEOUT)),
    ("headers a byte at a time do not extend it",
     [("data", 1, b"GET / HTTP/1.1\r\n"), ("data", 4, b"H")], (5.0, Ending.REQUEST_TIMEOUT)),
    ("a request served: idle from its headers", [("start", 2)], (62.0, Ending.SILENT)),
    ("its body restarts idle", [("start", 2), ("data", 30, b"{")], (90.0, Ending.SILENT)),
    ("after the answer idle goes on", [("start", 2), ("finish", 3)], (62.0, Ending.SILENT)),
    ("the next request's partial bytes do not extend it",
     [("start", 2), ("finish", 3), ("data", 50, b"GET / HTTP/1.1\r\n")],
     (62.0, Ending.SILENT)),
    ("the next request restarts it",
     [("start", 2), ("finish", 3), ("start", 50)], (110.0, Ending.SILENT)),
    ("a definitions import: no idle bound, inactivity only",
     [("start-no-idle", 2)], (302.0, Ending.SILENT)),
    ("idle comes back with the next request",
     [("start-no-idle", 2), ("finish", 400), ("start", 401)], (461.0, Ending.SILENT)),
]


@pytest.mark.parametrize("events, expected", [(e, x) for _, e, x in CASES],
                         ids=[name for name, _, _ in CASES])
def test_each_state_s_deadline_is_cowboy_s(events, expected):
    timer = HttpTimer(T, 0.0)
    for kind, at, *data in events:
        if kind == "data":
            timer.receive_data(data[0], at)
        elif kind == "start":
            timer.request_started(at)
        elif kind == "start-no-idle":
            timer.request_started(at, idle=False)
        else:
            timer.request_finished(at)
    assert timer.deadline() == expected


def test_inactivity_bounds_every_state():
    short = HttpTimeouts(request=50.0, idle=60.0, inactivity=10.0)
    timer = HttpTimer(short, 0.0)
    assert timer.deadline() == (10.0, Ending.SILENT)
    timer.request_started(5.0)
    assert timer.deadline() == (15.0, Ending.SILENT)


def test_the_408_is_cowboy_s():
    # RabbitMQ 3.10.8's answer to a request stopped inside its headers, as read live
    assert REQUEST_TIMEOUT_RESPONSE == (b"HTTP/1.1 408 Request Timeout\r\nconnection: close"
                                        b"\r\ncontent-length: 0\r\n\r\n")


# ---------------------------------------------------------------- on a socket


def _serve(timeouts: HttpTimeouts, body: bytes):
    """An aiohttp server with the timers on a free port, in a thread of its own."""
    import threading

    ready, state = threading.Event(), {}

    async def main() -> None:
        timed = TimedServer(None, timeouts)

        async def big(request):
            return web.Response(body=body)

        app = web.Application(middlewares=[middleware(timed)])
        app.router.add_get("/big", big)
        runner = web.AppRunner(app, keepalive_timeout=backstop(timeouts))
        await runner.setup()
        timed.wrap(runner._server)
        runner._server = timed
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["port"] = runner.addresses[0][1]
        state["stop"] = asyncio.Event()
        state["loop"] = asyncio.get_running_loop()
        ready.set()
        await state["stop"].wait()
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    return state, thread


def test_a_client_that_does_not_read_its_answer_is_cut_off_after_idle_timeout():
    """A GET of 64 MiB, never read: the server's writes stall; once idle_timeout
    passed with nothing from the client the connection is reset (before, such a
    client held it for good)."""
    state, thread = _serve(HttpTimeouts(request=5.0, idle=1.0, inactivity=300.0),
                           b"x" * (64 << 20))
    try:
        with socket.create_connection(("127.0.0.1", state["port"]), timeout=60) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            began = time.monotonic()
            time.sleep(2.0)   # the client reads nothing, meanwhile
            received, closed = 0, False
            deadline = began + 60
            while time.monotonic() < deadline:
                try:
                    data = sock.recv(1 << 20)
                except ConnectionResetError:
                    closed = True
                    break
                if not data:
                    closed = True
                    break
                received += len(data)
            assert closed and received < 64 << 20, (closed, received)
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)

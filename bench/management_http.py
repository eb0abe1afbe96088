"""Which HTTP server for the management API: aiohttp against Starlette on uvicorn.

Both serve the same handler (a /api/queues-like JSON list of QUEUES rows, built per
request) in a server process of their own, on one asyncio loop (uvloop), as the
broker would run them; one client process (aiohttp, CONCURRENCY keep-alive
connections) sends REQUESTS requests to each. Three A/B pairs, alternating which
goes first; printed: requests per second of each and the median ratio.

Starlette and uvicorn are not dependencies of the project: install them anywhere and
point BENCH_EXTRA_PATH at them, e.g.
    pip install --target /tmp/benchdeps starlette uvicorn
    BENCH_EXTRA_PATH=/tmp/benchdeps .venv/bin/python bench/management_http.py
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time

QUEUES = 200
REQUESTS = 3000
CONCURRENCY = 16


def rows() -> list[dict]:
    return [{"name": f"q{i}", "vhost": "/", "type": "quorum", "durable": True,
             "auto_delete": False, "exclusive": False, "arguments": {"x-queue-type": "quorum"},
             "node": "qq1@localhost", "leader": "qq1@localhost",
             "members": ["qq1@localhost", "qq2@localhost", "qq3@localhost"],
             "online": ["qq1@localhost", "qq2@localhost", "qq3@localhost"],
             "messages": i, "messages_ready": i, "messages_unacknowledged": 0,
             "consumers": 0, "policy": None} for i in range(QUEUES)]


def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def queues(_request):
        return web.Response(text=json.dumps(rows()), content_type="application/json")

    async def main():
        app = web.Application()
        app.router.add_get("/api/queues", queues)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    _loop_run(main())


def serve_starlette(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def queues(_request):
        return Response(json.dumps(rows()), media_type="application/json")

    app = Starlette(routes=[Route("/api/queues", queues)])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, loop="none",
                                           access_log=False, log_level="warning"))
    _loop_run(server.serve())


def _loop_run(coroutine) -> None:
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(coroutine)


async def load(port: int) -> float:
    import aiohttp

    url = f"http://127.0.0.1:{port}/api/queues"
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(50):  # warm up
            async with session.get(url) as response:
                await response.read()
        remaining = [REQUESTS]

        async def worker():
            while remaining[0] > 0:
                remaining[0] -= 1
                async with session.get(url) as response:
                    assert response.status == 200
                    await response.read()

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return REQUESTS / (time.perf_counter() - began)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure(kind: str) -> float:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "serve", kind, str(port)],
                              env=os.environ.copy())
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"{kind} server did not start")
                time.sleep(0.05)
        return asyncio.run(load(port))
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    ratios, results = [], {"aiohttp": [], "starlette": []}
    for pair in range(3):
        order = ("aiohttp", "starlette") if pair % 2 == 0 else ("starlette", "aiohttp")
        rates = {kind: measure(kind) for kind in order}
        for kind, rate in rates.items():
            results[kind].append(rate)
        ratios.append(rates["aiohttp"] / rates["starlette"])
        print(f"pair {pair + 1}: aiohttp {rates['aiohttp']:.0f} req/s, "
              f"starlette+uvicorn {rates['starlette']:.0f} req/s, "
              f"ratio {ratios[-1]:.2f}", flush=True)
    print(f"median aiohttp/starlette+uvicorn: {statistics.median(ratios):.2f}x "
          f"({QUEUES} rows per answer, {CONCURRENCY} connections, {REQUESTS} requests)")


if __name__ == "__main__":
    extra = os.environ.get("BENCH_EXTRA_PATH")
    if extra:
        sys.path.append(extra)
    if sys.argv[1:2] == ["serve"]:
        {"aiohttp": serve_aiohttp, "starlette": serve_starlette}[sys.argv[2]](int(sys.argv[3]))
    else:
        main()

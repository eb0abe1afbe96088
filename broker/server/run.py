"""Run one broker node in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from ..config import Settings, not_enforced_yet, precedence_warnings
from .server import BrokerServer

log = logging.getLogger("quorumqueue.broker")

# The writer thread (server.SyncWriter) needs the GIL back when an fdatasync returns, to
# hand the event loop its result. While the loop's thread is busy with input, it gets
# it only after the interpreter's switch interval (5 ms by default): a delay added to
# every Sync, hence to every confirm. At 0.5 ms a Sync of a busy single node took
# ~1.5 ms less (median 2.9 against 4.4 ms, fdatasync included), with no visible CPU cost.
GIL_SWITCH_INTERVAL_S = 0.0005


def configure_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr, level=level.upper(),
        format="%(asctime)s.%(msecs)03d [%(levelname)s] <%(process)d> %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S")


def event_loop_factory():
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop
    return uvloop.new_event_loop


async def serve(settings: Settings, ready=None) -> None:
    for warning in not_enforced_yet(settings):  # accepted, but not silently ignored
        log.warning("%s", warning)
    for warning in precedence_warnings(settings):
        log.warning("%s", warning)
    if settings.ssl_options.configured and settings.ssl_port is None:
        log.warning("ssl_options.* are set but listeners.ssl.default is not: no TLS "
                    "listener is started")
    server = BrokerServer(settings)
    stop = asyncio.Event()
    failed = []
    server.on_fatal = lambda: (failed.append(True), stop.set())
    await server.start()
    try:
        await server.start_management()
    except OSError as error:  # another node of this host has the port: say so, go on
        log.error("management.tcp.port %d: %s; this node runs without the management "
                  "HTTP API (set management.tcp.port, or --management-port)",
                  settings.management_port, error.strerror or error)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("Server startup complete; listening for AMQP 0-9-1 on %s:%d (data: %s)",
             settings.host, server.port, settings.data_dir)
    if ready is not None:
        ready(server)
    await stop.wait()
    log.info("shutdown requested, closing connections")
    if failed:
        os._exit(70)  # EX_SOFTWARE: no clean stop after a failed apply; restart recovers
    await server.stop()


def run(settings: Settings) -> None:
    configure_logging(settings.log_level)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # this process is the node's own
    loop = event_loop_factory()()
    try:
        loop.run_until_complete(serve(settings))
    finally:
        loop.close()

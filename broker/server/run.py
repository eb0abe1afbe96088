"""Run one broker node in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import gc
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

# Python's cyclic garbage collector: a gen0 pass every 700 net allocations of container
# objects by default, and each Raft entry, frame and delivery allocates several, so
# with C frames in the profile the collector was 9-13% of a node's publish samples
# (163 of 175 of its samples started in RaftNode._append). After boot, gc.freeze()
# moves everything alive (modules, recovered state) out of the generations the
# collector walks, and a higher gen0 threshold makes the passes rarer; gen1 and gen2
# keep their defaults (10, 10), so cyclic garbage is still collected, in fewer,
# larger passes. Measured (bench/cluster_throughput.py --messages 30000, 6 interleaved
# pairs, medians of every node's CPU per message): publish 0.91x on a 3-node cluster
# through the leader (each pair 0.86-0.97x), 0.91x through a follower, 0.95x on one
# node; consume within the noise (0.87-1.07x). GC_TUNING is that A/B's switch.
GC_TUNING = True
GC_GEN0_THRESHOLD = 50_000


def tune_gc() -> None:
    if not GC_TUNING:
        return
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


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
    stop = asyncio.Event()
    # before any listener: a SIGTERM once a port answers (a service manager's stop
    # right after its start) stops the node cleanly, after its start, never by the
    # signal's default action
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    failed = []
    server = BrokerServer(settings, on_fatal=lambda: (failed.append(True), stop.set()))
    await server.start()
    try:
        await server.start_management()
    except OSError as error:  # another node of this host has the port: say so, go on
        log.error("management.tcp.port %d: %s; this node runs without the management "
                  "HTTP API (set management.tcp.port, or --management-port)",
                  settings.management_port, error.strerror or error)
    tune_gc()  # booted: what is alive now lives as long as the node
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

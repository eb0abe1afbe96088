"""The Prometheus endpoint: an aiohttp server on the broker's event loop.

Responsibilities: listen on `prometheus.tcp.ip`:`prometheus.tcp.port` (RabbitMQ's keys;
loopback and 15692 by default) and answer `GET /metrics` (aggregated),
`/metrics/per-object` (per queue) and `/metrics/detailed?family=...&vhost=...`, as
rabbitmq_prometheus does, in the exposition format the scraper asks for (Prometheus
text 0.0.4 or OpenMetrics, by its Accept header; gzip when accepted).

How it works: each request reads the node's state into metric families with a
`NodeCollector` (collector.py) on the broker's own event loop, between two of its
callbacks, so the state is read consistently without locks; then a worker thread
renders them with prometheus_client's encoder (the families are plain values by then,
nothing the loop changes). The loop pays for the reading only: for 1,000 queues (half
of them quorum queues) ~9 ms on /metrics and ~20 ms on /metrics/per-object, whose
rendering takes 2-3x that (in-process timing, loaded 2-core machine).

Invariants: the listener binds the configured address only; a port other than the
default, or the default one named in the configuration file, must be free, or the node
does not start (ConfigError); the default port left implicit, when taken (another node
of this host has it), is logged and skipped.

Not here: what the metrics say (collector.py).
"""

from __future__ import annotations

import asyncio
import logging
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ..config_network import http_timeouts
from ..config_values import ConfigError
from ..net.http_log import ServerLog
from ..net.http_timeouts import TimedServer, backstop, middleware
from .collector import Broker, NodeCollector

log = logging.getLogger("quorumqueue.broker")

PORT_KEY = "prometheus.tcp.port"
DEFAULT_PORT = 15692  # rabbitmq_prometheus's


def port_required(settings) -> bool:
    """Whether failing to listen stops the node: for any port but the default one,
    and for the default one when the configuration file names it."""
    return settings.prometheus_port != DEFAULT_PORT or PORT_KEY in settings.configured_keys


class Collected:
    """Metric families already read from the node: what the encoder renders."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self):
        return iter(self.families)


def collect(server: Broker, view: str, families=(), vhosts=()) -> CollectorRegistry:
    """A registry holding `view`'s families as the node's state is now (on the loop)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collected(list(NodeCollector(server, view, families, vhosts).collect())))
    return registry


def application(server: Broker, timed: TimedServer | None = None) -> web.Application:
    async def scrape(request: web.Request, view: str, families=(), vhosts=()):
        registry = collect(server, view, families, vhosts)
        encoder, content_type = choose_encoder(request.headers.get("Accept"))
        # rendering the text is most of a per-object scrape's time (2-3x reading the
        # node): a worker thread does it, so the loop goes on serving clients meanwhile
        body = await asyncio.get_running_loop().run_in_executor(None, encoder, registry)
        response = web.Response(body=body)
        # set whole: aiohttp's content_type= refuses parameters (version, charset)
        response.headers["Content-Type"] = content_type
        response.enable_compression()
        return response

    async def aggregated(request: web.Request):
        return await scrape(request, "aggregated")

    async def per_object(request: web.Request):
        return await scrape(request, "per-object")

    async def detailed(request: web.Request):
        return await scrape(request, "detailed", request.query.getall("family", []),
                            request.query.getall("vhost", []))

    app = web.Application(middlewares=[middleware(timed)] if timed is not None else [])
    app.router.add_get("/metrics", aggregated)
    app.router.add_get("/metrics/per-object", per_object)
    app.router.add_get("/metrics/detailed", detailed)
    return app


class MetricsListener:
    """The running endpoint; `port` is where it listens (None: not listening)."""

    def __init__(self, server: Broker) -> None:
        self.server = server
        self.port: int | None = None
        self.ssl_port: int | None = None   # the HTTPS listener (prometheus.ssl.port)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        settings = self.server.settings
        # prometheus.tcp.request_timeout, idle_timeout, inactivity_timeout: Cowboy's
        # three timers, as the management API's (net/http_timeouts.py)
        timeouts = http_timeouts(settings.network, "prometheus")
        timed = TimedServer(None, timeouts)
        runner = web.AppRunner(application(self.server, timed), access_log=None,
                               handle_signals=False, logger=ServerLog(log, "Prometheus"),
                               keepalive_timeout=backstop(timeouts))
        await runner.setup()
        timed.wrap(runner._server)
        runner._server = timed
        sockets = getattr(self.server, "sockets", None)
        if sockets is not None:   # its connections count against the node's sockets_limit
            runner._server = sockets.guard(runner._server, "Prometheus")
        site = web.TCPSite(runner, settings.prometheus_host, settings.prometheus_port,
                           reuse_address=True)
        try:
            await site.start()
        except OSError as error:
            await runner.cleanup()
            where = f"{settings.prometheus_host}:{settings.prometheus_port}"
            if port_required(settings):
                raise ConfigError(f"{PORT_KEY}: cannot listen on {where} for Prometheus "
                                  f"metrics: {error}") from None
            log.warning("Prometheus metrics are off: cannot listen on %s (%s); set %s to "
                        "a free port", where, error.strerror or error, PORT_KEY)
            return
        self._runner = runner
        self.port = runner.addresses[0][1]
        if settings.prometheus_ssl_port is not None:
            from ..tls import server_context

            host = settings.prometheus_ssl_ip or settings.prometheus_host
            tls_site = web.TCPSite(runner, host, settings.prometheus_ssl_port,
                                   reuse_address=True,
                                   ssl_context=server_context(settings.prometheus_ssl))
            try:
                await tls_site.start()
            except OSError as error:
                await self.stop()
                raise ConfigError(f"prometheus.ssl.port: cannot listen on "
                                  f"{host}:{settings.prometheus_ssl_port} for Prometheus "
                                  f"metrics over TLS: {error}") from None
            self.ssl_port = tls_site._server.sockets[0].getsockname()[1]
            log.info("started Prometheus metrics TLS listener on %s:%d", host,
                     self.ssl_port)
        log.info("started Prometheus metrics listener on %s:%d (/metrics, "
                 "/metrics/per-object, /metrics/detailed)", settings.prometheus_host,
                 self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

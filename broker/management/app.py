"""The management HTTP API's server: aiohttp on the broker's own event loop.

Responsibilities: listen on `management.tcp.ip`:`management.tcp.port` (loopback
and 15672 by default, as RabbitMQ's management plugin), authenticate every /api
request (access.py), refuse a body that is not JSON (415) and add the security and
CORS headers to every answer (security.py), find its handler in ROUTES, and turn
what handlers raise into RabbitMQ's error bodies: `{"error": ..., "reason": ...}`
with 400, 401, 404, 405 or 415; serve the web UI's files (ui/: `/` and `/ui/NAME`).

How it works: aiohttp's AppRunner and TCPSite run in the broker process, on the
loop the AMQP server runs on, so handlers read the node directly and changes go
through the same node and metadata path as AMQP clients (direct.py, node/management).
Routing is by path segments taken from the raw path and unquoted one by one, so a
vhost named `/` is `%2F` in a URL as RabbitMQ expects (a router over the decoded
path would see an extra `/`). List answers take RabbitMQ's query parameters
(listing.py: columns, sort, pagination with a name filter).

The shell it needs (`shell`, the BrokerServer): `node`, `settings`, `port` (AMQP),
`pass_time()`, `schedule_flush()`, `attach_direct(session, link)`,
`detach_direct(session)`, `client_connections()` and the alarm limits.

Not here: the JSON shapes (rows.py), endpoint logic (views.py, changes.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import unquote

from aiohttp import web

from ..amqp import spec
from ..amqp.errors import AMQPError
from ..amqp.properties import MAX_TABLE_DEPTH, too_deep
from ..config_network import http_timeouts
from ..net.http_log import ServerLog
from ..net.http_timeouts import TimedServer, backstop, middleware
from . import listing, security
from .access import Refused, authenticate
from .direct import DirectError

log = logging.getLogger("quorumqueue.broker")

Handler = Callable[..., Awaitable[Any]]
# (method, path pattern as segments; "{x}" captures one, "{x*}" the rest) -> handler
ROUTES: list[tuple[str, tuple[str, ...], Handler]] = []


def route(method: str, path: str):
    def register(handler: Handler) -> Handler:
        ROUTES.append((method, tuple(path.strip("/").split("/")), handler))
        return handler
    return register


class Answer:
    """A handler's answer other than a JSON 200: a status and an optional body."""

    def __init__(self, status: int, body: Any = None, headers: dict | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers or {}


class Request:
    """What a handler gets: the user, the path captures, the query and the body."""

    def __init__(self, api: "ManagementAPI", http: web.Request, user, password: str,
                 captures: dict[str, str]) -> None:
        self.api = api
        self.node = api.shell.node
        self.http = http
        self.user = user
        self.password = password
        self.captures = captures
        self.query = http.query
        self.peer_host = _peer_host(http)

    async def json(self) -> dict:
        raw = await self.http.read()
        if not raw.strip():
            return {}
        try:
            value = json.loads(raw)
        except ValueError as error:
            raise bad_request(f"not JSON: {error}") from None
        except RecursionError:
            value = None
        # nested deeper than an AMQP field table may be (amqp/properties.py): refused
        # here, before any part of the node walks it recursively
        if value is None or too_deep(value):
            raise bad_request(f"not JSON: nested deeper than {MAX_TABLE_DEPTH} levels")
        if not isinstance(value, dict):
            raise bad_request("the body must be a JSON object")
        return value


def bad_request(reason: str) -> Refused:
    return Refused("bad_request", reason, 400)


def not_found() -> Refused:
    return Refused("Object Not Found", "Not Found", 404)


def refusal_of(error: AMQPError | DirectError) -> Refused:
    """An AMQP refusal as RabbitMQ's API shows it (rabbit_mgmt_util:with_channel)."""
    code = error.code
    text = error.reply_text if isinstance(error, AMQPError) else error.text
    name, separator, detail = text.partition(" - ")
    detail = detail if separator else text
    if code == spec.NOT_FOUND:
        return Refused("not_found", detail, 404, amqp_text=text)
    if code == spec.ACCESS_REFUSED:
        return Refused("not_authorised", detail, 401, amqp_text=text)
    return Refused("bad_request", detail, 400, amqp_text=text)


def _peer_host(http: web.Request) -> str:
    peer = http.transport.get_extra_info("peername") if http.transport else None
    return peer[0] if peer else "?"


def _segments(raw_path: str) -> list[str]:
    return [unquote(part) for part in raw_path.split("?")[0].strip("/").split("/")]


def _match(pattern: tuple[str, ...], segments: list[str]) -> dict[str, str] | None:
    captures: dict[str, str] = {}
    for position, part in enumerate(pattern):
        if part.endswith("*}"):
            captures[part[1:-2]] = "/".join(segments[position:])
            return captures
        if position >= len(segments):
            return None
        if part.startswith("{"):
            captures[part[1:-1]] = segments[position]
        elif part != segments[position]:
            return None
    return captures if len(segments) == len(pattern) else None


UI = Path(__file__).with_name("ui")  # the web UI's files (README.md: "The web UI")
UI_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css",
            ".png": "image/png", ".svg": "image/svg+xml", ".txt": "text/plain"}


def _static(path: str) -> web.StreamResponse:
    """The web UI: `/` is its page, `/ui/NAME` its files (no login needed: the page
    asks for credentials and sends them with each /api request, as RabbitMQ's UI)."""
    if path in ("", "/", "/index.html"):
        name = "index.html"
    elif path.startswith("/ui/") and "/" not in path[4:]:
        name = path[4:]
    else:
        name = ""
    file = UI / name
    if not name or name.startswith(".") or file.suffix not in UI_TYPES or not file.is_file():
        return _json_response(404, {"error": "Object Not Found", "reason": "Not Found"})
    return web.Response(body=file.read_bytes(), content_type=UI_TYPES[file.suffix],
                        charset="utf-8" if file.suffix != ".png" else None,
                        headers={"Cache-Control": "no-cache"})


def _idle_exempt(request: web.Request) -> bool:
    """Served without idle_timeout: a definitions import (RabbitMQ's
    rabbit_mgmt_wm_definitions turns it off for its request) and the membership
    commands, whose wait has a bound of its own (operations.py, the body's timeout)."""
    path = request.path
    return request.method in ("POST", "DELETE") and (
        path.startswith("/api/definitions") or "/replicas/" in path
        or path == "/api/quorumqueue/definitions/import")


def _json_response(status: int, body: Any, headers: dict | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), headers=headers,
                        content_type="application/json")


class ManagementAPI:
    """The HTTP listener (start/stop) and the request dispatcher."""

    def __init__(self, shell) -> None:
        from . import admin, changes, leases, operations, views  # noqa: F401 - @route handlers

        self.shell = shell
        settings = shell.settings
        self.host = settings.management_ip
        self.port = settings.management_port
        self._runner: web.AppRunner | None = None
        self.ssl_port: int | None = None   # the HTTPS listener's port (management.ssl.port)
        from .rates import Rates

        self.rates = Rates(shell.node, settings.statistics_interval_ms / 1000,
                           shell.schedule_flush)
        self.headers_config = settings.network.management_headers
        self.security_headers = security.headers_for(self.headers_config)

    async def start(self) -> None:
        # management.tcp.request_timeout, idle_timeout, inactivity_timeout: Cowboy's
        # three timers on every connection (net/http_timeouts.py); aiohttp's own
        # keep-alive timer is only a backstop behind them
        timeouts = http_timeouts(self.shell.settings.network, "management")
        timed = TimedServer(None, timeouts)
        app = web.Application(client_max_size=settings_max_body(self.shell.settings),
                              middlewares=[middleware(timed, _idle_exempt)])
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        app.on_response_prepare.append(self._add_headers)
        # shutdown_timeout: requests still running when the broker stops get 5 s
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=5.0,
                                     keepalive_timeout=backstop(timeouts),
                                     logger=ServerLog(log, "management"))
        await self._runner.setup()
        timed.wrap(self._runner._server)
        self._runner._server = timed
        sockets = getattr(self.shell, "sockets", None)
        if sockets is not None:   # its connections count against the node's sockets_limit
            self._runner._server = sockets.guard(self._runner._server, "management")
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        server = site._server
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        log.info("Management plugin: HTTP (non-TLS) listener started on %s:%d",
                 self.host, self.port)
        settings = self.shell.settings
        if settings.management_ssl_port is not None:
            from ..tls import server_context

            host = settings.management_ssl_ip or self.host
            tls_site = web.TCPSite(self._runner, host, settings.management_ssl_port,
                                   reuse_address=True,
                                   ssl_context=server_context(settings.management_ssl))
            try:
                await tls_site.start()
            except OSError as error:   # a port set explicitly: the node does not start
                await self._runner.cleanup()
                self._runner = None
                from ..config_values import ConfigError

                raise ConfigError(f"management.ssl.port: cannot listen on {host}:"
                                  f"{settings.management_ssl_port}: {error}") from None
            server = tls_site._server
            self.ssl_port = server.sockets[0].getsockname()[1]
            log.info("Management plugin: HTTP (TLS) listener started on %s:%d",
                     host, self.ssl_port)
        self.rates.start()

    async def stop(self) -> None:
        await self.rates.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def later(self, start: Callable[[Callable[[Any], None]], None],
                    timeout: float = 60.0) -> Any:
        """Run `start(done)` (a node operation answering through a callback once log
        entries are applied) and wait for `done`'s value."""
        future = asyncio.get_running_loop().create_future()

        def done(value) -> None:
            if not future.done():
                future.set_result(value)

        start(done)
        self.shell.schedule_flush()
        return await asyncio.wait_for(future, timeout)

    async def _add_headers(self, http: web.Request, response: web.StreamResponse) -> None:
        """Every answer, the UI's files and errors included: the security headers,
        and CORS's (security.py)."""
        config = self.headers_config
        response.headers.update(self.security_headers)
        response.headers.update(security.cors_headers(config, http.headers.get("Origin")))

    async def _dispatch(self, http: web.Request) -> web.StreamResponse:
        segments = _segments(http.raw_path)
        if not segments or segments[0] != "api":
            return _static(http.path)
        allowed = []
        for method, pattern, handler in ROUTES:
            captures = _match(pattern, segments)
            if captures is None:
                continue
            if method != http.method:
                allowed.append(method)
                continue
            return await self._run(http, handler, captures)
        if allowed and http.method == "OPTIONS":  # a CORS preflight: no credentials
            return web.Response(status=200, headers=security.preflight(
                self.headers_config, http.headers.get("Origin"), allowed,
                http.headers.get("Access-Control-Request-Headers")))
        if allowed:
            return _json_response(405, {"error": "Method Not Allowed",
                                        "reason": "Method Not Allowed"},
                                  {"Allow": ", ".join(sorted(set(allowed)))})
        return _json_response(404, {"error": "Object Not Found", "reason": "Not Found"})

    async def _run(self, http: web.Request, handler: Handler,
                   captures: dict) -> web.StreamResponse:
        try:
            user, password = authenticate(self.shell.node, http.headers.get("Authorization"),
                                          _peer_host(http))
            refusal = security.body_refusal(http.method, http.headers, http.body_exists)
            if refusal is not None:
                raise refusal
            request = Request(self, http, user, password, captures)
            self.rates.used()
            body = await handler(request)
        except Refused as refusal:
            # the challenge makes a browser ask for credentials itself (a dialog, or
            # a request left waiting when headless): the web UI, which has its own
            # login form, says X-Requested-With and gets the 401 without it
            challenge = (refusal.status == 401 and
                         http.headers.get("X-Requested-With") != "XMLHttpRequest")
            headers = ({"WWW-Authenticate": 'Basic realm="RabbitMQ Management"'}
                       if challenge else {})
            return _json_response(refusal.status, {"error": refusal.error,
                                                   "reason": refusal.reason},
                                  {**headers, **_error_header(refusal)})
        except (AMQPError, DirectError) as error:
            refusal = refusal_of(error)
            return _json_response(refusal.status, {"error": refusal.error,
                                                   "reason": refusal.reason},
                                  _error_header(refusal))
        except asyncio.TimeoutError:
            return _json_response(500, {"error": "timeout",
                                        "reason": "the node did not answer in time"})
        if isinstance(body, Answer):
            if body.body is None:
                return web.Response(status=body.status, headers=body.headers)
            return _json_response(body.status, body.body, body.headers)
        try:
            body = listing.shape(body, http.query)
        except Refused as refusal:
            return _json_response(refusal.status, {"error": refusal.error,
                                                   "reason": refusal.reason})
        return _json_response(200, body)


# a refusal's AMQP reply text (`NAME - detail`, as the management operations and
# AMQP give it), JSON-quoted (ASCII for a header); the body stays RabbitMQ's
# {"error", "reason"}, and `quorumqueue` commands print this text (client/
# http_management.py)
ERROR_HEADER = "X-Quorumqueue-Error"


def _error_header(refusal: Refused) -> dict:
    return {ERROR_HEADER: json.dumps(refusal.amqp_text)} if refusal.amqp_text else {}


def settings_max_body(settings) -> int:
    # a publish carries a message; leave room for base64 and the JSON around it
    return settings.max_message_size * 2 + 1024 * 1024



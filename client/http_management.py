"""Client side of the management HTTP API: what the command line talks to a node with,
as rabbitmqadmin does.

Responsibilities
    `HttpManagement`: one JSON request to a node's management HTTP API
    (broker/management/, `management.tcp.port`, 15672 by default; https with the
    `management.ssl.*` listener) with HTTP basic auth, its JSON answer, and refusals
    raised as `ManagementError` with the CLI's texts. `management_options`: the
    rabbitmqadmin-style click options every `quorumqueue queues|ctl|cluster status`
    command takes (`--host`, `--port`, `--username`, `--password`, `--ssl` and its
    files, or one `--base-uri`), turned into an `HttpManagement`.

How it works
    The standard library's `urllib.request` (not aiohttp's client): the command line
    is synchronous and makes a few requests per run, so an event loop would add
    nothing, and urllib needs no dependency, speaks https with an `ssl.SSLContext`
    and sends bodies with any method (DELETE with a JSON body, as RabbitMQ's
    shrink takes). Path segments are percent-encoded one by one, so the vhost `/`
    is `%2F`, as RabbitMQ's API expects.

    Errors: a refusal's body is RabbitMQ's `{"error": ..., "reason": ...}`; the
    node adds the AMQP reply text of the refusal (`NAME - detail`, the text the
    management RPC gave before) in the `X-Quorumqueue-Error` header, and that is the
    message when present. Otherwise: 401 login refusals say RabbitMQ's `Login
    failed` with the user and URL; a 404 of an object the caller named takes the
    caller's `missing` text; anything else `<error> - <reason> (HTTP <status>)`.

Invariants
    - Messages never hold a password (`redact_uri`).
    - No AMQP connection is opened: everything goes over HTTP(S).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import click

from .errors import ManagementError, redact_uri

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 15672
ERROR_HEADER = "X-Quorumqueue-Error"      # the refusal's AMQP reply text, JSON-quoted
COUNT_HEADER = "X-Quorumqueue-Message-Count"  # purge-ok / delete-ok's message_count


class HttpManagement:
    """The management HTTP API of one node: `base` (http[s]://host:port), a user."""

    def __init__(self, base: str, username: str = "guest", password: str = "guest",
                 context: ssl.SSLContext | None = None, timeout: float = 120.0) -> None:
        self.base = base.rstrip("/")
        self.username, self.password = username, password
        self.context, self.timeout = context, timeout
        self.last_headers: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"HttpManagement({self.base!r}, user {self.username!r})"

    def request(self, method: str, segments: tuple | list, body: Any = None, *,
                query: dict | None = None, missing: str | None = None,
                allow_missing: bool = False, answers: tuple[int, ...] = (),
                headers: dict[str, str] | None = None) -> Any:
        """One request to /api/SEGMENTS...; its JSON answer (None for 204). A 404
        raises ManagementError(`missing`) when given, or answers None with
        `allow_missing` (what should go is gone already); an error status in `answers`
        is an answer too (a failed health check's 503 and its body)."""
        path = "/api/" + "/".join(quote(str(s), safe="") for s in segments)
        if query:
            path += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        url = self.base + path
        data = None if body is None else json.dumps(body).encode()
        credentials = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Basic {credentials}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {}),
            **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout,
                                        context=self.context) as answer:
                self.last_headers = dict(answer.headers.items())
                raw = answer.read()
        except urllib.error.HTTPError as error:
            if error.code == 404 and allow_missing:
                return None
            if error.code in answers:
                raw = error.read()
                return json.loads(raw) if raw.strip() else None
            raise ManagementError(self._refusal(error, url, missing)) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ManagementError(
                f"cannot connect to {redact_uri(self.base)}: {reason}. Is the broker "
                "running (with its management API on that port)? Start it with "
                "`quorumqueue broker start`.") from None
        return json.loads(raw) if raw.strip() else None

    def get(self, *segments, **kw) -> Any:
        return self.request("GET", segments, **kw)

    def put(self, *segments, body: Any = None, **kw) -> Any:
        return self.request("PUT", segments, {} if body is None else body, **kw)

    def post(self, *segments, body: Any = None, **kw) -> Any:
        return self.request("POST", segments, {} if body is None else body, **kw)

    def delete(self, *segments, body: Any = None, **kw) -> Any:
        return self.request("DELETE", segments, body, **kw)

    def message_count(self) -> int:
        """The message count the last purge or queue delete reported."""
        return int(self.last_headers.get(COUNT_HEADER, 0))

    def _refusal(self, error: urllib.error.HTTPError, url: str, missing: str | None) -> str:
        raw = error.read()
        quoted = error.headers.get(ERROR_HEADER)
        if quoted:
            try:
                return json.loads(quoted)
            except ValueError:
                pass
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            body = {}
        name = body.get("error", "") if isinstance(body, dict) else ""
        reason = body.get("reason", "") if isinstance(body, dict) else ""
        if error.code == 401 and name == "not_authorized":
            return (f"{reason or 'Login failed'} (HTTP 401 from {redact_uri(self.base)} "
                    f"for user '{self.username}')")
        if error.code == 404 and missing is not None:
            return missing
        return f"{name or error.reason} - {reason or error.reason} (HTTP {error.code} " \
               f"{error.reason} from {redact_uri(url)})"


def from_options(base_uri: str | None, host: str | None, port: int | None,
                 username: str | None, password: str | None, use_ssl: bool,
                 ca_file: str | None, cert_file: str | None, key_file: str | None,
                 no_hostname_check: bool) -> HttpManagement:
    """An HttpManagement from the command line's options (management_options)."""
    if base_uri:
        if host is not None or port is not None:
            raise click.UsageError("give either --base-uri or --host/--port, not both")
        parts = urlsplit(base_uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise click.BadParameter(f"expected http://HOST:PORT or https://HOST:PORT "
                                     f"(the management API), got {redact_uri(base_uri)}",
                                     param_hint="--base-uri")
        scheme = parts.scheme
        if use_ssl and scheme != "https":
            raise click.UsageError("--ssl with an http:// --base-uri: give https:// instead")
        netloc = parts.netloc.rpartition("@")[2]
        base = f"{scheme}://{netloc}{parts.path.rstrip('/')}"
        if parts.path.rstrip("/").endswith("/api"):
            base = base[:-4]
        username = username if username is not None else parts.username
        password = password if password is not None else parts.password
    else:
        scheme = "https" if use_ssl else "http"
        host = host or DEFAULT_HOST
        base = f"{scheme}://{'[' + host + ']' if ':' in host else host}:" \
               f"{port if port is not None else DEFAULT_PORT}"
    tls_files = [name for name, value in (("--ssl-ca-cert-file", ca_file),
                                         ("--ssl-cert-file", cert_file),
                                         ("--ssl-key-file", key_file)) if value]
    if no_hostname_check:
        tls_files.append("--ssl-disable-hostname-verification")
    for name, path in (("--ssl-ca-cert-file", ca_file), ("--ssl-cert-file", cert_file),
                       ("--ssl-key-file", key_file)):
        if path and not os.path.isfile(path):
            raise click.BadParameter(f"no such file: {path}", param_hint=name)
    if key_file and not cert_file:
        raise click.UsageError("--ssl-key-file is the key of --ssl-cert-file: give both")
    context = None
    if scheme == "https":
        context = ssl.create_default_context(cafile=ca_file or None)
        if no_hostname_check:
            context.check_hostname = False
        if cert_file:
            try:
                context.load_cert_chain(cert_file, key_file or None)
            except (OSError, ssl.SSLError) as error:
                raise click.BadParameter(f"cannot load {cert_file}: {error}",
                                         param_hint="--ssl-cert-file") from None
    elif tls_files:  # TLS settings for plain HTTP would be ignored: refuse them
        raise click.UsageError(f"{', '.join(tls_files)} need https (--ssl, or an "
                               "https:// --base-uri)")
    return HttpManagement(base, username if username is not None else "guest",
                          password if password is not None else "guest", context)


def management_options(command):
    """The options naming the node and user (rabbitmqadmin's names), collapsed into
    one `api` argument (an HttpManagement) for the command."""
    import functools

    options = [
        click.option("--base-uri", "api_base_uri", envvar="QUORUMQUEUE_MANAGEMENT_URI",
                     help="The node's management API as one URL, e.g. "
                          "http://guest:guest@127.0.0.1:15672 (instead of --host/--port)."),
        click.option("-H", "--host", "api_host", default=None,
                     help=f"Host of the node's management API [default: {DEFAULT_HOST}]."),
        click.option("-P", "--port", "api_port", type=int, default=None,
                     help=f"The management API's port (management.tcp.port, or "
                          f"management.ssl.port with --ssl) [default: {DEFAULT_PORT}]."),
        click.option("-u", "--username", "api_username", default=None,
                     help="A user with the administrator tag [default: guest]."),
        click.option("--password", "api_password", default=None, envvar="QUORUMQUEUE_PASSWORD",
                     help="Its password [default: guest]."),
        click.option("-s", "--ssl", "api_ssl", is_flag=True,
                     help="https: the management.ssl listener."),
        click.option("--ssl-ca-cert-file", "api_ca_file", default=None,
                     help="The CA (PEM) the node's certificate must chain to."),
        click.option("--ssl-cert-file", "api_cert_file", default=None,
                     help="A client certificate (PEM) to present."),
        click.option("--ssl-key-file", "api_key_file", default=None, help="Its key (PEM)."),
        click.option("--ssl-disable-hostname-verification", "api_no_hostname_check",
                     is_flag=True, help="Do not check the certificate's name."),
    ]

    @functools.wraps(command)
    def run(*args, api_base_uri, api_host, api_port, api_username, api_password, api_ssl,
            api_ca_file, api_cert_file, api_key_file, api_no_hostname_check, **kwargs):
        api = from_options(api_base_uri, api_host, api_port, api_username, api_password,
                           api_ssl, api_ca_file, api_cert_file, api_key_file,
                           api_no_hostname_check)
        return command(*args, api=api, **kwargs)

    for option in reversed(options):
        run = option(run)
    return run

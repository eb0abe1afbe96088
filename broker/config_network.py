"""The settings of what the node shows the network: RabbitMQ's keys and defaults.

- The management API's response headers, RabbitMQ's keys: `management.csp.policy`,
  `management.headers.frame_options`, `management.headers.content_type_options`,
  `management.headers.xss_protection`, `management.hsts.policy`; and CORS, off
  unless `management.cors.allow_origins` names origins (`.1 = https://...`, a list,
  or `*`), with `management.cors.max_age` (s, 1800). The defaults here are stricter
  than RabbitMQ's (which sends a CSP allowing inline and eval'd scripts and no
  framing rule): the UI is one page of this origin's own files.
- Timeouts for clients that connect and do not speak, RabbitMQ's keys and defaults:
  `handshake_timeout` (ms, 10000, or `infinity`): an AMQP connection not open by then
  (nothing sent, part of the protocol header, stopped before start-ok, tune-ok or
  open) is closed; `management.tcp.request_timeout` and `prometheus.tcp.request_timeout`
  (ms, Cowboy's 5000): an HTTP connection that has not sent a whole request's
  headers that long after it connected is closed (408 if it stopped inside them);
  `management.tcp.idle_timeout` and `prometheus.tcp.idle_timeout` (ms, Cowboy's
  60000): once a request's headers are whole, a connection that sends nothing more
  that long (inside a body, not reading an answer, or before its next request on a
  keep-alive connection) is closed; `management.tcp.inactivity_timeout` and
  `prometheus.tcp.inactivity_timeout` (ms, Cowboy's 300000): nothing received and no
  request begun or answered that long: closed (broker/net/http_timeouts.py);
  `ssl_handshake_timeout` (ms, 5000): a connection to the AMQP TLS listener that has
  not finished its TLS handshake by then is closed (handshake_timeout starts after it).

`parse_network(pairs)` reads them into a frozen `NetworkSettings`; an impossible
value is a ConfigError naming the key; `http_timeouts(settings, listener)` gives a
listener's three HTTP timers. Not here: what enforces them (broker/net/,
broker/management/security.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .config_values import ConfigError

# what the web UI needs, nothing more: its own scripts, styles and API; no plugins,
# no other page may frame it, forms post only to it
DEFAULT_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; "
               "img-src 'self' data:; connect-src 'self'; object-src 'none'; "
               "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


@dataclass(frozen=True, slots=True)
class ResponseHeaders:
    """What every management API and UI response carries, and CORS."""
    content_security_policy: str = DEFAULT_CSP
    frame_options: str = "DENY"
    content_type_options: str = "nosniff"
    xss_protection: str = ""            # none unless set (browsers dropped the filter)
    strict_transport_security: str = ""  # none unless set (HSTS binds the host to TLS)
    cors_allow_origins: tuple[str, ...] = ()   # "*" allows any origin
    cors_max_age: int = 1800


@dataclass(frozen=True, slots=True)
class NetworkSettings:
    management_headers: ResponseHeaders = field(default_factory=ResponseHeaders)
    handshake_timeout_ms: int = 10_000       # 0: infinity (never)
    management_request_timeout_ms: int = 5_000
    prometheus_request_timeout_ms: int = 5_000
    management_idle_timeout_ms: int = 60_000         # Cowboy's idle_timeout
    prometheus_idle_timeout_ms: int = 60_000
    management_inactivity_timeout_ms: int = 300_000  # Cowboy's inactivity_timeout
    prometheus_inactivity_timeout_ms: int = 300_000
    ssl_handshake_timeout_ms: int = 5_000    # the AMQP TLS listener's TLS handshake


_HEADER_KEYS = {
    "management.csp.policy": "content_security_policy",
    "management.headers.frame_options": "frame_options",
    "management.headers.content_type_options": "content_type_options",
    "management.headers.xss_protection": "xss_protection",
    "management.hsts.policy": "strict_transport_security",
}
_CORS_ORIGINS = "management.cors.allow_origins"
_TIMEOUT_KEYS = {
    "handshake_timeout": "handshake_timeout_ms",
    "management.tcp.request_timeout": "management_request_timeout_ms",
    "prometheus.tcp.request_timeout": "prometheus_request_timeout_ms",
    "management.tcp.idle_timeout": "management_idle_timeout_ms",
    "prometheus.tcp.idle_timeout": "prometheus_idle_timeout_ms",
    "management.tcp.inactivity_timeout": "management_inactivity_timeout_ms",
    "prometheus.tcp.inactivity_timeout": "prometheus_inactivity_timeout_ms",
    "ssl_handshake_timeout": "ssl_handshake_timeout_ms",
}
KEYS = frozenset({"management.cors.max_age", *_HEADER_KEYS, *_TIMEOUT_KEYS})


def is_network_key(key: str) -> bool:
    return key in KEYS or key == _CORS_ORIGINS or bool(
        re.fullmatch(re.escape(_CORS_ORIGINS) + r"\.[^.]+", key))


def _header(key: str, value) -> str:
    if not isinstance(value, str) or any(c in value for c in "\r\n"):
        raise ConfigError(f"{key}: expected a header value on one line, got {value!r}")
    return value.strip()


def _origin(key: str, value) -> str:
    if value == "*" or (isinstance(value, str)
                        and re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s]+", value)):
        return value
    raise ConfigError(f"{key}: expected an origin such as https://example.com (scheme, "
                      f"host and port, no path) or *, got {value!r}")


def _timeout(key: str, value) -> int:
    """Milliseconds, positive; `infinity` (as rabbitmq.conf allows for
    handshake_timeout) is 0: no timeout."""
    if value == "infinity" and key == "handshake_timeout":
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        more = " or infinity" if key == "handshake_timeout" else ""
        raise ConfigError(f"{key}: expected a positive number of milliseconds{more}, "
                          f"got {value!r}")
    return value


def parse_network(pairs) -> NetworkSettings:
    """NetworkSettings from (dotted key, value) pairs for which `is_network_key`."""
    values: dict = {}
    headers: dict = {}
    origins: list[str] = []
    for key, value in pairs:
        if key in _TIMEOUT_KEYS:
            values[_TIMEOUT_KEYS[key]] = _timeout(key, value)
        elif key in _HEADER_KEYS:
            headers[_HEADER_KEYS[key]] = _header(key, value)
        elif key == "management.cors.max_age":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{key}: expected a number of seconds, got {value!r}")
            headers["cors_max_age"] = value
        elif key == _CORS_ORIGINS:
            if value == "none":   # RabbitMQ's way of saying no origin
                continue
            for item in value if isinstance(value, list) else [value]:
                origins.append(_origin(key, item))
        else:  # management.cors.allow_origins.NAME
            origins.append(_origin(key, value))
    if origins:
        headers["cors_allow_origins"] = tuple(dict.fromkeys(origins))
    if headers:
        values["management_headers"] = ResponseHeaders(**headers)
    return NetworkSettings(**values)


def http_timeouts(network: NetworkSettings, listener: str):
    """The HTTP timers (seconds) of `listener`, "management" or "prometheus"."""
    from .net.http_timeouts import HttpTimeouts

    return HttpTimeouts(
        request=getattr(network, f"{listener}_request_timeout_ms") / 1000,
        idle=getattr(network, f"{listener}_idle_timeout_ms") / 1000,
        inactivity=getattr(network, f"{listener}_inactivity_timeout_ms") / 1000)

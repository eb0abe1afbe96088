"""What keeps another web page from acting through a browser that is logged in to the
management API: request bodies only as JSON, response headers, and CORS only for
origins named in the configuration.

- Bodies (`body_refusal`): a request that carries a body, or says what it carries,
  must say `application/json` (parameters such as charset allowed), else 415. A page
  of another origin can make a browser send a POST without asking first (a CORS
  "simple request") only as a form (urlencoded, multipart) or text/plain, or with no
  Content-Type at all; with basic-auth credentials cached for the API the browser
  adds them. RabbitMQ 3.10.8 answers 415 to text/plain on /api/definitions but takes
  multipart there and any type elsewhere; here every endpoint takes JSON only, so no
  such request gets further than 415. A request with neither a body nor a
  Content-Type (curl -X DELETE, a PUT of a vhost without settings) is fine.
- Response headers (`headers_for`), on the UI's files and every API answer:
  Content-Security-Policy, X-Frame-Options, X-Content-Type-Options (and
  Strict-Transport-Security, X-XSS-Protection when configured): RabbitMQ's keys,
  stricter defaults (config_network.py).
- CORS (`cors_headers`, `preflight`): as rabbit_mgmt_cors, off unless
  `management.cors.allow_origins` names the request's Origin (or `*`): then the
  answer allows that origin with credentials, and an OPTIONS preflight gets the
  path's methods, the headers asked for and `management.cors.max_age`.

Not here: authentication (access.py), routing (app.py).
"""

from __future__ import annotations

from ..config_network import ResponseHeaders
from .access import Refused

JSON = "application/json"
BODY_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})


def body_refusal(method: str, headers, has_body: bool) -> Refused | None:
    """415 for a body that is not declared as JSON (see the module docstring)."""
    if method not in BODY_METHODS:
        return None
    declared = headers.get("Content-Type")
    if declared is None and not has_body:
        return None
    media_type = (declared or "").split(";", 1)[0].strip().lower()
    if media_type == JSON:
        return None
    what = f"Content-Type {declared!r}" if declared is not None else "no Content-Type"
    return Refused("unsupported_media_type",
                   f"the request body must be JSON, sent with Content-Type: {JSON} (this "
                   f"request has {what})", 415)


def headers_for(config: ResponseHeaders) -> dict[str, str]:
    """The security headers every response carries (empty values are left out)."""
    pairs = (("Content-Security-Policy", config.content_security_policy),
             ("X-Frame-Options", config.frame_options),
             ("X-Content-Type-Options", config.content_type_options),
             ("X-XSS-Protection", config.xss_protection),
             ("Strict-Transport-Security", config.strict_transport_security))
    return {name: value for name, value in pairs if value}


def allowed_origin(config: ResponseHeaders, origin: str | None) -> str | None:
    """The request's Origin when CORS allows it, else None."""
    if not origin or not config.cors_allow_origins:
        return None
    if origin in config.cors_allow_origins or "*" in config.cors_allow_origins:
        return origin
    return None


def cors_headers(config: ResponseHeaders, origin: str | None) -> dict[str, str]:
    """Vary: Origin on every answer (as RabbitMQ); the allow headers for an allowed one."""
    allowed = allowed_origin(config, origin)
    if allowed is None:
        return {"Vary": "Origin"}
    return {"Vary": "Origin", "Access-Control-Allow-Origin": allowed,
            "Access-Control-Allow-Credentials": "true"}


def preflight(config: ResponseHeaders, origin: str | None, methods: list[str],
              requested_headers: str | None) -> dict[str, str]:
    """An OPTIONS answer's headers: Allow, and for an allowed origin what it may send."""
    allow = ", ".join(sorted({*methods, "OPTIONS"}))
    answer = {"Allow": allow, **cors_headers(config, origin)}
    if allowed_origin(config, origin) is not None:
        answer["Access-Control-Allow-Methods"] = allow
        answer["Access-Control-Max-Age"] = str(config.cors_max_age)
        if requested_headers:
            answer["Access-Control-Allow-Headers"] = requested_headers
    return answer

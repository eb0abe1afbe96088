"""An HTTP client for the management API tests (urllib, as a script would use)."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

from tests.support.waiting import wait_until

WAIT = 60.0  # seconds: generous, the machine is shared


def call(base_url: str, method: str, path: str, body=None, user: str = "guest",
         password: str = "guest") -> tuple[int, object, dict]:
    """(status, decoded JSON body or None, headers)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": "Basic " + base64.b64encode(
        f"{user}:{password}".encode()).decode()}
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(base_url + path, data=data, method=method,
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as response:
            raw, status, answer_headers = response.read(), response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        raw, status, answer_headers = error.read(), error.code, dict(error.headers)
    return status, json.loads(raw) if raw else None, answer_headers


def wait_until_serving(base_url: str) -> None:
    """The HTTP listener starts right after the AMQP one: wait for it."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            call(base_url, "GET", "/api/whoami")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_for(condition, what: str, timeout: float = WAIT):
    """condition()'s first true value, polled until `timeout`; raises naming `what`
    (tests/support/waiting.py)."""
    return wait_until(condition, what, timeout, interval=0.1)

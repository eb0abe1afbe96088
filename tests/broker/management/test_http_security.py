"""The management API against another web page and malformed requests (issue 30):
bodies only as JSON (415), security headers on every answer, CORS only for the origins
configured, JSON nested too deep refused with a 400, failed logins logged with the
user and the peer, a malformed request logged in one line (broker/management/
security.py, app.py, access.py; broker/net/http_log.py). The cross-origin attack
itself, in a real browser, is in test_csrf_browser.py. No differential test compares
these answers with RabbitMQ 3.10.8's yet."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import uuid

import pytest

from tests.support.broker import BrokerProcess

from .support import call, wait_for, wait_until_serving

pytestmark = pytest.mark.timeout(180)

GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess() as process:
        wait_until_serving(process.management_url)
        yield process


def send(broker, method: str, path: str, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, bytes, http.client.HTTPMessage]:
    """One request with exactly these headers (http.client adds Host and, with a
    body, Content-Length; nothing else)."""
    connection = http.client.HTTPConnection("127.0.0.1", broker.management_port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read(), response.headers
    finally:
        connection.close()


def user_exists(broker, name: str) -> bool:
    return call(broker.management_url, "GET", f"/api/users/{name}")[0] == 200


def test_a_body_must_be_json_else_415_and_nothing_changes(broker):
    """What a page of another origin can make a browser send without a preflight:
    a form (urlencoded, multipart), text/plain, or a body without a Content-Type."""
    definitions = json.dumps({"users": [{"name": "evil", "password": "x",
                                         "tags": "administrator"}]}).encode()
    user = json.dumps({"password": "x", "tags": "administrator"}).encode()
    refused = [
        ("POST", "/api/definitions", definitions, {"Content-Type": "text/plain"}),
        ("POST", "/api/definitions", b"users=evil", {
            "Content-Type": "application/x-www-form-urlencoded"}),
        ("POST", "/api/definitions", b'--b\r\nContent-Disposition: form-data; name="file"; '
                                     b'filename="d.json"\r\n\r\n' + definitions +
                                     b"\r\n--b--\r\n",
         {"Content-Type": "multipart/form-data; boundary=b"}),
        ("POST", "/api/definitions", definitions, {}),    # no Content-Type at all
        ("PUT", "/api/users/evil", user, {"Content-Type": "text/plain"}),
        ("PUT", "/api/users/evil", user, {"Content-Type": "application/vnd.evil+json"}),
    ]
    for method, path, body, headers in refused:
        status, raw, _ = send(broker, method, path, body, {"Authorization": GUEST, **headers})
        assert status == 415, (method, path, headers, status, raw)
        answer = json.loads(raw)
        assert answer["error"] == "unsupported_media_type"
        assert "Content-Type: application/json" in answer["reason"]
    assert not user_exists(broker, "evil")
    # JSON (with a charset too) is taken; so are requests without a body
    name = f"ok-{uuid.uuid4().hex[:6]}"
    status, raw, _ = send(broker, "PUT", f"/api/users/{name}", user, {
        "Authorization": GUEST, "Content-Type": "application/json; charset=utf-8"})
    assert status == 201, raw
    assert send(broker, "PUT", f"/api/vhosts/{name}", None, {"Authorization": GUEST})[0] == 201
    assert send(broker, "DELETE", f"/api/vhosts/{name}", None, {"Authorization": GUEST})[0] == 204
    assert send(broker, "DELETE", f"/api/users/{name}", None, {"Authorization": GUEST})[0] == 204
    # no credentials: 401 first, as RabbitMQ (the media type is looked at once logged in)
    status, _, headers = send(broker, "POST", "/api/definitions", b"{}",
                              {"Content-Type": "text/plain"})
    assert status == 401 and headers["WWW-Authenticate"]


def test_every_answer_carries_the_security_headers(broker):
    for path, auth in (("/", None), ("/ui/app.js", None), ("/api/overview", GUEST),
                       ("/api/overview", None), ("/api/nowhere", GUEST)):
        _status, _, headers = send(broker, "GET", path, None,
                                   {"Authorization": auth} if auth else {})
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], path
        assert "script-src 'self'" in headers["Content-Security-Policy"], path
        assert headers["X-Frame-Options"] == "DENY", path
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["Vary"] == "Origin", path
        assert "Strict-Transport-Security" not in headers, path


def test_cors_is_off_unless_configured(broker):
    evil = {"Origin": "http://evil.example", "Authorization": GUEST}
    _status, _, headers = send(broker, "GET", "/api/overview", None, evil)
    assert "Access-Control-Allow-Origin" not in headers
    status, _, headers = send(broker, "OPTIONS", "/api/users/someone", None, {
        "Origin": "http://evil.example", "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 200
    assert headers["Allow"] == "DELETE, GET, OPTIONS, PUT"
    assert "Access-Control-Allow-Origin" not in headers
    assert "Access-Control-Allow-Methods" not in headers


def test_cors_allows_the_configured_origins_only(tmp_path):
    config = ('management.cors.allow_origins.1 = "http://good.example:8080"\n'
              "management.cors.max_age = 600\n"
              'management.headers.frame_options = "SAMEORIGIN"\n'
              'management.hsts.policy = "max-age=31536000"\n')
    with BrokerProcess(data_dir=str(tmp_path / "node"), extra_config=config) as broker:
        wait_until_serving(broker.management_url)
        good = {"Origin": "http://good.example:8080", "Authorization": GUEST}
        _status, _, headers = send(broker, "GET", "/api/overview", None, good)
        assert headers["Access-Control-Allow-Origin"] == "http://good.example:8080"
        assert headers["Access-Control-Allow-Credentials"] == "true"
        assert headers["X-Frame-Options"] == "SAMEORIGIN"
        assert headers["Strict-Transport-Security"] == "max-age=31536000"
        _status, _, headers = send(broker, "GET", "/api/overview", None, {
            "Origin": "http://evil.example", "Authorization": GUEST})
        assert "Access-Control-Allow-Origin" not in headers
        status, _, headers = send(broker, "OPTIONS", "/api/queues/%2F/q", None, {
            "Origin": "http://good.example:8080", "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert status == 200
        assert headers["Access-Control-Allow-Origin"] == "http://good.example:8080"
        assert headers["Access-Control-Allow-Methods"] == "DELETE, GET, OPTIONS, PUT"
        assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        assert headers["Access-Control-Max-Age"] == "600"


@pytest.mark.parametrize("body", [
    "[" * 50_000 + "]" * 50_000,
    '{"a":' * 50_000 + "1" + "}" * 50_000,
    json.dumps({"durable": True, "arguments": {"x-deep": json.loads("[" * 150 + "]" * 150)}}),
], ids=["arrays-50000", "objects-50000", "arguments-150"])
def test_json_nested_too_deep_is_a_400_and_the_node_goes_on(broker, body):
    name = f"deep-{uuid.uuid4().hex[:6]}"
    status, raw, _ = send(broker, "PUT", f"/api/queues/%2F/{name}", body.encode(), {
        "Authorization": GUEST, "Content-Type": "application/json"})
    assert status == 400, raw
    answer = json.loads(raw)
    assert answer == {"error": "bad_request",
                      "reason": "not JSON: nested deeper than 100 levels"}
    assert call(broker.management_url, "GET", f"/api/queues/%2F/{name}")[0] == 404
    assert call(broker.management_url, "PUT", f"/api/queues/%2F/{name}",
                {"durable": True})[0] == 201
    assert "Traceback" not in broker.log()


def test_a_malformed_request_is_one_log_line(broker):
    for _ in range(3):
        status, _, _ = send(broker, "GET", "/api/overview", None, {
            "Authorization": GUEST, "X-Long": "a" * 20_000})
        assert status in (400, 431)
    with socket.create_connection(("127.0.0.1", broker.management_port), timeout=30) as sock:
        sock.sendall(b"GET /api/overview HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n")
        assert b" 400 " in sock.recv(100)
    lines = wait_for(lambda: [line for line in broker.log().splitlines()
                              if "malformed request" in line] or None,
                     "the malformed requests in the log")
    log = broker.log()
    assert "Traceback" not in log
    assert len([line for line in lines if "Got more than" in line]) == 3, lines
    assert all("management HTTP listener: Error handling request from 127.0.0.1" in line
               for line in lines), lines
    assert all(len(line) < 400 for line in lines), lines


def test_failed_logins_are_logged_with_user_and_peer(broker):
    for user, password in (("guest", "wrong"), ("nobody", "x")):
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        status, _, _ = send(broker, "GET", "/api/overview", None,
                            {"Authorization": f"Basic {token}"})
        assert status == 401
    wait_for(lambda: "HTTP access denied: user 'nobody' - invalid credentials (from "
             "127.0.0.1)" in broker.log(), "the refused login in the log")
    assert "HTTP access denied: user 'guest' - invalid credentials (from 127.0.0.1)" \
        in broker.log()

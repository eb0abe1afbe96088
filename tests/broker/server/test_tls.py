"""AMQP over TLS (docs/behaviour/tls.md; RabbitMQ's TLS guide): `listeners.ssl.default`
and `ssl_options.*`, with pika over amqps:// and certificates made at test time.

Each broker runs both listeners: plain AMQP on its port, TLS on listeners.ssl.default.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import time
import urllib.request

import pika
import pika.exceptions
import pytest

from quorumqueue.client.tls import ClientTls, connection_parameters
from tests.support.broker import BrokerProcess, free_port
from tests.support.certs import make_pki


# the broker's refusal: pika raises the SSL error of a failed handshake, or its own
# connection error when the broker's alert comes after the handshake (TLS 1.3)
REFUSED = (pika.exceptions.AMQPConnectionError, ssl.SSLError)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


def tls_broker(pki, top: str = "", **ssl_options) -> BrokerProcess:
    port = free_port()
    lines = [f'certfile = "{pki.server_cert}"', f'keyfile = "{pki.server_key}"',
             f'cacertfile = "{pki.ca}"', 'verify = "verify_peer"']
    for key, value in ssl_options.items():
        lines.append(f"{key} = {value}")
    broker = BrokerProcess(extra_config=top + f"listeners.ssl.default = {port}\n"
                                        "[ssl_options]\n" + "\n".join(lines) + "\n")
    broker.ssl_port = port
    broker.start()
    wait_listening(port)
    return broker


def wait_listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="module")
def optional_cert_broker(pki):
    """verify_peer, fail_if_no_peer_cert false, TLS 1.2 only."""
    broker = tls_broker(pki, fail_if_no_peer_cert="false", **{"versions.1": '"tlsv1.2"'})
    yield broker
    broker.cleanup()


@pytest.fixture(scope="module")
def required_cert_broker(pki):
    """verify_peer, fail_if_no_peer_cert true, TLS 1.3 only."""
    broker = tls_broker(pki, fail_if_no_peer_cert="true", **{"versions.1": '"tlsv1.3"'})
    yield broker
    broker.cleanup()


def amqps(broker) -> str:
    return f"amqps://guest:guest@localhost:{broker.ssl_port}/%2F"


def round_trip(parameters, queue: str) -> bytes:
    """Declare a quorum queue, publish with confirms, get it back."""
    connection = pika.BlockingConnection(parameters)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.basic_publish("", queue, b"over tls")
        _method, _properties, body = channel.basic_get(queue, auto_ack=True)
        return body
    finally:
        connection.close()


def test_pika_over_amqps_without_a_client_certificate(pki, optional_cert_broker):
    parameters = connection_parameters(amqps(optional_cert_broker), ClientTls(ca_file=pki.ca))
    assert round_trip(parameters, "tls-no-cert") == b"over tls"


def test_pika_over_amqps_with_a_client_certificate(pki, optional_cert_broker):
    parameters = connection_parameters(amqps(optional_cert_broker), ClientTls(
        ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key))
    assert round_trip(parameters, "tls-cert") == b"over tls"


def test_rabbitmq_uri_query_parameters_configure_tls(pki, optional_cert_broker):
    uri = (f"{amqps(optional_cert_broker)}?cacertfile={pki.ca}&certfile={pki.client_cert}"
           f"&keyfile={pki.client_key}&heartbeat=30")
    parameters = connection_parameters(uri)
    assert parameters.heartbeat == 30
    assert round_trip(parameters, "tls-query") == b"over tls"


def test_the_plain_listener_runs_beside_the_tls_one(optional_cert_broker):
    assert round_trip(pika.URLParameters(optional_cert_broker.uri), "tls-plain") == b"over tls"


def test_the_management_overview_lists_the_tls_listener(optional_cert_broker):
    """/api/overview's listeners name the TLS AMQP port `amqp/ssl`, as RabbitMQ's."""
    broker = optional_cert_broker
    request = urllib.request.Request(f"{broker.management_url}/api/overview", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(request, timeout=30) as response:
        listeners = json.loads(response.read())["listeners"]
    assert {(row["protocol"], row["port"]) for row in listeners} >= {
        ("amqp", broker.port), ("amqp/ssl", broker.ssl_port)}


def test_plain_amqp_on_the_tls_port_gets_no_amqp(optional_cert_broker):
    with socket.create_connection(("127.0.0.1", optional_cert_broker.ssl_port),
                                  timeout=10) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        try:
            answer = sock.recv(64)
        except ConnectionResetError:
            answer = b""
    assert not answer.startswith(b"\x01\x00\x00")  # no connection.start frame


def test_a_client_refuses_a_broker_its_ca_did_not_sign(pki, optional_cert_broker):
    parameters = connection_parameters(amqps(optional_cert_broker),
                                       ClientTls(ca_file=pki.other_ca))
    with pytest.raises(ssl.SSLCertVerificationError):  # pika re-raises it as it is
        pika.BlockingConnection(parameters)


def test_the_broker_refuses_a_client_certificate_of_another_ca(pki, optional_cert_broker):
    parameters = connection_parameters(amqps(optional_cert_broker), ClientTls(
        ca_file=pki.ca, cert_file=pki.other_client_cert, key_file=pki.other_client_key))
    with pytest.raises(REFUSED):
        pika.BlockingConnection(parameters)


def test_verify_none_on_the_client_accepts_any_broker_certificate(optional_cert_broker):
    parameters = connection_parameters(amqps(optional_cert_broker), ClientTls(verify=False))
    assert round_trip(parameters, "tls-verify-none") == b"over tls"


def test_fail_if_no_peer_cert_refuses_a_client_without_a_certificate(pki,
                                                                     required_cert_broker):
    parameters = connection_parameters(amqps(required_cert_broker), ClientTls(ca_file=pki.ca))
    with pytest.raises(REFUSED):
        pika.BlockingConnection(parameters)


def test_fail_if_no_peer_cert_admits_a_client_with_a_certificate(pki, required_cert_broker):
    parameters = connection_parameters(amqps(required_cert_broker), ClientTls(
        ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key))
    assert round_trip(parameters, "tls-required") == b"over tls"


def negotiated_version(pki, port: int, maximum: ssl.TLSVersion | None = None) -> str:
    context = ssl.create_default_context(cafile=pki.ca)
    context.load_cert_chain(pki.client_cert, pki.client_key)
    if maximum is not None:
        context.maximum_version = maximum
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            assert sock.recv(1) == b"\x01"  # connection.start: AMQP over TLS
            return sock.version()


def test_versions_bound_the_negotiated_tls_version(pki, optional_cert_broker,
                                                   required_cert_broker):
    assert negotiated_version(pki, optional_cert_broker.ssl_port) == "TLSv1.2"
    # the broker's connection log says over what (RabbitMQ's ssl_protocol, ssl_cipher)
    assert "over TLSv1.2 (" in optional_cert_broker.log()
    assert negotiated_version(pki, required_cert_broker.ssl_port) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        negotiated_version(pki, required_cert_broker.ssl_port, ssl.TLSVersion.TLSv1_2)


def test_the_management_client_accepts_amqps(pki, optional_cert_broker):
    from quorumqueue.client.management import call

    round_trip(connection_parameters(amqps(optional_cert_broker), ClientTls(ca_file=pki.ca)),
               "tls-management")
    uri = f"{amqps(optional_cert_broker)}?cacertfile={pki.ca}"
    assert "tls-management" in [row["name"] for row in call(uri, "queues.list")]


def test_a_tls_listener_without_a_certificate_stops_the_broker_at_start(tmp_path):
    from tests.cli.test_cli import CLI
    import subprocess

    config = tmp_path / "broker.toml"
    config.write_text(f"listeners.ssl.default = {free_port()}\n")
    result = subprocess.run(CLI + ["broker", "start", "--config", str(config), "--port", "0",
                                   "--data-dir", str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "ssl_options.certfile: a TLS listener needs a certificate" in result.stderr


def test_a_connection_that_never_starts_tls_is_closed_after_ssl_handshake_timeout(pki):
    """RabbitMQ's ssl_handshake_timeout (5000 ms by default; 1000 here): a client of
    the TLS listener that sends nothing, or a ClientHello cut short, is closed (before:
    after a hard-wired 30 s)."""
    broker = tls_broker(pki, top="ssl_handshake_timeout = 1000\n")
    try:
        for data in (b"", b"\x16\x03\x01\x00\xa5\x01"):
            # a recv still waiting after 20 s raises TimeoutError: not closed
            with socket.create_connection(("127.0.0.1", broker.ssl_port), timeout=20) as sock:
                began = time.monotonic()
                sock.sendall(data)
                try:
                    while sock.recv(4096):
                        pass
                except ConnectionResetError:
                    pass
                assert time.monotonic() - began >= 0.5
    finally:
        broker.cleanup()

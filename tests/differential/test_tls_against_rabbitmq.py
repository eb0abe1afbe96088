"""AMQP over TLS on RabbitMQ 3.10.8 and on quorumqueue, configured with the same
`listeners.ssl.default` and `ssl_options.*` (verify_peer, fail_if_no_peer_cert) and
the same certificates (made by openssl at test time): pika's outcome for each kind
of client is the same on both."""

from __future__ import annotations

import ssl

import pika
import pika.exceptions
import pytest

from quorumqueue.client.tls import ClientTls, connection_parameters
from tests.broker.server.test_tls import tls_broker, wait_listening
from tests.support.broker import free_port
from tests.support.certs import make_pki
from tests.support.rabbitmq import RabbitMQNode

pytestmark = pytest.mark.timeout(300)


def outcome(port: int, tls: ClientTls) -> str:
    try:
        connection = pika.BlockingConnection(connection_parameters(
            f"amqps://guest:guest@localhost:{port}/%2F", tls))
    except (pika.exceptions.AMQPConnectionError, ssl.SSLError):
        return "refused"
    try:
        channel = connection.channel()
        channel.queue_declare("", exclusive=True)
        return "ok"
    finally:
        connection.close()


def outcomes(port: int, pki) -> dict[str, str]:
    return {
        "CA and client certificate": outcome(port, ClientTls(
            ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)),
        "CA, no client certificate": outcome(port, ClientTls(ca_file=pki.ca)),
        "another CA on the client": outcome(port, ClientTls(
            ca_file=pki.other_ca, cert_file=pki.client_cert, key_file=pki.client_key)),
        "a client certificate of another CA": outcome(port, ClientTls(
            ca_file=pki.ca, cert_file=pki.other_client_cert,
            key_file=pki.other_client_key)),
        "no verification, no certificate": outcome(port, ClientTls(verify=False)),
    }


def test_tls_clients_fare_alike_on_rabbitmq_and_quorumqueue(tmp_path):
    if not RabbitMQNode.available():
        pytest.skip(RabbitMQNode.skip_reason)
    pki = make_pki(str(tmp_path / "pki"))
    port = free_port()
    rabbit_config = (f"\nlisteners.ssl.default = {port}\n"
                     f"ssl_options.cacertfile = {pki.ca}\n"
                     f"ssl_options.certfile = {pki.server_cert}\n"
                     f"ssl_options.keyfile = {pki.server_key}\n"
                     "ssl_options.verify = verify_peer\n"
                     "ssl_options.fail_if_no_peer_cert = true\n")
    with RabbitMQNode(extra_config=rabbit_config):
        wait_listening(port)
        rabbitmq = outcomes(port, pki)
    broker = tls_broker(pki, fail_if_no_peer_cert="true")
    try:
        ours = outcomes(broker.ssl_port, pki)
    finally:
        broker.cleanup()
    assert ours == rabbitmq
    assert rabbitmq["CA and client certificate"] == "ok"
    assert rabbitmq["CA, no client certificate"] == "refused"

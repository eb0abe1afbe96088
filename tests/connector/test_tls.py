"""The connector over amqps:// (connector/README.md, "Options"): the tls.* options, checked
at start, and a batch read of a quorum queue from a broker that requires a client
certificate (so the options reach the executors' connections). Real local Spark."""

from __future__ import annotations

import json

import pytest

from quorumqueue.connector.options import (OptionError, parse_batch_read_options,
                                           parse_sink_options, parse_source_options)
from tests.broker.server.test_tls import amqps, tls_broker
from tests.support.certs import make_pki

from .queues import publish_orders, unique

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def tls_only_with_certificate(pki):
    broker = tls_broker(pki, fail_if_no_peer_cert="true")
    yield broker
    broker.cleanup()


def tls_options(pki) -> dict:
    return {"tls.caFile": pki.ca, "tls.certFile": pki.client_cert,
            "tls.keyFile": pki.client_key}


def test_tls_options_reach_every_address(pki):
    options = parse_source_options({"uri": "amqps://a:5671/%2F,amqps://b:5671/%2F",
                                    "queue": "q", **tls_options(pki)})
    assert {address.tls.ca_file for address in options.addresses} == {pki.ca}
    assert all(address.tls.cert_file == pki.client_cert for address in options.addresses)
    sink = parse_sink_options({"uri": "amqps://a/%2F", "routingKey": "q",
                               "TLS.CAFILE": pki.ca, "tls.verify": "false"})
    assert sink.addresses[0].tls.verify is False
    assert parse_batch_read_options({"uri": "amqps://a/%2F", "queue": "q", "maxMessages": "1",
                                     "tls.caFile": pki.ca}).addresses[0].port == 5671


@pytest.mark.parametrize("options, message", [
    ({"uri": "amqp://a/%2F", "tls.caFile": "{ca}"},
     r"option 'tls.caFile' needs amqps:// URIs .* amqp://a/%2F"),
    ({"uri": "amqps://a/%2F", "tls.caFile": "/nonexistent/ca.pem"},
     r"option 'tls.caFile': '/nonexistent/ca.pem' does not exist"),
    ({"uri": "amqps://a/%2F", "tls.keyFile": "{key}"},
     r"option 'tls.keyFile' needs option 'tls.certFile'"),
    ({"uri": "amqps://a/%2F", "tls.certFile": "{cert}", "tls.keyFile": "{other_key}"},
     r"option 'tls.certFile': .* cannot be used with"),
    ({"uri": "amqps://a/%2F", "tls.caFile": "{ca}", "tls.verify": "maybe"},
     r"option 'tls.verify' must be true or false"),
    ({"uri": "amqps://a/%2F?cacertfile={other_ca}", "tls.caFile": "{ca}"},
     r"option 'tls.caFile': TLS ca_file is given twice"),
    ({"uri": "amqps://a/%2F", "tls.trustStore": "{ca}"},
     r"unknown option 'tls.trustStore'"),
])
def test_impossible_tls_options_fail_at_start_naming_the_option(pki, options, message):
    options = {key: value.format(ca=pki.ca, key=pki.client_key, cert=pki.client_cert,
                                 other_key=pki.server_key, other_ca=pki.other_ca)
               for key, value in options.items()}
    with pytest.raises(OptionError, match=message):
        parse_source_options({"queue": "q", **options})


def test_a_batch_read_over_amqps_with_a_client_certificate(spark, pki,
                                                           tls_only_with_certificate):
    broker = tls_only_with_certificate
    queue = unique("tls-orders")
    publish_orders(broker.uri, queue, range(8))   # published over the plain listener
    reader = (spark.read.format("quorumqueue").option("uri", amqps(broker))
              .option("queue", queue).option("maxMessages", "8"))
    for key, value in tls_options(pki).items():
        reader = reader.option(key, value)
    rows = reader.load().collect()
    assert sorted(json.loads(row.body)["order"] for row in rows) == list(range(8))

"""The cluster transport over TLS (broker/server/cluster_transport.py; the cluster.tls keys,
cluster/README.md "TLS between nodes"): nodes whose certificates one CA signed talk;
a node with another CA's certificate, and a plain node, are refused both ways, and so
is a node of the CA that does not know the cookie.

Scenarios run in their own event loop on loopback ports the kernel picks; a refusal
is waited for as connection attempts that failed, never as a fixed delay.
"""

from __future__ import annotations

import logging

import pytest

from quorumqueue.broker.config import _cluster_contexts
from quorumqueue.broker.cluster.wire import Rpc
from quorumqueue.broker.tls import TlsOptions
from tests.broker.server.test_cluster_transport import mesh, run, start, until
from tests.support.certs import make_pki

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


def contexts(ca: str, cert: str, key: str) -> dict:
    options = TlsOptions(prefix="cluster.tls", cacertfile=ca, certfile=cert, keyfile=key,
                         verify_peer=True, configured=True)
    server, client = _cluster_contexts(options)
    return {"ssl_server": server, "ssl_client": client}


def test_nodes_of_one_ca_exchange_envelopes_over_tls(pki):
    tls = contexts(pki.ca, pki.server_cert, pki.server_key)

    async def scenario():
        a, b, c = [await start(name, **tls) for name in "abc"]
        mesh(a, b, c)
        for sender in (a, b, c):
            for peer in "abc":
                if peer != sender.transport.node_name:
                    sender.transport.send(peer, Rpc("hello", {"from": sender.transport.node_name}))
        await until(lambda: all(len(node.got) == 2 for node in (a, b, c)))
        assert sorted(s for s, _ in a.got) == ["b", "c"]
        for node in (a, b, c):
            await node.transport.stop()

    run(scenario)


def refused_both_ways(good, bad) -> None:
    """Each side tries to reach the other; wait until both have failed twice."""

    async def scenario():
        a = await start("a", **good)
        b = await start("b", **bad)
        mesh(a, b)
        a.transport.send("b", Rpc("hello", {}))
        b.transport.send("a", Rpc("hello", {}))
        await until(lambda: a.transport.stats("b").connect_failures >= 2
                    and b.transport.stats("a").connect_failures >= 2)
        assert a.got == [] and b.got == []
        for node in (a, b):
            await node.transport.stop()

    run(scenario)


def test_a_node_with_another_cas_certificate_is_refused_both_ways(pki):
    refused_both_ways(contexts(pki.ca, pki.server_cert, pki.server_key),
                      contexts(pki.other_ca, pki.other_server_cert, pki.other_server_key))


def test_a_node_trusting_the_ca_but_holding_another_cas_certificate_is_refused(pki):
    """It can verify the cluster's nodes, but they cannot verify it."""
    refused_both_ways(contexts(pki.ca, pki.server_cert, pki.server_key),
                      contexts(pki.ca, pki.other_server_cert, pki.other_server_key))


def test_a_plain_node_cannot_talk_to_a_tls_node(pki):
    refused_both_ways(contexts(pki.ca, pki.server_cert, pki.server_key), {})


def test_a_node_of_the_ca_with_another_cookie_is_refused_both_ways_over_tls(pki, caplog):
    """Inside TLS the cookie is still proven by challenge and response: a certificate
    the CA signed is not enough (issue 17)."""
    tls = contexts(pki.ca, pki.server_cert, pki.server_key)

    async def scenario():
        a = await start("a", **tls)
        b = await start("b", cookie="guess", **tls)
        mesh(a, b)
        a.transport.send("b", Rpc("hello", {}))
        b.transport.send("a", Rpc("hello", {}))
        await until(lambda: a.transport.stats().refused >= 2
                    and b.transport.stats().refused >= 2)
        assert a.got == [] and b.got == []
        for node in (a, b):
            await node.transport.stop()

    with caplog.at_level(logging.ERROR, logger="quorumqueue.cluster"):
        run(scenario)
    assert "the cookie does not match this node's cookie" in caplog.text


def test_tls_both_ways_or_not_at_all(pki):
    tls = contexts(pki.ca, pki.server_cert, pki.server_key)

    async def scenario():
        with pytest.raises(ValueError, match="go together"):
            await start("a", ssl_server=tls["ssl_server"])

    run(scenario)

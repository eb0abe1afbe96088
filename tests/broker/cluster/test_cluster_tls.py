"""A 3-node cluster whose nodes talk over TLS (cluster.tls.*, cluster/README.md "TLS
between nodes"), used as a RabbitMQ user would, and a node restarted with another
CA's certificate: the others refuse it and it refuses them."""

from __future__ import annotations

import pika
import pytest

from quorumqueue.cli import launcher
from tests.broker.cluster.test_cluster import connect, drain, leader_of, status
from tests.support.certs import make_pki
from tests.support.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.timeout(400)


def cluster_tls(ca: str, cert: str, key: str) -> str:
    return (f'[cluster.tls]\ncacertfile = "{ca}"\ncertfile = "{cert}"\nkeyfile = "{key}"\n'
            'verify = "verify_peer"\n')


def reachable(uri: str) -> set[str]:
    return {node["name"] for node in status(uri)["nodes"] if node["reachable"]}


def test_a_tls_cluster_replicates_and_refuses_a_node_of_another_ca(tmp_path):
    pki = make_pki(str(tmp_path / "pki"))
    with LocalCluster(3, proxied=False,
                      extra_config=cluster_tls(pki.ca, pki.server_cert, pki.server_key)
                      ) as cluster:
        one, two, three = cluster.uris()
        wait_for("every node reachable from every node", lambda: all(
            reachable(uri) == set(cluster.names) for uri in cluster.uris()))
        assert "(TLS), peers" in cluster.log(cluster.names[0], tail=100_000)
        with connect(one) as connection:
            connection.channel().queue_declare("tls-relay", durable=True,
                                               arguments={"x-queue-type": "quorum"})
        wait_for("a leader", lambda: leader_of(three, "tls-relay"))
        with connect(three) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for n in range(20):
                channel.basic_publish("", "tls-relay", f"m{n}".encode(),
                                      pika.BasicProperties(delivery_mode=2))
        assert drain(two, "tls-relay", 20) == [f"m{n}".encode() for n in range(20)]

        # the third node comes back with a certificate (and CA) of another authority
        third = cluster.names[2]
        cluster.kill(third)
        launcher.write_cluster_config(cluster.config_path, cluster.cookie, cluster_tls(
            pki.other_ca, pki.other_server_cert, pki.other_server_key))
        cluster.restart(third)
        wait_for("the third node failing to verify the others", lambda:
                 "CERTIFICATE_VERIFY_FAILED" in cluster.log(third, tail=100_000))
        # (reachable: heard from within the last seconds; the first node heard the
        # third until it was stopped)
        wait_for("the first node no longer hearing the third", lambda:
                 third not in reachable(one))
        assert reachable(three) == {third}
        # the two others still form a majority and serve the queue
        with connect(one) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("", "tls-relay", b"after", pika.BasicProperties(delivery_mode=2))
        assert drain(two, "tls-relay", 1) == [b"after"]

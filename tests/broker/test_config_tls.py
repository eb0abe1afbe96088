"""TLS configuration (broker/tls.py, docs/behaviour/tls.md): RabbitMQ's
`listeners.ssl.default` and `ssl_options.*`, quorumqueue's `cluster.tls.*`; impossible
settings stop the broker at start with a message naming the key."""

from __future__ import annotations

import ssl

import pytest

from quorumqueue.broker.config import (ConfigError, cluster_tls_contexts, load_settings,
                                       ssl_listener_context)
from tests.support.certs import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


def load(tmp_path, text):
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return load_settings(str(path))


def server_keys(pki, extra=""):
    return (f'[ssl_options]\ncertfile = "{pki.server_cert}"\nkeyfile = "{pki.server_key}"\n'
            f'cacertfile = "{pki.ca}"\n{extra}')


def test_rabbitmq_ssl_keys_become_a_server_context(tmp_path, pki):
    settings = load(tmp_path, "listeners.ssl.default = 5671\n" + server_keys(
        pki, 'verify = "verify_peer"\nfail_if_no_peer_cert = true\n'
             'versions.1 = "tlsv1.2"\nversions.2 = "tlsv1.3"\n'
             'ciphers.1 = "ECDHE-ECDSA-AES256-GCM-SHA384"\n'))
    assert (settings.ssl_host, settings.ssl_port) == ("", 5671)
    options = settings.ssl_options
    assert options.verify_peer and options.fail_if_no_peer_cert
    assert options.versions == ("tlsv1.2", "tlsv1.3")
    context = ssl_listener_context(settings)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert (context.minimum_version, context.maximum_version) == (
        ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3)
    assert "ECDHE-ECDSA-AES256-GCM-SHA384" in [c["name"] for c in context.get_ciphers()]


def test_verify_peer_without_fail_if_no_peer_cert_makes_the_certificate_optional(tmp_path, pki):
    settings = load(tmp_path, "listeners.ssl.default = 5671\n"
                    + server_keys(pki, 'verify = "verify_peer"\n'))
    assert ssl_listener_context(settings).verify_mode == ssl.CERT_OPTIONAL
    settings = load(tmp_path, "listeners.ssl.default = 5671\n" + server_keys(pki))
    assert ssl_listener_context(settings).verify_mode == ssl.CERT_NONE  # RabbitMQ's default


def test_a_listener_may_name_its_address(tmp_path, pki):
    settings = load(tmp_path, 'listeners.ssl.default = "127.0.0.1:5671"\n' + server_keys(pki))
    assert (settings.ssl_host, settings.ssl_port) == ("127.0.0.1", 5671)


def test_an_encrypted_key_with_its_password(tmp_path, pki):
    text = (f'listeners.ssl.default = 5671\n[ssl_options]\ncertfile = "{pki.server_cert}"\n'
            f'keyfile = "{pki.server_key_encrypted}"\n')
    assert ssl_listener_context(load(tmp_path, text + 'password = "secret"\n')) is not None
    with pytest.raises(ConfigError, match=r"^ssl_options.keyfile: .*ssl_options.password"):
        load(tmp_path, text + 'password = "wrong"\n')
    assert "secret" not in repr(load(tmp_path, text + 'password = "secret"\n'))


@pytest.mark.parametrize("text, message", [
    ('listeners.ssl.default = 5671\n', r"^ssl_options.certfile: a TLS listener needs"),
    ('listeners.ssl.default = "localhost"\n', r"^listeners.ssl.default: expected a port"),
    ('listeners.ssl.default = 70000\n', r"^listeners.ssl.default: expected a port"),
    ('listeners.ssl.default = 5672\n{keys}', r"^listeners.ssl.default: port 5672 is also"),
    ('[ssl_options]\ncertfile = "/nonexistent/cert.pem"\n',
     r"^ssl_options.certfile: /nonexistent/cert.pem does not exist"),
    ('[ssl_options]\ncertfile = "{cert}"\nverify = "verify_peer"\n',
     r"^ssl_options.verify: verify_peer needs ssl_options.cacertfile"),
    ('{keys}fail_if_no_peer_cert = true\n',
     r"^ssl_options.fail_if_no_peer_cert: true needs ssl_options.verify = verify_peer"),
    ('{keys}verify = "verify_everything"\n', r"^ssl_options.verify: expected verify_peer"),
    ('{keys}versions.1 = "tlsv1.1"\n', r"^ssl_options.versions.1: tlsv1.1 is not supported"),
    ('{keys}versions = ["tlsv1.2", "tls9"]\n', r"^ssl_options.versions.2: expected tlsv1.2"),
    ('{keys}ciphers.1 = "NO-SUCH-CIPHER"\n', r"^ssl_options.ciphers: OpenSSL knows none"),
    ('{keys}depth = 2\n', r"^ssl_options.depth: not supported"),
    ('{keys}honor_cipher_order = true\n', r"unknown key 'ssl_options.honor_cipher_order'"),
    ('[ssl_options]\ncertfile = "{cert}"\nkeyfile = "{other_key}"\n',
     r"^ssl_options.keyfile: cannot use .* the key does not match"),
    ('[ssl_options]\ncertfile = "{cert}"\nkeyfile = "{cert}"\n',
     r"^ssl_options.keyfile: cannot use"),
    ('[ssl_options]\ncertfile = "{cert}"\nkeyfile = "{key}"\ncacertfile = "{key}"\n',
     r"^ssl_options.cacertfile: .* holds no PEM certificate"),
    ('[cluster.tls]\ncertfile = "{cert}"\nkeyfile = "{key}"\n',
     r"^cluster.tls.cacertfile: inter-node TLS checks"),
    ('[cluster.tls]\ncacertfile = "{ca}"\n', r"^cluster.tls.certfile: inter-node TLS needs"),
    ('[cluster.tls]\ncertfile = "{cert}"\nkeyfile = "{key}"\ncacertfile = "{ca}"\n'
     'fail_if_no_peer_cert = true\n', r"unknown key 'cluster.tls.fail_if_no_peer_cert'"),
])
def test_impossible_tls_settings_fail_at_start_naming_the_key(tmp_path, pki, text, message):
    text = text.format(keys=server_keys(pki), cert=pki.server_cert, key=pki.server_key,
                       other_key=pki.client_key, ca=pki.ca)
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, text)


def test_cluster_tls_verifies_both_ways_by_default(tmp_path, pki):
    settings = load(tmp_path, f'[cluster.tls]\ncertfile = "{pki.server_cert}"\n'
                              f'keyfile = "{pki.server_key}"\ncacertfile = "{pki.ca}"\n')
    server, client = cluster_tls_contexts(settings)
    assert server.verify_mode == ssl.CERT_REQUIRED  # a peer without a certificate: refused
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert cluster_tls_contexts(load(tmp_path, "")) == (None, None)

"""HTTPS for the management API and the Prometheus endpoint (RabbitMQ's
`management.ssl.*` and `prometheus.ssl.*` keys): requests over TLS with the right CA,
a wrong CA refused, client certificates when fail_if_no_peer_cert, rabbitmqadmin
--ssl unchanged, a Prometheus scrape over https, and the plain listeners still up."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.config import ConfigError, load_settings
from tests.support.broker import BrokerProcess, free_port
from tests.support.certs import make_pki

from .support import wait_until_serving

AUTH = "Basic " + base64.b64encode(b"guest:guest").decode()
RABBITMQADMIN = Path("/usr/bin/rabbitmqadmin")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(str(tmp_path_factory.mktemp("pki")))


def group(name: str, port: int, pki, **extra) -> str:
    lines = [f"{name}.ssl.port = {port}", f'{name}.ssl.certfile = "{pki.server_cert}"',
             f'{name}.ssl.keyfile = "{pki.server_key}"',
             f'{name}.ssl.cacertfile = "{pki.ca}"']
    lines += [f"{name}.ssl.{key} = {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def broker(pki):
    """management.ssl without client certificates; prometheus.ssl requiring one."""
    management_ssl, prometheus_ssl = free_port(), free_port()
    config = ("prometheus.tcp.port = 0\n" + group("management", management_ssl, pki)
              + group("prometheus", prometheus_ssl, pki, verify='"verify_peer"',
                      fail_if_no_peer_cert="true"))
    with BrokerProcess(extra_config=config) as process:
        process.management_ssl, process.prometheus_ssl = management_ssl, prometheus_ssl
        wait_until_serving(process.management_url)
        yield process


def context(ca: str, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def get(url: str, ctx: ssl.SSLContext) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": AUTH})
    with urllib.request.urlopen(request, context=ctx, timeout=30) as response:
        return response.read()


def test_management_over_https_with_the_right_ca(broker, pki):
    body = json.loads(get(f"https://localhost:{broker.management_ssl}/api/overview",
                          context(pki.ca)))
    assert {(row["protocol"], row["port"]) for row in body["listeners"]} >= {
        ("http", broker.management_port), ("https", broker.management_ssl)}
    # the plain listener still serves
    plain = json.loads(get(f"{broker.management_url}/api/overview", context(pki.ca)))
    assert plain["node"] == body["node"]


def test_management_https_refused_by_a_client_trusting_another_ca(broker, pki):
    with pytest.raises(urllib.error.URLError) as caught:
        get(f"https://localhost:{broker.management_ssl}/api/overview",
            context(pki.other_ca))
    assert isinstance(caught.value.reason, ssl.SSLCertVerificationError)


def test_prometheus_over_https_needs_a_client_certificate(broker, pki):
    url = f"https://localhost:{broker.prometheus_ssl}/metrics"
    text = get(url, context(pki.ca, pki.client_cert, pki.client_key)).decode()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert any(name.startswith("rabbitmq_") for name in names)
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(url, context(pki.ca))
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        get(url, context(pki.ca, pki.other_client_cert, pki.other_client_key))


@pytest.mark.skipif(not RABBITMQADMIN.is_file(),
                    reason="Debian's rabbitmqadmin is not installed; run .ci/install-rabbitmq")
def test_rabbitmqadmin_over_https(broker, pki):
    def admin(*arguments):
        return subprocess.run(
            ["/usr/bin/python3", str(RABBITMQADMIN), "-H", "localhost", "-P",
             str(broker.management_ssl), "-u", "guest", "-p", "guest", "--ssl",
             f"--ssl-ca-cert-file={pki.ca}", *arguments],
            capture_output=True, text=True, timeout=60)
    declared = admin("declare", "queue", "name=https-q", "durable=true",
                     "queue_type=quorum")
    assert declared.returncode == 0, declared.stderr
    listed = admin("-f", "raw_json", "list", "queues", "name")
    assert listed.returncode == 0, listed.stderr
    assert "https-q" in {row["name"] for row in json.loads(listed.stdout)}


def write(tmp_path, text: str) -> str:
    path = tmp_path / "quorumqueue.conf"
    path.write_text(text)
    return str(path)


def test_config_errors_name_the_key(tmp_path, pki):
    cases = [
        ('management.ssl.certfile = "/nonexistent.pem"\nmanagement.ssl.port = 15671\n',
         "management.ssl.certfile"),
        ("management.ssl.port = 15671\n", "management.ssl.certfile"),
        (f'prometheus.ssl.certfile = "{pki.server_cert}"\n'
         f'prometheus.ssl.keyfile = "{pki.server_key}"\n', "prometheus.ssl.port"),
        (group("prometheus", 70000, pki), "prometheus.ssl.port"),
        (group("management", 15671, pki, verify='"verify_sometimes"'),
         "management.ssl.verify"),
        (group("management", 15671, pki, fail_if_no_peer_cert="true"),
         "management.ssl.fail_if_no_peer_cert"),
        (group("management", 15671, pki, colour='"blue"'), "management.ssl.colour"),
        (group("management", 15671, pki, **{"versions.1": '"tlsv1"'}),
         "management.ssl.versions.1"),
        (group("management", 15672, pki), "management.ssl.port"),
    ]
    for text, key in cases:
        with pytest.raises(ConfigError) as caught:
            load_settings(write(tmp_path, text))
        assert key in str(caught.value), (text, caught.value)
    settings = load_settings(write(tmp_path, group("management", 15671, pki)))
    assert settings.management_ssl_port == 15671 and settings.prometheus_ssl_port is None


def test_the_command_line_talks_to_a_node_over_https(broker, pki):
    """`quorumqueue queues list --ssl` (rabbitmqadmin's options) goes to the
    management.ssl listener, checking the node's certificate against the CA given;
    a CA that did not sign it is refused."""
    from tests.cli.test_cli import run_cli

    https = ["--ssl", "--host", "localhost", "--port", str(broker.management_ssl)]
    listed = run_cli("queues", "list", *https, "--ssl-ca-cert-file", pki.ca)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[:2] == ["vhost", "name"]
    url = f"https://guest:guest@localhost:{broker.management_ssl}"
    assert run_cli("cluster", "status", "--base-uri", url,
                   "--ssl-ca-cert-file", pki.ca).returncode == 0
    refused = run_cli("queues", "list", *https, "--ssl-ca-cert-file", pki.other_ca)
    assert refused.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in refused.stderr
    # TLS files for plain http would be ignored: refused instead
    plain = run_cli("queues", "list", "--port", str(broker.management_port),
                    "--ssl-ca-cert-file", pki.ca)
    assert plain.returncode == 2 and "need https" in plain.stderr

"""Scraping a Prometheus endpoint in tests: the bundled broker's or RabbitMQ's.

`scrape(port, path)` fetches and parses the exposition text with prometheus_client's
own parser (what a test asserts is what a Prometheus server would read);
`value(samples, name, **labels)` reads one sample; `dashboard_queries()` and
`metrics_and_labels(query)` read the PromQL of conf/grafana's dashboard. `broker_with_metrics()` is a
`BrokerProcess` whose endpoint listens on a free port; `RabbitMQWithPrometheus` a
private RabbitMQ node (tests/support/rabbitmq.py) with the rabbitmq_prometheus plugin
enabled on a free port.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.broker import BrokerProcess, free_port
from tests.support.rabbitmq import RabbitMQNode, _reserve_loopback_ports


def fetch(port: int, path: str = "/metrics", accept: str | None = None) -> tuple[str, str]:
    """(body, content type) of GET http://127.0.0.1:port/path."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if accept:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode(), response.headers["Content-Type"]


def scrape(port: int, path: str = "/metrics") -> dict:
    """{sample name: [(labels, value, family type)]} of one scrape."""
    samples: dict = {}
    for family in text_string_to_metric_families(fetch(port, path)[0]):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value,
                                                        family.type))
    return samples


def value(samples: dict, name: str, **labels) -> float:
    """The value of the one sample `name` whose labels include `labels`."""
    found = [v for sample_labels, v, _type in samples.get(name, ())
             if all(sample_labels.get(k) == want for k, want in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples in {samples.get(name)}"
    return found[0]


def wait_for(port: int, path: str, condition, timeout: float = 60.0) -> dict:
    """Scrape until `condition(samples)` holds (RabbitMQ refreshes its queue metrics
    every few seconds); the last scrape, or AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(port, path)
        try:
            if condition(samples):
                return samples
        except AssertionError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} on port {port}: condition not met within "
                                 f"{timeout:.0f} s")
        time.sleep(0.5)


DASHBOARD = Path(__file__).resolve().parents[2] / "conf" / "grafana" / \
    "quorumqueue-quorum-queues.json"


def dashboard_queries(path: Path = DASHBOARD) -> list[str]:
    """Every PromQL expression of a Grafana dashboard: panel targets and variable
    queries."""
    document = json.loads(path.read_text())
    queries = [target["expr"] for panel in document["panels"]
               for target in panel.get("targets", ())]
    for variable in document["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            queries.append(query["query"])
    return queries


def metrics_and_labels(query: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) a PromQL expression uses: label lists (by, on,
    group_left, label_values' second argument) and selectors hold labels, what is left
    names metrics. `instance`, which Prometheus adds at scrape, is left out."""
    groups = re.findall(r"\b(?:by|on|group_left)\s*\(([^)]*)\)", query)
    groups += re.findall(r"label_values\(\s*\w+\s*,([^)]*)\)", query)
    labels = {label.strip() for group in groups for label in group.split(",")
              if label.strip()} - {"instance"}
    labels |= set(re.findall(r"([a-z_]+)\s*[=!]~?\s*\"", query))
    bare = re.sub(r"\{[^}]*\}", "", re.sub(
        r"\b(?:by|on|group_left)\s*\([^)]*\)|,[^,()]*\)\s*$", "", query))
    return set(re.findall(r"\b(rabbitmq_[a-z0-9_]+)\b", bare)), labels


def broker_with_metrics() -> tuple[BrokerProcess, int]:
    """A bundled broker (not started) whose Prometheus endpoint gets a free port."""
    port = free_port()
    return BrokerProcess(extra_config=f"prometheus.tcp.port = {port}\n"), port


class RabbitMQWithPrometheus(RabbitMQNode):
    """RabbitMQ with rabbitmq_prometheus enabled, listening on `prometheus_port`."""

    def __init__(self, **options) -> None:
        self.prometheus_port = _reserve_loopback_ports(1)[0]
        super().__init__(extra_config=f"prometheus.tcp.port = {self.prometheus_port}\n"
                                      "prometheus.tcp.ip = 127.0.0.1", **options)

    def _environment(self) -> dict[str, str]:
        environment = super()._environment()
        assert self.base_dir is not None
        (self.base_dir / "enabled_plugins").write_text("[rabbitmq_prometheus].\n")
        return environment

"""Where a new classic queue's leader goes (ClassicQueue.place, settings.leader_locator,
cluster.Cluster.least_hosting / random_running): RabbitMQ 4's mapping of the deprecated
queue-master-locator values to "balanced", and, with RabbitMQ 3.13's deprecated-feature
switch for classic queue mirroring on, the 3.13 values as its mirroring guide's "Queue
Leader Location" gives them (min-masters: the node hosting the fewest leaders;
random: a random node; client-local: the declaring node). Among the running nodes
only. The cluster test is tests/broker/cluster/test_mirrored_queues_location.py."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from quorumqueue.broker.cluster.cluster import Cluster
from quorumqueue.broker.config import ConfigError, Settings, load_settings
from quorumqueue.broker.queues.classic import ClassicQueue
from quorumqueue.broker.queues.settings import leader_locator


class FakeCluster:
    """Cluster's placement methods over nodes a, b, c, this one "a"; `hosted`
    node -> how many classic queues it leads; `down` not reachable."""

    least_hosting = Cluster.least_hosting
    random_running = Cluster.random_running

    def __init__(self, hosted: dict, down=()) -> None:
        self.name = "a"
        self.nodes = ("a", "b", "c")
        self.down = set(down)
        self._random = random.Random(7)
        queues = {f"q{i}": SimpleNamespace(metadata_record=lambda h=host: {"host": h})
                  for i, host in enumerate(h for h, n in hosted.items() for _ in range(n))}
        self.node = SimpleNamespace(all_queues=queues.values)   # cluster/host.py's

    def reachable(self, name: str) -> bool:
        return name not in self.down


def host(arguments, cluster, mirroring=True, policy=None, **settings):
    settings = Settings(permit_classic_queue_mirroring=mirroring, **settings)
    return ClassicQueue.place("/", "q", arguments, policy, settings, cluster)["host"]


@pytest.mark.parametrize("value", ["random", "min-masters", "least-leaders"])
def test_without_the_mirroring_switch_old_values_are_balanced(value):
    """RabbitMQ 4 (rabbit_queue_location:leader_locator): deprecated, balanced."""
    assert leader_locator({"x-queue-master-locator": value}, None, "client-local") \
        == "balanced"
    assert host({"x-queue-master-locator": value}, FakeCluster({"a": 2, "b": 1, "c": 0}),
                mirroring=False) == "c"


@pytest.mark.parametrize("value, expected", [
    ("random", "random"), ("min-masters", "min-masters"),
    ("least-leaders", "min-masters"), ("client-local", "client-local"),
    ("balanced", "balanced")])
def test_with_the_mirroring_switch_the_3_13_values_keep_their_meaning(value, expected):
    assert leader_locator({"x-queue-master-locator": value}, None, "client-local",
                          classic_mirroring=True) == expected
    policy = SimpleNamespace(definition={"queue-master-locator": value})
    assert leader_locator({}, policy, "client-local", classic_mirroring=True) == expected


def test_min_masters_picks_the_running_node_leading_fewest():
    cluster = FakeCluster({"a": 2, "b": 1, "c": 0})
    assert host({"x-queue-master-locator": "min-masters"}, cluster) == "c"
    cluster = FakeCluster({"a": 2, "b": 1, "c": 0}, down={"c"})
    assert host({"x-queue-master-locator": "min-masters"}, cluster) == "b"
    # the policy key, and a tie: this node
    cluster = FakeCluster({"a": 1, "b": 1, "c": 1})
    policy = SimpleNamespace(definition={"queue-master-locator": "min-masters"})
    assert host({}, cluster, policy=policy) == "a"


def test_client_local_is_the_declaring_node():
    cluster = FakeCluster({"a": 5, "b": 0, "c": 0})
    assert host({"x-queue-master-locator": "client-local"}, cluster) == "a"
    assert host({}, cluster) == "a"  # the default


def test_random_spreads_over_the_running_nodes_only():
    cluster = FakeCluster({}, down={"b"})
    hosts = [host({"x-queue-master-locator": "random"}, cluster) for _ in range(60)]
    assert set(hosts) == {"a", "c"}  # 2 ** -59 that one of them is missed by chance


def test_the_configured_queue_master_locator(tmp_path):
    """rabbitmq.conf's queue_master_locator, where queue_leader_locator is left at
    client-local; 3.13's values only."""
    path = tmp_path / "broker.toml"
    path.write_text('queue_master_locator = "min-masters"\n'
                    'deprecated_features.permit.classic_queue_mirroring = true\n')
    settings = load_settings(str(path))
    assert settings.queue_master_locator == "min-masters"
    cluster = FakeCluster({"a": 2, "b": 1, "c": 3})
    assert ClassicQueue.place("/", "q", {}, None, settings, cluster)["host"] == "b"
    # the argument still wins over the configuration
    assert ClassicQueue.place("/", "q", {"x-queue-master-locator": "client-local"}, None,
                              settings, cluster)["host"] == "a"
    path.write_text('queue_master_locator = "somewhere"\n')
    with pytest.raises(ConfigError, match="queue_master_locator"):
        load_settings(str(path))

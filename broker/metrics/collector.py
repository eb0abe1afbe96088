"""The node's state as rabbitmq_prometheus's metric families, read at scrape time.

Responsibilities: turn what a node holds — its queues' counts, its quorum queues' Raft
state, its connections and channels, the message counters of node/counters.py, its
memory, disk and alarms — into the metric families RabbitMQ's Prometheus plugin
exports, with the same names, types and labels (checked against RabbitMQ 3.10.8 by
tests/differential/test_prometheus_against_rabbitmq.py); plus quorumqueue's own
families, under `quorumqueue_` (the event loop's lag: loop_lag.py; the durable leases
of quorum queues: quorumqueue_leases{state}, quorumqueue_leased_messages and
quorumqueue_lease_idle_seconds_max, the longest a lease holding messages has been
idle, what its timeout is measured against).

How it works: `NodeCollector` is a prometheus_client custom collector. Its `collect()`
runs on the event loop's thread when an endpoint is scraped (broker/metrics/http.py)
and builds the families from the node's state as it is then; nothing is recorded on
the hot path except the plain ints of node/counters.py and the one timed entry per
Raft group behind the commit-latency gauge. Three views, as RabbitMQ's endpoints:

- aggregated (`/metrics`): the queue and Raft families without labels, one sample
  each, summed over this node's queues (the commit latency: the largest);
- per object (`/metrics/per-object`): one sample per queue, labels {vhost, queue};
- detailed (`/metrics/detailed?family=...&vhost=...`): the families asked for,
  per queue, prefixed `rabbitmq_detailed_`.

Which node reports a queue: the one that serves it (`Queue.served_here`: a classic
queue's host, a quorum queue's leader), so summing a cluster's nodes counts each
queue once. Every member of a quorum queue reports its own Raft state.

Not here: the HTTP listener (http.py), counting (node/counters.py).
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import sys
from importlib import metadata as package_metadata
from typing import Iterable, Iterator, Protocol, Sized

from prometheus_client.metrics_core import (CounterMetricFamily, GaugeMetricFamily, Metric,
                                            UnknownMetricFamily)

from ..config import Settings
from ..node.node import Node
from .loop_lag import LoopLag


class Broker(Protocol):
    """What the collector reads of the running broker (server/server.py's
    BrokerServer): its node, its settings, its connections and memory figures."""

    node: Node
    settings: Settings
    connections: Sized
    loop_lag: LoopLag   # the event loop's lag samples (server/loop_lag.py)

    def resident_memory(self) -> int:
        """The process's resident memory, in bytes."""

    def memory_limit(self) -> int:
        """The memory high watermark, in bytes."""

    def disk_free_limit(self) -> int:
        """The free disk space low watermark, in bytes."""

PROTOCOL = "amqp091"
# our queue type names -> RabbitMQ's `queue_type` label values
QUEUE_TYPES = {"classic": "rabbit_classic_queue", "quorum": "rabbit_quorum_queue"}

# the queue families: (name, type, help, how to read a queue served here)
QUEUE_FAMILIES = (
    ("queue_messages_ready", "gauge", "Messages ready to be delivered to consumers",
     lambda q: q.ready_count),
    ("queue_messages_unacked", "gauge", "Messages delivered to consumers but not yet "
     "acknowledged", lambda q: q.unacked_count),
    ("queue_messages", "gauge", "Sum of ready and unacknowledged messages - total queue "
     "depth", lambda q: q.ready_count + q.unacked_count),
    ("queue_consumers", "gauge", "Consumers on a queue", lambda q: q.consumer_count),
    ("queue_messages_ready_bytes", "gauge", "Size in bytes of ready messages",
     lambda q: q.ready_bytes),
    # None for a queue whose type does not count unacked bytes (Queue.unacked_bytes)
    ("queue_messages_unacked_bytes", "gauge", "Size in bytes of all unacknowledged "
     "messages", lambda q: q.unacked_bytes),
    ("queue_messages_bytes", "gauge", "Size in bytes of ready and unacknowledged messages",
     lambda q: None if (unacked := q.unacked_bytes) is None else q.ready_bytes + unacked),
)

# /metrics/detailed: RabbitMQ's family names -> the queue families they hold
DETAILED_FAMILIES = {
    "queue_coarse_metrics": ("queue_messages_ready", "queue_messages_unacked",
                             "queue_messages"),
    "queue_consumer_count": ("queue_consumers",),
    "queue_metrics": ("queue_messages_ready_bytes", "queue_messages_unacked_bytes",
                      "queue_messages_bytes"),
}


def _raft_snapshot_index(raft) -> int:
    meta = raft.log.snapshot_meta()
    return meta.index if meta is not None else 0


# the Raft families, per member of a quorum queue on this node: (name, type, help, read,
# how the aggregated view combines members)
RAFT_FAMILIES = (
    ("raft_term_total", "counter", "Current Raft term number",
     lambda q: q.raft.term, sum),
    ("raft_log_snapshot_index", "gauge", "Raft log snapshot index",
     lambda q: _raft_snapshot_index(q.raft), sum),
    ("raft_log_last_applied_index", "gauge", "Raft log last applied index",
     lambda q: q.raft.applied_index, sum),
    ("raft_log_commit_index", "gauge", "Raft log commit index",
     lambda q: q.raft.commit_index, sum),
    ("raft_log_last_written_index", "gauge", "Raft log last written index",
     lambda q: q.raft.log.persisted_index(), sum),
    ("raft_entry_commit_latency_seconds", "gauge", "Time taken for a log entry to be "
     "committed", lambda q: q.commit_latency_s, max),
)


@functools.lru_cache(maxsize=None)
def _version(package: str) -> str:
    try:
        return package_metadata.version(package)
    except package_metadata.PackageNotFoundError:  # pragma: no cover - run from a tree
        return "unknown"


def _family(name: str, kind: str, documentation: str, labels: Iterable[str] = ()) -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, documentation, labels=list(labels))
    if kind == "gauge":
        return GaugeMetricFamily(name, documentation, labels=list(labels))
    return UnknownMetricFamily(name, documentation, labels=list(labels))


def _single(name: str, kind: str, documentation: str, value: float) -> Metric:
    family = _family(name, kind, documentation)
    family.add_metric([], value)
    return family


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # pragma: no cover - not Linux
        return 0


class NodeCollector:
    """A prometheus_client collector over one running broker (`server`): its node,
    settings and resource limits. `view` is "aggregated", "per-object" or "detailed"
    (then `families` and `vhosts` select, as /metrics/detailed's query does)."""

    def __init__(self, server: Broker, view: str = "aggregated",
                 families: Iterable[str] = (), vhosts: Iterable[str] = ()) -> None:
        assert view in ("aggregated", "per-object", "detailed")
        self.server = server
        self.view = view
        self.families = tuple(families)
        self.vhosts = frozenset(vhosts)

    def collect(self) -> Iterator[Metric]:
        if self.view == "detailed":
            yield from self._detailed()
            yield from self._identity()
            return
        yield from self._node()
        yield from self._raft()
        yield from self._queues()
        yield from self._leases()
        yield from self._connections()
        yield from self._global()
        yield from self._identity()

    # ------------------------------------------------------------ identity

    def _identity(self) -> Iterator[Metric]:
        settings = self.server.settings
        build = UnknownMetricFamily(
            "rabbitmq_build_info", "quorumqueue & Python version info",
            labels=["rabbitmq_version", "prometheus_plugin_version",
                    "prometheus_client_version", "python_version"])
        version = _version("quorumqueue")
        build.add_metric([version, version, _version("prometheus-client"),
                          ".".join(map(str, sys.version_info[:3]))], 1)
        yield build
        identity = UnknownMetricFamily(
            "rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
            labels=["rabbitmq_node", "rabbitmq_cluster", "rabbitmq_cluster_permanent_id"])
        identity.add_metric([settings.node_name, settings.cluster_name,
                             settings.cluster_name], 1)
        yield identity

    # ------------------------------------------------------------ the node's resources

    def _node(self) -> Iterator[Metric]:
        server = self.server
        alarms = server.node.alarms
        if self.view == "aggregated":  # as RabbitMQ's: /metrics/per-object has none
            yield _single("rabbitmq_alarms_file_descriptor_limit", "untyped",
                          "is 1 if file descriptor limit alarm is in effect", 0)
            yield _single("rabbitmq_alarms_free_disk_space_watermark", "untyped",
                          "is 1 if free disk space watermark alarm is in effect",
                          int("disk" in alarms))
            yield _single("rabbitmq_alarms_memory_used_watermark", "untyped",
                          "is 1 if VM memory watermark alarm is in effect",
                          int("memory" in alarms))
        yield _single("rabbitmq_process_open_fds", "gauge", "Open file descriptors",
                      open_fds())
        yield _single("rabbitmq_process_max_fds", "gauge", "Open file descriptors limit",
                      resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        yield _single("rabbitmq_process_resident_memory_bytes", "gauge",
                      "Memory used in bytes", server.resident_memory())
        yield _single("rabbitmq_resident_memory_limit_bytes", "gauge",
                      "Memory high watermark in bytes", server.memory_limit())
        yield _single("rabbitmq_disk_space_available_bytes", "gauge",
                      "Disk space available in bytes",
                      shutil.disk_usage(server.settings.data_dir).free)
        yield _single("rabbitmq_disk_space_available_limit_bytes", "gauge",
                      "Free disk space low watermark in bytes", server.disk_free_limit())
        yield from server.loop_lag.families()   # quorumqueue's own (loop_lag.py)

    # ------------------------------------------------------------ queues and Raft

    def _queues_here(self) -> list:
        vhosts = self.vhosts
        return [queue for name, vhost in self.server.node.vhosts.items()
                if not vhosts or name in vhosts for queue in vhost.queues.values()]

    def _queues(self) -> Iterator[Metric]:
        served = [q for q in self._queues_here() if q.served_here]
        yield from self._queue_families(served, "rabbitmq_",
                                        [f[0] for f in QUEUE_FAMILIES],
                                        self.view == "per-object")

    def _queue_families(self, queues: list, prefix: str, names: Iterable[str],
                        per_object: bool) -> Iterator[Metric]:
        wanted = set(names)
        for name, kind, documentation, read in QUEUE_FAMILIES:
            if name not in wanted:
                continue
            values = [(queue, read(queue)) for queue in queues]
            if per_object:
                family = _family(prefix + name, kind, documentation, ("vhost", "queue"))
                for queue, number in values:
                    if number is not None:  # not counted by the queue's type
                        family.add_metric([queue.vhost, queue.name], number)
            else:
                family = _family(prefix + name, kind, documentation)
                if all(number is not None for _queue, number in values):
                    family.add_metric([], sum(number for _queue, number in values))
            yield family

    def _leases(self) -> Iterator[Metric]:
        """quorumqueue's own: the leases of the quorum queues this node leads."""
        per_object = self.view == "per-object"
        labels = ("vhost", "queue") if per_object else ()
        count = _family("quorumqueue_leases", "gauge", "Durable leases (the Spark connector's) "
                        "by state: holding, empty, fenced", (*labels, "state"))
        held = _family("quorumqueue_leased_messages", "gauge",
                       "Messages held by durable leases", labels)
        idle = _family("quorumqueue_lease_idle_seconds_max", "gauge",
                       "The longest a durable lease holding messages has been idle", labels)
        now_ms = self.server.node.clock_ms
        totals = {"holding": 0, "empty": 0, "fenced": 0}
        all_held, all_idle = 0, 0.0
        for queue in (q for q in self._queues_here() if q.served_here):
            leases = queue.leases()
            if not leases and per_object:
                continue
            states = {"holding": 0, "empty": 0, "fenced": 0}
            messages, longest = 0, 0.0
            for lease in leases.values():
                states["fenced" if lease.fence is not None else
                       "holding" if len(lease.indexes) else "empty"] += 1
                messages += len(lease.indexes)
                if len(lease.indexes):
                    longest = max(longest, max(0, now_ms - lease.last_active) / 1000)
            if per_object:
                for state, number in states.items():
                    count.add_metric([queue.vhost, queue.name, state], number)
                held.add_metric([queue.vhost, queue.name], messages)
                idle.add_metric([queue.vhost, queue.name], longest)
            for state, number in states.items():
                totals[state] += number
            all_held, all_idle = all_held + messages, max(all_idle, longest)
        if not per_object:
            for state, number in totals.items():
                count.add_metric([state], number)
            held.add_metric([], all_held)
            idle.add_metric([], all_idle)
        yield from (count, held, idle)

    def _raft(self) -> Iterator[Metric]:
        members = [q for q in self._queues_here()
                   if q.REPLICATED and getattr(q, "raft", None) is not None]
        per_object = self.view == "per-object"
        for name, kind, documentation, read, combine in RAFT_FAMILIES:
            if per_object:
                family = _family("rabbitmq_" + name, kind, documentation, ("vhost", "queue"))
                for queue in members:
                    family.add_metric([queue.vhost, queue.name], read(queue))
            else:
                family = _family("rabbitmq_" + name, kind, documentation)
                family.add_metric([], combine([read(queue) for queue in members] or [0]))
            yield family

    def _detailed(self) -> Iterator[Metric]:
        names = [name for family in self.families
                 for name in DETAILED_FAMILIES.get(family, ())]
        if names:
            served = [q for q in self._queues_here() if q.served_here]
            yield from self._queue_families(served, "rabbitmq_detailed_", names, True)

    # ------------------------------------------------------------ connections, messages

    def _connections(self) -> Iterator[Metric]:
        node = self.server.node
        counters = node.counters
        channels = [channel for session in node.sessions
                    for channel in session.channels.values()]
        yield _single("rabbitmq_connections_opened_total", "counter",
                      "Total number of connections opened", counters.connections_opened)
        yield _single("rabbitmq_connections_closed_total", "counter",
                      "Total number of connections closed or terminated",
                      counters.connections_closed)
        yield _single("rabbitmq_channels_opened_total", "counter",
                      "Total number of channels opened", counters.channels_opened)
        yield _single("rabbitmq_channels_closed_total", "counter",
                      "Total number of channels closed", counters.channels_closed)
        yield _single("rabbitmq_connections", "gauge", "Connections currently open",
                      len(self.server.connections))
        yield _single("rabbitmq_channels", "gauge", "Channels currently open",
                      len(channels))
        yield _single("rabbitmq_consumers", "gauge", "Consumers currently connected",
                      sum(len(channel.consumers) for channel in channels))
        yield _single("rabbitmq_queues", "gauge", "Queues available",
                      sum(len(vhost.queues) for vhost in node.vhosts.values()))
        publishers = GaugeMetricFamily("rabbitmq_global_publishers",
                                       "Current number of publishers", labels=["protocol"])
        publishers.add_metric([PROTOCOL], sum(1 for c in channels if c.published))
        yield publishers
        consumers = GaugeMetricFamily("rabbitmq_global_consumers",
                                      "Current number of consumers", labels=["protocol"])
        consumers.add_metric([PROTOCOL], sum(len(c.consumers) for c in channels))
        yield consumers

    def _global(self) -> Iterator[Metric]:
        counters = self.server.node.counters
        for name, documentation, value in (
                ("received", "Total number of messages received from publishers",
                 counters.received),
                ("received_confirm", "Total number of messages received from publishers "
                 "expecting confirmations", counters.received_confirm),
                ("routed", "Total number of messages routed to queues or streams",
                 counters.routed),
                ("unroutable_dropped", "Total number of messages published as "
                 "non-mandatory into an exchange and dropped as unroutable",
                 counters.unroutable_dropped),
                ("unroutable_returned", "Total number of messages published as mandatory "
                 "into an exchange and returned to the publisher as unroutable",
                 counters.unroutable_returned),
                ("confirmed", "Total number of messages confirmed to publishers",
                 counters.confirmed)):
            family = CounterMetricFamily(f"rabbitmq_global_messages_{name}_total",
                                         documentation, labels=["protocol"])
            family.add_metric([PROTOCOL], value)
            yield family
        by_type = {label: counters.of(name) for name, label in QUEUE_TYPES.items()}
        for name, documentation, read in (
                ("delivered", "Total number of messages delivered to consumers",
                 lambda c: c.delivered),
                ("delivered_consume_manual_ack", "Total number of messages delivered to "
                 "consumers using basic.consume with manual acknowledgment",
                 lambda c: c.consume_manual_ack),
                ("delivered_consume_auto_ack", "Total number of messages delivered to "
                 "consumers using basic.consume with automatic acknowledgment",
                 lambda c: c.consume_auto_ack),
                ("delivered_get_manual_ack", "Total number of messages delivered to "
                 "consumers using basic.get with manual acknowledgment",
                 lambda c: c.get_manual_ack),
                ("delivered_get_auto_ack", "Total number of messages delivered to "
                 "consumers using basic.get with automatic acknowledgment",
                 lambda c: c.get_auto_ack),
                ("redelivered", "Total number of messages redelivered to consumers",
                 lambda c: c.redelivered),
                ("acknowledged", "Total number of messages acknowledged by consumers",
                 lambda c: c.acknowledged)):
            family = CounterMetricFamily(f"rabbitmq_global_messages_{name}_total",
                                         documentation, labels=["protocol", "queue_type"])
            for label, type_counters in by_type.items():
                family.add_metric([PROTOCOL, label], read(type_counters))
            yield family

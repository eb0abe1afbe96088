"""Broker configuration: RabbitMQ's key names, in a TOML file, validated once.

RabbitMQ's `rabbitmq.conf` keys are dotted (`vm_memory_high_watermark.relative`),
and TOML reads a dotted key as nested tables, so `conf/broker.toml` uses RabbitMQ's
names verbatim. `load_settings` flattens the file back into dotted keys, refuses
unknown keys and impossible values with a message naming the key, and returns a
frozen `Settings`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import tomllib
from dataclasses import dataclass


from .config_network import NetworkSettings, is_network_key, parse_network
from .config_values import ConfigError, parse_size  # noqa: F401 - re-exported
from .tls import TlsOptions, client_context, parse_tls, server_context


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 5672
    data_dir: str = "data/node"
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    # RabbitMQ 4.0 lowered the default from 128 MiB to 16 MiB (its hard limit is 512 MiB)
    max_message_size: int = 16 * 1024 * 1024
    cluster_name: str = "quorumqueue"
    node_name: str = ""  # default: quorumqueue@<hostname>, like RabbitMQ's rabbit@<hostname>
    default_vhost: str = "/"
    default_user: str = "guest"
    default_pass: str = "guest"
    loopback_users: tuple[str, ...] = ("guest",)
    # memory alarm (docs/behaviour/alarms.md): the node's resident set size
    # (RabbitMQ's default `rss` calculation strategy) against absolute bytes, which win
    # over the relative fraction of total memory (RabbitMQ 4's default: 0.6)
    memory_high_watermark_relative: float = 0.6
    memory_high_watermark_absolute: int = 0
    # what "total memory" is: 0 reads it from the OS, else these bytes (RabbitMQ's
    # total_memory_available_override_value); the relative limits are fractions of it
    total_memory_override: int = 0
    # disk alarm: free bytes on the data directory's file system below the absolute
    # limit or, when only the relative one is set, below that multiple of total memory
    disk_free_limit_absolute: int = 50 * 1000 * 1000
    disk_free_limit_relative: float = 0.0
    memory_calculation_strategy: str = "rss"
    memory_paging_ratio: float = 0.5         # unused since RabbitMQ 4.0, as there
    memory_monitor_interval: int = 2500      # unused since RabbitMQ 4.0, as there
    alarm_check_interval: float = 1.0
    fsync: bool = True
    msg_store_segment_bytes: int = 64 * 1024 * 1024
    # space held back in the data directory (storage/reserve.py) and given back when a
    # write finds the disk full, so that acks, consumers and replication go on while
    # the disk alarm blocks publishers; 0: none
    disk_reserve_bytes: int = 16 * 1024 * 1024
    log_level: str = "info"
    # RabbitMQ 3.13's deprecated-feature switch for classic queue mirroring (default
    # false, as there): true lets ha-* policy keys in (queues/mirroring.py)
    permit_classic_queue_mirroring: bool = False
    # RabbitMQ's mirroring_sync_batch_size: a mirrored queue's synchronisation batch
    # when its policy sets no ha-sync-batch-size (the mirroring guide's "Batch
    # Synchronization"; RabbitMQ's default and bounds)
    mirroring_sync_batch_size: int = 4096
    # the quorum-queue log storage keys (`raft.wal_max_size_bytes`...), as (key, value)
    # pairs; validated by load_settings, turned into a StorageConfig by storage_config()
    raft: tuple = ()
    # clustering (broker/cluster/README.md): this node's inter-node listener
    # (RabbitMQ's distribution port: AMQP port + 20000 unless set), the cluster's
    # nodes as "name@host:port" (every node lists the same set, itself included; empty:
    # a node of its own), the shared secret nodes prove to each other (like Erlang's
    # cookie; empty: read or create ~/.quorumqueue.cookie), and quorum-queue placement
    distribution_port: int = -1
    cluster_nodes: tuple[str, ...] = ()
    cluster_cookie: str = ""
    cluster_join: str = ""               # "name@host:port" of a running node to join
    quorum_initial_cluster_size: int = 3
    queue_leader_locator: str = "client-local"
    # RabbitMQ 3.13's queue_master_locator (client-local, min-masters, random): read
    # for classic queues with classic queue mirroring permitted, where
    # queue_leader_locator is left at client-local (queues/classic.py place)
    queue_master_locator: str = ""
    raft_tick_ms: int = 100
    # client input one group-commit round takes at most (methods; a publish with its
    # content counts once): past it the shell reads no more from clients until the
    # round is taken into a Sync (server/server.py; connections show state "flow")
    flow_round_methods: int = 4096
    # continuous membership reconciliation (the 4.2 guide's CMR; broker/node/membership.py)
    cmr_enabled: bool = False
    cmr_target_group_size: int = 0       # 0: none (per queue: x-quorum-target-group-size)
    cmr_auto_remove: bool = False
    cmr_interval_ms: int = 3_600_000
    cmr_trigger_interval_ms: int = 10_000
    # the metadata group snapshots its state and truncates its log every this many
    # applied entries (broker/node/metadata_snapshot.py; Khepri's default is 4096)
    metadata_snapshot_interval: int = 4096
    # how long a client waits for the metadata group to apply a change it asked for
    # (declare, delete, bind, users, policies...) before it gets an error instead:
    # without a majority the group commits nothing (groups/metadata.py MetaGroup.bounded;
    # RabbitMQ 4's Khepri operations time out after 30 s too)
    metadata_timeout_ms: int = 30_000
    # the 4.2 quorum queues guide's "Options to Relax Property Equivalence Checks": a
    # redeclaration's x-queue-type is not compared (node/handlers.py queue_declare)
    quorum_relaxed_checks_on_redeclaration: bool = False
    # accepted and validated; what they govern is not built yet, and the server logs a
    # warning at start when one is set (NOT_ENFORCED_YET, docs/behaviour/configuration.md)
    quorum_commands_soft_limit: int = 32          # RabbitMQ's default
    # at-least-once dead lettering: the dead letters a queue's dead-letter worker holds
    # unconfirmed at a time (the quorum queues guide, "Dead Lettering"; RabbitMQ's 32)
    dead_letter_worker_consumer_prefetch: int = 32
    # ... and how long its worker waits for a target's confirm (or for a missing
    # exchange or route to appear) before sending a dead letter again (RabbitMQ's
    # dead_letter_worker_publisher_confirm_timeout, in ms; its default)
    dead_letter_worker_publisher_confirm_timeout_ms: int = 180_000
    # the delivery acknowledgement timeout (node/channel.py, the consumers guide's
    # "Delivery Acknowledgement Timeout"): a delivery unacked for longer closes its
    # channel with 406. None: no timeout (RabbitMQ's `undefined`, written
    # consumer_timeout = "undefined" here); queues override it with x-consumer-timeout
    # or a consumer-timeout policy
    consumer_timeout_ms: int | None = 1_800_000   # 30 minutes, RabbitMQ's default
    # how long a durable lease (docs/behaviour/leases.md) may sit idle holding messages
    # before they go back to the queue and the lease is fenced, for a lease.grow that
    # names no timeout_ms (the Spark connector without option leaseTimeout). None: never
    # (lease_timeout = "undefined", as consumer_timeout)
    lease_timeout_ms: int | None = 1_800_000
    # how often each channel checks its oldest unacked delivery against the timeout
    # (RabbitMQ's channel_tick_interval, an advanced.config key: 60000 ms by default);
    # the server's ticker runs every 0.5 s, so shorter values act as 0.5 s
    channel_tick_interval_ms: int = 60_000
    # a node on several cores (docs/design/workers.md): with broker.workers > 1, `broker
    # start` runs a supervisor of that many worker processes (server/workers.py), each a
    # member of a loopback cluster; `worker` is this process's index among them (-1: the
    # node is one process), set by the supervisor's --worker, never by a file
    workers: int = 1
    worker: int = -1
    # the management HTTP API (broker/management/): RabbitMQ's management plugin keys
    # and defaults (loopback only, like the AMQP listener); 0 picks a free port
    management_port: int = 15672
    management_ip: str = "127.0.0.1"
    # how often queue counts are sampled for the API's rates (RabbitMQ's key, ms)
    statistics_interval_ms: int = 5000
    # the Prometheus endpoint (broker/metrics/): rabbitmq_prometheus's port, on
    # loopback unless set (0: a free port, logged). The default port left implicit,
    # found taken, is logged and the node runs without metrics; any other port (or
    # the default one named in the file) must be free, or the node does not start
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 15692
    # AMQP over TLS (docs/behaviour/tls.md): listeners.ssl.default, a port or
    # "host:port" (host "": listeners.tcp.host); None: no TLS listener. Both listeners
    # may run. ssl_options: RabbitMQ's keys, validated (broker/tls.py)
    ssl_host: str = ""
    ssl_port: int | None = None
    ssl_options: TlsOptions = TlsOptions()
    # inter-node TLS (cluster/README.md "TLS between nodes"): quorumqueue's own keys
    # cluster.tls.* (RabbitMQ configures Erlang distribution's TLS outside rabbitmq.conf)
    cluster_tls: TlsOptions = TlsOptions(prefix="cluster.tls")
    # HTTPS for the management API and the Prometheus endpoint: RabbitMQ's
    # management.ssl.* / prometheus.ssl.* keys (port: 15671 / 15691 by convention; None:
    # no TLS listener). The plain listener keeps running beside it. The host is the
    # group's .ip key, else the plain listener's.
    management_ssl_port: int | None = None
    management_ssl_ip: str = ""
    management_ssl: TlsOptions = TlsOptions(prefix="management.ssl")
    prometheus_ssl_port: int | None = None
    prometheus_ssl_ip: str = ""
    prometheus_ssl: TlsOptions = TlsOptions(prefix="prometheus.ssl")
    # the management API's response headers and CORS (config_network.py: RabbitMQ's
    # keys management.csp.policy, management.cors.allow_origins ...)
    network: NetworkSettings = NetworkSettings()
    configured_keys: frozenset = frozenset()      # the keys the configuration file set

    @property
    def cluster_port(self) -> int:
        if self.distribution_port >= 0:
            return self.distribution_port
        return self.port + 20000 if self.port else 0

    @property
    def clustered(self) -> bool:
        return bool(self.cluster_nodes or self.cluster_join)

    def cluster_peers(self) -> dict[str, tuple[str, int]]:
        """{node name: (host, port)} of every node in cluster_nodes, this one included
        (a node joining with --join: itself, at its name's host and cluster_port, and
        the node it joins through)."""
        peers = dict(parse_cluster_node("cluster_formation.classic_config.nodes", item)
                     for item in self.cluster_nodes)
        if self.cluster_join:
            name, address = parse_cluster_node("--join", self.cluster_join)
            peers.setdefault(name, address)
            peers.setdefault(self.node_name, (self.node_name.partition("@")[2],
                                              self.cluster_port))
        return peers

    def total_memory(self, from_os: int) -> int:
        """Total memory as the alarms see it: the override if set, else the OS's."""
        return self.total_memory_override or from_os

    def memory_limit(self, total_memory: int) -> int:
        """The memory alarm's limit in bytes (RabbitMQ: an absolute limit wins)."""
        if self.memory_high_watermark_absolute:
            return self.memory_high_watermark_absolute
        return int(total_memory * self.memory_high_watermark_relative)

    def disk_free_limit(self, total_memory: int) -> int:
        """The disk alarm's limit in free bytes: disk_free_limit.relative times total
        memory when it is set, unless disk_free_limit.absolute is set too (then the
        absolute one wins, as RabbitMQ's configuration schema says)."""
        if self.disk_free_limit_relative and (
                "disk_free_limit.absolute" not in self.configured_keys):
            return round(self.disk_free_limit_relative * total_memory)
        return self.disk_free_limit_absolute

    def storage_config(self):
        from .raft.storage.config import StorageConfig

        return StorageConfig.from_mapping(dict(self.raft), fsync=self.fsync)


# dotted RabbitMQ key -> (Settings field, converter)
def _int(key, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    return value


# where a node of broker.workers gives its workers their cookie (server/workers.py)
WORKER_COOKIE_ENV = "QUORUMQUEUE_WORKER_COOKIE"


def _workers(key, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key}: expected a number of worker processes, at least 1, "
                          f"got {value!r}")
    return value


def _str(key, value):
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _bool(key, value):
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    return value


def _fraction(key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(f"{key}: expected a fraction in (0, 1], got {value!r}")
    return float(value)


def _sync_batch_size(key, value):
    # rabbit.schema's validator: "Batch size should be greater than 0 and less than 1M"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 1_000_000:
        raise ConfigError(f"{key}: batch size should be greater than 0 and less than 1M, "
                          f"got {value!r}")
    return value


def _positive_number(key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{key}: expected a positive number, got {value!r}")
    return float(value)


def _memory_strategy(key, value):
    # RabbitMQ's other strategies (allocated, erlang, legacy) measure the Erlang VM's
    # allocators, which a Python process does not have
    if value != "rss":
        raise ConfigError(f"{key}: only \"rss\" (the process's resident set size, "
                          f"RabbitMQ's default) is supported, got {value!r}")
    return value


def _deprecated_number(key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    return value


def _users(key, value):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: expected a list of user names, got {value!r}")
    return tuple(value)


def parse_cluster_node(key: str, value: str) -> tuple[str, tuple[str, int]]:
    """"name@host:port" -> (name, (host, port)); the name is the node's `node_name`."""
    match = re.fullmatch(r"([^@\s:/]+@([^@\s:/]+)):(\d+)", value) if isinstance(value, str) else None
    if match is None or not 0 < int(match.group(3)) < 65536:
        raise ConfigError(f"{key}: expected \"name@host:port\" (the node's name and its "
                          f"inter-node address), got {value!r}")
    return match.group(1), (match.group(2), int(match.group(3)))


def _nodes(key, value):
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: expected a list of \"name@host:port\", got {value!r}")
    for item in value:
        parse_cluster_node(key, item)
    return tuple(value)


def _ms_or_undefined(key, value):
    # RabbitMQ: a positive integer in rabbitmq.conf; `undefined` (advanced.config) turns
    # the timeout off, which its guide advises against
    if value == "undefined":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: expected an integer (milliseconds) or \"undefined\" (no "
                          f"timeout), got {value!r}")
    return value


def _listener(key, value) -> tuple[str, int]:
    """RabbitMQ's listener value: a port, or "ip:port" ("[::1]:5671" for IPv6)."""
    host, port = "", value
    if isinstance(value, str):
        match = re.fullmatch(r"\[?([^\[\]]*?)\]?:(\d+)", value.strip())
        if match is None:
            raise ConfigError(f"{key}: expected a port or \"ip:port\", got {value!r}")
        host, port = match.group(1), int(match.group(2))
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"{key}: expected a port in 0..65535 or \"ip:port\", got {value!r}")
    return host, port


def _master_locator(key, value):
    if value not in ("client-local", "min-masters", "random"):
        raise ConfigError(f"{key}: expected \"client-local\", \"min-masters\" or "
                          f"\"random\", got {value!r}")
    return value


def _locator(key, value):
    if value not in ("client-local", "balanced"):
        raise ConfigError(f"{key}: expected \"client-local\" or \"balanced\", got {value!r}")
    return value


KEYS = {
    "listeners.tcp.host": ("host", _str),
    "listeners.tcp.default": ("port", _int),
    "listeners.ssl.default": ("ssl_listener", _listener),
    "data_dir": ("data_dir", _str),
    "frame_max": ("frame_max", _int),
    "channel_max": ("channel_max", _int),
    "heartbeat": ("heartbeat", _int),
    "max_message_size": ("max_message_size", parse_size),
    "cluster_name": ("cluster_name", _str),
    "node_name": ("node_name", _str),
    "default_vhost": ("default_vhost", _str),
    "default_user": ("default_user", _str),
    "default_pass": ("default_pass", _str),
    "loopback_users": ("loopback_users", _users),
    "vm_memory_high_watermark.relative": ("memory_high_watermark_relative", _fraction),
    "vm_memory_high_watermark.absolute": ("memory_high_watermark_absolute", parse_size),
    "disk_free_limit.absolute": ("disk_free_limit_absolute", parse_size),
    "disk_free_limit.relative": ("disk_free_limit_relative", _positive_number),
    "total_memory_available_override_value": ("total_memory_override", parse_size),
    "vm_memory_calculation_strategy": ("memory_calculation_strategy", _memory_strategy),
    # deprecated and unused since RabbitMQ 4.0 (its schema says so): accepted, no effect
    "vm_memory_high_watermark_paging_ratio": ("memory_paging_ratio", _deprecated_number),
    "memory_monitor_interval": ("memory_monitor_interval", _deprecated_number),
    "alarm_check_interval": ("alarm_check_interval", lambda k, v: float(_int(k, v))
                             if isinstance(v, int) else v),
    "storage.fsync": ("fsync", _bool),
    "storage.msg_store_segment_bytes": ("msg_store_segment_bytes", parse_size),
    "storage.disk_reserve": ("disk_reserve_bytes", parse_size),
    "log.level": ("log_level", _str),
    "deprecated_features.permit.classic_queue_mirroring":
        ("permit_classic_queue_mirroring", _bool),
    "mirroring_sync_batch_size": ("mirroring_sync_batch_size", _sync_batch_size),
    "distribution.listener.port": ("distribution_port", _int),
    "cluster_formation.classic_config.nodes": ("cluster_nodes", _nodes),
    "cluster.cookie": ("cluster_cookie", _str),
    "quorum_queue.initial_cluster_size": ("quorum_initial_cluster_size", _int),
    "queue_leader_locator": ("queue_leader_locator", _locator),
    "queue_master_locator": ("queue_master_locator", _master_locator),
    "raft.tick_interval_ms": ("raft_tick_ms", _int),
    "flow_control.round_methods": ("flow_round_methods", _int),
    "quorum_queue.continuous_membership_reconciliation.enabled": ("cmr_enabled", _bool),
    "quorum_queue.continuous_membership_reconciliation.target_group_size":
        ("cmr_target_group_size", _int),
    "quorum_queue.continuous_membership_reconciliation.auto_remove": ("cmr_auto_remove", _bool),
    "quorum_queue.continuous_membership_reconciliation.interval": ("cmr_interval_ms", _int),
    "quorum_queue.continuous_membership_reconciliation.trigger_interval":
        ("cmr_trigger_interval_ms", _int),
    "metadata_store.snapshot_interval": ("metadata_snapshot_interval", _int),
    "metadata_store.operation_timeout": ("metadata_timeout_ms", _int),
    "quorum_queue.property_equivalence.relaxed_checks_on_redeclaration":
        ("quorum_relaxed_checks_on_redeclaration", _bool),
    "quorum_queue.commands_soft_limit": ("quorum_commands_soft_limit", _int),
    "dead_letter_worker_consumer_prefetch": ("dead_letter_worker_consumer_prefetch", _int),
    "dead_letter_worker_publisher_confirm_timeout":
        ("dead_letter_worker_publisher_confirm_timeout_ms", _int),
    "consumer_timeout": ("consumer_timeout_ms", _ms_or_undefined),
    "lease_timeout": ("lease_timeout_ms", _ms_or_undefined),
    "channel_tick_interval": ("channel_tick_interval_ms", _int),
    "broker.workers": ("workers", _workers),
    "management.tcp.port": ("management_port", _int),
    "management.tcp.ip": ("management_ip", _str),
    "collect_statistics_interval": ("statistics_interval_ms", _int),
    "prometheus.tcp.ip": ("prometheus_host", _str),
    "prometheus.tcp.port": ("prometheus_port", _int),
}

# keys accepted and validated whose effect is not built yet: (key, Settings field,
# what they will govern). The server logs a warning naming each one a file sets, so
# nobody takes it for applied.
NOT_ENFORCED_YET = (
    ("quorum_queue.commands_soft_limit", "quorum_commands_soft_limit",
     "the unconfirmed quorum-queue commands a channel may have before it is throttled "
     "(credit flow): quorumqueue does not throttle publishers per channel"),
)


def _flatten(table: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def validate(settings: Settings) -> Settings:
    if not 0 <= settings.port <= 65535:
        raise ConfigError(f"listeners.tcp.default: port {settings.port} is not in 0..65535")
    if settings.statistics_interval_ms <= 0:
        raise ConfigError(f"collect_statistics_interval: expected a positive number of "
                          f"milliseconds, got {settings.statistics_interval_ms}")
    if not 0 <= settings.management_port <= 65535:
        raise ConfigError(f"management.tcp.port: port {settings.management_port} is not in "
                          "0..65535")
    if settings.disk_reserve_bytes < 0:
        raise ConfigError(f"storage.disk_reserve: expected a size of 0 or more, got "
                          f"{settings.disk_reserve_bytes}")
    if not 8192 <= settings.frame_max <= 2 ** 31:
        raise ConfigError(f"frame_max: {settings.frame_max} is outside 8192..2147483648")
    if not 1 <= settings.channel_max <= 65535:
        raise ConfigError(f"channel_max: {settings.channel_max} is outside 1..65535")
    if not 0 <= settings.heartbeat <= 65535:
        raise ConfigError(f"heartbeat: {settings.heartbeat} is outside 0..65535 seconds")
    if not 0 < settings.max_message_size <= 512 * 1024 * 1024:
        raise ConfigError("max_message_size: must be between 1 byte and 512MiB "
                          f"(RabbitMQ's hard limit), got {settings.max_message_size}")
    if not 0 <= settings.prometheus_port <= 65535:
        raise ConfigError(f"prometheus.tcp.port: port {settings.prometheus_port} is not in "
                          "0..65535")
    if not -1 <= settings.distribution_port <= 65535:
        raise ConfigError(f"distribution.listener.port: {settings.distribution_port} is not "
                          "in 0..65535")
    if settings.cluster_join:
        if not re.fullmatch(r"[^@\s:/]+@[^@\s:/]+", settings.node_name):
            raise ConfigError(f"node_name: a node joining a cluster needs a name@host name "
                              f"(its host is where the others reach it), got "
                              f"{settings.node_name!r}")
        if settings.cluster_port == 0:
            raise ConfigError("distribution.listener.port: a node joining a cluster needs "
                              "a fixed inter-node port, not 0")
        settings.cluster_peers()
    if settings.cluster_nodes:
        peers = settings.cluster_peers()
        if len(peers) != len(settings.cluster_nodes):
            raise ConfigError("cluster_formation.classic_config.nodes: a node is listed twice")
        if settings.node_name not in peers:
            raise ConfigError(f"cluster_formation.classic_config.nodes: this node "
                              f"({settings.node_name}) is not in the list "
                              f"({', '.join(peers)}); set node_name to one of them")
    if settings.quorum_initial_cluster_size < 1:
        raise ConfigError("quorum_queue.initial_cluster_size: must be at least 1, got "
                          f"{settings.quorum_initial_cluster_size}")
    for key, value in (("target_group_size", settings.cmr_target_group_size),
                       ("interval", settings.cmr_interval_ms),
                       ("trigger_interval", settings.cmr_trigger_interval_ms)):
        if value < (0 if key == "target_group_size" else 1):
            raise ConfigError(f"quorum_queue.continuous_membership_reconciliation.{key}: "
                              f"must be a positive integer, got {value}")
    for key, value in (("quorum_queue.commands_soft_limit",
                        settings.quorum_commands_soft_limit),
                       ("dead_letter_worker_consumer_prefetch",
                        settings.dead_letter_worker_consumer_prefetch),
                       ("dead_letter_worker_publisher_confirm_timeout",
                        settings.dead_letter_worker_publisher_confirm_timeout_ms),
                       ("consumer_timeout", 1 if settings.consumer_timeout_ms is None
                        else settings.consumer_timeout_ms),
                       ("lease_timeout", 1 if settings.lease_timeout_ms is None
                        else settings.lease_timeout_ms),
                       ("channel_tick_interval", settings.channel_tick_interval_ms),
                       ("flow_control.round_methods", settings.flow_round_methods)):
        if value < 1:
            raise ConfigError(f"{key}: must be a positive integer, got {value}")
    if settings.metadata_timeout_ms < 1:
        raise ConfigError("metadata_store.operation_timeout: must be a positive number of "
                          f"milliseconds, got {settings.metadata_timeout_ms}")
    if settings.metadata_snapshot_interval < 1:
        raise ConfigError("metadata_store.snapshot_interval: must be a positive integer, got "
                          f"{settings.metadata_snapshot_interval}")
    if not 10 <= settings.raft_tick_ms <= 10000:
        raise ConfigError(f"raft.tick_interval_ms: {settings.raft_tick_ms} is outside "
                          "10..10000")
    if settings.ssl_port is not None:
        server_context(settings.ssl_options)  # reads the files: missing or wrong fail now
        if settings.ssl_port and settings.ssl_port == settings.port and (
                (settings.ssl_host or settings.host) == settings.host):
            raise ConfigError(f"listeners.ssl.default: port {settings.ssl_port} is also "
                              "listeners.tcp.default's")
    elif settings.ssl_options.configured:
        server_context(settings.ssl_options)
    if settings.cluster_tls.configured:
        _cluster_contexts(settings.cluster_tls)
    for group, port in (("management", settings.management_ssl_port),
                        ("prometheus", settings.prometheus_ssl_port)):
        options = getattr(settings, f"{group}_ssl")
        if port is not None:
            if not 0 <= port <= 65535:
                raise ConfigError(f"{group}.ssl.port: port {port} is not in 0..65535")
            if not options.certfile:
                raise ConfigError(f"{group}.ssl.certfile: an HTTPS listener needs a "
                                  f"certificate (and {group}.ssl.keyfile)")
            plain = settings.management_port if group == "management" \
                else settings.prometheus_port
            if port and port == plain:
                raise ConfigError(f"{group}.ssl.port: port {port} is also "
                                  f"{group}.tcp.port's")
            server_context(options)   # reads the files: missing or wrong fail now
        elif options.configured:
            raise ConfigError(f"{group}.ssl.port: {group}.ssl.* keys are set but no "
                              f"port; set {group}.ssl.port (RabbitMQ uses "
                              f"{15671 if group == 'management' else 15691})")
    settings.storage_config()  # refuses unknown or impossible raft.* values, naming the key
    if settings.log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log.level: {settings.log_level!r} is not one of debug, info, "
                          "warning, error")
    return settings


def _cluster_contexts(options: TlsOptions):
    """(server, client) contexts of the inter-node transport: a node presents its
    certificate both ways and, with verify_peer (the default), each side checks the
    other's against cluster.tls.cacertfile and refuses a peer without one. The CA is
    the identity: names are not checked (a node's address may be a proxy's)."""
    if not options.certfile:
        raise ConfigError("cluster.tls.certfile: inter-node TLS needs each node's "
                          "certificate (and cluster.tls.keyfile)")
    server = server_context(dataclasses.replace(
        options, fail_if_no_peer_cert=options.verify_peer))
    return server, client_context(options, check_hostname=False)


def cluster_tls_contexts(settings: Settings):
    """(server, client) ssl contexts for the inter-node transport, or (None, None)."""
    if not settings.cluster_tls.configured:
        return None, None
    return _cluster_contexts(settings.cluster_tls)


def http_ssl_context(settings: Settings, group: str):
    """The HTTPS listener's context of `group` ("management" | "prometheus") when its
    ssl.port is set, else None."""
    if getattr(settings, f"{group}_ssl_port") is None:
        return None
    return server_context(getattr(settings, f"{group}_ssl"))


def ssl_listener_context(settings: Settings):
    """The AMQP TLS listener's context (listeners.ssl.default set), else None."""
    return None if settings.ssl_port is None else server_context(settings.ssl_options)


def load_settings(path: str | None = None, **overrides) -> Settings:
    """Settings from a TOML file (optional) plus explicit overrides (CLI flags)."""
    values: dict = {}
    if path is not None:
        if not os.path.exists(path):
            raise ConfigError(f"config file {path} does not exist")
        with open(path, "rb") as handle:
            try:
                document = tomllib.load(handle)
            except tomllib.TOMLDecodeError as error:
                raise ConfigError(f"{path}: {error}") from None
        raft, ssl_pairs, cluster_tls, network = [], [], [], []
        http_tls: dict = {"management": [], "prometheus": []}
        for key, value in _flatten(document).items():
            if is_network_key(key):
                network.append((key, value))
                continue
            group = key.split(".", 1)[0]
            if group in http_tls and key.startswith(f"{group}.ssl."):
                if key == f"{group}.ssl.port":
                    values[f"{group}_ssl_port"] = _int(key, value)
                elif key == f"{group}.ssl.ip":
                    values[f"{group}_ssl_ip"] = _str(key, value)
                else:
                    http_tls[group].append((key, value))
                continue
            if key.startswith("raft.") and key not in KEYS:
                raft.append((key, value))
                continue
            if key.startswith("ssl_options."):
                ssl_pairs.append((key, value))
                continue
            if key.startswith("cluster.tls."):
                cluster_tls.append((key, value))
                continue
            if key not in KEYS:
                raise ConfigError(f"{path}: unknown key '{key}' (known keys: "
                                  f"{', '.join(sorted(KEYS))}, and raft.*, "
                                  "ssl_options.*, cluster.tls.*, management.ssl.*, "
                                  "prometheus.ssl.*, management.cors.*, "
                                  "management.headers.*)")
            name, convert = KEYS[key]
            values[name] = convert(key, value)
        if "ssl_listener" in values:
            values["ssl_host"], values["ssl_port"] = values.pop("ssl_listener")
        values["ssl_options"] = parse_tls("ssl_options", ssl_pairs)
        cluster = parse_tls("cluster.tls", cluster_tls, server=False)
        if cluster_tls and not any(k == "cluster.tls.verify" for k, _ in cluster_tls):
            cluster = dataclasses.replace(cluster, verify_peer=True)  # the default here
            if not cluster.cacertfile:
                raise ConfigError("cluster.tls.cacertfile: inter-node TLS checks every "
                                  "peer's certificate against this CA (or set "
                                  "cluster.tls.verify = verify_none)")
        values["cluster_tls"] = cluster
        for group, pairs in http_tls.items():
            values[f"{group}_ssl"] = parse_tls(f"{group}.ssl", pairs)
        if raft:
            values["raft"] = tuple(raft)
        values["network"] = parse_network(network)
        values["configured_keys"] = frozenset(_flatten(document))
    values.update({k: v for k, v in overrides.items() if v is not None})
    if not values.get("node_name"):
        values["node_name"] = f"quorumqueue@{socket.gethostname()}"
    return validate(Settings(**values))


def replace(settings: Settings, **changes) -> Settings:
    return validate(dataclasses.replace(settings, **changes))


def precedence_warnings(settings: Settings) -> list[str]:
    """RabbitMQ's warnings for a file that sets both forms of one limit."""
    keys = settings.configured_keys
    return [f"Both {name}.absolute and {name}.relative are configured. {name}.absolute "
            "has precedence" for name in ("vm_memory_high_watermark", "disk_free_limit")
            if {f"{name}.absolute", f"{name}.relative"} <= keys]


def not_enforced_yet(settings: Settings) -> list[str]:
    """A warning for each key the configuration set whose effect is not built yet."""
    return [f"{key} = {getattr(settings, field)} is accepted but has no effect yet: {what}"
            for key, field, what in NOT_ENFORCED_YET if key in settings.configured_keys]


__all__ = ["Settings", "ConfigError", "load_settings", "replace", "parse_size"]

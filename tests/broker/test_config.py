"""Broker configuration: RabbitMQ key names in TOML, validated once at start."""

import pytest

from quorumqueue.broker.config import ConfigError, Settings, load_settings, parse_size


def write(tmp_path, text):
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return str(path)


def test_shipped_config_loads_with_rabbitmq_key_names():
    settings = load_settings("conf/broker.toml")
    assert settings.port == 5672
    assert settings.heartbeat == 60
    assert settings.max_message_size == 16 * 1024 * 1024  # RabbitMQ 4.0's default
    assert settings.disk_free_limit_absolute == 50_000_000
    assert settings.memory_high_watermark_relative == 0.6
    assert settings.loopback_users == ("guest",)
    storage = settings.storage_config()
    assert (storage.wal_max_size_bytes, storage.segment_max_entries) == (512 * 1024 ** 2, 4096)


def test_raft_keys_reach_the_log_storage(tmp_path):
    settings = load_settings(write(tmp_path, "storage.fsync = false\n[raft]\n"
                                             "wal_max_size_bytes = \"64MB\"\n"
                                             "segment_max_entries = 65535\n"))
    storage = settings.storage_config()
    assert storage.wal_max_size_bytes == 64_000_000
    assert storage.segment_max_entries == 65535
    assert storage.fsync is False


def test_segment_max_entries_above_65535_stops_the_broker_at_startup(tmp_path):
    import subprocess

    from tests.cli.test_cli import CLI

    config = write(tmp_path, "raft.segment_max_entries = 100000\n")
    result = subprocess.run(CLI + ["broker", "start", "--config", config, "--port", "0",
                                   "--data-dir", str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "raft.segment_max_entries: values above 65535 are not supported" in result.stderr


def test_dotted_keys_read_as_rabbitmq_writes_them(tmp_path):
    settings = load_settings(write(tmp_path, 'listeners.tcp.default = 5999\n'
                                             'vm_memory_high_watermark.absolute = "2GiB"\n'))
    assert settings.port == 5999
    assert settings.memory_high_watermark_absolute == 2 * 1024 ** 3


def test_cli_overrides_win_over_the_file(tmp_path):
    settings = load_settings(write(tmp_path, "listeners.tcp.default = 5999\n"), port=6000,
                             data_dir=None)
    assert settings.port == 6000
    assert settings.data_dir == Settings().data_dir


@pytest.mark.parametrize("text, key", [
    ("listeners.tcp.defualt = 5672\n", "listeners.tcp.defualt"),
    ("frame_max = 4096\n", "frame_max"),
    ("heartbeat = \"soon\"\n", "heartbeat"),
    ("max_message_size = \"1TB\"\n", "max_message_size"),
    ("max_message_size = \"lots\"\n", "max_message_size"),
    ("vm_memory_high_watermark.relative = 1.5\n", "vm_memory_high_watermark.relative"),
    ("channel_max = 0\n", "channel_max"),
    ("disk_free_limit.relative = 0\n", "disk_free_limit.relative"),
    ("disk_free_limit.relative = \"2GB\"\n", "disk_free_limit.relative"),
    ("vm_memory_calculation_strategy = \"allocated\"\n", "vm_memory_calculation_strategy"),
    ("total_memory_available_override_value = \"lots\"\n",
     "total_memory_available_override_value"),
    ("storage.fsync = \"yes\"\n", "storage.fsync"),
    ("raft.segment_max_entries = 65536\n", "raft.segment_max_entries"),
    ("raft.segment_max_entries = 0\n", "raft.segment_max_entries"),
    ("raft.wal_max_size_bytes = \"huge\"\n", "raft.wal_max_size_bytes"),
    ("raft.wal_max_batch_sise = 10\n", "raft.wal_max_batch_sise"),
])
def test_impossible_settings_fail_naming_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(write(tmp_path, text))


def test_missing_file_and_bad_toml_are_reported(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="broker.toml"):
        load_settings(write(tmp_path, "frame_max = = 1\n"))


@pytest.mark.parametrize("value, expected", [
    (1024, 1024), ("50MB", 50_000_000), ("1GiB", 1024 ** 3), ("512kb", 512_000), ("7", 7),
])
def test_sizes_use_rabbitmqs_units(value, expected):
    assert parse_size("k", value) == expected


RABBITMQ_42_KEYS = ('quorum_queue.property_equivalence.relaxed_checks_on_redeclaration = true\n'
                    'quorum_queue.commands_soft_limit = 512\n'
                    'dead_letter_worker_consumer_prefetch = 64\n'
                    'dead_letter_worker_publisher_confirm_timeout = 5000\n'
                    'consumer_timeout = 900000\n')


def test_rabbitmq_42_keys_are_accepted_with_their_values(tmp_path):
    settings = load_settings(write(tmp_path, RABBITMQ_42_KEYS))
    assert settings.quorum_relaxed_checks_on_redeclaration is True
    assert settings.quorum_commands_soft_limit == 512
    assert settings.dead_letter_worker_consumer_prefetch == 64
    assert settings.dead_letter_worker_publisher_confirm_timeout_ms == 5000
    assert settings.consumer_timeout_ms == 900_000
    defaults = Settings()  # RabbitMQ's defaults
    assert (defaults.quorum_relaxed_checks_on_redeclaration, defaults.quorum_commands_soft_limit,
            defaults.dead_letter_worker_consumer_prefetch,
            defaults.dead_letter_worker_publisher_confirm_timeout_ms,
            defaults.consumer_timeout_ms) == (False, 32, 32, 180_000, 1_800_000)


@pytest.mark.parametrize("text, message", [
    ("quorum_queue.property_equivalence.relaxed_checks_on_redeclaration = 1\n",
     "relaxed_checks_on_redeclaration: expected true or false"),
    ("quorum_queue.commands_soft_limit = 0\n",
     "quorum_queue.commands_soft_limit: must be a positive integer"),
    ("dead_letter_worker_consumer_prefetch = -1\n",
     "dead_letter_worker_consumer_prefetch: must be a positive integer"),
    ("dead_letter_worker_publisher_confirm_timeout = 0\n",
     "dead_letter_worker_publisher_confirm_timeout: must be a positive integer"),
    ('consumer_timeout = "30m"\n', "consumer_timeout: expected an integer"),
    ("consumer_timeout = 0\n", "consumer_timeout: must be a positive integer"),
    ("channel_tick_interval = 0\n", "channel_tick_interval: must be a positive integer"),
    ("flow_control.round_methods = 0\n", "flow_control.round_methods: must be a positive "
     "integer"),
])
def test_rabbitmq_42_keys_are_validated(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(write(tmp_path, text))


def test_keys_without_an_effect_yet_are_named_in_a_warning_at_start(tmp_path):
    from tests.support.broker import BrokerProcess

    with BrokerProcess(data_dir=str(tmp_path), extra_config=RABBITMQ_42_KEYS) as broker:
        log = broker.log()
    assert "quorum_queue.commands_soft_limit = 512 is accepted but has no effect yet" in log
    # applied: nothing to warn of
    assert "relaxed_checks_on_redeclaration" not in log
    assert "dead_letter_worker_consumer_prefetch" not in log
    # the consumer timeout is enforced (node/channel.py): no such warning for it
    assert "consumer_timeout = 900000 is accepted" not in log


def test_consumer_timeout_undefined_turns_the_timeout_off(tmp_path):
    # RabbitMQ's `{consumer_timeout, undefined}` (advanced.config)
    settings = load_settings(write(tmp_path, 'consumer_timeout = "undefined"\n'))
    assert settings.consumer_timeout_ms is None


def test_the_metadata_operation_timeout_is_read_and_validated(tmp_path):
    assert Settings().metadata_timeout_ms == 30_000
    settings = load_settings(write(tmp_path, "metadata_store.operation_timeout = 5000\n"))
    assert settings.metadata_timeout_ms == 5000
    with pytest.raises(ConfigError, match="metadata_store.operation_timeout: must be a "
                                          "positive number of milliseconds"):
        load_settings(write(tmp_path, "metadata_store.operation_timeout = 0\n"))


def test_defaults_are_rabbitmq_4s():
    """RabbitMQ 4's rabbit application defaults: max_message_size 16 MiB (4.0 lowered
    it from 128 MiB), vm_memory_high_watermark 0.6, disk_free_limit 50 MB, rss."""
    settings = Settings()
    assert settings.max_message_size == 16_777_216
    assert settings.memory_high_watermark_relative == 0.6
    assert settings.disk_free_limit(total_memory=8 * 1024 ** 3) == 50_000_000
    assert settings.memory_limit(total_memory=1000) == 600
    assert settings.memory_calculation_strategy == "rss"


def test_disk_free_limit_relative_is_a_multiple_of_total_memory(tmp_path):
    """The disk alarms guide, "Configuring Disk Free Space Limit": disk_free_limit.relative
    is relative to the RAM installed (RabbitMQ: round(Relative * total memory))."""
    settings = load_settings(write(tmp_path, "disk_free_limit.relative = 1.5\n"))
    assert settings.disk_free_limit(total_memory=2_000_000_000) == 3_000_000_000
    overridden = load_settings(write(tmp_path, "disk_free_limit.relative = 2.0\n"
                                               "total_memory_available_override_value = "
                                               "\"1GiB\"\n"))
    assert overridden.disk_free_limit(overridden.total_memory(64 * 1024 ** 3)) == 2 * 1024 ** 3
    assert overridden.memory_limit(overridden.total_memory(64 * 1024 ** 3)) == int(
        0.6 * 1024 ** 3)


def test_absolute_limits_win_over_relative_ones_with_rabbitmqs_warning(tmp_path):
    """RabbitMQ's schema: both set, the absolute one has precedence, with a warning."""
    from quorumqueue.broker.config import precedence_warnings

    settings = load_settings(write(tmp_path, "disk_free_limit.relative = 3.0\n"
                                             "disk_free_limit.absolute = \"1GB\"\n"
                                             "vm_memory_high_watermark.relative = 0.5\n"
                                             "vm_memory_high_watermark.absolute = 1000\n"))
    assert settings.disk_free_limit(total_memory=10 ** 12) == 1_000_000_000
    assert settings.memory_limit(total_memory=10 ** 12) == 1000
    assert precedence_warnings(settings) == [
        "Both vm_memory_high_watermark.absolute and vm_memory_high_watermark.relative are "
        "configured. vm_memory_high_watermark.absolute has precedence",
        "Both disk_free_limit.absolute and disk_free_limit.relative are configured. "
        "disk_free_limit.absolute has precedence"]
    assert precedence_warnings(load_settings(write(tmp_path, "disk_free_limit.relative = "
                                                             "1.0\n"))) == []


def test_rabbitmq_4s_deprecated_memory_keys_are_accepted(tmp_path):
    """vm_memory_high_watermark_paging_ratio and memory_monitor_interval are "not used
    since RabbitMQ 4.0" (its schema) but still accepted there; here too."""
    settings = load_settings(write(tmp_path, "vm_memory_high_watermark_paging_ratio = 0.75\n"
                                             "memory_monitor_interval = 1000\n"
                                             "vm_memory_calculation_strategy = \"rss\"\n"))
    assert (settings.memory_paging_ratio, settings.memory_monitor_interval) == (0.75, 1000)


def test_management_keys_are_rabbitmqs_and_checked(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text('management.tcp.port = 15999\nmanagement.tcp.ip = "0.0.0.0"\n')
    settings = load_settings(str(path))
    assert (settings.management_port, settings.management_ip) == (15999, "0.0.0.0")
    assert (load_settings().management_port, load_settings().management_ip) == (
        15672, "127.0.0.1")
    path.write_text("management.tcp.port = 70000\n")
    with pytest.raises(ConfigError, match="management.tcp.port: port 70000"):
        load_settings(str(path))


def test_connection_timeouts_take_rabbitmq_s_keys_and_defaults(tmp_path):
    """handshake_timeout (ms, or infinity) and the HTTP listeners' request_timeout
    (Cowboy's 5 s); impossible values name the key."""
    network = load_settings().network
    assert (network.handshake_timeout_ms, network.management_request_timeout_ms,
            network.prometheus_request_timeout_ms) == (10_000, 5_000, 5_000)
    network = load_settings(write(tmp_path, 'handshake_timeout = "infinity"\n'
                                            "management.tcp.request_timeout = 700\n"
                                            "prometheus.tcp.request_timeout = 800\n")).network
    assert (network.handshake_timeout_ms, network.management_request_timeout_ms,
            network.prometheus_request_timeout_ms) == (0, 700, 800)
    for text in ("handshake_timeout = 0\n", 'handshake_timeout = "10s"\n',
                 "management.tcp.request_timeout = -1\n"):
        with pytest.raises(ConfigError, match=text.split(" =")[0]):
            load_settings(write(tmp_path, text))


def test_http_idle_and_inactivity_timeouts_take_rabbitmq_s_keys_and_cowboy_s_defaults(tmp_path):
    """management.tcp.idle_timeout / inactivity_timeout and Prometheus's (Cowboy 2.8's
    60000 and 300000 ms: RabbitMQ 3.10.8 sets none of its own)."""
    from quorumqueue.broker.config_network import http_timeouts

    network = load_settings().network
    assert http_timeouts(network, "management") == http_timeouts(network, "prometheus")
    assert (http_timeouts(network, "management").request,
            http_timeouts(network, "management").idle,
            http_timeouts(network, "management").inactivity) == (5.0, 60.0, 300.0)
    network = load_settings(write(tmp_path, "management.tcp.idle_timeout = 700\n"
                                            "management.tcp.inactivity_timeout = 900\n"
                                            "prometheus.tcp.idle_timeout = 800\n"
                                            "prometheus.tcp.inactivity_timeout = 1000\n")
                            ).network
    assert (http_timeouts(network, "management").idle,
            http_timeouts(network, "management").inactivity,
            http_timeouts(network, "prometheus").idle,
            http_timeouts(network, "prometheus").inactivity) == (0.7, 0.9, 0.8, 1.0)
    for text in ("management.tcp.idle_timeout = 0\n",
                 'prometheus.tcp.inactivity_timeout = "5m"\n'):
        with pytest.raises(ConfigError, match=text.split(" =")[0]):
            load_settings(write(tmp_path, text))


def test_ssl_handshake_timeout_is_rabbitmq_s_key(tmp_path):
    assert load_settings().network.ssl_handshake_timeout_ms == 5000
    assert load_settings(write(tmp_path, "ssl_handshake_timeout = 1500\n")
                         ).network.ssl_handshake_timeout_ms == 1500

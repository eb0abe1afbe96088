"""StorageConfig: RabbitMQ's key names and defaults, refused values name the key
(quorum-queue guide: "Resources that Quorum Queues Use", "Tuning: Raft segment file
entry count")."""

from __future__ import annotations

import pytest

from quorumqueue.broker.config import ConfigError
from quorumqueue.broker.raft.storage import LogStore, StorageConfig


def test_defaults_follow_rabbitmq():
    config = StorageConfig()
    assert config.wal_max_size_bytes == 512 * 1024 * 1024
    assert config.segment_max_entries == 4096
    assert config.segment_max_size_bytes == 64 * 1024 * 1024
    assert config.fsync is True


@pytest.mark.parametrize("value, message", [
    (65536, "raft.segment_max_entries: values above 65535 are not supported, got 65536"),
    (0, "raft.segment_max_entries: must be at least 1, got 0"),
    (-5, "raft.segment_max_entries: must be at least 1"),
    ("4096", "raft.segment_max_entries: expected an integer"),
    (True, "raft.segment_max_entries: expected an integer"),
])
def test_segment_max_entries_is_refused_outside_1_to_65535(value, message):
    with pytest.raises(ConfigError, match=message):
        StorageConfig(segment_max_entries=value)


def test_the_limits_themselves_are_accepted(tmp_path):
    assert StorageConfig(segment_max_entries=65535).segment_max_entries == 65535
    assert StorageConfig(segment_max_entries=1).segment_max_entries == 1
    LogStore(str(tmp_path), StorageConfig(segment_max_entries=65535, fsync=False)).close()


def test_from_mapping_reads_dotted_keys_and_sizes():
    config = StorageConfig.from_mapping({
        "raft.wal_max_size_bytes": "64MB",
        "raft.segment_max_entries": 32768,
        "raft.segment_max_size_bytes": "8MiB",
        "raft.wal_max_batch_size": 1024,
        "listeners.tcp.default": 5672,                     # not ours: ignored
    }, fsync=False)
    assert (config.wal_max_size_bytes, config.segment_max_entries,
            config.segment_max_size_bytes, config.wal_max_batch_size, config.fsync) == \
        (64_000_000, 32768, 8 * 1024 * 1024, 1024, False)


@pytest.mark.parametrize("mapping, message", [
    ({"raft.segment_max_entries": 65536}, "raft.segment_max_entries"),
    ({"raft.wal_max_size_bytes": "lots"}, "raft.wal_max_size_bytes: cannot read"),
    ({"raft.wal_max_size_bytes": 0}, "raft.wal_max_size_bytes: must be at least 1"),
    ({"raft.wal_max_batch_size": 0}, "raft.wal_max_batch_size: must be at least 1"),
    ({"raft.segment_max_size_bytes": -1}, "raft.segment_max_size_bytes"),
    ({"raft.data_dir": "x"}, "raft.data_dir: unknown setting"),
])
def test_from_mapping_refuses_impossible_values_naming_the_key(mapping, message):
    with pytest.raises(ConfigError, match=message):
        StorageConfig.from_mapping(mapping)

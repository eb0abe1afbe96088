"""StorageConfig: the log storage knobs, under RabbitMQ's key names, validated once.

Responsibilities: hold the WAL and segment limits and refuse impossible values at
startup with a `ConfigError` naming the RabbitMQ key (`raft.segment_max_entries`...).
`from_mapping` reads the dotted keys as they appear in `conf/broker.toml`.

Not here: Raft timing (broker/raft/config.py), where the data directory is (Settings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

from ...config_values import ConfigError, parse_size

SEGMENT_MAX_ENTRIES_LIMIT = 65535   # RabbitMQ: "values above 65535 are not supported"


@dataclass(frozen=True, slots=True)
class StorageConfig:
    # roll to a new WAL file once the current one is larger than this (after a flush)
    wal_max_size_bytes: int = 512 * 1024 * 1024
    # at most this many WAL records per write() call; a flush still fsyncs once
    wal_max_batch_size: int = 8192
    # index slots of a new segment file; a segment closes when they are all used ...
    segment_max_entries: int = 4096
    # ... or when its data reaches this many bytes (it may exceed it by one entry)
    segment_max_size_bytes: int = 64 * 1024 * 1024
    # open segment readers kept (file descriptor + parsed index) across reads
    segment_reader_cache: int = 32
    # False only in tests and benchmarks: no fsync/fdatasync at all
    fsync: bool = True

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            key = _KEYS.get(field.name, field.name)
            if field.name == "fsync":
                if not isinstance(value, bool):
                    raise ConfigError(f"{key}: expected true or false, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{key}: expected an integer, got {value!r}")
            if value < 1:
                raise ConfigError(f"{key}: must be at least 1, got {value}")
        if self.segment_max_entries > SEGMENT_MAX_ENTRIES_LIMIT:
            raise ConfigError(
                f"raft.segment_max_entries: values above {SEGMENT_MAX_ENTRIES_LIMIT} are "
                f"not supported, got {self.segment_max_entries}")
        if self.segment_max_size_bytes >= 1 << 62:
            raise ConfigError(f"raft.segment_max_size_bytes: too large, got "
                              f"{self.segment_max_size_bytes}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], *, fsync: bool = True) -> StorageConfig:
        """From dotted RabbitMQ keys (`raft.wal_max_size_bytes = "64MB"` ...); any other
        `raft.` key is refused, keys outside `raft.` are ignored (not ours)."""
        by_key = {key: name for name, key in _KEYS.items()}
        kwargs: dict[str, object] = {"fsync": fsync}
        for key, value in values.items():
            if not key.startswith("raft."):
                continue
            name = by_key.get(key)
            if name is None:
                raise ConfigError(f"{key}: unknown setting (known: {', '.join(sorted(by_key))})")
            kwargs[name] = parse_size(key, value) if name.endswith("_bytes") else value
        return cls(**kwargs)


_KEYS = {
    "wal_max_size_bytes": "raft.wal_max_size_bytes",
    "wal_max_batch_size": "raft.wal_max_batch_size",
    "segment_max_entries": "raft.segment_max_entries",
    "segment_max_size_bytes": "raft.segment_max_size_bytes",
    "segment_reader_cache": "raft.segment_reader_cache",
}
